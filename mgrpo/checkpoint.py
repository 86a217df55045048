"""Trainer checkpoints: the model as an ordinary HF folder (save_pretrained), plus optimizer, RNG
and step, written to a temp folder and renamed so a crash never leaves a half checkpoint.

The optimizer state comes in one of two forms, and either resumes on any number of ranks and either
backend (`load_optimizer_state`, `full_optimizer_state`):
- full, keyed by parameter name (torch.distributed.checkpoint's `get_optimizer_state_dict(
  full_state_dict=True)`) inside `trainer_state.pt`: one process, the megatron backend, and ranks
  spread over several machines (only node 0 holds the checkpoint volume);
- sharded: FSDP2 ranks on one machine each write their own shard into `optimizer/` with
  torch.distributed.checkpoint (`write_optimizer`), so no rank ever holds the whole state; the
  trainer state then names that folder (`{"dcp": "optimizer"}`). DCP reshards on load: to another W,
  or to one process (`no_dist`).
Checkpoints of earlier versions (keyed by parameter index) still load on one process."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeGuard, cast

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from transformers import PreTrainedTokenizerBase

from mgrpo.retention import retained

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
SHARDED = "optimizer"  # a checkpoint's folder of DCP optimizer shards


class Saves(Protocol):
    """A model the checkpoint writes with its own `save_pretrained`: an HF model (the whole model) or
    a peft model (its adapter folder, `mgrpo.lora`)."""

    def save_pretrained(self, save_directory: Any, /, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    version: int


def save_checkpoint(
    root: Path,
    model: Saves,
    tokenizer: PreTrainedTokenizerBase,
    optimizer_state: dict[str, Any] | None,
    *,
    step: int,
    version: int,
    keep: int = 2,
    keep_every_steps: int = 0,
    write_optimizer: Callable[[Path], None] | None = None,
    meta: dict[str, Any] | None = None,
) -> CheckpointInfo:
    """Write `root/step-<step>` atomically; keep the newest `keep` checkpoints and, when
    `keep_every_steps` > 0, every checkpoint whose step count (step + 1) is a multiple of it.
    `optimizer_state`: FQN-keyed and full (`optimizer_state`, or a sharded policy's gathered one);
    or None and `write_optimizer(folder)`, which writes the shards (every rank) into the checkpoint
    before it is complete. `meta`: more of what `mgrpo.json` records (`checkpoint_meta` reads it back)."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if write_optimizer is not None:
        write_optimizer(tmp / SHARDED)
        optimizer_state = {"dcp": SHARDED}
    torch.save(
        {"optimizer": optimizer_state, "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()},
        tmp / "trainer_state.pt",
    )
    (tmp / "mgrpo.json").write_text(json.dumps({**(meta or {}), "step": step, "version": version}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    folders = {int(p.name.removeprefix("step-")): p for p in root.glob("step-*")}
    kept = retained(folders, keep=keep, keep_every_steps=keep_every_steps)
    for s, old in folders.items():
        if s not in kept:
            shutil.rmtree(old, ignore_errors=True)
    return CheckpointInfo(final, step, version)


def latest_checkpoint(root: Path, *, step: int | None = None) -> CheckpointInfo | None:
    """The newest complete checkpoint (or the one of `step`)."""
    for path in sorted(root.glob("step-*"), reverse=True):
        meta = path / "mgrpo.json"
        if not meta.exists():
            continue
        info = json.loads(meta.read_text())
        if step is None or info["step"] == step:
            return CheckpointInfo(path, int(info["step"]), int(info["version"]))
    return None


def checkpoint_meta(info: CheckpointInfo) -> dict[str, Any]:
    """Everything a checkpoint's `mgrpo.json` records (step, version, and the writer's `meta`)."""
    return cast(dict[str, Any], json.loads((info.path / "mgrpo.json").read_text()))


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A one-process optimizer's state, full and keyed by parameter name."""
    return cast(dict[str, Any], get_optimizer_state_dict(model, optimizer, options=FULL))


def is_sharded(state: object) -> TypeGuard[dict[str, Any]]:
    """Whether a restored optimizer state names DCP shards (`{"dcp": folder}`) rather than holding it."""
    return isinstance(state, dict) and "dcp" in state


def save_sharded_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Every rank of a sharded model: write its shard of the optimizer state into `folder` (DCP)."""
    dcp_save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=folder)


def load_sharded_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path, *, no_dist: bool
) -> None:
    """Load DCP optimizer shards into `optimizer`, resharded to how `model` is held now: every rank of
    a sharded model (`no_dist=False`), or one process holding the whole model (`no_dist=True`)."""
    if not optimizer.state:  # torch initialises an empty state only where no parameter holds a gradient
        optimizer.zero_grad(set_to_none=True)
    template = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # initialises the state
    dcp_load(template, checkpoint_id=folder, no_dist=no_dist)
    set_optimizer_state_dict(model, optimizer, template["optimizer"])


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a checkpoint's optimizer state into a one-process optimizer (DCP shards, name- or, from
    earlier versions, index-keyed)."""
    if is_sharded(state):
        load_sharded_optimizer(model, optimizer, state["dcp"], no_dist=True)
    elif all(isinstance(k, int) for k in state.get("state", {})):
        optimizer.load_state_dict(state)
    else:
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def full_optimizer_state(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """A restored optimizer state in the full, FQN-keyed form (DCP shards gathered through `model`,
    the whole model in this process, and a scratch AdamW); other forms as they are."""
    if not is_sharded(state):
        return state
    scratch = torch.optim.AdamW(model.parameters())
    load_optimizer_state(model, scratch, state)
    return optimizer_state(model, scratch)


def restore_trainer_state(info: CheckpointInfo) -> dict[str, Any]:
    """Restore the RNGs a checkpoint saved; returns its optimizer state (for `load_optimizer_state`, or
    for a sharded policy to load): sharded, `{"dcp": <the checkpoint's shard folder>}`."""
    state = torch.load(info.path / "trainer_state.pt", weights_only=False)
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    optimizer = cast(dict[str, Any], state["optimizer"])
    return {"dcp": str(info.path / optimizer["dcp"])} if is_sharded(optimizer) else optimizer
