"""The MarsRL workflow (arXiv 2511.11373; algorithm.md §9): solver → verifier → corrector (→ verifier →
corrector), grouped agentic rollouts, agent-specific rewards, and the inference-time V–C loop.

One problem's training rollout (at most `max_agent_steps` = 5 agent steps: S → V1 → C1 → V2 → C2):

1. S: G solutions of the problem (one group). Reward `answer_reward` (1 iff the answer is right).
2. V: the verifier takes `k` (= 2) solutions chosen by `select_inputs` (adaptive: wrong ones first)
   and writes G reports on each (one group per chosen solution), reading each step with its
   calculator value when `calculator` is on. Reward `verifier_reward`: 1 iff its verdict agrees with
   the reviewed solution's own reward.
3. C: among the reports with verdict Wrong, `k` are chosen (adaptive: reports with reward 1 first)
   and the corrector writes G revisions of each (one group per chosen report); reward as the solver.
   No report says Wrong → the chain stops there (a verifier found no error).
4. V2, C2: the same on the revisions.

Every group shares one input, and groups never mix roles. `reward: outcome` (MarsRL's baseline)
replaces every reward by the final outcome of the trajectories through the output instead
[decision]: a solution or revision nobody continued scores its own correctness, a report nobody
continued scores the correctness of the solution it reviewed (that solution stands), and an output
that was continued scores the mean outcome of its continuations.

The program is pure except for `run(role, prompt, n, group)`, which samples n outputs of a role (an
in-process engine, or the role's service over HTTP) and returns their text and a reference to the
recorded episode.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

from mgrpo.agents.agents import TurnAgent
from mgrpo.algo import alignment_seed, answer_reward, select_inputs, verifier_reward
from mgrpo.algo.selection import Strategy
from mgrpo.records import Transcript
from mgrpo.tasks.arithmetic import (
    Problem,
    Turn,
    answer_value,
    corrector_prompt,
    parse_turn,
    parse_verdict,
    solver_prompt,
    verifier_prompt,
)

RewardMode = Literal["agent", "outcome"]


@dataclass(frozen=True)
class Output:
    """What a role sampled for one input: its turn's text and where its episode is (its Transcript
    for an in-process role, its episode id for a role served elsewhere)."""

    text: str
    ref: Transcript | str


Run = Callable[[str, str, int, str], list[Output]]  # (role, prompt, n, group id) → n outputs


@dataclass
class Attempt:
    role: str
    group: str
    prompt: str
    turn: Turn
    ref: Transcript | str  # the episode: its transcript (sampled in process) or its id (recorded elsewhere)
    judges: bool = False  # a verdict on another output (the verifier), not an answer
    correct: bool = False  # solver / corrector: the answer is right
    verdict: bool | None = None  # verifier: True 'Correct', False 'Wrong', None malformed
    reward: float = 0.0
    parent: Attempt | None = None
    children: list[Attempt] = field(default_factory=list)


@dataclass(frozen=True)
class MarsSettings:
    group_size: int = 4  # G
    select_k: int = 2  # outputs of the previous agent each later agent takes
    selection: Strategy = "adaptive"
    reward: RewardMode = "agent"
    max_agent_steps: int = 5
    calculator: bool = False  # the verifier reads each step with its calculator value (`calculated`)
    seed: int = 0


def _attempts(run: Run, role: str, group: str, prompt: str, n: int, parent: Attempt | None) -> list[Attempt]:
    out = [
        Attempt(role, group, prompt, parse_turn(o.text), o.ref, parent=parent)
        for o in run(role, prompt, n, group)
    ]
    if parent is not None:
        parent.children.extend(out)
    return out


def _score_answers(problem: Problem, attempts: list[Attempt]) -> None:
    for a in attempts:
        a.correct = a.turn.format_ok and answer_value(a.turn.answer) == problem.answer
        a.reward = answer_reward(a.turn.format_ok, a.correct)


def _verify(
    problem: Problem, run: Run, solutions: list[Attempt], s: MarsSettings, tag: str, step: int
) -> list[Attempt]:
    seed = alignment_seed(s.seed, step, f"{problem.pid}:{tag}")
    chosen = select_inputs([a.reward for a in solutions], s.select_k, s.selection, prefer=0.0, seed=seed)
    reports: list[Attempt] = []
    for j in chosen:
        sol = solutions[j]
        prompt = verifier_prompt(problem.text, sol.turn.shown(), s.calculator)
        for v in _attempts(run, "verifier", f"{problem.pid}.{tag}.{j}", prompt, s.group_size, sol):
            v.judges = True
            v.verdict = parse_verdict(v.turn.answer) if v.turn.format_ok else None
            v.reward = verifier_reward(v.verdict, sol.correct)
            reports.append(v)
    return reports


def _correct(
    problem: Problem, run: Run, reports: list[Attempt], s: MarsSettings, tag: str, step: int
) -> list[Attempt]:
    flagged = [v for v in reports if v.verdict is False]
    seed = alignment_seed(s.seed, step, f"{problem.pid}:{tag}")
    chosen = select_inputs([v.reward for v in flagged], s.select_k, s.selection, prefer=1.0, seed=seed)
    revisions: list[Attempt] = []
    for j in chosen:
        v = flagged[j]
        sol = v.parent
        assert sol is not None  # a report always reviews a solution
        prompt = corrector_prompt(problem.text, sol.turn.shown(), v.turn.think)
        revisions += _attempts(run, "corrector", f"{problem.pid}.{tag}.{j}", prompt, s.group_size, v)
    _score_answers(problem, revisions)
    return revisions


def rollout_problem(problem: Problem, run: Run, s: MarsSettings, step: int = 0) -> list[Attempt]:
    """Every attempt of one problem's grouped rollout (S → V1 → C1 → V2 → C2), rewards filled."""
    solutions = _attempts(run, "solver", f"{problem.pid}.S", solver_prompt(problem.text), s.group_size, None)
    _score_answers(problem, solutions)
    every, current, agent_steps = list(solutions), solutions, 1
    for round_ in (1, 2):
        if agent_steps >= s.max_agent_steps:
            break
        reports = _verify(problem, run, current, s, f"V{round_}", step)
        every += reports
        agent_steps += 1
        if agent_steps >= s.max_agent_steps or not any(v.verdict is False for v in reports):
            break
        current = _correct(problem, run, reports, s, f"C{round_}", step)
        every += current
        agent_steps += 1
    if s.reward == "outcome":
        for a in every:
            a.reward = outcome(a)
    return every


def outcome(a: Attempt) -> float:
    """The final outcome of the trajectories through `a` (see the module docstring)."""
    if a.children:
        return sum(outcome(c) for c in a.children) / len(a.children)
    if a.role == "verifier":
        return float(a.parent is not None and a.parent.correct)
    return float(a.correct)


def verification_metrics(attempts: Sequence[Attempt]) -> dict[str, float]:
    """What the verifier and the corrector do, per class, over a step's attempts (a verifier that says
    Wrong to everything scores recall 1 on wrong outputs and 0 on right ones, which its mean reward
    hides when most reviewed outputs are wrong):

    - `<verifier>/recall_wrong`, `/recall_right`: the share of its reports on wrong (right) outputs whose
      verdict says so (a malformed verdict is a miss); `/balanced_accuracy`: their mean;
      `/reviewed_right`: the share of right outputs among the outputs it reviewed;
    - `<corrector>/fix_rate`: the share of revisions of a wrong output that are right; `/break_rate`:
      the share of revisions of a right output that are wrong.

    A rate over an empty class is left out, not 0 (`balanced_accuracy` needs both)."""
    out: dict[str, float] = {}

    def rate(key: str, hits: list[bool]) -> None:
        if hits:
            out[key] = sum(hits) / len(hits)

    reports = [a for a in attempts if a.judges and a.parent is not None]
    for role in sorted({a.role for a in reports}):
        mine = [a for a in reports if a.role == role]
        rate(f"{role}/recall_wrong", [a.verdict is False for a in mine if not _right(a.parent)])
        rate(f"{role}/recall_right", [a.verdict is True for a in mine if _right(a.parent)])
        if f"{role}/recall_wrong" in out and f"{role}/recall_right" in out:
            out[f"{role}/balanced_accuracy"] = (out[f"{role}/recall_wrong"] + out[f"{role}/recall_right"]) / 2
        reviewed = {id(a.parent): a.parent for a in mine}.values()
        rate(f"{role}/reviewed_right", [_right(r) for r in reviewed])
    fixes: dict[str, list[bool]] = {}
    breaks: dict[str, list[bool]] = {}
    for a in attempts:
        if a.parent is None or not a.parent.judges:
            continue  # not a revision of a reviewed output
        if _right(a.parent.parent):
            breaks.setdefault(a.role, []).append(not a.correct)
        else:
            fixes.setdefault(a.role, []).append(a.correct)
    for role in sorted(fixes.keys() | breaks.keys()):
        rate(f"{role}/fix_rate", fixes.get(role, []))
        rate(f"{role}/break_rate", breaks.get(role, []))
    return out


def _right(a: Attempt | None) -> bool:
    """The output a report reviewed, or a revision revised, was right."""
    return a is not None and a.correct


def rollout_step(
    problems: Sequence[Problem],
    run: Run,
    s: MarsSettings,
    step: int = 0,
    *,
    around: Callable[[Problem], AbstractContextManager[Any]] | None = None,
) -> list[Attempt]:
    """All problems of a step concurrently (later agents of one problem wait for the earlier ones);
    `around(problem)`: what each problem's chain runs inside, on its thread (e.g. its trace's span)."""

    def one(p: Problem) -> list[Attempt]:
        with around(p) if around is not None else nullcontext():
            return rollout_problem(p, run, s, step)

    with ThreadPoolExecutor(max_workers=max(1, len(problems))) as pool:
        per_problem = list(pool.map(one, problems))
    return [a for attempts in per_problem for a in attempts]


# ---- inference-time V–C loop (evaluation) ---------------------------------------------------------
@dataclass
class VCResult:
    solver_correct: bool
    system_correct: bool
    first_verdict: bool | None  # the verifier's verdict on the solver's own solution
    iterations: int
    accepted: bool = False  # a candidate passed `accept_after` verifications in a row (no fallback)
    revised_wrong: int = 0  # revisions of a wrong candidate …
    fixed: int = 0  # … that were right
    revised_right: int = 0  # revisions of a right candidate …
    broke: int = 0  # … that were wrong


def vc_loop(
    problem: Problem, run: Run, *, calculator: bool = False, accept_after: int = 4, max_iterations: int = 10
) -> VCResult:
    """MarsRL §2.7: verify; while the verdict is Wrong, correct and verify again; accept a solution
    after `accept_after` consecutive Correct verdicts; after `max_iterations` verifications without
    acceptance answer with the candidate judged Correct most often (the first such on ties; the
    solver's own when none was). `calculator`: the verifier reads the solutions as it was trained to
    (`MarsSettings.calculator`)."""
    first = parse_turn(run("solver", solver_prompt(problem.text), 1, "eval.S")[0].text)
    candidates: list[tuple[Turn, int]] = [(first, 0)]  # (solution, times judged Correct)
    current, passes, first_verdict = 0, 0, None
    counts = {"revised_wrong": 0, "fixed": 0, "revised_right": 0, "broke": 0}
    for it in range(max_iterations):
        sol = candidates[current][0]
        report = parse_turn(
            run("verifier", verifier_prompt(problem.text, sol.shown(), calculator), 1, f"eval.V{it}")[0].text
        )
        verdict = parse_verdict(report.answer) if report.format_ok else None
        first_verdict = verdict if it == 0 else first_verdict
        if verdict:
            candidates[current] = (sol, candidates[current][1] + 1)
            passes += 1
            if passes >= accept_after:
                return VCResult(
                    _ok(problem, first), _ok(problem, sol), first_verdict, it + 1, accepted=True, **counts
                )
            continue
        passes = 0
        revised = parse_turn(
            run("corrector", corrector_prompt(problem.text, sol.shown(), report.think), 1, f"eval.C{it}")[
                0
            ].text
        )
        was, now = _ok(problem, sol), _ok(problem, revised)
        counts["revised_right" if was else "revised_wrong"] += 1
        counts["broke" if was else "fixed"] += int(was != now)
        candidates.append((revised, 0))
        current = len(candidates) - 1
    best = max(range(len(candidates)), key=lambda i: (candidates[i][1], -i))
    return VCResult(
        _ok(problem, first), _ok(problem, candidates[best][0]), first_verdict, max_iterations, False, **counts
    )


def _ok(problem: Problem, t: Turn) -> bool:
    return t.format_ok and answer_value(t.answer) == problem.answer


def vc_metrics(results: Sequence[VCResult]) -> dict[str, float]:
    """Solver-alone and V–C-system accuracy; the verifier's precision / recall at flagging wrong
    solutions and its recall on right ones (on the solver's own solutions; balanced accuracy: the mean
    of the two recalls), with the always-'Correct' verifier's accuracy beside; the loop's accept rate
    (a candidate passed, no fallback) and the corrector's fix rate (revisions of a wrong candidate that
    are right) and break rate (of a right candidate that are wrong). Empty classes give 0."""
    n = max(len(results), 1)
    wrong = [r for r in results if not r.solver_correct]
    right = [r for r in results if r.solver_correct]
    flagged = [r for r in results if r.first_verdict is False]
    hits = sum(1 for r in flagged if not r.solver_correct)
    passed = sum(1 for r in right if r.first_verdict is True)
    agree = sum(1 for r in results if r.first_verdict is not None and r.first_verdict == r.solver_correct)
    recall_wrong = hits / len(wrong) if wrong else 0.0
    recall_right = passed / len(right) if right else 0.0
    revised_wrong, revised_right = (
        sum(r.revised_wrong for r in results),
        sum(r.revised_right for r in results),
    )
    return {
        "solver_accuracy": sum(r.solver_correct for r in results) / n,
        "system_accuracy": sum(r.system_correct for r in results) / n,
        "verifier_precision": hits / len(flagged) if flagged else 0.0,
        "verifier_recall": recall_wrong,
        "verifier_recall_right": recall_right,
        "verifier_balanced_accuracy": (recall_wrong + recall_right) / 2,
        "verifier_accuracy": agree / n,
        "always_correct_verifier_accuracy": sum(r.solver_correct for r in results) / n,
        "iterations_mean": sum(r.iterations for r in results) / n,
        "accept_rate": sum(r.accepted for r in results) / n,
        "corrector_fix_rate": sum(r.fixed for r in results) / revised_wrong if revised_wrong else 0.0,
        "corrector_break_rate": sum(r.broke for r in results) / revised_right if revised_right else 0.0,
        "n": float(len(results)),
    }


ACCURACIES = ("solver_accuracy", "system_accuracy")


def evaluate(
    problems: Sequence[Problem],
    run: Run,
    *,
    calculator: bool = False,
    concurrency: int = 64,
    outcomes: dict[str, list[float]] | None = None,
    on_done: Callable[[], None] | None = None,
) -> dict[str, float]:
    """`vc_metrics` over held-out problems, with standard errors of the two accuracies; each problem's
    solver-alone and V–C-system outcome (1 or 0, in `problems`' order) into `outcomes` when given,
    for paired comparisons of two evaluations; `on_done()` after each problem (a progress bar)."""

    def one(p: Problem) -> VCResult:
        result = vc_loop(p, run, calculator=calculator)
        if on_done is not None:
            on_done()
        return result

    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(problems)))) as pool:
        results = list(pool.map(one, problems))
    if outcomes is not None:
        outcomes["solver_accuracy"] = [float(r.solver_correct) for r in results]
        outcomes["system_accuracy"] = [float(r.system_correct) for r in results]
    m = vc_metrics(results)
    n = max(len(results), 1)
    for name in ACCURACIES:
        m[f"{name}_se"] = math.sqrt(m[name] * (1 - m[name]) / n)
    return m


class LocalRun:
    """`Run` over in-process agents (role → TurnAgent; roles that share a model share an agent). With
    `seed`, every call is seeded from (seed, group, prompt), so an evaluation repeats exactly."""

    def __init__(self, agents: dict[str, TurnAgent], *, seed: int | None = None) -> None:
        self.agents, self.seed = agents, seed

    def __call__(self, role: str, prompt: str, n: int, group: str) -> list[Output]:
        seed = None if self.seed is None else self.seed + zlib.crc32(f"{group}|{prompt}".encode())
        return [Output(text, tr) for text, tr in self.agents[role].sample(prompt, n, seed=seed)]
