"""The step assembly of every role on hand-checkable numbers: 2 queries × K = 2 → the expected
per-query groups, rewards and advantages (a lumped group, a dropped planner outcome or a mixed-role
group fails here)."""

import math

import pytest

from mgrpo.advantages import assign_advantages
from mgrpo.records import Sample, Transcript
from mgrpo.tasks.deep_research import Question
from mgrpo.workflows.deep_research import (
    CalleeQuery,
    Episode,
    QueryRollouts,
    Rollout,
    align_query,
    aligned_samples,
    planner_samples,
    subagent_outcome_reward,
)

S = 1 / math.sqrt(1 + 1e-6)  # ±1 after normalising a two-valued group by its population std (ε = 1e-6)


def tr(final=None, ok=True):
    t = Transcript([1, 2, 3], [0.0, -0.5, -0.5], [0, 1, 1], 1, final=final)
    t.format_ok = ok
    return t


def query(qid, *rollouts):
    """A query's rollouts as (transcript, scored answer) pairs."""
    return QueryRollouts(qid, Question(qid, "?", "", 2, "kind"), [Rollout(t, correct=c) for t, c in rollouts])


def test_planner_groups_are_per_query():
    # q0: right, wrong → rewards 1.0, 0.1;  q1: malformed, right → 0.0, 1.0
    # (the scorer's view of rollout 2 is 1.0, but it is malformed, so it counts 0)
    queries = [
        query("q0", (tr("paris"), 1.0), (tr("rome"), 0.0)),
        query("q1", (tr("paris", ok=False), 1.0), (tr("oslo"), 1.0)),
    ]
    samples = planner_samples(queries, "planner")
    assert [s.group for s in samples] == ["q0", "q0", "q1", "q1"] and {s.role for s in samples} == {"planner"}
    assert [s.reward for s in samples] == pytest.approx([1.0, 0.1, 0.0, 1.0])
    adv = assign_advantages(samples)
    assert adv.tolist() == pytest.approx([S, -S, -S, S], abs=1e-5)  # one group of all four would not give ±1


def test_a_rejected_score_is_never_trained_on():
    # q0: one rollout's reward was rejected (NaN): it leaves the group statistics and gets advantage 0
    samples = planner_samples([query("q0", (tr("a"), 1.0), (tr("b"), math.nan), (tr("c"), 0.0))], "planner")
    assert math.isnan(samples[1].reward)
    adv = assign_advantages(samples)
    assert adv[1] == 0.0 and adv[0] == pytest.approx(S, abs=1e-5) and adv[2] == pytest.approx(-S, abs=1e-5)


def test_subagent_slots_pool_per_query_with_the_planner_outcome():
    # q0: rollout 0 made e0,e1; rollout 1 made e2 → D=2 slots each: [e0, e1], [e2, e2] (own duplicate)
    slots = align_query([["e0", "e1"], ["e2"]], 2, seed=0, mode="duplicate_drop")
    assert slots == [(0, "e0"), (0, "e1"), (1, "e2"), (1, "e2")]
    eps = {"e0": Episode(tr(), True, 1.0), "e1": Episode(tr(), True, 0.0), "e2": Episode(tr(), False, 1.0)}
    fetched = []
    samples, empty = aligned_samples(
        "subagent",
        [
            CalleeQuery("q0", [["e0", "e1"], ["e2"]], [1.0, 0.0]),
            CalleeQuery(
                "q1", [["e1"], []], [0.0, 0.0]
            ),  # rollout 1 made none: it draws from the query's pool
            CalleeQuery("q2", [[], []], [1.0, 1.0]),  # no episode at all: no sample
        ],
        slots=2,
        mode="duplicate_drop",
        seed_of=lambda _qid: 0,
        fetch=lambda ids: fetched.append(ids) or {e: eps[e] for e in ids},
        reward=subagent_outcome_reward,
    )
    assert fetched[0] == ["e0", "e1", "e2"] and fetched[1] == ["e1"] and empty == 1  # each id fetched once
    q0, q1 = samples[:4], samples[4:]
    assert [s.episode_id for s in q0] == ["e0", "e1", "e2", "e2"] and [s.group for s in q1] == ["q1"] * 4
    # R_S = 0.1 + 0.4·correct_main + 0.5·expert; malformed → 0
    assert [s.reward for s in q0] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    adv = assign_advantages(q0 + q1)
    mu, sd = 0.375, math.sqrt(((1 - 0.375) ** 2 + (0.5 - 0.375) ** 2 + 2 * 0.375**2) / 4)
    want = [(r - mu) / (sd + 1e-6) for r in (1.0, 0.5, 0.0, 0.0)] + [0.0] * 4  # q1 is a flat group
    assert adv.tolist() == pytest.approx(want, abs=1e-5)


def test_groups_never_mix_roles():
    same_group = [
        Sample("verifier", "g", tr(), 1.0),
        Sample("verifier", "g", tr(), 0.0),
        Sample("corrector", "g", tr(), 1.0),
        Sample("corrector", "g", tr(), 1.0),
    ]
    assert assign_advantages(same_group).tolist() == pytest.approx([S, -S, 0.0, 0.0], abs=1e-5)
