"""The job's answer scorer: `correct ∈ [0, 1]` of R_M (algorithm.md §2) for a final answer against a row's
reference, by a built-in rule or the user's HTTP reward endpoint (`RewardConfig`).

Built-ins (pure functions of `answer, reference`):
    exact       1 if the stripped strings are equal
    normalized  1 if equal after `normalize_answer` (lower-case, no punctuation or articles)
    numeric     1 if both parse as numbers within `numeric_rel_tol` (commas and a trailing % ignored)
    regex       1 if the answer fully matches the reference read as a regular expression (case-insensitive)
    math        1 if `math-verify` finds the two expressions equivalent (LaTeX or plain)

`http` posts each step's answers to the user's endpoint in one batch; `judge` asks an LLM the job
loads (`mgrpo/judge.py`) and rewards its p(yes).

A score outside [0, 1], NaN, or an HTTP batch that failed after its retries is *rejected*: it becomes
NaN (unscorable), which the advantage step excludes from its group and gives advantage 0 (algorithm.md §4),
so it is never trained on; `Scores.rejected` / `Scores.errors` count them and `Scores.messages` says
why, for the step's metrics and log.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import torch

from mgrpo.algo.rewards import normalize_answer
from mgrpo.config import RewardConfig
from mgrpo.judge import Judge

_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


@dataclass(frozen=True)
class Item:
    query: str
    answer: str
    reference: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scores:
    values: list[float]
    rejected: int = 0  # out of [0, 1] or NaN from the scorer
    errors: int = 0  # the scorer failed (an HTTP batch after its retries)
    messages: list[str] = field(default_factory=list)


def exact(answer: str, reference: str) -> float:
    return float(answer.strip() == reference.strip())


def normalized(answer: str, reference: str) -> float:
    return float(normalize_answer(answer) == normalize_answer(reference))


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "").rstrip("%").strip()
    return float(t) if _NUMBER.match(t) else None


def numeric(answer: str, reference: str, rel_tol: float = 1e-6) -> float:
    a, r = _number(answer), _number(reference)
    return float(a is not None and r is not None and math.isclose(a, r, rel_tol=rel_tol, abs_tol=1e-12))


def regex(answer: str, reference: str) -> float:
    try:
        return float(re.fullmatch(reference, answer.strip(), flags=re.IGNORECASE) is not None)
    except re.error:
        return math.nan  # a reference that is not a regular expression cannot score anything


def math_equal(answer: str, reference: str) -> float:
    from math_verify import parse, verify  # sympy-heavy: imported on first use

    # No timeouts: math-verify's use signal.alarm, which only works on the main thread.
    gold = parse(reference, parsing_timeout=None)
    pred = parse(answer, parsing_timeout=None)
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None))


def builtin(cfg: RewardConfig) -> Callable[[str, str], float]:
    if cfg.kind == "numeric":
        return lambda a, r: numeric(a, r, cfg.numeric_rel_tol)
    rules: dict[str, Callable[[str, str], float]] = {
        "exact": exact,
        "normalized": normalized,
        "regex": regex,
        "math": math_equal,
    }
    return rules[cfg.kind]


class Scorer:
    """Scores one step's answers in one call (one batched request for `kind: http`)."""

    def __init__(self, cfg: RewardConfig, *, token: str = "", device: torch.device | str = "cpu") -> None:
        self.cfg = cfg
        self.rule = None if cfg.kind in ("http", "judge") else builtin(cfg)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(timeout=cfg.timeout_s, headers=headers) if cfg.kind == "http" else None
        self.judge = None
        if cfg.kind == "judge":
            assert cfg.judge_path is not None
            self.judge = Judge(cfg.judge_path, cfg.judge_prompt, device=device)

    def __call__(self, items: Sequence[Item]) -> Scores:
        if not items:
            return Scores([])
        if self.rule is not None:
            return _checked([self.rule(i.answer, i.reference) for i in items], self.cfg.kind)
        if self.judge is not None:
            return _checked(self.judge(items), f"the judge {self.cfg.judge_path}")
        return self._http(items)

    def _http(self, items: Sequence[Item]) -> Scores:
        assert self.http is not None and self.cfg.url is not None
        body = {
            "items": [
                {"query": i.query, "answer": i.answer, "reference": i.reference, "metadata": i.metadata}
                for i in items
            ]
        }
        last = ""
        for _ in range(self.cfg.retries + 1):
            try:
                r = self.http.post(self.cfg.url, json=body)
                r.raise_for_status()
                values = r.json()["rewards"]
                if not isinstance(values, list) or len(values) != len(items):
                    raise ValueError(f"'rewards' must be a list of {len(items)} numbers")
                return _checked([_float(v) for v in values], f"the reward endpoint {self.cfg.url}")
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                last = f"{type(exc).__name__}: {exc}"
        message = f"the reward endpoint {self.cfg.url} failed {self.cfg.retries + 1} times ({last}); {len(items)} answers left unscored"
        return Scores([math.nan] * len(items), errors=len(items), messages=[message])

    def close(self) -> None:
        if self.http is not None:
            self.http.close()


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return math.nan
    return float(v)


def _checked(values: list[float], source: str) -> Scores:
    """Rewards outside [0, 1] or NaN are rejected (→ NaN, counted, explained), never trained on."""
    bad = [(i, v) for i, v in enumerate(values) if math.isnan(v) or not 0.0 <= v <= 1.0]
    if not bad:
        return Scores(values)
    shown = ", ".join(f"#{i}: {v!r}" for i, v in bad[:3])
    message = (
        f"{source} gave {len(bad)} reward(s) outside [0, 1] or NaN ({shown}); they are excluded from training"
    )
    return Scores(
        [math.nan if (math.isnan(v) or not 0.0 <= v <= 1.0) else v for v in values],
        rejected=len(bad),
        messages=[message],
    )
