"""Rewards of the planner and the sub-agent (algorithm.md §2; M-GRPO paper Eqs. 4 and 5).

    R_M = 0                                   if the planner output is malformed
        = α1·1 + α2·correct                   otherwise, α = (0.1, 0.9)  → R_M ∈ {0, 0.1, 1}

    R_S = 0                                   if the sub-agent episode is malformed
        = β1·1 + β2·correct_main + β3·expert  otherwise, β = (0.1, 0.4, 0.5)

Decisions (docs/algorithm.md):
- `correct` is exact match after `normalize_answer` (lower-case, strip punctuation, articles, extra spaces).
- `correct_main(k)` is the planner's `correct` for rollout k, copied to every episode of that rollout.
- `expert ∈ [0, 1]` comes from a pluggable judge (programmatic for the built-in task).
- A NaN score means "unscorable": it propagates to a NaN reward, which the advantage step excludes
  from the group statistics and gives advantage 0 (algorithm.md §4).
"""

from __future__ import annotations

import math
import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, collapse whitespace (SQuAD-style)."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _check_unit(name: str, value: float) -> None:
    if not math.isnan(value) and not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1] (or be NaN for 'unscorable'), got {value!r}")


def planner_reward(format_ok: bool, correct: float, *, alpha: tuple[float, float] = (0.1, 0.9)) -> float:
    """Planner reward R_M (paper Eq. 4). `correct` ∈ [0, 1] (1 = exact match); NaN propagates."""
    _check_unit("correct", correct)
    if len(alpha) != 2:
        raise ValueError(f"alpha must be (alpha_format, alpha_correct), got {alpha!r}")
    if not format_ok:
        return 0.0
    return alpha[0] * 1.0 + alpha[1] * float(correct)


def subagent_reward(
    format_ok: bool,
    correct_main: float,
    expert: float,
    *,
    beta: tuple[float, float, float] = (0.1, 0.4, 0.5),
) -> float:
    """Sub-agent episode reward R_S (paper Eq. 5).

    `correct_main` is the planner's outcome of the rollout this episode belongs to; `expert` ∈ [0, 1]
    is the judge's score of the episode's own work. Either may be NaN (unscorable); NaN propagates.
    """
    _check_unit("correct_main", correct_main)
    _check_unit("expert", expert)
    if len(beta) != 3:
        raise ValueError(f"beta must be (beta_format, beta_main, beta_expert), got {beta!r}")
    if not format_ok:
        return 0.0
    return beta[0] * 1.0 + beta[1] * float(correct_main) + beta[2] * float(expert)


def answer_reward(format_ok: bool, correct: bool) -> float:
    """MarsRL solver and corrector reward: 1 when the answer matches the reference, else 0 (a malformed
    turn scores 0)."""
    return float(format_ok and correct)


def verifier_reward(verdict: bool | None, solution_correct: bool) -> float:
    """MarsRL verifier reward r_V = 1[verdict == the reviewed solution's true correctness] (algorithm.md §9).

    `verdict`: True for 'Correctness: Correct', False for 'Correctness: Wrong', None for a malformed
    verdict (reward 0). `solution_correct` comes from the reviewed solution's own reward."""
    return 0.0 if verdict is None else float(verdict == solution_correct)
