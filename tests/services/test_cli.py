"""The `mgrpo` CLI run as a real process (python -m services.cli), against the test Redis."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared_store import Store, keys
from shared_store.schemas import AlignedBatchManifest
from shared_store.streams import get_step

ROOT = Path(__file__).resolve().parents[2]


def mgrpo(*args, env=None, timeout=240, cwd=None, drop=()):
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in drop}
    full_env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)  # fmt: skip


def test_demo_with_embedded_redis_and_relative_run_dir(tmp_path):
    """The README's first command path: no REDIS_URL, so the demo starts its own redis-server."""
    proc = mgrpo("demo", "--steps", "2", "--run-dir", "out", cwd=tmp_path, drop=("REDIS_URL",))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "embedded Redis" in proc.stdout
    assert len((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.redis
def test_demo_trains_both_policies_through_redis(redis_url, tmp_path):
    proc = mgrpo("demo", "--steps", "30", "--run-dir", str(tmp_path), env={"REDIS_URL": redis_url})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(30))
    first = sum(r["planner/success"] for r in rows[:6]) / 6
    last = sum(r["planner/success"] for r in rows[-6:]) / 6
    assert last > first + 0.2, (first, last)  # both policies learn: uniform start is ~0.44
    assert (tmp_path / "rewards.png").stat().st_size > 5_000

    store = Store.connect(redis_url)
    job = next(j for j in store.jobs.list(limit=50)[0] if j.config.get("kind") == "toy-demo")
    assert job.status == "succeeded"
    ledger = store.ledger.entries(job.job_id)
    assert sorted((e.role, e.step) for e in ledger) == sorted((r, s) for r in keys.ROLES for s in range(30))
    manifest = get_step(store.client, AlignedBatchManifest, job.job_id, "manifests", 29)
    assert manifest is not None
    for q in manifest.queries:
        assert [len(s) for s in q.slots] == [manifest.slots_per_rollout] * 8  # K·D aligned samples
    assert store.episodes.step_ids(job.job_id, 0) == []  # old steps were garbage-collected


def test_unreachable_redis_is_a_clean_cli_error(tmp_path):
    proc = mgrpo(
        "demo",
        "--steps",
        "1",
        "--redis-wait-s",
        "1",
        "--run-dir",
        str(tmp_path),
        env={"REDIS_URL": "redis://:pw@127.0.0.1:1/0"},
    )
    assert proc.returncode == 2
    assert "cannot reach Redis" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    assert ":pw@" not in proc.stdout


def test_bad_option_is_a_usage_error(tmp_path):
    proc = mgrpo("demo", "--steps", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
