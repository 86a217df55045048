"""What every root-role trainer shares: the step loop over the job's steps (a cancel stops it
between steps) and the wait for the callee roles to finish the last step."""

from __future__ import annotations

from collections.abc import Callable

from mgrpo.config import JobConfig
from mgrpo.role_model import RoleModel
from shared_store import Store
from shared_store.jobs import JobCancelled


class RootJob:
    store: Store
    job_id: str
    cfg: JobConfig
    m: RoleModel
    start_step: int

    @property
    def version(self) -> int:
        return self.m.version

    def run(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
        for step in range(self.start_step, self.cfg.steps):
            if self.store.jobs.cancel_requested(self.job_id):
                raise JobCancelled()
            values = self.step(step)
            if on_step:
                on_step(step, values)
        self.finish()

    def step(self, step: int) -> dict[str, float]:
        raise NotImplementedError

    def finish(self) -> None:
        """Return once every callee role applied the last step (the job then succeeds)."""
        raise NotImplementedError
