"""What a trainer service needs to start a job: where it runs (`Placement`), its role's model (from
the cached warm start of its presets, or a folder), its rollout engine and its KL reference."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from mgrpo.engines.base import RolloutEngine
from mgrpo.engines.hf import HFEngine
from mgrpo.engines.replicas import ReplicatedEngine
from mgrpo.engines.sglang import SGLangEngine, WeightSync
from mgrpo.models import load, place
from mgrpo.parallel.ranks import RankGroup
from mgrpo.workflows import JobSpec


@dataclass(frozen=True)
class Placement:
    """Where and how a role's trainer runs (its service's settings): the warm-start cache and the
    checkpoint volume, the torch device, the SGLang servers it rolls out with (`sglang_url`; '' = the
    in-process hf engine) and the address they take pushed weights from (`sglang_sync_host`), the
    service's own URL as others reach it, its stream consumer's name, its group of ranks when it
    trains on W > 1 (`mgrpo.parallel.ranks`), the agent programs it may run (`mgrpo.programs`), and its
    experiment trackers (`mgrpo.tracking`)."""

    cache_dir: Path = Path(".cache/mgrpo")
    checkpoint_dir: Path = Path("checkpoints")
    device: torch.device | str = "cpu"
    sglang_url: str = ""
    sglang_sync_host: str = ""
    public_url: str = ""
    consumer_name: str = ""
    ranks: RankGroup | None = None  # this service's group of ranks (W > 1), on rank 0
    allowed_programs: tuple[str, ...] = ()  # agent programs the operator allows (mgrpo.programs)
    tracking_dir: Path = Path("runs/tracking")  # where trackers write (mgrpo.tracking)
    tracking: tuple[str, ...] = ()  # the trackers of a job that names none
    allowed_tracking_uris: tuple[str, ...] = ()  # the tracking servers jobs may name
    stop: threading.Event | None = None  # set when the job ends: a warm-start build gives up


def resolve_device(name: str) -> torch.device:
    """`cpu`, `cuda`, `cuda:N` or `auto` → a torch device; a GPU that is not there is a clear error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} asked for, but torch sees no GPU; set MGRPO_DEVICE=cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeError(f"device {name!r} asked for, but torch sees {torch.cuda.device_count()} GPU(s)")
    return device


def role_model_source(job: JobSpec, role: str, cache_dir: Path, stop: threading.Event | None = None) -> str:
    """Where the role's starting model is: `path` when given, else the (cached) warm start of the
    running workflow's presets (`JobSpec.warm_start`; a build gives up when `stop` is set)."""
    spec = job.model_of(role)
    if spec.path is not None:
        return spec.path
    return job.warm_start().source(job, role, cache_dir, stop=stop)


def load_role_model(
    job: JobSpec, role: str, cache_dir: Path
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The role's starting model (see `role_model_source`)."""
    return load(role_model_source(job, role, cache_dir))


def rollout_engine(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    sglang_url: str,
    *,
    weights: str,
    max_batch: int = 64,
    own_weights: bool = False,
    version: int = 0,
    sync_host: str = "",
    role: str = "",
    load_base: bool = True,
) -> RolloutEngine:
    """The trainer's rollout engine: the in-process `hf` engine on the trainer's model (`own_weights`:
    on its own copy, swapped at each push), or, with `sglang_url`, that SGLang server (several,
    comma-separated: its replicas, `mgrpo.engines.replicas`), first loaded with `weights` (a folder
    the servers can read) as policy `version`; with `sync_host`, the servers take `model` itself and
    every later policy by broadcast from that address (`mgrpo.engines.sglang`). `role`: whose LoRA
    adapters the servers get (named `mgrpo-<role>-v<N>`); `load_base` False: another role on the same
    base already loaded it onto these servers (roles sharing a base share their servers)."""
    if not sglang_url:
        return HFEngine(model, tokenizer, max_batch=max_batch, own_weights=own_weights, version=version)
    urls = [u.strip() for u in sglang_url.split(",") if u.strip()]
    sync: WeightSync = "distributed" if sync_host else "disk"
    servers = [
        SGLangEngine(
            u,
            eos_token_id=tokenizer.eos_token_id,
            weight_sync=sync,
            sync_host=sync_host,
            adapter_family=f"mgrpo-{role}" if role else "mgrpo",
        )
        for u in urls
    ]
    engine = servers[0] if len(servers) == 1 else ReplicatedEngine(servers)
    if not load_base:  # a resumed role's policy version comes with its adapter (`RoleModel`)
        return engine
    if sync_host:
        engine.push_weights(model, version)
    else:
        engine.update_weights(weights, version)
    return engine


def reference_model(
    job: JobSpec, role: str, cache_dir: Path, device: torch.device | str = "cpu"
) -> PreTrainedModel | None:
    """The frozen starting model the KL penalty anchors to (None when the role's kl_coef is 0).
    A resumed trainer loads it again from the job's source, not from its checkpoint."""
    optim = job.optim_of(role)
    if optim.kl_coef == 0:
        return None
    model, _ = load_role_model(job, role, cache_dir)
    return place(model, device).eval().requires_grad_(False)
