"""Padded training batches and the supervised step (`mgrpo.batching`)."""

import copy

import pytest
import torch

from mgrpo.batching import collate, length_sorted_chunks, sft_step, sft_step_chunked
from mgrpo.tasks.deep_research import make_questions
from mgrpo.tasks.demos import planner_demo


@pytest.fixture(scope="module")
def demos(small_task, tokenizer):
    qs = make_questions(small_task.world, "train", 1, 6, seed=1) + make_questions(
        small_task.world, "train", 2, 6, seed=1
    )
    return [planner_demo(small_task, tokenizer, q) for q in qs]


def test_length_sorted_chunks_keep_every_row_once_and_pad_less(demos, tokenizer):
    pad = tokenizer.pad_token_id
    chunks = length_sorted_chunks(demos, pad, 4)
    assert [c.input_ids.shape[0] for c in chunks] == [3, 3, 3, 3]
    widths = [c.input_ids.shape[1] for c in chunks]
    assert widths == sorted(widths) and widths[-1] == max(len(t) for t in demos) and widths[0] < widths[-1]
    rows = sorted(
        tuple(r[m.bool()].tolist())
        for c in chunks
        for r, m in zip(c.input_ids, c.attention_mask, strict=True)
    )
    assert rows == sorted(tuple(t.token_ids) for t in demos)
    assert sum(c.input_ids.numel() for c in chunks) < collate(demos, pad).input_ids.numel()
    with pytest.raises(ValueError, match="n_chunks"):
        length_sorted_chunks(demos, pad, 13)


def test_a_chunked_step_is_the_one_batch_step(demos, tokenizer, tiny_model):
    """The token-mean over the whole batch, whatever the chunking: the same loss and the same update
    (SGD, so the update is the gradient itself), up to float rounding."""
    one, four = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    loss_one = sft_step(
        one, torch.optim.SGD(one.parameters(), lr=0.5), collate(demos, tokenizer.pad_token_id)
    )
    chunks = length_sorted_chunks(demos, tokenizer.pad_token_id, 4)
    loss_four = sft_step_chunked(four, torch.optim.SGD(four.parameters(), lr=0.5), chunks)
    assert loss_four == pytest.approx(loss_one, abs=1e-5)
    moved = max((a - tiny_model.state_dict()[k]).abs().max().item() for k, a in one.state_dict().items())
    diff = max((a - four.state_dict()[k]).abs().max().item() for k, a in one.state_dict().items())
    assert moved > 1e-3 and diff < 1e-6
