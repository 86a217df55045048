"""The deep-research demo's held-out evaluation and its shipped baseline (`mgrpo.workflows.shipped`):
a saved planner and sub-agent on the demo's seeded stage-2 questions at T = 1 (`evaluate_heldout`),
and the key that names one such evaluation (`baseline_key`), under which the shipped warm start's
outcomes are stored so that the demo evaluates only what it trained.

The key covers this processor's numerics (`numerics_fingerprint`): the seeded draws give the same
outcomes only where the models and the engine's sampler compute the same floats bit for bit, and
MKL picks its code path by processor (`mgrpo.reproducibility`). Measured: an AMD EPYC family 25
model 1 (AVX2 only) agreed with a family 25 model 17 (AVX-512) on 1,531 of 1,600 questions, 0.147
against 0.164, while their logits on the fingerprint's shapes were the same; hence the fingerprint
also hashes what the engine samples. That was not enough either (the two still shared a fingerprint,
2026-12-07), so a shipped baseline also serves only the processor model that evaluated it
(`shipped.baseline`). A machine with no baseline for its fingerprint and processor model evaluates
the warm start itself; `mgrpo warmstart --ship-baseline` adds its own."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mgrpo.engines.base import Sample, SamplingParams
from mgrpo.engines.hf import HFEngine
from mgrpo.models import load
from mgrpo.reproducibility import RECIPE_VERSIONS
from mgrpo.tasks.deep_research import DeepResearchTask
from mgrpo.workflows.deep_research_eval import EVAL_SEED, evaluate_paired, heldout_questions
from mgrpo.workflows.deep_research_warmstart import WarmstartConfig

DEMO_EVAL_QUESTIONS = 1600  # the deep-research demo's held-out questions (`services/demo.py`)


def baseline_key(
    task: DeepResearchTask,
    cfg: WarmstartConfig,
    n: int,
    numerics: str,
    stage: int = 2,
    temperature: float = 1.0,
) -> str:
    """The evaluation a shipped baseline answers (`shipped.baseline`): its questions, seed, temperature,
    the recipe versions of the agents' formats and the `numerics_fingerprint` of the models on the
    processor that evaluates them, as `stage2-T1-n1600-<12 hex digits>`."""
    qs = heldout_questions(task, cfg, stage, n)
    blob = json.dumps(
        {
            "questions": [(q.text, q.answer) for q in qs],
            "seed": EVAL_SEED,
            "temperature": temperature,
            "recipe": RECIPE_VERSIONS,
            "numerics": numerics,
        },
        sort_keys=True,
    )
    return f"stage{stage}-T{temperature:g}-n{n}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def evaluate_heldout(
    task: DeepResearchTask,
    cfg: WarmstartConfig,
    system: tuple[Path, Path],
    n: int,
    *,
    on_done: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """A saved (planner, sub-agent) pair on the demo's held-out evaluation (stage 2, T = 1, seeded):
    `{"metrics", "outcomes"}` (its success per question, in order, for `evaluation.paired_gain`)."""
    models = {"it": (load(system[0]), load(system[1]))}
    metrics, outcomes = evaluate_paired(task, cfg, models, n_questions=n, on_done=on_done)
    return {"metrics": metrics["it"], "outcomes": outcomes["it"]}


@torch.no_grad()
def numerics_fingerprint(system: tuple[Path, Path]) -> str:
    """12 hex digits over what a saved (planner, sub-agent) pair computes, bit for bit, on fixed token
    ids: its logits in the shapes an evaluation runs (one row, a batch, long and one-token rows), and
    the token ids and log-probs the evaluation's own engine samples from it with fixed seeds (its
    one-thread prefill, its static-cache decoding, its sampler), one row at a time and batched.
    Equal on two processors only where their numerics give these models the same floats. The logits
    alone were not enough: an AMD EPYC family 25 model 17 gave the same logits as a family 25 model 1
    and yet sampled other tokens on 69 of the demo's 1,600 questions (measured 2026-12-07)."""
    digest = hashlib.sha256()
    for path in system:
        model, tok = load(path)
        gen = torch.Generator().manual_seed(0)
        for rows, length in ((1, 48), (8, 48), (32, 1), (64, 12)):
            ids = torch.randint(0, len(tok), (rows, length), generator=gen)
            digest.update(model(input_ids=ids).logits.float().numpy().tobytes())
        prompts = [
            torch.randint(0, len(tok), (n,), generator=gen).tolist() for n in (2, 5, 9, 17, 33, 48, 64)
        ]
        for sample in _engine_samples(model, tok, prompts):
            digest.update(struct.pack(f"{len(sample.token_ids)}q", *sample.token_ids))
            digest.update(struct.pack(f"{len(sample.logprobs)}d", *sample.logprobs))
    return digest.hexdigest()[:12]


def _engine_samples(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, prompts: list[list[int]]
) -> list[Sample]:
    """What the evaluation's engine samples from `model` at T = 1 with fixed seeds: each prompt alone,
    then all of them in one batch."""
    engine = HFEngine(model, tok)
    try:
        alone = [
            engine.generate([p], SamplingParams(max_new_tokens=32, seed=i))[0] for i, p in enumerate(prompts)
        ]
        return alone + engine.generate(prompts, SamplingParams(max_new_tokens=32, seed=len(prompts)))
    finally:
        engine.close()
