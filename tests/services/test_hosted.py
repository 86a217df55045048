"""`services.hosted`: a hosted callee job that raises fails the job with its reason, as a trainer
service's worker would (the root's waits then end, `planner_trainer.partners`); a cancel does not.
The callee job is a stand-in that only raises: the real one runs in `test_hosted_e2e.py`."""

from __future__ import annotations

import threading

from services.hosted import HostedCallee
from shared_store import Store
from shared_store.jobs import JobCancelled


class Raising:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def train_steps(self, stop: threading.Event | None = None) -> bool:
        raise self.exc

    def close(self) -> None:
        pass


def hosted(store: Store, job_id: str, exc: BaseException) -> HostedCallee:
    h = object.__new__(HostedCallee)  # its fields, not its build (that loads the root's base)
    h.store, h.job_id, h.role, h.host, h.callee = store, job_id, "subagent", "planner", Raising(exc)
    h.stop = threading.Event()
    h.thread = threading.Thread(target=h._train)
    return h


def test_a_hosted_job_that_raises_fails_the_job_naming_it_and_a_cancel_does_not(redis_url):
    store = Store.connect(redis_url)
    for exc, status in ((RuntimeError("out of memory"), "failed"), (JobCancelled(), "running")):
        record, _ = store.jobs.create({"steps": 2}, None, roles=("planner",))
        store.jobs.transition(record.job_id, "running")
        h = hosted(store, record.job_id, exc)
        h.thread.start()
        h.close()
        after = store.jobs.get(record.job_id)
        assert after.status == status, after
        if status == "failed":
            assert (
                after.reason
                == "subagent trainer (hosted in the planner trainer): RuntimeError: out of memory"
            )
