from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo.algo import align_episodes, alignment_seed


def test_exact_count_keeps_order():
    assert align_episodes([3], 3, seed=0) == [[(0, 0), (0, 1), (0, 2)]]


def test_fewer_duplicates_own_episodes_with_replacement():
    (slots,) = align_episodes([2], 5, seed=1)
    assert len(slots) == 5
    assert slots[:2] == [(0, 0), (0, 1)]  # every own episode kept, in order
    assert all(s in {(0, 0), (0, 1)} for s in slots[2:])


def test_more_drops_without_replacement_keeping_order():
    (slots,) = align_episodes([10], 4, seed=2)
    idx = [i for _, i in slots]
    assert len(idx) == 4 and len(set(idx)) == 4 and idx == sorted(idx)


def test_empty_rollout_fills_from_query_pool():
    out = align_episodes([0, 2, 1], 3, seed=3)
    pool = {(1, 0), (1, 1), (2, 0)}
    assert len(out[0]) == 3 and set(out[0]) <= pool
    assert out[1][:2] == [(1, 0), (1, 1)] and set(out[1]) <= {(1, 0), (1, 1)}
    assert out[2] == [(2, 0)] * 3


def test_query_without_any_episode_is_empty():
    assert align_episodes([0, 0, 0], 4, seed=0) == [[], [], []]


def test_mode_none_keeps_exactly_the_own_episodes():
    assert align_episodes([0, 2, 5], 3, seed=0, mode="none") == [
        [],
        [(1, 0), (1, 1)],
        [(2, i) for i in range(5)],
    ]


def test_draws_are_roughly_uniform():
    counts = Counter()
    for seed in range(400):
        (slots,) = align_episodes([4], 2, seed=seed)
        counts.update(i for _, i in slots)
    assert min(counts.values()) > 0.8 * 200 and max(counts.values()) < 1.2 * 200


def test_seed_helper_is_stable_and_distinct():
    assert alignment_seed(7, 3, "q1") == alignment_seed(7, 3, "q1")
    assert len({alignment_seed(7, s, q) for s in range(20) for q in ("a", "b", "c")}) == 60
    assert 0 <= alignment_seed(7, 3, "q1") < 2**63


@pytest.mark.parametrize(
    ("counts", "slots", "mode", "match"),
    [([1], 0, "duplicate_drop", "slots"), ([-1], 2, "duplicate_drop", ">= 0"), ([1], 2, "pad", "mode")],
)
def test_bad_input(counts, slots, mode, match):
    with pytest.raises(ValueError, match=match):
        align_episodes(counts, slots, seed=0, mode=mode)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=10), st.integers(1, 10), st.integers(0, 2**32))
def test_alignment_properties(counts, slots, seed):
    out = align_episodes(counts, slots, seed=seed)
    assert len(out) == len(counts)
    assert out == align_episodes(counts, slots, seed=seed)  # same seed → same draws
    if sum(counts) == 0:
        assert all(s == [] for s in out)
        return
    for k, (d, rollout_slots) in enumerate(zip(counts, out, strict=True)):
        assert len(rollout_slots) == slots
        for kk, i in rollout_slots:
            assert 0 <= i < counts[kk]
            assert kk == k or d == 0  # only own episodes, unless the rollout had none
        if 0 < d <= slots:
            assert {i for _, i in rollout_slots} == set(range(d))  # every episode kept
        if d > slots:
            assert len(set(rollout_slots)) == slots  # dropped without replacement
