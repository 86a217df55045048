"""The `mgrpo` command line (typer). It launches things, so it sits on the top floor: nothing imports it."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mgrpo import __version__
from mgrpo.config import TRACKERS
from mgrpo.parallel.backends import BACKENDS, pipelining
from services import cli_serve  # noqa: F401  (`serve` and `engine`, listed first)
from services.cli_base import app, console, fail, read_config

if TYPE_CHECKING:
    from mgrpo.workflows import Workflow

WorkflowOpt = Annotated[
    str,
    typer.Option(
        help="deep_research (planner → sub-agent), deep_research_team (planner → searcher | comparer), marsrl (solver → verifier → corrector), or an installed plugin's (`mgrpo workflows` lists them)."
    ),
]
SharedOpt = Annotated[
    bool,
    typer.Option(
        help="marsrl: one model and one trainer for every role; deep_research (and deep_research_team): the sub-agents hosted in the planner's service, their adapters on the planner's base (demo: with --lora; local up: no sub-agent service)."
    ),
]


def _workflow(name: str) -> Workflow:
    """The workflow table's entry (a clear error naming the choices when there is none)."""
    from mgrpo.workflows import get_workflow

    try:
        return get_workflow(name)
    except ValueError as exc:
        raise fail(str(exc)) from None


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
    from services.launcher import LocalCluster

    try:
        roles = _workflow(workflow).cluster_roles(shared=shared)
    except ValueError as exc:
        raise fail(str(exc)) from None
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
        if role not in roles or name not in BACKENDS:
            choices = " or ".join(f"ROLE={b}" for b in BACKENDS)
            raise fail(f"--backend {item!r}: give {choices}, ROLE one of {', '.join(roles)}")
        out[role] = {"MGRPO_BACKEND": name}
    return out


def _role_env(backends: list[str], stages: list[str], roles: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """`--backend` and `--pipeline-stages` options as each role's environment."""
    env = _parse_backends(backends, roles)
    for role, p in _parse_counts("--pipeline-stages", stages, roles).items():
        if env.get(role, {}).get("MGRPO_BACKEND") not in pipelining():
            needs = " or ".join(f"--backend {role}={b}" for b in pipelining())
            raise fail(f"--pipeline-stages {role}={p}: pipeline stages need {needs}")
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
def schema(
    markdown: Annotated[
        bool, typer.Option(help="Print docs/configuration.md instead: every job field and service setting.")
    ] = False,
) -> None:
    """Print the job config's JSON Schema (what POST /v1/jobs and `mgrpo train -c` take)."""
    import json

    from mgrpo.config import JobConfig
    from services.config_docs import configuration_markdown

    if markdown:
        print(configuration_markdown(), end="")
        return
    print(json.dumps(JobConfig.model_json_schema(), indent=2))


@app.command()
def version() -> None:
    """Print the mgrpo version."""
    console.print(__version__)


@app.command()
def warmstart(
    steps: Annotated[
        int | None, typer.Option(min=1, help="SFT steps (default: the workflow's documented early stop).")
    ] = None,
    n_people: Annotated[int | None, typer.Option(min=10, help="People in the generated world.")] = None,
    seed: Annotated[int, typer.Option(help="World and training seed.")] = 0,
    cache_dir: Annotated[Path, typer.Option(help="Where warm starts are cached.")] = Path(".cache/mgrpo"),
    single_agent: Annotated[bool, typer.Option(help="Warm-start the single-agent baseline instead.")] = False,
    workflow: WorkflowOpt = "deep_research",
    eval_questions: Annotated[
        int | None, typer.Option(min=0, help="Held-out questions (problems) it is evaluated on (0 skips).")
    ] = None,
    rebuild: Annotated[
        bool,
        typer.Option(
            help="Build every shipped default warm start again from scratch and rewrite mgrpo/shipped/."
        ),
    ] = False,
    ship_baseline: Annotated[
        bool,
        typer.Option(
            help="Evaluate the shipped deep-research warm start on the demo's held-out questions here and ship the outcomes for this processor model and its numerics (about two minutes)."
        ),
    ] = False,
    guess_share: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="A flawed sub-agent demonstrator: the share of subtasks it guesses instead of looking up (a job's warmstart_guess_share).",
        ),
    ] = 0.0,
) -> None:
    """Warm-start (SFT) the preset models of a workflow on demonstrations: the cache a job with these
    settings uses, built once and reused (the defaults ship with mgrpo: `--rebuild` builds those)."""
    from mgrpo.config import JobConfig
    from mgrpo.workflows import JobConfigError, job_spec
    from services.demo import warmstart_with_progress

    if rebuild:
        return _rebuild_shipped()
    if ship_baseline:
        from mgrpo.workflows.rebuild import ship_baseline_here

        listed = ship_baseline_here()
        console.print(f"shipped {listed['file']} (evaluated {listed['evaluated']}): commit mgrpo/shipped/")
        return
    _workflow(workflow)
    options: dict[str, Any] = {"n_people": n_people} if n_people is not None else {}
    options |= {"warmstart_guess_share": guess_share} if guess_share else {}
    mode = "single_agent" if single_agent else "co_train"
    try:
        job = job_spec(JobConfig(workflow=workflow, mode=mode, seed=seed, warmstart_steps=steps, **options))
        ws = job.warm_start()
    except (JobConfigError, ValueError) as exc:
        raise fail(str(exc)) from None
    config = ws.config(job)
    if eval_questions is not None:
        config = ws.evaluated_on(config, eval_questions)
    built = warmstart_with_progress(job, cache_dir, console, config)
    console.print(f"{'cached' if built.cached else 'trained'}: {built.folder}")
    for line in ws.summary(built):
        console.print(line)


def _rebuild_shipped() -> None:
    from mgrpo.workflows.rebuild import rebuild
    from services.progress import make_console

    log = make_console()
    last: dict[str, float] = {}

    def on_step(name: str, step: int, losses: dict[str, float]) -> None:
        now = time.monotonic()
        if now - last.get(name, 0.0) >= 10:
            last[name] = now
            log.print(
                f"{name} warm start: step {step + 1}  " + "  ".join(f"{k} {v:.3f}" for k, v in losses.items())
            )

    for entry in rebuild(on_step=on_step):
        log.print(f"shipped {entry['folder']}: {len(entry['files'])} files, recipe key {entry['recipe_key']}")
    log.print("commit mgrpo/shipped/ (its manifest names every file's sha256)")


@app.command()
def workflows() -> None:
    """List the workflows a job can name (built-ins and installed plugins) with their roles."""
    from rich.table import Table

    from mgrpo.workflows import all_workflows

    table = Table("WORKFLOW", "ROLES (root first)", "MODES", "DEMO", "DESCRIPTION")
    for wf in all_workflows().values():
        roles = ", ".join((wf.root, *wf.callees))
        table.add_row(wf.name, roles, ", ".join(wf.modes), "yes" if wf.demo else "", wf.description)
    console.print(table)


@app.command()
def demo(
    steps: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=10_000,
            help="Training steps (default: the workflow demo's: 30 for deep research, 20 for MarsRL).",
        ),
    ] = None,
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
            help="Held-out questions (problems) of the before/after evaluation (default: the workflow demo's: 1,600 for deep research, 400 for MarsRL).",
        ),
    ] = None,
    workflow: WorkflowOpt = "deep_research",
    shared: SharedOpt = False,
    warmstart_steps: Annotated[
        int | None,
        typer.Option(min=1, max=100_000, help="SFT steps of the warm start (default: the workflow's)."),
    ] = None,
    fresh_baseline: Annotated[
        bool,
        typer.Option(
            help="Deep research: evaluate the warm start here too, instead of reading its shipped held-out outcomes (about a minute)."
        ),
    ] = False,
    tracking: Annotated[
        list[str] | None,
        typer.Option(
            help="Log every role's metrics to this experiment tracker too (tensorboard, mlflow, wandb; repeat for several): <run dir>/tracking.",
        ),
    ] = None,
    lora: Annotated[
        int,
        typer.Option(
            min=0,
            max=256,
            help="Train a LoRA adapter of this rank on each role's frozen warm start instead of all its weights (0: off); with --shared, each role its own adapter on the one shared base.",
        ),
    ] = 0,
) -> None:
    """The whole system on one machine: warm start (cached), embedded Redis, the services as separate
    processes, one job over REST with live progress, then held-out results before/after."""
    from services.demo import DemoOptions

    wf = _workflow(workflow)
    if not wf.demo:
        raise fail(f"the {wf.name} workflow has no demo yet: run a job with `mgrpo train -c job.yaml`")
    if shared and not (wf.shares_root_model or wf.hosts_callees):
        raise fail(f"--shared: the {wf.name} workflow trains each role with a model of its own")
    out = run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    if unknown := set(tracking or ()) - set(TRACKERS):
        raise fail(f"--tracking: {', '.join(sorted(unknown))}: the trackers are {', '.join(TRACKERS)}")
    options = DemoOptions(
        steps,
        redis_url,
        cache_dir,
        lr,
        ppo_epochs,
        eval_questions,
        shared,
        warmstart_steps,
        fresh_baseline,
        tuple(tracking or ()),
        lora,
    )
    try:
        wf.load("demo")(out, options, console)
    except (RuntimeError, ValueError) as exc:
        raise fail(str(exc)) from None


from services import cli_client  # noqa: E402,F401  (the controller's client commands, listed after these)

if __name__ == "__main__":  # pragma: no cover - `python -m services.cli`
    app()
