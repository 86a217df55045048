"""Run under `torchrun --nproc-per-node 2` by test_megatron.py: the tiny Qwen3 of `updates.py` as a
megatron-core GPTModel split over 2 tensor-parallel ranks (gloo, on the CPU through `cpu_shim`):
its logits on a left-padded batch (→ `<out>/logits.pt`) and the two updates of `updates.py` through
`ppo_update` (the HF state after each → `<out>/tp2-1.pt`, `tp2-2.pt`)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mgrpo.parallel.group import init_from_env
from mgrpo.parallel.megatron import MegatronCausalLM, cpu_shim, hf_to_megatron, load_into
from mgrpo.training import ppo_update
from tests.mgrpo.parallel.updates import LR, SETTINGS, samples, tiny

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


def main(out: Path) -> None:
    from megatron.core import parallel_state

    assert init_from_env(timeout_s=120)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=dist.get_world_size())
    hf, tok = tiny()
    rank, tp = dist.get_rank(), dist.get_world_size()
    with cpu_shim():
        model = MegatronCausalLM(hf.config, tp)
        load_into(model.gpt, hf_to_megatron(hf.state_dict(), hf.config, tp, rank))
        ids, mask = batch(len(tok))
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        states, metrics = [], []
        for update in (0, 1):
            rows, stale = samples(update, len(tok), low=NO_PAD)
            metrics.append(
                ppo_update(
                    model, opt, rows, SETTINGS[update], pad_id=tok.pad_token_id, seed=update, stale=stale
                )
            )
            states.append(model.hf_state_dict())
    if rank == 0:
        torch.save({"logits": logits, "ids": ids, "mask": mask}, out / "logits.pt")
        for i, (state, m) in enumerate(zip(states, metrics, strict=True)):
            torch.save({"weights": state, "metrics": m}, out / f"tp2-{i + 1}.pt")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
