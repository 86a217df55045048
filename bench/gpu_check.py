"""The GPU check of issue 15, run by `bench/gpu_check.sh` where a GPU is lent; one JSON summary.

    python3 bench/gpu_check.py --out bench/results/gpu_check.json   # on the GPU (default device: cuda when seen)
    .venv/bin/python bench/gpu_check.py --device cpu --quick   # the same code on the CPU (the tests run this)

Parts, each timed and recorded even when another fails:
- `fsdp`: the FSDP2 `ShardedPolicy` on one rank of a real process group (NCCL on the GPU, gloo on
  the CPU), bf16 parameters with fp32 reduction on the GPU: updates of a synthetic batch, train tokens/s.
- `megatron`: a megatron-core GPTModel (tensor parallel 1) from the HF weights: the HF ↔ Megatron
  round trip exact, its logits against HF's, one `ppo_update` (forward and backward) finite.
- `megatron_moe`: the same for a tiny Qwen3-MoE through megatron-core's MoE layer (router, allgather
  dispatch, the experts), all on this one device.
- `mfu`: the one-process update's model FLOP/s (bench/mfu.py's count) on the largest size here
  that fits, against the fp32 and bf16 matmul peaks measured in the same run.
- `weight_sync`: the sharded policy's sync into a full model (the engine's) against a raw copy of
  the same bytes on the same device.
- `autocast`: what bf16 autocast would do to the one-process update (it runs fp32): its time and
  model FLOP/s on the `mfu` size, and how far its token log-probs fall from fp32's (the PPO ratio's
  noise against fp32 rollouts). A measurement only: no setting turns it on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, Qwen3Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.mfu import flops_per_token, synthetic_batch
from mgrpo.training import UpdateSettings, ppo_update

# (hidden, layers, heads, kv heads, head dim, MLP width): ~0.3M for --quick, ~110M and 306M on a GPU
SIZES = {
    "quick": (64, 2, 4, 2, 16, 128),
    "110m": (768, 12, 12, 4, 64, 2048),
    "300m": (1024, 24, 16, 8, 64, 3072),
}
VOCAB = 4096


def model_of(size: str, device: torch.device) -> torch.nn.Module:
    h, layers, heads, kv, d, f = SIZES[size]
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=h,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=d,
        intermediate_size=f,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    fn()  # warm-up
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / reps


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int) -> float:
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / timed(lambda: a @ b, device, 10) / 1e12  # TFLOP/s


def check_fsdp(device: torch.device, size: str, batch: int, seq: int) -> dict[str, Any]:
    from mgrpo.parallel.fsdp import ShardedPolicy

    model = model_of(size, device)
    policy = ShardedPolicy(model.config.to_dict(), 1e-5, source=model)
    rows = synthetic_batch(VOCAB, batch, seq)
    settings = UpdateSettings(minibatch_size=batch)
    run = lambda: policy.update(rows, settings, pad_id=0, seed=0, version=None)  # noqa: E731
    metrics = run()
    s = timed(run, device, 2)
    dtypes = sorted({str(p.dtype) for p in policy.model.parameters()})
    return {
        "size": size,
        "update_s": s,
        "train_tokens_per_s": batch * seq / s,
        "param_dtypes": dtypes,
        "loss_finite": bool(torch.isfinite(torch.tensor(metrics["loss"]))),
        "policy": policy,
        "model": model,
    }


def moe_of(device: torch.device) -> torch.nn.Module:
    """A tiny Qwen3-MoE (4 experts, 2 per token), its router scores spread (HF starts it at zero)."""
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(std=0.5)
    return model.to(device)


def check_megatron(device: torch.device, moe: bool = False) -> dict[str, Any]:
    """The dense model, or with `moe` a Qwen3-MoE through megatron-core's MoE layer (its experts on
    this one rank; the split over ranks runs on the CPU in the tests)."""
    from mgrpo.parallel.megatron import hf_to_megatron, megatron_to_hf
    from mgrpo.parallel.megatron_cpu import cpu_shim
    from mgrpo.parallel.megatron_model import MegatronCausalLM, load_into, tensor_parallel

    tensor_parallel(1)
    hf = moe_of(device) if moe else model_of("quick", device)
    state = {k: v.detach().cpu() for k, v in hf.state_dict().items()}
    exact = all(
        torch.equal(a, state[k])
        for k, a in megatron_to_hf([hf_to_megatron(state, hf.config)], hf.config).items()
    )
    with cpu_shim() if device.type == "cpu" else contextlib.nullcontext():
        mg = MegatronCausalLM(hf.config).to(device)
        load_into(mg.gpt, hf_to_megatron(state, hf.config))
        ids = torch.randint(1, VOCAB, (4, 64), device=device)
        mask = torch.ones_like(ids)
        with torch.no_grad():
            want = hf(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1)).logits
            got = mg(input_ids=ids, attention_mask=mask).logits
        opt = torch.optim.AdamW(mg.parameters(), lr=1e-5)
        t0 = time.perf_counter()
        metrics = ppo_update(
            mg, opt, synthetic_batch(VOCAB, 8, 64), UpdateSettings(minibatch_size=8), pad_id=0
        )  # type: ignore[arg-type]
        sync(device)
    return {
        "round_trip_exact": exact,
        "logits_max_diff": float((got - want).abs().max()),
        "update_s": time.perf_counter() - t0,
        "loss_finite": bool(torch.isfinite(torch.tensor(metrics["loss"]))),
    }


def check_mfu(device: torch.device, size: str, batch: int, seq: int) -> dict[str, Any]:
    model = model_of(size, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rows = synthetic_batch(VOCAB, batch, seq)
    settings = UpdateSettings(minibatch_size=batch)
    s = timed(lambda: ppo_update(model, opt, rows, settings, pad_id=0), device, 2)
    achieved = flops_per_token(model, seq) * batch * seq / s / 1e12
    n = 1024 if device.type == "cpu" else 8192
    peaks = {
        str(dt).removeprefix("torch."): matmul_peak(device, dt, n) for dt in (torch.float32, torch.bfloat16)
    }
    return {
        "size": size,
        "params": sum(p.numel() for p in model.parameters()),
        "update_s": s,
        "model_tflops_per_s": achieved,
        "matmul_peak_tflops": peaks,
        "mfu_vs_fp32_peak": achieved / peaks["float32"],
        "mfu_vs_bf16_peak": achieved / peaks["bfloat16"],
    }


def check_autocast(device: torch.device, size: str, batch: int, seq: int) -> dict[str, Any]:
    from mgrpo.models import token_logprobs

    model = model_of(size, device)
    ids = torch.randint(1, VOCAB, (batch, seq), device=device)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        exact = token_logprobs(model, ids, mask)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            cast = token_logprobs(model, ids, mask)
    diff = (cast - exact).abs()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rows = synthetic_batch(VOCAB, batch, seq)
    settings = UpdateSettings(minibatch_size=batch)

    def update() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            ppo_update(model, opt, rows, settings, pad_id=0)

    s = timed(update, device, 2)
    return {
        "size": size,
        "update_s": s,
        "model_tflops_per_s": flops_per_token(model, seq) * batch * seq / s / 1e12,
        "logprob_abs_diff_max": float(diff.max()),
        "logprob_abs_diff_mean": float(diff.mean()),
    }


def check_weight_sync(device: torch.device, policy: Any, model: torch.nn.Module) -> dict[str, Any]:
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    s = timed(lambda: policy.sync_into(model), device, 3)
    src, dst = torch.empty(nbytes // 4, device=device), torch.empty(nbytes // 4, device=device)
    raw = timed(lambda: dst.copy_(src), device, 3)
    return {
        "bytes": nbytes,
        "sync_s": s,
        "sync_gb_per_s": nbytes / s / 1e9,
        "raw_copy_gb_per_s": nbytes / raw / 1e9,
        "sync_vs_raw": raw / s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (the CPU dry run the tests make)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/gpu_check.json"))
    args = ap.parse_args()
    device = torch.device(
        "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device.replace("auto", "cpu")
    )
    size, batch, seq = ("quick", 4, 32) if args.quick else ("110m", 32, 512)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    summary: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    held: dict[str, Any] = {}

    def part(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        free_gb = torch.cuda.mem_get_info()[0] / 2**30 if device.type == "cuda" else None
        t0 = time.perf_counter()
        try:
            out = fn()
            held.update({k: out.pop(k) for k in ("policy", "model") if k in out})
            summary[name] = {**out, "ok": True}
        except Exception as exc:  # a part that fails is recorded; the others still run
            summary[name] = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "trace": traceback.format_exc()[-2000:],
            }
        summary[name]["wall_s"] = time.perf_counter() - t0
        summary[name]["gpu_free_gib_before"] = free_gb
        print(json.dumps({name: {k: v for k, v in summary[name].items() if k != "trace"}}), flush=True)

    part("fsdp", lambda: check_fsdp(device, size, batch, seq))
    part("megatron", lambda: check_megatron(device))
    part("megatron_moe", lambda: check_megatron(device, moe=True))
    part("mfu", lambda: check_mfu(device, "quick" if args.quick else "300m", batch, seq))
    part("autocast", lambda: check_autocast(device, "quick" if args.quick else "300m", batch, seq))
    if "policy" in held:
        part("weight_sync", lambda: check_weight_sync(device, held["policy"], held["model"]))
    summary["jax_imported"] = "jax" in sys.modules  # it would hold 75 % of the GPU (gpu_check.sh)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    dist.destroy_process_group()
    sys.exit(0 if all(v.get("ok") for v in summary.values() if isinstance(v, dict)) else 1)


if __name__ == "__main__":
    main()
