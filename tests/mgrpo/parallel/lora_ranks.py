"""Run under `torchrun --nproc-per-node 2` by test_fsdp.py: the two updates of `updates.py` (the second
with a KL penalty, whose reference is the base with the adapter off) on a LoRA role's policy sharded
over 2 ranks (gloo); after each, rank 0's model synced (the adapter only) → `<out>/lora-w2-<n>.pt`,
with the gathered weights (the frozen base among them)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mgrpo.parallel.fsdp import ShardedPolicy
from mgrpo.parallel.group import init_from_env
from tests.mgrpo.parallel.updates import LR, SETTINGS, lora_tiny, samples


def main(out: Path) -> None:
    assert init_from_env(timeout_s=120)
    model, tok, spec = lora_tiny()
    rank0 = dist.get_rank() == 0
    policy = ShardedPolicy(
        model.config.to_dict(), LR, source=model if rank0 else None, with_ref=False, lora=spec.model_dump()
    )
    for update in (0, 1):
        batch, version = samples(update, len(tok))
        metrics = policy.update(
            batch, SETTINGS[update], pad_id=tok.pad_token_id, seed=update, version=version
        )
        weights = policy.full_weights()
        policy.sync_into(model if rank0 else None, bucket_mb=0.05)
        if rank0:
            synced = {n: p.detach().clone() for n, p in model.named_parameters()}
            torch.save(
                {"synced": synced, "weights": weights, "metrics": metrics}, out / f"lora-w2-{update + 1}.pt"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
