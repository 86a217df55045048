"""A role's policy sharded over the group's ranks with FSDP2 (`fully_shard` per decoder layer, then the
root; bf16 parameters with fp32 gradient reduction on GPU). Every rank builds it from the model's
config and takes rank 0's weights by broadcast, so only rank 0 (the service) reads the checkpoint.

The update is `mgrpo.training.ppo_update` with `shard=(rank, W)`; the full weights and the optimizer
state are gathered to rank 0 (`full_weights`, `full_optimizer_state`: FQN-keyed), or each rank writes and reads its own shard of
the optimizer state (`save_optimizer`, torch.distributed.checkpoint), so a checkpoint of W ranks
resumes on any other W, W = 1 included.

The weight sync after every update (`sync_into`, rank 0's full model: the rollout engine's) gathers
the shards in buckets: each rank > 0 packs its dim-0 shards of a bucket's parameters (padded to the
even chunk FSDP2 gives each rank) into one flat buffer (kept between syncs) and sends it to rank 0,
which meanwhile copies its own rows into its model's parameters, then each other rank's. `full_weights`
(one all-gather and one CPU copy per parameter) reached a fifth to a third of a raw broadcast's
bandwidth of the same bytes (`bench/ranks_bench.py`)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from mgrpo.checkpoint import FULL, is_sharded, load_sharded_optimizer, save_sharded_optimizer
from mgrpo.config import LoraSpec
from mgrpo.lora import base_forward, inject
from mgrpo.parallel.group import device
from mgrpo.parallel.transport import buckets
from mgrpo.records import Sample
from mgrpo.training import UpdateSettings, ppo_update

FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def _chunk_rows(rows: int, world: int) -> int:
    """The rows of dim 0 each rank holds (FSDP2's even chunks, the last ranks' padded)."""
    return -(-rows // world)


def decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    """The repeated blocks FSDP shards one by one (HF causal LMs keep them at `model.layers`)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__} has no .model.layers to shard; only HF decoder-only LMs are supported"
        )
    return cast(Sequence[torch.nn.Module], layers)


def _sharded(
    config: dict[str, Any], source: PreTrainedModel | None, lora: LoraSpec | None = None
) -> PreTrainedModel:
    """The model of `config` sharded over the group, with rank 0's `source` weights (None elsewhere);
    with `lora`, the model has the adapter's layers (rank 0's `source` has them already)."""
    if source is not None:
        model = copy.deepcopy(source)
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
        if lora is not None:
            inject(model, lora)
    torch.nn.Module.to(model, device())
    gpu = device().type == "cuda"
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if gpu
        else MixedPrecisionPolicy()
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    full = get_model_state_dict(source) if source is not None else {}
    set_model_state_dict(model, full, options=FROM_RANK0)
    return model


class ShardedPolicy:
    def __init__(
        self,
        config: dict[str, Any],
        lr: float,
        source: PreTrainedModel | None = None,
        optimizer_state: dict[str, Any] | None = None,
        *,
        with_ref: bool = False,
        ref_source: PreTrainedModel | None = None,
        lora: dict[str, Any] | None = None,
    ) -> None:
        """On every rank: `config` (the HF config dict), `lr`, `with_ref` (a frozen reference for the
        KL penalty); rank 0 passes `source` (its full model, copied, not changed), a full
        `optimizer_state` to resume and the reference's weights `ref_source` (None elsewhere).
        `lora` (a LoRA role, `mgrpo.lora`): the adapter's spec; the base is sharded too but frozen,
        only the adapter is trained and synced, and the KL reference is the base itself (the adapter
        switched off), not a second model."""
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.lora = None if lora is None else LoraSpec.model_validate(lora)
        self.model: PreTrainedModel = _sharded(config, source, self.lora)
        self.ref: Any = (
            _sharded(config, ref_source).requires_grad_(False).eval()
            if with_ref and self.lora is None
            else functools.partial(base_forward, self.model)
            if self.lora is not None
            else None
        )
        self._buffers: dict[int, torch.Tensor] = {}  # sync_into's, per bucket
        trained = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
        given: list[Any] = [optimizer_state if is_sharded(optimizer_state) else optimizer_state is not None]
        dist.broadcast_object_list(given, src=0)  # DCP shards: their folder, read by every rank
        if is_sharded(given[0]):
            load_sharded_optimizer(self.model, self.optimizer, given[0]["dcp"], no_dist=False)
        elif given[0]:
            set_optimizer_state_dict(self.model, self.optimizer, optimizer_state or {}, options=FROM_RANK0)

    def update(
        self,
        samples: Sequence[Sample],
        settings: UpdateSettings,
        *,
        pad_id: int,
        seed: int,
        version: int | None,
    ) -> dict[str, float]:
        return ppo_update(
            self.model,
            self.optimizer,
            samples,
            settings,
            pad_id=pad_id,
            seed=seed,
            version=version,
            ref_model=self.ref if settings.kl_coef > 0 else None,
            shard=(self.rank, self.world),
        )

    def sync_into(self, into: torch.nn.Module | None = None, bucket_mb: float = 256.0) -> None:
        """Every rank: copy the trained weights into rank 0's full `into` (same parameter names; None
        elsewhere): a LoRA role's adapter only. Bucketed gathers of the dim-0 shards (module docstring)."""
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad or self.lora is None}
        dest = dict(into.named_parameters()) if into is not None else {}
        shards = {  # each rank's padded dim-0 shard of every parameter, fp32
            n: torch.Size([_chunk_rows(p.shape[0], self.world), p.numel() // max(p.shape[0], 1)])
            for n, p in params.items()
        }
        for i, names in enumerate(buckets(shards, 4, bucket_mb)):
            self._gather_bucket(i, [(n, params[n]) for n in names], dest)

    def _gather_bucket(
        self, i: int, bucket: list[tuple[str, torch.Tensor]], dest: dict[str, torch.nn.Parameter]
    ) -> None:
        slots = [(_chunk_rows(p.shape[0], self.world), p.numel() // max(p.shape[0], 1)) for _, p in bucket]
        n = sum(c * w for c, w in slots)
        size = n * max(self.world - 1, 1)  # rank 0 receives every other rank's part; the others send theirs
        if (
            self._buffers.get(i, torch.empty(0)).numel() != size
        ):  # kept between syncs: no page faults each time
            self._buffers[i] = torch.zeros(size, dtype=torch.float32, device=device())
        buf = self._buffers[i]
        if (
            self.rank > 0
        ):  # pack this rank's shards and send them (point to point: gloo's gather measured slower)
            at = 0
            for (_, p), (c, w) in zip(bucket, slots, strict=True):
                local = p.to_local().detach().reshape(-1)  # type: ignore[attr-defined]
                buf[at : at + local.numel()] = local
                at += c * w
            dist.send(buf, dst=0)
            return
        parts = [buf[(r - 1) * n : r * n] for r in range(1, self.world)]
        reqs = [dist.irecv(part, src=r) for r, part in enumerate(parts, start=1)]
        with torch.no_grad():
            for (name, p), (c, _) in zip(bucket, slots, strict=True):  # rank 0's own rows meanwhile
                rows = min(c, p.shape[0])
                dest[name].view(p.shape[0], -1)[:rows].copy_(p.to_local().detach().reshape(rows, -1))  # type: ignore[attr-defined]
            for req in reqs:
                if req is not None:
                    req.wait()
            for r, part in enumerate(parts, start=1):
                at = 0
                for (name, p), (c, w) in zip(bucket, slots, strict=True):
                    lo, hi = min(r * c, p.shape[0]), min((r + 1) * c, p.shape[0])
                    dest[name].view(p.shape[0], -1)[lo:hi].copy_(
                        part[at : at + (hi - lo) * w].view(hi - lo, w)
                    )
                    at += c * w

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The gathered state dict on rank 0 (CPU), {} elsewhere: every rank must call it."""
        return cast(dict[str, torch.Tensor], get_model_state_dict(self.model, options=FULL))

    def save_optimizer(self, path: str) -> None:
        """Every rank: its shard of the optimizer state into the folder `path` (DCP; every rank must
        see it: one machine, or a volume they share)."""
        save_sharded_optimizer(self.model, self.optimizer, Path(path))

    def full_optimizer_state(self) -> dict[str, Any]:
        """The gathered, FQN-keyed optimizer state on rank 0, {} elsewhere: every rank must call it."""
        return cast(dict[str, Any], get_optimizer_state_dict(self.model, self.optimizer, options=FULL))
