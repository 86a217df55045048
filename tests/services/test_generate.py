"""`POST /v1/generate` on a trainer's running job: the caps on prompt and new tokens, and the model's
context; the chat routes' capability check (Redis is real). The routes are mounted on an app of their own (FastAPI's TestClient, in process) over a real
tiny model and its real `hf` engine: a live job's engine is busy with rollouts, which would make the
timing checks race; the routes are the same functions the trainer services mount."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from mgrpo.engines.hf import HFEngine
from mgrpo.models import build_model, train_tokenizer
from services.common import install_common
from services.generate import add_chat_routes, add_policy_routes
from services.settings import Settings
from shared_store import Store

TEXTS = ["Ada Nuth was born in Dodus in 1984. Nuth works for Cougeith Corp."] * 20


@pytest.fixture(scope="module")
def client():
    tok = train_tokenizer(TEXTS, 300)
    model = build_model("tiny", tok, seed=0, max_positions=256)
    engine = HFEngine(model, tok)
    job = SimpleNamespace(
        job_id="j", version=3, model=SimpleNamespace(engine=engine, tokenizer=tok, model=model)
    )
    app = FastAPI()
    install_common(app, "planner")
    add_policy_routes(app, "planner", lambda _request: job)
    app.state.settings = Settings(api_token="", max_generate_prompt_tokens=64, max_generate_new_tokens=32)
    with TestClient(app) as c:
        yield c
    engine.close()


def test_a_prompt_within_the_caps_generates(client):
    r = client.post("/v1/generate", json={"prompt": "Ada Nuth was", "max_new_tokens": 8, "seed": 1})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["policy_version"] == 3 and 1 <= len(out["token_ids"]) <= 8
    assert len(out["logprobs"]) == len(out["token_ids"])


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"prompt": "Ada Nuth was born " * 40, "max_new_tokens": 8}, "MGRPO_MAX_GENERATE_PROMPT_TOKENS"),
        ({"prompt": "Ada", "max_new_tokens": 33}, "MGRPO_MAX_GENERATE_NEW_TOKENS"),
    ],
    ids=["long-prompt", "many-new-tokens"],
)
def test_over_a_cap_is_a_fast_422_naming_the_setting(client, body, says):
    t0 = time.perf_counter()
    r = client.post("/v1/generate", json=body)
    assert r.status_code == 422, r.text
    assert says in r.json()["detail"]
    assert time.perf_counter() - t0 < 1.0  # refused before any forward pass


def test_a_seed_beyond_the_bound_is_a_422(client):
    r = client.post("/v1/generate", json={"prompt": "Ada", "max_new_tokens": 2, "seed": 10**30})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "seed"], r.text


def test_prompt_and_budget_beyond_the_context_is_a_422(client):
    client.app.state.settings = Settings(
        api_token="", max_generate_prompt_tokens=10_000, max_generate_new_tokens=10_000
    )
    try:
        r = client.post("/v1/generate", json={"prompt": "Ada Nuth was born " * 20, "max_new_tokens": 200})
    finally:
        client.app.state.settings = Settings(
            api_token="", max_generate_prompt_tokens=64, max_generate_new_tokens=32
        )
    assert r.status_code == 422, r.text
    assert "context of 256 tokens" in r.json()["detail"]


@pytest.fixture
def chat_app(redis_url, job_id):
    """The chat routes over a job that records every call it serves, and a real Redis for capabilities."""
    store = Store.connect(redis_url)
    store.capabilities.issue_secret(job_id)
    served = []
    job = SimpleNamespace(
        job_id=job_id,
        store=store,
        chat_completion=lambda session, body, limits: served.append(session) or {"object": "chat.completion"},
    )
    app = FastAPI()
    install_common(app, "searcher")
    add_chat_routes(app, "searcher", lambda _request: job)
    app.state.settings = Settings(api_token="admin")
    with TestClient(app) as c:
        yield c, store, served


def test_a_session_call_needs_its_rollouts_capability(chat_app, job_id):
    """The agent program's API key is its run's capability: a user's admin token, or another run's
    capability, records nothing."""
    client, store, served = chat_app
    msg = {"messages": [{"role": "user", "content": "hi"}]}
    own = store.capabilities.sign(job_id, 2, "q7", 1)
    other = store.capabilities.sign(job_id, 2, "q7", 0)
    for token in ("admin", other):
        r = client.post(
            "/v1/s/2.q7.1/chat/completions", json=msg, headers={"Authorization": f"Bearer {token}"}
        )
        assert r.status_code == 403 and "capability" in r.json()["detail"], r.text
        r = client.post(
            "/v1/chat/completions",
            json={**msg, "user": "2.q7.1"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 403, r.text
    assert served == []
    r = client.post("/v1/s/2.q7.1/chat/completions", json=msg, headers={"Authorization": f"Bearer {own}"})
    assert r.status_code == 200 and served == ["2.q7.1"]
    r = client.post("/v1/chat/completions", json=msg, headers={"Authorization": f"Bearer {own}"})
    assert r.status_code == 401  # outside a session a capability is no token
    r = client.post("/v1/chat/completions", json=msg, headers={"Authorization": "Bearer admin"})
    assert r.status_code == 200 and served == ["2.q7.1", None]


@pytest.fixture(scope="module")
def chat_served(tmp_path_factory):
    """The chat routes over a real chat model serving completions through its real `hf` engine."""
    from mgrpo.agents.openai_chat import ChatSessions, serve
    from mgrpo.models import load
    from tests.mgrpo.chat_models import chat_model_folder

    model, tok = load(chat_model_folder(tmp_path_factory.mktemp("chat") / "m"))
    engine = HFEngine(model, tok)
    sessions = ChatSessions()

    def complete(session, body, limits):
        return serve(engine, tok, "searcher", sessions, session, body, max_tokens=8, parser="hermes",
                     record=lambda *_: None, limits=limits)  # fmt: skip  # one call, its arguments

    job = SimpleNamespace(job_id="j", chat_completion=complete, model=SimpleNamespace(model=model))
    app = FastAPI()
    install_common(app, "searcher")
    add_chat_routes(app, "searcher", lambda _request: job)
    app.state.settings = Settings(api_token="", max_generate_prompt_tokens=256, max_generate_new_tokens=32)
    with TestClient(app) as c:
        yield c
    engine.close()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            {"messages": [{"role": "user", "content": "Ada Nuth was born " * 1200}]},
            "MGRPO_MAX_GENERATE_PROMPT_TOKENS",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8192},
            "MGRPO_MAX_GENERATE_NEW_TOKENS",
        ),
    ],
    ids=["20k-characters", "8192-new-tokens"],
)
def test_chat_completions_take_the_same_limits_as_generate(chat_served, body, says):
    """A 20k-character message (once 120 s of prefill on a 1,024-token model) and a budget past the cap
    are a 422 naming the setting before any generation; a small request is served."""
    t0 = time.perf_counter()
    r = chat_served.post("/v1/chat/completions", json=body)
    assert r.status_code == 422 and says in r.json()["detail"], r.text
    assert time.perf_counter() - t0 < 1.0
    ok = chat_served.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 4, ok.text


def test_the_status_codes_say_what_happened(chat_app):
    """A session's call without a token is a 401 (it once was a 409); with no job running, generation
    and chat are a 503 to retry (the README's promise), not a 409."""
    client, _, served = chat_app
    r = client.post("/v1/s/2.q7.1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401 and "capability" in r.json()["detail"], r.text
    idle = FastAPI()
    install_common(idle, "planner")
    add_policy_routes(idle, "planner", lambda _request: None)
    idle.state.settings = Settings(api_token="")
    with TestClient(idle) as c:
        for path, body in (
            ("/v1/generate", {"prompt": "Ada"}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ):
            r = c.post(path, json=body)
            assert r.status_code == 503 and r.headers.get("retry-after"), (path, r.text)
    assert served == []
