"""`Store`: one object per process holding the client and every part of the protocol."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from shared_store.accounts import SampleAccounts
from shared_store.capabilities import Capabilities
from shared_store.connection import connect
from shared_store.datasets import DatasetRegistry
from shared_store.episodes import EpisodeStore
from shared_store.jobs import JOB_RETENTION_S, JobRegistry
from shared_store.ledger import StepLedger
from shared_store.policy import PolicyRegistry, Progress
from shared_store.presence import Presence
from shared_store.root_steps import RootSteps
from shared_store.schemas import LedgerEntry, PolicyVersion
from shared_store.session_traces import SessionTraces


@dataclass
class Store:
    client: redis.Redis
    job_retention_s: float = JOB_RETENTION_S  # how long a finished job's keys stay
    jobs: JobRegistry = field(init=False)
    episodes: EpisodeStore = field(init=False)
    ledger: StepLedger = field(init=False)
    policies: PolicyRegistry = field(init=False)
    progress: Progress = field(init=False)
    accounts: SampleAccounts = field(init=False)
    datasets: DatasetRegistry = field(init=False)
    capabilities: Capabilities = field(init=False)
    root_steps: RootSteps = field(init=False)
    presence: Presence = field(init=False)
    session_traces: SessionTraces = field(init=False)

    def __post_init__(self) -> None:
        self.jobs = JobRegistry(self.client, retention_s=self.job_retention_s)
        self.episodes = EpisodeStore(self.client)
        self.ledger = StepLedger(self.client)
        self.policies = PolicyRegistry(self.client)
        self.progress = Progress(self.client, self.episodes)
        self.accounts = SampleAccounts(self.client)
        self.datasets = DatasetRegistry(self.client)
        self.capabilities = Capabilities(self.client)
        self.root_steps = RootSteps(self.client)
        self.presence = Presence(self.client)
        self.session_traces = SessionTraces(self.client)

    def commit_step(self, version: PolicyVersion, *, roles: tuple[str, ...], ledger: bool = True) -> None:
        """A role finished a step: its ledger mark (unless its stream consumer marks it), its new policy
        version (and checkpoint record), its progress, and garbage collection of the steps every one
        of the job's `roles` finished."""
        if ledger:
            self.ledger.mark(
                LedgerEntry(
                    job_id=version.job_id,
                    role=version.role,
                    step=version.step,
                    policy_version=version.version,
                )
            )
        self.policies.publish(version)
        self.progress.advance(version.job_id, version.role, version.step)
        self.progress.collect(version.job_id, keep_steps=1, roles=roles)

    @classmethod
    def connect(
        cls,
        url: str | None = None,
        *,
        wait_s: float = 30.0,
        job_retention_s: float = JOB_RETENTION_S,
        retry_timeouts: bool = True,
    ) -> Store:
        """`retry_timeouts` False: a command gives up after one socket timeout (an API's store)."""
        return cls(connect(url, wait_s=wait_s, retry_timeouts=retry_timeouts), job_retention_s)
