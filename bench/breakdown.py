"""Where a step's time goes (issue 7), per role, and the share spent in Redis and HTTP exchange.

    .venv/bin/python bench/breakdown.py                    # a 10-step co_train job at the demo's size
    .venv/bin/python bench/breakdown.py --metrics runs/demo-…/metrics.jsonl   # summarise a finished run
    .venv/bin/python bench/breakdown.py --set max_staleness=1 --out bench/results/breakdown-async

Runs one `co_train` job (8 prompts × K 8 × D 4, the default recipe) on a local cluster and averages the
trainers' own per-step timings over steps 1.. (step 0 loads models). Planner phases: waiting for the
sub-agent's policy, rollout (generation, tools and delegations), reward, advantage, update,
checkpoint, and Redis (statistics, ledger, version, progress). Sub-agent phases: align (including the
episode fetch), advantage, update, checkpoint, Redis (fetch, manifest, statistics, version).

Exchange on the planner's critical path = its Redis time + the longest per-rollout sum of delegation
time spent in HTTP and Redis rather than in the sub-agent's model (the sub-agent reports its own time
in a `Server-Timing` header) + the part of the wait for the sub-agent that its Redis time can explain.
Writes `results.json` into `--out` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from mgrpo.config import JobConfig
from services.demo import run_train

sys.path.insert(0, str(Path(__file__).parent))
from learning import parse_sets

PLANNER = ("wait_partner", "rollout", "reward", "adv", "update", "checkpoint", "exchange_redis")
SUBAGENT = (
    "subagent_align",
    "subagent_adv",
    "subagent_update",
    "subagent_checkpoint",
    "subagent_exchange_redis",
)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for r in rows if r["step"] > 0 and "timing/step" in r and "timing/subagent_step" in r]
    if not rows:
        raise ValueError("no step after step 0 with both roles' timings; run at least 2 steps")

    def mean(key: str) -> float:
        return statistics.fmean(r[f"timing/{key}"] for r in rows)

    step = mean("step")
    http = mean("exchange_http_critical")
    sub_redis_on_path = statistics.fmean(
        min(r["timing/wait_partner"], r["timing/subagent_exchange_redis"]) for r in rows
    )
    exchange = mean("exchange_redis") + http + sub_redis_on_path
    return {
        "steps": len(rows),
        "planner_step_s": step,
        "subagent_step_s": mean("subagent_step"),
        "planner_s": {k: mean(k) for k in PLANNER},
        "subagent_s": {k: mean(k) for k in SUBAGENT},
        "delegation_exchange_ms_mean": statistics.fmean(r["exchange/delegation_ms_mean"] for r in rows),
        "delegation_server_queue_ms_mean": statistics.fmean(
            r.get("exchange/delegation_server_queue_ms_mean", 0.0) for r in rows
        ),
        "exchange_http_critical_s": http,
        "subagent_redis_on_critical_path_s": sub_redis_on_path,
        "exchange_s": exchange,
        "exchange_share": exchange / step,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics", type=Path, help="summarise this metrics.jsonl instead of running a job")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="job-config override")
    ap.add_argument("--out", type=Path, default=Path("bench/results/breakdown"))
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/mgrpo"))
    args = ap.parse_args()
    metrics = args.metrics
    if metrics is None:
        out = args.out / "run"
        job = JobConfig.model_validate({**parse_sets(args.set), "steps": args.steps})
        final = run_train(job, out, redis_url=None, cache_dir=args.cache_dir, console=Console())
        if final["status"] != "succeeded":
            raise SystemExit(f"the job {final['status']}: {final['reason']}")
        metrics = out / "metrics.jsonl"
    result = summarise([json.loads(line) for line in metrics.read_text().splitlines()])
    result["overrides"] = args.set
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    step = result["planner_step_s"]
    print(
        f"planner step {step:.2f} s (sub-agent step {result['subagent_step_s']:.2f} s), {result['steps']} steps"
    )
    for role in ("planner_s", "subagent_s"):
        for k, v in result[role].items():
            print(f"  {role[:-2]:9s} {k:26s} {v:7.3f} s  {v / step:6.1%}")
    print(
        f"exchange on the critical path {result['exchange_s']:.3f} s = {result['exchange_share']:.1%} of the step "
        f"(HTTP+Redis per delegation {result['delegation_exchange_ms_mean']:.1f} ms, of which "
        f"{result['delegation_server_queue_ms_mean']:.1f} ms queued in the sub-agent's server before its handler)"
    )


if __name__ == "__main__":
    main()
