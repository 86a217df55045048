"""The one record that crosses from rollout to training, for every role of every workflow.

A trainer's step assembles `Sample`s (tokens, behaviour log-probs, loss mask, role, GRPO group,
reward), `assign_advantages` fills their advantages group by group with the M-GRPO math
(`mgrpo.algo.group_advantages`, algorithm.md §4), and `ppo_update` trains on them. Groups never mix roles:
the group key is (role, group).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mgrpo.agents.loop import Transcript
from mgrpo.algo import group_advantages


@dataclass
class Sample:
    role: str
    group: str  # the GRPO group within the role: samples that share one input (a query, a selected output)
    transcript: Transcript  # token ids, logp_old, loss mask
    reward: float  # NaN = unscorable (advantage 0, excluded from the group's statistics)
    advantage: float = 0.0
    policy_version: int = 0
    episode_id: str = ""  # where it is stored, for samples recorded by another service


def assign_advantages(samples: Sequence[Sample]) -> torch.Tensor:
    """Fill every sample's advantage from its (role, group)'s rewards; returns them as a (N,) tensor."""
    if not samples:
        return torch.zeros(0)
    ids: dict[tuple[str, str], int] = {}
    groups = torch.tensor([ids.setdefault((s.role, s.group), len(ids)) for s in samples])  # (N,)
    adv = group_advantages(torch.tensor([s.reward for s in samples], dtype=torch.float32), groups)  # (N,)
    for s, a in zip(samples, adv.tolist(), strict=True):
        s.advantage = a
    return adv
