"""What tracing and tracking cost a training step (issue 40), side by side in one run.

    .venv/bin/python bench/trace_overhead.py                   # 3 rounds × (off, traced, tracked), 6 steps each
    .venv/bin/python bench/trace_overhead.py --rounds 5 --steps 10

Each round runs the same short `co_train` job (same seeds) on a fresh local cluster three ways, in
turn: plain; with MGRPO_TRACE_DIR set (every service writes its OpenTelemetry spans); with
`tracking: [tensorboard, mlflow, wandb]`. The measure is the median of the root's `timing/step` over
each job's steps after the first (the first loads models). Rounds interleave the variants so drift
on the machine falls on all alike; the ratios are per round, then their median and range. Writes
`results.json` into `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from mgrpo.config import JobConfig
from services.demo import run_job
from services.launcher import LocalCluster

VARIANTS = ("off", "traced", "tracked")


def one(variant: str, steps: int, out: Path, cache_dir: Path, console: Console) -> list[float]:
    env = {"MGRPO_CACHE_DIR": str(cache_dir.resolve())}
    if variant == "traced":
        env["MGRPO_TRACE_DIR"] = str(out / "traces")
    cfg: dict[str, Any] = {"steps": steps}
    if variant == "tracked":
        cfg["tracking"] = ["tensorboard", "mlflow", "wandb"]
    with LocalCluster(out, extra_env=env) as cluster:
        final, rows, _ = run_job(cluster, JobConfig.model_validate(cfg), out, console)
    if final["status"] != "succeeded":
        raise RuntimeError(f"{variant}: job {final['status']}: {final['reason']}")
    return [r["timing/step"] for r in rows if r.get("timing/step") is not None][1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("bench/results/trace-overhead"))
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/mgrpo"))
    args = ap.parse_args()
    console = Console()
    rounds = []
    for i in range(args.rounds):
        row = {}
        for v in VARIANTS:
            t0 = time.perf_counter()
            times = one(v, args.steps, args.out / f"round{i}-{v}", args.cache_dir, console)
            row[v] = {
                "step_s": times,
                "median_s": statistics.median(times),
                "job_s": time.perf_counter() - t0,
            }
        rounds.append(row)
        console.print(f"round {i}: " + ", ".join(f"{v} {row[v]['median_s']:.2f} s/step" for v in VARIANTS))
    ratios = {v: [r[v]["median_s"] / r["off"]["median_s"] for r in rounds] for v in VARIANTS if v != "off"}
    summary = {v: {"median": statistics.median(x), "min": min(x), "max": max(x)} for v, x in ratios.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(
        json.dumps({"rounds": rounds, "ratio_to_off": summary, "steps": args.steps}, indent=1)
    )
    for v, s in summary.items():
        console.print(f"{v}: {s['median']:.3f}× the plain step (range {s['min']:.3f}–{s['max']:.3f})")


if __name__ == "__main__":
    main()
