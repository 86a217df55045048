"""The root trainer's schedule (`RootJob.run`) with a real store and stand-in steps: how far the
rollouts run ahead of the updates, and how a failure or a cancel ends the pipeline."""

from __future__ import annotations

import math
import random
import threading
import time
from types import SimpleNamespace

import pytest

from mgrpo.config import JobConfig
from mgrpo.records import Sample, Transcript
from mgrpo.timing import PhaseTimer
from planner_trainer.root import Rollouts, RootJob
from shared_store import Store, keys
from shared_store.jobs import JobCancelled
from shared_store.schemas import LedgerEntry, PlannerStepStats
from shared_store.streams import get_step


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


class Pooled(Timed):
    """Each rollout also runs 8 episodes on the job's rollout pool, keeping the threads they ran on."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.threads: set[threading.Thread] = set()  # the objects: an ident can come back on a new thread

    def produce(self, step):
        def episode(_: int) -> None:
            time.sleep(0.005)
            with self.lock:
                self.threads.add(threading.current_thread())

        list(self.rollout_pool.map(episode, range(8)))
        return super().produce(step)


@pytest.mark.parametrize("staleness", [0, 1])
def test_episodes_run_on_threads_kept_for_the_whole_job(store, job_id, staleness):
    """A step's episodes run on the job's pool, whose threads outlive the step (a pool per step started
    64 threads while the pipelined update held the interpreter lock), and which closes with the job."""
    job = Pooled(store, job_id, JobConfig(steps=4, max_staleness=staleness))
    job.run()
    assert 1 < len(job.threads) <= 8  # 4 steps × 8 episodes, on the threads of the first step
    with pytest.raises(RuntimeError, match="shutdown"):
        job.rollout_pool.submit(print)


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


class Publishing(RootJob):
    """Each rollout publishes a step message to the callees and its own samples (random tokens, a
    NaN reward among them); `die_in_train` raises in the update, as a crash between publishing a step
    and marking it in the ledger would."""

    def __init__(self, store, job_id, cfg, *, start_step=0, die_in_train=-1):
        self.store, self.job_id, self.cfg = store, job_id, cfg
        self.m = SimpleNamespace(version=0, role="planner")
        self.start_step, self.remote, self.die_in_train = start_step, ("subagent",), die_in_train
        self.rolled, self.trained = [], {}

    def produce(self, step):
        self.rolled.append(step)
        rng = random.Random(f"{step}:{len(self.rolled)}")  # a second roll of a step differs
        samples = [
            Sample(
                "planner",
                f"q{i // 2}",
                Transcript(
                    [rng.randrange(300) for _ in range(9)],
                    [rng.random() - 1 for _ in range(9)],
                    [0, 0, 0, 1, 1, 1, 0, 1, 1],
                    3,
                ),
                math.nan if i == 1 else rng.random(),
                policy_version=step,
            )
            for i in range(4)
        ]
        message = PlannerStepStats(job_id=self.job_id, step=step, policy_version=step, queries=[])
        self.publish_produced(
            step, [("planner_stats", message)], samples, {"planner/x": float(step)}, {"subagent": 6}
        )
        return Rollouts(step, samples, PhaseTimer())

    def train(self, rollouts):
        if rollouts.step == self.die_in_train:
            raise RuntimeError("killed")
        self.trained[rollouts.step] = rollouts
        self.store.ledger.mark(
            LedgerEntry(job_id=self.job_id, role="planner", step=rollouts.step, policy_version=1)
        )
        return rollouts.step, rollouts.values

    def finish(self):
        pass


def test_a_restarted_root_trains_the_step_it_published_not_a_new_roll(store, job_id):
    cfg = JobConfig(steps=3, max_staleness=0)
    first = Publishing(store, job_id, cfg, die_in_train=1)
    with pytest.raises(RuntimeError, match="killed"):
        first.run()
    published = get_step(store.client, PlannerStepStats, job_id, "planner_stats", 1)
    assert first.rolled == [0, 1] and published is not None
    restarted = Publishing(store, job_id, cfg, start_step=1)
    restarted.run()
    assert restarted.rolled == [2]  # step 1 came from the store, not from a new roll
    again = restarted.trained[1]
    kept = store.root_steps.get(job_id, 1)
    assert kept is not None
    reused = again.samples
    assert [s.transcript.token_ids for s in reused] == [m_a[1].token_ids.tolist() for m_a in kept.samples]
    # the very samples the first run produced: tokens, log-probs, mask, prompt, reward (NaN kept), group
    rng = random.Random("1:2")
    tokens = [rng.randrange(300) for _ in range(9)]
    assert reused[0].transcript.token_ids == tokens and reused[0].transcript.prompt_len == 3
    assert math.isnan(reused[1].reward) and [s.group for s in reused] == ["q0", "q0", "q1", "q1"]
    assert again.values == {"planner/x": 1.0, "planner/step_reused": 1.0}
    assert store.accounts.totals(job_id)["planner"]["produced"] == 12  # 4 a step, step 1 once
    assert len(store.client.xrange(keys.stream(job_id, "planner_stats"))) == 3  # one message a step
