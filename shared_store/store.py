"""`Store`: one object per process holding the client and every part of the protocol."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from shared_store.connection import connect
from shared_store.episodes import EpisodeStore
from shared_store.jobs import JobRegistry
from shared_store.ledger import StepLedger
from shared_store.policy import PolicyRegistry, Progress


@dataclass
class Store:
    client: redis.Redis
    jobs: JobRegistry = field(init=False)
    episodes: EpisodeStore = field(init=False)
    ledger: StepLedger = field(init=False)
    policies: PolicyRegistry = field(init=False)
    progress: Progress = field(init=False)

    def __post_init__(self) -> None:
        self.jobs = JobRegistry(self.client)
        self.episodes = EpisodeStore(self.client)
        self.ledger = StepLedger(self.client)
        self.policies = PolicyRegistry(self.client)
        self.progress = Progress(self.client, self.episodes)

    @classmethod
    def connect(cls, url: str | None = None, *, wait_s: float = 30.0) -> Store:
        return cls(connect(url, wait_s=wait_s))
