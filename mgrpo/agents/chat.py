"""Chat models: an agent turn loop over any HF causal LM whose tokenizer has a chat template.

The prompt is the tokenizer's own chat template (`apply_chat_template`, with the role's tool
schemas); the model's tool calls are parsed in its family's format (`TOOL_PARSERS`: Qwen/Hermes
`<tool_call>{"name": …, "arguments": {…}}</tool_call>`; `register_tool_parser` adds others); thinking
(`<think>…</think>`) is kept in the transcript and kept or stripped from the answer per role.

Token-exact trajectories: the loop is `run_agent`'s, so the context only ever grows by the model's
own sampled ids and the environment's inserted ids — a turn is never re-tokenised. The inserted ids
of a tool result are the template's text between the end of a sampled assistant turn and the next
generation prompt: the difference of two renderings that share one placeholder assistant message,
so nothing the model sampled is rendered again. `retokenize_drift` reports whether re-rendering the
finished conversation would have produced other ids than the ones trained (it often does: BPE merges
across turn boundaries, templates that drop earlier thinking) — reported, never used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from mgrpo.agents.format import FormatError
from mgrpo.agents.loop import run_agent
from mgrpo.engines.base import RolloutEngine, SamplingParams
from mgrpo.records import Action, Transcript

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S)
_PLACEHOLDER = "\u2063mgrpo-turn\u2063"  # an assistant message no model writes


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """(content outside the calls, the calls) of a Qwen/Hermes-format turn; FormatError if a call is
    not a JSON object with a string `name` and an object `arguments`."""
    calls = []
    for body in _HERMES.findall(text):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            raise FormatError(f"a <tool_call> that is not JSON: {body[:80]!r}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise FormatError(f"a <tool_call> without a string 'name': {body[:80]!r}")
        args = obj.get("arguments", {})
        if not isinstance(args, dict):
            raise FormatError(f"a <tool_call> whose 'arguments' is not an object: {body[:80]!r}")
        calls.append(ToolCall(obj["name"], args))
    return _HERMES.sub("", text).strip(), calls


TOOL_PARSERS: dict[str, Callable[[str], tuple[str, list[ToolCall]]]] = {"hermes": parse_hermes}


def register_tool_parser(name: str, parser: Callable[[str], tuple[str, list[ToolCall]]]) -> None:
    """Add a model family's tool-call format (a function: turn text → (content, calls))."""
    TOOL_PARSERS[name] = parser


def is_chat_model(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def tool_schema(name: str, description: str, param: str = "argument") -> dict[str, Any]:
    """An OpenAI-style function schema with one string parameter (what every mgrpo tool takes)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {param: {"type": "string"}}, "required": [param]},
        },
    }


class ChatFormat:
    """One chat template's environment side: prompt ids, inserted tool-result ids, turn parsing."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        tools: list[dict[str, Any]],
        *,
        parser: str = "hermes",
        keep_thinking: bool = False,
        terminal: str = "answer",
    ) -> None:
        if not is_chat_model(tokenizer):
            raise ValueError(
                "the tokenizer has no chat template; give a chat model's folder, or use a preset"
            )
        if parser not in TOOL_PARSERS:
            raise ValueError(f"unknown tool parser {parser!r}; registered: {', '.join(TOOL_PARSERS)}")
        if tokenizer.eos_token_id is None:
            raise ValueError("the chat model's tokenizer has no eos token to end a turn on")
        self.tok, self.parse_calls = tokenizer, TOOL_PARSERS[parser]
        self.tools: list[dict[Any, Any] | Callable[..., Any]] | None = list(tools) or None
        self.keep_thinking, self.terminal = keep_thinking, terminal
        self.eos_ids = (int(tokenizer.eos_token_id),)
        rendered = self.render(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PLACEHOLDER}]
        )
        after = rendered[rendered.index(_PLACEHOLDER) + len(_PLACEHOLDER) :]
        eos = str(tokenizer.eos_token)
        # What the template writes after a sampled turn's eos (ChatML: "\n"), which the model never samples.
        self.closing = after[len(eos) :] if after.startswith(eos) else after

    def render(self, messages: list[dict[str, Any]], *, generation_prompt: bool = False) -> str:
        return str(
            self.tok.apply_chat_template(
                messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt
            )
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def prompt_ids(self, user: str, system: str | None = None) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]
        return self.encode(self.render(messages, generation_prompt=True))

    def tool_result_ids(self, results: list[tuple[str, str]]) -> list[int]:
        """The ids between a sampled tool-calling turn (ending on eos) and the next generation prompt."""
        head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PLACEHOLDER}]
        tool_msgs = [{"role": "tool", "name": n, "content": r} for n, r in results]
        base, full = self.render(head), self.render(head + tool_msgs, generation_prompt=True)
        if not full.startswith(base):
            raise ValueError(
                "the chat template renders earlier messages differently once tool results follow"
            )
        return self.encode(self.closing + full[len(base) :])

    def parse(self, text: str) -> Action:
        """A sampled turn (ending on eos) → a tool-call action (content: the calls as JSON) or the
        terminal action with the answer (thinking stripped unless kept)."""
        eos = str(self.tok.eos_token)
        body = text[: -len(eos)] if text.endswith(eos) else text
        content, calls = self.parse_calls(body)
        if calls:
            return Action(
                "tool_call", json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls])
            )
        answer = content if self.keep_thinking else _THINK.sub("", content).strip()
        if not answer:
            raise FormatError("an empty final turn")
        return Action(self.terminal, answer)


class ChatAgent:
    """A multi-turn tool-calling episode of a chat model: `call(name, arguments) -> result text`."""

    def __init__(
        self,
        engine: RolloutEngine,
        fmt: ChatFormat,
        call: Callable[[str, dict[str, Any]], str],
        *,
        temperature: float = 1.0,
        max_turns: int = 4,
        max_context_tokens: int = 1024,
        max_new_tokens_per_turn: int = 128,
    ) -> None:
        self.engine, self.fmt, self.call = engine, fmt, call
        self.max_turns, self.max_context_tokens = max_turns, max_context_tokens
        self.params = SamplingParams(max_new_tokens_per_turn, temperature, stop_token_ids=fmt.eos_ids)

    def run(self, text: str) -> Transcript:
        def act(action: Action) -> list[int]:
            calls = json.loads(action.content)
            return self.fmt.tool_result_ids(
                [(c["name"], self.call(c["name"], c["arguments"])) for c in calls]
            )

        return run_agent(
            self.engine,
            self.fmt.prompt_ids(text),
            parse=self.fmt.parse,
            act=act,
            params=self.params,
            max_turns=self.max_turns,
            max_context_tokens=self.max_context_tokens,
        )


_BUILTIN_SCHEMAS = {
    "search": ("query", "Search the offline corpus; returns one 'd<id> <title>' line per hit."),
    "open": ("doc_id", "Open a document by its id (d<id>); returns its text."),
    "compare": ("values", "Compare two values written 'a b': numbers by size, names by equality."),
    "calculator": ("expression", "Evaluate arithmetic: numbers with + - * / // % ** and parentheses."),
    "delegate": ("subtask", "Delegate one subtask to a sub-agent; returns its result."),
}


def tool_schemas(names_and_kinds: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The chat template's tool schemas of a role's tools ((name, kind) pairs): built-ins with their
    own parameter names, the user's HTTP and MCP tools with one string `argument`."""
    out = []
    for name, kind in names_and_kinds:
        param, text = (
            _BUILTIN_SCHEMAS[name]
            if kind == "builtin" and name in _BUILTIN_SCHEMAS
            else ("argument", f"The {name} tool.")
        )
        out.append(tool_schema(name, text, param))
    return out


def first_string(arguments: dict[str, Any]) -> str:
    """The argument an mgrpo tool takes: the first string value of a call's arguments."""
    return next((v for v in arguments.values() if isinstance(v, str)), "")


def retokenize_drift(fmt: ChatFormat, tr: Transcript) -> bool:
    """Would tokenising a sampled turn's text give other ids than the sampled ones (what a loop that
    re-tokenises chat turns would train on)? Reported per episode; the trained ids are the sampled ones."""
    i = tr.prompt_len
    while i < len(tr.mask):
        j = i
        while j < len(tr.mask) and tr.mask[j] == tr.mask[i]:
            j += 1
        if tr.mask[i] == 1:
            ids = tr.token_ids[i:j]
            if fmt.encode(str(fmt.tok.decode(ids, skip_special_tokens=False))) != ids:
                return True
        i = j
    return False
