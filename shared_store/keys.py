"""Every Redis key of the protocol, built in this one module (a test fails on a literal elsewhere).

Per-job keys: `mgrpo:v1:{<job_id>}:<noun>[:<id>]`. The braces are a Redis Cluster hash tag, so all of
one job's keys live in one slot and MULTI / Lua work on them. Global keys (the job index and the
dispatch streams) have no tag. `docs/store.md` lists every key with its type, writer, reader and
trim/TTL rule.
"""

from __future__ import annotations

import re
from typing import Literal

PREFIX = "mgrpo:v1"
Role = Literal["planner", "subagent"]
ROLES: tuple[Role, ...] = ("planner", "subagent")
# Stream names of one job (the `<noun>` of `mgrpo:v1:{job}:stream:<noun>`).
StreamName = Literal["planner_stats", "subagent_stats", "manifests", "events"]
STREAMS: tuple[StreamName, ...] = ("planner_stats", "subagent_stats", "manifests", "events")
# The per-step ones (a message per step, consumed by the other role; GC trims them); `events` is the
# job's metrics log and stays.
STEP_STREAMS: tuple[StreamName, ...] = ("planner_stats", "subagent_stats", "manifests")

_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


def check_id(kind: str, value: str) -> str:
    """Ids become parts of keys: letters, digits, '_', '.', '-' only, 1-128 characters."""
    if not isinstance(value, str) or not _ID.match(value):
        raise ValueError(f"{kind} {value!r} is invalid: use 1-128 letters, digits, '_', '.' or '-'")
    return value


def _job(job_id: str) -> str:
    return f"{PREFIX}:{{{check_id('job id', job_id)}}}"


# ---- global -----------------------------------------------------------------------------------
def jobs_index() -> str:
    """ZSET job_id → created_at (unix seconds)."""
    return f"{PREFIX}:jobs"


def dispatch(role: Role) -> str:
    """STREAM of JobDispatch messages for one trainer role."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return f"{PREFIX}:dispatch:{role}"


# ---- one job ----------------------------------------------------------------------------------
def job(job_id: str) -> str:
    """HASH: the job record (status, config, reason, cancel flag, timestamps)."""
    return f"{_job(job_id)}:job"


def stream(job_id: str, name: StreamName) -> str:
    """STREAM of one job: planner_stats, subagent_stats, manifests or events."""
    if name not in STREAMS:
        raise ValueError(f"stream must be one of {STREAMS}, got {name!r}")
    return f"{_job(job_id)}:stream:{name}"


def step_record(job_id: str, name: StreamName, step: int) -> str:
    """STRING: the message of `name` for one step, for random access beside the stream entry."""
    return f"{_job(job_id)}:{name}:{int(step)}"


def step_episodes(job_id: str, step: int) -> str:
    """HASH episode_id → episode blob: every sub-agent episode of one step (GC deletes it whole)."""
    return f"{_job(job_id)}:episodes:{int(step)}"


def ledger(job_id: str) -> str:
    """HASH `<role>:<step>` → LedgerEntry JSON: which steps each trainer has applied."""
    return f"{_job(job_id)}:ledger"


def ledger_log(job_id: str) -> str:
    """LIST of every successful ledger mark, in order (the audit trail of 'exactly once')."""
    return f"{_job(job_id)}:ledger_log"


def progress(job_id: str) -> str:
    """HASH role → last completed step (drives garbage collection)."""
    return f"{_job(job_id)}:progress"


def policy(job_id: str) -> str:
    """HASH role → PolicyVersion JSON."""
    return f"{_job(job_id)}:policy"


def metrics(job_id: str) -> str:
    """HASH role → latest MetricsEvent JSON of that role."""
    return f"{_job(job_id)}:metrics"


def dead_letter(stream_key: str) -> str:
    """STREAM of entries of `stream_key` that could not be decoded (same hash slot as the stream)."""
    if not stream_key.startswith(PREFIX):
        raise ValueError(f"{stream_key!r} is not a key of this protocol")
    return f"{stream_key}:dead"
