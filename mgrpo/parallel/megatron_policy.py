"""A role's policy as a megatron-core GPTModel split over the group's W ranks by tensor parallelism
(`MGRPO_BACKEND=megatron`), with the interface of the FSDP2 `ShardedPolicy`, so rank 0's service
drives either the same way (`mgrpo.parallel.ranks`).

Every rank builds its share of the model from the HF config (`mgrpo.parallel.megatron`) and takes
rank 0's HF weights, broadcast tensor by tensor and sliced on each rank; every rank then runs the
same `ppo_update` on every row of the step (tensor parallelism splits each layer, not the batch).
Out of it come the HF names the rest of the system knows: `sync_into` gathers the shards into rank
0's full HF model (the rollout engine's), and the optimizer state is converted the same way as the
weights — per parameter `exp_avg` and `exp_avg_sq` — to the full, FQN-keyed form FSDP2 writes, so a
checkpoint of either backend on any W resumes on the other.

On the CPU the model runs inside `cpu_shim` (gloo; see mgrpo.parallel.megatron); on GPUs as is."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from mgrpo.agents.loop import Transcript
from mgrpo.parallel.group import device
from mgrpo.parallel.megatron import (
    MegatronCausalLM,
    cpu_shim,
    hf_to_megatron,
    load_into,
    megatron_to_hf,
    tensor_parallel,
)
from mgrpo.training import UpdateSettings, ppo_update

MOMENTS = ("exp_avg", "exp_avg_sq")


def _on_device() -> contextlib.AbstractContextManager[None]:
    return cpu_shim() if device().type == "cpu" else contextlib.nullcontext()


def _broadcast_hf(hf_config: Any, source: PreTrainedModel | None) -> dict[str, torch.Tensor]:
    """Rank 0's HF state dict on every rank, one tensor at a time (the shapes come from the config)."""
    with torch.device("meta"):
        shapes = AutoModelForCausalLM.from_config(hf_config).state_dict()
    mine = source.state_dict() if source is not None else {}
    out = {}
    for name, meta in shapes.items():
        t = (
            mine[name].detach().to(device(), torch.float32).contiguous()
            if source is not None
            else torch.empty(meta.shape, device=device())
        )
        dist.broadcast(t, src=0)
        out[name] = t.cpu()
    return out


class MegatronPolicy:
    def __init__(self, config: dict[str, Any], lr: float, source: PreTrainedModel | None = None,
                 optimizer_state: dict[str, Any] | None = None, *, with_ref: bool = False,
                 ref_source: PreTrainedModel | None = None) -> None:  # fmt: skip
        """On every rank: `config` (the HF config dict), `lr`, `with_ref` (a frozen reference for the
        KL penalty); rank 0 passes `source` (its full HF model, not changed), a full FQN-keyed
        `optimizer_state` to resume and the reference's weights `ref_source` (None elsewhere)."""
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.hf_config = AutoConfig.for_model(**config)
        tensor_parallel(self.world)
        self.model = self._split(source)
        self.ref = self._split(ref_source).requires_grad_(False).eval() if with_ref else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self._load_optimizer_state(optimizer_state)

    def _split(self, source: PreTrainedModel | None) -> MegatronCausalLM:
        """This rank's share of rank 0's HF `source` (None elsewhere) as a GPTModel."""
        with _on_device():
            model = MegatronCausalLM(self.hf_config, self.world).to(device())
            shard = hf_to_megatron(
                _broadcast_hf(self.hf_config, source), self.hf_config, self.world, self.rank
            )
            load_into(model.gpt, shard)
        return model

    def update(self, samples: Sequence[tuple[Transcript, float]], settings: UpdateSettings, *,
               pad_id: int, seed: int, stale: Sequence[bool] | None) -> dict[str, float]:  # fmt: skip
        with _on_device():
            model, ref = (
                cast(PreTrainedModel, self.model),
                cast(PreTrainedModel | None, self.ref if settings.kl_coef > 0 else None),
            )  # the HF call
            return ppo_update(
                model, self.optimizer, samples, settings, pad_id=pad_id, seed=seed, stale=stale, ref_model=ref
            )

    def _gathered(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """HF-named full tensors on rank 0 ({} elsewhere) from every rank's megatron-named shards:
        one gather per tensor, in the same order on every rank (tensor-parallel shards are equal in size)."""
        shards: list[dict[str, torch.Tensor]] = [{} for _ in range(self.world)]
        for name in sorted(local):
            t = local[name].detach().contiguous()
            parts = [torch.empty_like(t) for _ in range(self.world)] if self.rank == 0 else None
            dist.gather(t, parts, dst=0)
            for r, part in enumerate(parts or []):
                shards[r][name] = part.cpu()
        return megatron_to_hf(shards, self.hf_config) if self.rank == 0 else {}

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The HF state dict on rank 0, {} elsewhere: every rank must call it."""
        return self._gathered(
            {k: v for k, v in self.model.gpt.state_dict().items() if not k.endswith("_extra_state")}
        )

    def sync_into(self, into: torch.nn.Module | None = None, bucket_mb: float = 256.0) -> None:
        """Every rank: the trained weights into rank 0's full HF `into` (None elsewhere); `bucket_mb`
        is the FSDP2 policy's (the tensors go one by one here)."""
        full = self.full_weights()
        if into is not None:
            with torch.no_grad():
                for name, p in into.state_dict().items():
                    p.copy_(full[name])

    def _named(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return ((n.removeprefix("gpt."), p) for n, p in self.model.named_parameters())

    def full_optimizer_state(self) -> dict[str, Any]:
        """The optimizer state, gathered and FQN-keyed as FSDP2's full form, on rank 0 ({} elsewhere)."""
        named = list(self._named())
        moments = {
            m: {n: self.optimizer.state[p][m] for n, p in named if p in self.optimizer.state} for m in MOMENTS
        }
        if not moments["exp_avg"]:
            return {}  # never stepped
        full = {m: self._gathered(moments[m]) for m in MOMENTS}
        if self.rank > 0:
            return {}
        step = next(iter(self.optimizer.state.values()))["step"]
        names = [
            n for n in full["exp_avg"] if not (self.hf_config.tie_word_embeddings and n == "lm_head.weight")
        ]
        group = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        return {
            "state": {n: {"step": step.clone(), **{m: full[m][n] for m in MOMENTS}} for n in names},
            "param_groups": [{**group, "params": names}],
        }

    def _load_optimizer_state(self, state: dict[str, Any] | None) -> None:
        """Every rank: rank 0's full FQN-keyed state (None elsewhere; None on rank 0 too: a fresh start)
        into this rank's shards."""
        box = [state]
        dist.broadcast_object_list(box, src=0)
        full = box[0]
        if not full:
            return
        if all(isinstance(k, int) for k in full.get("state", {})):
            raise ValueError(
                "an index-keyed optimizer state (an earlier version's checkpoint) cannot be resharded; resume it on one process"
            )
        by_name = full["state"]
        hf = {m: {n: s[m] for n, s in by_name.items()} for m in MOMENTS}
        shards = {m: hf_to_megatron(hf[m], self.hf_config, self.world, self.rank) for m in MOMENTS}
        step = next(iter(by_name.values()))["step"]
        for n, p in self._named():
            self.optimizer.state[p] = {
                "step": step.clone(),
                **{m: shards[m][n].to(p.device).clone() for m in MOMENTS},
            }
        for group in self.optimizer.param_groups:
            group.update({k: v for k, v in full["param_groups"][0].items() if k != "params"})
