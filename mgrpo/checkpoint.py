"""Trainer checkpoints: the model as an ordinary HF folder (save_pretrained), plus optimizer, RNG
and step, written to a temp folder and renamed so a crash never leaves a half checkpoint.

The optimizer state is the full one keyed by parameter name (torch.distributed.checkpoint's
`get_optimizer_state_dict(full_state_dict=True)`), the same whether one process or W sharded ranks
trained it, so a checkpoint resumes on any number of ranks (`optimizer_state` / `load_optimizer_state`).
Checkpoints of earlier versions (keyed by parameter index) still load on one process."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from transformers import PreTrainedModel, PreTrainedTokenizerBase

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    version: int


def save_checkpoint(
    root: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer_state: dict[str, Any],
    *,
    step: int,
    version: int,
    keep: int = 2,
    keep_every_steps: int = 0,
) -> CheckpointInfo:
    """Write `root/step-<step>` atomically; keep the newest `keep` checkpoints and, when
    `keep_every_steps` > 0, every checkpoint whose step count (step + 1) is a multiple of it.
    `optimizer_state`: FQN-keyed and full (`optimizer_state`, or a sharded policy's gathered one)."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optimizer_state, "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate()}, tmp / "trainer_state.pt")  # fmt: skip
    (tmp / "mgrpo.json").write_text(json.dumps({"step": step, "version": version}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(root.glob("step-*"))[:-keep]:
        if keep_every_steps and (int(old.name.removeprefix("step-")) + 1) % keep_every_steps == 0:
            continue
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


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A one-process optimizer's state, full and keyed by parameter name."""
    return cast(dict[str, Any], get_optimizer_state_dict(model, optimizer, options=FULL))


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a checkpoint's optimizer state into a one-process optimizer (name- or, from earlier
    versions, index-keyed)."""
    if all(isinstance(k, int) for k in state.get("state", {})):
        optimizer.load_state_dict(state)
    else:
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def restore_trainer_state(info: CheckpointInfo) -> dict[str, Any]:
    """Restore the RNGs a checkpoint saved; returns its optimizer state (for `load_optimizer_state`, or
    for a sharded policy to broadcast)."""
    state = torch.load(info.path / "trainer_state.pt", weights_only=False)
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return cast(dict[str, Any], state["optimizer"])
