"""Validation at the edge, against a real controller process and a real Redis (API-only: nothing
trains): NaN and Infinity, a 10 MB string, an unknown preset, an oversized job and a job id of
dots each get a short 422 naming the field, never a 500, and nothing is stored."""

from __future__ import annotations

import pytest

from shared_store import Store
from tests.services.checks import api_only

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(300)]
TOKEN = "edge-token"
H = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
JOB = '{"steps": 2, "prompts_per_step": 2, "rollouts_per_query": 4, %s}'
# an agent program job whose program is any importable callable: a shell on the trainer if it ran
PROGRAM = (
    '{"workflow": "openai_agents", "program": {"entry_point": "%s"}, "roles": {'
    + ", ".join(f'"{r}": {{"model": {{"path": "/models/{r}"}}}}' for r in ("planner", "searcher", "comparer"))
    + "}}"
)


@pytest.fixture(scope="module")
def api(redis_url, tmp_path_factory):
    with api_only(
        tmp_path_factory.mktemp("edge"),
        redis_url,
        TOKEN,
        MGRPO_MAX_JOB_ROLLOUTS="5000",
        MGRPO_MAX_CONTEXT_TOKENS="2048",
    ) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "loc", "says"),
    [
        (
            JOB % '"roles": {"planner": {"optim": {"lr": NaN}}}',
            ["body", "roles", "planner", "optim", "lr"],
            "finite",
        ),
        (
            JOB % '"roles": {"planner": {"optim": {"lr": Infinity}}}',
            ["body", "roles", "planner", "optim", "lr"],
            "finite",
        ),
        (
            JOB % '"reward": {"kind": "numeric", "numeric_rel_tol": -Infinity}',
            ["body", "reward", "numeric_rel_tol"],
            "finite",
        ),
        (
            JOB % ('"roles": {"planner": {"model": {"preset": "%s"}}}' % ("x" * 10_000_000)),
            ["body", "roles", "planner", "model", "preset"],
            "at most 32",
        ),
        (
            JOB % '"roles": {"subagent": {"model": {"preset": "huge"}}}',
            ["body", "roles", "subagent", "model"],
            "unknown preset 'huge'",
        ),
        (
            '{"steps": 20, "prompts_per_step": 8, "rollouts_per_query": 64}',
            ["body", "steps"],
            "MGRPO_MAX_JOB_ROLLOUTS",
        ),
        (
            JOB % '"roles": {"subagent": {"model": {"preset": "tiny-wide", "max_context_tokens": 4096}}}',
            ["body", "roles", "subagent", "model", "max_context_tokens"],
            "MGRPO_MAX_CONTEXT_TOKENS",
        ),
        (JOB % '"seed": 1000000000000000000000000000000', ["body", "seed"], "less than or equal"),
        (PROGRAM % "os:system", ["body", "program", "entry_point"], "MGRPO_ALLOWED_PROGRAMS"),
        (PROGRAM % "pty:spawn", ["body", "program", "entry_point"], "not a program this cluster runs"),
    ],
    ids=[
        "nan",
        "infinity",
        "minus-infinity",
        "10MB-string",
        "unknown-preset",
        "oversized",
        "long-context",
        "huge-seed",
        "os-system",
        "pty-spawn",
    ],
)
def test_a_bad_job_is_a_short_422_and_stores_nothing(api, redis_url, body, loc, says):
    before = Store.connect(redis_url).jobs.list(limit=1)[1]
    r = api.post("/v1/jobs", content=body, headers=H)
    assert r.status_code == 422, r.text[:500]
    (error,) = r.json()["detail"]
    assert error["loc"] == loc and says in error["msg"], error
    assert len(r.content) < 2000  # the input is echoed cut, not 10 MB
    assert Store.connect(redis_url).jobs.list(limit=1)[1] == before


@pytest.mark.parametrize("job_id", ["..", "...", "."])
def test_a_job_id_of_dots_is_refused(api, redis_url, job_id):
    """It would name the checkpoints' parent folder (`<volume>/<role>/..`)."""
    before = Store.connect(redis_url).jobs.list(limit=1)[1]
    r = api.post("/v1/jobs", params={"job_id": job_id}, content=JOB % '"seed": 1', headers=H)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "job_id"], r.text
    assert Store.connect(redis_url).jobs.list(limit=1)[1] == before


def test_a_job_within_the_limit_is_taken(api):
    r = api.post("/v1/jobs", params={"job_id": "a.b-1"}, content=JOB % '"seed": 2', headers=H)  # 16 rollouts
    assert r.status_code == 201 and r.json()["job_id"] == "a.b-1", r.text
