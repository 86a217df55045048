import torch

from mgrpo.batching import collate
from mgrpo.engines.base import SamplingParams
from mgrpo.engines.hf import HFEngine
from mgrpo.models import build_model, token_logprobs
from mgrpo.records import Transcript
from mgrpo.training import UpdateSettings, equal_count, microbatches, ppo_update
from tests.samples import as_samples


def sampled_transcripts(model, tokenizer, prompts):
    engine = HFEngine(model, tokenizer)
    try:
        samples = engine.generate(prompts, SamplingParams(max_new_tokens=12, seed=0))
    finally:
        engine.close()
    out = []
    for p, s in zip(prompts, samples, strict=True):
        out.append(
            Transcript(
                p + s.token_ids, [0.0] * len(p) + s.logprobs, [0] * len(p) + [1] * len(s.token_ids), len(p)
            )
        )
    return out


def seq_logp(model, tokenizer, transcripts):
    b = collate(transcripts, tokenizer.pad_token_id)
    with torch.no_grad():
        lp = token_logprobs(model, b.input_ids, b.attention_mask)
    return ((lp * b.loss_mask).sum(-1)).tolist()


def test_one_update_moves_probability_towards_positive_advantages(tokenizer, small_task):
    """The whole update path (engine log-probs → collate → teacher-forced log-probs → clipped loss →
    AdamW) raises the likelihood of positively advantaged samples and lowers the others."""
    model = build_model("tiny", tokenizer, seed=3)
    prompts = [tokenizer.encode(d.text, add_special_tokens=False)[:8] for d in small_task.world.docs[:4]]
    trs = sampled_transcripts(model, tokenizer, prompts)
    before = seq_logp(model, tokenizer, trs)
    adv = [1.0, -1.0, 1.0, -1.0]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    metrics = ppo_update(
        model,
        opt,
        as_samples(trs, adv)[0],
        UpdateSettings(minibatch_size=4),
        pad_id=tokenizer.pad_token_id,
    )
    after = seq_logp(model, tokenizer, trs)
    assert metrics["approx_kl"] < 1e-6  # the first minibatch is exactly on-policy: logp_old matches
    for a, b0, b1 in zip(adv, before, after, strict=True):
        assert (b1 - b0) * a > 0, (adv, before, after)


def test_kl_penalty_needs_a_reference_and_pulls_towards_it(tokenizer, small_task):
    """β > 0 without a reference model is refused; with one, kl_ref is reported (0 on the first
    minibatch: the policy still equals its reference) and a large β keeps the update closer to it."""
    import copy

    import pytest

    prompts = [tokenizer.encode(d.text, add_special_tokens=False)[:8] for d in small_task.world.docs[:4]]
    base = build_model("tiny", tokenizer, seed=3)
    trs = sampled_transcripts(base, tokenizer, prompts)
    samples, _ = as_samples(trs, [1.0, -1.0, 1.0, -1.0])
    with pytest.raises(ValueError, match="ref_model"):
        ppo_update(base, torch.optim.AdamW(base.parameters()), samples, UpdateSettings(kl_coef=0.1), pad_id=0)

    def drift(kl_coef):
        model, ref = copy.deepcopy(base), copy.deepcopy(base).requires_grad_(False)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        first = None
        for i in range(6):
            m = ppo_update(
                model,
                opt,
                samples,
                UpdateSettings(minibatch_size=4, kl_coef=kl_coef),
                pad_id=tokenizer.pad_token_id,
                seed=i,
                ref_model=ref,
            )
            first = m["kl_ref"] if first is None else first
        b = collate(trs, tokenizer.pad_token_id)
        with torch.no_grad():
            new = token_logprobs(model, b.input_ids, b.attention_mask)
            old = token_logprobs(ref, b.input_ids, b.attention_mask)
        return first, float(((new - old).abs() * b.loss_mask).sum() / b.loss_mask.sum())

    first, free = drift(0.0)
    assert first == 0.0
    _, anchored = drift(5.0)
    assert anchored < free, (anchored, free)


def test_compiled_update_matches_eager_and_leaves_rollouts_eager(tokenizer, small_task):
    """`compile: true` runs the update's forward through torch.compile (inductor C++ kernels on CPU):
    the same loss and the same weights afterwards as eager, while the model's own forward, which the
    rollout engine calls, stays eager."""
    prompts = [tokenizer.encode(d.text, add_special_tokens=False)[:8] for d in small_task.world.docs[:4]]
    models = [build_model("tiny", tokenizer, seed=5) for _ in range(2)]
    trs = sampled_transcripts(models[0], tokenizer, prompts)
    samples, _ = as_samples(trs, [1.0, -1.0, 0.5, -0.5])
    metrics = []
    for model, compile_ in zip(models, (False, True), strict=True):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        settings = UpdateSettings(minibatch_size=2, compile=compile_)
        metrics.append(ppo_update(model, opt, samples, settings, pad_id=tokenizer.pad_token_id))
    assert abs(metrics[0]["loss"] - metrics[1]["loss"]) < 1e-5, metrics
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        # inductor reorders float sums; Adam's first step (≈ lr·sign(g)) magnifies that on near-zero
        # gradients: measured up to 1.6e-5 with transformers 5.24, lr 1e-3
        assert torch.allclose(a, b, atol=5e-5), (a - b).abs().max()
    assert hasattr(models[1], "_mgrpo_compiled_forward") and not hasattr(models[0], "_mgrpo_compiled_forward")
    assert models[1].forward.__func__ is type(models[1]).forward  # the engine's path is untouched


def test_stale_samples_are_reweighted_against_the_current_policy(tokenizer, small_task):
    """Samples from an older policy: logp_prox is the current model's before the update, each token
    weighted by min(exp(logp_prox − logp_old), C); fresh samples in the same batch keep weight 1; with
    no stale flag set the update is exactly the on-policy one."""
    import copy

    old = build_model("tiny", tokenizer, seed=3)
    prompts = [tokenizer.encode(d.text, add_special_tokens=False)[:8] for d in small_task.world.docs[:4]]
    trs = sampled_transcripts(old, tokenizer, prompts)  # logp_old from the old policy
    current = copy.deepcopy(old)
    with torch.no_grad():
        for w in current.parameters():
            w.add_(0.1 * torch.randn_like(w, generator=torch.Generator().manual_seed(0)))
    adv, stale = [1.0, -1.0, 1.0, -1.0], [True, True, False, False]
    b = collate(trs, tokenizer.pad_token_id)
    with torch.no_grad():
        prox = token_logprobs(current.train(), b.input_ids, b.attention_mask)
    w = torch.exp(prox - b.logp_old).clamp(max=1.5)
    w[2:] = 1.0  # the fresh rows
    expected = float((w * b.loss_mask).sum() / b.loss_mask.sum())
    ratio = torch.exp(prox - b.logp_old)  # fresh rows: against logp_old; stale rows: against logp_prox
    ratio[:2] = 1.0
    expected_ratio = float((ratio * b.loss_mask).sum() / b.loss_mask.sum())

    def run(flags):
        model = copy.deepcopy(current)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        samples, version = as_samples(trs, adv, flags)
        m = ppo_update(
            model,
            opt,
            samples,
            UpdateSettings(minibatch_size=4, is_cap=1.5),
            pad_id=tokenizer.pad_token_id,
            version=version,
        )
        return m, torch.cat([p.flatten() for p in model.parameters()])

    m, _ = run(stale)
    assert abs(m["is_weight_mean"] - expected) < 1e-5 and m["is_capped_frac"] > 0
    assert abs(m["ratio_mean"] - expected_ratio) < 1e-4 and abs(expected_ratio - 1.0) > 1e-3
    m0, p0 = run(None)
    _, p1 = run([False] * 4)
    assert "is_weight_mean" not in m0 and torch.equal(p0, p1)


def test_first_minibatch_stale_rows_take_logp_prox_from_their_own_forward(tokenizer, small_task, monkeypatch):
    """In a one-epoch update the first minibatch runs on the weights the proximal pass would: its stale
    rows take logp_prox from its own forward (detached), the second minibatch's from the pass. Same
    metrics and weights as with the pass over every stale row, and that row's pass saved; with two
    epochs (the rows come back after steps) the pass runs for every stale row."""
    import copy

    import mgrpo.training as training

    old = build_model("tiny", tokenizer, seed=3)
    prompts = [
        tokenizer.encode(d.text, add_special_tokens=False)[: 5 + i]
        for i, d in enumerate(small_task.world.docs[:6])
    ]
    trs = sampled_transcripts(old, tokenizer, prompts)
    current = copy.deepcopy(old)
    with torch.no_grad():
        for w in current.parameters():
            w.add_(0.1 * torch.randn_like(w, generator=torch.Generator().manual_seed(0)))
    samples, version = as_samples(
        trs, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0], [True, True, False, True, True, True]
    )
    pass_of = training._proximal_logprobs
    rows_in_pass: list[int] = []

    def run(first_from_forward: bool, epochs: int = 1):
        def counted(model, samples, stale, s, pad_id, first):
            out = pass_of(model, samples, stale, s, pad_id, first if first_from_forward else set())
            rows_in_pass.append(sum(isinstance(p, torch.Tensor) for p in out or []))
            return out

        monkeypatch.setattr(training, "_proximal_logprobs", counted)
        model = copy.deepcopy(current)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        settings = UpdateSettings(minibatch_size=3, ppo_epochs=epochs, is_cap=1.5)
        m = ppo_update(model, opt, samples, settings, pad_id=tokenizer.pad_token_id, version=version)
        return m, torch.cat([p.flatten() for p in model.parameters()])

    (m_own, p_own), (m_pass, p_pass) = run(True), run(False)
    run(True, epochs=2)
    assert (
        rows_in_pass[1:] == [5, 5] and 2 <= rows_in_pass[0] < 5
    )  # the first minibatch held 1 to 3 stale rows
    assert m_own["is_capped_frac"] > 0 and m_own["clip_frac"] > 0  # both corrections acted
    for k, v in m_pass.items():
        assert abs(v - m_own[k]) < 1e-5 * max(1.0, abs(v)), (k, v, m_own[k])
    assert torch.allclose(p_own, p_pass, atol=1e-6), (p_own - p_pass).abs().max()


def test_microbatches_sort_by_length_and_keep_within_the_budget():
    lengths = [30, 10, 50, 20, 10, 40]
    assert microbatches(lengths, 0) == [[0, 1, 2, 3, 4, 5]]  # off: the minibatch as it came
    got = microbatches(lengths, 60)
    assert sorted(i for mb in got for i in mb) == list(range(6))  # every row exactly once
    assert got == [[1, 4, 3], [0], [5], [2]]  # 3 × 20, then 30, 40, 50 alone (2 × 30 > 60 …)
    for mb in got:
        assert len(mb) * max(lengths[i] for i in mb) <= 60 or len(mb) == 1
    assert microbatches([100, 5], 50) == [[1], [0]]  # a row over the budget gets its own
    assert microbatches([], 64) == []


def test_a_micro_batched_update_equals_the_one_batch_update(tokenizer, small_task):
    """Rows of different lengths, two minibatches (the second off-policy, so the clip acts), a stale
    sample, both loss aggregations: micro-batches of at most 40 padded tokens give the same loss,
    metrics and (SGD) weights as each minibatch in one forward."""
    prompts = [
        tokenizer.encode(d.text, add_special_tokens=False)[: 3 + 2 * i]
        for i, d in enumerate(small_task.world.docs[:8])
    ]
    base = build_model("tiny", tokenizer, seed=7)
    trs = [  # row i keeps 12 - i of its sampled tokens: both lengths and trained tokens differ
        Transcript(t.token_ids[: len(t) - i], t.logp[: len(t) - i], t.mask[: len(t) - i], t.prompt_len)
        for i, t in enumerate(sampled_transcripts(base, tokenizer, prompts))
    ]
    assert len({sum(t.mask) for t in trs}) == 8, "the test needs rows with different trained tokens"
    samples, version = as_samples(
        trs, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, 0.0], [False, True] + [False] * 6
    )
    for agg in ("seq-mean-token-mean", "token-mean"):
        models = [build_model("tiny", tokenizer, seed=7) for _ in range(2)]
        metrics = []
        for model, tokens in zip(models, (0, 40), strict=True):
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            settings = UpdateSettings(minibatch_size=4, ppo_epochs=2, loss_agg=agg, microbatch_tokens=tokens)
            metrics.append(
                ppo_update(model, opt, samples, settings, pad_id=tokenizer.pad_token_id, version=version)
            )
        assert metrics[0]["clip_frac"] > 0, metrics[0]  # the clip acted in the off-policy minibatches
        assert metrics[0].keys() == metrics[1].keys()
        for k, v in metrics[0].items():
            assert abs(v - metrics[1][k]) < 1e-5 * max(1.0, abs(v)), (agg, k, v, metrics[1][k])
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
            assert torch.allclose(a, b, atol=1e-6), (agg, (a - b).abs().max())


def test_equal_count_splits_then_fills_within_the_token_bound():
    assert equal_count([[0, 1, 2, 3], [4]], 3) == ([[0, 1], [2, 3], [4]], 3)  # the longest split first
    assert equal_count([[0], [1]], 4) == ([[0], [1], [0], [0]], 2)  # single rows: fillers after
    assert equal_count([[0, 1]], 1) == ([[0, 1]], 1)
