"""The multi-turn agent loop, which writes a `Transcript` (`mgrpo.records`: token ids, logp_old, loss mask).

The context is built by concatenating token ids — the model's own sampled ids, then the
environment's observation ids — never by re-tokenizing text, so the trainer sees exactly the tokens
the policy produced. The loss mask is 1 exactly on generated tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from transformers import PreTrainedTokenizerBase

from mgrpo.agents.format import FormatError, strip_tags
from mgrpo.engines.base import RolloutEngine, SamplingParams
from mgrpo.records import Action, Transcript


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
