"""Held-out evaluation of the deep-research warm starts and of the checkpoints trained from them:
every system of a comparison on the same seeded held-out questions with the same seeded draws
(`EVAL_SEED`), so differences are paired per question (`mgrpo.evaluation.paired_gain`).

Below the warm-start training (`deep_research_warmstart`), which evaluates what it saves with it;
a config is anything with the held-out question count and the world seed (`HeldoutConfig`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from transformers import PreTrainedModel, PreTrainedTokenizerFast

from mgrpo.engines.hf import HFEngine
from mgrpo.evaluation import System, evaluate, evaluate_single
from mgrpo.tasks.deep_research import DeepResearchTask, Question, majority_answers, make_questions

ModelAndTokenizer = tuple[PreTrainedModel, PreTrainedTokenizerFast]
EVAL_SEED = 1000  # held-out sampling is seeded: two systems see the same random draws (a paired comparison)


class HeldoutConfig(Protocol):
    """What an evaluation reads of a warm start's config (`WarmstartConfig` is one)."""

    @property
    def seed(self) -> int: ...

    @property
    def eval_questions(self) -> int: ...


def evaluate_system(
    task: DeepResearchTask,
    planner: tuple[PreTrainedModel, PreTrainedTokenizerFast],
    subagent: tuple[PreTrainedModel, PreTrainedTokenizerFast],
    cfg: HeldoutConfig,
    on_done: Callable[[], None] | None = None,
    **grid: Any,
) -> dict[str, dict[str, float]]:
    """Held-out success of planner + sub-agent (stages 1 and 2, temperature 1 and greedy by default;
    `grid` narrows it: see `heldout_grid`), with baselines and process metrics; `on_done` after
    each rollout."""

    def run(qs: list[Question], majority: dict[str, str], temperature: float) -> dict[str, float]:
        return _evaluate_seeded(task, planner, subagent, qs, majority, temperature, on_done)[0]

    return heldout_grid(task, cfg, run, **grid)


def _evaluate_seeded(
    task: DeepResearchTask,
    planner: ModelAndTokenizer,
    subagent: ModelAndTokenizer,
    qs: list[Question],
    majority: dict[str, str],
    temperature: float,
    on_done: Callable[[], None] | None,
) -> tuple[dict[str, float], list[float]]:
    """One system on `qs` with the evaluation seed: its metrics and its success per question."""
    system = System.build(task, planner, subagent, temperature=temperature, seed=EVAL_SEED)
    try:
        return evaluate(system, qs, majority, on_done=on_done), system.outcomes
    finally:
        system.close()


def evaluate_single_model(
    task: DeepResearchTask,
    single: tuple[PreTrainedModel, PreTrainedTokenizerFast],
    cfg: HeldoutConfig,
    **grid: Any,
) -> dict[str, dict[str, float]]:
    """The single-agent baseline on the same held-out grid as `evaluate_system`."""

    def run(qs: list[Question], majority: dict[str, str], temperature: float) -> dict[str, float]:
        engine = HFEngine(*single)
        try:
            return evaluate_single(engine, task, qs, majority, temperature=temperature, seed=EVAL_SEED)
        finally:
            engine.close()

    return heldout_grid(task, cfg, run, **grid)


def heldout_grid(
    task: DeepResearchTask,
    cfg: HeldoutConfig,
    run: Callable[[list[Question], dict[str, str], float], dict[str, float]],
    *,
    stages: tuple[int, ...] = (1, 2),
    temperatures: tuple[float, ...] = (1.0, 0.0),
    n_questions: int | None = None,
) -> dict[str, dict[str, float]]:
    """`run` on the same held-out questions for every system (`cfg.eval_questions` per stage unless
    `n_questions`); cells are named `heldout_stage<stage>_T<temperature>`."""
    majority = majority_baseline(task)
    out: dict[str, dict[str, float]] = {}
    for stage in stages:
        qs = heldout_questions(task, cfg, stage, n_questions or cfg.eval_questions)
        for temperature in temperatures:
            out[f"heldout_stage{stage}_T{temperature:g}"] = run(qs, majority, temperature)
    return out


def heldout_questions(task: DeepResearchTask, cfg: HeldoutConfig, stage: int, n: int) -> list[Question]:
    """The seeded held-out questions every evaluation of a stage draws from (people never trained on)."""
    return make_questions(task.world, "heldout", stage, n, seed=1000 + cfg.seed)


def evaluate_paired(
    task: DeepResearchTask,
    cfg: HeldoutConfig,
    systems: Mapping[str, tuple[ModelAndTokenizer, ModelAndTokenizer]],
    *,
    n_questions: int,
    stage: int = 2,
    temperature: float = 1.0,
    on_done: Callable[[], None] | None = None,
) -> tuple[dict[str, dict[str, float]], dict[str, list[float]]]:
    """Each named (planner, sub-agent) system on the same held-out questions with the same seeded
    draws: its metrics, and its success per question in one order (for `evaluation.paired_gain`)."""
    qs, majority = heldout_questions(task, cfg, stage, n_questions), majority_baseline(task)
    metrics, outcomes = {}, {}
    for name, (planner, subagent) in systems.items():
        metrics[name], outcomes[name] = _evaluate_seeded(
            task, planner, subagent, qs, majority, temperature, on_done
        )
    return metrics, outcomes


def majority_baseline(task: DeepResearchTask) -> dict[str, str]:
    """The majority answer of each question kind over training questions (the baseline every evaluation reports)."""
    return majority_answers(
        make_questions(task.world, "train", 1, 600) + make_questions(task.world, "train", 2, 1000)
    )
