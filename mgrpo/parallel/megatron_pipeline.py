"""Pipeline parallelism for the megatron-core backend: a minibatch's micro-batches through megatron-
core's non-interleaved 1F1B schedule (`get_forward_backward_func`), the PPO loss on the last stage.

Every rank of the group gets the same micro-batches (input_ids, attention_mask; their lengths may
differ: the stages exchange activation shapes, `variable_seq_lengths`). The first stage embeds the
tokens, each stage runs its layers on what the previous one sent, the last computes the logits and
`loss_fn(i, logits)` → (micro-batch i's loss as the minibatch's loss weights it, what to report).
The schedule divides every loss by the number of micro-batches (its convention for a mean), so it is
handed the loss times that number: the accumulated gradients are those of the losses as given.
What the last stage reports (its metrics, or its log-probs) is sent to every rank, so every rank
returns the same, as `ppo_update` expects of every backend.

On the CPU the schedule runs inside `cpu_shim` (mgrpo.parallel.megatron_cpu's docstring says what
it changes); on GPUs as is."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from mgrpo.models import logits_logprobs
from mgrpo.parallel.megatron_cpu import causal_mask, cpu_shim

Inputs = list[tuple[torch.Tensor, torch.Tensor]]


def _run(
    model: Any,
    inputs: Inputs,
    loss_fn: Callable[[int, torch.Tensor], tuple[torch.Tensor, Any]],
    forward_only: bool,
) -> list[Any]:
    """One pass of the schedule; what `loss_fn` kept per micro-batch on the last stage ([] elsewhere)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func  # megatron-core: optional and heavy

    n = len(inputs)

    def step(data: Any, gpt: torch.nn.Module) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
        i, (ids, mask) = next(data)
        out = gpt(ids, None, attention_mask=causal_mask(mask))  # later stages: what the previous sent

        def loss(logits: torch.Tensor) -> tuple[torch.Tensor, Any]:
            value, kept = loss_fn(i, logits[..., : model.vocab])
            return value * n, kept  # the schedule divides by n

        return out, loss

    with cpu_shim() if model.device.type == "cpu" else contextlib.nullcontext():
        kept = get_forward_backward_func()(
            forward_step_func=step,
            data_iterator=iter(enumerate(inputs)),
            model=[model.gpt],
            num_microbatches=n,
            seq_length=max(ids.shape[1] for ids, _ in inputs),
            micro_batch_size=max(ids.shape[0] for ids, _ in inputs),
            forward_only=forward_only,
        )
    return list(kept)


def _last_stage_rank() -> int:
    """A rank of the last stage, the same on every rank: the last (megatron-core's order, stages
    slowest, with no data parallelism)."""
    return dist.get_world_size() - 1


def train_pipeline(
    model: Any, inputs: Inputs, loss_fn: Callable[[int, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]
) -> list[dict[str, float]]:
    """Forward and backward of every micro-batch (gradients accumulate; the caller steps); each
    micro-batch's metrics, on every rank."""
    box = [_run(model, inputs, loss_fn, forward_only=False)]
    dist.broadcast_object_list(box, src=_last_stage_rank())
    return box[0]


def pipeline_logprobs(model: Any, inputs: Inputs, temperature: float) -> list[torch.Tensor]:
    """Teacher-forced log-probs (B, T − 1) of every micro-batch (`mgrpo.models.token_logprobs`'s), no
    gradient, on every rank."""

    def keep(i: int, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return logits.new_zeros(()), logits_logprobs(logits, inputs[i][0], temperature)

    with torch.no_grad():
        kept = _run(model, inputs, keep, forward_only=True)
    out = []
    for i, (ids, _) in enumerate(inputs):
        logp = kept[i].float() if kept else torch.empty(ids.shape[0], ids.shape[1] - 1, device=model.device)
        dist.broadcast(logp, src=_last_stage_rank())
        out.append(logp)
    return out
