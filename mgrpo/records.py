"""The records that cross from rollout to training, for every role of every workflow. A leaf module:
it imports nothing of mgrpo, so everything else can import it.

- `Action`: one parsed agent turn (what the model asked for: a delegation, a tool call, an answer).
- `Transcript`: one episode's tokens as the policy produced them — token ids, the behaviour policy's
  log-probs (`logp_old`), the loss mask (1 exactly on generated tokens) — and how it ended.
- `Sample`: a transcript with its role, GRPO group, reward and advantage, as the update takes it.

A trainer's step assembles `Sample`s (the workflow decides groups and rewards), `assign_advantages`
(`mgrpo.advantages`) fills their advantages group by group, and `ppo_update` (`mgrpo.training`)
trains on them: the same record from rollout to update, no parallel lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Finish = str  # "answer" | "result" | "format_error" | "max_turns" | "max_context" | "program_error" | …


@dataclass(frozen=True)
class Action:
    kind: str  # "delegate" | "answer" | "tool_call" | "result"
    content: str
    think: str = ""

    @property
    def terminal(self) -> bool:
        return self.kind in ("answer", "result")

    def tool(self) -> tuple[str, str]:
        """(tool name, argument) of a tool call: 'search Kir Naibram' → ('search', 'Kir Naibram')."""
        name, _, argument = self.content.strip().partition(" ")
        return name, argument.strip()


@dataclass
class Transcript:
    token_ids: list[int]
    logp: list[float]  # logp_old of each token (0 where the mask is 0)
    mask: list[int]  # 1 on generated tokens (trained), 0 on prompt and observations
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


@dataclass
class Sample:
    role: str
    group: str  # the GRPO group within the role: samples that share one input (a query, a selected output)
    transcript: Transcript  # token ids, logp_old, loss mask
    reward: float  # NaN = unscorable (advantage 0, excluded from the group's statistics)
    advantage: float = 0.0
    policy_version: int = 0  # the policy that sampled it (its oldest turn)
    episode_id: str = ""  # where it is stored, for samples recorded by another service
