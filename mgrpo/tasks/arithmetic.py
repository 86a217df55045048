"""The MarsRL built-in task: seeded multi-step arithmetic word problems with exact answers.

A problem starts from a number and applies 2 (default) additions or subtractions told as a story:

    "Ann has 7 apples. Ann finds 5 more. Ann gives away 3. How many apples now?"   answer 9

Every role writes its work as one turn `<think>…</think><answer>…</answer>` (the tags are single
special tokens of the tiny models' tokenizers, so generation stops on `</answer>`):

    solver / corrector   <think>7+5=12 12-3=9</think><answer>9</answer>
    verifier             <think>7+5=12 ok 12-3=9 ok</think><answer>Correctness: Correct</answer>
                         <think>7+5=13 bad</think><answer>Correctness: Wrong</answer>

The verifier's bug report is the `<think>` text and its verdict line the `<answer>` payload (algorithm.md §9's
"text before the `Correctness:` line", in tags so a tiny model stops on a special token
[decision]). With a calculator (`MarsRLConfig.calculator`, the default), the verifier reads each
written step with the calculator's value of it and copies that value into its report:

    solution as the verifier reads it   7+5=12 (12) 12-3=8 (9) => 8
    verifier                            <think>7+5=12 (12) ok 12-3=8 (9) bad</think><answer>Correctness: Wrong</answer>

The tool computes; comparing the written result with it, and checking that each operand was copied
from the problem, is still the verifier's to learn [decision: without it the tiny verifier learns the
base rate of its verdicts, not the check; docs/results.md]. Problems are split into `train` and `heldout` by a hash of their text (1 in 5 held out),
so a held-out problem is never trained on. Corrupted solutions (one wrong step result, or one wrong
copied operand, with the later steps computed correctly from it) give the verifier and the
corrector their demonstrations.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

NAMES = ("Ann", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal", "Ida", "Jo", "Kit", "Lu")
ITEMS = ("apples", "coins", "books", "shells", "stamps", "cards", "pens", "eggs")
ADD = ("finds {b} more", "gets {b} more", "buys {b} more")
SUB = ("gives away {b}", "loses {b}", "sells {b}")
VERDICTS = ("Correct", "Wrong")
_VERDICT = re.compile(r"^\s*Correctness:\s*(Correct|Wrong)\s*$")
Step = tuple[int, str, int, int]  # (left, op, right, result)


@dataclass(frozen=True)
class Problem:
    pid: str
    text: str
    start: int
    ops: tuple[tuple[str, int], ...]  # ("+", 5), ("-", 3)
    split: str

    @property
    def answer(self) -> int:
        return solve(self.start, self.ops)[-1][3] if self.ops else self.start

    def steps(self) -> list[Step]:
        return solve(self.start, self.ops)


def apply(a: int, op: str, b: int) -> int:
    """`a + b` or `a - b`: one step's result (what the calculator gives for it)."""
    return a + b if op == "+" else a - b


def solve(start: int, ops: tuple[tuple[str, int], ...]) -> list[Step]:
    out, cur = [], start
    for op, b in ops:
        res = apply(cur, op, b)
        out.append((cur, op, b, res))
        cur = res
    return out


def split_of(text: str) -> str:
    return "heldout" if hashlib.blake2b(text.encode(), digest_size=2).digest()[0] % 5 == 0 else "train"


def _draw(rng: random.Random, n_ops: int) -> tuple[str, int, tuple[tuple[str, int], ...]]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    start, cur, ops, parts = rng.randint(2, 20), 0, [], []
    cur = start
    for _ in range(n_ops):
        if cur > 3 and rng.random() < 0.5:
            b = rng.randint(1, min(cur - 1, 12))
            ops.append(("-", b))
            parts.append(rng.choice(SUB).format(b=b))
            cur -= b
        else:
            b = rng.randint(1, 12)
            ops.append(("+", b))
            parts.append(rng.choice(ADD).format(b=b))
            cur += b
    story = " ".join(f"{name} {p}." for p in parts)
    return f"{name} has {start} {item}. {story} How many {item} now?", start, tuple(ops)


def make_problems(split: str, n: int, *, seed: int = 0, n_ops: int = 2) -> list[Problem]:
    """`n` distinct problems of one split ('train' or 'heldout'), the same for the same seed."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng, seen, out = random.Random(f"arith:{seed}:{n_ops}:{split}"), set(), list[Problem]()
    for _ in range(200 * n + 1000):
        text, start, ops = _draw(rng, n_ops)
        if text in seen or split_of(text) != split:
            continue
        seen.add(text)
        out.append(Problem(f"{split[0]}{len(out)}", text, start, ops, split))
        if len(out) == n:
            return out
    raise ValueError(f"could not draw {n} distinct {split} problems with {n_ops} operations")


# ---- text of each role's turn ------------------------------------------------------------------
def steps_text(steps: list[Step]) -> str:
    return " ".join(f"{a}{op}{b}={r}" for a, op, b, r in steps)


def solution_turn(steps: list[Step]) -> str:
    """A solver/corrector turn: the steps, then the last step's result as the answer."""
    answer = steps[-1][3] if steps else 0
    return f"<think>{steps_text(steps)}</think><answer>{answer}</answer>"


def check_steps(problem: Problem, steps: list[Step], calculator: bool = False) -> tuple[str, bool]:
    """The verifier's report on written steps: each step 'ok' until the first 'bad' (an operand not
    copied from the problem or the previous result, or a wrong sum); with `calculator`, each step
    followed by the calculator's value of it as the verifier read it (`calculated`). Returns (report,
    all ok)."""
    words, cur = [], problem.start
    for i, (a, op, b, r) in enumerate(steps):
        want_op, want_b = problem.ops[i] if i < len(problem.ops) else ("?", -1)
        value = apply(a, op, b)
        ok = a == cur and op == want_op and b == want_b and r == value
        words.append(f"{a}{op}{b}={r}{f' ({value})' if calculator else ''} {'ok' if ok else 'bad'}")
        if not ok:
            return " ".join(words), False
        cur = r
    complete = len(steps) == len(problem.ops)
    return " ".join(words) if complete else " ".join([*words, "short"]), complete


def verification_turn(report: str, ok: bool) -> str:
    return f"<think>{report}</think><answer>Correctness: {'Correct' if ok else 'Wrong'}</answer>"


def corrupt(problem: Problem, rng: random.Random) -> list[Step]:
    """A wrong solution: one step's result off by 1-3, or one copied operand off by 1-2; the later
    steps are computed correctly from it, so the error is in one place and the answer is wrong."""
    steps, j = problem.steps(), rng.randrange(len(problem.ops))
    a, op, b, r = steps[j]
    if rng.random() < 0.5:
        r = max(0, r + rng.choice((-3, -2, -1, 1, 2, 3)))
        if r == steps[j][3]:
            r += 1
    else:
        b = max(1, b + rng.choice((-2, -1, 1, 2)))
        if b == steps[j][2]:
            b += 1
        r = apply(a, op, b)
    out = [*steps[:j], (a, op, b, r)]
    out += solve(r, problem.ops[j + 1 :])
    return out


# ---- parsing what a role wrote --------------------------------------------------------------------
_TURN = re.compile(r"\s*<think>(?P<think>[^<]*)</think>\s*<answer>(?P<answer>[^<]*)</answer>\s*$", re.S)
_STEP = re.compile(r"(\d+)([+-])(\d+)=(-?\d+)")


@dataclass(frozen=True)
class Turn:
    format_ok: bool
    think: str
    answer: str

    def shown(self) -> str:
        """The turn as a later role reads it: 'steps => answer' (tags removed)."""
        return f"{self.think} => {self.answer}" if self.format_ok else "(unreadable)"


def parse_turn(text: str) -> Turn:
    m = _TURN.match(text)
    if m is None or not m.group("answer").strip():
        return Turn(False, "", "")
    return Turn(True, " ".join(m.group("think").split()), m.group("answer").strip())


def answer_value(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_verdict(answer: str) -> bool | None:
    """'Correctness: Correct' → True, 'Correctness: Wrong' → False, anything else → None (format failure)."""
    m = _VERDICT.match(answer)
    return None if m is None else m.group(1) == "Correct"


def written_steps(think: str) -> list[Step]:
    return [(int(a), op, int(b), int(r)) for a, op, b, r in _STEP.findall(think)]


def calculated(solution: str) -> str:
    """A solution as a verifier with a calculator reads it: every written step `a±b=r` followed by the
    calculator's value of `a±b` in parentheses ("12-3=8 (9)"). The tool computes; whether the step
    copied the right operands and whether `r` matches is still the verifier's to check."""

    def value(m: re.Match[str]) -> str:
        return f"{m[0]} ({apply(int(m[1]), m[2], int(m[3]))})"

    return _STEP.sub(value, solution)


# ---- prompts ----------------------------------------------------------------------------------
def solver_prompt(problem: str) -> str:
    return f"P: {problem}\n"


def verifier_prompt(problem: str, solution: str, calculator: bool = False) -> str:
    """With `calculator`, the solution as a verifier with a calculator reads it (`calculated`)."""
    return f"P: {problem}\nS: {calculated(solution) if calculator else solution}\nCheck:\n"


def corrector_prompt(problem: str, solution: str, report: str) -> str:
    return f"P: {problem}\nS: {solution}\nR: {report}\nFix:\n"


def tokenizer_texts(seed: int) -> Iterator[str]:
    """What the tiny tokenizers are trained on: train problems and every kind of turn."""
    rng = random.Random(seed)
    for p in make_problems("train", 400, seed=seed):
        good, bad = p.steps(), corrupt(p, rng)
        yield solver_prompt(p.text)
        yield solution_turn(good) + solution_turn(bad)
        yield verification_turn(*check_steps(p, good)) + verification_turn(*check_steps(p, bad))
