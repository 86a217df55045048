"""`make warmstart` (`mgrpo warmstart --rebuild`): build the built-in workflows' default warm starts
from scratch and ship them (`mgrpo.workflows.shipped`): deep research's planner and sub-agent, the
team variant on top of them, deep research's one model for both roles (the base a hosted sub-agent
shares) and the team's on top of it, and MarsRL's roles with their shared model; and the deep-research demo's baseline (the warm start's
held-out outcomes, `shipped.baseline`)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mgrpo.config import JobConfig
from mgrpo.workflows import shipped
from mgrpo.workflows.deep_research_warmstart import (
    WarmstartConfig,
    WarmstartResult,
    job_task,
    run_team_warmstart,
    run_warmstart,
)
from mgrpo.workflows.demo_baseline import (
    DEMO_EVAL_QUESTIONS,
    baseline_key,
    evaluate_heldout,
    numerics_fingerprint,
)
from mgrpo.workflows.marsrl_warmstart import MarsWarmstartConfig
from mgrpo.workflows.marsrl_warmstart import run_warmstart as run_marsrl_warmstart

OnStep = Callable[[str, int, dict[str, float]], None]  # (which warm start, step, losses)


def ship_demo_baseline(folder: Path, root: Path = shipped.SHIPPED) -> dict[str, Any]:
    """The deep-research demo's baseline: the shipped warm start in `folder` (its planner and
    sub-agent) on the demo's held-out evaluation, keyed by this processor's numerics."""
    cfg, task = WarmstartConfig(), job_task(JobConfig())
    system = (folder / "planner", folder / "subagent")
    key = baseline_key(task, cfg, DEMO_EVAL_QUESTIONS, numerics_fingerprint(system))
    return shipped.ship_baseline(folder, key, evaluate_heldout(task, cfg, system, DEMO_EVAL_QUESTIONS), root)


def ship_baseline_here(root: Path = shipped.SHIPPED) -> dict[str, Any]:
    """`mgrpo warmstart --ship-baseline`: the demo's baseline of the shipped default warm start,
    evaluated on this processor and shipped beside those of others (`demo_baseline`)."""
    cfg = WarmstartConfig()
    folder = shipped.find("warmstart", cfg.as_dict(), cfg.presets(), root)
    if folder is None:
        raise shipped.StaleShippedError(
            f"the default warm start is not shipped: build it with {shipped.REBUILD}"
        )
    return ship_demo_baseline(folder, root)


def rebuild(root: Path = shipped.SHIPPED, on_step: OnStep | None = None) -> list[dict[str, Any]]:
    """Build and ship every default warm start; returns their manifest entries."""

    def step_of(name: str) -> Callable[[int, dict[str, float]], None] | None:
        return None if on_step is None else lambda s, m: on_step(name, s, m)

    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = WarmstartConfig()
        pair = run_warmstart(cfg, Path(tmp) / "pair", on_step=step_of("deep research"))
        entries.append(shipped.ship("warmstart", cfg.as_dict(), cfg.presets(), pair.folder, root))
        base = shipped.find("warmstart", cfg.as_dict(), cfg.presets(), root)
        assert base is not None
        base_result = WarmstartResult(base, base / "planner", base / "subagent", pair.metrics, cached=True)
        ship_demo_baseline(base, root)
        team = run_team_warmstart(cfg, Path(tmp) / "team", base_result, on_step=step_of("team"))
        entries.append(shipped.ship("team", cfg.as_dict(), cfg.presets(), team.folder, root))
        one = run_warmstart(cfg, Path(tmp) / "shared", on_step=step_of("shared base"), shared=True)
        entries.append(shipped.ship("shared", cfg.as_dict(), cfg.presets(), one.folder, root))
        one_team = run_team_warmstart(
            cfg, Path(tmp) / "shared_team", one, on_step=step_of("shared team base"), shared=True
        )
        entries.append(shipped.ship("shared_team", cfg.as_dict(), cfg.presets(), one_team.folder, root))
        mars = MarsWarmstartConfig()
        built = run_marsrl_warmstart(mars, Path(tmp) / "marsrl", on_step=step_of("MarsRL"))
        entries.append(shipped.ship("marsrl", asdict(mars), mars.presets(), built.folder, root))
    return entries
