"""The `mgrpo` command line (typer). It launches things, so it sits on the top floor: nothing imports it."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from mgrpo import __version__
from services import cli_serve  # noqa: F401  (`serve` and `engine`, listed first)
from services.cli_base import app, console, fail, read_config

WorkflowOpt = Annotated[
    str,
    typer.Option(
        help="deep_research (planner → sub-agent), deep_research_team (planner → searcher | comparer) or marsrl (solver → verifier → corrector)."
    ),
]
SharedOpt = Annotated[bool, typer.Option(help="marsrl: one model and one trainer for every role.")]


def _check_workflow(workflow: str) -> None:
    if workflow not in ("deep_research", "deep_research_team", "marsrl"):
        raise fail(f"unknown workflow {workflow!r}: choose deep_research, deep_research_team or marsrl")


local_app = typer.Typer(help="A local cluster: embedded Redis + the three services as separate processes.")
app.add_typer(local_app, name="local")


@local_app.command("up")
def local_up(
    run_dir: Annotated[Path, typer.Option(help="Logs, checkpoints and the embedded Redis go here.")] = Path(
        "runs/local"
    ),
    redis_url: Annotated[
        str | None, typer.Option(envvar="REDIS_URL", help="Use this Redis instead of an embedded one.")
    ] = None,
    api_token: Annotated[
        str, typer.Option(envvar="MGRPO_API_TOKEN", help="Bearer token of the services.")
    ] = "",
    port: Annotated[
        int, typer.Option(help="Controller port; the trainer services take the next ones.")
    ] = 8000,
    workflow: WorkflowOpt = "deep_research",
    shared: SharedOpt = False,
    ranks: Annotated[
        list[str] | None,
        typer.Option(
            "--ranks",
            help="ROLE=W: train that role on W ranks (torchrun, FSDP2), e.g. --ranks subagent=2; repeatable.",
        ),
    ] = None,
    nodes: Annotated[
        list[str] | None,
        typer.Option(
            "--nodes",
            help="ROLE=N: spread that role's ranks over N processes as if on N machines (serve --nodes N --node-rank K), e.g. --nodes planner=2; repeatable.",
        ),
    ] = None,
    backend: Annotated[
        list[str] | None,
        typer.Option(
            "--backend",
            help="ROLE=megatron: hold that role's model with megatron-core tensor parallelism over its ranks (default fsdp); repeatable.",
        ),
    ] = None,
    pipeline_stages: Annotated[
        list[str] | None,
        typer.Option(
            "--pipeline-stages",
            help="ROLE=P: with --backend ROLE=megatron, split that role's layers over P pipeline stages (P divides its ranks); repeatable.",
        ),
    ] = None,
) -> None:
    """Start the cluster in the foreground, restarting any service that dies (Ctrl-C stops it)."""
    from services.launcher import LocalCluster, workflow_roles

    _check_workflow(workflow)
    roles = workflow_roles(workflow, shared=shared)
    cluster = LocalCluster(
        run_dir,
        redis_url=redis_url,
        api_token=api_token,
        roles=roles,
        ranks=_parse_counts("--ranks", ranks or [], roles),
        nodes=_parse_counts("--nodes", nodes or [], roles),
        role_env=_role_env(backend or [], pipeline_stages or [], roles),
        ports={r: port + i for i, r in enumerate(("controller", *roles))},
    )

    def stop(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM (kill, a supervisor) stops the cluster like Ctrl-C, even mid-start

    signal.signal(signal.SIGTERM, stop)
    try:
        cluster.start()
        urls = "  ".join(f"{r} {cluster.url(r)}" for r in cluster.services)
        console.print(f"{urls}  Redis {cluster.redis_url}  logs {run_dir}/logs")
        while True:  # a service (or the embedded Redis) that dies is restarted, with backoff
            for name in cluster.supervise():
                console.print(f"restarted {name} (restart {cluster.restarts[name]}; logs in {run_dir}/logs)")
            time.sleep(0.5)
    except RuntimeError as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


def _parse_backends(items: list[str], roles: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """`--backend ROLE=NAME` options as each role's MGRPO_BACKEND."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        role, _, name = item.partition("=")
        if role not in roles or name not in ("fsdp", "megatron"):
            raise fail(f"--backend {item!r}: give ROLE=fsdp or ROLE=megatron, ROLE one of {', '.join(roles)}")
        out[role] = {"MGRPO_BACKEND": name}
    return out


def _role_env(backends: list[str], stages: list[str], roles: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """`--backend` and `--pipeline-stages` options as each role's environment."""
    env = _parse_backends(backends, roles)
    for role, p in _parse_counts("--pipeline-stages", stages, roles).items():
        if env.get(role, {}).get("MGRPO_BACKEND") != "megatron":
            raise fail(f"--pipeline-stages {role}={p}: pipeline stages need --backend {role}=megatron")
        env[role]["MGRPO_PIPELINE_STAGES"] = str(p)
    return env


def _parse_counts(option: str, items: list[str], roles: tuple[str, ...]) -> dict[str, int]:
    """`--ranks ROLE=W` (or `--nodes ROLE=N`) options as {role: count}, with what to fix named."""
    out: dict[str, int] = {}
    for item in items:
        role, _, w = item.partition("=")
        if role not in roles:
            raise fail(
                f"{option} {item!r}: {role!r} is not a trainer role of this cluster ({', '.join(roles)})"
            )
        if not w.isdigit() or not 1 <= int(w) <= 1024:
            raise fail(f"{option} {item!r}: the count must be a whole number from 1 to 1024, as in {role}=2")
        out[role] = int(w)
    return out


@app.command()
def train(
    config: Annotated[Path, typer.Option("--config", "-c", help="Job config (YAML or JSON).")],
    run_dir: Annotated[Path | None, typer.Option(help="Run folder (default runs/train-<time>).")] = None,
    redis_url: Annotated[
        str | None, typer.Option(envvar="REDIS_URL", help="Redis to use; embedded if unset.")
    ] = None,
    cache_dir: Annotated[Path, typer.Option(help="Warm-start cache.")] = Path(".cache/mgrpo"),
) -> None:
    """Run one job in the foreground on a local cluster (like `mgrpo demo`, with your config)."""
    from pydantic import ValidationError

    from mgrpo.config import JobConfig
    from services.demo import run_train

    try:
        job = JobConfig.model_validate(read_config(config))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise fail(f"{config} is not a valid job config: {problems}") from None
    if job.dataset is not None and job.dataset.source.startswith("file://"):
        path = Path(job.dataset.source[len("file://") :]).resolve()  # the services run elsewhere
        job = job.model_copy(update={"dataset": job.dataset.model_copy(update={"source": f"file://{path}"})})
    out = run_dir or Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")
    try:
        final = run_train(job, out, redis_url=redis_url, cache_dir=cache_dir, console=console)
    except (RuntimeError, ValueError) as exc:
        raise fail(str(exc)) from None
    if final["status"] != "succeeded":
        raise typer.Exit(code=1)


@app.command()
def schema() -> None:
    """Print the job config's JSON Schema (what POST /v1/jobs and `mgrpo train -c` take)."""
    import json

    from mgrpo.config import JobConfig

    print(json.dumps(JobConfig.model_json_schema(), indent=2))


@app.command()
def version() -> None:
    """Print the mgrpo version."""
    console.print(__version__)


@app.command()
def warmstart(
    steps: Annotated[
        int | None, typer.Option(min=1, help="SFT steps (default: the documented early stop).")
    ] = None,
    n_people: Annotated[int | None, typer.Option(min=10, help="People in the generated world.")] = None,
    seed: Annotated[int, typer.Option(help="World and training seed.")] = 0,
    cache_dir: Annotated[Path, typer.Option(help="Where warm starts are cached.")] = Path(".cache/mgrpo"),
    single_agent: Annotated[bool, typer.Option(help="Warm-start the single-agent baseline instead.")] = False,
    workflow: WorkflowOpt = "deep_research",
    eval_questions: Annotated[
        int | None, typer.Option(min=0, help="Held-out questions per stage it is evaluated on (0 skips).")
    ] = None,
) -> None:
    """Warm-start (SFT) the tiny models of a workflow on demonstrations; cached and reused."""
    from mgrpo.warmstart import WarmstartConfig

    _check_workflow(workflow)
    if workflow == "marsrl":
        _marsrl_warmstart(steps, seed, cache_dir)
        return

    default = WarmstartConfig()
    cfg = WarmstartConfig(
        seed=seed,
        steps=steps or default.steps,
        n_people=n_people or default.n_people,
        eval_questions=default.eval_questions if eval_questions is None else eval_questions,
    )
    from services.demo import warmstart_with_progress

    team = workflow == "deep_research_team"
    result = warmstart_with_progress(cfg, cache_dir, console, single_agent=single_agent, team=team)
    console.print(f"{'cached' if result.cached else 'trained'}: {result.folder}")
    for name, m in result.metrics.items():
        process = "  ".join(f"{k} {v:.2f}" for k, v in m.items() if k not in ("success", "majority_baseline"))
        console.print(
            f"[bold]{name}[/] success {m['success']:.2f}  majority baseline {m['majority_baseline']:.2f}"
        )
        console.print(f"  [dim]{process}[/]")


def _marsrl_warmstart(steps: int | None, seed: int, cache_dir: Path) -> None:
    from mgrpo.workflows.marsrl_warmstart import MarsWarmstartConfig
    from services.demo import marsrl_warmstart_with_progress

    cfg = MarsWarmstartConfig(seed=seed, steps=steps or MarsWarmstartConfig().steps)
    result = marsrl_warmstart_with_progress(cfg, cache_dir, console)
    console.print(f"{'cached' if result.cached else 'trained'}: {result.folder}")
    for name, m in result.metrics.items():
        console.print(
            f"[bold]{name}[/] solver {m['solver_accuracy']:.2f}  V–C system {m['system_accuracy']:.2f}  "
            f"verifier accuracy {m['verifier_accuracy']:.2f} (always-Correct {m['always_correct_verifier_accuracy']:.2f})"
        )


# The demos' held-out evaluations. Deep research: 1,600 questions put the gain's paired standard error
# near 0.011 (0.022 at 400, where one run's first 400 questions printed +0.045 and all 1,600 +0.086:
# README, "Why 1,600 questions"); it takes ~2 minutes on 2 cores. MarsRL: its 400 problems, as documented.
DEMO_EVAL_QUESTIONS = 1600
MARSRL_EVAL_PROBLEMS = 400


@app.command()
def demo(
    steps: Annotated[int, typer.Option(min=1, max=10_000, help="M-GRPO steps.")] = 20,
    run_dir: Annotated[Path | None, typer.Option(help="Run folder (default runs/demo-<time>).")] = None,
    redis_url: Annotated[
        str | None, typer.Option(envvar="REDIS_URL", help="Redis to use; embedded if unset.")
    ] = None,
    cache_dir: Annotated[Path, typer.Option(help="Warm-start cache.")] = Path(".cache/mgrpo"),
    lr: Annotated[float, typer.Option(min=1e-7, max=1.0, help="Learning rate of both trainers.")] = 1e-4,
    ppo_epochs: Annotated[int, typer.Option(min=1, max=16, help="Passes over each step's batch.")] = 1,
    eval_questions: Annotated[
        int | None,
        typer.Option(
            min=10,
            max=10_000,
            help="Held-out questions (problems) of the before/after evaluation "
            f"(default: {DEMO_EVAL_QUESTIONS} for deep research, {MARSRL_EVAL_PROBLEMS} for MarsRL).",
        ),
    ] = None,
    workflow: WorkflowOpt = "deep_research",
    shared: SharedOpt = False,
    warmstart_steps: Annotated[
        int | None,
        typer.Option(min=1, max=100_000, help="SFT steps of the warm start (default: the workflow's)."),
    ] = None,
) -> None:
    """The whole system on one machine: warm start (cached), embedded Redis, the services as separate
    processes, one job over REST with live progress, then held-out results before/after."""
    from services.demo import run_demo
    from services.demo_marsrl import run_marsrl_demo

    _check_workflow(workflow)
    if workflow == "deep_research_team":
        raise fail(
            "the deep_research_team workflow has no demo yet: run a job with `mgrpo train -c job.yaml`"
        )
    out = run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    if workflow == "marsrl":
        try:
            run_marsrl_demo(
                out,
                steps=steps,
                redis_url=redis_url,
                cache_dir=cache_dir,
                lr=lr,
                eval_problems=eval_questions or MARSRL_EVAL_PROBLEMS,
                shared=shared,
                warmstart_steps=warmstart_steps,
                console=console,
            )
        except (RuntimeError, ValueError) as exc:
            raise fail(str(exc)) from None
        return
    try:
        run_demo(
            out,
            steps=steps,
            redis_url=redis_url,
            cache_dir=cache_dir,
            lr=lr,
            ppo_epochs=ppo_epochs,
            eval_questions=eval_questions or DEMO_EVAL_QUESTIONS,
            console=console,
            warmstart_steps=warmstart_steps,
        )
    except (RuntimeError, ValueError) as exc:
        raise fail(str(exc)) from None


from services import cli_client  # noqa: E402,F401  (the controller's client commands, listed after these)

if __name__ == "__main__":  # pragma: no cover - `python -m services.cli`
    app()
