"""shared_store: the Redis protocol between the trainer services (no torch).

Keys (`keys`), wire schemas (`schemas`), binary episode arrays (`codec`), connections, the job
registry, streams with consumer groups, the step ledger, the episode store, policy versions and
garbage collection. See docs/store.md for every key and stream.
"""

from shared_store.codec import EpisodeArrays
from shared_store.store import Store

__all__ = ["EpisodeArrays", "Store"]
