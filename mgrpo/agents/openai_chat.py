"""The OpenAI chat-completions protocol over a role's chat model, for agent programs written against
the OpenAI API (`POST …/chat/completions`, non-streaming, with `tools`).

One call: the request's messages (and tools) rendered by the model's own chat template, one
sampled assistant turn, its tool calls parsed in the model family's format (`TOOL_PARSERS`) and
returned in OpenAI's `tool_calls` shape. The call's episode is the rendered prompt (loss mask 0) and
exactly the sampled ids (mask 1, their log-probs): what the role's trainer trains on. Whether the
prompt extends the same session's previous call (prompt + completion) id for id is reported
(`ChatSessions`, metric `<role>/chat_prefix_extends`): agent programs resend their history as text, and a template may render it
other than it was sampled.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from mgrpo.agents.chat import TOOL_PARSERS, is_chat_model
from mgrpo.agents.format import FormatError
from mgrpo.engines.base import RolloutEngine, SamplingParams

SESSION = re.compile(r"^(\d{1,7})\.([A-Za-z][A-Za-z0-9_]{0,31})\.(\d{1,4})$")


def session_id(step: int, query_id: str, rollout: int) -> str:
    """The session of one rollout of one query at one step: `<step>.<query_id>.<rollout>`."""
    return f"{step}.{query_id}.{rollout}"


def parse_session(session: str) -> tuple[int, str, int] | None:
    m = SESSION.match(session)
    return None if m is None else (int(m.group(1)), m.group(2), int(m.group(3)))


@dataclass
class ChatCall:
    """What one completion sampled: the episode to record."""

    token_ids: list[int]
    logp: list[float]
    mask: list[int]
    prompt_len: int
    finish_reason: str  # stop | tool_calls | length
    content: str
    last_user: str
    weights_version: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def _for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as HF chat templates take them: `content` a string, tool-call arguments objects."""
    out = []
    for m in messages:
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            m["content"] = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        elif content is None:
            m["content"] = ""
        calls = []
        for c in m.get("tool_calls") or []:
            fn = dict(c.get("function", {}))
            if isinstance(fn.get("arguments"), str):
                with contextlib.suppress(json.JSONDecodeError):
                    fn["arguments"] = json.loads(fn["arguments"])
            calls.append({**c, "function": fn})
        if calls:
            m["tool_calls"] = calls
        out.append(m)
    return out


@dataclass(frozen=True)
class ChatLimits:
    """The caps a service puts on every generation it serves, chat completions included: the rendered
    prompt's tokens, the new tokens, and their sum within the model's context (`max_positions`; None:
    unknown). Each names the setting that raises it."""

    max_prompt_tokens: int = 1024
    max_new_tokens: int = 512
    max_positions: int | None = None


class LimitError(ValueError):
    """A request past one of the service's `ChatLimits` (refused before any generation)."""


def check_limits(n_prompt: int, max_tokens: int, limits: ChatLimits, *, field: str = "max_tokens") -> None:
    """A `LimitError` naming the limit and its setting, unless the request is within every one
    (`field`: the request's name for its new-token budget)."""
    caps = [
        ("prompt", n_prompt, limits.max_prompt_tokens, "MGRPO_MAX_GENERATE_PROMPT_TOKENS"),
        (field, max_tokens, limits.max_new_tokens, "MGRPO_MAX_GENERATE_NEW_TOKENS"),
    ]
    for name, n, cap, setting in caps:
        if n > cap:
            raise LimitError(f"{name}: {n} tokens, over this service's limit of {cap} ({setting})")
    if limits.max_positions is not None and n_prompt + max_tokens > limits.max_positions:
        raise LimitError(
            f"prompt ({n_prompt} tokens) + {field} ({max_tokens}) exceed the model's context of "
            f"{limits.max_positions} tokens; shorten one"
        )


def complete(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    temperature: float,
    max_tokens: int,
    parser: str = "hermes",
    limits: ChatLimits | None = None,
) -> ChatCall:
    """One assistant turn of a chat model on OpenAI-style messages (within `limits`: checked on the
    rendered prompt, before any generation)."""
    if not is_chat_model(tokenizer):
        raise ValueError("this role's model has no chat template: serve a chat model (roles.<r>.model.path)")
    msgs = _for_template(messages)
    schemas: list[dict[Any, Any] | Callable[..., Any]] | None = list(tools) if tools else None
    text = tokenizer.apply_chat_template(msgs, tools=schemas, add_generation_prompt=True, tokenize=False)
    prompt = list(tokenizer.encode(str(text), add_special_tokens=False))
    if limits is not None:
        check_limits(len(prompt), max_tokens, limits)
    (s,) = engine.generate(
        [prompt], SamplingParams(max_tokens, temperature, stop_token_ids=(int(tokenizer.eos_token_id),))
    )
    body = str(tokenizer.decode(s.token_ids, skip_special_tokens=False)).removesuffix(
        str(tokenizer.eos_token)
    )
    try:
        content, calls = TOOL_PARSERS[parser](body)
    except FormatError:
        content, calls = body, []  # a malformed call is returned as text, as inference servers do
    tool_calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]
    finish = "length" if s.finish_reason != "stop" else "tool_calls" if calls else "stop"
    last_user = next((str(m["content"]) for m in reversed(msgs) if m.get("role") == "user"), "")
    return ChatCall(
        prompt + s.token_ids,
        [0.0] * len(prompt) + s.logprobs,
        [0] * len(prompt) + [1] * len(s.token_ids),
        len(prompt),
        finish,
        content,
        last_user,
        s.weights_version,
        tool_calls,
    )


def response(call: ChatCall, model: str) -> dict[str, Any]:
    """The OpenAI `chat.completion` object of a call."""
    message: dict[str, Any] = {"role": "assistant", "content": call.content or None}
    if call.tool_calls:
        message["tool_calls"] = call.tool_calls
    completion = len(call.token_ids) - call.prompt_len
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": call.finish_reason}],
        "usage": {
            "prompt_tokens": call.prompt_len,
            "completion_tokens": completion,
            "total_tokens": call.prompt_len + completion,
        },
    }


class ChatSessions:
    """One role service's view of its sessions (thread-safe): each call's index in its session, and
    whether its prompt extends the session's previous call id for id (the counts are step metrics)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, int] = {}
        self._last: dict[str, list[int]] = {}
        self._checked = [0, 0]  # later calls, of which extending the previous one

    def record(self, session: str, call: ChatCall) -> int:
        """The call's index in its session (0, 1, …), noting whether it extends the previous call."""
        with self._lock:
            n = self._calls.get(session, 0)
            self._calls[session] = n + 1
            prev = self._last.get(session)
            if prev is not None:
                self._checked[0] += 1
                self._checked[1] += call.token_ids[: len(prev)] == prev
            self._last[session] = call.token_ids
        return n

    def take_counts(self) -> dict[str, float]:
        with self._lock:
            (later, extends), self._checked = self._checked, [0, 0]
        return {
            "chat_calls_after_first": float(later),
            "chat_prefix_extends": extends / later if later else 1.0,
        }


Record = Callable[[int, str, int, int, ChatCall], None]  # (step, query_id, rollout, call index, call)


def serve(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    role: str,
    sessions: ChatSessions,
    session: str | None,
    body: dict[str, Any],
    *,
    max_tokens: int,
    parser: str,
    record: Record,
    limits: ChatLimits | None = None,
) -> dict[str, Any]:
    """One chat completion with a role's current policy (the `chat.completion` object); `record`ed as
    an episode when it belongs to a session (`<step>.<query>.<rollout>`). A request past `limits` is a
    `LimitError` before any generation."""
    call = complete(
        engine,
        tokenizer,
        body["messages"],
        body.get("tools"),
        temperature=body.get("temperature", 1.0),
        max_tokens=body.get("max_tokens") or max_tokens,
        parser=parser,
        limits=limits,
    )
    parsed = parse_session(session) if session else None
    if parsed is not None and session is not None:
        step, query_id, rollout = parsed
        record(step, query_id, rollout, sessions.record(session, call), call)
    return response(call, role)
