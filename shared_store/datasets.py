"""The dataset registry: uploaded datasets in the shared store, where every trainer can read them.

A dataset is its canonical JSONL (`mgrpo.datasets.canonical`), zlib-compressed under
`keys.dataset(id)`, and a `DatasetInfo` in `keys.datasets_index()`. The id is the content's hash, so
an upload of the same rows is the same dataset; both keys are written in one MULTI, so a dataset is
either wholly there or not at all.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import cast

import redis

from shared_store import keys
from shared_store.schemas import DatasetInfo, decode, encode


class DatasetNotFoundError(KeyError):
    pass


@dataclass
class DatasetRegistry:
    client: redis.Redis

    def put(
        self, dataset_id: str, canonical_jsonl: bytes, *, name: str, rows: int, splits: dict[str, int]
    ) -> tuple[DatasetInfo, bool]:
        """Store a dataset; returns (its info, whether it was new). An existing id is left as it is."""
        if (existing := self.info(dataset_id)) is not None:
            return existing, False
        info = DatasetInfo(
            dataset_id=dataset_id,
            name=name,
            rows=rows,
            splits=splits,
            bytes=len(canonical_jsonl),
            created_at=time.time(),
        )
        pipe = self.client.pipeline(transaction=True)
        pipe.set(keys.dataset(dataset_id), zlib.compress(canonical_jsonl, 6))
        pipe.hset(keys.datasets_index(), dataset_id, encode(info))
        pipe.execute()
        return info, True

    def info(self, dataset_id: str) -> DatasetInfo | None:
        raw = self.client.hget(keys.datasets_index(), keys.check_id("dataset id", dataset_id))
        return None if raw is None else decode(DatasetInfo, cast(bytes, raw))

    def list(self) -> list[DatasetInfo]:
        raw = cast(dict[bytes, bytes], self.client.hgetall(keys.datasets_index()))
        return sorted((decode(DatasetInfo, v) for v in raw.values()), key=lambda d: d.created_at)

    def content(self, dataset_id: str) -> bytes:
        """The canonical JSONL of a dataset; DatasetNotFoundError if there is none."""
        blob = self.client.get(keys.dataset(dataset_id))
        if blob is None:
            raise DatasetNotFoundError(dataset_id)
        return zlib.decompress(cast(bytes, blob))
