"""What every part of the `mgrpo` command line shares: the typer app, the console, how a command fails
(a message, exit code 2, no traceback) and how a job config file is read.

The command modules (`services/cli*.py`) import what a command runs inside the command, so that
`mgrpo --help` and the quick commands start without torch; the architecture test exempts them from
commenting each such import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from services.progress import make_console

app = typer.Typer(
    name="mgrpo",
    help="Decoupled multi-server M-GRPO training for multi-agent LLM systems.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = make_console()  # a log or a pipe gets whole lines: paths and tables never wrapped


def fail(message: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


def read_config(path: Path) -> dict[str, Any]:
    import yaml

    if not path.exists():
        raise fail(f"no config file at {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise fail(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise fail(f"{path} must hold a mapping of job config fields")
    return data
