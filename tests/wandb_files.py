"""Read a W&B offline run's `run-<id>.wandb` file back (what `wandb sync` uploads): the LevelDB-log
framing W&B writes (a 7-byte `:W&B` header, then records in 32 KiB blocks, each chunk with a 7-byte
header: checksum, length, kind), each record one `wandb_internal_pb2.Record`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, whole, pending = 7, [], b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == FULL:
            whole.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            whole.append(pending + chunk)
    out = []
    for raw in whole:
        record = pb.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def history(path: Path) -> dict[str, dict[int, float]]:
    """metric → step → value, from a run file's history records."""
    out: dict[str, dict[int, float]] = {}
    for r in records(path):
        if r.WhichOneof("record_type") != "history":
            continue
        items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        step = int(items.get("_step", r.history.step.num))
        for k, v in items.items():
            if not k.startswith("_"):
                out.setdefault(k, {})[step] = v
    return out


def run_info(path: Path) -> Any:
    """The run record: `display_name`, `run_group`, `job_type`, `project`, `config`."""
    return next(r.run for r in records(path) if r.WhichOneof("record_type") == "run")


def summary(path: Path) -> dict[str, Any]:
    """The run's summary (key → value), from a run file's summary records."""
    out: dict[str, Any] = {}
    for r in records(path):
        if r.WhichOneof("record_type") == "summary":
            for i in r.summary.update:
                out[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
    return out


def finished(folder: Path, runs: int) -> list[Path]:
    """The run files under `folder` once `runs` of them hold their run's end (an `exit` record), else
    []: W&B's own writer process may still be writing a file after `run.finish()` returned."""
    files = sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))
    try:
        done = [f for f in files if any(r.WhichOneof("record_type") == "exit" for r in records(f))]
    except AssertionError:  # not even the header yet
        return []
    return files if len(done) == runs == len(files) else []
