"""A role's policy as a megatron-core GPTModel split over the group's W ranks (`MGRPO_BACKEND=megatron`)
by tensor parallelism over T = W / P ranks on each of P pipeline stages (`MGRPO_PIPELINE_STAGES`,
default 1) — a Qwen3-MoE model by expert parallelism instead: its experts over all W ranks, the rest
replicated, each rank training its own rows of every minibatch (`ppo_update`'s data-parallel
`shard`) — with the interface of the FSDP2 `ShardedPolicy`, so rank 0's service drives either the
same way (`mgrpo.parallel.ranks`).

Every rank builds its share of the model from the HF config (`mgrpo.parallel.megatron`) and
receives only its share of rank 0's HF weights, converted on rank 0 one rank at a time and sent in
buckets (`mgrpo.parallel.transport`; a resumed optimizer state's moments the same way); every rank
then runs the same `ppo_update` on every row of the step (tensor parallelism splits each layer and
the stages the layers, not the batch; with P > 1 the update's micro-batches go through megatron-
core's 1F1B schedule, `mgrpo.parallel.megatron_pipeline`). Out of it come the HF names the rest of
the system knows: `sync_into` gathers the shards
in buckets and copies them, converted, into rank 0's full HF model (the rollout engine's), and the
optimizer state is converted the same way as the weights — per parameter `exp_avg` and `exp_avg_sq`
— to the full, FQN-keyed form FSDP2 writes, so a checkpoint of either backend on any W resumes on
the other.

On the CPU the model runs inside `cpu_shim` (gloo; see mgrpo.parallel.megatron_cpu); on GPUs as is."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from mgrpo.parallel.group import device
from mgrpo.parallel.megatron import check_split, copy_into_hf, empty_hf, hf_to_megatron, is_moe, place, tie_hf
from mgrpo.parallel.megatron_cpu import cpu_shim
from mgrpo.parallel.megatron_model import MegatronCausalLM, load_into, model_parallel
from mgrpo.parallel.transport import Transport
from mgrpo.records import Sample
from mgrpo.training import UpdateSettings, ppo_update

MOMENTS = ("exp_avg", "exp_avg_sq")


def _on_device() -> contextlib.AbstractContextManager[None]:
    return cpu_shim() if device().type == "cpu" else contextlib.nullcontext()


def _layout(hf_config: Any, share: dict[str, int]) -> dict[str, torch.Size]:
    """The names and shapes of a rank's megatron-core `share` (the same on every rank), worked out on
    the meta device."""
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(hf_config).state_dict()
        return {name: t.shape for name, t in hf_to_megatron(meta, hf_config, **share).items()}


class MegatronPolicy:
    def __init__(
        self,
        config: dict[str, Any],
        lr: float,
        source: PreTrainedModel | None = None,
        optimizer_state: dict[str, Any] | None = None,
        *,
        with_ref: bool = False,
        ref_source: PreTrainedModel | None = None,
        bucket_mb: float = 256.0,
        pipeline: int = 1,
    ) -> None:
        """On every rank: `config` (the HF config dict), `lr`, `with_ref` (a frozen reference for the
        KL penalty), `bucket_mb` (the transport's, until `sync_into` sets its own), `pipeline` (the
        stages P, dividing W); rank 0 passes `source` (its full HF model, not changed), a full
        FQN-keyed `optimizer_state` to resume and the reference's weights `ref_source` (None elsewhere)."""
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if pipeline < 1 or self.world % pipeline:
            raise ValueError(f"{pipeline} pipeline stages must divide the role's {self.world} ranks")
        self.hf_config = AutoConfig.for_model(**config)
        self.pp, self.tp, self.ep = pipeline, self.world // pipeline, 1
        if is_moe(self.hf_config):  # the experts split over every rank, the rest data parallel
            self.tp, self.ep = 1, self.world
            check_split(self.hf_config, 1, pipeline, self.ep)
        self.dp = self.world // (self.tp * self.pp)
        model_parallel(self.tp, self.pp, ep=self.ep)
        layouts: dict[int, dict[str, torch.Size]] = {}  # each rank's, worked out once (rank 0 asks)

        def layout_of(r: int) -> dict[str, torch.Size]:
            if r not in layouts:
                layouts[r] = _layout(self.hf_config, self.share(r))
            return layouts[r]

        def owned_of(r: int) -> dict[str, torch.Size]:
            return {n: shape for n, shape in layout_of(r).items() if self._owns(r, n)}

        varies = self.pp > 1 or self.ep > 1
        self.transport = Transport(bucket_mb, layout_of if varies else None)
        self.gather_layout = owned_of if varies else None  # what each rank sends back: its own part
        self.layout = layout_of(self.rank)
        self.model = self._split(source)
        self.ref = self._split(ref_source).requires_grad_(False).eval() if with_ref else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self._load_optimizer_state(optimizer_state)

    def share(self, r: int) -> dict[str, int]:
        """Where global rank `r`'s share sits (`place`; its data-parallel rank is its expert-parallel
        one here): hf_to_megatron's and copy_into_hf's keyword arguments."""
        t, d, stage = place(r, self.tp, self.dp)
        return {
            "tp": self.tp,
            "rank": t,
            "pp": self.pp,
            "stage": stage,
            "ep": self.ep,
            "expert_rank": d if self.ep > 1 else 0,
        }

    def _owns(self, r: int, name: str) -> bool:
        """Whether rank `r` sends `name` back (data-parallel copies: only the first rank's, but each
        rank its own experts)."""
        return place(r, self.tp, self.dp)[1] == 0 or ".local_experts." in name

    def _split(self, source: PreTrainedModel | None) -> MegatronCausalLM:
        """This rank's share of rank 0's HF `source` (None elsewhere) as a GPTModel."""
        with _on_device():
            at = self.share(self.rank)
            model = MegatronCausalLM(
                self.hf_config, self.tp, pp=self.pp, stage=at["stage"], ep=self.ep, dp=self.dp
            ).to(device())
            full = source.state_dict() if source is not None else None
            load_into(model.gpt, self._scattered(full))
        return model

    def _scattered(self, full: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """Every rank: its megatron-core share of rank 0's HF-named `full` (None elsewhere), sent in
        buckets; no rank but 0 ever holds more than its share."""

        def shard_of(r: int) -> dict[str, torch.Tensor]:
            return hf_to_megatron(full or {}, self.hf_config, **self.share(r))

        like = torch.empty(0, dtype=torch.float32, device=device())
        return self.transport.scatter(shard_of if full is not None else None, self.layout, like)

    def update(
        self,
        samples: Sequence[Sample],
        settings: UpdateSettings,
        *,
        pad_id: int,
        seed: int,
        version: int | None,
    ) -> dict[str, float]:
        with _on_device():
            model, ref = (
                cast(PreTrainedModel, self.model),
                cast(PreTrainedModel | None, self.ref if settings.kl_coef > 0 else None),
            )  # the HF call
            shard = (self.rank, self.world) if self.dp > 1 else (0, 1)  # dp > 1: experts, tp = pp = 1
            return ppo_update(
                model,
                self.optimizer,
                samples,
                settings,
                pad_id=pad_id,
                seed=seed,
                version=version,
                ref_model=ref,
                shard=shard,
            )

    def _gathered(
        self, local: dict[str, torch.Tensor], into: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Every rank: its megatron-named shards. Rank 0 gets them whole, HF-named: copied into `into`'s
        tensors (fresh CPU ones when None) as they arrive, in buckets; {} elsewhere."""
        shards = {n: t.detach() for n, t in local.items() if self._owns(self.rank, n)}
        if self.rank > 0:
            self.transport.gather(shards, lambda r, part: None)
            return {}
        like = torch.empty(0, dtype=next(iter(shards.values())).dtype)
        out = into if into is not None else empty_hf(self.hf_config, like)
        self.transport.gather(
            shards,
            lambda r, part: copy_into_hf(part, self.hf_config, hf=out, **self.share(r)),
            self.gather_layout,
        )
        return tie_hf(out, self.hf_config) if into is None else out

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The HF state dict on rank 0, {} elsewhere: every rank must call it."""
        return self._gathered(self._weights())

    def _weights(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.model.gpt.state_dict().items() if not k.endswith("_extra_state")}

    def sync_into(self, into: torch.nn.Module | None = None, bucket_mb: float = 256.0) -> None:
        """Every rank: the trained weights into rank 0's full HF `into` (None elsewhere), gathered in
        buckets of `bucket_mb` and copied into `into`'s parameters as they arrive."""
        self.transport.bucket_mb = bucket_mb
        with torch.no_grad():
            # the parameters themselves, not .data: a copy into them must move their version, which
            # the rollout engine's decoder watches
            dest: dict[str, torch.Tensor] | None = dict(into.named_parameters()) if into is not None else None
            self._gathered(self._weights(), into=dest)

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
        into this rank's shards. The step and the group's settings are broadcast; the moments are
        scattered like the weights, so no rank but 0 holds more than its share."""
        header: dict[str, Any] | None = None
        if state:
            by_name = state.get("state", {})
            if all(isinstance(k, int) for k in by_name):
                header = {"index_keyed": True}
            else:
                group = {k: v for k, v in state["param_groups"][0].items() if k != "params"}
                header = {"step": next(iter(by_name.values()))["step"], "group": group}
        box = [header]
        dist.broadcast_object_list(box, src=0)
        header = box[0]
        if not header:
            return
        if header.get("index_keyed"):
            raise ValueError(
                "an index-keyed optimizer state (an earlier version's checkpoint) cannot be resharded; resume it on one process"
            )
        moments = {
            m: self._scattered({n: s[m] for n, s in state["state"].items()} if state else None)
            for m in MOMENTS
        }
        for n, p in self._named():
            self.optimizer.state[p] = {
                "step": header["step"].clone(),
                **{m: moments[m][n].to(p.device) for m in MOMENTS},
            }
        for group in self.optimizer.param_groups:
            group.update(header["group"])
