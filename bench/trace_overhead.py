"""What tracing and tracking cost a training step (issue 40), side by side in one run.

    .venv/bin/python bench/trace_overhead.py                   # 3 rounds × (off, traced, tracked), 6 steps each
    .venv/bin/python bench/trace_overhead.py --rounds 5 --steps 10
    .venv/bin/python bench/trace_overhead.py --accounting         # spans per step × CPU per span (2 min)

Each round runs the same short `co_train` job (same seeds) on a fresh local cluster three ways, in
turn: plain; with MGRPO_TRACE_DIR set (every service writes its OpenTelemetry spans); with
`tracking: [tensorboard, mlflow, wandb]`. The measure is the median of the root's `timing/step` over
each job's steps after the first (the first loads models). Rounds interleave the variants so drift
on the machine falls on all alike; the ratios are per round, then their median and range. Writes
`results.json` into `--out`.

`--accounting` measures the cost instead of timing it, since on 2 busy cores a step's time moves by
more from run to run than the issue's 2 % bound: one traced job gives the spans every process wrote
per step (from the trace files); the CPU time of one span as the services make it (started with the
usual attributes, ended, exported by the same JSON-lines exporter and batch processor, its thread
included) and of one no-op span (tracing off) is measured in this process over many spans; their
product over the median step time is the share of a step spent on tracing, counted as if every
process's spans ran on the root's critical path (an upper bound: the services trace in parallel).
Writes `accounting.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from opentelemetry import trace
from rich.console import Console

from mgrpo import tracing
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


def span_cpu_s(tracer: trace.Tracer, n: int) -> float:
    """CPU seconds of this process (every thread) per span over `n` spans like a rollout's."""
    attrs = tracing.attributes(job_id="job-0123456789ab", step=3, role="subagent", query_id="q17", rollout=5)
    start = time.process_time()
    for i in range(n):
        with tracer.start_as_current_span("episode", attributes={**attrs, "mgrpo.policy_version": i}):
            pass
    return (time.process_time() - start) / n


def span_costs(n: int = 20_000) -> dict[str, float]:
    """µs of CPU per recorded span (exported to a file, flushed) and per no-op span."""
    with tempfile.TemporaryDirectory() as tmp:
        provider = tracing.provider_for("bench", Path(tmp))
        assert provider is not None
        tracer = provider.get_tracer("mgrpo")
        span_cpu_s(tracer, 1000)  # warm up
        provider.force_flush()
        start = time.process_time()
        span_cpu_s(tracer, n)
        provider.force_flush()
        provider.shutdown()
        recorded = (time.process_time() - start) / n  # the spans, their export and its thread
        written = sum(1 for f in Path(tmp).glob("*.jsonl") for _ in f.open())
    if written != n + 1000:
        raise RuntimeError(f"the exporter wrote {written} of {n + 1000} spans")
    noop = span_cpu_s(trace.NoOpTracer(), n)
    return {"recorded_us": recorded * 1e6, "noop_us": noop * 1e6}


def spans_per_step(traces: Path, steps: int) -> dict[str, float]:
    """Spans each service wrote per step of the job (`service.name` → spans / steps)."""
    count: Counter[str] = Counter()
    for f in traces.glob("*.jsonl"):
        for line in f.open():
            count[json.loads(line)["resource"]["attributes"]["service.name"]] += 1
    return {name: c / steps for name, c in sorted(count.items())}


def accounting(args: argparse.Namespace, console: Console) -> None:
    out = args.out / "accounting"
    times = one("traced", args.steps, out, args.cache_dir, console)
    per_step = spans_per_step(out / "traces", args.steps)
    costs = span_costs()
    step_s, spans = statistics.median(times), sum(per_step.values())
    share = {k: spans * costs[f"{k}_us"] * 1e-6 / step_s for k in ("recorded", "noop")}
    result = {"spans_per_step": per_step, "span_cpu_us": costs, "median_step_s": step_s, "share": share}
    result["steps"] = args.steps
    (args.out / "accounting.json").write_text(json.dumps(result, indent=1))
    console.print(", ".join(f"{name} {n:.0f}" for name, n in per_step.items()) + " spans per step")
    console.print(
        f"{spans:.0f} spans per step × {costs['recorded_us']:.1f} µs of CPU each = "
        f"{spans * costs['recorded_us'] * 1e-6:.3f} s of a {step_s:.2f} s step: "
        f"{share['recorded']:.2%} traced, {share['noop']:.3%} with tracing off ({costs['noop_us']:.2f} µs a no-op span)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("bench/results/trace-overhead"))
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/mgrpo"))
    ap.add_argument("--accounting", action="store_true", help="spans per step × CPU per span instead")
    args = ap.parse_args()
    console = Console()
    if args.accounting:
        return accounting(args, console)
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
