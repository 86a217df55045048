"""Run under `torchrun --nproc-per-node 2` by test_fsdp.py: the two updates of `updates.py` on a policy
sharded over 2 ranks (gloo), from scratch (state after each update → `<out>/w2-1.pt`, `w2-2.pt`) and
from a W = 1 state after the first (`<out>/w1-1.pt` → the second update → `<out>/w1to2-2.pt`), and
from the sharded (DCP) optimizer state it wrote after the first (`<out>/dcp-1/` → `<out>/dcp-2.pt`)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mgrpo.parallel.fsdp import ShardedPolicy
from mgrpo.parallel.group import init_from_env
from tests.mgrpo.parallel.updates import LR, SETTINGS, reference, samples, save, tiny


def run(policy: ShardedPolicy, pad_id: int, vocab: int, update: int, out: Path | None) -> None:
    batch, version = samples(update, vocab)
    metrics = policy.update(batch, SETTINGS[update], pad_id=pad_id, seed=update, version=version)
    weights, optimizer = policy.full_weights(), policy.full_optimizer_state()
    synced = tiny()[0] if dist.get_rank() == 0 else None
    if synced is not None:
        torch.nn.init.zeros_(synced.model.embed_tokens.weight)  # every row must come from the sync
        for p in synced.parameters():
            p.data.zero_()
    versions = {n: q._version for n, q in synced.named_parameters()} if synced is not None else {}
    policy.sync_into(synced, bucket_mb=0.05)  # several buckets
    if synced is not None:
        for name, q in synced.named_parameters():  # what tells the rollout engine's decoder to re-read it
            assert q._version > versions[name], f"sync_into left {name}'s version unchanged"
        for name, tensor in synced.state_dict().items():
            assert torch.equal(tensor, weights[name]), (
                f"sync_into differs from the gathered state dict at {name}"
            )
    if dist.get_rank() == 0 and out is not None:
        save(out, weights, optimizer, metrics)


def opened(model, rank0: bool, optimizer_state=None) -> ShardedPolicy:
    """A 2-rank policy from rank 0's `model` (and optimizer state), with the KL reference."""
    return ShardedPolicy(
        model.config.to_dict(),
        LR,
        source=model if rank0 else None,
        with_ref=True,
        ref_source=reference(1) if rank0 else None,
        optimizer_state=optimizer_state if rank0 else None,
    )


def main(out: Path) -> None:
    assert init_from_env(timeout_s=120)
    model, tok = tiny()
    rank0 = dist.get_rank() == 0
    policy = opened(model, rank0)
    run(policy, tok.pad_token_id, len(tok), 0, out / "w2-1.pt")
    policy.save_optimizer(str(out / "dcp-1"))  # every rank its shard
    run(policy, tok.pad_token_id, len(tok), 1, out / "w2-2.pt")
    for start, shards, name in (("w1-1.pt", None, "w1to2-2.pt"), ("w2-1.pt", out / "dcp-1", "dcp-2.pt")):
        state = torch.load(out / start, weights_only=False) if rank0 else None
        if state is not None:
            model.load_state_dict(state["weights"])
        optimizer = {"dcp": str(shards)} if shards else state["optimizer"] if state else None
        run(opened(model, rank0, optimizer), tok.pad_token_id, len(tok), 1, out / name)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
