import torch

from mgrpo.agents.loop import Transcript
from mgrpo.batching import collate
from mgrpo.engines.base import SamplingParams
from mgrpo.engines.hf import HFEngine
from mgrpo.models import build_model, token_logprobs
from mgrpo.training import UpdateSettings, ppo_update


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
        list(zip(trs, adv, strict=True)),
        UpdateSettings(minibatch_size=4),
        pad_id=tokenizer.pad_token_id,
    )
    after = seq_logp(model, tokenizer, trs)
    assert metrics["approx_kl"] < 1e-6  # the first minibatch is exactly on-policy: logp_old matches
    for a, b0, b1 in zip(adv, before, after, strict=True):
        assert (b1 - b0) * a > 0, (adv, before, after)
