"""LoRA roles (`mgrpo.lora`, `roles.<r>.lora`): the update against peft used directly, the frozen base,
the engine's merged weights, the adapter checkpoint and its resume, with the real loading path (a
saved HF folder as the role's `path`) and the real `RoleModel`."""

import json

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from pydantic import ValidationError
from safetensors.torch import load_file

from mgrpo.algo.loss import policy_loss
from mgrpo.batching import collate
from mgrpo.config import JobConfig, LoraSpec
from mgrpo.engines.base import SamplingParams
from mgrpo.lora import Adapter, weights_sha256
from mgrpo.models import build_model, load, save, token_logprobs
from mgrpo.records import Sample, Transcript
from mgrpo.role_model import RoleModel
from mgrpo.runtime import Placement
from mgrpo.training import UpdateSettings, ppo_update
from mgrpo.workflows import JobConfigError, job_spec
from tests.mgrpo.test_role_model import samples_of

SPEC = LoraSpec(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
PROMPT = "who was born in"


@pytest.fixture(scope="module")
def folder(tokenizer, tmp_path_factory):
    return save(build_model("tiny", tokenizer, seed=0), tokenizer, tmp_path_factory.mktemp("base") / "m")


def role_model(folder, tmp_path, *, last_step=-1, lora=SPEC, **job):
    roles = {"planner": {"model": {"path": str(folder)}, "lora": lora.model_dump() if lora else None}}
    cfg = JobConfig(roles=roles, **job)
    placement = Placement(cache_dir=tmp_path, checkpoint_dir=tmp_path)
    return RoleModel(job_spec(cfg), "planner", placement=placement, job_id="j", last_step=last_step)


def sampled(m, version=0):
    """Four rollouts of the role's engine with advantages ±1 (`samples_of`)."""
    return samples_of(m, [version] * 4)


def logits(model, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        return model(input_ids=x, attention_mask=torch.ones_like(x)).logits


class RecordingAdamW(torch.optim.AdamW):
    """AdamW that keeps each parameter's gradient as the step sees it."""

    def step(self, closure=None):
        self.seen = {
            id(p): p.grad.clone() for g in self.param_groups for p in g["params"] if p.grad is not None
        }
        return super().step(closure)


def test_an_update_equals_peft_used_directly(folder, tokenizer):
    """The same batch through `ppo_update` on our adapter and through a peft model built directly
    (same init, B set non-zero so A gets a gradient too): the same loss, the same adapter gradients."""
    ours = Adapter(load(folder)[0], SPEC, base_path=str(folder), seed=3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
        direct = get_peft_model(load(folder)[0], config)
    gen = torch.Generator().manual_seed(0)
    for (name, p), (name2, q) in zip(ours.peft.named_parameters(), direct.named_parameters(), strict=True):
        assert name == name2
        if "lora_B" in name:
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
                q.copy_(p)
        assert torch.equal(p, q), name  # the same init
    ours.merge()
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    samples = []
    for i, adv in enumerate([1.0, -1.0, 0.5, -0.5]):
        tail = tokenizer.encode(f" {1900 + 7 * i} in town {i}", add_special_tokens=False)
        full = ids + tail
        x = torch.tensor([full])
        with torch.no_grad():
            lp = token_logprobs(ours.merged, x, torch.ones_like(x))[0].tolist()
        tr = Transcript(full, [0.0, *lp], [0] * len(ids) + [1] * len(tail), len(ids))
        samples.append(Sample("planner", "g", tr, 0.0, advantage=adv))
    opt = RecordingAdamW(ours.trainable(), lr=1e-3)
    settings = UpdateSettings(minibatch_size=4, max_grad_norm=1e9)
    metrics = ppo_update(ours.model, opt, samples, settings, pad_id=tokenizer.pad_token_id)

    batch = collate([s.transcript for s in samples], tokenizer.pad_token_id)
    logp = token_logprobs(direct, batch.input_ids, batch.attention_mask)
    adv = torch.tensor([s.advantage for s in samples])
    loss, _ = policy_loss(logp, batch.logp_old, adv, batch.loss_mask)
    loss.backward()
    assert metrics["loss"] == pytest.approx(loss.item(), abs=1e-6)
    grads = {name: p.grad for name, p in direct.named_parameters() if p.requires_grad}
    assert len(grads) == len(opt.seen) == 3 * 2 * ours.model.config.num_hidden_layers  # q, v, down × A, B
    for name, p in ours.peft.named_parameters():
        if p.requires_grad:
            assert torch.allclose(opt.seen[id(p)], grads[name], atol=1e-6, rtol=0), name
            assert grads[name].abs().max() > 0, name  # A's gradient too: B is not zero


def test_the_base_stays_frozen_bit_for_bit(folder, tmp_path):
    """Three updates move the adapter only: every base tensor equals the saved one exactly, and the
    optimizer holds nothing but the adapter."""
    saved = load_file(str(folder / "model.safetensors"))
    m = role_model(folder, tmp_path)
    try:
        adapter = m.adapter
        before = {n: p.detach().clone() for n, p in adapter.peft.named_parameters() if p.requires_grad}
        for step in range(3):
            metrics = m.update(sampled(m, version=step), seed=step)
            assert metrics["adapter_bytes"] == adapter.bytes > 0
        held = {id(p) for g in m.optimizer.param_groups for p in g["params"]}
        assert held == {id(p) for p in adapter.trainable()} and len(held) == len(before)
        for name, p in adapter.peft.named_parameters():
            if "lora_" in name:
                assert not torch.equal(p, before[name]), f"{name} never trained"
                continue
            key = name.removeprefix("base_model.model.").replace(".base_layer", "")
            assert not p.requires_grad, name
            assert torch.equal(p, saved[key]), f"base tensor {key} changed"
    finally:
        m.close()


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_the_engine_samples_from_base_plus_adapter(folder, tmp_path, max_staleness):
    """After updates the engine's weights give the trained base + adapter's logits (teacher-forced),
    on the shared merged copy (synchronous) and on the engine's own pushed copy (max_staleness 1)."""
    m = role_model(folder, tmp_path, max_staleness=max_staleness)
    try:
        base = logits(load(folder)[0], [5, 6, 7, 8, 9])
        for step in range(2):
            m.update(sampled(m, version=step), seed=step)
        (s,) = m.engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2))
        assert s.weights_version == 2
        trained = logits(m.adapter.peft, [5, 6, 7, 8, 9])
        served = logits(m.engine.model, [5, 6, 7, 8, 9])
        assert (trained - base).abs().max() > 1e-3  # the adapter moved the policy
        assert torch.allclose(served, trained, atol=1e-5, rtol=0)
    finally:
        m.close()


def test_the_kl_reference_is_the_base(folder, tmp_path):
    """kl_coef > 0: the reference is the base with the adapter off — the base's logits after updates."""
    cfg = JobConfig(
        roles={
            "planner": {"model": {"path": str(folder)}, "lora": SPEC.model_dump(), "optim": {"kl_coef": 0.5}}
        }
    )
    placement = Placement(cache_dir=tmp_path, checkpoint_dir=tmp_path)
    m = RoleModel(job_spec(cfg), "planner", placement=placement, job_id="j", last_step=-1)
    try:
        metrics = m.update(sampled(m), seed=0)
        assert "kl_ref" in metrics
        metrics = m.update(sampled(m, version=1), seed=1)
        assert metrics["kl_ref"] > 0  # the adapter moved away from its reference
        x = torch.tensor([[5, 6, 7, 8]])
        with torch.no_grad():
            ref = m.ref_model(input_ids=x, attention_mask=torch.ones_like(x)).logits
        assert torch.equal(ref, logits(load(folder)[0], [5, 6, 7, 8]))
        assert not torch.equal(ref, logits(m.adapter.peft, [5, 6, 7, 8]))  # the adapter is back on
    finally:
        m.close()


def test_checkpoint_is_a_peft_adapter_folder_and_resumes(folder, tmp_path):
    """A checkpoint holds peft's adapter (no full weights) and the base's path and sha256; peft and
    `models.load` read it; a new trainer resumes the adapter and the optimizer, and its next update is
    the one the first trainer makes."""
    m = role_model(folder, tmp_path)
    try:
        m.update(sampled(m), seed=0)
        ckpt = m.save(0).path
        names = {p.name for p in ckpt.iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state.pt"} <= names
        assert not any(n.startswith("model") and n.endswith(".safetensors") for n in names)
        meta = json.loads((ckpt / "mgrpo.json").read_text())
        assert meta["lora_base"] == {"path": str(folder), "sha256": weights_sha256(folder)}
        assert json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
            folder
        )
        ids = [5, 6, 7, 8, 9]
        trained = logits(m.adapter.peft, ids)
        by_peft = PeftModel.from_pretrained(load(folder)[0], str(ckpt))
        assert torch.allclose(logits(by_peft, ids), trained, atol=1e-6, rtol=0)
        assert torch.allclose(logits(load(ckpt)[0], ids), trained, atol=1e-5, rtol=0)  # merged

        batch = sampled(m, version=1)
        resumed = role_model(folder, tmp_path, last_step=0)
        try:
            assert resumed.version == 1 and resumed.start_step == 1
            assert torch.allclose(logits(resumed.engine.model, ids), trained, atol=1e-5, rtol=0)
            a = m.update(batch, seed=1)
            b = resumed.update(batch, seed=1)
            assert a["loss"] == pytest.approx(b["loss"], abs=1e-7)
            for (n, p), (_, q) in zip(
                m.adapter.peft.named_parameters(), resumed.adapter.peft.named_parameters(), strict=True
            ):
                assert torch.allclose(p, q, atol=1e-7, rtol=0), n  # the optimizer state came back too
        finally:
            resumed.close()
    finally:
        m.close()


def test_resume_onto_another_base_is_refused(tokenizer, tmp_path):
    base = save(build_model("tiny", tokenizer, seed=0), tokenizer, tmp_path / "base")
    m = role_model(base, tmp_path)
    try:
        m.save(0)
    finally:
        m.close()
    save(build_model("tiny", tokenizer, seed=1), tokenizer, base)  # someone replaced the base's weights
    with pytest.raises(RuntimeError, match="sha256"):
        role_model(base, tmp_path, last_step=0)


def test_config_errors_say_what_to_fix(folder):
    with pytest.raises(ValidationError, match="module names"):
        LoraSpec(target_modules=["q_proj; rm -rf /"])
    with pytest.raises(ValidationError):
        LoraSpec(rank=0)
    with pytest.raises(JobConfigError, match=r"give roles.solver.lora too"):
        job_spec(JobConfig(workflow="marsrl", roles={"verifier": {"share_model_with": "solver", "lora": {}}}))
    with pytest.raises(ValueError, match="matches no linear layer"):
        Adapter(load(folder)[0], LoraSpec(target_modules=["nothing_here"]), base_path=str(folder))


def test_two_roles_on_one_base_each_train_their_own_adapter(folder, tmp_path):
    """Roles on one base (MarsRL's verifier with its own adapter in the solver's trainer): every base
    tensor is one tensor in memory for both; an update of either moves its own adapter only, with its
    own optimizer, and each engine samples from its own base + adapter; checkpoints and resume per role."""
    roles = {
        "solver": {"model": {"path": str(folder)}, "lora": SPEC.model_dump()},
        "verifier": {"share_model_with": "solver", "lora": SPEC.model_dump()},
    }
    job = job_spec(JobConfig(workflow="marsrl", roles=roles))
    assert job.own_adapter("verifier") and not job.own_adapter("solver")
    placement = Placement(cache_dir=tmp_path, checkpoint_dir=tmp_path)

    def opened(last_step=-1):
        root = RoleModel(job, "solver", placement=placement, job_id="j", last_step=last_step)
        head = RoleModel(job, "verifier", placement=placement, job_id="j", last_step=last_step, base_of=root)
        return root, head

    def adapters(m):
        return {n: p.detach().clone() for n, p in m.adapter.peft.named_parameters() if ".lora_" in n}

    root, head = opened()
    try:
        base = {p.data_ptr() for n, p in root.adapter.model.named_parameters() if ".lora_" not in n}
        mine = {p.data_ptr() for n, p in head.adapter.model.named_parameters() if ".lora_" not in n}
        assert mine == base  # one base in memory
        held = [{id(p) for g in m.optimizer.param_groups for p in g["params"]} for m in (root, head)]
        assert not held[0] & held[1] and held[1] == {id(p) for p in head.adapter.trainable()}
        start = {m.role: adapters(m) for m in (root, head)}
        assert any(not torch.equal(start["solver"][k], start["verifier"][k]) for k in start["solver"])
        saved = load_file(str(folder / "model.safetensors"))
        for m, other in ((head, root), (root, head)):
            m.update(sampled(m, version=m.version), seed=len(m.role))
            moved, kept = adapters(m), adapters(other)
            assert all(not torch.equal(moved[k], start[m.role][k]) for k in moved if "lora_B" in k), m.role
            assert all(torch.equal(kept[k], start[other.role][k]) for k in kept), (
                f"{m.role} moved {other.role}"
            )
            start[m.role] = moved
        for n, p in head.adapter.peft.named_parameters():
            if ".lora_" not in n:
                assert torch.equal(
                    p, saved[n.removeprefix("base_model.model.").replace(".base_layer", "")]
                ), n
        ids = [5, 6, 7, 8, 9]
        for m in (root, head):
            assert torch.allclose(logits(m.engine.model, ids), logits(m.adapter.peft, ids), atol=1e-5, rtol=0)
        assert not torch.allclose(logits(root.engine.model, ids), logits(head.engine.model, ids))
        ckpts = [m.save(0).path for m in (root, head)]
        assert [c.parent.name for c in ckpts] == ["solver", "verifier"]
    finally:
        root.close()
        head.close()
    root, head = opened(last_step=0)
    try:
        for m in (root, head):
            got = adapters(m)
            assert all(torch.equal(got[k], start[m.role][k]) for k in got), (
                f"{m.role} resumed another adapter"
            )
    finally:
        root.close()
        head.close()
