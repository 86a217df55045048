import pytest
import torch
from transformers import DynamicCache

from mgrpo.models import (
    PRESETS,
    SPECIAL_TOKENS,
    build_model,
    cache_kwargs,
    load,
    n_params,
    save,
    token_logprobs,
    train_tokenizer,
)


def test_tags_are_single_special_tokens(tokenizer):
    for tag in SPECIAL_TOKENS:
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1
    ids = tokenizer.encode("<delegate>birth city of X</delegate>", add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<delegate>")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token == "<pad>"


def test_a_digit_tokenizer_never_merges_digits_and_decodes_back():
    texts = ["Kit has 20 coins. Kit gets 11 more.", "20+11=31 31-3=28 ok", "<think>31-3=28</think>"] * 50
    split, merged = train_tokenizer(texts, 300, digits=True), train_tokenizer(texts, 300)
    text = "<think>20+11=31 ok 31-3=28</think>"
    pieces = [split.decode([i]) for i in split.encode(text, add_special_tokens=False)]
    assert all(len(p.strip()) <= 1 for p in pieces if any(c.isdigit() for c in p)), pieces
    assert any(
        sum(c.isdigit() for c in merged.decode([i])) > 1 for i in merged.encode(text)
    )  # BPE merges them
    assert split.decode(split.encode(text, add_special_tokens=False)) == text


def test_presets_have_distinct_shapes(tokenizer):
    sizes = {name: n_params(build_model(name, tokenizer)) for name in PRESETS}
    assert 300_000 < sizes["tiny"] < 700_000 and sizes["small"] > 2_000_000
    assert len(set(sizes.values())) == len(PRESETS)
    with pytest.raises(ValueError, match="unknown model preset"):
        build_model("huge", tokenizer)


def test_save_and_from_pretrained_round_trip(tmp_path, tiny_model, tokenizer):
    save(tiny_model, tokenizer, tmp_path / "ckpt")
    model2, tok2 = load(tmp_path / "ckpt")
    ids = torch.tensor([tokenizer.encode("Q: Where was X born?")])
    assert tok2.encode("Q: Where was X born?") == ids[0].tolist()
    assert tok2.padding_side == "left"
    a = token_logprobs(tiny_model, ids, torch.ones_like(ids))
    b = token_logprobs(model2, ids, torch.ones_like(ids))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="cannot load"):
        load(tmp_path / "nothing-here")


def test_token_logprobs_ignore_padding_side(tiny_model, tokenizer):
    ids = tokenizer.encode("Kir Naibram was born in Dodus", add_special_tokens=False)
    pad = tokenizer.pad_token_id
    left = torch.tensor([[pad, pad, *ids]])
    right = torch.tensor([[*ids, pad, pad]])
    lp_left = token_logprobs(tiny_model, left, (left != pad).long())[0, 2:]
    lp_right = token_logprobs(tiny_model, right, (right != pad).long())[0, : len(ids) - 1]
    assert torch.allclose(lp_left, lp_right, atol=1e-5)


def test_cache_kwargs_reach_the_forward(tiny_model):
    """The cache goes in under the keyword this transformers version reads (a wrong one lands in
    `**kwargs` unread): the prefill fills it, and a step from it equals the whole sequence's forward."""
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    cache = DynamicCache(config=tiny_model.config)
    with torch.no_grad():
        tiny_model(input_ids=ids[:, :4], use_cache=True, **cache_kwargs(tiny_model, cache))
        assert cache.get_seq_length() == 4
        step = tiny_model(
            input_ids=ids[:, 4:], position_ids=torch.tensor([[4]]), **cache_kwargs(tiny_model, cache)
        )
        whole = tiny_model(input_ids=ids).logits[:, -1]
    torch.testing.assert_close(step.logits[:, -1], whole, atol=1e-5, rtol=1e-5)
