"""Learning comparison (issue 7; M-GRPO paper §5 at small scale), through the real services.

    .venv/bin/python bench/learning.py                 # 4 arms × 3 seeds (about 2 hours on 2 cores)
    .venv/bin/python bench/learning.py --quick         # 4 arms × 1 seed, short runs (about 15 minutes)
    .venv/bin/python bench/learning.py --arms co_train --seeds 0 --set planner_optim.lr=1e-4
    .venv/bin/python bench/learning.py --worlds 301 302 303 --arms co_train main_only single_agent \
        --seeds 0 1 --steps 20 --eval-every 20 --eval-questions 400   # issue 43: worlds nobody tuned on
    .venv/bin/python bench/learning.py --worlds 0 --plateau --arms co_train main_only --seeds 0 1 \
        --steps 20 --eval-every 20 --eval-questions 400 --set warmstart_guess_share=0.3
        # issue 43: from a warm start trained to its plateau on a flawed sub-agent demonstrator
    .venv/bin/python bench/learning.py --combine A/results.json B/results.json --out C
        # one --worlds study run in parts (other arms or worlds later): one table, paired as if one run

Every run starts from the same cached warm start and trains on stage-2 training-split questions as a
job on a local cluster (embedded Redis, controller, planner and sub-agent services as processes);
`run_seed` varies the run (question order, alignment draws, sampling), not the world. Checkpoints
every `--eval-every` steps are then evaluated on the same held-out stage-2 questions at temperature 1
and greedy, next to the majority-answer baseline and a process metric (planner: first delegation is
the gold subtask; single agent: first search names the right person). Writes `results.json`,
`curves.png` and `table.md` into `--out`.

`--worlds A B …` repeats the study on each world (`JobConfig.seed`: the built-in world and its own warm
start) and compares the arms' final held-out success per world and pooled with paired standard errors:
every arm of a world is scored on the same questions with the same seeded draws, each question's
success averaged over the run seeds, differences taken per question (`evaluation.paired_by_question`).
The evaluation worlds are written down in docs/results.md; tuning happens on world 0 only.

Arms: co_train (M-GRPO), main_only (sub-agent frozen), single_agent (one model, all tools),
co_train_no_align (co_train with `alignment: none`); and, when named in `--arms`, co_train_pipelined
(co_train with max_staleness 1: rollouts overlap updates, stale samples reweighted; issue 13).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from worlds import (
    ARMS,
    CELLS,
    PLATEAU_LADDER,
    combine,
    compare_worlds,
    plateau,
    write_world_table,
)

from mgrpo.config import JobConfig
from mgrpo.engines.hf import HFEngine
from mgrpo.evaluation import evaluate_single
from mgrpo.models import load
from mgrpo.workflows import job_spec
from mgrpo.workflows.deep_research_eval import (
    EVAL_SEED,
    evaluate_paired,
    evaluate_single_model,
    evaluate_system,
    heldout_questions,
    majority_baseline,
)
from mgrpo.workflows.deep_research_warmstart import cached_ladder, cached_warmstart, job_task
from services.demo import run_train

TRAIN_SERIES = (  # per-step training metrics kept per run: does each role's advantage carry signal?
    "planner/success",
    "planner/flat_share",
    "planner/adv_std",
    "subagent/reward_mean",
    "subagent/flat_share",
    "subagent/adv_std",
)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`a.b=value` pairs (values parsed as YAML) into a nested dict of job-config overrides."""
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(value)
    return out


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def job_for(arm: str, seed: int, args: argparse.Namespace, world: int | None = None) -> JobConfig:
    base = yaml.safe_load(Path(args.job).read_text()) if args.job else {}
    cfg = merge(merge(base, ARMS[arm]), parse_sets(args.set))
    cfg.update(steps=args.steps, run_seed=seed, checkpoint_keep_every_steps=args.eval_every)
    if world is not None:
        cfg["seed"] = world
    return JobConfig.model_validate(cfg)


def evaluate_checkpoint(job: JobConfig, planner: Path, subagent: Path | None, n: int) -> dict[str, Any]:
    """Held-out stage 2 at T = 1 and greedy, and the T = 1 success of each question by id
    (`by_question`, for the paired comparisons of `--worlds`)."""
    task, ws = job_task(job), job_spec(job).warmstart_config()
    qs = heldout_questions(task, ws, 2, n)
    qids = [q.qid for q in qs]
    if len(set(qids)) != len(qids):
        raise RuntimeError("held-out questions repeat a question id: a per-question pairing would merge them")
    greedy: dict[str, Any] = {"stages": (2,), "temperatures": (0.0,), "n_questions": n}
    if subagent is None:
        single, outcomes = load(planner), list[float]()
        engine = HFEngine(*single)
        try:
            t1 = evaluate_single(
                engine, task, qs, majority_baseline(task), temperature=1.0, seed=EVAL_SEED, outcomes=outcomes
            )
        finally:
            engine.close()
        out = evaluate_single_model(task, single, ws, **greedy)
    else:
        system = (load(planner), load(subagent))
        metrics, outs = evaluate_paired(task, ws, {"it": system}, n_questions=n)
        t1, outcomes = metrics["it"], outs["it"]
        out = evaluate_system(task, *system, ws, **greedy)
    return {CELLS[0]: t1, **out, "by_question": dict(zip(qids, outcomes, strict=True))}


def run_one(
    arm: str,
    seed: int,
    args: argparse.Namespace,
    start: dict[str, Any],
    console: Console,
    world: int | None = None,
) -> dict[str, Any]:
    job = job_for(arm, seed, args, world)
    out = args.out / "runs" / (f"{arm}-seed{seed}" if world is None else f"world{world}-{arm}-seed{seed}")
    t0 = time.perf_counter()
    final = run_train(job, out, redis_url=args.redis_url, cache_dir=args.cache_dir, console=console)
    train_s = time.perf_counter() - t0
    if final["status"] != "succeeded":
        raise RuntimeError(f"{arm} seed {seed}: job {final['status']}: {final['reason']}")
    root = out / "checkpoints" / "planner" / final["job_id"] / "planner"
    sub_root = out / "checkpoints" / "subagent" / final["job_id"] / "subagent"
    curve = [{"updates": 0, **start}]
    for step in range(args.eval_every - 1, args.steps, args.eval_every):
        name = f"step-{step:06d}"
        sub = None if job.mode == "single_agent" else sub_root / name
        curve.append({"updates": step + 1, **evaluate_checkpoint(job, root / name, sub, args.eval_questions)})
        console.print(f"  {arm} seed {seed} after {step + 1} steps: {_cell_line(curve[-1])}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "arm": arm,
        "seed": seed,
        "world": job.seed,
        "job": job.model_dump(mode="json"),
        "train_s": train_s,
        "curve": curve,
        "train_success": [r.get("planner/success") for r in rows],
        "train": {k: [r.get(k) for r in rows] for k in TRAIN_SERIES},
    }


def _cell_line(point: dict[str, Any]) -> str:
    return "  ".join(f"{c[-2:]} {point[c]['success']:.3f}" for c in CELLS if c in point)


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    table = []
    for arm in dict.fromkeys(r["arm"] for r in runs):
        mine = [r for r in runs if r["arm"] == arm]
        row: dict[str, Any] = {"arm": arm, "seeds": len(mine)}
        for cell in CELLS:
            start = mine[0]["curve"][0][cell]["success"]
            final = [r["curve"][-1][cell]["success"] for r in mine]
            row[cell] = {
                "start": start,
                "final_mean": statistics.fmean(final),
                "final_std": statistics.stdev(final) if len(final) > 1 else 0.0,
                "final": final,
            }
        row["majority_baseline"] = mine[0]["curve"][0][CELLS[0]]["majority_baseline"]
        table.append(row)
    return table


def write_table(table: list[dict[str, Any]], path: Path) -> None:
    lines = [
        "| arm | seeds | held-out T=1: start → final (mean ± sd) | greedy: start → final | majority |",
        "|---|---|---|---|---|",
    ]
    for r in table:
        t1, t0 = r[CELLS[0]], r[CELLS[1]]
        lines.append(
            f"| {r['arm']} | {r['seeds']} | {t1['start']:.3f} → {t1['final_mean']:.3f} ± {t1['final_std']:.3f} "
            f"| {t0['start']:.3f} → {t0['final_mean']:.3f} ± {t0['final_std']:.3f} | {r['majority_baseline']:.3f} |"
        )
    path.write_text("\n".join(lines) + "\n")


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for arm in dict.fromkeys(r["arm"] for r in runs):
        mine = [r for r in runs if r["arm"] == arm]
        xs = [p["updates"] for p in mine[0]["curve"]]
        for ax, cell, metric in (
            (axes[0], CELLS[0], "success"),
            (axes[1], CELLS[1], "success"),
            (axes[2], CELLS[0], None),
        ):
            key = metric or (
                "first_search_right_entity" if arm == "single_agent" else "planner_first_delegation_gold"
            )
            ys = [[r["curve"][i][cell][key] for r in mine] for i in range(len(xs))]
            mean = [statistics.fmean(y) for y in ys]
            (line,) = ax.plot(xs, mean, marker=".", label=arm)
            ax.fill_between(
                xs, [min(y) for y in ys], [max(y) for y in ys], color=line.get_color(), alpha=0.15
            )
    base = runs[0]["curve"][0][CELLS[0]]["majority_baseline"]
    titles = (
        "held-out stage 2, T=1: success",
        "held-out stage 2, greedy: success",
        "process: first call names the right entity (T=1)",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training steps")
        ax.set_ylim(0, 1)
    for ax in axes[:2]:
        ax.axhline(base, color="#999", ls="--", lw=1, label="majority answer")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def find_plateau(world: int | None, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """`plateau` of one world's warm start, each rung scored like the study's start (stage 2, T = 1)."""

    job = job_for("co_train", 0, args, world)
    rungs = cached_ladder(job_spec(job).warmstart_config(), PLATEAU_LADDER, args.cache_dir)

    def scores(steps: int) -> dict[str, float]:  # asked rung by rung: one SFT run goes on while asked
        ws = next(rungs)
        if json.loads((ws.folder / "config.json").read_text())["config"]["steps"] != steps:
            raise RuntimeError(f"the warm-start ladder is out of step with PLATEAU_LADDER at {steps}")
        out = evaluate_checkpoint(job, ws.planner_path, ws.subagent_path, args.eval_questions)
        console.print(f"world {job.seed} warm start of {steps} SFT steps: {_cell_line(out)}")
        return dict(out["by_question"])

    found = plateau(scores)
    console.print(f"world {world}: plateau at {found['steps']} SFT steps")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 seed, 8 steps, 100 questions: about 15 minutes")
    ap.add_argument("--worlds", nargs="+", type=int, help="world seeds to repeat the study on (issue 43)")
    ap.add_argument(
        "--plateau",
        action="store_true",
        help="each world's warm start trained to its plateau (PLATEAU_LADDER of SFT steps; hours on 2 cores)",
    )
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS)[:4])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-questions", type=int, default=200)
    ap.add_argument("--job", help="YAML job config the arms start from (default: JobConfig defaults)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="job-config override")
    ap.add_argument("--out", type=Path, default=Path("bench/results/learning"))
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/mgrpo"))
    ap.add_argument("--redis-url", default=None)
    ap.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="RESULTS_JSON",
        help="the results.json of a --worlds study run in parts: writes their combined results.json and worlds.md into --out (runs nothing)",
    )
    args = ap.parse_args()
    if args.combine:
        args.out.mkdir(parents=True, exist_ok=True)
        runs, starts, plateaus = combine(args.combine)
        study = {"runs": runs, "plateaus": plateaus, "parts": [str(p) for p in args.combine]}
        study["worlds"] = compare_worlds(runs, starts)
        (args.out / "results.json").write_text(json.dumps(study, indent=1))
        write_world_table(study["worlds"], args.out / "worlds.md")
        Console().print((args.out / "worlds.md").read_text())
        return
    if args.quick:
        args.seeds, args.steps, args.eval_every, args.eval_questions = args.seeds[:1], 8, 4, 100
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console()
    starts: dict[tuple[int, bool], dict[str, Any]] = {}
    runs = []
    plateaus: dict[int, dict[str, Any]] = {}
    for world in args.worlds or [None]:
        if args.plateau:  # the arms then start from it (JobConfig.warmstart_steps)
            plateaus[world or 0] = find_plateau(world, args, console)
            args.set = [s for s in args.set if not s.startswith("warmstart_steps=")]
            args.set.append(f"warmstart_steps={plateaus[world or 0]['steps']}")
        for seed in args.seeds:  # seed-major: a study cut short still has every arm of its first seeds
            for arm in args.arms:
                job = job_for(arm, seed, args, world)
                key = (job.seed, job.mode == "single_agent")
                if key not in starts:  # the warm start's own numbers on the same questions
                    ws = cached_warmstart(
                        job_spec(job).warmstart_config(), args.cache_dir, single_agent=key[1]
                    )
                    starts[key] = evaluate_checkpoint(
                        job, ws.planner_path, None if key[1] else ws.subagent_path, args.eval_questions
                    )
                    who = "single agent" if key[1] else "planner + sub-agent"
                    console.print(f"world {job.seed} warm start ({who}): {_cell_line(starts[key])}")
                runs.append(run_one(arm, seed, args, starts[key], console, world))
                results: dict[str, Any] = {"runs": runs, "plateaus": plateaus}
                results |= (
                    {"worlds": compare_worlds(runs, starts)} if args.worlds else {"table": summarise(runs)}
                )
                (args.out / "results.json").write_text(json.dumps(results, indent=1))
                if args.worlds:  # a study cut short keeps the table of what it ran
                    write_world_table(results["worlds"], args.out / "worlds.md")
    if args.worlds:  # one table per world and pooled; the single-world table and curves would mix worlds
        console.print((args.out / "worlds.md").read_text())
        console.print(f"wrote {args.out}/results.json, worlds.md")
        return
    table = summarise(runs)
    write_table(table, args.out / "table.md")
    plot(runs, args.out / "curves.png")
    console.print((args.out / "table.md").read_text())
    console.print(f"wrote {args.out}/results.json, table.md, curves.png")


if __name__ == "__main__":
    main()
