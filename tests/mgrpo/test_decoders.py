"""The `hf` engine's decoders (`mgrpo.engines.decoders`): the static KV cache against a teacher-forced
forward pass, forked prefixes, cache growth and compaction, and the fallback to the dynamic path."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from mgrpo.engines.decoders import DynamicDecoder, StaticDecoder, make_decoder, static_unsupported


def _teacher_forced_logits(model, tokens):
    """Next-token logits after every prefix of `tokens`: (len, V)."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def _run(decoder, script, steps, seed=0):
    """Drive a decoder: `script[k]` lists the prompts admitted before step k; rows retire at random,
    except the first, which runs to the end.
    Returns every row's tokens and the logits it saw (row id -> (tokens, [logits]))."""
    g = torch.Generator().manual_seed(seed)
    vocab = decoder.model.config.vocab_size
    live, seen, next_id = [], {}, 0
    for k in range(steps):
        logits = []
        if live:
            logits.append(decoder.step(torch.tensor([seen[r][0][-1] for r in live])))
        new = script.get(k, [])
        if new:
            logits.append(decoder.admit(new))
            for p in new:
                seen[next_id] = (list(p), [])
                live.append(next_id)
                next_id += 1
        if not live:
            continue
        out = torch.cat(logits)
        assert out.shape == (len(live), vocab)
        for r, row in zip(live, out, strict=True):
            seen[r][1].append(row)
            seen[r][0].append(int(torch.randint(1, vocab, (), generator=g)))
        keep = [i for i in range(len(live)) if torch.rand((), generator=g) > 0.15 or live[i] == 0]
        decoder.keep(keep)
        live = [live[i] for i in keep]
    return seen


def _check_against_teacher_forcing(model, seen):
    for tokens, logits in seen.values():
        n_prompt = len(tokens) - len(logits)
        ref = _teacher_forced_logits(model, tokens[:-1])[n_prompt - 1 :]
        got = torch.stack(logits)
        assert torch.allclose(torch.log_softmax(got, -1), torch.log_softmax(ref, -1), atol=1e-4), tokens


def _script(vocab, waves, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {
        k: [
            torch.randint(1, vocab, (int(torch.randint(2, 30, (), generator=g)),), generator=g).tolist()
            for _ in range(n)
        ]
        for k, n in waves.items()
    }


@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
def test_rows_that_join_and_retire_match_a_teacher_forced_pass(tiny_model, static):
    """Waves of rows join a running batch and retire at random; the cache outgrows its first 8 slots
    and 128 positions, and compacts when rows retire; every logit row equals a full forward pass."""
    decoder = make_decoder(tiny_model, 0, static=static)
    assert isinstance(decoder, StaticDecoder if static else DynamicDecoder)
    vocab = tiny_model.config.vocab_size
    seen = _run(decoder, _script(vocab, {0: 5, 3: 12, 40: 3, 120: 2}), steps=170)
    _check_against_teacher_forcing(tiny_model, seen)
    if static:
        assert decoder.k.shape[1] >= 16 and decoder.k.shape[3] >= 256  # it grew in both dimensions


def test_forked_prefixes_equal_independent_prefills(tiny_model):
    """K equal prompts in one admission are prefilled once and forked; each row then decodes exactly as
    K independent prefills would (same logits at every step, for different continuations)."""
    vocab = tiny_model.config.vocab_size
    prompt = torch.randint(1, vocab, (17,), generator=torch.Generator().manual_seed(5)).tolist()
    other = prompt[:9]
    forked = StaticDecoder(tiny_model)
    first = forked.admit([prompt, other, prompt, prompt, other])
    assert forked.forks == 3
    alone = [StaticDecoder(tiny_model) for _ in range(5)]
    alone_first = torch.cat(
        [d.admit([p]) for d, p in zip(alone, [prompt, other, prompt, prompt, other], strict=True)]
    )
    assert torch.allclose(first, alone_first, atol=1e-5)
    g = torch.Generator().manual_seed(6)
    for _ in range(6):
        tokens = torch.randint(1, vocab, (5,), generator=g)
        got = forked.step(tokens)
        want = torch.cat([d.step(tokens[i : i + 1]) for i, d in enumerate(alone)])
        assert torch.allclose(got, want, atol=1e-5)


def test_static_and_dynamic_decoders_agree(tiny_model):
    vocab = tiny_model.config.vocab_size
    script = _script(vocab, {0: 6, 2: 4}, seed=3)
    a = _run(StaticDecoder(tiny_model), script, steps=30, seed=4)
    b = _run(DynamicDecoder(tiny_model, 0), script, steps=30, seed=4)
    for (ta, la), (tb, lb) in zip(a.values(), b.values(), strict=True):
        assert ta == tb
        assert torch.allclose(torch.stack(la), torch.stack(lb), atol=1e-4)


def test_an_in_place_update_is_seen_by_the_next_step(tiny_model):
    """Weights changed in place (an optimizer step, a checkpoint load) reach the next prefill and step,
    and a parked cache computed with the old weights is not reused."""
    import copy

    model = copy.deepcopy(tiny_model)
    decoder = StaticDecoder(model)
    prompt = list(range(5, 25))
    decoder.admit([prompt])
    before = decoder.step(torch.tensor([8]))
    decoder.keep([])  # parked with the old weights' K/V
    with torch.no_grad():
        for w in model.parameters():
            w.mul_(1.1)
    decoder.admit([prompt])
    after = decoder.step(torch.tensor([8]))
    assert decoder.reused_tokens == 0
    assert not torch.allclose(before, after, atol=1e-3)
    assert torch.allclose(after, _teacher_forced_logits(model, [*prompt, 8])[-1:], atol=1e-4)


def test_an_update_between_two_steps_of_a_running_row_reaches_the_second(tiny_model):
    """A row still decoding when the weights change: its next step computes the new token with the new
    weights over the prefix's cached K/V, exactly as the HF-forward decoder does."""
    import copy

    model = copy.deepcopy(tiny_model)
    static, dynamic = StaticDecoder(model), DynamicDecoder(model, 0)
    prompts = [list(range(5, 25)), list(range(7, 19))]
    for decoder in (static, dynamic):
        decoder.admit(prompts)
        decoder.step(torch.tensor([8, 9]))
    with torch.no_grad():
        for w in model.parameters():
            w.mul_(1.1)
    got, want = static.step(torch.tensor([10, 11])), dynamic.step(torch.tensor([10, 11]))
    assert torch.allclose(got, want, atol=1e-4)


def test_llama_runs_static_and_other_models_fall_back():
    """A Llama model (no q/k norms, untied head, no GQA) runs on the static path; GPT-2 falls back."""
    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            tie_word_embeddings=False,
        )
    ).eval()
    assert static_unsupported(llama) is None
    seen = _run(StaticDecoder(llama), _script(64, {0: 3, 2: 2}), steps=12)
    _check_against_teacher_forcing(llama, seen)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2)).eval()
    assert "gpt2" in str(static_unsupported(gpt2))
    assert isinstance(make_decoder(gpt2, 0), DynamicDecoder)
    with pytest.raises(ValueError, match="DynamicDecoder"):
        StaticDecoder(gpt2)


def test_a_next_turn_reuses_the_cache_of_the_row_it_extends(tiny_model):
    """A retired row's slot is parked with its cache: a later prompt that extends it (the episode's
    next turn) prefills only its new tokens, one that shares part of it reuses that part, and parked
    slots are taken over when room runs out; every logit still equals a teacher-forced pass."""
    vocab = tiny_model.config.vocab_size
    g = torch.Generator().manual_seed(7)

    def rand(n):
        return torch.randint(1, vocab, (n,), generator=g).tolist()

    def decode(decoder, rows, steps):  # rows: token lists (prompts already admitted), extended in place
        for _ in range(steps):
            logits = decoder.step(torch.tensor([r[-1] for r in rows]))
            for r, row_logits in zip(rows, logits, strict=True):
                ref = _teacher_forced_logits(tiny_model, r)[-1]
                assert torch.allclose(
                    torch.log_softmax(row_logits, -1), torch.log_softmax(ref, -1), atol=1e-4
                )
                r.append(int(row_logits.argmax()))

    d = StaticDecoder(tiny_model, slots=2)
    first = rand(20)
    d.admit([first])
    turn1 = [*first, 9]
    decode(d, [turn1], 5)
    d.keep([])
    cached = len(turn1) - 1  # the last sampled token was never fed
    turn2 = [*turn1, *rand(6)]
    d.admit([turn2])
    assert d.reused_tokens == cached and d.prefilled_tokens == len(first) + len(turn2) - cached
    turn2.append(3)
    decode(d, [turn2], 4)
    d.keep([])
    branch = [*turn2[:12], *rand(5)]  # shares 12 tokens, then differs
    d.admit([branch])
    assert d.reused_tokens == cached + 12
    branch.append(4)
    decode(d, [branch], 2)
    d.keep([])
    others = [[*rand(10), 1] for _ in range(3)]  # 3 rows, 2 slots: the parked one is taken, then it grows
    d.admit([r[:-1] for r in others])
    decode(d, others, 3)
    assert d.reused_tokens == cached + 12 and d.k.shape[1] == 4


def test_a_prompt_sharing_a_running_rows_prefix_copies_it(tiny_model):
    """A new prompt that starts like a running row (a question template) copies that row's cached
    prefix into its own slot and prefills the rest; both rows then decode exactly."""
    g = torch.Generator().manual_seed(8)
    vocab = tiny_model.config.vocab_size
    head = torch.randint(1, vocab, (14,), generator=g).tolist()
    a, b = [*head, *torch.randint(1, vocab, (5,), generator=g).tolist()], [*head, 7, 8, 9]
    d = StaticDecoder(tiny_model)
    d.admit([a])
    a.append(5)
    d.step(torch.tensor([5]))
    got_b = d.admit([b])
    assert d.reused_tokens == len(head) and d.prefilled_tokens == len(a) - 1 + 3
    assert torch.allclose(got_b[0], _teacher_forced_logits(tiny_model, b)[-1], atol=1e-4)
    a.append(11)
    b.append(6)
    logits = d.step(torch.tensor([a[-1], b[-1]]))
    for row, tokens in zip(logits, (a, b), strict=True):
        assert torch.allclose(row, _teacher_forced_logits(tiny_model, tokens)[-1], atol=1e-4)


def test_a_prompt_cached_whole_still_computes_its_last_token(tiny_model):
    """The same prompt again after its row retired (the next rollouts of a group arriving later): all
    but its last token come from the cache, and its logits are still computed."""
    prompt = list(range(3, 23))
    d = StaticDecoder(tiny_model)
    first = d.admit([prompt])
    d.step(torch.tensor([9]))
    d.keep([])
    again = d.admit([prompt])
    assert d.reused_tokens == len(prompt) - 1
    assert torch.allclose(again, first, atol=1e-5)
