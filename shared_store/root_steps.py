"""A root trainer's produced steps, kept until the step is collected:

    keys.root_step(job, step)   HASH  "values" → the rollout's metrics (JSON), "produced" → what it
                                      handed each callee role (JSON role → episodes), "<i>" → sample
                                      blob (RootSampleMeta JSON + arrays, the episodes' codec)

`publish` writes it in the same MULTI as the step's messages to the callee roles (`planner_stats`,
`batch.<role>`). A root that dies after that MULTI and before its ledger mark finds the step here when
it restarts and trains on these very samples: the callees already hold the messages of this roll, so
rolling the step out again would train the root and its callees on two different rolls (and replay
the first roll's recorded episodes to the second roll's delegations).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import redis

from shared_store import keys
from shared_store.codec import EpisodeArrays, seal, unseal
from shared_store.schemas import RootSampleMeta, StepMessage
from shared_store.streams import STEP_RECORD_TTL_S, stage_step


@dataclass(frozen=True)
class RootStep:
    samples: list[tuple[RootSampleMeta, EpisodeArrays]]
    values: dict[str, float]
    produced: dict[str, int]  # callee role → episodes the step's message handed it


class RootSteps:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def publish(
        self,
        job_id: str,
        step: int,
        messages: Sequence[tuple[keys.StreamName, StepMessage]],
        samples: Sequence[tuple[RootSampleMeta, EpisodeArrays]],
        values: dict[str, float],
        produced: dict[str, int],
    ) -> None:
        """The step's messages and the root's own step, in one MULTI: all or nothing."""
        key = keys.root_step(job_id, step)
        mapping: dict[str, bytes] = {
            "values": json.dumps({k: v for k, v in values.items() if math.isfinite(v)}).encode(),
            "produced": json.dumps(produced).encode(),
        }
        for meta, arrays in samples:
            mapping[str(meta.index)] = seal(meta, arrays)[1]
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
        pipe.expire(key, STEP_RECORD_TTL_S)
        for name, message in messages:
            stage_step(pipe, name, message)
        pipe.execute()

    def get(self, job_id: str, step: int) -> RootStep | None:
        raw = cast(dict[bytes, bytes], self.r.hgetall(keys.root_step(job_id, step)))
        if not raw:
            return None
        values = json.loads(raw.pop(b"values"))
        produced = json.loads(raw.pop(b"produced"))
        samples = [
            unseal(RootSampleMeta, raw[f], f"root sample {f.decode()} of step {step}")
            for f in sorted(raw, key=int)
        ]
        return RootStep(samples, values, produced)
