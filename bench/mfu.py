"""Training MFU (issue 7): the policy update's model FLOP/s against an fp32 matmul peak measured in
the same run.

    .venv/bin/python bench/mfu.py                       # presets small (3.2M) and tiny (0.44M)
    .venv/bin/python bench/mfu.py --presets small --batch 64 --seq-len 256
    .venv/bin/python bench/mfu.py --presets small --profile   # + where the update's time goes, by op
    .venv/bin/python bench/mfu.py --compile                   # + the same updates with `compile: true`

The update is the trainers' own `ppo_update` (clipped loss, AdamW, grad clipping) on synthetic
transcripts of the given shape (half of each sequence generated, random advantages). Model FLOPs
per token, forward + backward, follow the PaLM appendix: 6·N (N = parameters that take part in a
matmul: everything but the input embedding) + 12·L·d·T (attention scores and values, T = sequence
length), the same for every token of the batch (padding included: the batch is full). The peak is the
best of square fp32 `torch.matmul` sizes on the same threads. Prints one JSON line per preset; with
`--profile`, one more update runs under the torch profiler and the JSON gets each op group's share
of its CPU time (matmuls forward and backward, attention, the rest) and the top ops.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from mgrpo.models import build_model, train_tokenizer
from mgrpo.records import Sample, Transcript
from mgrpo.tasks.deep_research import DeepResearchTask
from mgrpo.training import UpdateSettings, ppo_update


def matmul_peak(sizes: tuple[int, ...] = (512, 1024, 2048), seconds: float = 1.0) -> dict[str, float]:
    """Best fp32 matmul GFLOP/s over `sizes` (each run for about `seconds`)."""
    best: dict[str, float] = {}
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.matmul(a, b)  # warm-up
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.matmul(a, b)
            reps += 1
        best[str(n)] = 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9
    return best


def flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    cfg = model.config
    n_matmul = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    if cfg.tie_word_embeddings:
        n_matmul += model.get_input_embeddings().weight.numel()  # the tied lm_head is a matmul
    return 6.0 * n_matmul + 12.0 * cfg.num_hidden_layers * cfg.hidden_size * seq_len


def synthetic_batch(vocab: int, batch: int, seq_len: int, seed: int = 0) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batch):
        ids = torch.randint(5, vocab, (seq_len,), generator=g).tolist()
        half = seq_len // 2
        tr = Transcript(
            ids, [0.0] * half + [-2.0] * (seq_len - half), [0] * half + [1] * (seq_len - half), half
        )
        out.append(Sample("bench", "g", tr, 0.0, advantage=float(torch.randn((), generator=g))))
    return out


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")


def profile_update(run: Callable[[], object]) -> dict[str, Any]:
    """One update under the torch profiler: self CPU time by op, grouped (matmul, attention, other)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(ops.values())
    groups = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for name, t in ops.items():
        group = "matmul" if name in MATMUL_OPS else "attention" if "attention" in name else "other"
        groups[group] += t / total
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:10]
    return {"self_cpu_share": groups, "top_ops": {k: v / total for k, v in top}}


def measure(
    preset: str, batch: int, seq_len: int, updates: int, profile: bool = False, compile: bool = False
) -> dict[str, Any]:
    task = DeepResearchTask()
    tok = train_tokenizer([d.text for d in task.world.docs[:500]], 320)
    model = build_model(preset, tok, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    samples = synthetic_batch(len(tok), batch, seq_len)
    settings = UpdateSettings(minibatch_size=batch, compile=compile)
    ppo_update(model, opt, samples, settings, pad_id=int(tok.pad_token_id))  # warm-up (and compilation)
    times = []
    for i in range(updates):
        t0 = time.perf_counter()
        ppo_update(model, opt, samples, settings, pad_id=int(tok.pad_token_id), seed=i)
        times.append(time.perf_counter() - t0)
    best = min(times)
    n_tokens = batch * seq_len
    achieved = flops_per_token(model, seq_len) * n_tokens / best / 1e9
    row = {
        "preset": preset,
        "compile": compile,
        "params": sum(p.numel() for p in model.parameters()),
        "tokens_per_update": n_tokens,
        "update_s_best": best,
        "update_s_median": sorted(times)[len(times) // 2],
        "train_tokens_per_s": n_tokens / best,
        "model_gflops_per_s": achieved,
    }
    if profile:
        row["profile"] = profile_update(
            lambda: ppo_update(model, opt, samples, settings, pad_id=int(tok.pad_token_id), seed=updates)
        )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["small", "tiny"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="add a torch-profiler op breakdown of one update")
    ap.add_argument("--compile", action="store_true", help="also measure each preset with compile: true")
    args = ap.parse_args()
    peak_before = matmul_peak()
    rows = [
        measure(p, args.batch, args.seq_len, args.updates, args.profile, compile)
        for p in args.presets
        for compile in ((False, True) if args.compile else (False,))
    ]
    peak_after = matmul_peak()
    peak = max(*peak_before.values(), *peak_after.values())
    for r in rows:
        r.update(
            peak_gflops_per_s=peak, mfu=float(r["model_gflops_per_s"]) / peak, threads=torch.get_num_threads()
        )
        print(json.dumps(r))
    print(json.dumps({"matmul_gflops_per_s_before": peak_before, "matmul_gflops_per_s_after": peak_after}))


if __name__ == "__main__":
    main()
