"""Run the planner + sub-agent system on questions and score it, next to honest baselines.

Every evaluation reports, beside success: the majority-answer baseline on the same questions, and
two process metrics — the share of planner rollouts whose first delegation is the gold first
subtask, and the share of sub-agent episodes whose first tool call searches the entity its subtask
names. A gain that only raw success shows is not a gain.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mgrpo.agents.agents import Delegation, PlannerAgent, PlannerRollout, SingleAgent, SubAgent
from mgrpo.algo.rewards import normalize_answer
from mgrpo.engines.hf import HFEngine
from mgrpo.records import Transcript
from mgrpo.tasks.deep_research import _SUBTASK, DeepResearchTask, Question, gold_plan


def question_seeds(seed: int | None, n: int) -> list[int | None]:
    """One sampling seed per question of an evaluation (all None when unseeded)."""
    return [None if seed is None else seed + 7919 * i for i in range(n)]


@dataclass
class System:
    """A planner and a sub-agent, each with its own model and engine, delegating in-process."""

    task: DeepResearchTask
    planner_engine: HFEngine
    subagent_engine: HFEngine
    temperature: float = 1.0
    seed: int | None = None  # seeded sampling: the same models give the same episodes (paired comparisons)
    episodes: list[tuple[str, Transcript]] = field(default_factory=list)
    outcomes: list[float] = field(default_factory=list)  # the last `evaluate`'s success per question

    @classmethod
    def build(
        cls,
        task: DeepResearchTask,
        planner: tuple[PreTrainedModel, PreTrainedTokenizerBase],
        subagent: tuple[PreTrainedModel, PreTrainedTokenizerBase],
        *,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> System:
        return cls(task, HFEngine(*planner), HFEngine(*subagent), temperature, seed)

    def subagent(self) -> SubAgent:
        return SubAgent(
            self.subagent_engine,
            self.subagent_engine.tokenizer,
            self.task.call_tool,
            temperature=self.temperature,
        )

    def planner(self) -> PlannerAgent:
        sub = self.subagent()

        def delegate(subtask: str) -> Delegation:
            tr = sub.run(
                subtask, seed=None if self.seed is None else self.seed + zlib.crc32(subtask.encode())
            )
            self.episodes.append((subtask, tr))
            return Delegation(subtask, tr.final if tr.format_ok and tr.final else "no result")

        return PlannerAgent(
            self.planner_engine, self.planner_engine.tokenizer, delegate, temperature=self.temperature
        )

    def run(
        self,
        questions: Sequence[Question],
        *,
        concurrency: int = 64,
        on_done: Callable[[], None] | None = None,
    ) -> list[PlannerRollout]:
        """One planner rollout per question (`on_done` is called, from a worker thread, after each)."""
        agent = self.planner()

        def rollout(q: Question, seed: int | None) -> PlannerRollout:
            r = agent.rollout(q.text, seed=seed)
            if on_done is not None:
                on_done()
            return r

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(rollout, questions, question_seeds(self.seed, len(questions))))

    def close(self) -> None:
        self.planner_engine.close()
        self.subagent_engine.close()


def _first_tool_ok(subtask: str, tr: Transcript) -> bool:
    m = _SUBTASK.match(subtask)
    if m is None or not tr.actions or tr.actions[0].kind != "tool_call":
        return False
    name, arg = tr.actions[0].tool()
    return name == "search" and normalize_answer(arg) == normalize_answer(m.group(2))


def evaluate(
    system: System,
    questions: Sequence[Question],
    majority: dict[str, str],
    *,
    on_done: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Success, format rate, baselines and process metrics of the system on `questions` (each
    question's success also in `system.outcomes`, for paired comparisons)."""
    system.episodes.clear()
    rollouts = system.run(questions, on_done=on_done)
    task = system.task
    correct = [
        task.correct(r.transcript.final or "", q.answer) if r.transcript.format_ok else 0.0
        for r, q in zip(rollouts, questions, strict=True)
    ]
    system.outcomes = correct
    first_ok = [
        bool(r.delegations) and r.delegations[0].subtask.strip() == gold_plan(task.world, q)[0][0]
        for r, q in zip(rollouts, questions, strict=True)
    ]
    judged = [task.judge(s, tr.final or "") for s, tr in system.episodes if tr.format_ok]
    judged = [j for j in judged if not math.isnan(j)]
    n_eps = max(1, len(system.episodes))
    return {
        "success": sum(correct) / len(questions),
        "majority_baseline": sum(majority.get(q.kind) == normalize_answer(q.answer) for q in questions)
        / len(questions),
        "planner_format_ok": sum(r.transcript.format_ok for r in rollouts) / len(questions),
        "planner_first_delegation_gold": sum(first_ok) / len(questions),
        "delegations_per_rollout": sum(r.n_delegations for r in rollouts) / len(questions),
        "subagent_format_ok": sum(tr.format_ok for _, tr in system.episodes) / n_eps,
        "subagent_first_search_right_entity": sum(_first_tool_ok(s, tr) for s, tr in system.episodes) / n_eps,
        "subagent_fact_found": sum(judged) / n_eps,
    }


def evaluate_single(
    engine: HFEngine,
    task: DeepResearchTask,
    questions: Sequence[Question],
    majority: dict[str, str],
    *,
    temperature: float = 1.0,
    concurrency: int = 64,
    seed: int | None = None,
    outcomes: list[float] | None = None,
) -> dict[str, float]:
    """The single-agent baseline on `questions`: success, format rate, majority baseline, and the
    process metric 'first tool call searches the question's first entity'; each question's success
    appended to `outcomes` when given (for paired comparisons)."""
    agent = SingleAgent(engine, engine.tokenizer, task.call_tool, temperature=temperature)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        transcripts = list(
            pool.map(
                lambda q, s: agent.rollout(q.text, seed=s), questions, question_seeds(seed, len(questions))
            )
        )
    correct = [
        task.correct(t.final or "", q.answer) if t.format_ok else 0.0
        for t, q in zip(transcripts, questions, strict=True)
    ]
    if outcomes is not None:
        outcomes.extend(correct)
    first_ok = [
        bool(t.actions)
        and t.actions[0].kind == "tool_call"
        and t.actions[0].tool() == ("search", q.entities[0])
        for t, q in zip(transcripts, questions, strict=True)
    ]
    return {
        "success": sum(correct) / len(questions),
        "majority_baseline": sum(majority.get(q.kind) == normalize_answer(q.answer) for q in questions)
        / len(questions),
        "format_ok": sum(t.format_ok for t in transcripts) / len(questions),
        "first_search_right_entity": sum(first_ok) / len(questions),
        "tool_calls_per_rollout": sum(len(t.actions) - 1 for t in transcripts) / len(questions),
    }


@dataclass(frozen=True)
class PairedGain:
    """after − before on the same questions with the same seeded draws (`paired_gain`)."""

    n: int
    before: float
    after: float
    gain: float
    se: float  # the paired standard error: sd of the per-question differences / sqrt(n)
    se_unpaired: float  # as if the two evaluations were independent samples (larger when they correlate)

    @property
    def z(self) -> float:
        return self.gain / self.se if self.se > 0 else 0.0


def paired_gain(before: Sequence[float], after: Sequence[float]) -> PairedGain:
    """The gain of `after` over `before`, both scored on the same n questions in one order.

    The demo's two evaluations share their questions and each question's sampling seed, so the
    per-question outcomes are correlated and the right standard error of the gain is the paired one:
    d_i = after_i − before_i, se = sd(d) / sqrt(n) with sd's n − 1 denominator. The unpaired
    sqrt(se_b² + se_a²) (binomial, se_x = sqrt(x(1 − x) / n)) is reported beside it.
    """
    if len(before) != len(after) or not before:
        raise ValueError(
            f"paired_gain needs two equally long non-empty lists, got {len(before)} and {len(after)}"
        )
    n = len(before)
    d = [a - b for a, b in zip(after, before, strict=True)]
    mean_b, mean_a, mean_d = sum(before) / n, sum(after) / n, sum(d) / n
    var_d = sum((x - mean_d) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    unpaired = math.sqrt((mean_b * (1 - mean_b) + mean_a * (1 - mean_a)) / n)
    return PairedGain(n, mean_b, mean_a, mean_d, math.sqrt(var_d / n), unpaired)


def paired_by_question(before: Mapping[str, float], after: Mapping[str, float]) -> PairedGain:
    """`paired_gain` of two evaluations given as success per question id: each difference is taken
    between the two scores of one question, whatever order the evaluations listed them in. Both must
    have scored the same questions (a comparison across different questions is not paired)."""
    if before.keys() != after.keys():
        only_b, only_a = sorted(before.keys() - after.keys()), sorted(after.keys() - before.keys())
        raise ValueError(
            f"paired_by_question needs both evaluations on the same questions; only before: "
            f"{only_b[:3]}{'…' if len(only_b) > 3 else ''} ({len(only_b)}), only after: "
            f"{only_a[:3]}{'…' if len(only_a) > 3 else ''} ({len(only_a)})"
        )
    qids = sorted(before)
    return paired_gain([before[q] for q in qids], [after[q] for q in qids])


def mean_over_runs(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per question id, the mean success over runs that were all scored on the same questions (the
    run seeds of one arm on one world), ready for `paired_by_question`."""
    if not runs:
        raise ValueError("mean_over_runs needs at least one run")
    for r in runs[1:]:
        if r.keys() != runs[0].keys():
            raise ValueError("mean_over_runs: the runs were scored on different questions")
    return {q: sum(r[q] for r in runs) / len(runs) for q in runs[0]}


def pooled(per_world: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Success per question of several worlds in one mapping, each question id prefixed with its
    world (`<world>/<qid>`), so a pooled `paired_by_question` pairs only within a world."""
    return {f"{w}/{q}": v for w, scores in per_world.items() for q, v in scores.items()}
