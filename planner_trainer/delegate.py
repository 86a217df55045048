"""Calls to a callee role over HTTP: a root rollout's subtask becomes `POST {callee}/v1/episodes`.

The callee answers with a `Server-Timing` header (its handler time and its Redis write); the
client records, per call, the time spent in exchange (HTTP + Redis) rather than in the model.
Retries with backoff while the callee's service is down or still loading the job, up to the job's
`partner_timeout_s`; then `PartnerError` names the partner, so the job fails with a clear reason
instead of hanging. The job's end (`ended`: a cancel, or another service failing it) ends a call in
flight — even one a stopped partner never answers — and every retry within a fifth of a second
(`JobCancelled`); the abandoned request is cut when the client closes with the job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import httpx

from mgrpo import tracing
from mgrpo.agents.agents import Delegation
from shared_store.jobs import JobCancelled


def server_timing(header: str) -> dict[str, float]:
    """`Server-Timing: a;dur=1.5, b;dur=2` → {"a": 1.5, "b": 2.0} (ms); entries without dur are skipped."""
    out: dict[str, float] = {}
    for entry in header.split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        for p in params:
            key, _, value = p.partition("=")
            if name and key == "dur":
                try:
                    out[name] = float(value)
                except ValueError:
                    continue
    return out


class Callee(Protocol):
    """What a root's rollout delegates to: a callee role's service over HTTP (`CalleeClient`), or
    the role's job hosted in the root's own trainer (`services.hosted`)."""

    role: str

    def episode(self, body: dict[str, Any]) -> Delegation: ...


class PartnerError(RuntimeError):
    """The partner service did not answer within the job's timeout."""


class CalleeClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float,
        role: str,
        ended: threading.Event | None = None,
        sign: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        """`ended`: set when the job ended (`shared_store.jobs.JobWatch`): a call in flight or a
        retry then raises `JobCancelled`. `sign(body)`: the delegation's capability
        (`shared_store.capabilities`), sent with it."""
        self.base_url, self.role, self.sign = base_url.rstrip("/"), role, sign
        self.timeout_s, self.ended = timeout_s, ended or threading.Event()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=256),
        )
        self.calls = ThreadPoolExecutor(max_workers=256, thread_name_prefix=f"call-{role}")

    def episode(self, body: dict[str, Any]) -> Delegation:
        """One delegation (retried while the callee's service is not ready), in a `delegate` span whose
        trace context travels in the request's `traceparent` header."""
        with tracing.span(
            "delegate",
            kind="client",
            job_id=body.get("job_id"),
            step=body.get("step"),
            role=self.role,
            query_id=body.get("query_id"),
            rollout=body.get("rollout"),
        ):
            return self._episode(body, dict(tracing.inject({})))

    def _episode(self, body: dict[str, Any], headers: dict[str, str]) -> Delegation:
        if self.sign is not None:
            body = {**body, "capability": self.sign(body)}
        deadline = time.monotonic() + self.timeout_s
        delay, last = 0.05, "no answer"
        while time.monotonic() < deadline:
            try:
                t0 = time.perf_counter()
                resp = self._post(body, headers)
                if resp.status_code == 200:
                    data = resp.json()
                    timing = server_timing(resp.headers.get("server-timing", ""))
                    model_s = (timing.get("episode", 0.0) - timing.get("store", 0.0)) / 1e3
                    exchange_s = max(time.perf_counter() - t0 - model_s, 0.0)
                    queued_s = timing.get("queued", 0.0) / 1e3
                    return Delegation(
                        body["subtask"], data["result"], data["episode_id"], exchange_s, queued_s, self.role
                    )
                if resp.status_code not in (409, 503):  # 503 (409 before): the job is not loaded there yet
                    raise PartnerError(
                        f"the {self.role} service at {self.base_url} refused an episode: {resp.status_code} {resp.text[:200]}"
                    )
                last = f"{resp.status_code} {resp.text[:200]}"
            except httpx.HTTPError as exc:
                last = str(exc) or type(exc).__name__
            if self.ended.wait(delay):
                raise JobCancelled()
            delay = min(delay * 2, 0.5)
        raise PartnerError(
            f"the {self.role} service at {self.base_url} did not answer within {self.timeout_s:.0f} s ({last})"
        )

    def _post(self, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        """The POST, abandoned (`JobCancelled`) as soon as the job ends while it waits for an answer."""
        call = self.calls.submit(self.http.post, "/v1/episodes", json=body, headers=headers)
        while True:
            try:
                return call.result(timeout=0.1)
            except TimeoutError:
                if self.ended.is_set():
                    call.cancel()
                    raise JobCancelled() from None

    def close(self) -> None:
        self.calls.shutdown(wait=False, cancel_futures=True)
        self.http.close()  # cuts the requests an ended job abandoned
