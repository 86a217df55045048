"""Run under `torchrun --nproc-per-node 2` by test_megatron.py: the tiny Qwen3 of `updates.py` as a
`MegatronPolicy` (a megatron-core GPTModel split over 2 tensor-parallel ranks, gloo, on the CPU
through `cpu_shim`): its logits on a left-padded batch (→ `<out>/logits.pt`); the two updates of
`updates.py` from scratch (HF weights and optimizer state after each → `<out>/tp2-1.pt`, `tp2-2.pt`,
the sync into a zeroed HF model, in several buckets, checked against them); and the second update
resumed from the one-process state after the first (`<out>/w1-1.pt` → `<out>/w1to2-2.pt`), its
weights and moments scattered in several buckets."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mgrpo.parallel.group import init_from_env
from mgrpo.parallel.megatron_policy import MegatronPolicy
from tests.mgrpo.parallel.updates import LR, SETTINGS, reference, samples, save, tiny

# HF's embedding drops the gradient of the pad token's row where the pad id is an *input* (its
# padding_idx); megatron-core's has no such row. Rollouts never feed the pad token as a real token,
# so the samples here do not either (ids from 1; the pad id is 0).
NO_PAD = 1


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two left-padded rows."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :5] = 0
    return ids, mask


def run(policy: MegatronPolicy, tok, update: int, out: Path) -> None:
    rows, stale = samples(update, len(tok), low=NO_PAD)
    metrics = policy.update(rows, SETTINGS[update], pad_id=tok.pad_token_id, seed=update, stale=stale)
    weights, optimizer = policy.full_weights(), policy.full_optimizer_state()
    synced = tiny()[0] if dist.get_rank() == 0 else None
    if synced is not None:
        for p in synced.parameters():
            p.data.zero_()
    versions = {n: q._version for n, q in synced.named_parameters()} if synced is not None else {}
    policy.sync_into(synced, bucket_mb=0.05)  # several buckets
    if synced is not None:
        for name, q in synced.named_parameters():  # what tells the rollout engine's decoder to re-read it
            assert q._version > versions[name], f"sync_into left {name}'s version unchanged"
        for name, tensor in synced.state_dict().items():
            assert torch.equal(tensor, weights[name]), (
                f"sync_into differs from the gathered weights at {name}"
            )
        save(out, weights, optimizer, metrics)


def main(out: Path) -> None:
    assert init_from_env(timeout_s=120)
    hf, tok = tiny()
    rank0 = dist.get_rank() == 0
    policy = MegatronPolicy(
        hf.config.to_dict(),
        LR,
        source=hf if rank0 else None,
        with_ref=True,
        ref_source=reference(1) if rank0 else None,
    )
    ids, mask = batch(len(tok))
    with torch.no_grad():
        logits = policy.model(input_ids=ids, attention_mask=mask).logits
    if rank0:
        torch.save({"logits": logits, "ids": ids, "mask": mask}, out / "logits.pt")
    run(policy, tok, 0, out / "tp2-1.pt")
    run(policy, tok, 1, out / "tp2-2.pt")
    start = torch.load(out / "w1-1.pt", weights_only=False) if rank0 else None
    if start is not None:
        hf.load_state_dict(start["weights"])
    policy = MegatronPolicy(hf.config.to_dict(), LR, source=hf if rank0 else None, with_ref=True,
                            ref_source=reference(1) if rank0 else None,
                            optimizer_state=start["optimizer"] if start else None,
                            bucket_mb=0.05)  # fmt: skip  # weights and moments scattered in several buckets
    run(policy, tok, 1, out / "w1to2-2.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
