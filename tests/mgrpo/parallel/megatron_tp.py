"""Run under `torchrun --nproc-per-node W` by test_megatron.py with P pipeline stages (`<out> P`): the
tiny Qwen3 of `updates.py` as a `MegatronPolicy` (a megatron-core GPTModel split over W / P tensor-
parallel ranks on each of P stages, gloo, on the CPU through `cpu_shim`; name tp{W/P}pp{P}): its
logits on a left-padded batch (P > 1: its log-probs from the schedule's forward-only pass) →
`<out>/<name>-logits.pt`; the two updates of `updates.py` from scratch (with P > 1 in micro-batches
through the 1F1B schedule; HF weights and optimizer state after each → `<out>/<name>-1.pt`, `-2.pt`,
the sync into a zeroed HF model, in several buckets, checked against them); and the second update
resumed from the one-process state after the first (`<out>/w1-1.pt` → `<out>/w1to<name>-2.pt`), its
weights and moments scattered in several buckets. With a third argument `moe`: the tiny Qwen3-MoE of
`updates.py`, its experts over the W ranks (name ep{W}; the one-process states `<out>/w1moe-*.pt`)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mgrpo.parallel.group import init_from_env
from mgrpo.parallel.megatron_model import model_parallel
from mgrpo.parallel.megatron_policy import MegatronPolicy
from tests.mgrpo.parallel.updates import LR, SETTINGS, reference, samples, save, tiny, tiny_moe

# HF's embedding drops the gradient of the pad token's row where the pad id is an *input* (its
# padding_idx); megatron-core's has no such row. Rollouts never feed the pad token as a real token,
# so the samples here do not either (ids from 1; the pad id is 0).
NO_PAD = 1
MICROBATCH_TOKENS = 40  # with pipeline stages: 2–4 micro-batches per minibatch of `updates.py`


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two left-padded rows."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :5] = 0
    return ids, mask


def run(policy: MegatronPolicy, tok, update: int, out: Path, model_of=tiny) -> None:
    rows, version = samples(update, len(tok), low=NO_PAD)
    settings = SETTINGS[update]
    if policy.pp > 1:  # several micro-batches of different lengths through the schedule
        settings = dataclasses.replace(settings, microbatch_tokens=MICROBATCH_TOKENS)
    metrics = policy.update(rows, settings, pad_id=tok.pad_token_id, seed=update, version=version)
    weights, optimizer = policy.full_weights(), policy.full_optimizer_state()
    synced = model_of()[0] if dist.get_rank() == 0 else None
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


def main(out: Path, stages: int, moe: bool) -> None:
    assert init_from_env(timeout_s=120)
    model_of = tiny_moe if moe else tiny
    hf, tok = model_of()
    rank0 = dist.get_rank() == 0
    policy = MegatronPolicy(
        hf.config.to_dict(),
        LR,
        source=hf if rank0 else None,
        with_ref=True,
        ref_source=reference(1, moe) if rank0 else None,
        pipeline=stages,
    )
    name = f"ep{dist.get_world_size()}" if moe else f"tp{dist.get_world_size() // stages}pp{stages}"
    ids, mask = batch(len(tok))
    with torch.no_grad():
        if stages == 1:
            logits = policy.model(input_ids=ids, attention_mask=mask).logits
        else:  # the schedule's forward: log-probs on every rank
            logits = policy.model.logprobs([(ids, mask)], temperature=1.0)[0]
    if rank0:
        torch.save({"logits": logits, "ids": ids, "mask": mask}, out / f"{name}-logits.pt")
    run(policy, tok, 0, out / f"{name}-1.pt", model_of)
    run(policy, tok, 1, out / f"{name}-2.pt", model_of)
    start = torch.load(out / ("w1moe-1.pt" if moe else "w1-1.pt"), weights_only=False) if rank0 else None
    if start is not None:
        hf.load_state_dict(start["weights"])
    policy = MegatronPolicy(
        hf.config.to_dict(),
        LR,
        source=hf if rank0 else None,
        with_ref=True,
        ref_source=reference(1, moe) if rank0 else None,
        optimizer_state=start["optimizer"] if start else None,
        bucket_mb=0.05,
        pipeline=stages,
    )  # weights and moments in several buckets
    run(policy, tok, 1, out / f"w1to{name}-2.pt", model_of)
    try:  # another split in this process is refused (megatron-core's parallel state is global)
        model_parallel(policy.tp, stages, ep=1 if moe else dist.get_world_size())
    except RuntimeError as exc:
        assert "one process holds one split" in str(exc), exc
    else:
        raise AssertionError("model_parallel accepted another split than the process's")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1, sys.argv[3:] == ["moe"])
