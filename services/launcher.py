"""A local cluster: (embedded Redis) + controller + one trainer service per role, each its own OS
process.

Used by `mgrpo local up`, `mgrpo demo` and the end-to-end tests. `roles` lists the workflow roles
that run a trainer, root first (`Workflow.cluster_roles`; default: deep_research's planner and
sub-agent). The root is started with
`python -m services.cli serve planner --role <root>`, every other role with `serve subagent --role
<role>`; the root finds them through MGRPO_ROLE_URLS. Each log goes to `<run_dir>/logs/<role>.log`.
A role given W > 1 `ranks` is served with `serve … --ranks W`, which runs it under torchrun (W
processes): rank 0 is its service, the others train with it (`mgrpo.parallel`); torchrun stops the
group when a rank dies, and `supervise` starts it again. A role given N > 1 `nodes` runs as N
processes as if on N machines (`serve … --nodes N --node-rank K`, meeting at node 0 on a port of
its own): node 0 is the role's service, node K is listed as the service `<role>@K` (its log
`logs/<role>@K.log`, its port answering the health probes), and each is restarted on its own.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from mgrpo.workflows import DEEP_RESEARCH
from shared_store.embedded import RedisServer, free_port

ROLES = DEEP_RESEARCH.cluster_roles()  # the default workflow's trainer roles (`Workflow.cluster_roles`)


@dataclass
class LocalCluster:
    run_dir: Path
    redis_url: str | None = None
    api_token: str = ""
    service_token: str = ""  # '' with an api_token: a random one, so users' tokens cannot write episodes
    extra_env: dict[str, str] = field(default_factory=dict)
    role_env: dict[str, dict[str, str]] = field(default_factory=dict)  # per role, over extra_env
    roles: tuple[str, ...] = ROLES  # trainer roles, root first
    cpus: dict[str, str] = field(default_factory=dict)  # role → `taskset -c` CPU list (e.g. "0"), to pin it
    ranks: dict[str, int] = field(default_factory=dict)  # role → its trainer's ranks per node (default 1)
    nodes: dict[str, int] = field(default_factory=dict)  # role → the nodes its ranks span (default 1)
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    redis: RedisServer | None = None
    restarts: dict[str, int] = field(default_factory=dict)  # by `supervise`, per service (and "redis")
    _started: dict[str, float] = field(
        default_factory=dict, repr=False
    )  # monotonic time of each one's last start
    _delay: dict[str, float] = field(default_factory=dict, repr=False)  # its last backoff
    _due: dict[str, float] = field(default_factory=dict, repr=False)  # when a dead one restarts

    def url(self, role: str) -> str:
        return f"http://127.0.0.1:{self.ports[role]}"

    def checkpoint_dir(self, role: str) -> Path:
        """The role's checkpoint volume (the API shows checkpoint paths relative to it): its service's,
        or the root's for a role without a service here (hosted in the root's, `services.hosted`)."""
        if self.roles and role not in self.roles:  # hosted in the root's service
            role = self.roles[0]
        return self.run_dir / "checkpoints" / role

    @property
    def tracking_dir(self) -> Path:
        """Where every role's trackers write, side by side (`tensorboard --logdir <it>/tensorboard`)."""
        return self.run_dir / "tracking"

    def start(self, timeout_s: float = 120.0) -> LocalCluster:
        for what, given in (("ranks", self.ranks), ("nodes", self.nodes)):
            if unknown := set(given) - set(self.roles):
                raise ValueError(
                    f"{what} for roles this cluster does not run: {sorted(unknown)}; its roles: {list(self.roles)}"
                )
        self.run_dir = self.run_dir.resolve()
        if self.api_token and not self.service_token:
            self.service_token = secrets.token_urlsafe(24)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        if not self.redis_url:
            self.redis = RedisServer(self.run_dir / "redis", appendonly=True)
            self.redis.start()
            self.redis_url = self.redis.url
            self._started["redis"] = time.monotonic()
        self.ports = {r: self.ports.get(r) or free_port() for r in (*self.services, *self._rendezvous)}
        for role in self.services:
            self.start_role(role)
        self.wait_ready(timeout_s)
        return self

    @property
    def services(self) -> tuple[str, ...]:
        """The processes it runs: the controller, each role's service, each role's nodes > 0."""
        nodes = (f"{r}@{k}" for r in self.roles for k in range(1, self.nodes.get(r, 1)))
        return ("controller", *self.roles, *nodes)

    @property
    def _rendezvous(self) -> tuple[str, ...]:
        return tuple(f"{r}~rendezvous" for r in self.roles if self.nodes.get(r, 1) > 1)

    def kind(self, role: str) -> str:
        role = role.split("@")[0]
        return "controller" if role == "controller" else "planner" if role == self.roles[0] else "subagent"

    def env(self, service: str) -> dict[str, str]:
        role, _, node = service.partition("@")
        spans: dict[str, str] = {}
        if self.nodes.get(role, 1) > 1:
            rendezvous = f"127.0.0.1:{self.ports[f'{role}~rendezvous']}"
            spans = {
                "MGRPO_NODES": str(self.nodes[role]),
                "MGRPO_NODE_RANK": node or "0",
                "MGRPO_RENDEZVOUS": rendezvous,
            }
        return {**self._role_env(role), **spans}

    def _role_env(self, role: str) -> dict[str, str]:
        callees = {r: self.url(r) for r in self.roles[1:]}
        return {
            **os.environ,
            "REDIS_URL": self.redis_url or "",
            "MGRPO_API_TOKEN": self.api_token,
            "MGRPO_SERVICE_TOKEN": self.service_token,
            "MGRPO_ROLE": "" if role == "controller" else role,
            "MGRPO_ROLE_URLS": json.dumps(callees),
            "MGRPO_SUBAGENT_URL": callees.get("subagent", ""),
            "MGRPO_CHECKPOINT_DIR": str(self.checkpoint_dir(role)),
            "MGRPO_TRACKING_DIR": str(self.tracking_dir),
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
            *(
                ["--ranks", str(self.ranks[base])]
                if self.ranks.get(base := role.split("@")[0], 1) > 1
                else []
            ),
        ]
        self.procs[role] = subprocess.Popen(
            cmd, env=self.env(role), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._started[role] = time.monotonic()

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

    def supervise(self, *, min_up_s: float = 30.0, max_delay_s: float = 30.0) -> list[str]:
        """Restart what died (a service, the embedded Redis) and return the names restarted. One that
        ran `min_up_s` or longer restarts at once; one that dies sooner waits a backoff that doubles
        (1 s, 2 s, … ≤ `max_delay_s`). Call it periodically (`mgrpo local up`: twice a second)."""
        now, restarted = time.monotonic(), []
        dead = [r for r, p in self.procs.items() if p.poll() is not None]
        if self.redis is not None and (self.redis.proc is None or self.redis.proc.poll() is not None):
            dead.insert(0, "redis")  # first: the services need it
        for name in dead:
            if name not in self._due:  # newly found dead
                quick = now - self._started.get(name, now) < min_up_s
                delay = min(max(self._delay.get(name, 0.5) * 2, 1.0), max_delay_s) if quick else 0.0
                self._delay[name], self._due[name] = delay, now + delay
            if now < self._due[name]:
                continue
            del self._due[name]
            if name == "redis":
                assert self.redis is not None
                self.redis.start()
                self._started[name] = time.monotonic()
            else:
                self.start_role(name)
            self.restarts[name] = self.restarts.get(name, 0) + 1
            restarted.append(name)
        return restarted

    def kill(self, role: str) -> None:
        """SIGKILL one service (no clean shutdown), as a crash would."""
        proc = self.procs.pop(role)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def terminate(self, role: str, timeout_s: float = 30.0) -> float:
        """SIGTERM one service (a clean shutdown, as `docker stop` or Kubernetes does); returns the
        seconds until it exited."""
        proc = self.procs.pop(role)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout_s)
        return time.monotonic() - t0

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
