"""The megatron-core backend (`mgrpo.parallel.megatron`, `.megatron_model`, `.megatron_pipeline`): HF Qwen3 ↔ Megatron names and
layouts round-trip bit for bit on 1, 2 and 4 tensor-parallel ranks and 1 or 2 pipeline stages (tied
and untied, a vocabulary that needs padding); a GPTModel split over 2 tensor-parallel ranks (two
processes under torchrun, gloo) gives the HF model's logits and, trained by `ppo_update` with the
same samples, the HF model's weights; and so does one split over 2 tensor-parallel ranks on each of 2
pipeline stages (four processes), its updates' micro-batches through megatron-core's 1F1B schedule. megatron-core runs on the CPU through `cpu_shim` (its CUDA-only buffer
placement and RNG fork; module docstring); its fused CUDA kernels and bf16 run in the GPU check
(bench/gpu_check.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

from mgrpo.checkpoint import optimizer_state
from mgrpo.models import token_logprobs
from mgrpo.parallel.megatron import check_split, hf_to_megatron, megatron_to_hf
from mgrpo.training import ppo_update
from tests.mgrpo.parallel.megatron_tp import NO_PAD, batch
from tests.mgrpo.parallel.test_fsdp import assert_same, load
from tests.mgrpo.parallel.updates import LR, SETTINGS, reference, samples, save, tiny, tiny_moe

ROOT = Path(__file__).resolve().parents[3]


def qwen3(tied: bool, vocab: int = 331) -> torch.nn.Module:
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=16,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(1)
    return AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2)])
def test_hf_megatron_round_trip_is_exact(tp, pp, tied):
    model = qwen3(tied)
    hf = model.state_dict()
    shards = [hf_to_megatron(hf, model.config, tp, r % tp, pp, r // tp) for r in range(tp * pp)]
    assert shards[0]["embedding.word_embeddings.weight"].shape[0] == -(-331 // tp)  # padded, then split
    back = megatron_to_hf(shards, model.config, pp)
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name
    if tp > 1:  # each rank holds its own query groups: [q of the group's heads; k; v]
        q = hf["model.layers.0.self_attn.q_proj.weight"]
        k = hf["model.layers.0.self_attn.k_proj.weight"]
        qkv1 = shards[1]["decoder.layers.0.self_attention.linear_qkv.weight"]
        first_group = 4 // tp  # groups on rank 0; rank 1's first group follows
        assert torch.equal(qkv1[: 2 * 16], q[first_group * 2 * 16 : (first_group * 2 + 2) * 16])
        assert torch.equal(qkv1[2 * 16 : 3 * 16], k[first_group * 16 : (first_group + 1) * 16])
    if pp > 1:  # the last stage: HF layer 1 as its local layer 0, the head (a tied one: the embedding's copy)
        last = shards[(pp - 1) * tp]  # its tensor-parallel rank 0
        assert (
            "embedding.word_embeddings.weight" not in last
            and "decoder.layers.1.input_layernorm.weight" not in last
        )
        assert torch.equal(
            last["decoder.layers.0.input_layernorm.weight"], hf["model.layers.1.input_layernorm.weight"]
        )
        head = hf["model.embed_tokens.weight" if tied else "lm_head.weight"]
        assert torch.equal(last["output_layer.weight"][: head.shape[0] // tp], head[: head.shape[0] // tp])


def qwen3_moe(tied: bool) -> torch.nn.Module:
    cfg = Qwen3MoeConfig(
        vocab_size=331,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(1)
    return AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_hf_megatron_round_trip_is_exact_for_experts(ep, tied):
    model = qwen3_moe(tied)
    hf = model.state_dict()
    shards = [hf_to_megatron(hf, model.config, ep=ep, expert_rank=r) for r in range(ep)]
    back = megatron_to_hf(shards, model.config)
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name
    last = shards[-1]  # the last rank's first expert is HF's expert 4 − 4 / ep; the router on every rank
    experts = hf["model.layers.1.mlp.experts.gate_up_proj"]
    assert torch.equal(
        last["decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"], experts[4 - 4 // ep]
    )
    assert torch.equal(last["decoder.layers.1.mlp.router.weight"], hf["model.layers.1.mlp.gate.weight"])
    assert sum(".local_experts." in n for n in last) == 2 * 2 * 4 // ep  # layers × (fc1, fc2) × local


def assert_update_equal(got: dict, want: dict, keys: tuple[str, ...]) -> None:
    """The same weights (float noise) and the same metrics `keys` (where the one process has them)."""
    assert_same(got["weights"], want["weights"])
    for key in keys:
        if key in want["metrics"]:
            assert abs(got["metrics"][key] - want["metrics"][key]) < 1e-4, (
                key,
                got["metrics"],
                want["metrics"],
            )


def assert_moments_equal(got: dict, want: dict) -> None:
    assert set(got["state"]) == set(want["state"])
    for name, s in want["state"].items():
        for m in ("exp_avg", "exp_avg_sq"):
            assert (got["state"][name][m] - s[m]).abs().max() < 1e-6 + 1e-3 * s[m].abs().max(), (name, m)


def test_a_split_that_does_not_divide_the_model_is_refused():
    with pytest.raises(ValueError, match="must divide the model's query groups"):
        check_split(qwen3(True).config, 8)
    with pytest.raises(ValueError, match="must divide the model's layers"):
        check_split(qwen3(True).config, 1, 3)
    with pytest.raises(ValueError, match="must divide the model's experts"):
        check_split(qwen3_moe(True).config, 1, 1, 3)
    with pytest.raises(ValueError, match="leave MGRPO_PIPELINE_STAGES at 1"):
        check_split(qwen3_moe(True).config, 1, 2, 1)


def _torchrun(out: Path, ranks: int, stages: int, *extra: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        str(ROOT / "tests/mgrpo/parallel/megatron_tp.py"),
        str(out),
        str(stages),
        *extra,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The two updates on the HF model in this process: the states after each."""
    out = tmp_path_factory.mktemp("megatron")
    model, tok = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    for update in (0, 1):
        rows, version = samples(update, len(tok), low=NO_PAD)
        m = ppo_update(
            model,
            opt,
            rows,
            SETTINGS[update],
            pad_id=tok.pad_token_id,
            seed=update,
            version=version,
            ref_model=reference(update),
        )
        save(out / f"w1-{update + 1}.pt", model.state_dict(), optimizer_state(model, opt), m)
    return out


@pytest.fixture(scope="module")
def ep2(tmp_path_factory):
    """A tiny Qwen3-MoE: the two updates in this process, then its experts split over 2 ranks (each
    training its own rows, the dense part data parallel) under torchrun."""
    out = tmp_path_factory.mktemp("megatron-moe")
    model, tok = tiny_moe()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    for update in (0, 1):
        rows, version = samples(update, len(tok), low=NO_PAD)
        m = ppo_update(
            model,
            opt,
            rows,
            SETTINGS[update],
            pad_id=tok.pad_token_id,
            seed=update,
            version=version,
            ref_model=reference(update, moe=True),
        )
        save(out / f"w1moe-{update + 1}.pt", model.state_dict(), optimizer_state(model, opt), m)
    _torchrun(out, 2, 1, "moe")
    return out


@pytest.fixture(scope="module")
def tp2(one_process):
    """The 2-rank tensor-parallel MegatronPolicy under torchrun, beside the one-process states."""
    _torchrun(one_process, 2, 1)
    return one_process


@pytest.fixture(scope="module")
def tp2pp2(one_process):
    """2 tensor-parallel ranks on each of 2 pipeline stages (4 processes), beside the one-process states."""
    _torchrun(one_process, 4, 2)
    return one_process


def test_tensor_parallel_forward_equals_hf(tp2):
    hf, tok = tiny()
    got = torch.load(tp2 / "tp2pp1-logits.pt")
    ids, mask = batch(len(tok))
    assert torch.equal(got["ids"], ids) and tok.pad_token_id < NO_PAD
    with torch.no_grad():
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        want = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    real = mask.bool()
    assert (got["logits"][real] - want[real]).abs().max() < 1e-4


@pytest.mark.parametrize("update", [1, 2])
def test_tensor_parallel_updates_equal_hf(tp2, update):
    """The same PPO updates (stale samples, both loss denominators, clipping) on the HF model in this
    process and on the 2-rank GPTModel: the same weights, converted back, and the same metrics."""
    got, want = load(tp2 / f"tp2pp1-{update}.pt"), load(tp2 / f"w1-{update}.pt")
    assert_same(got["weights"], want["weights"])
    for key in ("loss", "grad_norm", "clip_frac"):
        assert abs(got["metrics"][key] - want["metrics"][key]) < 1e-4, (key, got["metrics"], want["metrics"])


def test_optimizer_state_converts_both_ways(tp2):
    """The optimizer state comes out in the one-process, FQN-keyed form (the same moments), and a
    one-process state after update 1 resumes on 2 tensor-parallel ranks to the one-process update 2."""
    got, want = load(tp2 / "tp2pp1-1.pt")["optimizer"], load(tp2 / "w1-1.pt")["optimizer"]
    assert_moments_equal(got, want)
    assert "lm_head.weight" not in got["state"]  # tied
    for name, s in want["state"].items():
        assert float(got["state"][name]["step"]) == float(s["step"]), name
    assert_same(load(tp2 / "w1totp2pp1-2.pt")["weights"], load(tp2 / "w1-2.pt")["weights"])


def test_pipeline_stages_give_the_hf_log_probs(tp2pp2):
    """The schedule's forward-only pass (what the proximal and reference log-probs use): the HF
    model's teacher-forced log-probs, on every rank (rank 0 is the first stage)."""
    hf, _ = tiny()
    got = torch.load(tp2pp2 / "tp2pp2-logits.pt")
    with torch.no_grad():
        want = token_logprobs(hf, got["ids"], got["mask"])
    real = (got["mask"][:, :-1] * got["mask"][:, 1:]).bool()  # a real token after a real one (after
    # padding, each model's padding position predicts differently; never a trained token)
    assert (got["logits"][real] - want[real]).abs().max() < 1e-4


@pytest.mark.parametrize("update", [1, 2])
def test_pipeline_parallel_updates_equal_hf(tp2pp2, update):
    """The same PPO updates through 2 stages × 2 tensor-parallel ranks, in 2–3 micro-batches of
    different lengths per minibatch (stale samples and a KL reference run the forward-only schedule):
    the HF model's weights and metrics — the gradient norm is the whole model's, over stages and ranks,
    the tied embedding's two copies (first and last stage) trained as one."""
    got, want = load(tp2pp2 / f"tp2pp2-{update}.pt"), load(tp2pp2 / f"w1-{update}.pt")
    assert_update_equal(got, want, ("loss", "grad_norm", "clip_frac", "kl_ref"))


def test_pipeline_parallel_resumes_a_one_process_state(tp2pp2):
    """A one-process checkpoint (weights and moments) after update 1, scattered to the 4 ranks (each
    stage its own layers), and update 2 on them: the one-process update 2; the moments gathered back
    match the one-process ones."""
    got, want = load(tp2pp2 / "tp2pp2-1.pt")["optimizer"], load(tp2pp2 / "w1-1.pt")["optimizer"]
    assert_moments_equal(got, want)
    assert_same(load(tp2pp2 / "w1totp2pp2-2.pt")["weights"], load(tp2pp2 / "w1-2.pt")["weights"])


def test_experts_over_two_ranks_give_the_hf_logits(ep2):
    hf, _ = tiny_moe()
    got = torch.load(ep2 / "ep2-logits.pt")
    with torch.no_grad():
        position_ids = (got["mask"].cumsum(-1) - 1).clamp(min=0)
        want = hf(input_ids=got["ids"], attention_mask=got["mask"], position_ids=position_ids).logits
    real = got["mask"].bool()
    assert (got["logits"][real] - want[real]).abs().max() < 1e-4


@pytest.mark.parametrize("update", [1, 2])
def test_experts_over_two_ranks_update_as_one_process(ep2, update):
    """The same PPO updates of the Qwen3-MoE in one process and with its experts on 2 ranks (rows split
    between them, each rank's batch padded to the other's shape for the experts' dispatch, the dense
    gradients averaged, each expert's from both ranks' tokens): the same weights and metrics."""
    got, want = load(ep2 / f"ep2-{update}.pt"), load(ep2 / f"w1moe-{update}.pt")
    assert_update_equal(got, want, ("loss", "grad_norm", "clip_frac", "approx_kl", "kl_ref", "tokens"))


def test_experts_over_two_ranks_resume_a_one_process_state(ep2):
    got, want = load(ep2 / "ep2-1.pt")["optimizer"], load(ep2 / "w1moe-1.pt")["optimizer"]
    assert_moments_equal(got, want)
    assert_same(load(ep2 / "w1toep2-2.pt")["weights"], load(ep2 / "w1moe-2.pt")["weights"])
