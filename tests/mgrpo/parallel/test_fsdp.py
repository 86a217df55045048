"""A role's trainer on W = 2 ranks (FSDP2 over gloo, two processes under torchrun) trains exactly as
on one: the same weights after updates from the same batches (a last minibatch smaller than W, stale
samples, both loss denominators), the same metrics, and checkpoints that resume across W."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mgrpo.checkpoint import full_optimizer_state, load_optimizer_state, optimizer_state
from mgrpo.training import ppo_update
from tests.mgrpo.parallel.updates import LR, SETTINGS, lora_tiny, reference, samples, save, tiny

ROOT = Path(__file__).resolve().parents[3]
TOL = 1e-6  # float32 sums in another order (per-rank partial losses, reduce-scatter)
# Adam turns float noise on a gradient near its eps into a step of up to ~lr: a few single elements
# per tensor may differ by that much, never more, and never many.
FEW = 1e-3  # the share of elements allowed beyond TOL


def one_rank_update(model, opt, pad_id, vocab, update):
    batch, version = samples(update, vocab)
    return ppo_update(
        model,
        opt,
        batch,
        SETTINGS[update],
        pad_id=pad_id,
        seed=update,
        version=version,
        ref_model=reference(update),
    )


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """The same weights up to float noise (see FEW)."""
    assert set(a) == set(b)
    diff = torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in a])
    assert (diff > TOL).float().mean().item() < FEW, (
        f"{int((diff > TOL).sum())} of {diff.numel()} elements differ"
    )
    assert diff.max().item() < LR, diff.max().item()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """W = 1 in this process, then W = 2 under torchrun; the states after each update."""
    out = tmp_path_factory.mktemp("ranks")
    model, tok = tiny()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    m1 = one_rank_update(model, opt, tok.pad_token_id, len(tok), 0)
    save(out / "w1-1.pt", model.state_dict(), optimizer_state(model, opt), m1)
    m2 = one_rank_update(model, opt, tok.pad_token_id, len(tok), 1)
    save(out / "w1-2.pt", model.state_dict(), optimizer_state(model, opt), m2)
    on_two_ranks("two_ranks.py", out)
    return out, start


def on_two_ranks(script: str, out: Path) -> None:
    """Run tests/mgrpo/parallel/`script` under torchrun on 2 local ranks (gloo), writing into `out`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(ROOT / "tests/mgrpo/parallel" / script),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def load(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def test_two_ranks_train_as_one(runs):
    out, start = runs
    for name in ("1", "2"):
        one, two = load(out / f"w1-{name}.pt"), load(out / f"w2-{name}.pt")
        assert_same(one["weights"], two["weights"])
        assert max_diff(one["weights"], start) > LR  # the updates moved the weights
        for key in (
            "loss",
            "pg_loss",
            "tokens",
            "grad_norm",
            "ratio_max",
            "is_weight_mean",
            "kl_ref",
            "clip_frac",
            "approx_kl",
        ):
            if key in one["metrics"]:
                assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-6), key
    assert {"is_weight_mean", "kl_ref"} <= set(
        load(out / "w2-2.pt")["metrics"]
    )  # the correction and the KL ran


def test_a_checkpoint_resumes_on_another_world_size(runs):
    out, _ = runs
    reference = load(out / "w1-2.pt")["weights"]
    # W = 1 → 2: the second update at W = 2 from the one-rank state after the first
    assert_same(load(out / "w1to2-2.pt")["weights"], reference)
    # W = 2 → 2 through the ranks' own optimizer shards (DCP)
    assert_same(load(out / "dcp-2.pt")["weights"], reference)
    # W = 2 shards → 1: the same moments as the gathered state, and the same second update
    state = load(out / "w2-1.pt")
    model, tok = tiny()
    model.load_state_dict(state["weights"])
    full = full_optimizer_state(model, {"dcp": str(out / "dcp-1")})
    for name, s in state["optimizer"]["state"].items():
        assert all(torch.equal(full["state"][name][m], s[m]) for m in ("exp_avg", "exp_avg_sq")), name
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    load_optimizer_state(model, opt, {"dcp": str(out / "dcp-1")})
    one_rank_update(model, opt, tok.pad_token_id, len(tok), 1)
    assert_same(model.state_dict(), reference)
    # W = 2 → 1: the second update in one process from the two-rank state (FQN-keyed optimizer state)
    state = load(out / "w2-1.pt")
    model, tok = tiny()
    model.load_state_dict(state["weights"])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    load_optimizer_state(model, opt, state["optimizer"])
    one_rank_update(model, opt, tok.pad_token_id, len(tok), 1)
    assert_same(model.state_dict(), reference)
    # the optimizer state mattered: without it the second update lands elsewhere
    fresh, _ = tiny()
    fresh.load_state_dict(state["weights"])
    one_rank_update(
        fresh, torch.optim.AdamW(fresh.parameters(), lr=LR, weight_decay=0.0), tok.pad_token_id, len(tok), 1
    )
    assert max_diff(fresh.state_dict(), reference) > LR / 10


def test_a_lora_role_on_two_ranks_trains_as_on_one(tmp_path):
    """A LoRA role on W = 2 (the base sharded and frozen, the adapter trained): after each update the
    adapter synced into rank 0's model equals the one-process update's (the second with its KL
    reference, the base with the adapter off), and the base is the starting one, bit for bit."""
    from mgrpo.lora import base_forward

    model, tok, _ = lora_tiny()
    start = {n: p.detach().clone() for n, p in model.state_dict().items()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    one = []
    for update in (0, 1):
        batch, version = samples(update, len(tok))
        ref = functools.partial(base_forward, model) if SETTINGS[update].kl_coef > 0 else None
        metrics = ppo_update(
            model,
            opt,
            batch,
            SETTINGS[update],
            pad_id=tok.pad_token_id,
            seed=update,
            version=version,
            ref_model=ref,
        )
        one.append(({n: p.detach().clone() for n, p in model.named_parameters()}, metrics))
    on_two_ranks("lora_ranks.py", tmp_path)
    for n, (weights, metrics) in enumerate(one, start=1):
        two = load(tmp_path / f"lora-w2-{n}.pt")
        adapter = {k: v for k, v in weights.items() if ".lora_" in k}
        assert_same(adapter, {k: two["synced"][k] for k in adapter})
        assert max_diff(adapter, {k: start[k] for k in adapter}) > LR  # the adapter moved
        for k, v in two["weights"].items():
            if ".lora_" not in k:
                assert torch.equal(v, start[k]), f"base tensor {k} changed on the ranks"
        for key in ("loss", "grad_norm", "kl_ref"):
            if key in metrics:
                assert two["metrics"][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
    assert "kl_ref" in load(tmp_path / "lora-w2-2.pt")["metrics"]
