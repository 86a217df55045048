"""What the data-parallel tests train: a tiny model, hand-built samples and two updates' settings
(the second with stale samples, token-mean and a KL penalty to the starting model, so the proximal
pass, both denominators and the sharded reference run), the
same in the test process (W = 1) and under torchrun (`two_ranks.py`, W = 2)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from mgrpo.models import build_model, train_tokenizer
from mgrpo.records import Sample, Transcript
from mgrpo.training import UpdateSettings
from tests.samples import as_samples

LR = 1e-3
SETTINGS = (
    UpdateSettings(
        minibatch_size=4, ppo_epochs=2
    ),  # 5 samples: the last minibatch of 1 leaves rank 1 a weight-0 row
    # KL to the start; micro-batches of ≤ 30 padded tokens: at W = 2 one rank cuts 2 where the other
    # cuts 1 (rows of 6 and 22 tokens against one of 17), so ranks must even out their forwards
    UpdateSettings(minibatch_size=3, ppo_epochs=1, loss_agg="token-mean", kl_coef=0.05, microbatch_tokens=30),
)


def reference(update: int, moe: bool = False) -> torch.nn.Module | None:
    """The frozen reference of an update with a KL penalty: the starting model."""
    model = (tiny_moe() if moe else tiny())[0]
    return model.requires_grad_(False).eval() if SETTINGS[update].kl_coef > 0 else None


def tiny() -> tuple[torch.nn.Module, Any]:
    tok = train_tokenizer(["the quick brown fox jumps over the lazy dog"] * 20)
    return build_model("tiny", tok, seed=0), tok


def lora_tiny() -> tuple[torch.nn.Module, Any, Any]:
    """`tiny()` with a rank-4 LoRA adapter on q, v and down projections, its B drawn non-zero (so A
    gets a gradient too), the same on every rank and in every process; and the adapter's spec."""
    from mgrpo.config import LoraSpec
    from mgrpo.lora import inject

    model, tok = tiny()
    spec = LoraSpec(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
    torch.manual_seed(1)
    inject(model, spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    return model, tok, spec


def tiny_moe() -> tuple[torch.nn.Module, Any]:
    """A tiny Qwen3-MoE (4 experts, 2 per token, every layer sparse) on the same tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    tok = train_tokenizer(["the quick brown fox jumps over the lazy dog"] * 20)
    cfg = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # a router with distinct scores (HF starts it at zero: every expert tied)
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(std=0.5)
    return model, tok


def samples(update: int, vocab: int, low: int = 0) -> tuple[list[Sample], int | None]:
    """Random transcripts of token ids low … vocab − 1 with random advantages, some stale (update 1),
    and the policy version to train them at."""
    rng = random.Random(update)
    out, adv = [], []
    for _ in range(5 if update == 0 else 7):
        n, p = rng.randint(6, 24), rng.randint(2, 5)
        t = Transcript(
            token_ids=[rng.randrange(low, vocab) for _ in range(n)],
            logp=[-3 * rng.random() for _ in range(n)],
            mask=[0] * p + [1] * (n - p),
            prompt_len=p,
        )
        if update == 1 and len(out) == 2:
            t.mask = [0] * n  # a row with no trained token: outside the seq-mean denominator
        out.append(t)
        adv.append(rng.uniform(-1, 1))
    return as_samples(out, adv, [update == 1 and i % 2 == 0 for i in range(len(out))])


def save(
    path: Path, weights: dict[str, torch.Tensor], optimizer: dict[str, Any], metrics: dict[str, float]
) -> None:
    torch.save({"weights": weights, "optimizer": optimizer, "metrics": metrics}, path)
