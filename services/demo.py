"""`mgrpo demo`: the whole system on one machine, start to finish.

1. warm start: shipped in `mgrpo/shipped/` (checked by sha256; `mgrpo warmstart --rebuild` rebuilds it,
   about 8 minutes on 2 cores);
2. a local cluster: embedded Redis (unless REDIS_URL) and the three services as separate processes;
3. one `co_train` job (30 steps) submitted over REST, followed live (step, reward per role, timings);
4. the final checkpoints evaluated on held-out stage-2 questions with the seeded draws of the warm
   start's outcomes shipped with it for this processor's numerics (`shipped.baseline`; `--fresh-baseline`,
   another question count, a processor none was shipped for or a warm start not shipped: the warm start
   is evaluated here too), printed with the gain's paired
   standard error next to the baselines. 1,600 questions by default: the paired standard error near
   0.011, where 400 gave 0.022 (one run's first 400 questions printed +0.045, all 1,600 +0.086);
   `metrics.jsonl`, `rewards.png`, `eval.json` (with each question's success before and after) and
   both checkpoints in the run folder."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from mgrpo.config import JobConfig
from mgrpo.evaluation import PairedGain, paired_gain
from mgrpo.tasks.deep_research import DeepResearchTask
from mgrpo.workflows import JobSpec, get_workflow, job_spec
from mgrpo.workflows.deep_research_warmstart import (
    SHARED,
    WarmstartConfig,
    WarmstartResult,
    job_task,
)
from mgrpo.workflows.demo_baseline import (
    DEMO_EVAL_QUESTIONS,
    baseline_key,
    evaluate_heldout,
    numerics_fingerprint,
)
from mgrpo.workflows.shipped import baseline, provenance
from mgrpo.workflows.spec import Built, WarmStart
from services.launcher import LocalCluster
from services.progress import PhaseClock, phases, step_progress

HEADLINE = "heldout_stage2_T1"
LABELS = {"before": "warm start", "after": "trained"}


def warmstart_with_progress(
    job: JobSpec, cache_dir: Path, console: Console, config: Any = None, ws: WarmStart | None = None
) -> Built:
    """The job's cached warm start (`config`: its warm start's config, default the job's; `ws`:
    another warm start of its workflow's) with its progress: the SFT steps, then its evaluation's
    rollouts (each its own display, so that each rate and ETA is of one kind of work)."""
    ws = ws or job.warm_start()
    config = ws.config(job) if config is None else config
    steps, evals = ws.steps(config), ws.eval_rollouts(config)
    with phases(console) as show:
        show.start(ws.title, steps, "(cached runs skip this)")

        def on_step(step: int, m: dict[str, float]) -> None:
            info = "  ".join(f"{k.replace('/sft_loss', '')} loss {v:.3f}" for k, v in m.items())
            show.update(step + 1, "SFT " + info)

        def on_eval() -> None:
            show.advance_in("warm-start evaluation", evals, "held-out rollouts")

        built = ws.build(config, cache_dir, on_step=on_step, on_eval=on_eval)
        if built.cached:
            show.update(steps, "shipped" if provenance(built.folder) else "cached")
    return built


def describe_warm_start(job: JobSpec, built: Built, console: Console) -> None:
    """Where the warm start came from and what it scored on its own held-out questions."""
    origin = provenance(built.folder)
    if origin is not None:
        console.print(f"shipped warm start: {built.folder}\n  {origin}")
    else:
        console.print(f"warm start {'from the cache' if built.cached else 'built'}: {built.folder}")
    for line in job.warm_start().summary(built):
        console.print(f"  {line.strip()}")


DEMO_STEPS = 30  # its co_train steps: where the gain clears +0.08 and 6 paired SE (docs/results.md)


@dataclass(frozen=True)
class DemoOptions:
    """What `mgrpo demo` takes; every workflow's demo (`Workflow.demo`) reads the options it uses.
    `steps` and `eval_questions` None: the demo's own defaults."""

    steps: int | None = None
    redis_url: str | None = None
    cache_dir: Path = Path(".cache/mgrpo")
    lr: float = 1e-4
    ppo_epochs: int = 1
    eval_questions: int | None = None
    shared: bool = False
    warmstart_steps: int | None = None
    fresh_baseline: bool = False
    tracking: tuple[str, ...] = ()  # experiment trackers of the job (mgrpo.tracking): runs/<demo>/tracking
    lora: int = 0  # > 0: every trainer role trains a LoRA adapter of this rank on its frozen warm start


def role_settings(options: DemoOptions) -> dict[str, Any]:
    """What the demo's job sets for each role with a trainer: its update, and its adapter (`--lora`)."""
    out: dict[str, Any] = {"optim": {"lr": options.lr, "ppo_epochs": options.ppo_epochs}}
    if options.lora:
        out["lora"] = {"rank": options.lora, "alpha": 2 * options.lora}
    return out


def eval_count(options: DemoOptions) -> int:
    """The held-out questions this demo evaluates on: the option, else its default."""
    return options.eval_questions or DEMO_EVAL_QUESTIONS


def step_count(options: DemoOptions) -> int:
    """The co_train steps of this demo's job: the option, else its default."""
    return options.steps or DEMO_STEPS


def run_demo(out: Path, options: DemoOptions, console: Console) -> dict[str, Any]:
    """The deep-research demo (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    redis_url, cache_dir = options.redis_url, options.cache_dir
    eval_questions = eval_count(options)
    roles = {"planner": role_settings(options), "subagent": role_settings(options)}
    if options.shared:  # the sub-agent hosted in the planner's service, its adapter on the planner's base
        if not options.lora:
            raise ValueError(
                "--shared: the sub-agent trains an adapter of its own on the planner's base: add --lora 8"
            )
        roles["subagent"]["share_model_with"] = "planner"
    job = job_spec(
        JobConfig(
            steps=step_count(options),
            warmstart_steps=options.warmstart_steps,
            roles=roles,
            tracking=list(options.tracking),
        )
    )
    clock = PhaseClock(console)
    with clock.phase("warm start"):
        warm = warmstart_with_progress(job, cache_dir, console, ws=SHARED if options.shared else None)
        describe_warm_start(job, warm, console)
    assert isinstance(warm, WarmstartResult)
    cluster = LocalCluster(
        out,
        redis_url=redis_url,
        extra_env={"MGRPO_CACHE_DIR": str(cache_dir.resolve())},
        roles=job.trainer_roles,
    )
    with clock.phase("services"):
        console.print(
            f"[dim]Redis {redis_url if redis_url else '(embedded)'}, the controller and the "
            f"{' and '.join(job.trainer_roles)} services; logs in {out}/logs[/]"
        )
        cluster.start()
    try:
        with clock.phase("job"):
            final, rows, latest = run_job(cluster, job.cfg, out, console)
    finally:
        cluster.stop()
    if final["status"] != "succeeded":
        raise RuntimeError(f"the demo job {final['status']}: {final['reason']}")
    job_id = final["job_id"]
    task, ws = job_task(job.cfg), job.warm_start().config(job)
    systems = {
        "before": (warm.planner_path, warm.subagent_path),
        "after": (Path(latest["planner"]), Path(latest["subagent"])),
    }
    shipped = None
    if not options.fresh_baseline:
        numerics = numerics_fingerprint(systems["before"])
        shipped = baseline(warm.folder, baseline_key(task, ws, eval_questions, numerics))
        if shipped is None and provenance(warm.folder) is not None:
            console.print(
                f"warm start: no held-out outcomes shipped for this processor model and its numerics ({numerics}), "
                "so it is evaluated here too (`mgrpo warmstart --ship-baseline` ships this machine's)"
            )
    with clock.phase("evaluation"):
        evaluations = evaluate_before_after(task, ws, systems, eval_questions, shipped, console)
    before, after = {HEADLINE: evaluations["before"]["metrics"]}, {HEADLINE: evaluations["after"]["metrics"]}
    outcomes = {name: e["outcomes"] for name, e in evaluations.items()}
    gain = paired_gain(outcomes["before"], outcomes["after"])
    result = {
        "job_id": job_id,
        "questions": eval_questions,
        "before": before,
        "after": after,
        "gain": {**asdict(gain), "z": gain.z},
        "baseline": shipped["evaluated"] if shipped else "evaluated in this run",
        "success_per_question": outcomes,
        "checkpoints": latest,
    }
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    _plot(rows, before, after, gain, out / "rewards.png")
    _summary(before, after, gain, console)
    console.print(
        f"wrote {out}/metrics.jsonl, {out}/rewards.png, {out}/eval.json; checkpoints: {latest['planner']} and {latest['subagent']}"
    )
    tracked(out, options, console)
    console.print(clock.total())
    return result


def tracked(out: Path, options: DemoOptions, console: Console) -> None:
    """Where the demo's trackers wrote, and how to open them."""
    where = {
        "tensorboard": f"tensorboard --logdir {out / 'tracking' / 'tensorboard'}",
        "mlflow": f"mlflow ui --backend-store-uri sqlite:///{(out / 'tracking' / 'mlflow.db').resolve()}",
        "wandb": f"wandb sync {out / 'tracking' / 'wandb' / 'wandb'}/offline-run-*",
    }
    for name in options.tracking:
        console.print(f"{name}: {where[name]}")


def evaluate_before_after(
    task: DeepResearchTask,
    ws: WarmstartConfig,
    systems: dict[str, tuple[Path, Path]],
    n: int,
    shipped: dict[str, Any] | None,
    console: Console,
) -> dict[str, dict[str, Any]]:
    """The "before" and "after" systems on the held-out questions (`evaluate_heldout`), "before" read
    from its shipped baseline when there is one."""
    if shipped is not None:
        e = shipped["evaluated"]
        console.print(
            f"warm start: its held-out outcomes are shipped with it (evaluated {e['date']} on "
            f"{e['processor']} at {e['code']}; --fresh-baseline evaluates it here, about a minute)"
        )
    evaluations = {"before": shipped} if shipped else {}
    names = [n for n in ("before", "after") if n not in evaluations]
    title = f"held-out evaluation, {' then '.join(LABELS[name] for name in names)}, {n} questions each"
    with step_progress(console, title, len(names) * n) as bar:
        for name in names:
            evaluations[name] = evaluate_heldout(
                task, ws, systems[name], n, on_done=lambda: bar.advance("rollouts")
            )
    return evaluations


def run_train(
    job: JobConfig, out: Path, *, redis_url: str | None, cache_dir: Path, console: Console
) -> dict[str, Any]:
    """`mgrpo train`: one job in the foreground on a local cluster; returns the finished job."""
    out.mkdir(parents=True, exist_ok=True)
    spec = job_spec(job)
    if spec.uses_presets():  # warm-start here, with a progress bar
        warmstart_with_progress(spec, cache_dir, console)
    env = {"MGRPO_CACHE_DIR": str(cache_dir.resolve())}
    if job.program is not None and job.program.entry_point is not None:  # you run it, on your machine
        env["MGRPO_ALLOWED_PROGRAMS"] = json.dumps([job.program.entry_point])
    with LocalCluster(out, redis_url=redis_url, extra_env=env, roles=spec.trainer_roles) as cluster:
        final, _, _ = run_job(cluster, job, out, console)
    if ev := final["latest_metrics"].get("eval"):
        before = f"{ev['success_before']:.3f} → " if "success_before" in ev else ""
        split = job.dataset.eval_split if job.dataset else ""
        console.print(
            f"held-out success ({int(ev['queries_after'])} rows of split {split}): {before}{ev['success_after']:.3f}"
        )
    console.print(
        f"job {final['job_id']} {final['status']} {final['reason']}; metrics in {out}/metrics.jsonl, checkpoints in {out}/checkpoints"
    )
    return final


def run_job(
    cluster: LocalCluster, job: JobConfig, out: Path, console: Console, *, title: str = "M-GRPO"
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """Submit `job` to the cluster's controller over REST and follow it to its end; writes
    `out/metrics.jsonl`. Returns the finished job, its per-step rows and each role's last checkpoint."""
    base = cluster.url("controller")
    resp = httpx.post(f"{base}/v1/jobs", json=job.model_dump(mode="json"), timeout=30)
    if resp.status_code != 201:
        raise RuntimeError(f"the controller refused the job: {resp.status_code} {resp.text}")
    final = _follow(base, resp.json()["job_id"], job.steps, console, title=title)
    records = httpx.get(f"{base}/v1/jobs/{final['job_id']}/metrics", timeout=30).json()["records"]
    checkpoints = httpx.get(f"{base}/v1/jobs/{final['job_id']}/checkpoints", timeout=30).json()["checkpoints"]
    rows = _rows(records)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return (
        final,
        rows,
        {c["role"]: str(cluster.checkpoint_dir(c["role"]) / c["checkpoint"]) for c in checkpoints},
    )


def _follow(base: str, job_id: str, steps: int, console: Console, *, title: str = "M-GRPO") -> dict[str, Any]:
    with step_progress(console, f"{title} {job_id}", steps, "loading models …") as bar:
        while True:
            job = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=30).json()
            root = (job["roles"] or ["planner"])[0]
            latest = job["latest_metrics"]
            if root in latest:  # every role's metrics (their names carry the role), the root's timings
                merged = {k: v for r in (*latest, root) for k, v in latest[r].items()}
                workflow = job["config"].get("workflow", "deep_research")
                bar.update(job["steps_done"][root] + 1, progress_line(merged, workflow))
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return dict(job)
            time.sleep(1.0)


def progress_line(root: dict[str, float | None], workflow: str = "deep_research") -> str:
    """The live line of a job: each role's mean reward (and accuracy or success; a verifier's balanced
    accuracy), root first, the step time (a value stored as null, not being finite, shows as nan)."""
    value = {k: math.nan if v is None else v for k, v in root.items()}
    parts = []
    for r in get_workflow(workflow).role_names:
        if f"{r}/reward_mean" in value:
            extra = value.get(f"{r}/success", value.get(f"{r}/accuracy"))
            balanced = value.get(f"{r}/balanced_accuracy")  # a verifier: both classes, not the base rate
            parts.append(
                f"{r} {value[f'{r}/reward_mean']:.2f}"
                + (f" (acc {extra:.2f})" if extra is not None else "")
                + (f" (balanced acc {balanced:.2f})" if balanced is not None else "")
            )
    return " · ".join(parts) + f" · {value.get('timing/step', math.nan):.1f} s/step"


def _rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_step: dict[int, dict[str, Any]] = {}
    for r in records:
        by_step.setdefault(r["step"], {"step": r["step"]}).update(r["values"])
    return [by_step[s] for s in sorted(by_step)]


def _plot(
    rows: list[dict[str, Any]],
    before: dict[str, dict[str, float]],
    after: dict[str, dict[str, float]],
    gain: PairedGain,
    path: Path,
) -> None:
    n = gain.n
    b, a = before[HEADLINE]["success"], after[HEADLINE]["success"]
    bars = {
        "warm start": (b, standard_error(b, n)),
        "after M-GRPO": (a, standard_error(a, n)),
        "majority": (after[HEADLINE]["majority_baseline"], 0.0),
    }
    plot_run(
        rows,
        ("planner/success", "planner/reward_mean", "subagent/reward_mean"),
        bars,
        f"held-out success, stage 2, T=1, n={n}\ngain {gain.gain:+.3f} ± {gain.se:.3f} (paired)",
        path,
    )


def plot_run(
    rows: list[dict[str, Any]],
    curves: tuple[str, ...],
    bars: dict[str, tuple[float, float]],
    bar_title: str,
    path: Path,
) -> None:
    """A demo's picture: training curves per step (left) and held-out bars with standard errors (right)."""
    import matplotlib  # heavy: only for the demo's picture

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing the non-interactive backend

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [2, 1]})
    steps = [r["step"] for r in rows]
    for name in curves:
        ys = [r.get(name) for r in rows]
        ax.plot(steps, [math.nan if y is None else y for y in ys], label=name, marker=".")
    ax.set_xlabel("step")
    ax.set_ylim(0, 1)
    ax.set_title("training rollouts (train split)")
    ax.legend(loc="lower right", fontsize=8)
    colors = [*["#999", "#2a7", "#bbb", "#27a"][: len(bars) - 1], "#ddd"]  # before, after, …, the baseline
    bx.bar(
        list(bars), [v for v, _ in bars.values()], yerr=[e for _, e in bars.values()], capsize=4, color=colors
    )
    bx.set_ylim(0, 1)
    bx.set_title(bar_title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def standard_error(p: float, n: int) -> float:
    """Binomial standard error of a success rate p measured on n questions."""
    return math.sqrt(max(p * (1 - p), 0.0) / max(n, 1))


def _summary(
    before: dict[str, dict[str, float]],
    after: dict[str, dict[str, float]],
    gain: PairedGain,
    console: Console,
) -> None:
    n = gain.n
    table = Table(
        "metric",
        "warm start",
        "after M-GRPO",
        title=f"held-out stage-2 questions (n = {n}, people never trained on), T = 1",
    )
    b, a = before[HEADLINE], after[HEADLINE]
    table.add_row(
        "success",
        f"{b['success']:.3f} ± {standard_error(b['success'], n):.3f}",
        f"{a['success']:.3f} ± {standard_error(a['success'], n):.3f}",
    )
    for metric in (
        "majority_baseline",
        "planner_first_delegation_gold",
        "subagent_first_search_right_entity",
        "subagent_fact_found",
    ):
        table.add_row(metric, f"{b[metric]:.3f}", f"{a[metric]:.3f}")
    console.print(table)
    unpaired = gain.gain / gain.se_unpaired if gain.se_unpaired else 0.0
    console.print(
        f"held-out success {gain.before:.3f} → {gain.after:.3f}: {gain.gain:+.3f} ± {gain.se:.3f} "
        f"({gain.z:+.1f} standard errors, paired: same questions, same seeded draws; "
        f"{unpaired:+.1f} if the two were independent); majority-answer baseline {a['majority_baseline']:.3f}"
    )
