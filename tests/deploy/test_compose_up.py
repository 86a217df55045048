"""`docker compose up` for real: build the image, start Redis, the controller and both trainers as
containers, submit a short job over REST, see it succeed, take it all down; then the same with the
`ranks` profile, whose sub-agent trains on two ranks inside its container.

Runs where a Docker engine answers (`docker info`) and the base and Redis images can be had; skipped
with the reason otherwise (`make test` starts no engine; `make compose-test` does: it installs
Debian's docker.io, starts dockerd, and builds the images offline with
`tests/deploy/offline_images.sh`, since no image registry is reachable on these machines)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from shared_store.embedded import free_port

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "compose-token"
H = {"Authorization": f"Bearer {TOKEN}"}
JOB = {
    "steps": 1,
    "prompts_per_step": 1,
    "rollouts_per_query": 2,
    "subagent_slots_per_rollout": 1,
    "warmstart_steps": 5,
    "partner_timeout_s": 600,
}


def run(
    *cmd: str, env: dict[str, str] | None = None, timeout: float = 1200
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def available(image: str) -> bool:
    return (
        run("docker", "image", "inspect", image).returncode == 0
        or run("docker", "pull", image).returncode == 0
    )


@pytest.fixture(scope="module")
def env():
    if shutil.which("docker") is None or shutil.which("docker-compose") is None:
        pytest.skip("no docker / docker-compose binaries (make compose-test installs them)")
    if run("docker", "info", timeout=30).returncode != 0:
        pytest.skip("no Docker engine answers `docker info` (make compose-test starts one)")
    offline = "mgrpo-base:bookworm"  # tests/deploy/offline_images.sh's, when it ran here
    fallback = run("docker", "image", "inspect", offline).returncode == 0
    base = os.environ.get("MGRPO_BASE_IMAGE", offline if fallback else "python:3.11-slim")
    redis_image = os.environ.get("MGRPO_REDIS_IMAGE", offline if fallback else "redis:7-alpine")
    for image in (base, redis_image):
        if not available(image):
            pytest.skip(
                f"image {image} is neither here nor pullable: tests/deploy/offline_images.sh builds one"
            )
    return {
        **os.environ,
        "MGRPO_API_TOKEN": TOKEN,
        "MGRPO_SERVICE_TOKEN": "compose-service",
        "MGRPO_BASE_IMAGE": base,
        "MGRPO_REDIS_IMAGE": redis_image,
        "MGRPO_PORT": str(free_port()),
    }


@pytest.fixture(scope="module")
def built(env):
    """Seconds to build the image (once for both stacks)."""
    t0 = time.monotonic()
    compose = ["docker-compose", "-f", "docker-compose.yml"]
    out = run(*compose, "build", "controller", env={**env, "DOCKER_BUILDKIT": "0"}, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return time.monotonic() - t0


# the default stack, and the `ranks` profile's: its sub-agent on 2 ranks (torchrun in its container)
STACKS = {
    "default": ([], []),
    "ranks": (["--profile", "ranks"], ["--scale", "planner=0", "--scale", "subagent=0"]),
}


@pytest.mark.parametrize("stack", STACKS)
def test_compose_up_runs_a_job_and_comes_down(env, built, stack):
    profile, scale = STACKS[stack]
    compose = [
        "docker-compose",
        "-p",
        f"mgrpotest{stack}{env['MGRPO_PORT']}",
        "-f",
        "docker-compose.yml",
        *profile,
    ]
    t0 = time.monotonic()
    try:
        up = run(*compose, "up", "-d", *scale, env=env, timeout=900)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        url = f"http://127.0.0.1:{env['MGRPO_PORT']}"
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, run(*compose, "logs", "--tail", "50", env=env).stdout[-4000:]
            time.sleep(1)
        up_s = time.monotonic() - t0
        r = httpx.post(f"{url}/v1/jobs", json=JOB, headers=H, timeout=30)
        assert r.status_code == 201, r.text
        job_id, deadline = r.json()["job_id"], time.monotonic() + 1200
        while (job := httpx.get(f"{url}/v1/jobs/{job_id}", headers=H, timeout=30).json())["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, (
                job,
                run(*compose, "logs", "--tail", "80", env=env).stdout[-6000:],
            )
            time.sleep(2)
        assert job["status"] == "succeeded", (
            job["reason"],
            run(*compose, "logs", "--tail", "80", env=env).stdout[-6000:],
        )
        assert job["steps_done"] == {"planner": 0, "subagent": 0}  # both trainers applied the step
        if stack == "ranks":  # the sub-agent's container runs its two ranks
            top = run(*compose, "top", "subagent-ranks", env=env).stdout
            assert top.count("services.cli serve subagent") >= 3, top  # torchrun's agent and its 2 ranks
        print(
            f"compose ({stack}): image built in {built:.0f} s, up and ready {up_s:.0f} s, job {time.monotonic() - t0 - up_s:.0f} s"
        )
    finally:
        down = run(*compose, "down", "-v", env=env, timeout=300)
    assert down.returncode == 0, down.stderr[-2000:]
    assert run(*compose, "ps", "-q", env=env).stdout.strip() == ""
