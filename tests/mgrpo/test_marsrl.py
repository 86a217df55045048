"""MarsRL (algorithm.md §9): rewards, selection and the grouped rollout program on hand-built cases; the
V–C inference loop with scripted roles; the arithmetic task."""

import random

import pytest

from mgrpo.algo import answer_reward, select_inputs, verifier_reward
from mgrpo.tasks.arithmetic import (
    Problem,
    calculated,
    check_steps,
    corrupt,
    make_problems,
    parse_turn,
    parse_verdict,
    solution_turn,
    verification_turn,
    verifier_prompt,
)
from mgrpo.workflows.marsrl import (
    Attempt,
    MarsSettings,
    Output,
    evaluate,
    outcome,
    rollout_problem,
    vc_loop,
    vc_metrics,
    verification_metrics,
)

P = make_problems("train", 1, seed=3)[0]
RIGHT = solution_turn(P.steps())
WRONG = solution_turn(corrupt(P, random.Random(0)))
SAYS_OK = verification_turn("all ok", True)
SAYS_BAD = verification_turn("a step bad", False)


class Script:
    """A `Run` whose outputs are fixed per role (cycled per call), recording every call."""

    def __init__(self, **outputs):
        self.outputs, self.calls, self.count = outputs, [], dict.fromkeys(outputs, 0)

    def __call__(self, role, prompt, n, group):
        self.calls.append((role, prompt, n, group))
        texts, start = self.outputs[role], self.count[role] if n == 1 else 0  # single samples: the next text
        self.count[role] += n
        return [Output(texts[(start + i) % len(texts)], f"{group}#{i}") for i in range(n)]


def test_verifier_reward_is_verdict_agreement():
    assert [
        verifier_reward(v, c) for v, c in [(True, True), (False, False), (True, False), (False, True)]
    ] == [1, 1, 0, 0]
    assert verifier_reward(None, True) == verifier_reward(None, False) == 0.0  # a bad verdict format scores 0
    assert (
        answer_reward(True, True) == 1.0 and answer_reward(False, True) == answer_reward(True, False) == 0.0
    )


def test_verdict_format():
    assert parse_verdict("Correctness: Correct") is True and parse_verdict(" Correctness: Wrong ") is False
    assert parse_verdict("Correctness: Maybe") is None and parse_verdict("Correct") is None
    assert not parse_turn("<think>x</think>").format_ok


def test_selection_strategies():
    r = [1.0, 1.0, 0.0, 1.0, 0.0]
    assert select_inputs(r, 2, "adaptive", prefer=0.0, seed=1) == [2, 4]  # the verifier takes the wrong ones
    assert select_inputs([0.0, 1.0, 0.0], 1, "adaptive", prefer=1.0, seed=5) == [
        1
    ]  # the corrector: rightly flagged
    b = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    for seed in range(5):
        assert sorted(b[i] for i in select_inputs(b, 2, "balanced", prefer=0.0, seed=seed)) == [0.0, 1.0]
    assert len(select_inputs(r, 2, "random", prefer=0.0, seed=3)) == 2
    assert select_inputs(r, 2, "random", prefer=0.0, seed=3) == select_inputs(
        r, 2, "random", prefer=0.0, seed=3
    )
    assert select_inputs([1.0], 2, "adaptive", prefer=0.0, seed=0) == [0]  # fewer than k: all
    with pytest.raises(ValueError, match="strategy"):
        select_inputs(r, 2, "greedy", prefer=0.0, seed=0)  # type: ignore[arg-type]


def test_grouped_rollout_on_hand_built_outputs():
    run = Script(solver=[RIGHT, WRONG, WRONG, RIGHT], verifier=[SAYS_OK, SAYS_BAD], corrector=[RIGHT, WRONG])
    attempts = rollout_problem(P, run, MarsSettings(group_size=4), step=0)
    by_role = {r: [a for a in attempts if a.role == r] for r in ("solver", "verifier", "corrector")}
    # S (4) → V1: 2 chosen solutions × 4 → C1: 2 chosen reports × 4 → V2: 2 × 4 → C2: 2 × 4
    assert [len(by_role[r]) for r in ("solver", "verifier", "corrector")] == [4, 16, 16]
    assert [a.reward for a in by_role["solver"]] == [1.0, 0.0, 0.0, 1.0]
    groups = {}
    for a in attempts:
        groups.setdefault(a.group, []).append(a)
    for g, members in groups.items():  # every group shares one input and one role
        assert len({m.prompt for m in members}) == 1 and len({m.role for m in members}) == 1, g
        assert len(members) == 4
    v1 = [a for a in by_role["verifier"] if ".V1." in a.group]
    assert {a.parent.reward for a in v1} == {0.0}  # adaptive: the verifier reviewed the two wrong solutions
    for v in by_role["verifier"]:  # reward = verdict agrees with the reviewed solution's truth
        assert v.reward == float(v.verdict == v.parent.correct)
    assert sorted(a.reward for a in v1) == [0.0] * 4 + [1.0] * 4  # 'Correct' on a wrong solution scores 0
    for c in by_role["corrector"]:  # the corrector only took reports that said Wrong
        assert c.parent.verdict is False and c.reward == float(c.turn.answer == str(P.answer))
    c1_prompts = {a.prompt for a in by_role["corrector"] if ".C1." in a.group}
    assert all("a step bad" in p for p in c1_prompts)


def test_chain_stops_when_no_verifier_flags_an_error_and_at_the_step_limit():
    run = Script(solver=[WRONG], verifier=[SAYS_OK], corrector=[RIGHT])
    attempts = rollout_problem(P, run, MarsSettings(group_size=2), step=0)
    assert {a.role for a in attempts} == {"solver", "verifier"}  # no report said Wrong: no corrector
    run = Script(solver=[WRONG], verifier=[SAYS_BAD], corrector=[WRONG])
    attempts = rollout_problem(P, run, MarsSettings(group_size=2, max_agent_steps=3), step=0)
    assert [a.role for a in attempts].count("verifier") == 4 and {
        a.group.split(".")[1] for a in attempts
    } == {"S", "V1", "C1"}


def test_outcome_rewards_follow_the_final_answers():
    run = Script(solver=[WRONG], verifier=[SAYS_BAD], corrector=[RIGHT])
    attempts = rollout_problem(
        P, run, MarsSettings(group_size=2, max_agent_steps=3, reward="outcome"), step=0
    )
    solver, verifier, corrector = (
        [a for a in attempts if a.role == r] for r in ("solver", "verifier", "corrector")
    )
    assert all(c.reward == 1.0 for c in corrector)  # leaves: their own answer
    assert all(v.reward == 1.0 for v in verifier if v.children)  # continued: the mean of its revisions
    assert all(
        v.reward == 0.0 for v in verifier if not v.children
    )  # not continued: the wrong solution stands
    assert [s.reward for s in solver] == [outcome(s) for s in solver] and solver[0].reward > 0
    agent = rollout_problem(P, run, MarsSettings(group_size=2, max_agent_steps=3), step=0)
    assert [a.reward for a in agent if a.role == "solver"] == [0.0, 0.0]  # agent-specific: its own answer


def test_vc_loop_accepts_after_four_passes_and_falls_back_to_the_most_trusted():
    run = Script(solver=[WRONG], verifier=[SAYS_BAD, SAYS_OK, SAYS_OK, SAYS_OK, SAYS_OK], corrector=[RIGHT])
    r = vc_loop(P, run)
    assert not r.solver_correct and r.system_correct and r.first_verdict is False and r.iterations == 5
    never = Script(solver=[RIGHT], verifier=[SAYS_BAD], corrector=[WRONG])
    r = vc_loop(P, never, max_iterations=3)
    assert (
        r.solver_correct and r.system_correct and r.iterations == 3
    )  # none judged Correct: the solver's own


def test_arithmetic_problems():
    train, held = make_problems("train", 200), make_problems("heldout", 50)
    assert not {p.text for p in train} & {p.text for p in held}
    assert make_problems("train", 5, seed=1) == make_problems("train", 5, seed=1)
    rng = random.Random(0)
    for p in train[:50]:
        assert p.answer == p.steps()[-1][3] >= 0
        bad = corrupt(p, rng)
        assert bad[-1][3] != p.answer and not check_steps(p, bad)[1] and check_steps(p, p.steps())[1]


def test_the_corrector_takes_only_reports_that_say_wrong():
    # right solutions; 3 of each 4 reports say Correct (reward 1), 1 says Wrong (reward 0): adaptive would
    # prefer reward-1 reports, but only the Wrong ones may be corrected
    run = Script(solver=[RIGHT], verifier=[SAYS_OK, SAYS_OK, SAYS_OK, SAYS_BAD], corrector=[RIGHT])
    attempts = rollout_problem(P, run, MarsSettings(group_size=4, max_agent_steps=3), step=0)
    corrections = [a for a in attempts if a.role == "corrector"]
    assert len(corrections) == 8 and all(
        c.parent.verdict is False and c.parent.reward == 0.0 for c in corrections
    )


def test_evaluation_records_each_problems_outcomes_in_order_for_paired_gains():
    """`evaluate(..., outcomes=)`: the solver-alone and V–C-system outcome of every problem, in the
    problems' order (the demo pairs two evaluations by it), agreeing with the accuracies."""
    problems = make_problems("heldout", 6, seed=5)
    right = {p.text: i % 3 != 1 for i, p in enumerate(problems)}  # problems 1 and 4 answered wrong

    def run(role, prompt, n, group):
        if role != "solver":
            return [Output(SAYS_OK, None)] * n  # nothing flagged: the system keeps the solver's answer
        p = next(p for p in problems if p.text in prompt)
        turn = solution_turn(p.steps() if right[p.text] else corrupt(p, random.Random(0)))
        return [Output(turn, None)] * n

    outcomes: dict[str, list[float]] = {}
    m = evaluate(problems, run, concurrency=3, outcomes=outcomes)
    assert outcomes["solver_accuracy"] == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert outcomes["system_accuracy"] == outcomes["solver_accuracy"]
    assert m["solver_accuracy"] == m["system_accuracy"] == 4 / 6


# ---- what the verifier and the corrector learned, per class (issue 41) -------------------------------
def _output(role: str, correct: bool) -> Attempt:
    return Attempt(role, "g", "p", parse_turn(RIGHT if correct else WRONG), "ref", correct=correct)


def _report(reviewed: Attempt, verdict: bool | None) -> Attempt:
    a = Attempt(
        "verifier", "g", "p", parse_turn(SAYS_OK), "ref", judges=True, verdict=verdict, parent=reviewed
    )
    reviewed.children.append(a)
    return a


def _revision(report: Attempt, correct: bool) -> Attempt:
    a = _output("corrector", correct)
    a.parent = report
    report.children.append(a)
    return a


def test_verification_metrics_count_each_class_on_hand_made_attempts():
    """Reports on wrong solutions: 3 of 4 say Wrong (one malformed); on right ones 1 of 2 say Correct;
    revisions of wrong solutions: 1 of 3 right; of right ones: 1 of 2 wrong. Swapping the classes
    anywhere gives other numbers."""
    w1, w2, r1 = _output("solver", False), _output("solver", False), _output("solver", True)
    reports = [_report(w1, False), _report(w1, False), _report(w2, False), _report(w2, None)]
    reports += [_report(r1, True), _report(r1, False)]
    revisions = [_revision(reports[0], True), _revision(reports[0], False), _revision(reports[2], False)]
    revisions += [_revision(reports[5], False), _revision(reports[5], True)]
    m = verification_metrics([w1, w2, r1, *reports, *revisions])
    assert m == {
        "verifier/recall_wrong": 0.75,
        "verifier/recall_right": 0.5,
        "verifier/balanced_accuracy": 0.625,
        "verifier/reviewed_right": 1 / 3,
        "corrector/fix_rate": 1 / 3,
        "corrector/break_rate": 0.5,
    }


def test_a_verifier_that_says_wrong_to_everything_scores_half_balanced_accuracy():
    solutions = [_output("solver", c) for c in (False, False, False, True)]
    reports = [_report(s, False) for s in solutions]
    m = verification_metrics([*solutions, *reports])
    assert m["verifier/recall_wrong"] == 1.0 and m["verifier/recall_right"] == 0.0
    assert m["verifier/balanced_accuracy"] == 0.5  # its mean reward would read 0.75
    only_wrong = verification_metrics([solutions[0], reports[0]])
    assert "verifier/recall_right" not in only_wrong and "verifier/balanced_accuracy" not in only_wrong


def test_the_vc_loop_counts_fixes_breaks_and_acceptance():
    fixes = vc_loop(P, Script(solver=[WRONG], verifier=[SAYS_BAD] + [SAYS_OK] * 4, corrector=[RIGHT]))
    assert (fixes.accepted, fixes.revised_wrong, fixes.fixed, fixes.revised_right) == (True, 1, 1, 0)
    breaks = vc_loop(P, Script(solver=[RIGHT], verifier=[SAYS_BAD], corrector=[WRONG]), max_iterations=3)
    # a right solution revised into a wrong one (a break), then that wrong one revised twice, never fixed
    assert (breaks.accepted, breaks.revised_right, breaks.broke, breaks.revised_wrong, breaks.fixed) == (
        False,
        1,
        1,
        2,
        0,
    )
    m = vc_metrics([fixes, breaks])
    assert m["accept_rate"] == 0.5 and m["corrector_fix_rate"] == 1 / 3 and m["corrector_break_rate"] == 1.0
    # the solver's wrong solution flagged (recall on wrong 1), its right one flagged too (recall on right 0)
    assert m["verifier_recall"] == 1.0 and m["verifier_recall_right"] == 0.0
    assert m["verifier_balanced_accuracy"] == 0.5


def test_the_calculator_writes_each_steps_value_and_leaves_the_check_to_the_verifier():
    assert calculated("12-3=8 8+5=13 => 13") == "12-3=8 (9) 8+5=13 (13) => 13"
    assert calculated("3-5=-1 => -1") == "3-5=-1 (-2) => -1"
    p = Problem(
        "t0",
        "Ann has 12 apples. Ann loses 3. Ann finds 5 more. How many apples now?",
        12,
        (("-", 3), ("+", 5)),
        "train",
    )
    # a wrong result: the value beside it differs; a miscopied operand: the value agrees, the verdict does not
    assert check_steps(p, [(12, "-", 3, 8), (8, "+", 5, 13)], calculator=True) == ("12-3=8 (9) bad", False)
    assert check_steps(p, [(12, "-", 4, 8), (8, "+", 5, 13)], calculator=True) == ("12-4=8 (8) bad", False)
    assert check_steps(p, p.steps(), calculator=True) == ("12-3=9 (9) ok 9+5=14 (14) ok", True)
    assert check_steps(p, p.steps()) == ("12-3=9 ok 9+5=14 ok", True)  # without it, as before
    assert "S: 12-3=8 (9) => 8\n" in verifier_prompt(p.text, "12-3=8 => 8", calculator=True)
    assert "S: 12-3=8 => 8\n" in verifier_prompt(p.text, "12-3=8 => 8")


@pytest.mark.parametrize("calculator", [False, True])
def test_the_verifier_reads_solutions_as_it_was_trained_in_rollouts_and_in_the_vc_loop(calculator):
    run = Script(solver=[RIGHT], verifier=[SAYS_BAD], corrector=[RIGHT])
    rollout_problem(
        P, run, MarsSettings(group_size=2, max_agent_steps=2, calculator=calculator), step=0
    )  # 2 groups
    vc_loop(P, run, calculator=calculator, max_iterations=1)
    seen = [prompt for role, prompt, _, _ in run.calls if role == "verifier"]
    shown = parse_turn(RIGHT).shown()
    assert len(seen) == 3 and all(prompt == verifier_prompt(P.text, shown, calculator) for prompt in seen)
