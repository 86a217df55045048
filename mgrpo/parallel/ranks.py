"""The calls rank 0 — a role's service — makes every rank of its group run (verl's single controller
over a worker group, on torch.distributed itself): `RankGroup.call(name, **kwargs)` broadcasts (name,
kwargs) from rank 0 and runs the call there too; ranks > 0 sit in `serve`, running each call as it
comes, until `shutdown`. A call's collectives (FSDP's all-gathers and reduce-scatters) so run in the same
order on every rank. One call at a time.

Calls: `open` (build the sharded policy of a job's role from rank 0's model: FSDP2, or megatron-core
tensor and pipeline parallel with `RankGroup("megatron", stages)`), `update` (one PPO update
on the step's samples, split across the ranks), `sync` (the weights into rank 0's full model),
`optimizer_state` (gathered to rank 0), `save_optimizer` (each rank's shard into a checkpoint,
fsdp), `close`. An error raised alike on every rank (a bad argument) fails the call on rank 0 and leaves the
others serving. A rank that dies fails rank 0's next collective at once (gloo: "Connection closed by
peer"): `call` raises `RankLost`, on which the service exits rather than failing the job, so that
torchrun (or Kubernetes) restarts the group and the job resumes from its last checkpoint."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from mgrpo.parallel import group
from mgrpo.parallel.backends import backend as backend_named
from mgrpo.parallel.fsdp import ShardedPolicy
from mgrpo.parallel.megatron_policy import MegatronPolicy

log = logging.getLogger("mgrpo.parallel")


class RankLost(RuntimeError):
    """A collective failed because another rank of the group is gone: the group cannot go on."""


def _lost(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, dist.DistError) or any(w in text for w in ("gloo", "NCCL", "Connection closed"))


POLICIES: dict[str, type[ShardedPolicy] | type[MegatronPolicy]] = {
    "fsdp": ShardedPolicy,
    "megatron": MegatronPolicy,
}


def policy_class(backend: str) -> type[ShardedPolicy] | type[MegatronPolicy]:
    """The policy a backend (`mgrpo.parallel.backends`) holds on the ranks (megatron-core itself is
    imported only when it is built)."""
    return POLICIES[backend_named(backend).name]


class RankGroup:
    """This process's side of a role's group of ranks: how it holds the policy — `fsdp` (FSDP2 data
    parallel, `ShardedPolicy`) or `megatron` (megatron-core tensor parallel on each of
    `pipeline_stages` stages, `MegatronPolicy`) — and the policy once opened. Every rank makes one,
    before serving; rank 0's is handed to its service (`mgrpo.runtime.Placement.ranks`)."""

    def __init__(self, backend: str = "fsdp", pipeline_stages: int = 1) -> None:
        self.spec = backend_named(backend)
        if pipeline_stages > 1 and not self.spec.pipelines:
            raise ValueError(f"pipeline stages need a backend that pipelines ({backend} does not)")
        self.backend, self.stages = backend, pipeline_stages
        self.policy: ShardedPolicy | MegatronPolicy | None = None
        self.lock = threading.Lock()  # one call at a time
        self.calls: dict[str, Callable[..., Any]] = {
            "open": self._open,
            "update": lambda **kw: self._opened().update(**kw),
            "sync": lambda into=None: self._opened().sync_into(into),
            "optimizer_state": lambda: self._opened().full_optimizer_state(),
            "save_optimizer": lambda path: self._sharded().save_optimizer(path),
            "close": self._close,
        }

    def _open(
        self,
        config: dict[str, Any],
        lr: float,
        with_ref: bool = False,
        source: Any = None,
        optimizer_state: Any = None,
        ref_source: Any = None,
        lora: dict[str, Any] | None = None,
    ) -> None:
        if lora is not None and not self.trains_adapters:
            raise ValueError(f"a LoRA role trains on W ranks with the fsdp backend only (not {self.backend})")
        extra: dict[str, Any] = {"pipeline": self.stages} if self.spec.pipelines else {}
        if lora is not None:
            extra["lora"] = lora
        self.policy = policy_class(self.backend)(
            config,
            lr,
            source=source,
            optimizer_state=optimizer_state,
            with_ref=with_ref,
            ref_source=ref_source,
            **extra,
        )

    @property
    def trains_adapters(self) -> bool:
        """Whether this group's backend trains a LoRA role's adapter (`mgrpo.lora`)."""
        return self.spec.trains_adapters

    def _opened(self) -> ShardedPolicy | MegatronPolicy:
        if self.policy is None:
            raise RuntimeError("no sharded policy is open on this rank (call 'open' first)")
        return self.policy

    def _sharded(self) -> ShardedPolicy:
        policy = self._opened()
        if not isinstance(policy, ShardedPolicy):
            raise RuntimeError("only the fsdp backend writes optimizer shards")
        return policy

    def _close(self) -> None:
        self.policy = None

    def shards_optimizer(self) -> bool:
        """Whether this group checkpoints its optimizer state as per-rank shards (DCP): the fsdp backend
        with every rank on this machine, so every rank sees the checkpoint volume."""
        return self.spec.shards_optimizer and group.one_machine()

    def call(self, name: str, local: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """On rank 0: run `name` on every rank with `kwargs` (sent); `local` (rank 0's own, never sent:
        e.g. its full model) goes only to rank 0's call. Returns rank 0's result."""
        if name not in self.calls:
            raise ValueError(f"unknown call {name!r}: one of {sorted(self.calls)}")
        with self.lock:
            try:
                dist.broadcast_object_list([(name, kwargs)], src=0)
                return self.calls[name](**kwargs, **(local or {}))
            except RuntimeError as exc:
                if _lost(exc):
                    raise RankLost(
                        f"a rank of this role's group of {dist.get_world_size()} is gone ({exc})"
                    ) from exc
                raise

    def serve(self) -> None:
        """On ranks > 0: run rank 0's calls until it sends `exit`."""
        while self.serve_one():
            pass

    def serve_one(self) -> bool:
        """On ranks > 0: run rank 0's next call; False when it was `exit`."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        name, kwargs = box[0]
        if name == "exit":
            return False
        try:
            self.calls[name](**kwargs)
        except Exception:  # raised alike on rank 0, which reports it; this rank waits for the next call
            log.exception("rank %d: call %r failed", dist.get_rank(), name)
        return True

    def shutdown(self) -> None:
        """On rank 0: let the other ranks' `serve` return, then leave the group."""
        if dist.is_initialized():
            with self.lock, contextlib.suppress(RuntimeError):  # a group already broken has nothing to stop
                dist.broadcast_object_list([("exit", {})], src=0)
            dist.destroy_process_group()
