"""Every Redis key of the protocol, built in this one module (a test fails on a literal elsewhere).

Per-job keys: `mgrpo:v1:{<job_id>}:<noun>[:<id>]`. The braces are a Redis Cluster hash tag, so all of
one job's keys live in one slot and MULTI / Lua work on them. Global keys (the job index and the
dispatch streams) have no tag. `docs/store.md` lists every key with its type, writer, reader and
trim/TTL rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "mgrpo:v1"
# A role is a name a workflow declares (`planner`, `subagent`, `solver`, `verifier`, …): roles are data.
Role = str
# The roles of a job record written before records kept their roles (deep research's): the only default.
LEGACY_ROLES: tuple[Role, ...] = ("planner", "subagent")
# Stream names of one job (the `<noun>` of `mgrpo:v1:{job}:stream:<noun>`): `planner_stats` (the
# deep-research planner's per-query outcomes, read by its sub-agent trainer), `batch.<role>` (a root
# trainer's scored, grouped episodes of one callee role, read by that role's trainer) and `events`.
StreamName = str
STREAMS: tuple[StreamName, ...] = ("planner_stats", "events")
# The per-step ones (a message per step, consumed by another role; GC trims them); `events` is the
# job's metrics log and stays.
STEP_STREAMS: tuple[StreamName, ...] = ("planner_stats",)
_ROLE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


def check_id(kind: str, value: str) -> str:
    """Ids become parts of keys and folder names: letters, digits, '_', '.', '-' only, 1-128
    characters, not only dots."""
    if not isinstance(value, str) or not _ID.match(value) or not value.strip("."):
        raise ValueError(
            f"{kind} {value[:40] if isinstance(value, str) else value!r} is invalid: use 1-128 letters, digits, '_', '.' or '-', not only dots"
        )
    return value


def check_role(role: str) -> str:
    """Role names become parts of keys and hash fields: a lower-case letter, then [a-z0-9_], ≤ 32."""
    if not isinstance(role, str) or not _ROLE.match(role):
        raise ValueError(f"role {role!r} is invalid: use a lower-case letter then up to 31 of a-z, 0-9, '_'")
    return role


@dataclass(frozen=True)
class EpisodeKey:
    """What an episode id says: (step, query or group, rollout, call)."""

    step: int
    query_id: str
    rollout: int
    call: int


_EPISODE = re.compile(r"^s(\d+)-(.+)-r(\d+)-c(\d+)$")


def episode_id(step: int, query_id: str, rollout: int, call: int) -> str:
    """The id of one callee episode (a field of its step's episode hash): `s<step>-<query>-r<k>-c<n>`."""
    return check_id("episode id", f"s{int(step)}-{query_id}-r{int(rollout)}-c{int(call)}")


def parse_episode_id(eid: str) -> EpisodeKey | None:
    """`episode_id`'s parts back (None for any other string): the one parser of episode ids."""
    m = _EPISODE.match(eid)
    return None if m is None else EpisodeKey(int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)))


def batch_stream(role: str) -> StreamName:
    """The stream name of a callee role's scored batches (`batch.<role>`)."""
    return f"batch.{check_role(role)}"


def step_streams(roles: tuple[str, ...]) -> tuple[StreamName, ...]:
    """Every per-step stream a job with these roles may have."""
    return (*STEP_STREAMS, *(batch_stream(r) for r in roles))


def _check_stream(name: str) -> str:
    if name in STREAMS or (name.startswith("batch.") and check_role(name[6:])):
        return name
    raise ValueError(f"stream must be one of {STREAMS} or batch.<role>, got {name!r}")


def _job(job_id: str) -> str:
    return f"{PREFIX}:{{{check_id('job id', job_id)}}}"


# ---- global -----------------------------------------------------------------------------------
def jobs_index() -> str:
    """ZSET job_id → created_at (unix seconds)."""
    return f"{PREFIX}:jobs"


def dispatch() -> str:
    """STREAM of JobDispatch messages, one per job for all its trainer roles (each role reads it in a
    consumer group of its own), so every role meets the jobs in the same order."""
    return f"{PREFIX}:dispatch"


def trainers(role: str) -> str:
    """ZSET of the trainer services serving `role` (their consumer names) scored by their last heartbeat."""
    return f"{PREFIX}:trainers:{check_role(role)}"


def dispatch_lock(job_id: str) -> str:
    """STRING held (SET NX PX) while one create call dispatches the job."""
    return f"{_job(job_id)}:dispatch_lock"


def datasets_index() -> str:
    """HASH dataset_id → DatasetInfo JSON: every uploaded dataset."""
    return f"{PREFIX}:datasets"


def every_job_key() -> str:
    """The SCAN pattern of every job's keys, all jobs together (what retention must expire)."""
    return f"{PREFIX}:{{*"


def dataset(dataset_id: str) -> str:
    """STRING: one dataset's canonical JSONL, zlib-compressed (content-addressed: never rewritten)."""
    return f"{PREFIX}:dataset:{check_id('dataset id', dataset_id)}"


# ---- one job ----------------------------------------------------------------------------------
def job_keys(job_id: str) -> str:
    """The SCAN pattern of every key of one job (its hash tag): what expires with the job."""
    return f"{_job(job_id)}:*"


def job(job_id: str) -> str:
    """HASH: the job record (status, config, reason, cancel flag, timestamps)."""
    return f"{_job(job_id)}:job"


def delegation_secret(job_id: str) -> str:
    """STRING: the job's random key that signs its delegations (created once by the root trainer;
    read by the callee trainers; never served over HTTP)."""
    return f"{_job(job_id)}:delegation_secret"


def session_trace(job_id: str, session: str) -> str:
    """STRING: the W3C `traceparent` of an agent-program run's `rollout` span (session
    `<step>.<query>.<rollout>`), set by the root trainer when tracing is on; read by the services
    serving the run's chat calls, whose spans join that trace."""
    return f"{_job(job_id)}:session_trace:{check_id('session', session)}"


def stream(job_id: str, name: StreamName) -> str:
    """STREAM of one job: planner_stats, batch.<role> or events."""
    return f"{_job(job_id)}:stream:{_check_stream(name)}"


def step_record(job_id: str, name: StreamName, step: int) -> str:
    """STRING: the message of `name` for one step, for random access beside the stream entry."""
    return f"{_job(job_id)}:{_check_stream(name)}:{int(step)}"


def step_episodes(job_id: str, step: int) -> str:
    """HASH episode_id → episode blob: every callee episode of one step, all roles (GC deletes it whole)."""
    return f"{_job(job_id)}:episodes:{int(step)}"


def root_step(job_id: str, step: int) -> str:
    """HASH: a root trainer's own produced step (its samples, metrics and what it handed each callee),
    written with the step's messages, so a restarted root trains on it instead of rolling it again."""
    return f"{_job(job_id)}:root_step:{int(step)}"


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


def checkpoints(job_id: str) -> str:
    """LIST of PolicyVersion JSON: every checkpoint a trainer of the job published, in order."""
    return f"{_job(job_id)}:checkpoints"


def sample_counts(job_id: str) -> str:
    """HASH `<role>:<kind>:<step>` → count (kind: produced, trained, dropped, unaligned): each role's
    training queue, accounted per step."""
    return f"{_job(job_id)}:sample_counts"


def metrics(job_id: str) -> str:
    """HASH role → latest MetricsEvent JSON of that role."""
    return f"{_job(job_id)}:metrics"


def dead_letter(stream_key: str) -> str:
    """STREAM of entries of `stream_key` that could not be decoded (same hash slot as the stream)."""
    if not stream_key.startswith(PREFIX):
        raise ValueError(f"{stream_key!r} is not a key of this protocol")
    return f"{stream_key}:dead"
