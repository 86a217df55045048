"""The schedule model of `bench/pipeline_sim.py` against periods worked out by hand."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from pipeline_sim import Role, fair_shares, simulate


def test_fair_shares_fill_small_demands_first():
    assert fair_shares([0.3, 1.0]) == pytest.approx([0.3, 0.7])
    assert fair_shares([0.8, 1.0]) == pytest.approx([0.5, 0.5])
    assert fair_shares([0.2, 0.0]) == pytest.approx([0.2, 0.0])


def test_synchronous_period_is_rollout_plus_the_slowest_update():
    roles = [Role("root", 0.5, 1.0), Role("callee", 0.4, 1.4)]
    assert simulate(roles, 2.0, 0, 200)["period_s"] == pytest.approx(2.0 + 1.4, rel=1e-3)


def test_pipelined_period_is_bounded_by_the_busiest_node():
    """S = 1: the rollout of s + 1 overlaps the updates of s, so in steady state each node's work per step
    (u·R + T) is the bound when the rollout fits beside the updates."""
    roles = [Role("root", 0.3, 1.0), Role("callee", 0.3, 2.5)]  # callee node: 0.3·2 + 2.5 = 3.1 s a step
    piped = simulate(roles, 2.0, 1, 400)["period_s"]
    assert piped == pytest.approx(3.1, rel=0.02)
    assert simulate(roles, 2.0, 0, 400)["period_s"] == pytest.approx(4.5, rel=1e-3)
    # more staleness cannot beat the busiest node
    assert simulate(roles, 2.0, 2, 400)["period_s"] == pytest.approx(3.1, rel=0.02)
