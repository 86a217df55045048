"""Redis Streams with consumer groups: durable queues between the services.

- `publish` / `publish_step`: `XADD … MAXLEN ~` (the step variant also writes the message under a
  per-step key in the same MULTI, for random access).
- `StreamConsumer.read`: first `XAUTOCLAIM`s entries another consumer left pending longer than
  `min_idle_ms` (it crashed before `XACK`), then `XREADGROUP … BLOCK` for new ones.
- `XACK` only after the work is durable (`ack`), so a crash means redelivery, never loss.
- An entry that cannot be decoded (corrupted, or another schema version) is moved to a dead-letter
  stream and acknowledged, so one bad entry never blocks the queue; `dead_letters` lists them.
- `consume_once`: redelivery-safe handling through the step ledger (a step is never applied twice).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import redis

from shared_store import keys
from shared_store._text import as_str
from shared_store.ledger import StepLedger
from shared_store.schemas import (
    LedgerEntry,
    MetricsEvent,
    PayloadError,
    StepMessage,
    WireModel,
    decode,
    encode,
)

M = TypeVar("M", bound=WireModel)
S = TypeVar("S", bound=StepMessage)
DEFAULT_MAXLEN = 10_000
STEP_RECORD_TTL_S = 7 * 24 * 3600


def publish(client: redis.Redis, stream_key: str, message: WireModel, *, maxlen: int = DEFAULT_MAXLEN) -> str:
    """XADD one message; returns the entry id."""
    entry = client.xadd(stream_key, {"data": encode(message)}, maxlen=maxlen, approximate=True)
    return as_str(entry)


def publish_step(
    client: redis.Redis, name: keys.StreamName, message: StepMessage, *, ttl_s: int = STEP_RECORD_TTL_S
) -> str:
    """Write a step message under its per-step key and XADD it to the job's stream, atomically."""
    pipe = client.pipeline(transaction=True)
    stage_step(pipe, name, message, ttl_s=ttl_s)
    _, entry = pipe.execute()
    return as_str(entry)


def stage_step(
    pipe: redis.client.Pipeline,
    name: keys.StreamName,
    message: StepMessage,
    *,
    ttl_s: int = STEP_RECORD_TTL_S,
) -> None:
    """Queue `publish_step`'s two commands (SET, XADD) on a MULTI pipeline another writer executes."""
    payload = encode(message)
    pipe.set(keys.step_record(message.job_id, name, message.step), payload, ex=ttl_s)
    pipe.xadd(keys.stream(message.job_id, name), {"data": payload}, maxlen=DEFAULT_MAXLEN, approximate=True)


def publish_metrics(client: redis.Redis, event: MetricsEvent) -> None:
    """Append a metrics record or event to the job's events stream; metrics also become the role's latest."""
    pipe = client.pipeline(transaction=True)
    pipe.xadd(
        keys.stream(event.job_id, "events"), {"data": encode(event)}, maxlen=DEFAULT_MAXLEN, approximate=True
    )
    if event.kind == "metrics":
        pipe.hset(keys.metrics(event.job_id), event.role, encode(event))
    pipe.execute()


def publish_event(client: redis.Redis, job_id: str, role: str, message: str) -> None:
    """A line in the job's events (not a step's metrics): what the SSE stream and the CLI show."""
    publish_metrics(client, MetricsEvent(job_id=job_id, step=-1, role=role, kind="event", message=message))


def trim_through_step(client: redis.Redis, stream_key: str, step: int, *, page: int = 64) -> int:
    """Delete a step stream's oldest entries while their message's step is <= `step`; returns how many
    went. XTRIM MINID just past the last such entry, so an entry added meanwhile is never touched; an
    entry that cannot be read ends the scan (it stays for the dead-letter path)."""
    through: str | None = None  # id of the last entry to delete
    start, newer_seen = "-", False
    while not newer_seen:
        entries = cast(
            list[tuple[bytes, dict[bytes, bytes]]], client.xrange(stream_key, start, "+", count=page)
        )
        for entry_id, fields in entries:
            try:
                entry_step = int(json.loads(fields[b"data"])["step"])
            except (KeyError, ValueError, TypeError):
                entry_step = step + 1
            if entry_step > step:
                newer_seen = True
                break
            through = as_str(entry_id)
        if len(entries) < page:
            break
        start = "(" + as_str(entries[-1][0])
    if through is None:
        return 0
    ms, seq = through.split("-")
    return int(client.xtrim(stream_key, minid=f"{ms}-{int(seq) + 1}", approximate=False))


def get_step(client: redis.Redis, model: type[M], job_id: str, name: keys.StreamName, step: int) -> M | None:
    raw = client.get(keys.step_record(job_id, name, step))
    return None if raw is None else decode(model, raw)


@dataclass(frozen=True)
class Delivery(Generic[M]):
    entry_id: str
    message: M
    claimed: bool  # True when taken over from a consumer that left it pending


class StreamConsumer(Generic[M]):
    def __init__(
        self,
        client: redis.Redis,
        stream_key: str,
        group: str,
        consumer: str,
        model: type[M],
        *,
        min_idle_ms: int = 30_000,
    ) -> None:
        self.r, self.key, self.group, self.consumer, self.model = client, stream_key, group, consumer, model
        self.min_idle_ms = min_idle_ms
        self._own_checked = False
        self.ensure_group()

    def resume_own(self) -> None:
        """Read this consumer's own unacknowledged entries again on the next `read` (after a store
        outage broke off the handling of one)."""
        self._own_checked = False

    def ensure_group(self, start_id: str = "0") -> None:
        try:
            self.r.xgroup_create(self.key, self.group, id=start_id, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, *, count: int = 16, block_ms: int = 1000) -> list[Delivery[M]]:
        """This consumer's own unacknowledged entries on the first call (a restarted process resumes them),
        then stale entries of other consumers, else new entries (blocking up to block_ms)."""
        if not self._own_checked:
            self._own_checked = True
            own = self.read_own_pending(count=count)
            if own:
                return own
        claimed = self.r.xautoclaim(self.key, self.group, self.consumer, self.min_idle_ms, "0-0", count=count)
        entries = [(e, True) for e in claimed[1] if e[1] is not None]
        if not entries:
            reply = self.r.xreadgroup(self.group, self.consumer, {self.key: ">"}, count=count, block=block_ms)
            batches = cast(list[tuple[bytes, list[Any]]], reply or [])
            entries = [(e, False) for _, batch in batches for e in batch]
        return [d for d in (self._decode(e, c) for e, c in entries) if d is not None]

    def _decode(self, entry: tuple[bytes, dict[bytes, bytes]], claimed: bool) -> Delivery[M] | None:
        entry_id, fields = as_str(entry[0]), entry[1]
        try:
            return Delivery(entry_id, decode(self.model, fields.get(b"data", b"")), claimed)
        except (PayloadError, ValueError) as exc:
            self.dead_letter(entry_id, fields, str(exc))
            return None

    def dead_letter(self, entry_id: str, fields: dict[bytes, bytes], reason: str) -> None:
        pipe = self.r.pipeline(transaction=True)
        record: dict[Any, Any] = {**fields, b"reason": reason.encode(), b"entry": entry_id.encode()}
        pipe.xadd(keys.dead_letter(self.key), record)
        pipe.xack(self.key, self.group, entry_id)
        pipe.execute()

    def dead_letters(self) -> list[dict[str, str]]:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], self.r.xrange(keys.dead_letter(self.key)))
        return [{as_str(k): as_str(v) for k, v in fields.items()} for _, fields in entries]

    def read_own_pending(self, *, count: int = 16) -> list[Delivery[M]]:
        """Entries delivered to this consumer name but never acknowledged (a restart picks them up)."""
        reply = self.r.xreadgroup(self.group, self.consumer, {self.key: "0"}, count=count)
        batches = cast(list[tuple[bytes, list[Any]]], reply or [])
        entries = [(e, True) for _, batch in batches for e in batch if e[1]]
        return [d for d in (self._decode(e, c) for e, c in entries) if d is not None]

    def ack(self, entry_id: str) -> None:
        self.r.xack(self.key, self.group, entry_id)

    def pending(self) -> int:
        info = self.r.xpending(self.key, self.group)
        return int(info["pending"])


def consume_once(
    consumer: StreamConsumer[S],
    ledger: StepLedger,
    role: keys.Role,
    handler: Callable[[S], int],
    *,
    count: int = 16,
    block_ms: int = 1000,
) -> int:
    """Handle each delivered step message at most once per (job, role, step); returns how many ran.

    `handler` does the durable work and returns the policy version it produced; then the ledger is
    marked and the entry acknowledged. A redelivered entry whose step is already in the ledger is
    only acknowledged. A crash before the mark redoes the (not yet durable) work.
    """
    ran = 0
    for d in consumer.read(count=count, block_ms=block_ms):
        msg = d.message
        if not ledger.is_applied(msg.job_id, role, msg.step):
            version = handler(msg)
            ledger.mark(
                LedgerEntry(
                    job_id=msg.job_id,
                    role=role,
                    step=msg.step,
                    policy_version=version,
                    consumer=consumer.consumer,
                )
            )
            ran += 1
        consumer.ack(d.entry_id)
    return ran
