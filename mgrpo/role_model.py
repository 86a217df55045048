"""One role's model as its trainer holds it, for every trainer of every workflow: the starting
weights (warm start, a `path`, or the role's checkpoint of the last step its ledger holds), the
optimizer, the rollout engine, the frozen reference (KL), the update on `Sample`s and the checkpoint.
The trainers add the store around it (ledger, policy versions, streams)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from mgrpo.checkpoint import CheckpointInfo, latest_checkpoint, restore_trainer_state, save_checkpoint
from mgrpo.config import JobConfig
from mgrpo.models import load, place
from mgrpo.runtime import reference_model, role_model_source, rollout_engine
from mgrpo.sample import Sample
from mgrpo.training import UpdateSettings, ppo_update


class RoleModel:
    def __init__(self, cfg: JobConfig, role: str, *, cache_dir: Path, checkpoint_dir: Path, job_id: str,
                 last_step: int, device: torch.device | str = "cpu", sglang_url: str = "", max_batch: int = 64,
                 model_role: str | None = None) -> None:  # fmt: skip
        """`role`: whose update settings and checkpoints these are; `model_role` (default `role`): whose
        starting model to load (`single` for the single-agent baseline). `last_step`: the last step the
        ledger holds for the role (-1: none), resumed from its checkpoint."""
        self.cfg, self.role = cfg, role
        self.ckpt_root = checkpoint_dir / job_id / role
        resume = latest_checkpoint(self.ckpt_root, step=last_step) if last_step >= 0 else None
        source = str(resume.path) if resume else role_model_source(cfg, model_role or role, cache_dir)
        model, self.tokenizer = load(source)
        self.model = place(model, device).eval()
        optim = cfg.optim_of("planner" if role == "single" else role)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=optim.lr, weight_decay=0.0)
        if resume:
            restore_trainer_state(resume, self.optimizer)
        self.version = resume.version if resume else 0
        self.start_step = last_step + 1
        self.engine = rollout_engine(
            self.model, self.tokenizer, sglang_url, weights=source, max_batch=max_batch
        )
        self.spec = cfg.model_of("planner" if role == "single" else role)
        self.settings = UpdateSettings.of(optim, self.spec.temperature)
        self.ref_model = reference_model(cfg, model_role or role, cache_dir, device)

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def update(self, samples: Sequence[Sample], *, seed: int) -> dict[str, float]:
        """One clipped-PPO update on `samples` (advantages filled), rollouts paused meanwhile; bumps the
        policy version. Returns the update's metrics ({} when there is nothing to train on)."""
        if not samples:
            return {}
        with self.engine.paused():
            metrics = ppo_update(self.model, self.optimizer, [(s.transcript, s.advantage) for s in samples],
                                 self.settings, pad_id=self.pad_id, seed=seed, ref_model=self.ref_model)  # fmt: skip
        self.version += 1
        return metrics

    def save(self, step: int, *, push: bool = True) -> CheckpointInfo:
        """Checkpoint the step; an engine with its own weights (SGLang) loads them (when `push`)."""
        ckpt = save_checkpoint(self.ckpt_root, self.model, self.tokenizer, self.optimizer, step=step,
                               version=self.version, keep_every_steps=self.cfg.checkpoint_keep_every_steps)  # fmt: skip
        if push and not self.engine.shares_weights:
            self.engine.update_weights(str(ckpt.path))
        return ckpt

    def close(self) -> None:
        self.engine.close()
