"""The agents' output format and its parsers (the format reward's gate).

Planner turn:    [<think>…</think>] then exactly one of <delegate>subtask</delegate> | <answer>text</answer>
Sub-agent turn:  [<think>…</think>] then exactly one of <tool_call>name argument</tool_call> | <result>text</result>
Single agent:    [<think>…</think>] then exactly one of <tool_call>name argument</tool_call> | <answer>text</answer>
Inserted by the environment (never trained, loss mask 0):
                 <delegate_result>…</delegate_result> (planner), <tool_response>…</tool_response> (sub-agent)

A turn must end on its closing tag (the engine stops there); anything else — text outside the tags,
a missing closing tag, an empty payload, a stray tag inside the payload — is a `FormatError`, which
ends the episode as a format failure (reward 0), never as a crash.
"""

from __future__ import annotations

import re

from mgrpo.records import Action

PLANNER_STOPS = ("</delegate>", "</answer>")
SUBAGENT_STOPS = ("</tool_call>", "</result>")
SINGLE_STOPS = ("</tool_call>", "</answer>")
OBSERVATION_TAGS = {"planner": "delegate_result", "subagent": "tool_response", "single": "tool_response"}
_THINK = r"\s*(?:<think>(?P<think>[^<]*)</think>)?\s*"
_PLANNER = re.compile(_THINK + r"<(?P<tag>delegate|answer)>(?P<body>[^<]*)</(?P=tag)>\s*$", re.S)
_SUBAGENT = re.compile(_THINK + r"<(?P<tag>tool_call|result)>(?P<body>[^<]*)</(?P=tag)>\s*$", re.S)
_SINGLE = re.compile(_THINK + r"<(?P<tag>tool_call|answer)>(?P<body>[^<]*)</(?P=tag)>\s*$", re.S)
_ANY_TAG = re.compile(r"</?(think|delegate|delegate_result|answer|tool_call|tool_response|result)>")


class FormatError(ValueError):
    """A turn that does not follow the format."""


def _parse(pattern: re.Pattern[str], role: str, text: str) -> Action:
    m = pattern.match(text)
    if m is None:
        raise FormatError(f"{role} turn is malformed: {text[:120]!r}")
    body = m.group("body").strip()
    if not body:
        raise FormatError(f"{role} turn has an empty <{m.group('tag')}>")
    return Action(m.group("tag"), body, (m.group("think") or "").strip())


def parse_planner_turn(text: str) -> Action:
    return _parse(_PLANNER, "planner", text)


def parse_subagent_turn(text: str) -> Action:
    action = _parse(_SUBAGENT, "sub-agent", text)
    if action.kind == "tool_call" and not action.tool()[1]:
        raise FormatError(f"sub-agent tool call without an argument: {action.content!r}")
    return action


def parse_single_turn(text: str) -> Action:
    """The single-agent baseline: one model with the sub-agent's tools, answering like the planner."""
    action = _parse(_SINGLE, "single-agent", text)
    if action.kind == "tool_call" and not action.tool()[1]:
        raise FormatError(f"single-agent tool call without an argument: {action.content!r}")
    return action


def strip_tags(text: str) -> str:
    """Remove format tags from environment text so a tool or a sub-agent can never inject a turn."""
    return _ANY_TAG.sub(" ", text).strip()
