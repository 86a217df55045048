"""The `mgrpo` command line (typer). It launches things, so it sits on the top floor: nothing imports it."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mgrpo import __version__
from services.cli_base import app, console, fail, read_config

if TYPE_CHECKING:
    from services.settings import Settings


@app.command()
def serve(
    role: Annotated[
        str,
        typer.Argument(
            help="controller, planner (a root role's trainer) or subagent (a callee role's trainer)"
        ),
    ],
    as_role: Annotated[
        str | None,
        typer.Option(
            "--role",
            help="The workflow role it serves, e.g. solver, verifier, corrector (MGRPO_ROLE; default: planner / subagent).",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Bind address.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 8000,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    ranks: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=1024,
            help="Train this role on W ranks of this machine: the service restarts itself under torchrun, rank 0 serving, FSDP2 over all (default: MGRPO_RANKS, 1).",
        ),
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=1024,
            help="Machines the role's ranks span, each running this command with its --node-rank (MGRPO_NODES; W = nodes × ranks).",
        ),
    ] = None,
    node_rank: Annotated[
        int | None,
        typer.Option(
            min=0, help="This machine's index among the role's nodes; node 0 serves (MGRPO_NODE_RANK)."
        ),
    ] = None,
    rendezvous: Annotated[
        str | None,
        typer.Option(help="host:port of node 0, where the nodes meet (MGRPO_RENDEZVOUS)."),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="How the role's ranks hold the model: fsdp (data parallel) or megatron (megatron-core tensor parallel) (MGRPO_BACKEND)."
        ),
    ] = None,
    pipeline_stages: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="With --backend megatron: pipeline stages the layers are split over, dividing the ranks (MGRPO_PIPELINE_STAGES).",
        ),
    ] = None,
) -> None:
    """Run one service with uvicorn (settings from MGRPO_* and REDIS_URL environment variables)."""
    import uvicorn

    apps = {
        "controller": "services.controller:app",
        "planner": "services.planner:app",
        "subagent": "services.subagent:app",
    }
    if role not in apps:
        raise fail(f"unknown role {role!r}: choose one of {', '.join(apps)}")
    from pydantic import ValidationError

    from mgrpo.runtime import resolve_device
    from services.settings import get_settings

    given = {"MGRPO_ROLE": as_role, "MGRPO_RANKS": ranks, "MGRPO_NODES": nodes,
             "MGRPO_NODE_RANK": node_rank, "MGRPO_RENDEZVOUS": rendezvous, "MGRPO_BACKEND": backend,
             "MGRPO_PIPELINE_STAGES": pipeline_stages}  # fmt: skip
    for name, value in given.items():
        if value is not None:
            if role == "controller":
                option = "--" + name.removeprefix("MGRPO_").lower().replace("_", "-")
                raise fail(f"{option} is for the trainer services (planner, subagent), not the controller")
            os.environ[name] = str(value)
    get_settings.cache_clear()
    try:  # bad settings fail here, with their variable named, not inside uvicorn's start-up
        settings = get_settings()
        if role != "controller":
            resolve_device(settings.device)
    except ValidationError as exc:
        raise fail(
            "bad service setting: " + "; ".join(_env_error(e["loc"], e["msg"]) for e in exc.errors())
        ) from None
    except RuntimeError as exc:
        raise fail(str(exc)) from None

    def run() -> None:
        uvicorn.run(apps[role], host=host, port=port, log_level=log_level,
                    timeout_graceful_shutdown=settings.shutdown_grace_s)  # fmt: skip  # SIGTERM: stopped within ~2 s

    if role == "controller":
        return run()
    _serve_trainer(settings, run, host, port)


def torchrun_args(settings: Settings) -> list[str]:
    """torchrun's options for a trainer service on `ranks` ranks per machine over `nodes` machines:
    one machine is --standalone; several meet at node 0 (static rendezvous, so global rank 0, the
    service, is always node 0's first process)."""
    host, _, port = settings.rendezvous.rpartition(":")
    where = (
        ["--standalone"]
        if settings.nodes == 1
        else [
            f"--nnodes={settings.nodes}",
            f"--node-rank={settings.node_rank}",
            f"--master-addr={host}",
            f"--master-port={port}",
        ]
    )
    return ["-m", "torch.distributed.run", *where, f"--nproc-per-node={settings.ranks}", "--max-restarts=0"]


def _serve_trainer(settings: Settings, run: Callable[[], None], host: str, port: int) -> None:
    """A trainer service on W = nodes × ranks ranks: not yet under torchrun, this very command
    restarts under it; there, rank 0 runs the service and the others run its training calls (the
    first of them on a node > 0 answers the health probes on the service's port)."""
    if settings.nodes * settings.ranks > 1 and "WORLD_SIZE" not in os.environ:
        argv = [sys.executable, *torchrun_args(settings), "-m", "services.cli", *sys.argv[1:]]
        os.execv(sys.executable, argv)
    from mgrpo.parallel import group
    from mgrpo.parallel import ranks as rank_calls

    rank_calls.configure(settings.backend, settings.pipeline_stages)
    if group.init_from_env() and group.rank() > 0:
        if settings.node_rank > 0 and os.environ.get("LOCAL_RANK") == "0":
            from services.node_health import serve_health

            serve_health(host, port)
        rank_calls.serve()
        return
    if group.joined_world() > 1:
        stages = f" over {settings.pipeline_stages} pipeline stages" if settings.pipeline_stages > 1 else ""
        console.print(
            f"training on {group.joined_world()} ranks over {settings.nodes} node(s), backend {settings.backend}{stages}"
        )
    try:
        run()
    finally:
        rank_calls.shutdown()


def _env_error(loc: tuple[int | str, ...], msg: str) -> str:
    if not loc:  # a check across settings names its variables itself
        return msg.removeprefix("Value error, ")
    name = "_".join(map(str, loc))
    return f"{name if name.isupper() else f'MGRPO_{name.upper()}'}: {msg}"  # REDIS_URL has no prefix


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
    cluster = LocalCluster(run_dir, redis_url=redis_url, api_token=api_token, roles=roles,
                           ranks=_parse_counts("--ranks", ranks or [], roles),
                           nodes=_parse_counts("--nodes", nodes or [], roles),
                           role_env=_role_env(backend or [], pipeline_stages or [], roles),
                           ports={r: port + i for i, r in enumerate(("controller", *roles))})  # fmt: skip

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
def engine(
    model: Annotated[Path, typer.Argument(help="A save_pretrained folder (model and tokenizer).")],
    host: Annotated[str, typer.Option(help="Bind address.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port (SGLang's default).")] = 30000,
    max_batch: Annotated[int, typer.Option(min=1, help="Rows decoded together at most.")] = 64,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
) -> None:
    """Serve a rollout engine with SGLang's HTTP API (the hf engine, for CPUs): point a trainer at it
    with MGRPO_SGLANG_URL, and MGRPO_SGLANG_SYNC_HOST to push its weights by broadcast."""
    import uvicorn

    from services.engine_server import serve_app

    if not (model / "config.json").is_file():
        raise fail(f"{model} holds no config.json: pass a folder written by save_pretrained")
    try:
        app, _ = serve_app(str(model), max_batch=max_batch)
    except ValueError as exc:
        raise fail(str(exc)) from None
    console.print(f"mgrpo engine: {model} on http://{host}:{port}")
    uvicorn.run(app, host=host, port=port, log_level=log_level)


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
        console.print(f"[bold]{name}[/] solver {m['solver_accuracy']:.2f}  V–C system {m['system_accuracy']:.2f}  "
                      f"verifier accuracy {m['verifier_accuracy']:.2f} (always-Correct {m['always_correct_verifier_accuracy']:.2f})")  # fmt: skip


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
            run_marsrl_demo(out, steps=steps, redis_url=redis_url, cache_dir=cache_dir, lr=lr, eval_problems=eval_questions or MARSRL_EVAL_PROBLEMS,
                            shared=shared, warmstart_steps=warmstart_steps, console=console)  # fmt: skip
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
