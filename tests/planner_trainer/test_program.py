"""An agent program runs in the root trainer only if the cluster's operator allowed it
(`mgrpo.programs`): a job naming any other importable callable (`os:system`) is refused by the
trainer too, should it reach one past the controller, before anything is imported or called."""

from __future__ import annotations

import os

import pytest

from mgrpo.config import ProgramConfig
from mgrpo.programs import PROGRAM_GROUP
from planner_trainer.program import load_program


def test_a_program_the_operator_did_not_allow_is_never_called(monkeypatch):
    called = []
    monkeypatch.setattr(os, "system", lambda *a: called.append(a))
    for entry_point in ("os:system", "pty:spawn", "examples.openai_agent.agent:run"):
        with pytest.raises(ValueError, match="MGRPO_ALLOWED_PROGRAMS"):
            load_program(ProgramConfig(entry_point=entry_point))
    assert called == []


def test_an_allowed_or_installed_program_loads(tmp_path, monkeypatch):
    program = "examples.openai_agent.agent:run"
    assert callable(load_program(ProgramConfig(entry_point=program), allowed=[program]))
    dist = tmp_path / "my_agents-0.1.dist-info"  # a package the operator installed declares it
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-agents\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{PROGRAM_GROUP}]\nagent = {program}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert callable(load_program(ProgramConfig(entry_point=program)))
