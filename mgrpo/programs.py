"""Which agent programs a job may run in the root trainer's process (`program.entry_point`, workflow
`openai_agents`): only what the cluster's operator installed or allowed, never whatever a job names.

An entry point is allowed when it is the value of an installed package's entry point in the group
`mgrpo.programs` (`[project.entry-points."mgrpo.programs"] my_agent = "my_pkg.agent:run"`), or when it
is listed in the service's `MGRPO_ALLOWED_PROGRAMS` (a JSON list of `module:function`). Anything else
is refused at submission (a 422 naming `program.entry_point`) and again by the root trainer. A program
the operator did not install runs outside the trainers, behind `program.url`.
"""

from __future__ import annotations

from collections.abc import Collection
from importlib.metadata import entry_points

PROGRAM_GROUP = "mgrpo.programs"


def installed_programs() -> set[str]:
    """The `module:function` values of the installed `mgrpo.programs` entry points."""
    return {ep.value.strip() for ep in entry_points(group=PROGRAM_GROUP)}


def check_program(entry_point: str, allowed: Collection[str]) -> None:
    """A ValueError saying how to allow it, unless `entry_point` is allowed (module docstring)."""
    if entry_point in allowed or entry_point in installed_programs():
        return
    raise ValueError(
        f"program.entry_point: {entry_point!r} is not a program this cluster runs; its operator allows one "
        f"with MGRPO_ALLOWED_PROGRAMS (a JSON list of module:function) or by installing a package that "
        f"declares it under the {PROGRAM_GROUP!r} entry points; or serve your program over HTTP and give program.url"
    )
