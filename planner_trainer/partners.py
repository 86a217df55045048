"""The root trainer's waits on the callee roles' trainers, by their ledgers: before step s, every
callee role has applied step s − 1 − max_staleness; the job is done when every one applied the last
step. A wait ends with `PartnerError` naming the role after the job's `partner_timeout_s`, or with
`JobCancelled` within 50 ms of a cancel or of another trainer failing the job."""

from __future__ import annotations

import threading
import time

from planner_trainer.delegate import PartnerError
from shared_store import Store
from shared_store.jobs import JobCancelled


def wait_applied(
    store: Store,
    job_id: str,
    roles: tuple[str, ...],
    step: int,
    *,
    timeout_s: float,
    stop: threading.Event | None = None,
) -> None:
    """Block until every role in `roles` has `step` in the ledger (nothing to wait for when step < 0);
    returns early when `stop` is set."""
    if step < 0:
        return
    deadline = time.monotonic() + timeout_s
    for role in roles:
        while not store.ledger.is_applied(job_id, role, step):
            if time.monotonic() > deadline:
                raise PartnerError(
                    f"the {role} trainer did not finish step {step} within {timeout_s:.0f} s; is the {role} service running?"
                )
            if store.jobs.ended(job_id):  # a cancel, or a partner failed it
                raise JobCancelled()
            if stop is not None and stop.wait(0.02):
                return
            time.sleep(0 if stop is not None else 0.05)
