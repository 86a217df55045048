"""The deep-research demo's evaluation (`services.demo.evaluate_before_after`): the "before" column is
the shipped baseline when there is one, and only the trained system is evaluated; without one, both are
evaluated on the same questions with the same seeded draws."""

from __future__ import annotations

import io

from rich.console import Console

from mgrpo.config import JobConfig
from mgrpo.workflows import shipped
from mgrpo.workflows.deep_research_warmstart import WarmstartConfig, job_task
from mgrpo.workflows.demo_baseline import evaluate_heldout
from services.demo import evaluate_before_after

N = 16


def _setup():
    cfg = WarmstartConfig()
    folder = shipped.find("warmstart", cfg.as_dict(), cfg.presets())
    assert folder is not None
    pair = (folder / "planner", folder / "subagent")
    return job_task(JobConfig()), cfg, {"before": pair, "after": pair}


def test_a_shipped_baseline_is_the_before_column_and_only_after_is_evaluated():
    task, cfg, systems = _setup()
    fake = {
        "metrics": {"success": 0.0},
        "outcomes": [0.0] * N,
        "evaluated": {"date": "2026-12-06", "processor": "AMD EPYC", "code": "abc1234"},
    }
    out = io.StringIO()
    got = evaluate_before_after(task, cfg, systems, N, fake, Console(file=out, width=200))
    assert got["before"] is fake  # read, not evaluated
    assert got["after"] == evaluate_heldout(task, cfg, systems["after"], N)
    assert "shipped with it (evaluated 2026-12-06 on AMD EPYC at abc1234" in out.getvalue()
    assert f"trained, {N} questions" in out.getvalue() and "warm start then" not in out.getvalue()


def test_without_a_baseline_both_are_evaluated_with_the_same_draws():
    task, cfg, systems = _setup()
    out = io.StringIO()
    got = evaluate_before_after(task, cfg, systems, N, None, Console(file=out, width=200))
    assert got["before"] == got["after"]  # one pair of models, the same seeded draws: the same outcomes
    assert len(got["before"]["outcomes"]) == N and "warm start then trained" in out.getvalue()


def test_the_live_line_shows_a_verifiers_balanced_accuracy():
    """A collapsed verifier (mean reward 0.98) reads as such: balanced accuracy 0.50 beside it."""
    from services.demo import progress_line

    line = progress_line(
        {
            "solver/reward_mean": 0.25,
            "solver/accuracy": 0.25,
            "verifier/reward_mean": 0.98,
            "verifier/balanced_accuracy": 0.5,
            "timing/step": 5.0,
        },
        "marsrl",
    )
    assert line == "solver 0.25 (acc 0.25) · verifier 0.98 (balanced acc 0.50) · 5.0 s/step"
