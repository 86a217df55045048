"""Held-out evaluation (`mgrpo.evaluation`, `mgrpo.workflows.deep_research_warmstart.evaluate_paired`): repeatable, paired."""

import pytest

from mgrpo.evaluation import paired_gain
from mgrpo.models import load
from mgrpo.workflows.deep_research_warmstart import (
    WarmstartConfig,
    cached_warmstart,
    evaluate_paired,
    make_task,
)


def test_paired_gain_by_hand():
    g = paired_gain([1, 0, 0, 1], [1, 1, 0, 1])
    # d = [0, 1, 0, 0]: mean 0.25, sample sd 0.5, se 0.5 / 2; unpaired sqrt((0.25 + 0.1875) / 4)
    assert (g.n, g.before, g.after, g.gain) == (4, 0.5, 0.75, 0.25)
    assert g.se == pytest.approx(0.25) and g.se_unpaired == pytest.approx(0.3307189, abs=1e-6)
    assert g.z == pytest.approx(1.0)
    same = paired_gain([1, 0, 1], [1, 0, 1])
    assert same.gain == 0 and same.se == 0 and same.z == 0
    with pytest.raises(ValueError, match="equally long"):
        paired_gain([1, 0], [1])


def test_one_checkpoint_evaluates_identically_twice(tmp_path):
    """Seeded held-out evaluation is repeatable: the same checkpoint, loaded twice, gives the same
    metrics and the same success per question (the demo's paired gain rests on it)."""
    cfg = WarmstartConfig(n_people=60, steps=30, batch_size=8, eval_questions=0)
    res = cached_warmstart(cfg, tmp_path)
    systems = {name: (load(res.planner_path), load(res.subagent_path)) for name in ("a", "b")}
    metrics, outcomes = evaluate_paired(make_task(cfg), cfg, systems, n_questions=24, temperature=1.0)
    assert metrics["a"] == metrics["b"] and outcomes["a"] == outcomes["b"] and len(outcomes["a"]) == 24
    assert metrics["a"]["delegations_per_rollout"] > 0  # the models ran: it is not equal by being empty
