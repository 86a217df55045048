"""Group-relative advantages (algorithm.md §4; M-GRPO paper Eqs. 9-13).

    A_i = (R_i − mean_g) / (std_g + ε)        for every sample i of group g

Groups are keyed by an integer id array, so groups may have different sizes (ragged).
- Planner group: the K rollouts of one query. Sub-agent group: all K·D aligned episodes of one query.
  Planner and sub-agent rewards are never pooled in one group (callers pass them separately).

Decisions (docs/algorithm.md):
- std is the population std (1/n) by default, as in the paper; `std="unbiased"` (1/(n−1)) gives
  parity with verl/TRL. ε = 1e-6 is added to the std.
- A group with fewer than two valid rewards, or whose valid rewards are all equal (max == min,
  an exact test, so float round-off never turns a flat group into ±1), gets advantage 0.
- A NaN reward (unscorable) is excluded from its group's statistics and gets advantage 0.
- Statistics are computed in float64; the result has the dtype of `rewards` (float32 for ints).
"""

from __future__ import annotations

from typing import Literal

import torch

StdMode = Literal["population", "unbiased"]


def _as_1d(x: torch.Tensor | object, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D with shape (N,), got shape {tuple(t.shape)}")
    return t


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    eps: float = 1e-6,
    std: StdMode = "population",
) -> torch.Tensor:
    """Normalise rewards within their groups.

    Args:
        rewards: (N,) float rewards; NaN marks an unscorable sample.
        group_ids: (N,) integer group id of each reward (any values, any order).
        eps: added to the group std.
        std: "population" (paper) or "unbiased".

    Returns:
        (N,) advantages, same dtype as `rewards` (float32 if rewards are integers).
    """
    r_in = _as_1d(rewards, "rewards")
    gid = _as_1d(group_ids, "group_ids")
    if r_in.shape != gid.shape:
        raise ValueError(f"rewards {tuple(r_in.shape)} and group_ids {tuple(gid.shape)} must have one shape")
    if std not in ("population", "unbiased"):
        raise ValueError(f"std must be 'population' or 'unbiased', got {std!r}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    out_dtype = r_in.dtype if r_in.is_floating_point() else torch.float32
    if r_in.numel() == 0:
        return torch.zeros(0, dtype=out_dtype)

    r = r_in.detach().to(torch.float64)  # (N,)
    _, inv = torch.unique(gid, return_inverse=True)  # (N,) dense group index
    n_groups = int(inv.max()) + 1
    valid = ~torch.isnan(r)  # (N,)
    r0 = torch.where(valid, r, torch.zeros_like(r))

    def per_group_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n_groups, dtype=torch.float64).scatter_add_(0, inv, x)  # (G,)

    count = per_group_sum(valid.to(torch.float64))  # (G,)
    mean = per_group_sum(r0) / count.clamp(min=1.0)  # (G,)
    diff = torch.where(valid, r - mean[inv], torch.zeros_like(r))  # (N,)
    sq = per_group_sum(diff * diff)  # (G,)
    denom = count if std == "population" else count - 1.0
    sd = torch.sqrt(sq / denom.clamp(min=1.0))  # (G,)

    big = torch.finfo(torch.float64).max
    gmax = torch.full((n_groups,), -big, dtype=torch.float64).scatter_reduce(
        0, inv, torch.where(valid, r, torch.full_like(r, -big)), reduce="amax"
    )
    gmin = torch.full((n_groups,), big, dtype=torch.float64).scatter_reduce(
        0, inv, torch.where(valid, r, torch.full_like(r, big)), reduce="amin"
    )
    informative = (count >= 2) & (gmax > gmin)  # (G,)

    adv = diff / (sd[inv] + eps)  # (N,)
    keep = valid & informative[inv]
    adv = torch.where(keep, adv, torch.zeros_like(adv))
    return adv.to(out_dtype)
