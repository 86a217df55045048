"""The multi-turn agent loop and its transcript (token ids, logp_old, loss mask).

The context is built by concatenating token ids — the model's own sampled ids, then the
environment's observation ids — never by re-tokenizing text, so the trainer sees exactly the tokens
the policy produced. The loss mask is 1 exactly on generated tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from transformers import PreTrainedTokenizerBase

from mgrpo.agents.format import Action, FormatError, strip_tags
from mgrpo.engines.base import RolloutEngine, SamplingParams

Finish = str  # "answer" | "result" | "format_error" | "max_turns" | "max_context"


@dataclass
class Transcript:
    token_ids: list[int]
    logp: list[float]
    mask: list[int]
    prompt_len: int
    actions: list[Action] = field(default_factory=list)
    format_ok: bool = True
    finish: Finish = ""
    final: str | None = None
    policy_version: int | None = None  # the oldest weights version any generated turn came from

    @classmethod
    def start(cls, prompt_ids: list[int]) -> Transcript:
        return cls(list(prompt_ids), [0.0] * len(prompt_ids), [0] * len(prompt_ids), len(prompt_ids))

    def add(self, ids: list[int], logp: list[float] | None = None, *, generated: bool) -> None:
        self.token_ids += ids
        self.logp += logp if logp is not None else [0.0] * len(ids)
        self.mask += [1 if generated else 0] * len(ids)

    def sampled_by(self, version: int) -> None:
        """Record that a generated turn came from policy `version` (the transcript keeps the oldest)."""
        self.policy_version = version if self.policy_version is None else min(self.policy_version, version)

    def __len__(self) -> int:
        return len(self.token_ids)

    def fail(self, finish: Finish) -> None:
        self.format_ok, self.finish = False, finish


def observation_ids(tokenizer: PreTrainedTokenizerBase, tag: str, text: str) -> list[int]:
    """Token ids of an environment insert: <tag> text </tag>, tags stripped from the text."""
    return list(tokenizer.encode(f"<{tag}>{strip_tags(text)}</{tag}>", add_special_tokens=False))


def run_agent(
    engine: RolloutEngine,
    prompt_ids: list[int],
    *,
    parse: Callable[[str], Action],
    act: Callable[[Action], list[int]],
    params: SamplingParams,
    max_turns: int,
    max_context_tokens: int,
) -> Transcript:
    """Generate → parse → act until a terminal action, a format error, or a budget runs out.

    `act(action)` returns the observation ids to insert (mask 0) for a non-terminal action.
    """
    tr = Transcript.start(prompt_ids)
    for turn in range(max_turns):
        budget = max_context_tokens - len(tr)
        if budget <= 0:
            tr.fail("max_context")
            return tr
        seed = None if params.seed is None else params.seed + turn  # seeded episodes: a fresh draw per turn
        (sample,) = engine.generate(
            [tr.token_ids], replace(params, max_new_tokens=min(params.max_new_tokens, budget), seed=seed)
        )
        tr.add(sample.token_ids, sample.logprobs, generated=True)
        tr.sampled_by(sample.weights_version)
        if sample.finish_reason != "stop":
            tr.fail("format_error")  # ran out of tokens or emitted EOS before a closing tag
            return tr
        try:
            action = parse(sample.text)
        except FormatError:
            tr.fail("format_error")
            return tr
        tr.actions.append(action)
        if action.terminal:
            tr.finish, tr.final = action.kind, action.content
            return tr
        tr.add(act(action), generated=False)
    tr.fail("max_turns")
    return tr
