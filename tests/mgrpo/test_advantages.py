import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo.algo import group_advantages

EPS = 1e-6


def loop_reference(rewards, groups, eps=EPS, unbiased=False):
    """A plain-Python reference of algorithm.md §4, written independently of the vectorised code."""
    out = [0.0] * len(rewards)
    for g in set(groups):
        idx = [i for i, gg in enumerate(groups) if gg == g and not math.isnan(rewards[i])]
        vals = [rewards[i] for i in idx]
        if len(vals) < 2 or max(vals) == min(vals):
            continue
        mean = sum(vals) / len(vals)
        var = sum((v - mean) ** 2 for v in vals) / (len(vals) - (1 if unbiased else 0))
        for i in idx:
            out[i] = (rewards[i] - mean) / (math.sqrt(var) + eps)
    return out


def test_hand_computed_population():
    # mean 0.525; deviations .475 −.525 −.425 .475; population var .9075/4 = .226875; std .4763139720814
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.1, 1.0]), torch.tensor([0, 0, 0, 0]))
    expected = [0.9972392803952919, -1.1022118362263753, -0.8922667245642086, 0.9972392803952919]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)


def test_hand_computed_unbiased():
    # unbiased var .9075/3 = .3025 → std exactly .55
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.1, 1.0]), torch.tensor([7, 7, 7, 7]), std="unbiased")
    assert adv.tolist() == pytest.approx(
        [0.475 / 0.550001, -0.525 / 0.550001, -0.425 / 0.550001, 0.475 / 0.550001]
    )


def test_ragged_groups_singletons_and_flat_groups():
    rewards = torch.tensor([0.0, 1.0, 5.0, 0.1, 0.1, 0.1, 3.0, 1.0])
    groups = torch.tensor([2, 2, 9, 4, 4, 4, 1, 1])
    adv = group_advantages(rewards, groups)
    # group 2: [0, 1] → ±1/(0.5+ε)·0.5; group 9 singleton → 0; group 4 flat → exactly 0; group 1: [3, 1]
    assert adv.tolist() == pytest.approx(
        [-0.999998, 0.999998, 0.0, 0.0, 0.0, 0.0, 0.999998, -0.999998], abs=1e-6
    )
    assert adv[3:6].eq(0).all()  # flat group gives exact zeros, not round-off noise


def test_nan_is_excluded_and_gets_zero():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 0.1])
    adv = group_advantages(rewards, torch.zeros(4, dtype=torch.long))
    assert adv[1] == 0
    ref = group_advantages(torch.tensor([1.0, 0.0, 0.1]), torch.zeros(3, dtype=torch.long))
    assert adv[[0, 2, 3]].tolist() == pytest.approx(ref.tolist())


def test_group_with_one_valid_reward_is_zero():
    adv = group_advantages(torch.tensor([float("nan"), 1.0]), torch.tensor([0, 0]))
    assert adv.tolist() == [0.0, 0.0]


def test_dtype_and_empty():
    assert group_advantages(torch.tensor([1, 0]), torch.tensor([0, 0])).dtype == torch.float32
    assert (
        group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0])).dtype
        == torch.float64
    )
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).numel() == 0


def test_bad_input_says_what_to_fix():
    with pytest.raises(ValueError, match="one shape"):
        group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="population"):
        group_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), std="sample")  # type: ignore[arg-type]


# rewards on a 0.01 grid: distinct values differ enough that shift/scale never merges them in float64
reward_values = st.one_of(st.sampled_from([0.0, 0.1, 1.0]), st.integers(-1000, 1000).map(lambda x: x / 100))
groups_strategy = st.lists(st.tuples(st.integers(0, 5), reward_values), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(groups_strategy)
def test_matches_loop_reference(pairs):
    groups = [g for g, _ in pairs]
    rewards = [r for _, r in pairs]
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups))
    assert adv.tolist() == pytest.approx(loop_reference(rewards, groups), abs=1e-9)
    adv_u = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups), std="unbiased")
    assert adv_u.tolist() == pytest.approx(loop_reference(rewards, groups, unbiased=True), abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(groups_strategy)
def test_zero_mean_and_unit_std_per_group(pairs):
    groups = torch.tensor([g for g, _ in pairs])
    rewards = torch.tensor([r for _, r in pairs], dtype=torch.float64)
    adv = group_advantages(rewards, groups, eps=0.0)
    for g in groups.unique():
        sel = groups == g
        a, r = adv[sel], rewards[sel]
        assert abs(float(a.sum())) < 1e-6
        if len(r) >= 2 and float(r.max() - r.min()) > 1e-3:
            assert float(a.pow(2).mean().sqrt()) == pytest.approx(1.0, abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(groups_strategy, st.floats(-100, 100), st.floats(0.01, 100))
def test_invariant_to_shift_and_positive_scale(pairs, shift, scale):
    groups = torch.tensor([g for g, _ in pairs])
    rewards = torch.tensor([r for _, r in pairs], dtype=torch.float64)
    base = group_advantages(rewards, groups, eps=0.0)
    moved = group_advantages(rewards * scale + shift, groups, eps=0.0)
    # exact zero-variance groups stay zero; elsewhere equal up to float round-off
    assert moved.tolist() == pytest.approx(base.tolist(), abs=1e-5)


def test_advantage_stats_count_samples_of_all_equal_groups_as_flat():
    from mgrpo.advantages import advantage_stats

    adv = group_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1, 2, 2]))
    stats = advantage_stats(adv)
    assert stats["flat_share"] == pytest.approx(4 / 6)  # groups 0 and 2 are all-equal; group 1 is not
    assert stats["adv_std"] == pytest.approx(float(adv.std()))
    assert advantage_stats(torch.zeros(0)) == {"adv_std": 0.0, "flat_share": 0.0}
