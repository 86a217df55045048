"""User datasets: JSONL or Parquet rows of a query, its reference answer, a split and metadata.

One row (JSONL: one JSON object a line; Parquet: one row, the same column names):

    {"query": "Where was Kir Naibram born?", "answer": "Lotham", "split": "train", "metadata": {...}}

`query` (alias `prompt`) and `answer` are required non-empty strings; `split` defaults to "train";
`id` (a string) and `metadata` (a JSON object) are optional. Parsing validates every row and raises
`DatasetError` naming the first bad row and field. A parsed dataset has one canonical form (JSONL,
sorted keys, split filled in) whose hash is its id (`ds-<16 hex>`): the same rows uploaded twice are
one dataset. No torch, no Redis: the controller, the trainers and the CLI share this module.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ID_PREFIX = "ds-"
PARQUET_MAGIC = b"PAR1"
MAX_QUERY_CHARS = 8000
MAX_ANSWER_CHARS = 2000
MAX_METADATA_DEPTH = 32  # how deep a row's metadata may nest (a deeper one is refused, not recursed into)


class DatasetError(ValueError):
    """A dataset that cannot be used, with what to fix."""


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    answer: str = Field(min_length=1, max_length=MAX_ANSWER_CHARS)
    split: str = Field("train", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    id: str | None = Field(None, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("query", "answer")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v

    @field_validator("metadata", mode="before")
    @classmethod
    def _shallow(cls, v: Any) -> Any:
        if nesting(v) > MAX_METADATA_DEPTH:
            raise ValueError(f"nests more than {MAX_METADATA_DEPTH} levels deep; flatten it")
        return v


def nesting(value: Any) -> int:
    """How many levels of lists and objects `value` nests (0 for a scalar), without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, depth + 1)
            if depth + 1 <= MAX_METADATA_DEPTH:  # deeper is refused anyway: stop counting there
                todo += [(x, depth + 1) for x in (v.values() if isinstance(v, dict) else v)]
    return deepest


def _row(i: int, obj: Any) -> Row:
    if not isinstance(obj, dict):
        raise DatasetError(
            f"row {i}: expected a JSON object with 'query' and 'answer', got {type(obj).__name__}"
        )
    if "prompt" in obj and "query" not in obj:  # the other common name of the field
        obj = {**{k: v for k, v in obj.items() if k != "prompt"}, "query": obj["prompt"]}
    try:
        return Row.model_validate(obj)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "row"
        raise DatasetError(f"row {i}: field {field!r}: {err['msg']}") from None


def parse(data: bytes) -> list[Row]:
    """Rows of a JSONL or Parquet file (detected by Parquet's magic bytes); `DatasetError` otherwise."""
    if not data.strip():
        raise DatasetError("the file is empty: give at least one row with 'query' and 'answer'")
    if data[:4] == PARQUET_MAGIC:
        return _parse_parquet(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"the file is neither UTF-8 JSONL nor Parquet (byte {exc.start} is not UTF-8)"
        ) from None
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"row {i}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise DatasetError(
                f"row {i}: nests too deeply to read; at most {MAX_METADATA_DEPTH} levels"
            ) from None
        rows.append(_row(i, obj))
    if not rows:
        raise DatasetError("the file has no rows: give at least one row with 'query' and 'answer'")
    return rows


def _parse_parquet(data: bytes) -> list[Row]:
    import pyarrow.parquet as pq  # a heavy import, only for Parquet uploads

    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise DatasetError(f"the file starts like Parquet but cannot be read: {exc}") from None
    rows = [_row(i, obj) for i, obj in enumerate(table.to_pylist(), 1)]
    if not rows:
        raise DatasetError("the Parquet file has no rows")
    return rows


def canonical(rows: Sequence[Row]) -> bytes:
    """The one JSONL form of these rows (sorted keys, defaults filled in): what is stored and hashed."""
    lines = (json.dumps(r.model_dump(exclude_none=True), sort_keys=True, ensure_ascii=False) for r in rows)
    return ("\n".join(lines) + "\n").encode()


def dataset_id(rows: Sequence[Row]) -> str:
    return blob_id(canonical(rows))


def blob_id(blob: bytes) -> str:
    """The id of a dataset whose canonical form is `blob`."""
    return ID_PREFIX + hashlib.sha256(blob).hexdigest()[:16]


def splits(rows: Sequence[Row]) -> dict[str, int]:
    return dict(sorted(Counter(r.split for r in rows).items()))


def is_uri(source: str) -> bool:
    return "://" in source


def read_uri(uri: str) -> list[Row]:
    """Rows of a dataset on shared storage: `file:///path` here, `s3://…` and other fsspec protocols
    when fsspec and the protocol's package (e.g. s3fs) are installed."""
    if uri.startswith("file://"):
        path = Path(uri[len("file://") :])
        if not path.is_file():
            raise DatasetError(f"{uri}: no such file (a file:// dataset must be readable by every trainer)")
        return parse(path.read_bytes())
    try:
        import fsspec  # optional: only for remote dataset URIs
    except ImportError:
        raise DatasetError(
            f"{uri}: install fsspec (and the protocol's package, e.g. s3fs) to read it"
        ) from None
    try:
        with fsspec.open(uri, "rb") as f:
            return parse(f.read())
    except DatasetError:
        raise
    except Exception as exc:  # fsspec backends raise their own types
        raise DatasetError(f"{uri}: cannot read it ({type(exc).__name__}: {exc})") from None


def rows_of(source: str, stored: Callable[[str], bytes]) -> list[Row]:
    """A job's `dataset.source`: an uploaded id (its content from `stored`, the shared store's
    `datasets.content`) or a URI."""
    return read_uri(source) if is_uri(source) else parse(stored(source))


def check_splits(rows: Sequence[Row], train_split: str, eval_split: str | None) -> None:
    have = splits(rows)
    for field, split in (("train_split", train_split), ("eval_split", eval_split)):
        if split is not None and split not in have:
            raise DatasetError(
                f"dataset.{field}: the dataset has no split {split!r}; its splits are "
                + ", ".join(f"{k} ({n} rows)" for k, n in have.items())
                + ("" if field == "train_split" else "; set eval_split: null to skip evaluation")
            )
