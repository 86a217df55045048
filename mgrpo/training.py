"""The policy update of one role: clipped PPO epochs over a step's samples (algorithm.md §5).

Both trainers call this one function; the loss itself is `mgrpo.algo.policy_loss`. A sample is a
transcript (token ids, logp_old, loss mask) with its sequence advantage; duplicated samples (from
trajectory alignment) are passed as many times as they occur and so count in the loss.

Stale samples (sampled by an older policy version than the one being trained, algorithm.md §7): before the
first minibatch, one no-grad pass of the current model over them gives `logp_prox`; the loss then
clips the ratio against it and weights each token by min(exp(logp_prox − logp_old), `is_cap`). Fresh
samples keep logp_prox = logp_old, so a batch without stale samples trains exactly as before.

Data parallel (`shard=(rank, world)`, a role's trainer on W ranks, `mgrpo.parallel`): every rank
gets the whole step's samples and the same seed, so all draw the same minibatches; rank r trains on
rows r, r + W, … of each. Its loss is its partial sum over the minibatch's *global* denominator
(sequences with a trained token, or trained tokens — `loss.agg_count`) times W, so the gradients
FSDP averages over the ranks are exactly the W = 1 gradient. A rank left without a row (a minibatch
smaller than W) runs a forward on a row with weight 0: the collectives need every rank.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from mgrpo.agents.loop import Transcript
from mgrpo.algo.loss import AggMode, agg_count, policy_loss
from mgrpo.batching import collate
from mgrpo.config import OptimConfig
from mgrpo.models import token_logprobs


@dataclass(frozen=True)
class UpdateSettings:
    ppo_epochs: int = 1
    minibatch_size: int = 64
    clip_low: float = 0.2
    clip_high: float = 0.28
    loss_agg: AggMode = "seq-mean-token-mean"
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    kl_coef: float = 0.0
    compile: bool = False
    is_cap: float = 2.0

    @classmethod
    def of(cls, optim: OptimConfig, temperature: float) -> UpdateSettings:
        """A role's settings from its job config: `optim` and the temperature its rollouts sample at."""
        return cls(optim.ppo_epochs, optim.minibatch_size, optim.clip_low, optim.clip_high, optim.loss_agg,
                   optim.max_grad_norm, temperature, optim.kl_coef, optim.compile, optim.is_cap)  # fmt: skip


def ppo_update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[tuple[Transcript, float]],
    settings: UpdateSettings,
    *,
    pad_id: int,
    seed: int = 0,
    ref_model: PreTrainedModel | None = None,
    stale: Sequence[bool] | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict[str, float]:
    """Run `ppo_epochs` passes of minibatch updates; returns mean metrics (loss, clip_frac, approx_kl,
    grad_norm, tokens; kl_ref with a `ref_model`; is_weight_mean, is_capped_frac when any sample is
    `stale`). Samples whose advantage is 0 still count (they are real group members). `ref_model`
    (frozen) is needed when `settings.kl_coef` > 0. `stale[i]`: sample i came from an older policy.
    `shard`: (rank, world) of a data-parallel update (module docstring); every rank gets the same
    metrics."""
    if settings.kl_coef > 0 and ref_model is None:
        raise ValueError("kl_coef > 0 needs ref_model (the frozen starting model)")
    if not samples:
        return {"samples": 0.0}
    if stale is not None and len(stale) != len(samples):
        raise ValueError(f"stale has {len(stale)} flags for {len(samples)} samples")
    prox = _proximal_logprobs(model, samples, stale, settings, pad_id)
    rng = random.Random(seed)
    totals: dict[str, float] = {}
    n_updates = 0
    model.train()
    for _ in range(settings.ppo_epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        for start in range(0, len(order), settings.minibatch_size):
            idx = order[start : start + settings.minibatch_size]
            metrics = _minibatch(model, optimizer, [samples[i] for i in idx], settings, pad_id, ref_model,
                                 None if prox is None else [prox[i] for i in idx], shard)  # fmt: skip
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v
            n_updates += 1
    model.eval()
    out = {k: v / n_updates for k, v in totals.items()}
    out["samples"] = float(len(samples))
    out["updates"] = float(n_updates)
    return out


def _proximal_logprobs(
    model: PreTrainedModel,
    samples: Sequence[tuple[Transcript, float]],
    stale: Sequence[bool] | None,
    s: UpdateSettings,
    pad_id: int,
) -> list[torch.Tensor | None] | None:
    """logp_prox of every stale sample (its shifted token log-probs under `model` before this update,
    length len − 1); None for fresh ones; None overall when no sample is stale."""
    if stale is None or not any(stale):
        return None
    out: list[torch.Tensor | None] = [None] * len(samples)
    idx = [i for i, flag in enumerate(stale) if flag]
    model.train()  # the mode the loss's forward runs in
    with torch.no_grad():
        for start in range(0, len(idx), s.minibatch_size):
            chunk = idx[start : start + s.minibatch_size]
            batch = collate([samples[i][0] for i in chunk], pad_id).to(model.device)
            logp = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=s.temperature)
            for row, i in enumerate(chunk):
                out[i] = logp[row, : len(samples[i][0]) - 1].float().cpu()
    return out


def compiled_forward(model: PreTrainedModel) -> Callable[..., Any]:
    """`torch.compile` of the model's forward with dynamic shapes, made once per model object and kept
    on it. Only the update calls it: `model(...)` itself (the rollout engine's decode steps with a KV
    cache) stays eager."""
    fn: Callable[..., Any] | None = getattr(model, "_mgrpo_compiled_forward", None)
    if fn is None:
        fn = torch.compile(model.forward, dynamic=True)
        object.__setattr__(model, "_mgrpo_compiled_forward", fn)
    return fn


def _minibatch(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch_samples: list[tuple[Transcript, float]],
    s: UpdateSettings,
    pad_id: int,
    ref_model: PreTrainedModel | None,
    prox: list[torch.Tensor | None] | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict[str, float]:
    rank, world = shard
    share = 1.0  # this rank's part of the minibatch's loss denominator
    if world > 1:
        total = agg_count([t.mask[1:] for t, _ in batch_samples], s.loss_agg)
        rows = list(range(rank, len(batch_samples), world))
        share = (
            agg_count([batch_samples[i][0].mask[1:] for i in rows], s.loss_agg) / max(total, 1)
            if rows
            else 0.0
        )
        rows = rows or [0]  # a row with weight 0 when none is left: the collectives need this rank
        mine = [batch_samples[i] for i in rows]
        batch_samples, prox = mine, None if prox is None else [prox[i] for i in rows]
    batch = collate([t for t, _ in batch_samples], pad_id).to(model.device)
    logp_prox = None
    if prox is not None:  # fresh rows keep logp_old: their importance weight is exactly 1
        logp_prox = batch.logp_old.clone()
        for row, p in enumerate(prox):
            if p is not None:
                logp_prox[row, : p.numel()] = p.to(logp_prox.device)
    adv = torch.tensor([a for _, a in batch_samples], dtype=torch.float32, device=model.device)  # (B,)
    ref_logp = None
    if ref_model is not None:
        with torch.no_grad():
            ref_logp = token_logprobs(
                ref_model, batch.input_ids, batch.attention_mask, temperature=s.temperature
            )
    forward = compiled_forward(model) if s.compile else model
    logp = token_logprobs(
        forward, batch.input_ids, batch.attention_mask, temperature=s.temperature
    )  # (B, T-1)
    loss, metrics = policy_loss(logp, batch.logp_old, adv, batch.loss_mask, clip_low=s.clip_low,
                                clip_high=s.clip_high, agg=s.loss_agg, ref_logp=ref_logp, kl_coef=s.kl_coef,
                                logp_prox=logp_prox, is_cap=s.is_cap)  # fmt: skip
    optimizer.zero_grad()
    (loss * (share * world) if world > 1 else loss).backward()
    clip = getattr(model, "clip_grad_norm_", None)  # a tensor-parallel model clips by its whole norm
    grad_norm = (
        clip(s.max_grad_norm) if clip else torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
    )
    optimizer.step()
    metrics["loss"] = loss.item()
    metrics["grad_norm"] = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    metrics["tokens"] = float(batch.loss_mask.sum()) if share > 0 else 0.0
    return reduce_metrics(metrics, share) if world > 1 else metrics


def reduce_metrics(metrics: dict[str, float], share: float) -> dict[str, float]:
    """One minibatch's metrics over the ranks: the means weighted by each rank's `share` of the loss
    denominator (so `loss` is the minibatch's loss), `tokens` summed, `ratio_max` the max, `grad_norm`
    (already global) as it is."""
    keys = sorted(k for k in metrics if k not in ("grad_norm", "ratio_max"))
    vals = torch.tensor(
        [metrics[k] if k == "tokens" else metrics[k] * share for k in keys], dtype=torch.float64
    )
    dist.all_reduce(vals)
    out = dict(zip(keys, vals.tolist(), strict=True))
    if "ratio_max" in metrics:
        top = torch.tensor([metrics["ratio_max"] if share > 0 else 0.0], dtype=torch.float64)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        out["ratio_max"] = float(top)
    out["grad_norm"] = metrics["grad_norm"]
    return out
