import json
import time

import pytest

from shared_store import keys
from shared_store.schemas import PlannerStepStats, QueryStats, RolloutStat
from shared_store.streams import (
    StreamConsumer,
    consume_once,
    get_step,
    publish,
    publish_step,
    trim_through_step,
)

pytestmark = pytest.mark.redis


def stats(job_id: str, step: int) -> PlannerStepStats:
    q = QueryStats(
        query_id="q0",
        reward_mean=0.5,
        reward_std=0.5,
        rollouts=[RolloutStat(rollout=0, reward=1.0, correct=1.0, format_ok=True)],
    )
    return PlannerStepStats(job_id=job_id, step=step, policy_version=step, queries=[q])


def consumer(store, job_id, name, idle_ms=50):
    key = keys.stream(job_id, "planner_stats")
    return StreamConsumer(store.client, key, "subagent", name, PlannerStepStats, min_idle_ms=idle_ms)


def test_publish_step_writes_stream_and_step_record(store, job_id):
    publish_step(store.client, "planner_stats", stats(job_id, 0))
    assert get_step(store.client, PlannerStepStats, job_id, "planner_stats", 0) == stats(job_id, 0)
    assert get_step(store.client, PlannerStepStats, job_id, "planner_stats", 1) is None
    got = consumer(store, job_id, "c1").read(block_ms=100)
    assert [d.message.step for d in got] == [0]


def test_consumer_dies_before_work_another_claims_and_applies_once(store, job_id):
    applied: list[int] = []
    publish_step(store.client, "planner_stats", stats(job_id, 0))
    dead = consumer(store, job_id, "dead")
    assert len(dead.read(block_ms=100)) == 1  # read, then "crash": no work, no XACK
    alive = consumer(store, job_id, "alive")
    time.sleep(0.1)  # past min_idle_ms
    ran = consume_once(alive, store.ledger, "subagent", lambda m: applied.append(m.step) or 1, block_ms=100)
    assert ran == 1 and applied == [0]
    assert alive.pending() == 0
    assert [(e.role, e.step, e.consumer) for e in store.ledger.entries(job_id)] == [("subagent", 0, "alive")]


def test_consumer_dies_after_work_before_ack_step_not_applied_twice(store, job_id):
    applied: list[int] = []
    publish_step(store.client, "planner_stats", stats(job_id, 0))
    publish_step(store.client, "planner_stats", stats(job_id, 1))
    dead = consumer(store, job_id, "dead")
    # the dead consumer applies both steps and records them, but dies before XACK
    dead_handler = lambda m: applied.append(m.step) or 1  # noqa: E731
    original_ack = dead.ack
    dead.ack = lambda entry_id: None  # type: ignore[method-assign]
    assert consume_once(dead, store.ledger, "subagent", dead_handler, block_ms=100) == 2
    dead.ack = original_ack  # type: ignore[method-assign]
    assert dead.pending() == 2
    alive = consumer(store, job_id, "alive")
    time.sleep(0.1)
    ran = consume_once(alive, store.ledger, "subagent", lambda m: applied.append(m.step) or 1, block_ms=100)
    assert ran == 0 and applied == [0, 1]  # redelivered, recognised from the ledger, only acknowledged
    assert alive.pending() == 0
    assert sorted(e.step for e in store.ledger.entries(job_id)) == [0, 1]


def test_ledger_mark_is_once_only(store, job_id):
    from shared_store.schemas import LedgerEntry

    e = LedgerEntry(job_id=job_id, role="planner", step=5, policy_version=6)
    assert store.ledger.mark(e) and not store.ledger.mark(e)
    assert store.ledger.is_applied(job_id, "planner", 5) and not store.ledger.is_applied(
        job_id, "subagent", 5
    )
    assert store.ledger.last_step(job_id, "planner") == 5 and store.ledger.last_step(job_id, "subagent") == -1
    assert len(store.ledger.entries(job_id)) == 1


def test_undecodable_entry_goes_to_dead_letters_and_does_not_block(store, job_id):
    key = keys.stream(job_id, "planner_stats")
    store.client.xadd(key, {"data": b'{"schema_version": 99}'})
    store.client.xadd(key, {"data": b"\x00garbage"})
    publish(store.client, key, stats(job_id, 7))
    c = consumer(store, job_id, "c1")
    got = c.read(block_ms=100)
    assert [d.message.step for d in got] == [7]
    dead = c.dead_letters()
    assert len(dead) == 2 and "schema_version 99" in dead[0]["reason"]
    assert c.pending() == 1  # only the good one awaits its ack


def test_block_returns_empty_on_timeout(store, job_id):
    t0 = time.monotonic()
    assert consumer(store, job_id, "c1").read(block_ms=200) == []
    assert time.monotonic() - t0 >= 0.15


def test_trim_through_step_deletes_exactly_the_old_steps(store, job_id):
    """Across XRANGE pages, with a redelivered duplicate; an unreadable entry ends the scan."""
    key = keys.stream(job_id, "planner_stats")
    for step in [0, 1, 1, 2, 3, 4, 5]:
        publish_step(store.client, "planner_stats", stats(job_id, step))
    assert trim_through_step(store.client, key, 3, page=2) == 5
    left = [json.loads(f[b"data"])["step"] for _, f in store.client.xrange(key)]
    assert left == [4, 5]
    assert trim_through_step(store.client, key, 3) == 0  # nothing older left
    store.client.xadd(key, {"data": b"not json"})
    publish_step(store.client, "planner_stats", stats(job_id, 6))
    assert trim_through_step(store.client, key, 10) == 2  # 4 and 5; the unreadable entry and 6 stay
    assert store.client.xlen(key) == 2
    assert trim_through_step(store.client, keys.stream(job_id, "batch.nobody"), 3) == 0  # no such stream
