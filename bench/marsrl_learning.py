"""MarsRL comparison (issue 12; MarsRL §3 at small scale), through the real services.

    .venv/bin/python bench/marsrl_learning.py                  # 4 arms × 3 seeds (about 40 minutes)
    .venv/bin/python bench/marsrl_learning.py --quick          # 4 arms × 1 seed, short runs
    .venv/bin/python bench/marsrl_learning.py --arms agent --seeds 0 --set marsrl.select_k=2

Every run starts from the same cached MarsRL warm start (three distinct models) and trains on
training-split problems as a `marsrl` job on a local cluster (embedded Redis, controller, the
solver's, verifier's and corrector's trainer services as processes); `run_seed` varies the run.
The final checkpoints are evaluated with the inference-time V–C loop on the same seeded held-out
problems at temperature 1: solver-alone and V–C-system accuracy, verifier precision and recall.
Writes `results.json` and `table.md` into `--out`.

Arms: agent (agent-specific rewards, adaptive selection: the default), outcome (every role rewarded
by the final outcome, MarsRL's baseline), random (agent-specific rewards, random selection), balanced
(agent-specific rewards, as many right as wrong inputs per later agent), pipelined (agent, with
max_staleness 1: rollouts of step s + 1 overlap every trainer's update of step s; issue 13),
balanced_s3 (balanced selection and S → V → C only: the verifier reviews the solver's solutions, one
right and one wrong when both exist, never the corrector's mostly wrong revisions; issue 41).
`--arms` defaults to the first four. Besides the accuracies: the V–C system's paired gain over the
solver alone on the same problems (`system_minus_solver`, its paired standard error in the run's
`final`), the verifier's recall on wrong and on right solutions and their mean (balanced accuracy),
the loop's accept rate and the corrector's fix and break rates (`mgrpo.workflows.marsrl.vc_metrics`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import merge, parse_sets

from mgrpo.config import JobConfig
from mgrpo.evaluation import paired_gain
from mgrpo.models import load
from mgrpo.tasks.arithmetic import make_problems
from mgrpo.workflows import job_spec
from mgrpo.workflows.marsrl_warmstart import ROLES, cached_warmstart, evaluate_system
from services.demo import run_train
from services.demo_marsrl import majority_baseline

ARMS: dict[str, dict[str, Any]] = {
    "agent": {"marsrl": {"reward": "agent", "selection": "adaptive"}},
    "outcome": {"marsrl": {"reward": "outcome", "selection": "adaptive"}},
    "random": {"marsrl": {"reward": "agent", "selection": "random"}},
    "balanced": {"marsrl": {"reward": "agent", "selection": "balanced"}},
    "pipelined": {"marsrl": {"reward": "agent", "selection": "adaptive"}, "max_staleness": 1},
    "balanced_s3": {"marsrl": {"reward": "agent", "selection": "balanced", "max_agent_steps": 3}},
}
METRICS = (
    "solver_accuracy",
    "system_accuracy",
    "system_minus_solver",
    "verifier_balanced_accuracy",
    "verifier_recall",
    "verifier_recall_right",
    "accept_rate",
    "corrector_fix_rate",
    "corrector_break_rate",
)


def job_for(arm: str, seed: int, args: argparse.Namespace) -> JobConfig:
    base = {
        "workflow": "marsrl",
        "prompts_per_step": 8,
        "rollouts_per_query": 8,
        "roles": {r: {"optim": {"lr": args.lr}} for r in ROLES},
    }
    cfg = merge(merge(base, ARMS[arm]), parse_sets(args.set))
    cfg.update(steps=args.steps, run_seed=seed)
    return JobConfig.model_validate(cfg)


def evaluate(job: JobConfig, paths: dict[str, Path], n: int) -> dict[str, float]:
    """`vc_metrics` of these checkpoints, and the V–C system's paired gain over the solver alone."""
    ws = job_spec(job).warmstart_config()
    problems = make_problems("heldout", n, seed=1000 + ws.seed, n_ops=ws.n_ops)
    outcomes: dict[str, list[float]] = {}
    models = {r: load(p) for r, p in paths.items()}
    m = evaluate_system(problems, models, outcomes=outcomes, calculator=ws.calculator)
    gain = paired_gain(outcomes["solver_accuracy"], outcomes["system_accuracy"])
    return {**m, "system_minus_solver": gain.gain, "system_minus_solver_se": gain.se}


def run_one(arm: str, seed: int, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    job = job_for(arm, seed, args)
    out = args.out / "runs" / f"{arm}-seed{seed}"
    t0 = time.perf_counter()
    final = run_train(job, out, redis_url=args.redis_url, cache_dir=args.cache_dir, console=console)
    train_s = time.perf_counter() - t0
    if final["status"] != "succeeded":
        raise RuntimeError(f"{arm} seed {seed}: job {final['status']}: {final['reason']}")
    last = f"step-{args.steps - 1:06d}"
    paths = {r: out / "checkpoints" / r / final["job_id"] / r / last for r in ROLES}
    result = evaluate(job, paths, args.eval_problems)
    console.print(f"  {arm} seed {seed}: " + "  ".join(f"{m} {result[m]:.3f}" for m in METRICS))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "arm": arm,
        "seed": seed,
        "job": job.model_dump(mode="json"),
        "train_s": train_s,
        "final": result,
        "train_solver_accuracy": [r.get("solver/accuracy") for r in rows],
    }


def summarise(runs: list[dict[str, Any]], start: dict[str, float]) -> list[dict[str, Any]]:
    table = []
    for arm in dict.fromkeys(r["arm"] for r in runs):
        mine = [r["final"] for r in runs if r["arm"] == arm]
        row: dict[str, Any] = {"arm": arm, "seeds": len(mine)}
        for m in METRICS:
            vals = [x[m] for x in mine]
            row[m] = {
                "start": start[m],
                "mean": statistics.fmean(vals),
                "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                "values": vals,
            }
        table.append(row)
    return table


def write_table(table: list[dict[str, Any]], majority: float, n: int, path: Path) -> None:
    head = "| arm | seeds | " + " | ".join(f"{m}: start → final (mean ± sd)" for m in METRICS) + " |"
    lines = [head, "|---|---|" + "---|" * len(METRICS)]
    for r in table:
        cells = " | ".join(f"{r[m]['start']:.3f} → {r[m]['mean']:.3f} ± {r[m]['std']:.3f}" for m in METRICS)
        lines.append(f"| {r['arm']} | {r['seeds']} | {cells} |")
    lines.append(f"\n{n} held-out problems, T = 1, seeded; majority-answer baseline {majority:.3f}.")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 seed, 6 steps, 100 problems")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS)[:4])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval-problems", type=int, default=400)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="job-config override")
    ap.add_argument("--out", type=Path, default=Path("bench/results/marsrl"))
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/mgrpo"))
    ap.add_argument("--redis-url", default=None)
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.steps, args.eval_problems = args.seeds[:1], 6, 100
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console()
    job = job_for(args.arms[0], args.seeds[0], args)
    warm = cached_warmstart(job_spec(job).warmstart_config(), args.cache_dir)
    start = evaluate(job, {r: warm.path(r) for r in ROLES}, args.eval_problems)
    majority = majority_baseline(job_spec(job).warmstart_config(), args.eval_problems)
    console.print("warm start: " + "  ".join(f"{m} {start[m]:.3f}" for m in METRICS))
    runs = []
    for seed in args.seeds:  # seed-major: a study cut short still has every arm of its first seeds
        for arm in args.arms:
            runs.append(run_one(arm, seed, args, console))
            payload = {
                "runs": runs,
                "start": start,
                "majority_baseline": majority,
                "table": summarise(runs, start),
            }
            (args.out / "results.json").write_text(json.dumps(payload, indent=1))
    write_table(summarise(runs, start), majority, args.eval_problems, args.out / "table.md")
    console.print((args.out / "table.md").read_text())
    console.print(f"wrote {args.out}/results.json and table.md")


if __name__ == "__main__":
    main()
