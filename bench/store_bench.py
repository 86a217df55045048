"""Store benchmark (issue 3): aligned-batch exchange throughput vs raw redis-py, and stats latency.

    .venv/bin/python bench/store_bench.py [--episodes 2048] [--tokens 1024] [--redis-url URL]

Writes 2,048 episodes × 1,024 tokens (int32 ids, float32 log-probs, uint8 mask: 9 KiB each) through
`EpisodeStore.put_many` and reads them back with `get_many`, in batches of 64; in the same run and
the same server, raw redis-py pipelined SET/GET of the same bytes. Then the p50/p99 latency of a
per-step statistics round trip (publish_step → XREADGROUP → XACK) for 8 queries × 8 rollouts.
Prints a JSON line; with no --redis-url a private redis-server is started.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from shared_store import EpisodeArrays, Store, keys
from shared_store.embedded import RedisServer
from shared_store.keys import episode_id
from shared_store.schemas import EpisodeMeta, PlannerStepStats, QueryStats, RolloutStat
from shared_store.streams import StreamConsumer, publish_step

BATCH = 64


def make_episodes(job_id: str, n: int, tokens: int) -> list[tuple[EpisodeMeta, EpisodeArrays]]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        arr = EpisodeArrays.of(
            rng.integers(0, 150_000, tokens), rng.standard_normal(tokens), rng.integers(0, 2, tokens)
        )
        meta = EpisodeMeta(
            job_id=job_id,
            step=0,
            policy_version=0,
            episode_id=episode_id(0, f"q{i // 64}", (i // 8) % 8, i % 8),
            query_id=f"q{i // 64}",
            rollout=(i // 8) % 8,
            call=i % 8,
            n_tokens=0,
        )
        out.append((meta, arr))
    return out


def bench_store(
    store: Store, job_id: str, eps: list[tuple[EpisodeMeta, EpisodeArrays]]
) -> tuple[float, float]:
    t0 = time.perf_counter()
    for i in range(0, len(eps), BATCH):
        store.episodes.put_many(eps[i : i + BATCH])
    t1 = time.perf_counter()
    ids = [m.episode_id for m, _ in eps]
    for i in range(0, len(ids), BATCH):
        store.episodes.get_many(job_id, 0, ids[i : i + BATCH])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def bench_raw(store: Store, job_id: str, eps: list[tuple[EpisodeMeta, EpisodeArrays]]) -> tuple[float, float]:
    blobs = [a.token_ids.tobytes() + a.logp.tobytes() + a.loss_mask.tobytes() for _, a in eps]
    names = [f"raw-bench:{job_id}:{i}" for i in range(len(eps))]
    r = store.client
    t0 = time.perf_counter()
    for i in range(0, len(blobs), BATCH):
        pipe = r.pipeline(transaction=False)
        for name, blob in zip(names[i : i + BATCH], blobs[i : i + BATCH], strict=True):
            pipe.set(name, blob)
        pipe.execute()
    t1 = time.perf_counter()
    for i in range(0, len(names), BATCH):
        pipe = r.pipeline(transaction=False)
        for name in names[i : i + BATCH]:
            pipe.get(name)
        got = pipe.execute()
        _ = [np.frombuffer(b, dtype=np.uint8) for b in got]
    t2 = time.perf_counter()
    r.delete(*names)
    return t1 - t0, t2 - t1


def bench_stats_latency(store: Store, job_id: str, n: int = 300) -> dict[str, float]:
    rollouts = [
        RolloutStat(
            rollout=k, reward=0.1 * k, correct=1.0, format_ok=True, episodes={"subagent": [f"s0-q-r{k}-c0"]}
        )
        for k in range(8)
    ]
    queries = [
        QueryStats(query_id=f"q{i}", rollouts=rollouts, reward_mean=0.4, reward_std=0.2) for i in range(8)
    ]
    consumer = StreamConsumer(
        store.client, keys.stream(job_id, "planner_stats"), "bench", "c", PlannerStepStats
    )
    lat = []
    for step in range(n):
        t0 = time.perf_counter()
        publish_step(
            store.client,
            "planner_stats",
            PlannerStepStats(job_id=job_id, step=step, policy_version=step, queries=queries),
        )
        (d,) = consumer.read(count=1, block_ms=1000)
        consumer.ack(d.entry_id)
        lat.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(lat, n=100)
    return {"stats_roundtrip_p50_ms": round(q[49], 3), "stats_roundtrip_p99_ms": round(q[98], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--redis-url", default=None)
    args = ap.parse_args()
    server = None
    if args.redis_url is None:
        server = RedisServer(Path(tempfile.mkdtemp()))
        server.start()
    try:
        store = Store.connect(args.redis_url or server.url)  # type: ignore[union-attr]
        job_id = f"bench-{int(time.time())}"
        eps = make_episodes(job_id, args.episodes, args.tokens)
        mb = sum(9 * len(a) for _, a in eps) / 1e6
        best = {"store_w": 1e9, "store_r": 1e9, "raw_w": 1e9, "raw_r": 1e9}
        for _ in range(args.repeats):  # interleaved, best of N: the machine is noisy
            sw, sr = bench_store(store, job_id, eps)
            rw, rr = bench_raw(store, job_id, eps)
            store.episodes.delete_step(job_id, 0)
            best = {
                "store_w": min(best["store_w"], sw),
                "store_r": min(best["store_r"], sr),
                "raw_w": min(best["raw_w"], rw),
                "raw_r": min(best["raw_r"], rr),
            }
        result = {
            "payload_MB": round(mb, 1),
            "store_write_MBps": round(mb / best["store_w"], 1),
            "raw_set_MBps": round(mb / best["raw_w"], 1),
            "store_read_MBps": round(mb / best["store_r"], 1),
            "raw_get_MBps": round(mb / best["raw_r"], 1),
            "write_ratio": round(best["raw_w"] / best["store_w"], 3),
            "read_ratio": round(best["raw_r"] / best["store_r"], 3),
            "roundtrip_ratio": round(
                (best["raw_w"] + best["raw_r"]) / (best["store_w"] + best["store_r"]), 3
            ),
            **bench_stats_latency(store, job_id),
        }
        print(json.dumps(result))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
