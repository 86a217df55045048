"""The episode store: every sub-agent episode of one step lives in one Redis hash.

    keys.step_episodes(job, step)   HASH  episode_id → blob (metadata JSON + three arrays, see codec)

Written once per (job, step, query, rollout, call); a batch of episodes is one HSET, a fetch of many
is one HMGET, and garbage collection of a finished step is one UNLINK. The hash carries a TTL as a
safety net against abandoned jobs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol, cast

import redis

from shared_store import keys
from shared_store._text import as_str
from shared_store.codec import EpisodeArrays, seal, unseal
from shared_store.keys import episode_id
from shared_store.schemas import EpisodeMeta

EPISODE_TTL_S = 2 * 24 * 3600


class ServedCall(Protocol):
    """What `record_call` reads of a served chat completion (`mgrpo.agents.openai_chat.ChatCall`)."""

    token_ids: list[int]
    logp: list[float]
    mask: list[int]
    weights_version: int
    finish_reason: str
    last_user: str
    content: str


class EpisodeNotFoundError(KeyError):
    def __str__(self) -> str:
        return f"episodes not in the store (expired, collected or never written): {self.args[0]}"


class EpisodeStore:
    def __init__(self, client: redis.Redis, *, ttl_s: int = EPISODE_TTL_S) -> None:
        self.r = client
        self.ttl_s = ttl_s

    def put(self, meta: EpisodeMeta, arrays: EpisodeArrays) -> EpisodeMeta:
        """Write one episode; returns the metadata with n_tokens and checksum filled in."""
        return self.put_many([(meta, arrays)])[0]

    def put_many(self, episodes: Sequence[tuple[EpisodeMeta, EpisodeArrays]]) -> list[EpisodeMeta]:
        """Write episodes with one HSET per step (one round trip); returns their completed metadata."""
        out = []
        by_step: dict[tuple[str, int], dict[Any, Any]] = defaultdict(dict)
        for meta, arrays in episodes:
            meta, blob = seal(meta, arrays)
            by_step[(meta.job_id, meta.step)][keys.check_id("episode id", meta.episode_id)] = blob
            out.append(meta)
        pipe = self.r.pipeline(transaction=False)
        for (job_id, step), mapping in by_step.items():
            pipe.hset(keys.step_episodes(job_id, step), mapping=mapping)
            pipe.expire(keys.step_episodes(job_id, step), self.ttl_s)
        pipe.execute()
        return out

    def put_once(self, meta: EpisodeMeta, arrays: EpisodeArrays) -> tuple[EpisodeMeta, bool]:
        """Write an episode unless its id is already recorded (HSETNX): an id is written once. Returns
        the recorded metadata (the earlier one on a replay) and whether this call wrote it."""
        meta, blob = seal(meta, arrays)
        key = keys.step_episodes(meta.job_id, meta.step)
        eid = keys.check_id("episode id", meta.episode_id)
        pipe = self.r.pipeline(transaction=True)
        pipe.hsetnx(key, eid, blob)
        pipe.expire(key, self.ttl_s)
        created, _ = pipe.execute()
        if created:
            return meta, True
        found = self.get_one(meta.job_id, meta.step, eid)
        if found is None:  # collected in between: nothing to replay against
            raise EpisodeNotFoundError([eid])
        return found[0], False

    def record_call(
        self, job_id: str, step: int, query_id: str, rollout: int, call: int, served: ServedCall
    ) -> EpisodeMeta:
        """One served chat completion as an episode of its session (`openai_agents`): written once per
        (step, query, rollout, call); a call cut off at its token budget is not format_ok."""
        arrays = EpisodeArrays.of(served.token_ids, served.logp, served.mask)
        meta = EpisodeMeta(
            job_id=job_id,
            step=step,
            policy_version=served.weights_version,
            episode_id=episode_id(step, query_id, rollout, call),
            query_id=query_id,
            rollout=rollout,
            call=call,
            n_tokens=len(arrays),
            format_ok=served.finish_reason != "length",
            finish_reason=served.finish_reason,
            subtask=served.last_user[:2000],
            result=served.content[:2000],
        )
        return self.put_once(meta, arrays)[0]

    def get_one(self, job_id: str, step: int, episode_id: str) -> tuple[EpisodeMeta, EpisodeArrays] | None:
        blob = cast(bytes | None, self.r.hget(keys.step_episodes(job_id, step), episode_id))
        return None if blob is None else self._decode(episode_id, blob)

    def get_many(
        self, job_id: str, step: int, episode_ids: Sequence[str]
    ) -> list[tuple[EpisodeMeta, EpisodeArrays]]:
        """Fetch episodes of one step in the given order (duplicates allowed) with one HMGET."""
        unique = list(dict.fromkeys(episode_ids))
        if not unique:
            return []
        blobs = cast(list[bytes | None], self.r.hmget(keys.step_episodes(job_id, step), unique))
        missing = [eid for eid, blob in zip(unique, blobs, strict=True) if blob is None]
        if missing:
            raise EpisodeNotFoundError(missing[:10])
        decoded = {eid: self._decode(eid, cast(bytes, b)) for eid, b in zip(unique, blobs, strict=True)}
        return [decoded[eid] for eid in episode_ids]

    @staticmethod
    def _decode(eid: str, blob: bytes) -> tuple[EpisodeMeta, EpisodeArrays]:
        return unseal(EpisodeMeta, blob, f"episode {eid}")

    def step_ids(self, job_id: str, step: int) -> list[str]:
        return sorted(as_str(x) for x in cast(list[bytes], self.r.hkeys(keys.step_episodes(job_id, step))))

    def delete_step(self, job_id: str, step: int) -> int:
        """Delete every episode of one step (UNLINK: freed in the background); returns how many went."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hlen(keys.step_episodes(job_id, step))
        pipe.unlink(keys.step_episodes(job_id, step))
        count, _ = pipe.execute()
        return int(count)
