"""The judge reward: a frozen LLM's p(yes) against p(no) as the first token of its reply, batched
with left padding, on chat and plain tiny models saved as HF folders."""

import pytest
import torch

from mgrpo.config import DEFAULT_JUDGE_PROMPT, RewardConfig
from mgrpo.judge import Judge
from mgrpo.models import build_model, save, train_tokenizer
from mgrpo.scoring import Item, Scorer
from tests.mgrpo.chat_models import TEMPLATES, chat_model_folder

ITEMS = [
    Item("Where was Kir Naibram born?", "Lotham", "Lotham"),
    Item("Where was Kir Naibram born?", "in the city of Boustus, I think, in 1973", "Lotham"),
    Item("q", "", "a much longer reference answer than the others so the rows differ in length"),
]


@pytest.fixture(scope="module", params=["chat", "plain"])
def judge_path(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "chat":
        return chat_model_folder(path, TEMPLATES["qwen3"], seed=4)
    tok = train_tokenizer(["yes no " + DEFAULT_JUDGE_PROMPT] * 20)
    return save(build_model("tiny", tok, seed=5), tok, path)


def test_batched_scores_equal_each_prompt_alone(judge_path):
    judge = Judge(str(judge_path), DEFAULT_JUDGE_PROMPT, batch_size=8)
    scores = judge(ITEMS)
    lengths = {len(judge.prompt_ids(i)) for i in ITEMS}
    assert len(lengths) == len(ITEMS)  # the batch is padded
    for item, score in zip(ITEMS, scores, strict=True):
        ids = torch.tensor([judge.prompt_ids(item)])
        with torch.no_grad():
            last = judge.model(input_ids=ids).logits[0, -1]
        p = torch.softmax(last[[judge.yes, judge.no]], -1)[0].item()  # p(yes) / (p(yes) + p(no))
        assert 0.0 <= score <= 1.0 and score == pytest.approx(p, abs=1e-5)
    assert len(set(scores)) == len(scores)  # the answer reaches the judge


def test_the_prompt_carries_the_item_and_the_chat_template(judge_path):
    judge = Judge(str(judge_path), "Is {answer!r} right for {query}? Reference: {reference}.")
    text = judge.tok.decode(judge.prompt_ids(ITEMS[1]))
    assert "in the city of Boustus" in text and "Reference: Lotham." in text
    if judge.chat is not None:
        assert text.rstrip().endswith("<|im_start|>assistant")


def test_a_judge_reward_through_the_scorer(judge_path):
    cfg = RewardConfig(kind="judge", judge_path=str(judge_path))
    scores = Scorer(cfg)(ITEMS)
    assert scores.rejected == scores.errors == 0
    assert scores.values == pytest.approx(Judge(str(judge_path), cfg.judge_prompt)(ITEMS))


def test_a_folder_that_is_no_model_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"reward.judge_path: .*(Unrecognized model|cannot load)"):
        Judge(str(tmp_path), DEFAULT_JUDGE_PROMPT)
