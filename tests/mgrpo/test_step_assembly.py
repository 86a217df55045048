"""The step assembly of every role on hand-checkable numbers: 2 queries × K = 2 → the expected
per-query groups, rewards and advantages (a lumped group, a dropped planner outcome or a mixed-role
group fails here)."""

import math

import pytest

from mgrpo.advantages import assign_advantages
from mgrpo.records import Sample, Transcript
from mgrpo.workflows.deep_research import Episode, align_query, planner_samples, subagent_samples

S = 1 / math.sqrt(1 + 1e-6)  # ±1 after normalising a two-valued group by its population std (ε = 1e-6)


def tr(final=None, ok=True):
    t = Transcript([1, 2, 3], [0.0, -0.5, -0.5], [0, 1, 1], 1, final=final)
    t.format_ok = ok
    return t


def test_planner_groups_are_per_query():
    # q0: right, wrong → rewards 1.0, 0.1;  q1: malformed, right → 0.0, 1.0
    trs = [tr("paris"), tr("rome"), tr("paris", ok=False), tr("oslo")]
    scored = [1.0, 0.0, 1.0, 1.0]  # the scorer's view; rollout 2 is malformed, so it counts 0
    samples, correct = planner_samples(["q0", "q1"], trs, scored, k=2)
    assert [s.group for s in samples] == ["q0", "q0", "q1", "q1"]
    assert [s.reward for s in samples] == pytest.approx([1.0, 0.1, 0.0, 1.0])
    assert correct == [1.0, 0.0, 0.0, 1.0]  # what the sub-agent's reward reads (a malformed turn is 0)
    adv = assign_advantages(samples)
    assert adv.tolist() == pytest.approx([S, -S, -S, S], abs=1e-5)  # one group of all four would not give ±1


def test_a_rejected_score_is_never_trained_on():
    # q0: one rollout's reward was rejected (NaN): it leaves the group statistics and gets advantage 0
    trs = [tr("a"), tr("b"), tr("c")]
    samples, correct = planner_samples(["q0"], trs, [1.0, math.nan, 0.0], k=3)
    assert math.isnan(samples[1].reward) and math.isnan(correct[1])
    adv = assign_advantages(samples)
    assert adv[1] == 0.0 and adv[0] == pytest.approx(S, abs=1e-5) and adv[2] == pytest.approx(-S, abs=1e-5)


def test_subagent_slots_pool_per_query_with_the_planner_outcome():
    # q0: rollout 0 made e0,e1; rollout 1 made e2 → D=2 slots each: [e0, e1], [e2, e2] (own duplicate)
    slots = align_query([["e0", "e1"], ["e2"]], 2, seed=0, mode="duplicate_drop")
    assert slots == [(0, "e0"), (0, "e1"), (1, "e2"), (1, "e2")]
    eps = {"e0": Episode(tr(), True, 1.0), "e1": Episode(tr(), True, 0.0), "e2": Episode(tr(), False, 1.0)}
    q0 = subagent_samples("q0", slots, eps, correct_main=[1.0, 0.0])
    # R_S = 0.1 + 0.4·correct_main + 0.5·expert; malformed → 0
    assert [s.reward for s in q0] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    q1 = subagent_samples("q1", [(0, "e1"), (1, "e1")], eps, correct_main=[0.0, 0.0])
    adv = assign_advantages(q0 + q1)
    mu, sd = 0.375, math.sqrt(((1 - 0.375) ** 2 + (0.5 - 0.375) ** 2 + 2 * 0.375**2) / 4)
    want = [(r - mu) / (sd + 1e-6) for r in (1.0, 0.5, 0.0, 0.0)] + [0.0, 0.0]  # q1 is a flat group
    assert adv.tolist() == pytest.approx(want, abs=1e-5)


def test_groups_never_mix_roles():
    same_group = [
        Sample("verifier", "g", tr(), 1.0),
        Sample("verifier", "g", tr(), 0.0),
        Sample("corrector", "g", tr(), 1.0),
        Sample("corrector", "g", tr(), 1.0),
    ]
    assert assign_advantages(same_group).tolist() == pytest.approx([S, -S, 0.0, 0.0], abs=1e-5)
