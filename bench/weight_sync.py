"""Weight sync against model size and raw broadcast (issue 15), on two gloo ranks of this machine:

    .venv/bin/python bench/weight_sync.py [--sizes tiny small 100MB 400MB] [--backends fsdp megatron megatron_pp2]
                                          [--repeats 3] [--out docs/results/weight-sync-results.json]

For each backend and each random-weight Qwen3 size (fp32, 1.7 to 404 MB), the sharded role's weights
into rank 0's full model — what reaches the rollout engine after every update (`weight_sync_s`):
`ShardedPolicy.sync_into` (FSDP2) or `MegatronPolicy.sync_into` (tensor parallel 2, or 2 pipeline
stages), bucketed — against a raw `broadcast` of the same bytes in the same group, in the same run:
seconds, GB/s and sync / raw bandwidth (goal ≥ 0.8). For FSDP2 also torch's own
`get_model_state_dict(full_state_dict=True)` + `load_state_dict`. Medians of `--repeats`.

Prints a table and writes the JSON; the two ranks run as `torchrun --nproc-per-node 2` of this file.
`bench/ranks_bench.py` runs the same measurement beside the update's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mgrpo.models import n_params, train_tokenizer  # noqa: E402
from mgrpo.parallel.backends import backend as backend_named  # noqa: E402
from mgrpo.parallel.fsdp import ShardedPolicy  # noqa: E402
from mgrpo.parallel.ranks import policy_class  # noqa: E402

# name → Qwen3 shape (vocab 320): random weights for the sync sizes
SHAPES = {
    "tiny": dict(
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
    ),
    "small": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
    ),
    "100MB": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
    ),
    "400MB": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
    ),
}
# backend arm → (policy backend, pipeline stages)
ARMS = {"fsdp": ("fsdp", 1), "megatron": ("megatron", 1), "megatron_pp2": ("megatron", 2)}
GOAL = 0.8  # sync / raw bandwidth


def tokenizer():
    return train_tokenizer(["the quick brown fox jumps over the lazy dog"] * 20)


def model_of(shape: str, tok):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        **SHAPES[shape],
    )
    return AutoModelForCausalLM.from_config(cfg)


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fresh_parallel_state(stages: int) -> None:
    """megatron-core's parallel state is global: a pipeline arm after a tensor-parallel one sets it anew."""
    if stages > 1:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()


def sync_sizes(shape: str, tok, rank0: bool, repeats: int, backend: str = "fsdp", stages: int = 1) -> dict:
    """Under torchrun: one model size's sync, torch's state-dict sync (fsdp) and a raw broadcast, in seconds."""
    import torch.distributed as dist

    full = model_of(shape, tok)
    kw = {"pipeline": stages} if backend_named(backend).pipelines else {}
    policy = policy_class(backend)(full.config.to_dict(), 1e-5, source=full if rank0 else None, **kw)
    nbytes = sum(p.numel() * p.element_size() for p in full.parameters())

    def state_dict_sync() -> None:
        weights = policy.full_weights()
        if rank0:
            full.load_state_dict(weights)

    flat = torch.zeros(nbytes // 4, dtype=torch.float32)
    sync_s = median_time(lambda: policy.sync_into(full if rank0 else None), repeats)
    sd_s = median_time(state_dict_sync, repeats) if isinstance(policy, ShardedPolicy) else float("nan")
    raw_s = median_time(lambda: dist.broadcast(flat, src=0), repeats)
    return {
        "model": shape,
        "params": n_params(full),
        "MB": nbytes / 1e6,
        "sync_s": sync_s,
        "raw_broadcast_s": raw_s,
        "state_dict_sync_s": sd_s,
        "sync_GBps": nbytes / sync_s / 1e9,
        "raw_GBps": nbytes / raw_s / 1e9,
        "sync_over_raw": raw_s / sync_s,
    }


def print_table(rows: list[dict]) -> None:
    print(
        f"{'model':>6} {'MB':>7} {'sync s':>7} {'raw s':>7} {'state-dict s':>12} {'sync GB/s':>9} "
        f"{'raw GB/s':>8} {'sync/raw':>8}"
    )
    for r in rows:
        print(
            f"{r['model']:>6} {r['MB']:7.1f} {r['sync_s']:7.3f} {r['raw_broadcast_s']:7.3f} {r['state_dict_sync_s']:12.3f} "
            f"{r['sync_GBps']:9.2f} {r['raw_GBps']:8.2f} {r['sync_over_raw']:8.2f}"
        )


def two_ranks(args) -> None:
    """Under torchrun: every arm's sizes; rank 0 writes the JSON to args.worker_out."""
    import torch.distributed as dist

    from mgrpo.parallel.group import init_from_env

    init_from_env(timeout_s=600)
    rank0, tok = dist.get_rank() == 0, tokenizer()
    out = {}
    for arm in args.backends:
        backend, stages = ARMS[arm]
        fresh_parallel_state(stages)
        out[arm] = [sync_sizes(shape, tok, rank0, args.repeats, backend, stages) for shape in args.sizes]
    if rank0:
        Path(args.worker_out).write_text(json.dumps(out))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--backends", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "docs/results/weight-sync-results.json"))
    ap.add_argument("--worker-out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_out:
        return two_ranks(args)
    with tempfile.TemporaryDirectory() as tmp:
        worker_out = Path(tmp) / "w2.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            __file__,
            "--sizes",
            *args.sizes,
            "--backends",
            *args.backends,
            f"--repeats={args.repeats}",
            f"--worker-out={worker_out}",
        ]
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        arms = json.loads(worker_out.read_text())
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "cores": os.cpu_count(),
        "repeats": args.repeats,
        "goal_sync_over_raw": GOAL,
        "sync": arms,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    for arm, rows in arms.items():
        met = [r["model"] for r in rows if r["sync_over_raw"] >= GOAL]
        print(f"\n{arm}: sync / raw ≥ {GOAL} at {', '.join(met) or 'no size'}")
        print_table(rows)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
