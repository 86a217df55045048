import math

import pytest

from mgrpo.algo import normalize_answer, planner_reward, subagent_reward


def test_planner_reward_takes_three_values():
    assert planner_reward(False, 1.0) == 0.0
    assert planner_reward(True, 0.0) == pytest.approx(0.1)
    assert planner_reward(True, 1.0) == pytest.approx(1.0)


def test_planner_reward_custom_alpha():
    assert planner_reward(True, 1.0, alpha=(0.2, 0.5)) == pytest.approx(0.7)


def test_subagent_reward_hand_numbers():
    assert subagent_reward(False, 1.0, 1.0) == 0.0
    assert subagent_reward(True, 0.0, 0.0) == pytest.approx(0.1)
    assert subagent_reward(True, 1.0, 0.0) == pytest.approx(0.5)
    assert subagent_reward(True, 0.0, 1.0) == pytest.approx(0.6)
    assert subagent_reward(True, 1.0, 0.5) == pytest.approx(0.1 + 0.4 + 0.25)
    assert subagent_reward(True, 1.0, 1.0, beta=(0.0, 0.5, 0.5)) == pytest.approx(1.0)


def test_nan_propagates_as_unscorable():
    assert math.isnan(planner_reward(True, float("nan")))
    assert math.isnan(subagent_reward(True, 1.0, float("nan")))
    assert subagent_reward(False, 1.0, float("nan")) == 0.0


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_out_of_range_scores_are_rejected(bad):
    with pytest.raises(ValueError, match="correct"):
        planner_reward(True, bad)
    with pytest.raises(ValueError, match="expert"):
        subagent_reward(True, 1.0, bad)


def test_bad_weights_are_rejected():
    with pytest.raises(ValueError, match="alpha"):
        planner_reward(True, 1.0, alpha=(0.1,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beta"):
        subagent_reward(True, 1.0, 1.0, beta=(0.1, 0.9))  # type: ignore[arg-type]


def test_normalize_answer():
    assert normalize_answer("  The United   Kingdom! ") == "united kingdom"
    assert normalize_answer("An apple, a day.") == "apple day"
    assert normalize_answer("Paris") == normalize_answer("paris.")
