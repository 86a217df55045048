"""Held-out evaluation (`mgrpo.evaluation`, `mgrpo.workflows.deep_research_eval.evaluate_paired`): repeatable, paired."""

import math

import pytest

from mgrpo.evaluation import mean_over_runs, paired_by_question, paired_gain, pooled
from mgrpo.models import load
from mgrpo.workflows.deep_research_eval import evaluate_paired
from mgrpo.workflows.deep_research_warmstart import WarmstartConfig, cached_warmstart, make_task


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


def test_paired_by_question_pairs_each_question_with_itself_whatever_the_order():
    """The world study's bookkeeping (issue 43): two arms listed their questions in different orders;
    the difference is taken per question id. A pairing by position (q1 with q3, …) gives another
    gain and another standard error, so it fails here."""
    before = {"q1": 0.0, "q2": 1.0, "q3": 1.0, "q4": 0.0}
    after = {"q3": 0.0, "q4": 1.0, "q1": 1.0, "q2": 1.0}  # d = [1, 0, -1, 1] by question
    g = paired_by_question(before, after)
    assert (g.n, g.before, g.after, g.gain) == (4, 0.5, 0.75, 0.25)
    assert g.se == pytest.approx(math.sqrt(2.75 / 3) / 2)
    by_position = paired_gain(list(before.values()), list(after.values()))
    assert by_position.se != pytest.approx(g.se)  # the hand-made case tells the two pairings apart
    with pytest.raises(ValueError, match="same questions"):
        paired_by_question(before, {"q1": 1.0, "q2": 1.0, "q3": 1.0, "q5": 1.0})


def test_run_seeds_average_per_question_and_worlds_pool_without_crossing():
    runs = [{"a": 1.0, "b": 0.0}, {"b": 1.0, "a": 1.0}]
    assert mean_over_runs(runs) == {"a": 1.0, "b": 0.5}
    with pytest.raises(ValueError, match="different questions"):
        mean_over_runs([{"a": 1.0}, {"b": 1.0}])
    # the same question id in two worlds is two questions: pooling keeps them apart
    frozen = pooled({"301": {"q": 0.0, "r": 0.0}, "302": {"q": 1.0, "r": 0.0}})
    co = pooled({"301": {"q": 1.0, "r": 0.0}, "302": {"q": 1.0, "r": 1.0}})
    g = paired_by_question(frozen, co)
    assert (g.n, g.gain) == (4, 0.5)  # d = [1, 0, 0, 1]
    assert g.se == pytest.approx(math.sqrt(1 / 3) / 2)


def test_one_checkpoint_evaluates_identically_twice(tmp_path):
    """Seeded held-out evaluation is repeatable: the same checkpoint, loaded twice, gives the same
    metrics and the same success per question (the demo's paired gain rests on it)."""
    cfg = WarmstartConfig(n_people=60, steps=30, batch_size=8, eval_questions=0)
    res = cached_warmstart(cfg, tmp_path)
    systems = {name: (load(res.planner_path), load(res.subagent_path)) for name in ("a", "b")}
    metrics, outcomes = evaluate_paired(make_task(cfg), cfg, systems, n_questions=24, temperature=1.0)
    assert metrics["a"] == metrics["b"] and outcomes["a"] == outcomes["b"] and len(outcomes["a"]) == 24
    assert metrics["a"]["delegations_per_rollout"] > 0  # the models ran: it is not equal by being empty
