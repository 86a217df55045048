"""openai_agents' pure parts: session and episode ids, each role's calls per rollout in call order,
outcome rewards per slot, and one OpenAI-style completion (tool calls in OpenAI's shape; the recorded
ids are the rendered prompt, then exactly the sampled ids)."""

from __future__ import annotations

import json
import math

from mgrpo.agents.openai_chat import ChatSessions, complete, parse_session, response, session_id
from mgrpo.records import Transcript
from mgrpo.workflows.deep_research import CalleeQuery, Episode, aligned_samples, outcome_reward
from mgrpo.workflows.openai_agents import Call, calls_per_rollout, program_query
from shared_store.keys import EpisodeKey, episode_id, parse_episode_id
from tests.mgrpo.chat_models import chat_tokenizer
from tests.mgrpo.test_chat import ScriptedEngine


def test_ids():
    assert parse_session(session_id(3, "q1", 2)) == (3, "q1", 2) and parse_session("3.q1") is None
    eid = episode_id(3, program_query("q1", "searcher"), 2, 0)
    key = parse_episode_id(eid)
    assert key == EpisodeKey(3, "q1.searcher", 2, 0) and parse_episode_id("x-r1") is None
    assert Call.of(eid, key.query_id, key.rollout, key.call) == Call(eid, "q1", "searcher", 2, 0)
    assert Call.of(episode_id(3, "q1", 2, 0), "q1", 2, 0) is None  # not a program call
    calls = []
    for q in ("q0", "q1"):
        for r in ("planner", "searcher"):
            for k in range(2):
                for n in (10, 2, 0):
                    e = episode_id(0, program_query(q, r), k, n)
                    k_ = parse_episode_id(e)
                    calls.append(Call.of(e, k_.query_id, k_.rollout, k_.call))
    assert calls_per_rollout(calls, "searcher", "q1", 2) == [
        [episode_id(0, "q1.searcher", k, n) for n in (0, 2, 10)] for k in range(2)
    ]  # call order, not text order


def test_outcome_rewards_per_slot():
    ep = Episode(Transcript([1, 2], [0.0, -1.0], [0, 1], 1), False, math.nan)
    samples, empty = aligned_samples(
        "searcher",
        [CalleeQuery("q0", [["a"], ["b"]], [1.0, 0.0])],
        slots=1,
        mode="none",
        seed_of=lambda _q: 0,
        fetch=lambda ids: dict.fromkeys(ids, ep),
        reward=outcome_reward,
    )
    assert [s.reward for s in samples] == [1.0, 0.0] and {s.group for s in samples} == {"q0"} and empty == 0


def test_a_completion_in_openai_shape():
    tok = chat_tokenizer()
    engine = ScriptedEngine(
        tok, ['<tool_call>{"name": "search", "arguments": {"query": "Kir"}}</tool_call>', "Lotham"]
    )
    messages = [{"role": "user", "content": "Where was Kir born?"}]
    call = complete(engine, tok, messages, None, temperature=1.0, max_tokens=64)
    assert call.finish_reason == "tool_calls" and json.loads(call.tool_calls[0]["function"]["arguments"]) == {
        "query": "Kir"
    }
    assert call.token_ids[: call.prompt_len] == engine.prompts[0]
    assert call.mask == [0] * call.prompt_len + [1] * (len(call.token_ids) - call.prompt_len)
    body = response(call, "searcher")
    assert (
        body["object"] == "chat.completion"
        and body["choices"][0]["message"]["tool_calls"][0]["type"] == "function"
    )
    sessions = ChatSessions()
    assert sessions.record("0.q0.0", call) == 0
    follow = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": call.tool_calls},
        {"role": "tool", "tool_call_id": call.tool_calls[0]["id"], "content": "d1 Kir"},
    ]
    second = complete(engine, tok, follow, None, temperature=1.0, max_tokens=64)
    assert second.content == "Lotham" and second.finish_reason == "stop"
    assert sessions.record("0.q0.0", second) == 1
    # the program resent its history as text: the template renders the assistant turn other than it was sampled
    assert sessions.take_counts() == {"chat_calls_after_first": 1.0, "chat_prefix_extends": 0.0}
