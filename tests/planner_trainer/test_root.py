"""The root trainer's schedule (`RootJob.run`) with a real store and stand-in steps: how far the
rollouts run ahead of the updates, and how a failure or a cancel ends the pipeline."""

from __future__ import annotations

import threading
import time

import pytest

from mgrpo.config import JobConfig
from mgrpo.timing import PhaseTimer
from planner_trainer.root import Rollouts, RootJob
from shared_store import Store
from shared_store.jobs import JobCancelled


class _Version:
    version = 0


class Timed(RootJob):
    """Rollouts take `roll_s`, updates `train_s`; records, per produced step, how many steps the root
    had applied when its rollout started, and when each phase began and ended."""

    def __init__(self, store, job_id, cfg, *, roll_s=0.02, train_s=0.08, fail_at=-1):
        self.store, self.job_id, self.cfg, self.m = store, job_id, cfg, _Version()
        self.start_step, self.remote = 0, ()
        self.roll_s, self.train_s, self.fail_at = roll_s, train_s, fail_at
        self.applied_at_start: dict[int, int] = {}
        self.spans: dict[tuple[str, int], tuple[float, float]] = {}
        self.lock = threading.Lock()

    def produce(self, step):
        timer = PhaseTimer()
        self.wait_bound(step, timer)
        with self.lock:
            self.applied_at_start[step] = self._applied
        t0 = time.perf_counter()
        if step == self.fail_at:
            raise RuntimeError(f"rollout {step} failed")
        time.sleep(self.roll_s)
        self.spans[("rollout", step)] = (t0, time.perf_counter())
        return Rollouts(step, [], timer)

    def train(self, rollouts):
        t0 = time.perf_counter()
        time.sleep(self.train_s)
        self.spans[("train", rollouts.step)] = (t0, time.perf_counter())
        return rollouts.step, self.finish_values(rollouts)


@pytest.fixture
def store(redis_url):
    return Store.connect(redis_url, wait_s=10)


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_rollouts_never_run_more_than_max_staleness_ahead(store, job_id, staleness):
    cfg = JobConfig(steps=8, max_staleness=staleness)
    job = Timed(store, job_id, cfg)
    seen = []
    job.run(lambda step, values: seen.append((step, values)))
    assert [s for s, _ in seen] == list(range(8))
    for step, applied in job.applied_at_start.items():
        assert applied >= step - 1 - staleness, (step, applied)
    # the bound is also reached: with updates slower than rollouts, each rollout starts as early as allowed
    assert [job.applied_at_start[s] for s in range(2 + staleness, 8)] == [
        s - 1 - staleness for s in range(2 + staleness, 8)
    ]
    overlap = [s for s in range(7) if job.spans[("rollout", s + 1)][0] < job.spans[("train", s)][1]]
    assert bool(overlap) == (staleness > 0)  # pipelined: the rollout of s + 1 runs during the update of s
    assert all("timing/period" in v and "timing/wait_trainer" in v for _, v in seen)


def test_a_failed_rollout_fails_the_run(store, job_id):
    job = Timed(store, job_id, JobConfig(steps=6, max_staleness=1), fail_at=3)
    with pytest.raises(RuntimeError, match="rollout 3 failed"):
        job.run()
    assert max(s for k, s in job.spans if k == "train") == 2


def test_cancel_stops_the_pipeline(store, job_id):
    record, _ = store.jobs.create({}, job_id)
    job = Timed(store, record.job_id, JobConfig(steps=50, max_staleness=1))

    def cancel():
        time.sleep(0.3)
        store.jobs.request_cancel(record.job_id)

    threading.Thread(target=cancel).start()
    with pytest.raises(JobCancelled):
        job.run()
    assert len([k for k in job.spans if k[0] == "train"]) < 50
