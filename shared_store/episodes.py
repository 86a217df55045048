"""The episode store: one sub-agent episode = a hash of metadata JSON + three binary arrays.

Written once per (job, step, query, rollout, call); fetched many at a time with one pipeline; each
step's episode ids are indexed in a set so a whole step is deleted once both trainers moved past it
(`delete_step`). Every key also carries a TTL as a safety net against abandoned jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis

from shared_store import keys
from shared_store._text import as_str
from shared_store.codec import EpisodeArrays, decode_arrays, encode_arrays
from shared_store.schemas import EpisodeMeta, PayloadError, decode, encode

EPISODE_TTL_S = 2 * 24 * 3600


class EpisodeNotFoundError(KeyError):
    def __str__(self) -> str:
        return f"episodes not in the store (expired or never written): {self.args[0]}"


class EpisodeStore:
    def __init__(self, client: redis.Redis, *, ttl_s: int = EPISODE_TTL_S) -> None:
        self.r = client
        self.ttl_s = ttl_s

    def put(self, meta: EpisodeMeta, arrays: EpisodeArrays) -> EpisodeMeta:
        """Write one episode atomically; returns the metadata with n_tokens and checksum filled in."""
        fields, crc = encode_arrays(arrays)
        meta = meta.model_copy(update={"n_tokens": len(arrays), "checksum": crc})
        key = keys.episode(meta.job_id, meta.episode_id)
        index = keys.step_episodes(meta.job_id, meta.step)
        mapping: dict[Any, Any] = {"meta": encode(meta), **fields}
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(key, mapping=mapping)
        pipe.expire(key, self.ttl_s)
        pipe.sadd(index, meta.episode_id)
        pipe.expire(index, self.ttl_s)
        pipe.execute()
        return meta

    def get_many(self, job_id: str, episode_ids: Sequence[str]) -> list[tuple[EpisodeMeta, EpisodeArrays]]:
        """Fetch episodes in the given order (duplicates allowed) with one pipelined round trip."""
        unique = list(dict.fromkeys(episode_ids))
        pipe = self.r.pipeline(transaction=False)
        for eid in unique:
            pipe.hgetall(keys.episode(job_id, eid))
        replies = cast(list[dict[bytes, bytes]], pipe.execute())
        missing = [eid for eid, h in zip(unique, replies, strict=True) if not h]
        if missing:
            raise EpisodeNotFoundError(missing[:10])
        decoded = {eid: self._decode(eid, h) for eid, h in zip(unique, replies, strict=True)}
        return [decoded[eid] for eid in episode_ids]

    @staticmethod
    def _decode(eid: str, h: dict[bytes, bytes]) -> tuple[EpisodeMeta, EpisodeArrays]:
        if b"meta" not in h:
            raise PayloadError(f"episode {eid}: metadata field is missing")
        meta = decode(EpisodeMeta, h[b"meta"])
        fields = {as_str(k): v for k, v in h.items() if k != b"meta"}
        return meta, decode_arrays(fields, meta.n_tokens, meta.checksum, f"episode {eid}")

    def step_ids(self, job_id: str, step: int) -> list[str]:
        return sorted(as_str(x) for x in cast(set[bytes], self.r.smembers(keys.step_episodes(job_id, step))))

    def delete_step(self, job_id: str, step: int) -> int:
        """Delete every episode of one step and its index; returns how many episodes went."""
        ids = self.step_ids(job_id, step)
        pipe = self.r.pipeline(transaction=True)
        for eid in ids:
            pipe.delete(keys.episode(job_id, eid))
        pipe.delete(keys.step_episodes(job_id, step))
        pipe.execute()
        return len(ids)
