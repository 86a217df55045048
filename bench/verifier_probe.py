"""Can the tiny MarsRL verifier check a solution at all? (issue 41)

    .venv/bin/python bench/verifier_probe.py                       # the shipped verifier, teacher-forced (10 s)
    .venv/bin/python bench/verifier_probe.py --sft --steps 1200    # a verifier SFT'd from scratch (4 min)
    .venv/bin/python bench/verifier_probe.py --sft --n-ops 1 --digits --preset small --lr 1e-3
    .venv/bin/python bench/verifier_probe.py --sft --calc --steps 2000 --every 200   # the default recipe's view

Teacher-forced (the default): the verifier reads a problem and a solution whose first step is right or
corrupted (`mgrpo.tasks.arithmetic.corrupt`), then its own report up to that step's decision; the
probe reads its probability of ` ok` against ` bad` there. A verifier that checks gives the right
steps a higher P(ok) than the corrupted ones; one that learned only the base rate gives both the same.

`--sft`: a fresh verifier trained on the warm start's demonstrations (half right, half corrupted
solutions, `mgrpo.workflows.marsrl_warmstart.demo`); every `--every` steps its balanced accuracy
(mean recall on wrong and on right solutions, T = 1, seeded) on held-out problems: corrupted or right
solutions ("synthetic", its own demonstrations' kind) and the shipped solver's own sampled solutions.
Variants: `--n-ops 1` (one-step problems), `--digits` (a tokenizer that splits numbers into digits,
as Qwen's does), `--recompute` (the report writes the step's true result before its verdict), `--resolve` (the report
solves the problem itself, then compares its answer with the solution's),
`--data solver` (demonstrations on the shipped solver's own sampled solutions of training problems,
half wrong and half right, labelled by `check_steps`) or `--data mix` (half of each kind), `--preset`,
`--lr`, `--calc` (the verifier reads each step with its calculator value, `calculated`, and its
report copies them before each verdict: the default recipe since issue 41). Prints one JSON line per evaluation. `--errors`: what the shipped solver's wrong solutions
get wrong first (operand, operator or result of which step) and how far off its wrong results are.
`--rights`: the shipped verifier on the solver's right answers, with and without a wrong step on the way.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

import mgrpo.workflows.marsrl_warmstart as warmstart
from mgrpo.agents.agents import TurnAgent, demo_transcript
from mgrpo.batching import collate, sft_step
from mgrpo.engines.hf import HFEngine
from mgrpo.models import build_model, load, train_tokenizer
from mgrpo.records import Transcript
from mgrpo.tasks.arithmetic import (
    Problem,
    Step,
    Turn,
    answer_value,
    calculated,
    corrupt,
    make_problems,
    parse_turn,
    parse_verdict,
    solution_turn,
    solver_prompt,
    steps_text,
    tokenizer_texts,
    verification_turn,
    verifier_prompt,
    written_steps,
)

Judged = tuple[Problem, Turn, bool]  # a problem, a solution, whether it is right


def shipped(role: str) -> Path:
    return next(Path("mgrpo/shipped").glob("marsrl-*")) / role


def teacher_forced(folder: Path, n: int = 300) -> dict[str, float]:
    """P(ok) at the first step's decision on right and corrupted first steps, the solution shown as the
    verifier was trained to read it (with the calculator's values when its warm start had them)."""
    model, tok = load(folder)
    calc = trained_with_calculator(folder)
    ok, bad = (tok.encode(w, add_special_tokens=False)[0] for w in (" ok", " bad"))
    rng, out = random.Random(1), {"calculator": float(calc)}
    for split, seed in (("train", 0), ("heldout", 2000)):
        by_truth: dict[bool, list[float]] = {True: [], False: []}
        for p in make_problems(split, n, seed=seed):
            steps = p.steps() if rng.random() < 0.5 else corrupt(p, rng)
            a, op, b, r = steps[0]
            first = calculated(f"{a}{op}{b}={r}") if calc else f"{a}{op}{b}={r}"  # as its report writes it
            shown = parse_turn(solution_turn(steps)).shown()
            text = verifier_prompt(p.text, shown, calc) + f"<think>{first}"
            with torch.no_grad():
                logp = model(torch.tensor([tok.encode(text, add_special_tokens=False)])).logits[0, -1]
            p_ok, p_bad = logp.softmax(-1)[[ok, bad]].tolist()
            by_truth[steps[0] == p.steps()[0]].append(p_ok / (p_ok + p_bad))
        for truth, name in ((True, "right"), (False, "corrupted")):
            out[f"{split}_p_ok_first_step_{name}"] = round(sum(by_truth[truth]) / len(by_truth[truth]), 3)
    return out


def recompute_report(problem: Problem, steps: list[Step], calculator: bool = False) -> tuple[str, bool]:
    """`check_steps` whose report writes each step's true result before the verdict on it."""
    words, cur = [], problem.start
    for i, (a, op, b, r) in enumerate(steps):
        want_op, want_b = problem.ops[i] if i < len(problem.ops) else ("?", -1)
        true = cur + want_b if want_op == "+" else cur - want_b
        ok = a == cur and op == want_op and b == want_b and r == true
        words.append(f"{a}{op}{b}={r} {true} {'ok' if ok else 'bad'}")
        if not ok:
            return " ".join(words), False
        cur = r
    complete = len(steps) == len(problem.ops)
    return " ".join(words if complete else [*words, "short"]), complete


def resolve_report(problem: Problem, steps: list[Step], calculator: bool = False) -> tuple[str, bool]:
    """A report that solves the problem itself, then compares its answer with the solution's."""
    given = steps[-1][3] if steps else None
    return f"{steps_text(problem.steps())} vs {given}", given == problem.answer


def pooled(fn: Callable[[int], object], n: int) -> list:
    with ThreadPoolExecutor(64) as pool:
        return list(pool.map(fn, range(n)))


def solver_solutions(problems: list[Problem], seed: int) -> list[Judged]:
    model, tok = load(shipped("solver"))
    engine = HFEngine(model, tok)
    agent = TurnAgent(engine, tok, temperature=1.0)

    def one(i: int) -> Judged:
        turn = parse_turn(agent.sample(solver_prompt(problems[i].text), 1, seed=seed + i)[0][0])
        return problems[i], turn, turn.format_ok and answer_value(turn.answer) == problems[i].answer

    try:
        return pooled(one, len(problems))
    finally:
        engine.close()


def balanced_accuracy(
    model: PreTrainedModel, tok: PreTrainedTokenizerFast, judged: list[Judged], calc: bool = False
) -> dict:
    engine = HFEngine(model, tok)
    agent = TurnAgent(engine, tok, temperature=1.0)

    def verdict(i: int) -> bool | None:
        p, turn, _ = judged[i]
        prompt = verifier_prompt(p.text, turn.shown(), calc)
        report = parse_turn(agent.sample(prompt, 1, seed=50_000 + i)[0][0])
        return parse_verdict(report.answer) if report.format_ok else None

    try:
        verdicts = pooled(verdict, len(judged))
    finally:
        engine.close()
    wrong = [v is False for (_, _, right), v in zip(judged, verdicts, strict=True) if not right]
    right = [v is True for (_, _, right), v in zip(judged, verdicts, strict=True) if right]
    rw, rr = sum(wrong) / max(len(wrong), 1), sum(right) / max(len(right), 1)
    return {"recall_wrong": round(rw, 3), "recall_right": round(rr, 3), "balanced": round((rw + rr) / 2, 3)}


def trained_with_calculator(folder: Path) -> bool:
    """Whether the warm start this model folder belongs to showed its verifier the calculator's values."""
    built = folder.parent / "config.json"
    return built.exists() and bool(json.loads(built.read_text())["config"].get("calculator", False))


def labelled(judged: Judged, calc: bool = False) -> tuple[str, bool]:
    """The report and verdict `check_steps` gives a sampled solution's written steps (a solution whose
    answer is not its last step's result is Wrong)."""
    p, turn, _ = judged
    steps = written_steps(turn.think)
    report, ok = warmstart.check_steps(p, steps, calc)
    return report, ok and bool(steps) and answer_value(turn.answer) == steps[-1][3]


def labelled_demo(judged: Judged, tok: PreTrainedTokenizerFast, calc: bool = False) -> Transcript:
    """A verifier demonstration on a sampled solution, labelled by `labelled`."""
    p, turn, _ = judged
    report, ok = labelled(judged, calc)
    prompt = list(tok.encode(verifier_prompt(p.text, turn.shown(), calc), add_special_tokens=False))
    return demo_transcript(tok, prompt, [(verification_turn(report, ok), None)], "tool_response")


def sft(args: argparse.Namespace) -> None:
    _, tok = load(shipped("verifier"))
    if args.digits:
        tok = train_tokenizer(tokenizer_texts(0), 320, digits=True)
    if args.recompute or args.resolve:  # the demonstrations' report (in the probe's own process only)
        warmstart.check_steps = resolve_report if args.resolve else recompute_report
    rng = random.Random(5)
    synthetic: list[Judged] = []
    for p in make_problems("heldout", args.n_eval, seed=2000, n_ops=args.n_ops):
        steps = p.steps() if rng.random() < 0.5 else corrupt(p, rng)
        synthetic.append((p, parse_turn(solution_turn(steps)), steps == p.steps()))
    solver = solver_solutions(make_problems("heldout", args.n_eval, seed=1000), 7) if args.n_ops == 2 else []
    torch.manual_seed(0)
    verifier = build_model(args.preset, tok, seed=1)
    opt = torch.optim.AdamW(verifier.parameters(), lr=args.lr)
    problems, rng = make_problems("train", 3000, seed=0, n_ops=args.n_ops), random.Random(0)
    sampled = [j for j in solver_solutions(problems, 100) if j[1].format_ok] if args.data != "corrupt" else []
    by_class = [[j for j in sampled if j[2] == right] for right in (False, True)]  # wrong, right

    def demos() -> list[Transcript]:
        """32 demonstrations: corrupted-or-right (`corrupt`), the solver's own solutions, half wrong
        and half right (`solver`), or 16 of each kind (`mix`)."""
        own = 0 if args.data == "corrupt" else 32 if args.data == "solver" else 16
        made = [warmstart.demo("verifier", p, tok, rng, args.calc) for p in rng.sample(problems, 32 - own)]
        return made + [labelled_demo(rng.choice(by_class[i % 2]), tok, args.calc) for i in range(own)]

    start = time.time()
    for step in range(1, args.steps + 1):
        loss = sft_step(verifier, opt, collate(demos(), int(tok.pad_token_id)))
        if step % args.every == 0:
            row = {
                "step": step,
                "loss": round(loss, 4),
                "synthetic": balanced_accuracy(verifier, tok, synthetic, args.calc),
            }
            if solver:
                row["solver_solutions"] = balanced_accuracy(verifier, tok, solver, args.calc)
            print(json.dumps({**row, "s": round(time.time() - start)}), flush=True)


def solver_errors(n: int = 400) -> dict[str, Any]:
    """What the shipped solver gets wrong on `n` held-out problems (T = 1, seeded): the first wrong
    thing in each wrong solution, and how far off a wrong step result is."""
    kinds: Counter[str] = Counter()
    offsets: Counter[int] = Counter()
    for p, turn, right in solver_solutions(make_problems("heldout", n, seed=1000), 7):
        steps = written_steps(turn.think) if turn.format_ok else []
        if right or not turn.format_ok or len(steps) != len(p.ops):
            kinds["right" if right else "unreadable" if not turn.format_ok else "wrong number of steps"] += 1
            continue
        cur, kind = p.start, "answer is not the last result"
        for i, (a, op, b, r) in enumerate(steps):
            want_op, want_b = p.ops[i]
            true = a + b if op == "+" else a - b
            wrong = [(a != cur, "left operand"), (op != want_op, "operator"), (b != want_b, "right operand")]
            wrong.append((r != true, "result"))
            if found := next((what for bad, what in wrong if bad), None):
                kind = f"step {i + 1}: {found}"
                if found == "result":
                    offsets[r - true] += 1
                break
            cur = r
        kinds[kind] += 1
    return {"kinds": dict(kinds.most_common()), "result_offsets": dict(sorted(offsets.items()))}


def right_answers(n: int = 400) -> dict[str, Any]:
    """The shipped verifier on the shipped solver's right answers (T = 1, seeded): how many were reached
    through steps `check_steps` passes, and its recall on all of them and on those alone."""
    calc = trained_with_calculator(shipped("verifier"))
    right = [j for j in solver_solutions(make_problems("heldout", n, seed=1000), 7) if j[2]]
    model, tok = load(shipped("verifier"))
    sound = [j for j in right if labelled(j)[1]]
    return {
        "right_answers": len(right),
        "through_steps_all_right": len(sound),
        "recall_right_all": balanced_accuracy(model, tok, right, calc)["recall_right"],
        "recall_right_steps_all_right": balanced_accuracy(model, tok, sound, calc)["recall_right"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verifier", type=Path, default=None, help="teacher-forced probe of this folder")
    ap.add_argument("--sft", action="store_true", help="train a fresh verifier and evaluate it as it learns")
    ap.add_argument("--errors", action="store_true", help="what the shipped solver gets wrong")
    ap.add_argument(
        "--rights", action="store_true", help="the shipped verifier on the solver's right answers"
    )
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--every", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--preset", default="tiny-wide")
    ap.add_argument("--n-ops", type=int, default=2)
    ap.add_argument("--n-eval", type=int, default=300)
    ap.add_argument("--digits", action="store_true")
    ap.add_argument("--data", choices=("corrupt", "solver", "mix"), default="corrupt")
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--resolve", action="store_true")
    ap.add_argument(
        "--calc", action="store_true", help="the verifier reads and copies each step's calculator value"
    )
    args = ap.parse_args()
    if args.errors:
        print(json.dumps(solver_errors()))
    elif args.rights:
        print(json.dumps(right_answers()))
    elif args.sft:
        sft(args)
    else:
        print(json.dumps(teacher_forced(args.verifier or shipped("verifier"))))


if __name__ == "__main__":
    main()
