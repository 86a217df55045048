"""The rollout-engine interface every backend implements."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal, Protocol

FinishReason = Literal["stop", "length", "eos"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one continuation.

    `logp` of each sampled token is taken from softmax(logits / temperature) — the distribution a
    training forward pass at the same temperature computes — before top-p truncation (as verl does).
    temperature 0 means greedy; its log-probs are then those of temperature 1.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")


@dataclass
class Sample:
    """One generated continuation: its token ids, their log-probs (logp_old), why it ended."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "length"
    text: str = ""
    weights_version: int = 0  # the policy version of the weights that sampled it (engines that track it)


class RolloutEngine(Protocol):
    """Generate continuations of token-id prompts. Implementations are thread-safe: concurrent
    callers are batched together.

    `shares_weights`: the engine samples from the trainer's own model object (the default in-process
    `hf` engine), so an update is live at once; otherwise (an SGLang server, an `hf` engine with its
    own copy) the trainer pushes each new policy. `paused()` holds generation while the trainer
    changes weights the engine shares. `weights_version`: the policy version new requests sample
    from; every `Sample` records the version it came from."""

    shares_weights: bool
    weights_version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]: ...

    def update_weights(self, path: str, version: int | None = None) -> None:
        """Load new policy weights (policy `version`, default: the next) from a saved HF folder."""
        ...

    def paused(self) -> AbstractContextManager[None]: ...

    def close(self) -> None: ...
