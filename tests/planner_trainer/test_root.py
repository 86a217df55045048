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
from mgrpo.workflows import job_spec
from planner_trainer.root import Rollouts, RootJob
from shared_store import Store, keys
from shared_store.jobs import JobCancelled
from shared_store.schemas import LedgerEntry, PlannerStepStats
from shared_store.streams import get_step


class _Version:
    version = 0


class Timed(RootJob):
    """Stand-in steps that synchronise on events and state, not on sleeps: the update of step s waits
    until the rollout of step s + S has started (S = max_staleness; already true on one thread, at
    S = 0), which a pipeline lets happen during that update, and then until the rollout thread has
    either started step s + S + 1 (beyond the bound: the test fails on it) or is waiting at the bound
    for the update to end. Records, per produced step, how many steps the root had applied when its
    rollout started, and when each phase began and ended."""

    def __init__(self, store, job_id, cfg, *, fail_at=-1, cancel_at=-1, paced=True):
        self.store, self.job_id, self.cfg, self.job = store, job_id, cfg, job_spec(cfg)
        self.paced = paced  # the updates wait for the rollouts they should overlap
        self.root, self.model, self.start_step, self.remote = "planner", _Version(), 0, ()
        self.fail_at, self.cancel_at = fail_at, cancel_at
        self.started = {s: threading.Event() for s in range(cfg.steps)}
        self.arrived = {s: threading.Event() for s in range(cfg.steps)}  # at the bound check
        self.applied_at_start: dict[int, int] = {}
        self.spans: dict[tuple[str, int], tuple[float, float]] = {}
        self.ahead_in_time: list[int] = []  # updates during which the rollout they waited for started
        self.lock = threading.Lock()

    def produce(self, step):
        timer = PhaseTimer()
        self.arrived[step].set()
        self.wait_bound(step, timer)
        with self.lock:
            self.applied_at_start[step] = self._applied
        t0 = time.perf_counter()
        self.started[step].set()
        if step == self.fail_at:
            raise RuntimeError(f"rollout {step} failed")
        if step == self.cancel_at:
            self.store.jobs.request_cancel(self.job_id)
        self.spans[("rollout", step)] = (t0, time.perf_counter())
        return Rollouts(step, [], timer)

    def train(self, rollouts):
        t0, step = time.perf_counter(), rollouts.step
        ahead = step + self.cfg.max_staleness
        if self.paced and ahead < self.cfg.steps:
            set_before = self.started[ahead].is_set()
            assert self.started[ahead].wait(30), (
                f"the rollout of step {ahead} never started during update {step}"
            )
            if not set_before:
                self.ahead_in_time.append(step)
            if ahead + 1 < self.cfg.steps and self.cfg.max_staleness > 0:
                self._settled(ahead + 1)
        self.spans[("train", step)] = (t0, time.perf_counter())
        return step, self.finish_values(rollouts)

    def _settled(self, step):
        """Until the rollout of `step` started, or the rollout thread waits at the bound for it (on
        the schedule's condition: a waiter there)."""
        deadline, tick = time.monotonic() + 30, threading.Event()
        while not (self.started[step].is_set() or (self.arrived[step].is_set() and self._cond._waiters)):
            assert time.monotonic() < deadline, f"the rollout thread never reached step {step}"
            tick.wait(0.001)


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
        assert applied >= step - 1 - staleness, (step, applied)  # never further ahead than the bound
    # and the bound is reached: each rollout that an update waited for started as early as allowed
    assert [job.applied_at_start[s] for s in range(1 + staleness, 8)] == [
        s - 1 - staleness for s in range(1 + staleness, 8)
    ]
    rollout_start, train_end = (
        {s: job.spans[("rollout", s)][0] for s in range(8)},
        {s: job.spans[("train", s)][1] for s in range(8)},
    )
    if staleness == 0:  # one thread: the next rollout starts after the update ends
        assert all(rollout_start[s + 1] >= train_end[s] for s in range(7)) and job.ahead_in_time == []
    else:  # pipelined: the rollout of s + S started during the update of s, which waited for it
        assert job.ahead_in_time == list(range(8 - staleness))
        assert all(rollout_start[s + staleness] < train_end[s] for s in range(8 - staleness))
    assert all("timing/period" in v and "timing/wait_trainer" in v for _, v in seen)


class Pooled(Timed):
    """Each rollout also runs 8 episodes on the job's rollout pool, two at a time by a barrier (so at
    least two threads), keeping the threads they ran on."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.threads: set[threading.Thread] = set()  # the objects: an ident can come back on a new thread
        self.pair = threading.Barrier(2, timeout=30)

    def produce(self, step):
        def episode(_: int) -> None:
            self.pair.wait()
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
    job = Timed(store, job_id, JobConfig(steps=6, max_staleness=1), fail_at=3, paced=False)
    with pytest.raises(RuntimeError, match="rollout 3 failed"):
        job.run()
    assert max(s for k, s in job.spans if k == "train") == 2


def test_cancel_stops_the_pipeline(store, job_id):
    """A cancel requested while step 3 rolls out stops the job within the next step or two: it was
    still running when the cancel came (step 3's rollout requested it)."""
    record, _ = store.jobs.create({}, job_id, roles=("planner",))
    job = Timed(store, record.job_id, JobConfig(steps=50, max_staleness=1), cancel_at=3, paced=False)
    with pytest.raises(JobCancelled):
        job.run()
    trained = [k[1] for k in job.spans if k[0] == "train"]
    assert job.started[3].is_set() and max(trained) <= 4, trained


class Publishing(RootJob):
    """Each rollout publishes a step message to the callees and its own samples (random tokens, a
    NaN reward among them); `die_in_train` raises in the update, as a crash between publishing a step
    and marking it in the ledger would."""

    def __init__(self, store, job_id, cfg, *, start_step=0, die_in_train=-1):
        self.store, self.job_id, self.cfg, self.job = store, job_id, cfg, job_spec(cfg)
        self.root, self.model = "planner", SimpleNamespace(version=0)
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
