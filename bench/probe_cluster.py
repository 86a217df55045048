"""Probe a live `mgrpo local up` cluster as an operator and an attacker would (issue 38's list).

    python bench/probe_cluster.py [--run-dir runs/probe] [--port 8300]

Starts a deep_research cluster (embedded Redis, controller, planner, sub-agent as processes), then
sends each probe over HTTP and prints one line per probe with its status code, time and verdict;
at the end it counts the 5xx answers the services logged and exits non-zero if any probe failed.
The probes: a job naming `os:system` / `pty:spawn` as its program, a job seed of 10^30, dataset
metadata nested 5,000 deep, `/v1/generate` with seed 10^30 and with no job, a session chat call
without a token, a 20k-character chat message and `max_tokens` 8192 during a job, a cancel in the
middle of a job (and how soon the next one starts), the checkpoint list against the disk, a job for
roles nobody serves (`MGRPO_QUEUE_TIMEOUT_S=20`), Redis SIGSTOPped (a 503 within 5 s), and whether
a finished job's keys carry an expiry.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the tests' helpers
from shared_store import keys
from shared_store.embedded import RedisServer
from tests.waiting import wait_for

TOKEN = "probe-token"
H = {"Authorization": f"Bearer {TOKEN}"}
PROGRAM = "examples.openai_agent.agent:run"  # the example program, allowed by the probe's operator
JOB = {"steps": 40, "prompts_per_step": 2, "rollouts_per_query": 4}
RESULTS: list[tuple[str, bool, str]] = []


def probe(name: str, ok: bool, detail: str) -> None:
    RESULTS.append((name, ok, detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name:<44} {detail}", flush=True)


def timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    t0 = time.perf_counter()
    r = call()
    return r, time.perf_counter() - t0


def job_state(api: httpx.Client, job_id: str) -> str:
    return str(api.get(f"/v1/jobs/{job_id}", headers=H).json()["status"])


def program_job(entry_point: str) -> dict:
    roles = {r: {"model": {"path": f"/models/{r}"}} for r in ("planner", "searcher", "comparer")}
    return {"workflow": "openai_agents", "program": {"entry_point": entry_point}, "roles": roles}


def probe_inputs(api: httpx.Client, planner: httpx.Client) -> None:
    for ep in ("os:system", "pty:spawn"):
        r = api.post("/v1/jobs", json=program_job(ep), headers=H)
        probe(f"program {ep}", r.status_code == 422, f"{r.status_code} {r.text[:90]}")
    r = api.post("/v1/jobs", content=json.dumps({**JOB, "seed": 10**30}), headers=H)
    probe("job seed 10^30", r.status_code == 422, f"{r.status_code}")
    meta = '{"m": ' * 5000 + "{}" + "}" * 5000  # written by hand: json.dumps would recurse too
    row = '{"query": "q", "answer": "a", "split": "train", "metadata": ' + meta + "}"
    r = api.post("/v1/datasets", content=row.encode(), headers=H)
    probe("dataset metadata nested 5,000 deep", 400 <= r.status_code < 500, f"{r.status_code} {r.text[:90]}")
    r = planner.post("/v1/generate", json={"prompt": "hi", "seed": 10**30}, headers=H)
    probe("/v1/generate seed 10^30", r.status_code == 422, f"{r.status_code}")
    r = planner.post("/v1/generate", json={"prompt": "hi"}, headers=H)
    probe("/v1/generate with no job", r.status_code == 503, f"{r.status_code} {r.text[:90]}")
    r = planner.post("/v1/s/1.q0.0/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    probe("session chat without a token", r.status_code == 401, f"{r.status_code}")


def probe_running_job(api: httpx.Client, run_dir: Path, port: int) -> None:
    job = api.post("/v1/jobs", json=JOB, headers=H).json()["job_id"]
    wait_for(lambda: job_state(api, job) == "running", "the job runs", 300, 0.2)
    nxt = api.post("/v1/jobs", json={**JOB, "steps": 2}, headers=H).json()["job_id"]
    wait_for(
        lambda: bool(api.get(f"/v1/jobs/{job}/metrics", headers=H).json()["records"]),
        "a step is done",
        300,
        0.2,
    )
    partner = subprocess.run(
        ["pgrep", "-f", f"services.cli serve subagent --host 127.0.0.1 --port {port + 2}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    for pid in partner:  # the planner's delegations in flight now wait on a partner that never answers
        os.kill(int(pid), signal.SIGSTOP)
    try:
        r, s = timed(lambda: api.post(f"/v1/jobs/{job}/cancel", headers=H))
        took = wait_for(lambda: job_state(api, job) == "cancelled", "cancelled", 60, 0.02)
        start = wait_for(lambda: job_state(api, nxt) != "queued", "the next job starts", 60, 0.02)
    finally:
        for pid in partner:
            os.kill(int(pid), signal.SIGCONT)
    probe(
        f"cancel mid-job, sub-agent stopped ({len(partner)} pid)",
        r.status_code == 200 and s + took < 1 and len(partner) == 1,
        f"{r.status_code}; cancelled in {s + took:.2f} s",
    )
    probe(
        "next job starts after a cancel", s + took + start < 2, f"{s + took + start:.2f} s after the cancel"
    )
    wait_for(lambda: job_state(api, nxt) in {"succeeded", "failed"}, "the next job ends", 600, 0.5)
    probe("next job succeeds", job_state(api, nxt) == "succeeded", job_state(api, nxt))
    listed = api.get(f"/v1/jobs/{nxt}/checkpoints", headers=H).json()
    listed_n = len(listed.get("checkpoints", []))
    on_disk = len(list((run_dir / "checkpoints").glob(f"*/{nxt}/*/step-*")))
    probe(
        "checkpoint list = what is on disk", listed_n == on_disk > 0, f"{listed_n} listed, {on_disk} on disk"
    )


def probe_unserved(api: httpx.Client) -> None:
    body = {"workflow": "marsrl", "steps": 2, "prompts_per_step": 2, "rollouts_per_query": 2}
    r = api.post("/v1/jobs", json=body, headers=H)
    if r.status_code != 201:
        probe("job for roles nobody serves", False, f"{r.status_code} {r.text[:90]}")
        return
    job = r.json()["job_id"]
    took = wait_for(lambda: job_state(api, job) == "failed", "failed", 90, 0.5)
    error = api.get(f"/v1/jobs/{job}", headers=H).json().get("reason") or ""
    probe("job for roles nobody serves", "solver" in error, f"failed after {took:.0f} s: {error[:80]}")


def probe_store(api: httpx.Client, redis_pid: int) -> None:
    os.kill(redis_pid, signal.SIGSTOP)
    try:
        r, s = timed(lambda: api.get("/v1/jobs", headers=H, timeout=30))
    finally:
        os.kill(redis_pid, signal.SIGCONT)
    probe("Redis SIGSTOPped: GET /v1/jobs", r.status_code == 503 and s < 5, f"{r.status_code} in {s:.2f} s")


def probe_expiry(r: redis.Redis) -> None:
    found = list(r.scan_iter(keys.every_job_key(), count=1000))
    ttl = [r.ttl(k) for k in found]
    forever = [k.decode() for k, t in zip(found, ttl, strict=True) if t == -1]
    probe("job keys expire", not forever, f"{len(found)} keys, {len(forever)} without expiry {forever[:3]}")


class Cluster:
    """`mgrpo local up` of one workflow on the probe's Redis, its logs in `run_dir`."""

    def __init__(self, run_dir: Path, store: RedisServer, port: int, workflow: str, env: dict[str, str]):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir, self.port = run_dir, port
        cmd = [sys.executable, "-m", "services.cli", "local", "up", "--run-dir", str(run_dir)]
        cmd += ["--redis-url", store.url, "--api-token", TOKEN, "--port", str(port), "--workflow", workflow]
        self.log = open(run_dir / "cluster.log", "w")  # noqa: SIM115 - lives as long as the cluster
        self.proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        self.root = httpx.Client(base_url=f"http://127.0.0.1:{port + 1}", timeout=60)
        ready = lambda c: c.get("/readyz").status_code == 200  # noqa: E731
        wait_for(lambda: _up(lambda: ready(self.api) and ready(self.root)), "the cluster", 300, 0.5)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        self.api.close()
        self.root.close()
        self.log.close()

    def statuses(self) -> list[int]:
        """Every status code the services answered (uvicorn's access lines in their logs)."""
        codes = []
        for log in (self.run_dir / "logs").glob("*.log"):
            for line in log.open(errors="replace"):
                if '" ' in line and "HTTP/1.1" in line:
                    code = line.rsplit('" ', 1)[1].split()[0]
                    codes.append(int(code)) if code.isdigit() else None
        return codes


def probe_chat(c: Cluster) -> None:
    """The chat routes of an openai_agents job's planner (a tiny random chat model) while it runs."""
    from tests.mgrpo.chat_models import TEMPLATES, chat_model_folder  # the tests' tiny chat models

    roles = ("planner", "searcher", "comparer")
    folders = {
        r: chat_model_folder(c.run_dir / "models" / r, TEMPLATES["qwen2.5"], seed=i)
        for i, r in enumerate(roles)
    }
    body = {
        **program_job(PROGRAM),
        **JOB,
        "roles": {r: {"model": {"path": str(f)}} for r, f in folders.items()},
    }
    r = c.api.post("/v1/jobs", json=body, headers=H)
    if r.status_code != 201:
        probe("openai_agents job", False, f"{r.status_code} {r.text[:120]}")
        return
    job = r.json()["job_id"]
    wait_for(
        lambda: c.root.get("/v1/policy", headers=H).json()["job_id"] == job,
        "the planner holds the job",
        300,
        0.2,
    )
    big = {"messages": [{"role": "user", "content": "x " * 10_000}], "max_tokens": 16}
    r, s = timed(lambda: c.root.post("/v1/chat/completions", json=big, headers=H))
    probe(
        "chat, 20k-character message",
        r.status_code == 422 and s < 1,
        f"{r.status_code} in {s:.2f} s {r.text[:60]}",
    )
    long = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8192}
    r, s = timed(lambda: c.root.post("/v1/chat/completions", json=long, headers=H))
    probe(
        "chat, max_tokens 8192", r.status_code == 422 and s < 1, f"{r.status_code} in {s:.2f} s {r.text[:60]}"
    )
    ok = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    r, s = timed(lambda: c.root.post("/v1/chat/completions", json=ok, headers=H))
    probe("chat, a short call", r.status_code == 200, f"{r.status_code} in {s:.2f} s")
    r, s = timed(lambda: c.api.post(f"/v1/jobs/{job}/cancel", headers=H))
    took = wait_for(lambda: job_state(c.api, job) == "cancelled", "cancelled", 60, 0.02)
    probe("cancel an openai_agents job", r.status_code == 200 and took < 1, f"cancelled in {s + took:.2f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=Path("runs/probe"))
    ap.add_argument("--port", type=int, default=8300)
    a = ap.parse_args()
    store = RedisServer(a.run_dir / "redis")
    store.start()
    codes: list[int] = []
    try:
        env = {"MGRPO_QUEUE_TIMEOUT_S": "20", "MGRPO_JOB_RETENTION_S": "3600"}
        c = Cluster(a.run_dir / "deep_research", store, a.port, "deep_research", env)
        try:
            probe_inputs(c.api, c.root)
            probe_running_job(c.api, c.run_dir, c.port)
            probe_unserved(c.api)
            assert store.proc is not None
            probe_store(c.api, store.proc.pid)
            probe_expiry(redis.Redis.from_url(store.url))
        finally:
            c.close()
            codes += c.statuses()
        root = str(Path(__file__).resolve().parents[1])
        env = {"MGRPO_ALLOWED_PROGRAMS": json.dumps([PROGRAM]), "PYTHONPATH": root}
        c = Cluster(a.run_dir / "openai_agents", store, a.port + 10, "openai_agents", env)
        try:
            probe_chat(c)
        finally:
            c.close()
            codes += c.statuses()
    finally:
        store.stop()
    count = {code: codes.count(code) for code in sorted(set(codes))}
    bad = sum(n for code, n in count.items() if code >= 500 and code != 503)
    probe("no 5xx but the documented 503s", bad == 0, f"status codes served: {count}")
    return 0 if all(ok for _, ok, _ in RESULTS) else 1


def _up(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
