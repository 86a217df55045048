"""One role's model as its trainer holds it, for every trainer of every workflow: the starting
weights (warm start, a `path`, or the role's checkpoint of the last step its ledger holds), the
optimizer, the rollout engine, the frozen reference (KL), the update on `Sample`s and the checkpoint.
The trainers add the store around it (ledger, policy versions, streams).

Staleness (max_staleness ≥ 1, pipelined): the `hf` engine samples from its own copy of the weights,
so rollouts never pause for an update; each update is pushed to it and bumps the policy version. A
sample's staleness is the trained version minus the version that sampled it (its oldest turn). Within
the bound it is trained with the importance-weight correction (`mgrpo.training`); beyond it,
`stale_samples` decides: `drop` (counted) or `keep-with-correction`. Reported per update:
`staleness_<k>` (share of samples k versions old), `stale_dropped`, `stale_beyond_bound`.

On W ranks (the service started under torchrun, `mgrpo.parallel`): this object lives on rank 0 and
keeps the full model the engine and the checkpoints use; the update runs on the policy held by all
ranks (FSDP2 shards, or megatron-core tensor parallel with `MGRPO_BACKEND=megatron`; the KL
reference sharded alike), and its gathered weights are loaded back into the full model after every
update (the weight sync, `weight_sync_s` per update). W = 1 trains `model` itself, as always.

A LoRA role (`roles.<r>.lora`, `mgrpo.lora`): `model` is the frozen base with the adapter's layers in
it, the optimizer holds the adapter only, the engine samples from `served` (base + adapter merged after
every update: `weight_sync_s`, and `adapter_bytes`, what a remote engine takes), the KL reference is
the base with the adapter off, and checkpoints are peft adapter folders. On W ranks (fsdp) every rank
holds the adapter's layers on its shard of the frozen base and the sync gathers the adapter only. Rollout servers
(SGLang, `mgrpo engine`) start on the base and load each checkpoint's adapter folder (SGLang's LoRA API)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from mgrpo.checkpoint import (
    CheckpointInfo,
    checkpoint_meta,
    full_optimizer_state,
    is_sharded,
    latest_checkpoint,
    load_optimizer_state,
    optimizer_state,
    restore_trainer_state,
    save_checkpoint,
)
from mgrpo.engines.hf import HFEngine
from mgrpo.engines.replicas import ReplicatedEngine
from mgrpo.engines.sglang import SGLangEngine
from mgrpo.lora import Adapter
from mgrpo.models import load, place
from mgrpo.parallel.group import joined_world
from mgrpo.parallel.ranks import RankGroup
from mgrpo.records import Sample
from mgrpo.runtime import Placement, reference_model, role_model_source, rollout_engine
from mgrpo.training import UpdateSettings, ppo_update
from mgrpo.workflows import JobSpec

UPDATE_NICE = 10  # how much lower than the engine's decode steps an update runs while they share a core


@contextlib.contextmanager
def _yielding(on: bool) -> Iterator[None]:
    """Run the calling thread's update at a lower CPU priority while the engine keeps decoding on its
    own weights (pipelined): a decode step another role waits on preempts the update, which fills the
    idle time. Linux thread nice; restored afterwards where allowed."""
    if not on or not hasattr(os, "setpriority"):
        yield
        return
    tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, tid)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, min(before + UPDATE_NICE, 19))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # lowering nice again needs CAP_SYS_NICE: else it stays
            os.setpriority(os.PRIO_PROCESS, tid, before)


def _start_note(
    role: str, resume: CheckpointInfo | None, adapter: Adapter | None, shown: Callable[[Path], str]
) -> str:
    """What a trainer says of how its role's model started: resumed (from which checkpoint), and a
    LoRA role's adapter ('' when it started fresh with all its weights trained)."""
    parts = [f"{role} resumed at step {resume.step + 1} from {shown(resume.path)}"] if resume else []
    if adapter is not None:
        trained = sum(p.numel() for p in adapter.trainable())
        total = sum(p.numel() for p in adapter.model.parameters())
        parts.append(
            f"{role} trains a LoRA adapter (rank {adapter.spec.rank}, {trained:,} of {total:,} parameters, "
            f"{100 * trained / total:.1f}%) on {adapter.base_path}"
        )
    return "; ".join(parts)


def _check_lora_placement(role: str, placement: Placement, world: int) -> None:
    """A LoRA role trains in one process or on FSDP2 ranks; its rollout servers take adapter folders."""
    if placement.ranks is not None and not placement.ranks.trains_adapters:
        raise ValueError(
            f"roles.{role}.lora: a LoRA role trains on W ranks with the fsdp backend; start its trainer "
            f"with --backend fsdp (this one runs {placement.ranks.backend}), or drop lora"
        )
    if placement.sglang_url and placement.sglang_sync_host:
        raise ValueError(
            f"roles.{role}.lora: a LoRA role sends its rollout servers the adapter folder of each "
            "checkpoint, not its weights by broadcast: start its trainer without MGRPO_SGLANG_SYNC_HOST"
        )


def _check_shared_base(role: str, base_of: RoleModel, own_adapter_here: bool) -> None:
    """A role on another role's base trains an adapter of its own in that role's process, rolling out
    in it (`own_adapter_here`: it has a lora and runs in one process) or on its rollout servers (each
    role's adapters under names of its own, `mgrpo.engines.sglang`)."""
    if base_of.adapter is None or not own_adapter_here:
        raise ValueError(
            f"roles.{role}: a role on another role's base needs both to train LoRA adapters, in one process"
        )


def _loads_adapters(engine: object) -> TypeGuard[SGLangEngine | ReplicatedEngine]:
    """Whether the engine's servers take a LoRA role's adapter folders (SGLang's LoRA API)."""
    return isinstance(engine, SGLangEngine | ReplicatedEngine)


def _broadcasts(engine: object) -> TypeGuard[SGLangEngine | ReplicatedEngine]:
    """Whether the engine's servers take each policy by broadcast (else from the checkpoint folder)."""
    return isinstance(engine, SGLangEngine | ReplicatedEngine) and engine.broadcasts


class RoleModel:
    def __init__(
        self,
        job: JobSpec,
        role: str,
        *,
        placement: Placement,
        job_id: str,
        last_step: int,
        max_batch: int = 64,
        base_of: RoleModel | None = None,
    ) -> None:
        """`role`: whose model, update settings and checkpoints these are. `last_step`: the last step
        the ledger holds for the role (-1: none), resumed from its checkpoint. `placement`: the
        service's volumes, device and rollout servers (with `sglang_sync_host`, each policy is pushed
        to the SGLang servers by broadcast, `mgrpo.engines.sglang`, not through the checkpoint folder).
        `base_of`: a LoRA role co-located with another in its trainer (roles on one base): this role's
        adapter goes on that role's frozen base, whose tensors both share (`Adapter.shared_base`)."""
        self.job, self.role = job, role
        self.tokenizer: PreTrainedTokenizerFast
        self.checkpoint_dir, self.ckpt_root = (
            placement.checkpoint_dir,
            placement.checkpoint_dir / job_id / role,
        )
        resume = latest_checkpoint(self.ckpt_root, step=last_step) if last_step >= 0 else None
        lora = job.lora_of(role)
        self.world, self.ranks = joined_world(), placement.ranks
        if lora is not None:
            _check_lora_placement(role, placement, self.world)
        if base_of is not None:  # the other role's base, shared
            _check_shared_base(role, base_of, lora is not None and self.world == 1)
            assert base_of.adapter is not None
            source, self.tokenizer = base_of.adapter.base_path, base_of.tokenizer
            model = base_of.adapter.shared_base()
        else:
            source = (
                str(resume.path)
                if resume and lora is None  # a LoRA role's checkpoint holds its adapter: the base is loaded
                else role_model_source(job, role, placement.cache_dir, placement.stop)
            )
            model, self.tokenizer = load(source)
            model = place(model, placement.device).eval()
        self.adapter: Adapter | None = None
        if lora is not None:
            self.adapter = Adapter(
                model,
                lora,
                base_path=source,
                resume=resume.path if resume else None,
                seed=job.cfg.seed + zlib.crc32(role.encode()),  # co-located roles: adapters of their own
                base_sha256=base_of.adapter.base_sha256 if base_of and base_of.adapter else None,
            )
            if resume:
                self.adapter.check_base(checkpoint_meta(resume), resume.path)
            model = self.adapter.model
        self.model = model
        optim = job.optim_of(role)
        state = restore_trainer_state(resume) if resume else None
        self.ref_model: PreTrainedModel | Callable[..., Any] | None = (
            reference_model(job, role, placement.cache_dir, placement.device)
            if self.adapter is None
            else self.adapter.reference
            if optim.kl_coef > 0
            else None
        )
        if self.world > 1:
            if is_sharded(state) and not self.group.shards_optimizer():  # shards this group cannot read
                state = full_optimizer_state(self.model, state)
            self.group.call(
                "open",
                config=self.model.config.to_dict(),
                lr=optim.lr,
                with_ref=self.ref_model is not None and lora is None,  # a LoRA role's: the base
                lora=None if lora is None else lora.model_dump(),
                local={
                    "source": self.model,
                    "optimizer_state": state,
                    "ref_source": None if lora else self.ref_model,
                },
            )
        trained = self.adapter.trainable() if self.adapter else self.model.parameters()
        self.optimizer = torch.optim.AdamW(trained, lr=optim.lr, weight_decay=0.0)
        if state is not None and self.world == 1:
            load_optimizer_state(self.model, self.optimizer, state)
        self.version = resume.version if resume else 0
        self.start_step = last_step + 1
        self.served = self.adapter.merged if self.adapter else self.model  # the weights rollouts sample from
        self.engine = rollout_engine(
            self.served,
            self.tokenizer,
            placement.sglang_url,
            weights=source,
            max_batch=max_batch,
            own_weights=job.cfg.max_staleness > 0,
            version=self.version,
            sync_host=placement.sglang_sync_host,
            role=role,
            load_base=base_of is None,  # the base role loaded it onto the servers both roll out on
        )
        if resume and self.adapter is not None and _loads_adapters(self.engine):
            self.engine.load_adapter(str(resume.path), self.version)  # the servers hold the base: add it
        self.model_spec = job.model_of(role)
        self.settings = UpdateSettings.of(optim, self.model_spec.temperature)
        self.start_note = _start_note(role, resume, self.adapter, self.shown)

    @property
    def group(self) -> RankGroup:
        """The role's group of ranks (W > 1)."""
        if self.ranks is None:
            raise RuntimeError(
                f"this process is one of {self.world} ranks, but its service was given no RankGroup"
            )
        return self.ranks

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def update(self, samples: Sequence[Sample], *, seed: int) -> dict[str, float]:
        """One clipped-PPO update on `samples` (advantages filled; rollouts paused meanwhile when the
        engine shares the weights); bumps the policy version and hands the engine the new weights.
        Returns the update's metrics ({} when there is nothing to train on)."""
        if not samples:
            return {}
        kept, report = self.triage(samples)
        if not kept:
            return report
        with self.engine.paused(), _yielding(not self.engine.shares_weights):
            if self.world > 1:
                metrics = self.group.call(
                    "update",
                    samples=kept,
                    settings=self.settings,
                    pad_id=self.pad_id,
                    seed=seed,
                    version=self.version,
                )
                t0 = time.perf_counter()
                self.group.call("sync", local={"into": self.model})
                metrics["weight_sync_s"] = time.perf_counter() - t0
            else:
                metrics = ppo_update(
                    self.model,
                    self.optimizer,
                    kept,
                    self.settings,
                    pad_id=self.pad_id,
                    seed=seed,
                    ref_model=self.ref_model,
                    version=self.version,
                )
            if self.adapter is not None:  # base + adapter into the weights the engine samples from
                t0 = time.perf_counter()
                self.adapter.merge()
                metrics["weight_sync_s"] = time.perf_counter() - t0
                metrics["adapter_bytes"] = float(self.adapter.bytes)
            self.version += 1
            if self.engine.shares_weights:
                self.engine.weights_version = self.version
        if isinstance(self.engine, HFEngine) and not self.engine.shares_weights:
            self.engine.push_weights(self.served, self.version)
        elif _broadcasts(self.engine):
            t0 = time.perf_counter()
            self.engine.push_weights(self.model, self.version)
            metrics["sglang_push_s"] = time.perf_counter() - t0
        return {**metrics, **report}

    def drops(self, sample: Sample) -> bool:
        """Whether the next update leaves `sample` out (beyond the bound, `stale_samples: drop`)."""
        beyond = self.version - sample.policy_version > self.job.cfg.max_staleness
        return beyond and self.job.cfg.stale_samples == "drop"

    def triage(self, samples: Sequence[Sample]) -> tuple[list[Sample], dict[str, float]]:
        """The samples to train on and the staleness report (see the module docstring)."""
        bound = self.job.cfg.max_staleness
        lag = [max(self.version - s.policy_version, 0) for s in samples]
        beyond = [d > bound for d in lag]
        kept = [s for s in samples if not self.drops(s)]
        report = {f"staleness_{k}": lag.count(k) / len(lag) for k in range(bound + 1)}
        report["stale_beyond_bound"] = float(sum(beyond))
        report["stale_dropped"] = float(len(samples) - len(kept))
        return kept, report

    def shown(self, path: Path) -> str:
        """A checkpoint's path as the API shows it: relative to this service's volume."""
        return str(Path(path).relative_to(self.checkpoint_dir))

    def save(self, step: int, *, push: bool = True) -> CheckpointInfo:
        """Checkpoint the step; an engine with its own weights (SGLang) loads them (when `push`)."""
        state, write = None, None
        if self.world == 1:
            state = optimizer_state(self.model, self.optimizer)
        elif self.group.shards_optimizer():  # every rank writes its own shard into the checkpoint
            write = lambda folder: self.group.call("save_optimizer", path=str(folder))  # noqa: E731
        else:  # the full state, gathered to rank 0
            state = self.group.call("optimizer_state")
        ckpt = save_checkpoint(
            self.ckpt_root,
            self.adapter.peft if self.adapter else self.model,  # a LoRA role: peft's adapter folder
            self.tokenizer,
            state,
            step=step,
            version=self.version,
            keep_every_steps=self.job.cfg.checkpoint_keep_every_steps,
            write_optimizer=write,
            meta=self.adapter.meta() if self.adapter else None,
        )
        if push and self.adapter is not None and _loads_adapters(self.engine):
            self.engine.load_adapter(str(ckpt.path), self.version)  # only the adapter travels
        elif (
            push
            and not self.engine.shares_weights
            and not isinstance(self.engine, HFEngine)
            and not _broadcasts(self.engine)
        ):
            self.engine.update_weights(str(ckpt.path), self.version)  # an SGLang server reads the folder
        return ckpt

    def close(self) -> None:
        self.engine.close()
        if self.world > 1:
            self.group.call("close")
