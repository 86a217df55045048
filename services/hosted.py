"""Callee roles hosted in the root's trainer (`JobSpec.hosted_callees`): deep research's sub-agent
with a LoRA adapter of its own on the planner's frozen base, in the planner's process.

Each hosted role runs the workflow's own callee job (`Workflow.callee_job`) built on the root's base
(`RoleModel(base_of=…)`), so nothing of M-GRPO changes: the root's delegations call it directly
instead of over HTTP and it records each episode in Redis as its service would; it trains on its
intake stream (the root's per-query statistics), marks its ledger and publishes its policy in a
thread of its own, which the root waits for by the ledger as it waits for a remote trainer. A hosted
job that fails fails the job with its reason (the root's waits then end); a cancel ends it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from mgrpo.agents.agents import Delegation
from mgrpo.workflows import JobSpec
from planner_trainer.root import RootJob
from shared_store import Store
from shared_store.jobs import JobCancelled, JobConflictError
from subagent_trainer.job import CalleeJob

log = logging.getLogger("mgrpo.hosted")


class HostedCallee:
    """One callee role's job in the root's trainer: what its delegations call, and its training thread."""

    def __init__(self, store: Store, job_id: str, job: JobSpec, role: str, root: RootJob) -> None:
        cls: type[CalleeJob] = job.workflow.load("callee_job")
        self.store, self.job_id, self.role, self.host = store, job_id, role, root.root
        self.callee = cls(store, job_id, job, role, placement=root.placement, base_of=root.model)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._train, name=f"hosted-{role}", daemon=True)

    def episode(self, body: dict[str, Any]) -> Delegation:
        """One delegation, run and recorded as the role's service would (`POST /v1/episodes`)."""
        meta, store_s = self.callee.run_episode(
            body["step"], body["query_id"], body["rollout"], body["call"], body["subtask"]
        )
        return Delegation(body["subtask"], meta.result, meta.episode_id, store_s, 0.0, self.role)

    def _train(self) -> None:
        try:
            self.callee.train_steps(self.stop)
        except JobCancelled:
            return
        except Exception as exc:  # the job fails with the reason, as a trainer service's would
            log.exception("job %s failed in the %s trainer (hosted by %s)", self.job_id, self.role, self.host)
            reason = f"{self.role} trainer (hosted in the {self.host} trainer): {type(exc).__name__}: {exc}"
            with contextlib.suppress(JobConflictError):  # already ended elsewhere
                self.store.jobs.transition(self.job_id, "failed", reason)

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        self.callee.close()


@contextlib.contextmanager
def hosted_callees(store: Store, job_id: str, job: JobSpec, root: RootJob) -> Iterator[list[HostedCallee]]:
    """Build the job's hosted callee roles on `root`'s base, hand them to `root` and train them while
    the block runs; stopped and closed when it ends."""
    hosted: list[HostedCallee] = []
    try:
        for role in job.hosted_callees:
            hosted.append(HostedCallee(store, job_id, job, role, root))
            root.host(role, hosted[-1])
        for h in hosted:
            h.thread.start()
        yield hosted
    finally:
        for h in hosted:
            h.close()
