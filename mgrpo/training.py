"""The policy update of one role: clipped PPO epochs over a step's samples (algorithm.md §5).

Every trainer calls this one function on the step's `Sample`s (`mgrpo.records`: a transcript —
token ids, logp_old, loss mask — with its sequence advantage); the loss itself is
`mgrpo.algo.policy_loss`. Duplicated samples (from trajectory alignment) are passed as many times as
they occur and so count in the loss.

Stale samples (sampled by an older policy version than the `version` being trained, algorithm.md §7): before the
first minibatch, one no-grad pass of the current model over them gives `logp_prox`; the loss then
clips the ratio against it and weights each token by min(exp(logp_prox − logp_old), `is_cap`). Fresh
samples keep logp_prox = logp_old, so a batch without stale samples trains exactly as before.

Data parallel (`shard=(rank, world)`, a role's trainer on W ranks, `mgrpo.parallel`): every rank
gets the whole step's samples and the same seed, so all draw the same minibatches; rank r trains on
rows r, r + W, … of each. Its loss is its partial sum over the minibatch's *global* denominator
(sequences with a trained token, or trained tokens — `loss.agg_count`) times W, so the gradients
FSDP averages over the ranks are exactly the W = 1 gradient. A rank left without a row (a minibatch
smaller than W) runs a forward on a row with weight 0: the collectives need every rank.

Micro-batches (`microbatch_tokens` > 0): a rank's rows of a minibatch are sorted by length and cut
into micro-batches of at most that many padded tokens; each micro-batch's loss, over its own
denominator, is scaled by its part of the minibatch's denominator before its backward, so the
accumulated gradient — and the one optimizer step — are those of the whole minibatch, with less
padding and one micro-batch's activations in memory at a time. On W ranks every rank runs as many
micro-batches as the rank with the most (`equal_count`: its largest split, then weight-0 fillers), as
each forward's collectives (FSDP2's all-gathers, the experts' dispatch) must pair up across ranks.

Pipeline parallelism (a model with `pipelined` set: the megatron-core backend on P > 1 stages): the
same micro-batches and weights, but the model's schedule runs them (`train_pipeline`: 1F1B, the loss
`_part_loss` on the last stage from its logits) and its forward-only schedule gives the proximal and
reference log-probs (`logprobs`); the metrics come back from the last stage to every rank.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from mgrpo.algo.loss import AggMode, agg_count, policy_loss
from mgrpo.batching import TokenBatch, collate
from mgrpo.config import OptimConfig
from mgrpo.models import logits_logprobs, token_logprobs
from mgrpo.records import Sample
from mgrpo.shared_prefix import shared_prefix_logprobs, shares_prefixes


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
    microbatch_tokens: int = 0
    shared_prefix: bool = True

    @classmethod
    def of(cls, optim: OptimConfig, temperature: float) -> UpdateSettings:
        """A role's settings from its job config: `optim`'s fields of the same names, and the temperature
        its rollouts sample at."""
        names = {f.name for f in fields(cls)} - {"temperature"}
        return cls(**optim.model_dump(include=names), temperature=temperature)


def ppo_update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    settings: UpdateSettings,
    *,
    pad_id: int,
    seed: int = 0,
    ref_model: PreTrainedModel | Callable[..., Any] | None = None,
    version: int | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict[str, float]:
    """Run `ppo_epochs` passes of minibatch updates on `samples` (advantages filled); returns mean
    metrics (loss, clip_frac, approx_kl, grad_norm, tokens; kl_ref with a `ref_model`; is_weight_mean,
    is_capped_frac when any sample is stale). Samples whose advantage is 0 still count (they are real
    group members). `ref_model` (frozen; a model or its forward, e.g. a LoRA role's base with the adapter
    off) is needed when `settings.kl_coef` > 0. `version`: the policy
    version being trained; a sample whose `policy_version` is older is stale (None: none is).
    `shard`: (rank, world) of a data-parallel update (module docstring); every rank gets the same
    metrics."""
    if settings.kl_coef > 0 and ref_model is None:
        raise ValueError("kl_coef > 0 needs ref_model (the frozen starting model)")
    if not samples:
        return {"samples": 0.0}
    stale = None if version is None else [s.policy_version < version for s in samples]
    rng = random.Random(seed)
    orders = []
    for _ in range(settings.ppo_epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        orders.append(order)
    # one epoch: the first minibatch's forward runs on the pre-update weights (later epochs see it again after steps)
    first = set(orders[0][: settings.minibatch_size]) if settings.ppo_epochs == 1 else set()
    prox = _proximal_logprobs(model, samples, stale, settings, pad_id, first)
    totals: dict[str, float] = {}
    n_updates = 0
    model.train()
    for order in orders:
        for start in range(0, len(order), settings.minibatch_size):
            idx = order[start : start + settings.minibatch_size]
            metrics = _minibatch(
                model,
                optimizer,
                [samples[i] for i in idx],
                settings,
                pad_id,
                ref_model,
                None if prox is None else [prox[i] for i in idx],
                shard,
            )
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v
            n_updates += 1
    model.eval()
    out = {k: v / n_updates for k, v in totals.items()}
    out["samples"] = float(len(samples))
    out["updates"] = float(n_updates)
    return out


class _OwnForward:
    """The logp_prox of a stale sample in the first minibatch of a one-epoch update: the detached
    log-probs of that minibatch's own forward, which runs on the weights before any step of this
    update — the proximal pass's weights — so that pass is not run for it (with one minibatch, not at
    all). With more epochs the row comes back after steps, so the pass runs for every stale row."""


OWN_FORWARD = _OwnForward()
Prox = torch.Tensor | _OwnForward | None


def _proximal_logprobs(
    model: PreTrainedModel,
    samples: Sequence[Sample],
    stale: Sequence[bool] | None,
    s: UpdateSettings,
    pad_id: int,
    first: set[int],
) -> list[Prox] | None:
    """logp_prox of every stale sample (its shifted token log-probs under `model` before this update,
    length len − 1): `OWN_FORWARD` for those in `first` (the first minibatch's rows); None for fresh
    ones; None overall when no sample is stale."""
    if stale is None or not any(stale):
        return None
    out: list[Prox] = [OWN_FORWARD if flag and i in first else None for i, flag in enumerate(stale)]
    idx = [i for i, flag in enumerate(stale) if flag and i not in first]
    if not idx:
        return out
    model.train()  # the mode the loss's forward runs in
    chunks = [idx[start : start + s.minibatch_size] for start in range(0, len(idx), s.minibatch_size)]
    batches = [collate([samples[i].transcript for i in chunk], pad_id).to(model.device) for chunk in chunks]
    with torch.no_grad():
        if getattr(model, "pipelined", False):  # one run of its schedule
            ids = [(b.input_ids, b.attention_mask) for b in batches]
            logps = model.logprobs(ids, s.temperature)  # type: ignore[operator]
        else:
            logps = [_logprobs(model, b, replace(s, compile=False)) for b in batches]
    for chunk, logp in zip(chunks, logps, strict=True):
        for row, i in enumerate(chunk):
            out[i] = logp[row, : len(samples[i].transcript) - 1].float().cpu()
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


def equal_count(cuts: list[list[int]], n: int) -> tuple[list[list[int]], int]:
    """`cuts` (a rank's micro-batches) made `n`, for a rank with fewer than another: the micro-batch
    with the most rows split in two (each half within the token bound) while one has two rows, then
    fillers — its first row again, to train with weight 0 — after the real ones; and how many are
    real."""
    out = [list(c) for c in cuts]
    while len(out) < n and any(len(c) > 1 for c in out):
        j = max(range(len(out)), key=lambda i: len(out[i]))
        half = len(out[j]) // 2
        out[j : j + 1] = [out[j][:half], out[j][half:]]
    return out + [out[0][:1]] * (n - len(out)), len(out)


def _max_over_ranks(n: int, device: torch.device) -> int:
    count = torch.tensor([n], dtype=torch.long, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count)


def microbatches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """The row indices of a minibatch cut into micro-batches for the forward/backward: sorted by length
    (stable) and filled while the micro-batch's padded size (rows × its longest row) stays within
    `max_tokens`, so short rows are not padded to the longest of the whole minibatch. A row longer
    than `max_tokens` gets a micro-batch of its own; `max_tokens` 0 keeps the minibatch whole."""
    if max_tokens <= 0:
        return [list(range(len(lengths)))] if lengths else []
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):  # ascending: the new row is the longest
        if out and (len(out[-1]) + 1) * lengths[i] <= max_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _minibatch(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch_samples: list[Sample],
    s: UpdateSettings,
    pad_id: int,
    ref_model: PreTrainedModel | Callable[..., Any] | None,
    prox: list[Prox] | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict[str, float]:
    """One optimizer step on a minibatch: this rank's rows (all of them at W = 1), in micro-batches
    whose losses, each over its own denominator, are weighted by their part of the minibatch's
    (`agg_count`), so the accumulated gradient is the one-batch gradient."""
    rank, world = shard
    total = agg_count([x.transcript.mask[1:] for x in batch_samples], s.loss_agg)
    share, idle = 1.0, False  # this rank's part of the minibatch's denominator; a rank without a row
    if world > 1:
        idle = rank >= len(batch_samples)
        rows = [0] if idle else list(range(rank, len(batch_samples), world))  # a row with weight 0
        # when none is left: the collectives need every rank
        batch_samples, prox = (
            [batch_samples[i] for i in rows],
            None if prox is None else [prox[i] for i in rows],
        )
        share = (
            0.0
            if idle
            else agg_count([x.transcript.mask[1:] for x in batch_samples], s.loss_agg) / max(total, 1)
        )
    optimizer.zero_grad()
    cuts = microbatches([len(x.transcript) for x in batch_samples], s.microbatch_tokens)
    n_real = len(cuts)
    if world > 1:  # every rank runs as many forwards (their collectives pair up)
        cuts, n_real = equal_count(cuts, _max_over_ranks(len(cuts), model.device))
    micro = [[batch_samples[i] for i in idx] for idx in cuts]
    micro_prox = [None if prox is None else [prox[i] for i in idx] for idx in cuts]
    weights = [
        0.0 if idle or j >= n_real else _weight(part, total, len(batch_samples), s)
        for j, part in enumerate(micro)
    ]
    if getattr(model, "pipelined", False):  # its schedule runs the micro-batches
        part_metrics = _pipelined(model, micro, weights, s, pad_id, ref_model, micro_prox)
    else:
        part_metrics = []
        for part, weight, p in zip(micro, weights, micro_prox, strict=True):
            loss, m = _loss(model, part, s, pad_id, ref_model, p)
            (loss * (weight * world)).backward()
            part_metrics.append(m)
    tokens = [0.0 if idle else float(sum(sum(x.transcript.mask[1:]) for x in part)) for part in micro]
    parts = list(zip(part_metrics, weights, tokens, strict=True))[: max(n_real, 1)]  # not the fillers
    metrics = _combine(parts, share)
    clip = getattr(model, "clip_grad_norm_", None)  # a tensor-parallel model clips by its whole norm
    grad_norm = (
        clip(s.max_grad_norm) if clip else torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
    )
    optimizer.step()
    metrics["grad_norm"] = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    return reduce_metrics(metrics, share) if world > 1 else metrics


def _weight(part: list[Sample], total: float, rows: int, s: UpdateSettings) -> float:
    """A micro-batch's part of its minibatch's loss denominator (`total`; by rows when it is 0)."""
    if not total:
        return len(part) / rows
    return agg_count([x.transcript.mask[1:] for x in part], s.loss_agg) / total


# Metrics that are means over trained tokens (the rest: `loss` and `pg_loss`, over the loss's denominator).
TOKEN_MEANS = (
    "clip_frac",
    "approx_kl",
    "ratio_mean",
    "kl_ref",
    "is_weight_mean",
    "is_capped_frac",
    "entropy",
)


def _combine(parts: list[tuple[dict[str, float], float, float]], share: float) -> dict[str, float]:
    """This rank's minibatch metrics from its micro-batches' (metrics, weight in the minibatch's loss,
    trained tokens): token means weighted by tokens, the loss by its weights, `ratio_max` the max."""
    tokens = sum(t for _, _, t in parts)
    if len(parts) == 1:
        return {**parts[0][0], "tokens": tokens}
    out = {"tokens": tokens}
    for k in parts[0][0]:
        if k == "ratio_max":
            out[k] = max(m[k] for m, _, _ in parts)
        elif k in TOKEN_MEANS:
            out[k] = sum(m[k] * t for m, _, t in parts) / tokens if tokens else 0.0
        else:
            out[k] = sum(m[k] * w for m, w, _ in parts) / share if share else 0.0
    return out


def _loss(
    model: PreTrainedModel,
    part: list[Sample],
    s: UpdateSettings,
    pad_id: int,
    ref_model: PreTrainedModel | Callable[..., Any] | None,
    prox: list[Prox] | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's loss over its own denominator, and its metrics."""
    batch, adv, logp_prox, own = _inputs(part, pad_id, prox, model.device)
    ref_logp = None
    if ref_model is not None:
        with torch.no_grad():
            ref_logp = _logprobs(
                ref_model, batch, replace(s, compile=False)
            )  # the frozen model: never compiled
    logp = _logprobs(model, batch, s)
    return _part_loss(logp, batch, adv, _with_own(logp_prox, own, logp), ref_logp, s)


def _with_own(
    logp_prox: torch.Tensor | None, own: torch.Tensor | None, logp: torch.Tensor
) -> torch.Tensor | None:
    """logp_prox with the `OWN_FORWARD` rows (`own`, (B,) bool) taken from this forward's `logp`."""
    if logp_prox is None or own is None:
        return logp_prox
    return torch.where(own.unsqueeze(-1), logp.detach(), logp_prox)


def _logprobs(
    model: PreTrainedModel | Callable[..., Any], batch: TokenBatch, s: UpdateSettings
) -> torch.Tensor:
    """Teacher-forced log-probs (B, T-1) of a batch for the loss: each shared prompt run once
    (`mgrpo.shared_prefix`; 0 before a row's first trained target) where the settings and the model
    allow it — a plain HF model in one process, not compiled — else `token_logprobs` of the whole rows
    (through the compiled forward with `compile`)."""
    if s.compile and isinstance(model, PreTrainedModel):
        return token_logprobs(
            compiled_forward(model), batch.input_ids, batch.attention_mask, temperature=s.temperature
        )
    if s.shared_prefix and shares_prefixes(model) is None:
        return shared_prefix_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.loss_mask, temperature=s.temperature
        )
    return token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=s.temperature)


def _inputs(
    part: list[Sample],
    pad_id: int,
    prox: list[Prox] | None,
    device: torch.device,
) -> tuple[TokenBatch, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """A micro-batch's padded batch, advantages (B,), logp_prox (None when no row is stale) and which
    rows take theirs from the forward (`OWN_FORWARD`; None when none)."""
    batch = collate([x.transcript for x in part], pad_id).to(device)
    logp_prox = own = None
    if prox is not None:  # fresh rows keep logp_old: their importance weight is exactly 1
        logp_prox = batch.logp_old.clone()
        for row, p in enumerate(prox):
            if isinstance(p, torch.Tensor):
                logp_prox[row, : p.numel()] = p.to(logp_prox.device)
        if any(p is OWN_FORWARD for p in prox):
            own = torch.tensor([p is OWN_FORWARD for p in prox], device=device)
    adv = torch.tensor([x.advantage for x in part], dtype=torch.float32, device=device)
    return batch, adv, logp_prox, own


def _part_loss(
    logp: torch.Tensor,
    batch: TokenBatch,
    adv: torch.Tensor,
    logp_prox: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    s: UpdateSettings,
) -> tuple[torch.Tensor, dict[str, float]]:
    loss, metrics = policy_loss(
        logp,
        batch.logp_old,
        adv,
        batch.loss_mask,
        clip_low=s.clip_low,
        clip_high=s.clip_high,
        agg=s.loss_agg,
        ref_logp=ref_logp,
        kl_coef=s.kl_coef,
        logp_prox=logp_prox,
        is_cap=s.is_cap,
    )
    metrics["loss"] = loss.item()
    return loss, metrics


def _pipelined(
    model: Any,
    parts: list[list[Sample]],
    weights: list[float],
    s: UpdateSettings,
    pad_id: int,
    ref_model: Any,
    prox: list[list[Prox] | None],
) -> list[dict[str, float]]:
    """A pipeline-parallel model's forward/backward of a minibatch's micro-batches: one run of its
    schedule, micro-batch i's loss scaled by `weights[i]` on the last stage; each one's metrics."""
    inputs = [_inputs(part, pad_id, p, model.device) for part, p in zip(parts, prox, strict=True)]
    ids = [(b.input_ids, b.attention_mask) for b, _, _, _ in inputs]
    refs = ref_model.logprobs(ids, s.temperature) if ref_model is not None else [None] * len(ids)

    def loss_fn(i: int, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        batch, adv, logp_prox, own = inputs[i]
        logp = logits_logprobs(logits, batch.input_ids, s.temperature)
        loss, m = _part_loss(logp, batch, adv, _with_own(logp_prox, own, logp), refs[i], s)
        return loss * weights[i], m

    result: list[dict[str, float]] = model.train_pipeline(ids, loss_fn)
    return result


def reduce_metrics(metrics: dict[str, float], share: float) -> dict[str, float]:
    """One minibatch's metrics over the ranks: the loss terms weighted by each rank's `share` of the
    loss denominator (so `loss` is the minibatch's loss), the token means (`TOKEN_MEANS`) by each
    rank's trained tokens (as `_combine` weights micro-batches), `tokens` summed, `ratio_max` the max,
    `grad_norm` (already global) as it is."""
    keys = sorted(k for k in metrics if k not in ("grad_norm", "ratio_max"))
    tokens = metrics.get("tokens", 0.0)
    weights = [1.0 if k == "tokens" else tokens if k in TOKEN_MEANS else share for k in keys]
    vals = torch.tensor([metrics[k] * w for k, w in zip(keys, weights, strict=True)], dtype=torch.float64)
    dist.all_reduce(vals)
    out = dict(zip(keys, vals.tolist(), strict=True))
    total = out.get("tokens", 0.0)
    for k in TOKEN_MEANS:
        if k in out:
            out[k] = out[k] / total if total else 0.0
    if "ratio_max" in metrics:
        top = torch.tensor([metrics["ratio_max"] if share > 0 else 0.0], dtype=torch.float64)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        out["ratio_max"] = float(top)
    out["grad_norm"] = metrics["grad_norm"]
    return out
