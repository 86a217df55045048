import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from mgrpo.batching import collate
from mgrpo.models import build_model, token_logprobs
from mgrpo.records import Transcript
from mgrpo.shared_prefix import prefix_groups, shared_prefix_logprobs, shares_prefixes
from mgrpo.training import UpdateSettings, ppo_update
from tests.samples import as_samples


def transcripts(vocab: int, seed: int = 0) -> list[Transcript]:
    """Three groups with prompts of 5, 9 and 13 tokens (two, three and one rows), answers of 2–11
    tokens; one row has two turns (a tool response, untrained, between them); one trains nothing.
    Random logp_old, so the update's ratios are not all 1."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    out = []
    for prompt_len, answers in ((5, (4, 11)), (9, (2, 7, 6)), (13, (3,))):
        prompt = ids(prompt_len)
        for n in answers:
            t = Transcript.start(prompt)
            t.add(ids(n), (-torch.rand(n, generator=g) * 4).tolist(), generated=True)
            out.append(t)
    out[3].add(ids(4), generated=False)  # a tool response
    out[3].add(ids(5), (-torch.rand(5, generator=g) * 4).tolist(), generated=True)  # the next turn
    untrained = Transcript.start(out[0].token_ids[:5])
    untrained.add(ids(6), generated=False)
    return [*out, untrained]


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_model("tiny", tokenizer, seed=4).train()


def test_prompts_group_rows_up_to_their_first_trained_token(tokenizer):
    trs = transcripts(len(tokenizer))
    b = collate(trs, 0)
    group_of, prompt_len = prefix_groups(b.input_ids, b.attention_mask, b.loss_mask)
    # the untrained row shares the first prompt's 5 tokens but is a prompt of its own: all but its last token
    assert group_of == [0, 0, 1, 1, 1, 2, 3]
    assert prompt_len == [5, 9, 13, len(trs[-1]) - 1]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_and_gradients_equal_whole_rows(model, tokenizer, temperature):
    """Every trained target's log-prob equals the whole-row forward's (within float tolerance), so does
    the gradient of their sum; columns before a row's first trained target are 0."""
    b = collate(transcripts(len(tokenizer)), 0)
    whole = token_logprobs(model, b.input_ids, b.attention_mask, temperature=temperature)
    shared = shared_prefix_logprobs(
        model, b.input_ids, b.attention_mask, b.loss_mask, temperature=temperature
    )
    assert shared.shape == whole.shape
    trained = b.loss_mask.bool()
    torch.testing.assert_close(shared[trained], whole[trained], atol=1e-5, rtol=1e-5)
    first = trained.float().argmax(-1)
    for row, f in enumerate(first.tolist()):
        assert (shared[row, :f] == 0).all()
    grads = []
    for lp in (whole, shared):
        model.zero_grad()
        (lp * b.loss_mask).sum().backward(retain_graph=True)
        grads.append([p.grad.clone() for p in model.parameters()])
    for gw, gs in zip(*grads, strict=True):
        torch.testing.assert_close(gs, gw, atol=1e-5, rtol=1e-4)


def test_distinct_prompts_take_the_whole_rows(model, tokenizer):
    trs = [transcripts(len(tokenizer))[i] for i in (0, 2, 5)]  # one row of each group
    b = collate(trs, 0)
    with torch.no_grad():
        whole = token_logprobs(model, b.input_ids, b.attention_mask)
        shared = shared_prefix_logprobs(model, b.input_ids, b.attention_mask, b.loss_mask)
    assert torch.equal(shared, whole)  # the same call: prompt columns included


def test_an_update_through_shared_prompts_equals_the_whole_row_update(tokenizer):
    """ppo_update with `shared_prefix` on and off: the same loss and metrics, and the same weights after
    two epochs of minibatches (SGD: a gradient difference would show unscaled)."""
    trs = transcripts(len(tokenizer), seed=1)
    samples, _ = as_samples(trs, [1.0, -1.0, 0.5, -0.5, 2.0, -1.0, 0.0])
    base = build_model("tiny", tokenizer, seed=5)
    results = []
    for shared in (False, True):
        m = copy.deepcopy(base)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        metrics = ppo_update(
            m, opt, samples, UpdateSettings(minibatch_size=7, ppo_epochs=2, shared_prefix=shared), pad_id=0
        )
        results.append((metrics, [p.detach().clone() for p in m.parameters()]))
    (m0, w0), (m1, w1) = results
    assert m0.keys() == m1.keys()
    for k in m0:
        assert m1[k] == pytest.approx(m0[k], rel=1e-4, abs=1e-6), k
    moved = max(float((a - b).abs().max()) for a, b in zip(w0, base.parameters(), strict=True))
    assert moved > 1e-3  # the update did move the weights
    for a, b in zip(w0, w1, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_models_that_cannot_share_a_prompt_say_why(tokenizer):
    assert shares_prefixes(build_model("tiny", tokenizer)) is None
    windowed = AutoModelForCausalLM.from_config(
        Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=0,
        )
    )
    assert "sliding" in (shares_prefixes(windowed) or "") or "full context" in (
        shares_prefixes(windowed) or ""
    )
    assert shares_prefixes(torch.nn.Linear(2, 2)) == "not a Hugging Face causal LM"


def test_the_update_runs_each_prompt_once(tokenizer):
    """With `shared_prefix` (the default) the update's forward sees each distinct prompt once, then each
    row's own tokens; off, the whole rows."""
    trs = transcripts(len(tokenizer), seed=2)
    samples, _ = as_samples(trs, [1.0] * len(trs))
    b = collate(trs, 0)
    whole = b.input_ids.numel()
    group_of, prompt_len = prefix_groups(b.input_ids, b.attention_mask, b.loss_mask)
    own = max(len(t) - prompt_len[g] for t, g in zip(trs, group_of, strict=True))
    shared_positions = len(prompt_len) * max(prompt_len) + len(trs) * own  # prompts once, then own tokens
    seen = []
    for shared in (True, False):
        m = build_model("tiny", tokenizer, seed=6)
        counted: list[int] = []
        hook = m.model.embed_tokens.register_forward_hook(
            lambda _m, args, _o, counted=counted: counted.append(args[0].numel())
        )
        ppo_update(
            m,
            torch.optim.SGD(m.parameters(), lr=0.1),
            samples,
            UpdateSettings(minibatch_size=len(trs), shared_prefix=shared),
            pad_id=0,
        )
        hook.remove()
        seen.append(sum(counted))
    assert seen == [shared_positions, whole]
    assert shared_positions < whole
