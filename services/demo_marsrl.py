"""`mgrpo demo --workflow marsrl`: MarsRL on one machine, start to finish.

1. the MarsRL warm start (solver, verifier, corrector and a shared model; cached) with a progress bar;
2. a local cluster: embedded Redis (unless REDIS_URL), the controller and one trainer service per
   role (three models), or the solver's alone holding one model for every role (`--shared`);
3. one `marsrl` job over REST, followed live (each role's mean reward, the solver's accuracy, step time);
4. the warm start and the final checkpoints evaluated side by side with the inference-time V–C loop on
   the same seeded held-out problems: solver-alone and V–C-system accuracy with standard errors and
   each gain with its paired standard error (the same problems and draws on both sides, as the deep-
   research demo), verifier precision / recall, next to the majority-answer baseline;
   `metrics.jsonl`, `rewards.png`, `eval.json` in the run folder.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from mgrpo.config import JobConfig
from mgrpo.evaluation import PairedGain, paired_gain
from mgrpo.models import load
from mgrpo.tasks.arithmetic import make_problems
from mgrpo.workflows import job_spec
from mgrpo.workflows.marsrl import ACCURACIES
from mgrpo.workflows.marsrl_warmstart import ROLES, MarsWarmstart, MarsWarmstartConfig, evaluate_system
from services.demo import (
    DemoOptions,
    describe_warm_start,
    plot_run,
    run_job,
    tracked,
    warmstart_with_progress,
)
from services.launcher import LocalCluster
from services.progress import PhaseClock, step_progress

EVAL_PROBLEMS = 400  # the MarsRL demo's held-out problems
DEMO_STEPS = 20  # its marsrl steps
ROWS = (
    "solver_accuracy",
    "system_accuracy",
    "verifier_precision",
    "verifier_recall",
    "verifier_recall_right",
    "verifier_balanced_accuracy",
    "verifier_accuracy",
    "always_correct_verifier_accuracy",
    "accept_rate",
    "corrector_fix_rate",
    "corrector_break_rate",
    "iterations_mean",
)


def marsrl_job(
    steps: int,
    lr: float,
    *,
    shared: bool,
    warmstart_steps: int | None = None,
    tracking: tuple[str, ...] = (),
    lora: int = 0,
) -> JobConfig:
    """The MarsRL demo's job (`lora` > 0: each role trains an adapter of that rank; with `shared`,
    three adapters on the one shared base in the solver's trainer)."""
    adapter = {"lora": {"rank": lora, "alpha": 2 * lora}} if lora else {}
    roles: dict[str, Any] = {r: {"optim": {"lr": lr}, **adapter} for r in ROLES}
    if shared:
        roles = {
            "solver": roles["solver"],
            **{r: {"share_model_with": "solver", "optim": {"lr": lr}, **adapter} for r in ROLES[1:]},
        }
    return JobConfig(
        workflow="marsrl",
        steps=steps,
        prompts_per_step=8,
        rollouts_per_query=8,
        roles=roles,
        warmstart_steps=warmstart_steps,
        tracking=list(tracking),
    )


def _on_the_solvers_volume(solver_checkpoint: str, role: str) -> Path:
    """A role's checkpoint of the same step when it trains its own adapter in the solver's trainer:
    `<job>/<role>/step-N` beside the solver's `<job>/solver/step-N`."""
    path = Path(solver_checkpoint)
    return path.parent.parent / role / path.name


def majority_baseline(cfg: MarsWarmstartConfig, n: int) -> float:
    """Accuracy on the held-out problems of always answering the most common train answer."""
    train = Counter(p.answer for p in make_problems("train", 3000, seed=cfg.seed, n_ops=cfg.n_ops))
    guess = train.most_common(1)[0][0]
    held = make_problems("heldout", n, seed=1000 + cfg.seed, n_ops=cfg.n_ops)
    return sum(p.answer == guess for p in held) / len(held)


def eval_count(options: DemoOptions) -> int:
    """The held-out problems this demo evaluates on: the option, else its default."""
    return options.eval_questions or EVAL_PROBLEMS


def run_marsrl_demo(out: Path, options: DemoOptions, console: Console) -> dict[str, Any]:
    """The MarsRL demo (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    redis_url, cache_dir, shared = options.redis_url, options.cache_dir, options.shared
    eval_problems = eval_count(options)
    job = job_spec(
        marsrl_job(
            options.steps or DEMO_STEPS,
            options.lr,
            shared=shared,
            warmstart_steps=options.warmstart_steps,
            tracking=options.tracking,
            lora=options.lora,
        )
    )
    ws = job.warm_start().config(job)
    clock = PhaseClock(console)
    with clock.phase("warm start"):
        warm = warmstart_with_progress(job, cache_dir, console, ws)
        describe_warm_start(job, warm, console)
    assert isinstance(warm, MarsWarmstart)
    cluster = LocalCluster(
        out,
        redis_url=redis_url,
        roles=job.trainer_roles,
        extra_env={"MGRPO_CACHE_DIR": str(cache_dir.resolve())},
    )
    with clock.phase("services"):
        console.print(
            f"[dim]Redis {redis_url or '(embedded)'}, the controller and the {', '.join(job.trainer_roles)} "
            f"trainer service(s); logs in {out}/logs[/]"
        )
        cluster.start()
    try:
        with clock.phase("job"):
            final, rows, latest = run_job(cluster, job.cfg, out, console, title="MarsRL")
    finally:
        cluster.stop()
    if final["status"] != "succeeded":
        raise RuntimeError(f"the demo job {final['status']}: {final['reason']}")
    job_id = final["job_id"]
    problems = make_problems("heldout", eval_problems, seed=1000 + ws.seed, n_ops=ws.n_ops)
    outcomes: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    systems = {
        "before": dict.fromkeys(ROLES, load(warm.path("shared")))
        if shared
        else {r: load(warm.path(r)) for r in ROLES},
        "after": {r: load(_on_the_solvers_volume(latest["solver"], r)) for r in ROLES}
        if shared and options.lora
        else dict.fromkeys(ROLES, load(latest["solver"]))
        if shared
        else {r: load(latest[r]) for r in ROLES},
    }
    title = f"held-out V–C evaluation, warm start then trained, {eval_problems} problems each"
    with clock.phase("evaluation"), step_progress(console, title, 2 * eval_problems) as bar:
        before, after = (
            evaluate_system(
                problems,
                systems[s],
                outcomes=outcomes[s],
                on_done=lambda: bar.advance("problems"),
                calculator=ws.calculator,
            )
            for s in ("before", "after")
        )
    majority = majority_baseline(ws, eval_problems)
    gains = {name: paired_gain(outcomes["before"][name], outcomes["after"][name]) for name in ACCURACIES}
    loop = {when: paired_gain(o["solver_accuracy"], o["system_accuracy"]) for when, o in outcomes.items()}
    result = {
        "job_id": job_id,
        "problems": eval_problems,
        "shared": shared,
        "before": before,
        "after": after,
        "gains": {
            name: {"gain": g.gain, "paired_se": g.se, "unpaired_se": g.se_unpaired}
            for name, g in gains.items()
        },
        "system_minus_solver": {when: {"gain": g.gain, "paired_se": g.se} for when, g in loop.items()},
        "outcomes": outcomes,
        "majority_baseline": majority,
        "checkpoints": latest,
    }
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    _plot(rows, before, after, majority, eval_problems, out / "rewards.png")
    summary(before, after, gains, majority, eval_problems, console)
    what_the_loop_adds(loop, console)
    console.print(
        f"wrote {out}/metrics.jsonl, {out}/rewards.png, {out}/eval.json; checkpoints in {out}/checkpoints"
    )
    tracked(out, options, console)
    console.print(clock.total())
    return result


def summary(
    before: dict[str, float],
    after: dict[str, float],
    gains: dict[str, PairedGain],
    majority: float,
    n: int,
    console: Console,
) -> None:
    table = Table(
        "metric", "warm start", "after MarsRL", title=f"held-out problems (n = {n}), T = 1, seeded, V–C loop"
    )
    for name in ROWS:
        b, a = before[name], after[name]
        if name in ACCURACIES:
            table.add_row(
                name, f"{b:.3f} ± {before[name + '_se']:.3f}", f"{a:.3f} ± {after[name + '_se']:.3f}"
            )
        else:
            table.add_row(name, f"{b:.3f}", f"{a:.3f}")
    table.add_row("majority-answer baseline", f"{majority:.3f}", f"{majority:.3f}")
    console.print(table)
    for name, g in gains.items():
        unpaired = g.gain / g.se_unpaired if g.se_unpaired else 0.0
        console.print(
            f"{name} {g.before:.3f} → {g.after:.3f}: {g.gain:+.3f} ± {g.se:.3f} ({g.z:+.1f} standard errors, "
            f"paired: same problems, same seeded draws; {unpaired:+.1f} if the two were independent)"
        )


def what_the_loop_adds(loop: dict[str, PairedGain], console: Console) -> None:
    """The V–C system against the solver alone on the same problems, before and after training."""
    console.print(
        "V–C system − solver alone: "
        + ", ".join(f"{when} {g.gain:+.3f} ± {g.se:.3f} ({g.z:+.1f} paired SE)" for when, g in loop.items())
    )


def _plot(
    rows: list[dict[str, Any]],
    before: dict[str, float],
    after: dict[str, float],
    majority: float,
    n: int,
    path: Path,
) -> None:
    bars = {
        f"{name}\n{when}": (m[key], m[key + "_se"])
        for name, key in (("solver", "solver_accuracy"), ("V–C", "system_accuracy"))
        for when, m in (("warm", before), ("after", after))
    }
    bars["majority"] = (majority, 0.0)
    plot_run(
        rows,
        ("solver/reward_mean", "verifier/reward_mean", "corrector/reward_mean"),
        bars,
        f"held-out accuracy, T=1, n={n}",
        path,
    )
