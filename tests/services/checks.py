"""What the end-to-end tests share: did a role's trainer really update its model, did a step reach
each ledger, is every training queue accounted? And API-only services to send requests to, and the
`mgrpo` CLI run as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import torch
from transformers import AutoModelForCausalLM

from services.launcher import LocalCluster
from shared_store import Store, keys
from shared_store.schemas import WireModel, decode

SHORT_JOB: dict[str, Any] = {  # a deep-research job of 3 short steps (its roles are each test's)
    "steps": 3,
    "prompts_per_step": 2,
    "rollouts_per_query": 4,
    "subagent_slots_per_rollout": 3,
    "partner_timeout_s": 300,
}
LORA = {"rank": 8, "alpha": 16, "target_modules": "all-linear"}
ROOT = Path(__file__).resolve().parents[2]


def mgrpo(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, cwd: Path | None = None, drop=()
) -> subprocess.CompletedProcess[str]:
    """`mgrpo ARGS` as a process (python -m services.cli) from this checkout; `drop`: variables unset."""
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in drop}
    full_env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
    )


def params_of(path: str | Path) -> dict[str, torch.nn.Parameter]:
    return dict(AutoModelForCausalLM.from_pretrained(str(path)).named_parameters())


def final_checkpoint(cluster: LocalCluster, role: str, job_id: str) -> Path:
    ckpts = sorted((cluster.checkpoint_dir(role) / job_id / role).glob("step-*"))
    assert ckpts, f"no {role} checkpoint"
    return ckpts[-1]


def stream_messages(store: Store, job_id: str, name: str, model: type[WireModel]) -> list[Any]:
    return [decode(model, f[b"data"]) for _, f in store.client.xrange(keys.stream(job_id, name))]


def wait_ledger(store: Store, job_id: str, role: str, step: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while store.ledger.last_step(job_id, role) < step:
        assert time.monotonic() < deadline, f"{role} never reached step {step}"
        time.sleep(0.1)


def killed_and_finished(
    cluster: LocalCluster,
    store: Store,
    job_id: str,
    roles: tuple[str, ...],
    *,
    after: str,
    kill: str,
    headers: dict[str, str],
) -> dict[str, Any]:
    """SIGKILL the `kill` service once `after`'s first step is in the ledger (the cluster's supervisor
    restarts it), then follow the job to its end: it succeeded and the service was restarted, every
    step of each of `roles` is in the ledger exactly once and every queue is accounted. Returns the job."""
    url = cluster.url("controller")
    wait_ledger(store, job_id, after, 0)
    first = cluster.procs[kill]
    first.kill()
    deadline = time.monotonic() + 600
    while (job := httpx.get(f"{url}/v1/jobs/{job_id}", headers=headers, timeout=10).json())["status"] not in (
        "succeeded",
        "failed",
        "cancelled",
    ):
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    assert job["status"] == "succeeded", job["reason"]
    assert cluster.procs[kill] is not first, f"the {kill} service was never restarted"
    marks = sorted((e.role, e.step) for e in store.ledger.entries(job_id))
    assert marks == sorted((r, s) for r in roles for s in range(job["config"]["steps"]))
    assert_accounted(store, job_id, roles)
    return dict(job)


def assert_accounted(store: Store, job_id: str, roles: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """Every role's training queue: produced = trained + dropped + unaligned, nothing lost."""
    totals = store.accounts.totals(job_id)
    assert set(totals) == set(roles), totals
    for role, t in totals.items():
        assert t["produced"] > 0 and t["produced"] == t["trained"] + t["dropped"] + t["unaligned"], (role, t)
    return totals


def moved(start: str | Path, trained: str | Path) -> list[str]:
    """The names of the parameters that differ between two HF folders."""
    before, after = params_of(start), params_of(trained)
    return [n for n, p in after.items() if not torch.equal(p, before[n])]


def assert_updated(role: str, start: str | Path, trained: str | Path, records: list[dict[str, Any]]) -> bool:
    """Every parameter of the role moved exactly when its updates had a gradient; returns whether
    they had one. A job whose every group of the role drew equal rewards has advantage 0 on every
    sample (algorithm.md §4): a zero gradient, and Adam leaves each weight as it was. At a tiny warm start's
    accuracy (~5-10 % for the MarsRL solver) that is a few percent of short jobs, so a move cannot be
    asserted unconditionally; a gradient without a move, or a move without one, is always a bug."""
    key = f"{role}/grad_norm"
    grads = [r["values"][key] for r in records if r["role"] == role and key in r["values"]]
    assert grads, f"{role}: no update in the job's metrics"
    changed, total = moved(start, trained), len(params_of(start))
    if max(grads) > 0:
        assert len(changed) == total, (
            f"{role}: a gradient ({max(grads):.3g}) but {total - len(changed)} of {total} parameters never moved"
        )
    else:
        assert not changed, f"{role}: every gradient was 0, yet {changed[:3]} moved"
    return max(grads) > 0


@contextmanager
def supervised(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster started, with its own supervisor (`LocalCluster.supervise`, what `mgrpo local up`
    runs) restarting whatever dies, five times a second; stopped afterwards."""
    stop = threading.Event()

    def supervisor() -> None:
        while not stop.is_set():
            cluster.supervise()
            stop.wait(0.2)

    with cluster:
        keeper = threading.Thread(target=supervisor, daemon=True)
        keeper.start()
        try:
            yield cluster
        finally:
            stop.set()
            keeper.join(5)


@contextmanager
def api_only_cluster(run_dir: Path, redis_url: str, token: str, **env: str) -> Iterator[LocalCluster]:
    """The services as real processes without job workers (nothing trains: jobs stay queued). `env`:
    more settings, e.g. MGRPO_MAX_DATASET_BYTES="4000"."""
    with LocalCluster(
        run_dir, redis_url=redis_url, api_token=token, extra_env={"MGRPO_RUN_WORKER": "false", **env}
    ) as cluster:
        yield cluster


@contextmanager
def api_only(run_dir: Path, redis_url: str, token: str, **env: str) -> Iterator[httpx.Client]:
    """`api_only_cluster`, and a client of its controller."""
    with (
        api_only_cluster(run_dir, redis_url, token, **env) as cluster,
        httpx.Client(base_url=cluster.url("controller"), timeout=30) as client,
    ):
        yield client


def rank_pid(cluster: LocalCluster, role: str, rank: int, timeout_s: float = 30) -> int:
    """The pid of one rank of a role started under torchrun (a child of its torchrun process, with
    RANK=<rank> in its environment)."""
    parent, deadline = cluster.procs[role].pid, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                env = (stat.parent / "environ").read_bytes().split(b"\0") if ppid == parent else []
            except (OSError, ValueError, IndexError):
                continue
            if f"RANK={rank}".encode() in env:
                return int(stat.parent.name)
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} under {role}'s torchrun (pid {parent})")


def spans_of(traces: Path) -> list[dict[str, Any]]:
    """Every span the services wrote (`MGRPO_TRACE_DIR`), with the service that wrote it."""
    out = []
    for f in traces.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            span = json.loads(line)
            out.append({**span, "service": span["resource"]["attributes"]["service.name"]})
    return out
