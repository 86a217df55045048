"""Trainer checkpoints: the model as an ordinary HF folder (save_pretrained), plus optimizer, RNG
and step, written to a temp folder and renamed so a crash never leaves a half checkpoint."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    version: int


def save_checkpoint(
    root: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    version: int,
    keep: int = 2,
    keep_every_steps: int = 0,
) -> CheckpointInfo:
    """Write `root/step-<step>` atomically; keep the newest `keep` checkpoints and, when
    `keep_every_steps` > 0, every checkpoint whose step count (step + 1) is a multiple of it."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
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


def restore_trainer_state(info: CheckpointInfo, optimizer: torch.optim.Optimizer) -> None:
    state = torch.load(info.path / "trainer_state.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
