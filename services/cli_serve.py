"""The `mgrpo` commands that run one server in the foreground, like uvicorn: `serve` (a service, on
one rank or restarted under torchrun on several) and `engine` (a rollout server with SGLang's API)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from services.cli_base import app, console, fail

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

    kinds = ("controller", "planner", "subagent")
    if role not in kinds:
        raise fail(f"unknown role {role!r}: choose one of {', '.join(kinds)}")
    from pydantic import ValidationError

    from services.settings import Settings

    given = {
        "role": as_role,
        "ranks": ranks,
        "nodes": nodes,
        "node_rank": node_rank,
        "rendezvous": rendezvous,
        "backend": backend,
        "pipeline_stages": pipeline_stages,
    }
    chosen: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    if role == "controller" and chosen:
        option = "--" + next(iter(chosen)).replace("_", "-")
        raise fail(f"{option} is for the trainer services (planner, subagent), not the controller")
    try:  # bad settings fail here, with their variable named, not inside uvicorn's start-up
        settings = Settings(**chosen)
    except ValidationError as exc:
        raise fail(
            "bad service setting: " + "; ".join(_env_error(e["loc"], e["msg"]) for e in exc.errors())
        ) from None

    def run(app: Any) -> None:
        # SIGTERM: stopped within ~2 s
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=settings.shutdown_grace_s,
        )

    if role == "controller":
        from services.controller import create_app

        return run(create_app(settings))
    _serve_trainer(settings, role, run, host, port)


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


def _serve_trainer(settings: Settings, kind: str, run: Callable[[Any], None], host: str, port: int) -> None:
    """A trainer service on W = nodes × ranks ranks: not yet under torchrun, this very command
    restarts under it; there, rank 0 runs the service and the others run its training calls (the
    first of them on a node > 0 answers the health probes on the service's port)."""
    from mgrpo.runtime import resolve_device

    try:
        resolve_device(settings.device)
    except RuntimeError as exc:
        raise fail(str(exc)) from None
    if settings.nodes * settings.ranks > 1 and "WORLD_SIZE" not in os.environ:
        argv = [sys.executable, *torchrun_args(settings), "-m", "services.cli", *sys.argv[1:]]
        os.execv(sys.executable, argv)
    from mgrpo.parallel import group
    from mgrpo.parallel.ranks import RankGroup

    ranks = RankGroup(settings.backend, settings.pipeline_stages)
    if group.init_from_env() and group.rank() > 0:
        if settings.node_rank > 0 and os.environ.get("LOCAL_RANK") == "0":
            from services.node_health import serve_health

            serve_health(host, port)
        ranks.serve()
        return
    if group.joined_world() > 1:
        stages = f" over {settings.pipeline_stages} pipeline stages" if settings.pipeline_stages > 1 else ""
        console.print(
            f"training on {group.joined_world()} ranks over {settings.nodes} node(s), backend {settings.backend}{stages}"
        )
    from services import planner, subagent

    factories = {"planner": planner.create_app, "subagent": subagent.create_app}
    try:
        run(
            factories[kind](
                settings.role or kind, settings, ranks=ranks if group.joined_world() > 1 else None
            )
        )
    finally:
        ranks.shutdown()


def _env_error(loc: tuple[int | str, ...], msg: str) -> str:
    if not loc:  # a check across settings names its variables itself
        return msg.removeprefix("Value error, ")
    name = "_".join(map(str, loc))
    return f"{name if name.isupper() else f'MGRPO_{name.upper()}'}: {msg}"  # REDIS_URL has no prefix


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
