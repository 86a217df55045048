"""Token-level clipped policy loss (algorithm.md §5), as the authors' released training uses.

    ρ_t = exp(clamp(logp_t − logp_old_t, −20, 20))
    L_t = max(−A·ρ_t, −A·clip(ρ_t, 1 − ε_low, 1 + ε_high))        (= −min(ρA, clip(ρ)A))
        + β·k3_t   with k3_t = exp(ref_t − logp_t) − (ref_t − logp_t) − 1   (only when β > 0)

- ε_low = 0.2, ε_high = 0.28 ("clip-higher"). The sequence advantage is broadcast to every token.
- Loss mask: 1 on tokens the agent generated, 0 on prompt, tool outputs and delegated results.
- Aggregation (names as verl's `loss_agg_mode`): `seq-mean-token-mean` (default [decision]: mean over a
  sequence's masked tokens, then mean over the sequences that have at least one masked token; a
  sequence with no trained token is left out rather than producing NaN) or `token-mean` (mean over
  all masked tokens of the batch).
- KL to a reference model is off by default (β = 0, as in the paper); k3 estimator when enabled.
- Stale samples (algorithm.md §7, decoupled PPO as in AReaL), when `logp_prox` is given: `logp_old` is the
  behaviour policy's log-probs `logp_b` (the version that sampled the tokens), `logp_prox` the
  trainer's own at the start of the update. The clip ratio becomes ρ_t = exp(logp_t − logp_prox_t)
  and each token's policy-gradient term is multiplied by the detached, truncated importance weight
  w_t = min(exp(logp_prox_t − logp_b_t), C), C = `is_cap` (2 by default). When the versions match,
  logp_prox = logp_b, w = 1 and the loss is the one above exactly. The KL term is not weighted.

Metrics (python floats, masked token means): `clip_frac` (share of tokens whose clipped term was the
active one), `approx_kl` (k3 of the new policy from the old one, (ρ−1) − log ρ), `ratio_mean`,
`ratio_max`, `pg_loss`, and `kl_ref` / `entropy` when those inputs are given; with `logp_prox`,
`is_weight_mean` and `is_capped_frac` (share of tokens whose weight hit the cap).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

AggMode = Literal["seq-mean-token-mean", "token-mean"]
LOG_RATIO_CLAMP = 20.0


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask == 1 (0 when the mask is empty). x, mask: same shape."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, agg: AggMode) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar with the given aggregation mode."""
    if agg == "token-mean":
        return masked_mean(loss_mat, mask)
    if agg == "seq-mean-token-mean":
        tokens = mask.sum(dim=-1)  # (B,)
        seq_loss = (loss_mat * mask).sum(dim=-1) / tokens.clamp(min=1.0)  # (B,)
        has_tokens = (tokens > 0).to(loss_mat.dtype)  # (B,)
        return (seq_loss * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)
    raise ValueError(f"agg must be 'seq-mean-token-mean' or 'token-mean', got {agg!r}")


def agg_count(masks: Sequence[Sequence[int]], agg: AggMode) -> int:
    """The denominator `aggregate` divides by, from the rows' loss masks: the rows with a trained token
    (`seq-mean-token-mean`) or the trained tokens (`token-mean`). A data-parallel rank scales its
    partial loss by its count over the minibatch's (`mgrpo.training`)."""
    if agg == "token-mean":
        return sum(sum(m) for m in masks)
    return sum(1 for m in masks if any(m))


def _check_shapes(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape (B, T), got {tuple(logp.shape)}")
    for name, t in (("logp_old", logp_old), ("mask", mask)):
        if t.shape != logp.shape:
            raise ValueError(f"{name} must have the shape of logp {tuple(logp.shape)}, got {tuple(t.shape)}")
    if adv.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(
            f"advantages must have shape (B,) or (B, T) = {tuple(logp.shape)}, got {tuple(adv.shape)}"
        )


def policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: AggMode = "seq-mean-token-mean",
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    logp_prox: torch.Tensor | None = None,
    is_cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped token-level policy loss.

    Args:
        logp: (B, T) log-probs of the taken tokens under the policy being trained (requires grad).
        logp_old: (B, T) log-probs recorded at generation time by the policy that generated them.
        advantages: (B,) sequence advantages (broadcast over tokens) or (B, T) per-token.
        mask: (B, T) 1 on trained tokens, 0 elsewhere (bool or float).
        clip_low, clip_high: ε_low and ε_high of the asymmetric clip.
        agg: "seq-mean-token-mean" or "token-mean".
        ref_logp: (B, T) reference-model log-probs; used only when kl_coef > 0.
        kl_coef: β, weight of the k3 KL penalty.
        entropy: (B, T) per-token entropy, reported as a metric only.
        logp_prox: (B, T) the trainer's log-probs at the start of the update, for samples of an older
            policy (then `logp_old` is the behaviour policy's); None: on-policy, as before.
        is_cap: C, the cap of the importance weight exp(logp_prox − logp_old).

    Returns:
        (scalar loss, metrics dict of floats).
    """
    _check_shapes(logp, logp_old, advantages, mask)
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp (the reference model's log-probs)")
    if logp_prox is not None and logp_prox.shape != logp.shape:
        raise ValueError(
            f"logp_prox must have the shape of logp {tuple(logp.shape)}, got {tuple(logp_prox.shape)}"
        )
    if is_cap <= 0:
        raise ValueError(f"is_cap must be > 0, got {is_cap}")
    m = mask.to(logp.dtype)  # (B, T)
    adv = advantages.to(logp.dtype)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # (B, 1) or (B, T)

    anchor = (logp_old if logp_prox is None else logp_prox).detach()  # (B, T)
    log_ratio = torch.clamp(logp - anchor, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    pg_unclipped = -adv * ratio  # (B, T)
    pg_clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    pg_mat = torch.maximum(pg_unclipped, pg_clipped)  # (B, T)
    metrics: dict[str, float] = {}
    if logp_prox is not None:  # stale samples: the truncated importance weight of algorithm.md §7
        log_w = torch.clamp(logp_prox.detach() - logp_old.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        w = torch.clamp(torch.exp(log_w), max=is_cap)  # (B, T), no gradient
        pg_mat = pg_mat * w
        metrics["is_weight_mean"] = float(masked_mean(w, m))
        metrics["is_capped_frac"] = float(masked_mean((torch.exp(log_w) >= is_cap).to(m.dtype), m))
    loss_mat = pg_mat

    if ref_logp is not None:
        d = ref_logp.detach() - logp  # (B, T)
        k3 = torch.exp(torch.clamp(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)) - d - 1.0  # (B, T)
        metrics["kl_ref"] = float(masked_mean(k3.detach(), m))
        if kl_coef > 0:
            loss_mat = pg_mat + kl_coef * k3

    loss = aggregate(loss_mat, m, agg)
    with torch.no_grad():
        metrics["pg_loss"] = float(aggregate(pg_mat, m, agg))
        metrics["clip_frac"] = float(masked_mean((pg_clipped > pg_unclipped).to(m.dtype), m))
        metrics["approx_kl"] = float(masked_mean((ratio - 1.0) - log_ratio, m))
        metrics["ratio_mean"] = float(masked_mean(ratio, m))
        metrics["ratio_max"] = float((ratio * m).max()) if m.numel() else 0.0
        if entropy is not None:
            metrics["entropy"] = float(masked_mean(entropy.detach().to(m.dtype), m))
    return loss, metrics
