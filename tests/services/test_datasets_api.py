"""`/v1/datasets` and a job's `dataset` against a real controller process and a real Redis: good
uploads are stored once (content-addressed), bad ones get a 4xx naming the problem and store nothing,
and a job naming a dataset or split that is not there gets a 422 naming the field. API-only services
(no job workers): nothing trains here; `e2e/test_yours.py` trains on an uploaded dataset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared_store import Store, keys
from tests.services.checks import api_only

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "data-token"
H = {"Authorization": f"Bearer {TOKEN}"}
ROWS = [
    {"query": f"Where was P{i} born?", "answer": f"C{i}", "split": "train" if i < 6 else "test"}
    for i in range(8)
]


def jsonl(rows):
    return "\n".join(json.dumps(r) for r in rows).encode()


@pytest.fixture(scope="module")
def api(redis_url, tmp_path_factory):
    with api_only(
        tmp_path_factory.mktemp("data"), redis_url, TOKEN, MGRPO_MAX_DATASET_BYTES="4000"
    ) as client:
        yield client


def stored(redis_url):
    return {k for k in Store.connect(redis_url).client.scan_iter(f"{keys.PREFIX}:dataset*")}


def test_upload_list_get(api):
    r = api.post("/v1/datasets", content=jsonl(ROWS), params={"name": "people"}, headers=H)
    assert r.status_code in (200, 201), r.text  # 200 when an earlier run of the module stored it
    d = r.json()
    assert d["dataset_id"].startswith("ds-") and d["rows"] == 8 and d["splits"] == {"test": 2, "train": 6}
    again = api.post("/v1/datasets", content=jsonl(ROWS), headers=H)
    assert (
        again.status_code == 200
        and again.json()["dataset_id"] == d["dataset_id"]
        and not again.json()["created"]
    )
    assert api.get("/v1/datasets").status_code == 401  # reads need a token (read or admin)
    assert d["dataset_id"] in [x["dataset_id"] for x in api.get("/v1/datasets", headers=H).json()["datasets"]]
    assert api.get(f"/v1/datasets/{d['dataset_id']}", headers=H).json()["rows"] == 8
    assert api.get("/v1/datasets/ds-0000000000000000", headers=H).status_code == 404
    assert api.get("/v1/datasets/..%2F..", headers=H).status_code == 404


def test_cli_upload_and_list(api, tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_bytes(jsonl(ROWS[:5]))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MGRPO_CONTROLLER_URL": str(api.base_url),
        "MGRPO_API_TOKEN": TOKEN,
    }

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "services.cli", "dataset", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    up = cli("upload", str(path))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "5 rows (train 5)" in up.stdout and "ds-" in up.stdout
    listed = cli("list")
    assert "mine.jsonl" in listed.stdout
    path.write_bytes(jsonl([{"query": "q"}]))
    bad = cli("upload", str(path))
    assert (
        bad.returncode == 2
        and "row 1: field 'answer'" in " ".join(bad.stdout.split())
        and "Traceback" not in bad.stdout + bad.stderr
    )


def test_upload_needs_the_token(api):
    assert api.post("/v1/datasets", content=jsonl(ROWS)).status_code == 401


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        (jsonl([*ROWS[:3], {"query": "q"}, *ROWS[3:]]), 422, "row 4: field 'answer'"),
        (jsonl([{"question": "q", "answer": "a"}]), 422, "row 1: field"),
        (b"", 422, "empty"),
        (b"\xff\xfe\x00binary\x00", 422, "neither UTF-8 JSONL nor Parquet"),
        (jsonl(ROWS * 20), 413, "larger than 4000 bytes"),
    ],
)
def test_bad_uploads_store_nothing(api, redis_url, body, code, says):
    before = stored(redis_url)
    r = api.post("/v1/datasets", content=body, headers=H)
    assert r.status_code == code and says in r.json()["detail"], r.text
    assert stored(redis_url) == before


def test_a_job_must_name_a_dataset_and_splits_that_exist(api, tmp_path):
    ds = api.post("/v1/datasets", content=jsonl(ROWS), headers=H).json()["dataset_id"]
    path = tmp_path / "d.jsonl"
    path.write_bytes(jsonl(ROWS))
    cases = [
        (
            {"source": "ds-0123456789abcdef"},
            ["body", "dataset", "source"],
            "upload it with POST /v1/datasets",
        ),
        ({"source": ds, "eval_split": "dev"}, ["body", "dataset", "eval_split"], "no split 'dev'"),
        ({"source": ds, "train_split": "all"}, ["body", "dataset", "train_split"], "no split 'all'"),
        ({"source": f"file://{tmp_path}/none.jsonl"}, ["body", "dataset", "source"], "no such file"),
        ({"source": "not a source"}, ["body", "dataset", "source"], "should match pattern"),
    ]
    for dataset, loc, says in cases:
        r = api.post("/v1/jobs", json={"dataset": dataset}, headers=H)
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        assert err["loc"] == loc and says in err["msg"], err
    for reward, loc, says in (
        ({"kind": "oracle"}, ["body", "reward", "kind"], "'judge'"),
        ({"kind": "judge"}, ["body", "reward"], "judge_path"),
    ):
        bad_reward = api.post("/v1/jobs", json={"dataset": {"source": ds}, "reward": reward}, headers=H)
        assert bad_reward.status_code == 422, bad_reward.text
        (err,) = bad_reward.json()["detail"]
        assert err["loc"] == loc and says in err["msg"], err
    for source in (ds, f"file://{path}"):
        ok = api.post("/v1/jobs", json={"dataset": {"source": source}, "steps": 1}, headers=H)
        assert ok.status_code == 201 and ok.json()["config"]["dataset"]["source"] == source


def test_a_large_upload_does_not_stall_other_requests(tmp_path):
    """A 60 MB upload is parsed, hashed and stored off the controller's event loop: a GET timed every
    50 ms meanwhile stays fast (it once waited 20 s). Prints the GETs' p50 and p99."""
    import threading
    import time

    import httpx

    from services.launcher import LocalCluster

    row = (
        '{"query": "Where was Person %07d born, and in which year?", "answer": "City %07d", "split": "train"}'
    )
    body = "\n".join(row % (i, i) for i in range(600_000)).encode()
    assert len(body) > 60_000_000
    with LocalCluster(tmp_path, api_token=TOKEN, roles=()) as cluster:  # a Redis of its own: 60 MB
        url, done, latencies = cluster.url("controller"), threading.Event(), []
        result: dict[str, httpx.Response] = {}

        def upload():
            result["r"] = httpx.post(f"{url}/v1/datasets", content=body, headers=H, timeout=300)
            done.set()

        uploader = threading.Thread(target=upload)
        uploader.start()
        with httpx.Client(base_url=url, headers=H, timeout=60) as http:
            while not done.wait(0.05):
                t0 = time.perf_counter()
                assert http.get("/v1/datasets").status_code == 200
                latencies.append(time.perf_counter() - t0)
        uploader.join()
    assert result["r"].status_code in (200, 201), result["r"].text[:300]
    latencies.sort()
    p50, p99 = latencies[len(latencies) // 2], latencies[int(0.99 * (len(latencies) - 1))]
    print(
        f"GET /v1/datasets during a 60 MB upload: {len(latencies)} requests, p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms"
    )
    assert len(latencies) >= 10 and p99 < 1.0, (len(latencies), p50, p99)
