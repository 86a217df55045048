"""The adapter from the records to the math: every `Sample`'s advantage from its (role, group)'s
rewards (`mgrpo.algo.group_advantages`, algorithm.md §4). Groups never mix roles: the group key is
(role, group)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mgrpo.algo import group_advantages
from mgrpo.records import Sample


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


def advantage_stats(adv: torch.Tensor) -> dict[str, float]:
    """A step's advantages in two numbers: their spread (`adv_std`) and the share of samples whose
    advantage is 0 (`flat_share`: their group's rewards were all equal, so they carry no signal)."""
    if len(adv) == 0:
        return {"adv_std": 0.0, "flat_share": 0.0}
    return {
        "adv_std": float(adv.std()) if len(adv) > 1 else 0.0,
        "flat_share": float((adv.abs() < 1e-8).float().mean()),
    }
