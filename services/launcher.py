"""A local cluster: (embedded Redis) + controller + one trainer service per role, each its own OS
process.

Used by `mgrpo local up`, `mgrpo demo` and the end-to-end tests. `roles` lists the workflow roles
that run a trainer, root first (default: deep_research's planner and sub-agent; marsrl: solver,
verifier, corrector, or just solver when the others share its model). The root is started with
`python -m services.cli serve planner --role <root>`, every other role with `serve subagent --role
<role>`; the root finds them through MGRPO_ROLE_URLS. Each log goes to `<run_dir>/logs/<role>.log`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from shared_store.embedded import RedisServer, free_port

ROLES = ("planner", "subagent")  # deep_research's trainer roles, the default


def workflow_roles(workflow: str, *, shared: bool = False) -> tuple[str, ...]:
    """The trainer roles of a built-in workflow's cluster (`shared`: marsrl with one model for all roles)."""
    if workflow == "marsrl":
        return ("solver",) if shared else ("solver", "verifier", "corrector")
    if workflow == "deep_research_team":
        return ("planner", "searcher", "comparer")
    return ROLES


@dataclass
class LocalCluster:
    run_dir: Path
    redis_url: str | None = None
    api_token: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    role_env: dict[str, dict[str, str]] = field(default_factory=dict)  # per role, over extra_env
    roles: tuple[str, ...] = ROLES  # trainer roles, root first
    cpus: dict[str, str] = field(default_factory=dict)  # role → `taskset -c` CPU list (e.g. "0"), to pin it
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    redis: RedisServer | None = None

    def url(self, role: str) -> str:
        return f"http://127.0.0.1:{self.ports[role]}"

    def start(self, timeout_s: float = 120.0) -> LocalCluster:
        self.run_dir = self.run_dir.resolve()
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        if not self.redis_url:
            self.redis = RedisServer(self.run_dir / "redis", appendonly=True)
            self.redis.start()
            self.redis_url = self.redis.url
        self.ports = self.ports or {r: free_port() for r in self.services}
        for role in self.services:
            self.start_role(role)
        self.wait_ready(timeout_s)
        return self

    @property
    def services(self) -> tuple[str, ...]:
        return ("controller", *self.roles)

    def kind(self, role: str) -> str:
        return "controller" if role == "controller" else "planner" if role == self.roles[0] else "subagent"

    def env(self, role: str) -> dict[str, str]:
        callees = {r: self.url(r) for r in self.roles[1:]}
        return {
            **os.environ,
            "REDIS_URL": self.redis_url or "",
            "MGRPO_API_TOKEN": self.api_token,
            "MGRPO_ROLE": "" if role == "controller" else role,
            "MGRPO_ROLE_URLS": json.dumps(callees),
            "MGRPO_SUBAGENT_URL": callees.get("subagent", ""),
            "MGRPO_CHECKPOINT_DIR": str(self.run_dir / "checkpoints" / role),
            "MGRPO_CONSUMER_NAME": f"local-{role}",
            "MGRPO_PUBLIC_URL": self.url(role),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
            **self.role_env.get(role, {}),
        }

    def start_role(self, role: str) -> None:
        log = (self.run_dir / "logs" / f"{role}.log").open("ab")
        pin = ["taskset", "-c", self.cpus[role]] if role in self.cpus else []
        cmd = [
            *pin,
            sys.executable,
            "-m",
            "services.cli",
            "serve",
            self.kind(role),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.ports[role]),
        ]
        self.procs[role] = subprocess.Popen(cmd, env=self.env(role), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip

    def wait_ready(self, timeout_s: float, roles: tuple[str, ...] | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        for role in roles or self.services:
            while True:
                proc = self.procs[role]
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"the {role} service exited with code {proc.returncode}; see {self.run_dir}/logs/{role}.log"
                    )
                try:
                    if httpx.get(f"{self.url(role)}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the {role} service was not ready after {timeout_s:.0f} s; see {self.run_dir}/logs/{role}.log"
                    )
                time.sleep(0.1)

    def kill(self, role: str) -> None:
        """SIGKILL one service (no clean shutdown), as a crash would."""
        proc = self.procs.pop(role)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
