"""The planner (delegates subtasks, answers) and the tool-using sub-agent, plus their demonstrations.

`delegate(subtask) -> Delegation` is in-process for unit tests and the warm start, and an HTTP call
to the sub-agent service once services exist. A planner rollout records its delegations (d_k) and
the ids of the resulting sub-agent episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from mgrpo.agents.format import (
    OBSERVATION_TAGS,
    PLANNER_STOPS,
    SINGLE_STOPS,
    SUBAGENT_STOPS,
    parse_planner_turn,
    parse_single_turn,
    parse_subagent_turn,
)
from mgrpo.agents.loop import observation_ids, run_agent
from mgrpo.engines.base import RolloutEngine, SamplingParams
from mgrpo.records import Action, Transcript


@dataclass(frozen=True)
class Delegation:
    subtask: str
    result: str
    episode_id: str | None = None
    exchange_s: float = 0.0  # time this delegation spent in HTTP and Redis, not in the sub-agent's model
    server_queue_s: float = 0.0  # of which waiting in the sub-agent's server before its handler ran
    role: str = "subagent"  # the callee role that ran it


@dataclass
class PlannerRollout:
    transcript: Transcript
    delegations: list[Delegation] = field(default_factory=list)

    @property
    def n_delegations(self) -> int:
        return len(self.delegations)


def planner_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    return list(tokenizer.encode(f"Q: {question}\n", add_special_tokens=False))


def subagent_prompt(tokenizer: PreTrainedTokenizerBase, subtask: str) -> list[int]:
    return list(tokenizer.encode(f"T: {subtask}\n", add_special_tokens=False))


def _stop_ids(tokenizer: PreTrainedTokenizerBase, tags: tuple[str, ...]) -> tuple[int, ...]:
    ids = tokenizer.convert_tokens_to_ids(list(tags))
    if not isinstance(ids, list) or tokenizer.unk_token_id in ids:
        raise ValueError(
            f"the tokenizer lacks the format tags {tags}; build it with mgrpo.models.train_tokenizer"
        )
    return tuple(int(i) for i in ids)


@dataclass
class AgentLimits:
    max_turns: int = 6
    max_context_tokens: int = 512
    max_new_tokens_per_turn: int = 48


class PlannerAgent:
    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        delegate: Callable[[str], Delegation],
        *,
        temperature: float = 1.0,
        limits: AgentLimits | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.delegate = engine, tokenizer, delegate
        self.limits = limits or AgentLimits()
        self.params = SamplingParams(
            self.limits.max_new_tokens_per_turn,
            temperature,
            stop_token_ids=_stop_ids(tokenizer, PLANNER_STOPS),
        )

    def rollout(self, question: str, *, seed: int | None = None) -> PlannerRollout:
        delegations: list[Delegation] = []

        def act(action: Action) -> list[int]:
            d = self.delegate(action.content)
            delegations.append(d)
            return observation_ids(self.tokenizer, OBSERVATION_TAGS["planner"], d.result)

        tr = run_agent(
            self.engine,
            planner_prompt(self.tokenizer, question),
            parse=parse_planner_turn,
            act=act,
            params=_seeded(self.params, seed),
            max_turns=self.limits.max_turns,
            max_context_tokens=self.limits.max_context_tokens,
        )
        return PlannerRollout(tr, delegations)


class ToolAgent:
    """An agent that calls tools until it emits its terminal tag: the sub-agent (`<result>`) or, with
    `single=True`, the paper's single-agent baseline (the sub-agent's tools, the planner's `<answer>`)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        call_tool: Callable[[str, str], str],
        *,
        temperature: float = 1.0,
        limits: AgentLimits | None = None,
        single: bool = False,
    ) -> None:
        self.engine, self.tokenizer, self.call_tool, self.single = engine, tokenizer, call_tool, single
        default = AgentLimits(max_turns=10, max_context_tokens=1024) if single else AgentLimits(max_turns=4)
        self.limits = limits or default
        self.role = "single" if single else "subagent"
        self.parse = parse_single_turn if single else parse_subagent_turn
        self.prompt = planner_prompt if single else subagent_prompt
        stops = SINGLE_STOPS if single else SUBAGENT_STOPS
        self.params = SamplingParams(
            self.limits.max_new_tokens_per_turn, temperature, stop_token_ids=_stop_ids(tokenizer, stops)
        )

    def run(self, text: str, *, seed: int | None = None) -> Transcript:
        """One episode on a subtask (sub-agent) or a question (single agent)."""

        def act(action: Action) -> list[int]:
            return observation_ids(
                self.tokenizer, OBSERVATION_TAGS[self.role], self.call_tool(*action.tool())
            )

        return run_agent(
            self.engine,
            self.prompt(self.tokenizer, text),
            parse=self.parse,
            act=act,
            params=_seeded(self.params, seed),
            max_turns=self.limits.max_turns,
            max_context_tokens=self.limits.max_context_tokens,
        )


class SubAgent(ToolAgent):
    """The tool-using sub-agent: a subtask in, `<result>` out."""


class SingleAgent(ToolAgent):
    """The single-agent baseline: a question in, `<answer>` out, every lookup done itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, single=True, **kwargs)

    def rollout(self, question: str, *, seed: int | None = None) -> Transcript:
        return self.run(question, seed=seed)


def _seeded(params: SamplingParams, seed: int | None) -> SamplingParams:
    return params if seed is None else replace(params, seed=seed)


def demo_transcript(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[int],
    turns: list[tuple[str, str | None]],
    obs_tag: str,
) -> Transcript:
    """A demonstration in the exact token layout of a rollout: each (generated text, observation or None)."""
    tr = Transcript.start(prompt_ids)
    for text, observation in turns:
        tr.add(list(tokenizer.encode(text, add_special_tokens=False)), generated=True)
        if observation is not None:
            tr.add(observation_ids(tokenizer, obs_tag, observation), generated=False)
    return tr


class TurnAgent:
    """One turn: a prompt text in, one `<think>…</think><answer>…</answer>` turn out (the MarsRL roles).
    The transcript holds the prompt (mask 0) and the sampled turn (mask 1, its log-probs)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        *,
        temperature: float = 1.0,
        max_new_tokens: int = 48,
    ) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.params = SamplingParams(
            max_new_tokens, temperature, stop_token_ids=_stop_ids(tokenizer, ("</answer>",))
        )

    def sample(self, prompt: str, n: int, *, seed: int | None = None) -> list[tuple[str, Transcript]]:
        """`n` turns on one prompt, sampled concurrently; with `seed`, turn i uses seed + i."""
        ids = list(self.tokenizer.encode(prompt, add_special_tokens=False))
        if seed is None:
            samples = self.engine.generate([ids] * n, self.params)
        else:
            samples = [
                s for i in range(n) for s in self.engine.generate([ids], _seeded(self.params, seed + i))
            ]
        out = []
        for s in samples:
            tr = Transcript.start(ids)
            tr.add(s.token_ids, s.logprobs, generated=True)
            tr.sampled_by(s.weights_version)
            if s.finish_reason != "stop":
                tr.fail("format_error")
            out.append((s.text, tr))
        return out
