"""Chaos: SIGKILL a random part of a running `mgrpo local up` cluster (either trainer, the controller
or the embedded Redis; each at least once) at a random time in each of 5 short jobs, with the cluster's own supervisor
(`LocalCluster.supervise`, what `local up` runs) bringing it back: every job succeeds, every step is
in each role's ledger exactly once, every training queue is accounted. Seeded (`MGRPO_CHAOS_SEED`),
so a failure can be replayed."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import httpx
import pytest

from mgrpo.config import JobConfig
from mgrpo.workflows import DEEP_RESEARCH, job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart
from services.launcher import LocalCluster
from shared_store import Store
from tests.services.checks import SHORT_JOB, assert_accounted, supervised

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mgrpo"
TOKEN = "chaos-token"
H = {"Authorization": f"Bearer {TOKEN}"}
TRIALS = 5
JOB = {
    **SHORT_JOB,
    "roles": {"planner": {"optim": {"lr": 1e-3}}, "subagent": {"optim": {"lr": 1e-3}}},
}


def job_status(url, job_id):
    """The job's status, riding out the controller's own restart."""
    deadline = time.monotonic() + 120
    while True:
        try:
            r = httpx.get(f"{url}/v1/jobs/{job_id}", headers=H, timeout=10)
            if r.status_code == 200:
                return r.json()
            assert r.status_code == 503, r.text  # the store is restarting
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the controller never came back"
        time.sleep(0.5)


def test_random_kills_lose_no_job_and_no_step(tmp_path):
    cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)
    rng = random.Random(int(os.environ.get("MGRPO_CHAOS_SEED", "17")))
    cluster = LocalCluster(tmp_path, api_token=TOKEN, extra_env={"MGRPO_CACHE_DIR": str(CACHE)})
    with supervised(cluster):
        url, store, killed = cluster.url("controller"), Store.connect(cluster.redis_url), []
        parts = ["planner", "subagent", "controller", "redis"]
        victims = [
            *rng.sample(parts, len(parts)),
            rng.choice(parts),
        ]  # each part at least once, in random order
        for trial in range(TRIALS):
            staleness = rng.choice([0, 1])
            job_id = f"chaos-{trial}"
            r = httpx.post(
                f"{url}/v1/jobs",
                params={"job_id": job_id},
                json={**JOB, "max_staleness": staleness},
                headers=H,
                timeout=30,
            )
            assert r.status_code == 201, r.text
            # somewhere in the job: once it runs, or once the root applied its first step (two steps to
            # go), then a random moment later, while rollouts, an update or a checkpoint run
            at = rng.randrange(JOB["steps"] - 1)
            while (job := job_status(url, job_id))["status"] != "running" or job["steps_done"].get(
                "planner", -1
            ) < at - 1:
                assert job["status"] in ("queued", "running"), job
                time.sleep(0.2)
            time.sleep(rng.uniform(0.0, 0.5))
            assert job_status(url, job_id)["status"] == "running", (
                f"{job_id} ended before its kill: nothing tested"
            )
            victim = victims[trial]
            if victim == "redis":
                cluster.redis.kill()
            else:
                cluster.procs[victim].kill()  # SIGKILL; the supervisor restarts it
            killed.append((job_id, victim))
            deadline = time.monotonic() + 900
            while (job := job_status(url, job_id))["status"] not in ("succeeded", "failed", "cancelled"):
                assert time.monotonic() < deadline, f"{job_id} stuck after killing {victim}: {job}"
                time.sleep(0.5)
            assert job["status"] == "succeeded", (victim, job["reason"])
            marks = sorted((e.role, e.step) for e in store.ledger.entries(job_id))
            assert marks == sorted((r, s) for r in DEEP_RESEARCH.role_names for s in range(JOB["steps"])), (
                victim,
                marks,
            )
            assert_accounted(store, job_id, DEEP_RESEARCH.role_names)
    print(f"chaos: {TRIALS} trials passed; killed {killed}; restarts {cluster.restarts}")


OTHER_JOBS = {  # enough queries that the team's planner delegates a comparison in every step
    "deep_research_team": {
        "workflow": "deep_research_team",
        "steps": 3,
        "prompts_per_step": 5,
        "rollouts_per_query": 4,
    },
    "marsrl": {
        "workflow": "marsrl",
        "steps": 3,
        "prompts_per_step": 2,
        "rollouts_per_query": 4,
        "warmstart_steps": 150,
    },
}


@pytest.mark.parametrize("workflow", sorted(OTHER_JOBS))
def test_a_random_kill_or_stop_on_the_other_workflows_loses_nothing(tmp_path, workflow):
    """The same for a team job and a MarsRL job (three trainers each), where the part hit is killed
    (SIGKILL) or paused (SIGSTOP for 1–4 s, then SIGCONT: a frozen or swapped-out process), both
    seeded: the job succeeds, every step in each role's ledger exactly once, every queue accounted."""
    config = {**OTHER_JOBS[workflow], "partner_timeout_s": 300}
    rng = random.Random(f"{os.environ.get('MGRPO_CHAOS_SEED', '17')}:{workflow}")
    job = job_spec(JobConfig.model_validate(config))
    job.warm_start().build(job.warmstart_config(), CACHE)
    cluster = LocalCluster(
        tmp_path, api_token=TOKEN, roles=job.trainer_roles, extra_env={"MGRPO_CACHE_DIR": str(CACHE)}
    )
    with supervised(cluster):
        url, store = cluster.url("controller"), Store.connect(cluster.redis_url)
        r = httpx.post(f"{url}/v1/jobs", json=config, headers=H, timeout=30)
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        while (state := job_status(url, job_id))["status"] != "running" or state["steps_done"].get(
            job.root, -1
        ) < 0:
            assert state["status"] in ("queued", "running"), state
            time.sleep(0.2)
        victim, how = rng.choice(["controller", "redis", *job.trainer_roles]), rng.choice(["kill", "stop"])
        assert job_status(url, job_id)["status"] == "running", (
            "the job ended before its fault: nothing tested"
        )
        assert cluster.redis is not None and cluster.redis.proc is not None
        pid = cluster.redis.proc.pid if victim == "redis" else cluster.procs[victim].pid
        if how == "kill":
            os.kill(pid, signal.SIGKILL)  # the supervisor restarts it
        else:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(rng.uniform(1.0, 4.0))  # the pause itself, not a wait for something
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 900
        while (state := job_status(url, job_id))["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, f"{job_id} stuck after {how} of {victim}: {state}"
            time.sleep(0.5)
        assert state["status"] == "succeeded", (how, victim, state["reason"])
        marks = sorted((e.role, e.step) for e in store.ledger.entries(job_id))
        assert marks == sorted((r, s) for r in job.trainer_roles for s in range(config["steps"])), (
            how,
            victim,
            marks,
        )
        assert_accounted(store, job_id, job.trainer_roles)
    print(f"chaos {workflow}: {how} of {victim} survived; restarts {cluster.restarts}")
