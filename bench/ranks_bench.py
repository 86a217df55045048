"""A role's trainer on W = 2 ranks vs one process (issue 15), in one run on this machine's cores:

    .venv/bin/python bench/ranks_bench.py [--samples 64] [--tokens 256] [--repeats 3] [--out docs/results/ranks-results.json]

1. **Update**: one PPO update (`ppo_update`, the `small` preset, `--samples` random transcripts of
   `--tokens` tokens, minibatch 32) in one process with all the cores vs FSDP2 over two gloo ranks
   under torchrun (one core each): seconds per update and samples/s, median of `--repeats`.
2. **Weight sync** vs model size (random weights, tiny to ~400 MB of fp32): the sharded policy's
   weights into rank 0's full model (what reaches the rollout engine after each update,
   `weight_sync_s`: `ShardedPolicy.sync_into`, bucketed gathers) against a raw `broadcast` of the
   same bytes in the same group: seconds, GB/s, and sync / raw bandwidth (goal ≥ 0.8); and, for
   comparison, torch's `get_model_state_dict(full_state_dict=True)` + `load_state_dict`. (The sync
   measurement is `bench/weight_sync.py`'s, which also runs it alone.)
3. **The megatron backend** on the same two ranks (megatron-core tensor parallel 2, on the CPU
   through its shim): the same update, and its sync (`MegatronPolicy.sync_into`: the shards gathered
   to rank 0 in buckets, converted to HF names and copied into its model) against the same raw
   broadcast.
4. **megatron with 2 pipeline stages** (tensor parallel 1): the same update, its minibatch of 32 cut
   into micro-batches of `--pp-microbatch-tokens` padded tokens (4 at the defaults) that megatron-
   core's 1F1B schedule overlaps across the stages, and its sync (each stage's layers to rank 0).

Prints a table and writes the JSON. The W = 2 half runs as `torchrun --nproc-per-node 2` of this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.weight_sync import (  # noqa: E402
    ARMS,
    SHAPES,
    fresh_parallel_state,
    median_time,
    print_table,
    sync_sizes,
    tokenizer,
)
from mgrpo.models import build_model  # noqa: E402
from mgrpo.parallel.backends import backend as backend_named  # noqa: E402
from mgrpo.parallel.ranks import policy_class  # noqa: E402
from mgrpo.records import Sample, Transcript  # noqa: E402
from mgrpo.training import UpdateSettings, ppo_update  # noqa: E402

SETTINGS = UpdateSettings(minibatch_size=32, ppo_epochs=1)


def batch(n: int, tokens: int, vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(0, vocab, (tokens,), generator=g).tolist()
        t = Transcript(ids, [-1.0] * tokens, [0] * 32 + [1] * (tokens - 32), 32)
        out.append(Sample("bench", "g", t, 0.0, advantage=1.0 if i % 2 else -1.0))
    return out


def one_process(args) -> dict:
    tok = tokenizer()
    model = build_model("small", tok)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    data = batch(args.samples, args.tokens, len(tok))
    s = median_time(lambda: ppo_update(model, opt, data, SETTINGS, pad_id=tok.pad_token_id), args.repeats)
    return {"update_s": s, "samples_per_s": args.samples / s, "threads": torch.get_num_threads()}


def two_ranks(args) -> None:
    """Under torchrun: the update and the sync sizes; rank 0 writes the JSON to args.worker_out."""
    import torch.distributed as dist

    from mgrpo.parallel.group import init_from_env

    init_from_env(timeout_s=600)
    rank0, out = dist.get_rank() == 0, {}
    tok = tokenizer()
    model = build_model("small", tok)
    data = batch(args.samples, args.tokens, len(tok))
    piped = dataclasses.replace(SETTINGS, microbatch_tokens=args.pp_microbatch_tokens)
    for arm, (backend, stages) in ARMS.items():
        suffix = "" if arm == "fsdp" else f"_{arm}"
        fresh_parallel_state(stages)
        kw = {"pipeline": stages} if backend_named(backend).pipelines else {}
        policy = policy_class(backend)(model.config.to_dict(), 1e-5, source=model if rank0 else None, **kw)
        settings = piped if stages > 1 else SETTINGS
        s = median_time(
            lambda p=policy, st=settings: p.update(data, st, pad_id=tok.pad_token_id, seed=0, version=None),
            args.repeats,
        )
        out["update" + suffix] = {
            "update_s": s,
            "samples_per_s": args.samples / s,
            "threads": torch.get_num_threads(),
        }
        out["sync" + suffix] = [
            sync_sizes(shape, tok, rank0, args.repeats, backend, stages) for shape in SHAPES
        ]
    if rank0:
        Path(args.worker_out).write_text(json.dumps(out))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--pp-microbatch-tokens", type=int, default=2048, help="micro-batch size of the pipeline arm"
    )
    ap.add_argument("--out", default=str(ROOT / "docs/results/ranks-results.json"))
    ap.add_argument("--worker-out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_out:
        return two_ranks(args)
    w1 = one_process(args)
    with tempfile.TemporaryDirectory() as tmp:
        worker_out = Path(tmp) / "w2.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            __file__,
            f"--samples={args.samples}",
            f"--tokens={args.tokens}",
            f"--repeats={args.repeats}",
            f"--pp-microbatch-tokens={args.pp_microbatch_tokens}",
            f"--worker-out={worker_out}",
        ]
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        w2 = json.loads(worker_out.read_text())
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "cores": os.cpu_count(),
        "samples": args.samples,
        "tokens": args.tokens,
        "update_w1": w1,
        "update_w2": w2["update"],
        "sync": w2["sync"],
        "update_w2_over_w1_speed": w1["update_s"] / w2["update"]["update_s"],
        "update_megatron_tp2": w2["update_megatron"],
        "sync_megatron": w2["sync_megatron"],
        "update_megatron_tp2_over_w1_speed": w1["update_s"] / w2["update_megatron"]["update_s"],
        "pp_microbatch_tokens": args.pp_microbatch_tokens,
        "update_megatron_pp2": w2["update_megatron_pp2"],
        "sync_megatron_pp2": w2["sync_megatron_pp2"],
        "update_megatron_pp2_over_w1_speed": w1["update_s"] / w2["update_megatron_pp2"]["update_s"],
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(
        f"update ({args.samples} × {args.tokens} tokens, small preset): W=1 {w1['update_s']:.2f} s "
        f"({w1['samples_per_s']:.1f} samples/s, {w1['threads']} threads)  W=2 {w2['update']['update_s']:.2f} s "
        f"({w2['update']['samples_per_s']:.1f} samples/s, 1 thread per rank)  W=2/W=1 speed "
        f"{result['update_w2_over_w1_speed']:.2f}"
    )
    print_table(w2["sync"])
    for key, name, speed in (
        ("megatron", "tensor parallel 2", "update_megatron_tp2_over_w1_speed"),
        (
            "megatron_pp2",
            f"2 pipeline stages ({args.pp_microbatch_tokens}-token micro-batches)",
            "update_megatron_pp2_over_w1_speed",
        ),
    ):
        m = w2["update_" + key]
        print(
            f"megatron, {name}: update {m['update_s']:.2f} s ({m['samples_per_s']:.1f} samples/s), "
            f"speed / W=1 {result[speed]:.2f}; its sync:"
        )
        print_table(w2["sync_" + key])


if __name__ == "__main__":
    main()
