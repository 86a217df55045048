"""What every root-role trainer shares: its set-up (the role's model, its first policy published,
a client per callee trainer), the step loop over the job's steps (a cancel stops it between steps),
the bound on how far rollouts run ahead, the training half of a step, and the wait for the callee
roles to finish the last step. A workflow's root job (`Workflow.root_job`) adds only `produce`.

A step is two halves: `produce(step)` (wait for the bound, roll out, score, hand every callee role its
share of the step through its Redis stream) and `train(rollouts)` (the root's own update, checkpoint,
ledger). With `max_staleness: 0` they alternate on one thread, synchronously (the paper's schedule).
With `max_staleness: S ≥ 1` they are a pipeline: a rollout thread produces step s + 1 while the
trainer updates on step s, and the rollout of step s starts once every trainer of the job, the root
included, has applied step s − 1 − S — so no sample is more than S versions older than the policy it
trains. The root's own samples wait for its trainer in an in-process queue; `timing/wait_partner` is
the rollout side's wait for the callee roles, `timing/wait_trainer` its wait for the root's own
update, `timing/period` the time between two finished steps (the pipeline's throughput).

A produced step is published once: its messages to the callees and the root's own samples in one
MULTI (`publish_produced`). A root restarted after that (killed before its ledger mark) trains on the
published samples (`produce_once`, metric `<root>/step_reused`) instead of rolling the step again.
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from mgrpo.advantages import advantage_stats, assign_advantages
from mgrpo.records import Sample, Transcript
from mgrpo.role_model import RoleModel
from mgrpo.runtime import Placement
from mgrpo.timing import PhaseTimer
from mgrpo.tracking import open_trackers
from mgrpo.workflows import JobSpec
from planner_trainer.delegate import Callee, CalleeClient, PartnerError
from planner_trainer.partners import wait_applied
from shared_store import EpisodeArrays, Store
from shared_store.jobs import JobCancelled
from shared_store.schemas import MetricsEvent, PolicyVersion, RootSampleMeta, StepMessage
from shared_store.streams import publish_event, publish_metrics

log = logging.getLogger("mgrpo.root")
ROLLOUT_THREADS = 128  # a step's episodes in flight at once (more wait for a free thread)


@dataclass
class Rollouts:
    """One produced step, handed from the rollout side to the root's trainer."""

    step: int
    samples: list[Sample]  # the root trainer's own samples, rewards filled
    timer: PhaseTimer
    values: dict[str, float] = field(default_factory=dict)  # the rollout's metrics
    extra: Any = None  # what a workflow's `train` needs besides the samples


class _Stopped(Exception):
    """The trainer side ended; the rollout thread leaves quietly."""


class RootJob:
    """The root role's trainer for one job. Subclasses write `produce(step)`; `train` is the same for
    every workflow: `adv` → `update` → `checkpoint` → ledger, policy version, progress."""

    max_batch = 256  # rows the root's engine decodes together (every rollout of a step at once)

    def __init__(
        self,
        store: Store,
        job_id: str,
        job: JobSpec,
        *,
        callees: Mapping[str, CalleeClient],
        placement: Placement,
    ) -> None:
        """`callees`: a client per callee role with a trainer of its own (`job.callee_trainers`); a
        role hosted in this trainer (`job.hosted_callees`) joins with `host` before `run`."""
        self.store, self.job_id, self.job, self.cfg = store, job_id, job, job.cfg
        self.root, self.remote = job.root, job.callee_loops  # the callee roles whose ledgers it waits on
        missing = [r for r in job.callee_trainers if r not in callees]
        if missing:
            raise PartnerError(f"no service configured for role(s) {', '.join(missing)} (MGRPO_ROLE_URLS)")
        self.callees: dict[str, Callee] = dict(callees)
        self.placement = placement
        last = store.ledger.last_step(job_id, self.root)
        self.model = RoleModel(
            job, self.root, placement=placement, job_id=job_id, last_step=last, max_batch=self.max_batch
        )
        # roles on one base: a role in this trainer with an adapter of its own on the root's base
        self.heads = {
            r: RoleModel(job, r, placement=placement, job_id=job_id, last_step=last, base_of=self.model)
            for r in job.root_roles
            if job.own_adapter(r)
        }
        self.start_step = self.model.start_step
        self.last_checkpoint: str | None = None  # the newest checkpoint this trainer wrote (trackers)
        self.trackers = open_trackers(
            job.cfg, job_id, self.root, placement=placement, start_step=self.start_step, report=self.event
        )
        for m in (self.model, *self.heads.values()):
            if m.start_note:
                self.event(m.start_note)
        store.policies.publish(
            PolicyVersion(job_id=job_id, role=self.root, version=self.model.version, step=last)
        )

    @property
    def version(self) -> int:
        return self.model.version

    def host(self, role: str, callee: Callee) -> None:
        """A callee role hosted in this trainer (its job built on this root's base): delegations to
        it call `callee` directly."""
        if role not in self.job.hosted_callees:
            raise ValueError(f"the {role} role is not hosted in the {self.root} trainer of this job")
        self.callees[role] = callee

    @functools.cached_property
    def rollout_pool(self) -> ThreadPoolExecutor:
        """The threads a step's episodes run on, kept from step to step. A pool per step started its
        64 threads one by one while the pipelined update held the interpreter lock: the step's first
        engine calls then reached the server over 60-100 ms instead of 30-50 (docs/results.md)."""
        return ThreadPoolExecutor(max_workers=ROLLOUT_THREADS, thread_name_prefix="rollout")

    def run(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
        self._applied = self.start_step - 1  # the root trainer's last applied step
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._last_done = time.perf_counter()
        try:
            if self.cfg.max_staleness == 0:
                for step in range(self.start_step, self.cfg.steps):
                    self._check_cancel()
                    self._done(self.train(self.produce_once(step)), on_step)
            else:
                self._run_pipelined(on_step)
        finally:
            if "rollout_pool" in self.__dict__:
                self.rollout_pool.shutdown(wait=False, cancel_futures=True)
        self.finish()

    def _run_pipelined(self, on_step: Callable[[int, dict[str, float]], None] | None) -> None:
        handoff: queue.Queue[Rollouts | BaseException] = queue.Queue()

        def produce_all() -> None:
            try:
                for step in range(self.start_step, self.cfg.steps):
                    self._check_cancel()
                    handoff.put(self.produce_once(step))
            except _Stopped:
                return
            except BaseException as exc:  # the trainer side raises it
                handoff.put(exc)

        rollouts = threading.Thread(target=produce_all, name="root-rollouts", daemon=True)
        rollouts.start()
        try:
            for _ in range(self.start_step, self.cfg.steps):
                item = handoff.get()
                if isinstance(item, BaseException):
                    raise item
                self._done(self.train(item), on_step)
        finally:
            self._stop.set()
            with self._cond:
                self._cond.notify_all()
            # a rollout in flight ends in seconds; the thread is a daemon either way
            rollouts.join(timeout=min(self.cfg.partner_timeout_s, 30.0))

    def _done(
        self,
        rollouts_values: tuple[int, dict[str, float]],
        on_step: Callable[[int, dict[str, float]], None] | None,
    ) -> None:
        step, values = rollouts_values
        with self._cond:
            self._applied = step
            self._cond.notify_all()
        if on_step:
            on_step(step, values)

    def _check_cancel(self) -> None:
        if self._stop.is_set():
            raise _Stopped()
        if self.store.jobs.cancel_requested(self.job_id):
            raise JobCancelled()

    def wait_bound(self, step: int, timer: PhaseTimer) -> None:
        """Before rolling out `step`: every trainer applied step − 1 − max_staleness (the root's own
        trainer: in-process; the callee roles': by their ledgers)."""
        bound = step - 1 - self.cfg.max_staleness
        with timer("wait_trainer"), self._cond:
            while self._applied < bound:
                if self._stop.is_set():
                    raise _Stopped()
                self._cond.wait(0.1)
        if not self.job.trains_callees:
            return  # main_only: the callees never update
        with timer("wait_partner"):
            wait_applied(
                self.store,
                self.job_id,
                self.remote,
                bound,
                timeout_s=self.cfg.partner_timeout_s,
                stop=self._stop,
            )
        if self._stop.is_set():
            raise _Stopped()

    def account_trained(self, step: int, n_samples: int, updates: list[dict[str, float]]) -> None:
        """The root's own queue for `step`: what its updates (the root's, and those of the roles on
        its base) trained and what they dropped as stale."""
        dropped = sum(int(m.get("stale_dropped", 0)) for m in updates)
        self.store.accounts.record(self.job_id, self.root, step, trained=n_samples - dropped, dropped=dropped)

    def finish_values(self, rollouts: Rollouts) -> dict[str, float]:
        """The step's timings and its period (seconds since the previous finished step)."""
        now = time.perf_counter()
        period, self._last_done = now - self._last_done, now
        return {**rollouts.timer.values(), "timing/period": period}

    def produce(self, step: int) -> Rollouts:
        """Roll the step out, score it, and `publish_produced` it."""
        raise NotImplementedError

    def publish_produced(
        self,
        step: int,
        messages: Sequence[tuple[str, StepMessage]],
        samples: list[Sample],
        values: dict[str, float],
        produced: dict[str, int],
    ) -> None:
        """Hand every callee role its share of the step (`messages`) and keep the root's own samples
        beside them, atomically (`store.root_steps`); then account what each queue was handed."""
        kept = [
            (
                RootSampleMeta(
                    job_id=self.job_id,
                    step=step,
                    policy_version=s.policy_version,
                    index=i,
                    role=s.role,
                    group=s.group,
                    reward=None if math.isnan(s.reward) else s.reward,
                    prompt_len=s.transcript.prompt_len,
                    episode_id=s.episode_id,
                    n_tokens=0,
                ),
                EpisodeArrays.of(s.transcript.token_ids, s.transcript.logp, s.transcript.mask),
            )
            for i, s in enumerate(samples)
        ]
        self.store.root_steps.publish(self.job_id, step, messages, kept, values, produced)
        self._account_produced(step, len(samples), produced)

    def _account_produced(self, step: int, n_own: int, produced: dict[str, int]) -> None:
        for role, n in produced.items():  # a callee's first message's count stands
            self.store.accounts.record(self.job_id, role, step, first_wins=True, produced=n)
        self.store.accounts.record(self.job_id, self.root, step, produced=n_own)

    def produce_once(self, step: int) -> Rollouts:
        """The step as this root already published it before a restart (trained on as it was), else a
        new roll."""
        kept = self.store.root_steps.get(self.job_id, step)
        if kept is None:
            return self.produce(step)
        samples = [
            Sample(
                m.role,
                m.group,
                Transcript(a.token_ids.tolist(), a.logp.tolist(), a.loss_mask.tolist(), m.prompt_len),
                math.nan if m.reward is None else m.reward,
                policy_version=m.policy_version,
                episode_id=m.episode_id,
            )
            for m, a in kept.samples
        ]
        self._account_produced(step, len(samples), kept.produced)
        log.info(
            "job %s: step %d was published before a restart; training on it as it was", self.job_id, step
        )
        timer = PhaseTimer(job_id=self.job_id, step=step, role=self.root)
        return Rollouts(step, samples, timer, {**kept.values, f"{self.root}/step_reused": 1.0})

    def train(self, rollouts: Rollouts) -> tuple[int, dict[str, float]]:
        """Train on one produced step; returns (step, the step's metrics)."""
        step, samples, timer, r = rollouts.step, rollouts.samples, rollouts.timer, self.root
        with timer("adv"):
            adv = assign_advantages(samples)
        own = {h: [s for s in samples if s.role == h] for h in self.heads}  # roles on the root's base
        with timer("update"):
            metrics = self.model.update([s for s in samples if s.role not in own], seed=step)
            heads = {h: m.update(own[h], seed=step) for h, m in self.heads.items()}
        with timer("checkpoint"):
            ckpt = self.model.save(step)
            self.last_checkpoint = str(ckpt.path)
            saved = {h: m.save(step) for h, m in self.heads.items()}
        with timer("exchange_redis"):
            self.account_trained(step, len(samples), [metrics, *heads.values()])
            for h, m in self.heads.items():  # the roles on the root's base: their versions and checkpoints
                self.store.policies.publish(
                    PolicyVersion(
                        job_id=self.job_id,
                        role=h,
                        version=m.version,
                        step=step,
                        checkpoint=m.shown(saved[h].path),
                    )
                )
            done = PolicyVersion(
                job_id=self.job_id,
                role=r,
                version=self.version,
                step=step,
                checkpoint=self.model.shown(ckpt.path),
            )
            self.store.commit_step(done, roles=self.job.ledger_roles)
        values = {
            **{f"{r}/{k}": v for k, v in metrics.items()},
            **{f"{h}/{k}": v for h, m in heads.items() for k, v in m.items()},
            **rollouts.values,
            **{f"{r}/{k}": v for k, v in advantage_stats(adv).items()},
            f"{r}/version": float(self.version),
            **self.finish_values(rollouts),
        }
        self.emit(MetricsEvent(job_id=self.job_id, step=step, role=r, values=values))
        return step, values

    def emit(self, event: MetricsEvent) -> None:
        """A metrics record or event to the job's stream; a record also to the job's trackers (another
        role's record, the held-out evaluation's, with its role as the prefix of its keys)."""
        publish_metrics(self.store.client, event)
        if event.kind == "metrics":
            own = event.role == self.root
            self.trackers.log(
                event.step, {k if own else f"{event.role}/{k}": v for k, v in event.values.items()}
            )

    def event(self, message: str) -> None:
        """A line in the job's events and this service's log (a rejected reward, a tracker's news)."""
        log.info("job %s: %s", self.job_id, message)
        publish_event(self.store.client, self.job_id, self.root, message)

    def close(self) -> None:
        self.trackers.close(checkpoint=self.last_checkpoint)
        for m in self.heads.values():
            m.close()
        self.model.close()

    def finish(self) -> None:
        """Return once every callee role applied the last step (the job then succeeds)."""
        wait_applied(
            self.store, self.job_id, self.remote, self.cfg.steps - 1, timeout_s=self.cfg.partner_timeout_s
        )
