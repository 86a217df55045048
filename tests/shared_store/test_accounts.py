import pytest


def test_counts_per_step_sum_per_role(store, job_id):
    a = store.accounts
    a.record(job_id, "planner", 0, produced=8)
    a.record(job_id, "planner", 0, trained=7, dropped=1)
    a.record(job_id, "planner", 1, produced=8)
    a.record(job_id, "planner", 1, produced=6)  # rolled out again after a restart: replaced, not added
    a.record(job_id, "planner", 1, trained=6)
    a.record(job_id, "subagent", 0, first_wins=True, produced=5)
    a.record(job_id, "subagent", 0, first_wins=True, produced=9)  # the second message of a step is skipped
    a.record(job_id, "subagent", 0, trained=4, unaligned=1)
    assert a.totals(job_id) == {
        "planner": {"produced": 14, "trained": 13, "dropped": 1, "unaligned": 0},
        "subagent": {"produced": 5, "trained": 4, "dropped": 0, "unaligned": 1},
    }
    with pytest.raises(ValueError, match="kinds"):
        a.record(job_id, "planner", 2, lost=1)
    with pytest.raises(ValueError, match="role"):
        a.record(job_id, "Planner!", 2, produced=1)
