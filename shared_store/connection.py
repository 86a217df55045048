"""Redis connections: one pool per process and URL, retries with backoff, clear errors.

`REDIS_URL` is the one setting (`redis://`, `rediss://`, with or without a password). Commands that
hit a connection error are retried with exponential backoff (so a Redis restart is ridden out); when
the server stays away, `StoreUnavailableError` names the URL, never the password. Each command gives
up on a server that is reachable but does not answer (paused, overloaded) after the socket timeout
(3 s); the controller's client does not retry then (`retry_timeouts=False`: an API call answers a 503
within seconds instead of hanging), a trainer's does, as for a restart, riding out a pause of ~30 s.
"""

from __future__ import annotations

import os
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

DEFAULT_URL = "redis://127.0.0.1:6379/0"
_pools: dict[tuple[int, str, bool], redis.ConnectionPool] = {}
_lock = threading.Lock()


class StoreUnavailableError(ConnectionError):
    """Redis could not be reached within the bounded wait."""


def redact(url: str) -> str:
    """The URL with any password replaced by '***' (safe for logs and error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def resolve_url(url: str | None = None) -> str:
    value = url or os.environ.get("REDIS_URL") or DEFAULT_URL
    if urlsplit(value).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"REDIS_URL {redact(value)!r} must start with redis://, rediss:// or unix://")
    return value


def _pool(url: str, retries: int, socket_timeout_s: float, retry_timeouts: bool) -> redis.ConnectionPool:
    key = (os.getpid(), url, retry_timeouts)  # a forked child gets its own pool
    errors: tuple[type[Exception], ...] = (redis.ConnectionError,)
    if retry_timeouts:
        errors += (redis.TimeoutError,)
    with _lock:
        pool = _pools.get(key)
        if pool is None:
            pool = redis.ConnectionPool.from_url(
                url,
                socket_connect_timeout=2.0,
                socket_timeout=socket_timeout_s,
                health_check_interval=15,
                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries, supported_errors=errors),
                retry_on_error=list(errors),
            )
            _pools[key] = pool
        return pool


def connect(
    url: str | None = None,
    *,
    wait_s: float = 30.0,
    retries: int = 12,
    socket_timeout_s: float = 3.0,
    retry_timeouts: bool = True,
) -> redis.Redis:
    """A client on this process's shared pool, after Redis answered PING (waits up to `wait_s`)."""
    resolved = resolve_url(url)
    wait_ready(resolved, wait_s)
    return redis.Redis(connection_pool=_pool(resolved, retries, socket_timeout_s, retry_timeouts))


def wait_ready(url: str, wait_s: float) -> None:
    """PING with a probe client of its own (no command retries) until it answers, at most `wait_s`."""
    probe = redis.Redis.from_url(url, socket_connect_timeout=min(2.0, wait_s), retry=Retry(NoBackoff(), 0))
    deadline = time.monotonic() + wait_s
    delay = 0.05
    while True:
        try:
            probe.ping()
            probe.close()
            return
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            if time.monotonic() + delay > deadline:
                raise StoreUnavailableError(
                    f"cannot reach Redis at {redact(url)} after {wait_s:.0f} s ({exc}); start it or set "
                    "REDIS_URL to a running server"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def ping_now(client: redis.Redis, timeout_s: float = 1.0) -> None:
    """PING on a fresh connection with no retries (readiness probes): returns, or raises
    `StoreUnavailableError` within about `timeout_s`, however long the client's own retries last."""
    pool = client.connection_pool
    kwargs = {
        **pool.connection_kwargs,
        "socket_connect_timeout": timeout_s,
        "socket_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_error": [],
    }
    conn = pool.connection_class(**kwargs)
    try:
        conn.connect()
        conn.send_command("PING")
        conn.read_response()
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise StoreUnavailableError(f"Redis not reachable: {exc}") from exc
    finally:
        conn.disconnect()
