"""`POST /v1/generate` for both trainer services: a prompt with the current policy."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from mgrpo.engines.base import SamplingParams
from mgrpo.engines.hf import HFEngine
from services.api import GenerateRequest, GenerateResponse


def generate_with(
    engine: HFEngine, tokenizer: PreTrainedTokenizerBase, body: GenerateRequest, version: int
) -> GenerateResponse:
    ids = list(tokenizer.encode(body.prompt, add_special_tokens=False))
    params = SamplingParams(body.max_new_tokens, body.temperature, body.top_p, seed=body.seed)
    (s,) = engine.generate([ids], params)
    return GenerateResponse(text=s.text, token_ids=s.token_ids, logprobs=s.logprobs, finish_reason=s.finish_reason,
                            policy_version=version)  # fmt: skip
