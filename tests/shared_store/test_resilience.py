"""Restarts, unreachable servers, passwords and bounded memory, each against its own redis-server."""

import threading
import time

import pytest

from shared_store import Store, keys
from shared_store.connection import StoreUnavailableError, connect
from shared_store.embedded import RedisServer, free_port
from shared_store.keys import episode_id
from shared_store.schemas import (
    EpisodeMeta,
    PlannerStepStats,
    PolicyVersion,
    QueryStats,
    RolloutStat,
)
from shared_store.streams import StreamConsumer, publish_step

pytestmark = pytest.mark.redis


def stats(job_id, step):
    q = QueryStats(
        query_id="q0",
        reward_mean=0.0,
        reward_std=0.0,
        rollouts=[RolloutStat(rollout=0, reward=0.0, correct=0.0, format_ok=True)],
    )
    return PlannerStepStats(job_id=job_id, step=step, policy_version=step, queries=[q])


def test_restart_during_exchange_loses_nothing_acknowledged(tmp_path, job_id):
    server = RedisServer(tmp_path / "r", appendonly=True)
    server.start()
    try:
        store = Store.connect(server.url, wait_s=10)
        for s in range(5):
            publish_step(store.client, "planner_stats", stats(job_id, s))
        c = StreamConsumer(store.client, keys.stream(job_id, "planner_stats"), "g", "c1", PlannerStepStats)
        got = c.read(count=5, block_ms=100)
        for d in got[:3]:
            c.ack(d.entry_id)

        server.kill()  # SIGKILL: only what reached the append-only file survives
        restarter = threading.Timer(0.5, server.start)
        restarter.start()
        publish_step(store.client, "planner_stats", stats(job_id, 5))  # retried until the server is back
        restarter.join()

        assert store.client.xlen(keys.stream(job_id, "planner_stats")) == 6
        assert c.pending() == 2  # the two unacknowledged entries are still pending, the acked ones not
        fresh = c.read(count=10, block_ms=100)
        assert [d.message.step for d in fresh] == [5]
    finally:
        server.stop()


def test_unreachable_redis_is_a_clear_error_without_password():
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="cannot reach Redis") as err:
        connect(url, wait_s=1.0)
    assert "hunter2" not in str(err.value) and "***" in str(err.value)
    assert time.monotonic() - t0 < 5


def test_password_url_works(tmp_path):
    server = RedisServer(tmp_path / "p", password="s3cret")
    server.start()
    try:
        assert connect(server.url, wait_s=5).ping()
    finally:
        server.stop()


def test_bad_scheme_is_refused():
    with pytest.raises(ValueError, match="redis://"):
        connect("http://127.0.0.1:6379")


def test_policy_versions_and_wait(store, job_id):
    from shared_store.policy import PolicyTimeoutError

    assert store.policies.get(job_id, "planner") is None
    with pytest.raises(PolicyTimeoutError, match="planner"):
        store.policies.wait_for(job_id, "planner", 1, timeout_s=0.2)
    threading.Timer(
        0.2, store.policies.publish, args=(PolicyVersion(job_id=job_id, role="planner", version=2, step=1),)
    ).start()
    got = store.policies.wait_for(job_id, "planner", 2, timeout_s=5)
    assert got.version == 2 and store.policies.get(job_id, "subagent") is None


def test_memory_stays_flat_over_200_steps(tmp_path, job_id):
    """Each step writes 32 episodes of 256 tokens and 3 stream messages; GC keeps one finished step."""
    import numpy as np

    from shared_store import EpisodeArrays

    server = RedisServer(tmp_path / "m")
    server.start()
    try:
        store = Store.connect(server.url, wait_s=10)
        rng = np.random.default_rng(0)
        arr = EpisodeArrays.of(rng.integers(0, 1000, 256), rng.standard_normal(256), np.ones(256))
        samples: dict[int, tuple[int, int]] = {}
        for step in range(200):
            for i in range(32):
                eid = episode_id(step, "q0", i // 4, i % 4)
                meta = EpisodeMeta(
                    job_id=job_id,
                    step=step,
                    policy_version=step,
                    episode_id=eid,
                    query_id="q0",
                    rollout=i // 4,
                    call=i % 4,
                    n_tokens=0,
                )
                store.episodes.put(meta, arr)
            for name in ("planner_stats", "batch.verifier"):
                publish_step(store.client, name, stats(job_id, step))
            for role in ("solver", "verifier"):
                store.progress.advance(job_id, role, step)
            store.progress.collect(job_id, keep_steps=1, roles=("solver", "verifier"))
            if step in (20, 199):
                info = store.client.info("memory")
                samples[step] = (int(store.client.dbsize()), int(info["used_memory"]))
        (keys20, mem20), (keys199, mem199) = samples[20], samples[199]
        assert keys199 == keys20  # the same keys: two steps of episodes, their indexes, 3 step records each
        for name in ("planner_stats", "batch.verifier"):  # GC trims the consumed entries
            assert store.client.xlen(keys.stream(job_id, name)) == 1, name
        assert abs(mem199 - mem20) < 64_000, (mem20, mem199)  # flat: 180 more steps left nothing behind
    finally:
        server.stop()
