import pytest

from mgrpo.agents.format import parse_planner_turn, parse_single_turn, parse_subagent_turn
from mgrpo.tasks.deep_research import gold_plan, make_questions, plan_answer
from mgrpo.tasks.demos import guessed, planner_demo, single_agent_demo, subagent_demo, subtasks_of


def generated_segments(tokenizer, tr):
    """Split a transcript's trained tokens into its turns (maximal runs of mask 1)."""
    segs, cur = [], []
    for t, m in zip(tr.token_ids, tr.mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            segs.append(tokenizer.decode(cur))
            cur = []
    if cur:
        segs.append(tokenizer.decode(cur))
    return segs


@pytest.mark.parametrize("stage", [1, 2])
def test_planner_demos_follow_the_format(small_task, tokenizer, stage):
    for q in make_questions(small_task.world, "train", stage, 10):
        tr = planner_demo(small_task, tokenizer, q)
        actions = [parse_planner_turn(s) for s in generated_segments(tokenizer, tr)]
        assert [a.content for a in actions[:-1]] == [sub for sub, _ in gold_plan(small_task.world, q)]
        assert actions[-1].kind == "answer" and actions[-1].content == q.answer
        assert tr.mask[: tr.prompt_len] == [0] * tr.prompt_len


def test_subagent_and_single_agent_demos(small_task, tokenizer):
    qs = make_questions(small_task.world, "train", 2, 10)
    for sub in subtasks_of(small_task, qs):
        tr = subagent_demo(small_task, tokenizer, sub)
        actions = [parse_subagent_turn(s) for s in generated_segments(tokenizer, tr)]
        assert [a.kind for a in actions] == ["tool_call", "tool_call", "result"]
        assert small_task.judge(sub, actions[-1].content) == 1.0
    for q in qs:
        actions = [
            parse_single_turn(s)
            for s in generated_segments(tokenizer, single_agent_demo(small_task, tokenizer, q))
        ]
        assert len(actions) == 2 * len(gold_plan(small_task.world, q)) + 1 and actions[-1].content == q.answer
    with pytest.raises(ValueError, match="no demonstration"):
        subagent_demo(small_task, tokenizer, "colour of the sky")


def test_the_flawed_demonstrator_guesses_a_share_of_subtasks_with_a_value_of_the_right_kind(
    small_task, tokenizer
):
    """`WarmstartConfig.guess_share` (issue 43): the guessing demonstrator reports a value of the
    asked kind at once, for about `share` of the subtasks, the same subtasks every time."""
    world = small_task.world
    subs = sorted(set(subtasks_of(small_task, make_questions(world, "train", 2, 200))))
    assert all(guessed(small_task, s, 0.0, 0) is None for s in subs)
    guesses = {s: guessed(small_task, s, 0.3, 0) for s in subs}
    assert 0.2 < sum(g is not None for g in guesses.values()) / len(subs) < 0.4
    assert guesses == {s: guessed(small_task, s, 0.3, 0) for s in subs}  # a seeded draw per subtask
    assert guesses != {s: guessed(small_task, s, 0.3, 1) for s in subs}
    kinds = {
        "birth city": world.cities,
        "country": world.countries,
        "employer": world.orgs,
        "base": world.cities,
    }
    wrong = 0
    for sub, guess in guesses.items():
        if guess is None:
            continue
        relation = sub.split(" of ")[0]
        assert guess in kinds[relation] if relation in kinds else guess.isdigit()
        wrong += small_task.judge(sub, guess) == 0.0
        tr = subagent_demo(small_task, tokenizer, sub, guess=guess)
        actions = [parse_subagent_turn(s) for s in generated_segments(tokenizer, tr)]
        assert [(a.kind, a.content) for a in actions] == [("result", guess)]
    assert wrong > 0.6 * sum(g is not None for g in guesses.values())  # a guess, not the fact


def test_the_single_agent_learns_from_the_same_flawed_demonstrator(small_task, tokenizer):
    """`guess_share` for the single agent (issue 43): the same guesses as the sub-agent's demonstrator
    (the same seeded draws per subtask): a guessed subtask's lookups are left out and the plan goes on
    from the guess, to the answer it leads to — a guessed birth city's country is looked up."""
    world, qs = small_task.world, make_questions(small_task.world, "train", 2, 40)
    wrong = carried = 0
    for q in qs:
        plan = gold_plan(world, q, told=lambda sub: guessed(small_task, sub, 0.3, 7))
        kept = [sub for sub, _ in plan if guessed(small_task, sub, 0.3, 7) is None]
        tr = single_agent_demo(small_task, tokenizer, q, guess_share=0.3, seed=7)
        actions = [parse_single_turn(s) for s in generated_segments(tokenizer, tr)]
        assert len(actions) == 2 * len(kept) + 1 and actions[-1].content == plan_answer(q, plan)
        searched = [a.content.removeprefix("search ") for a in actions if a.content.startswith("search ")]
        assert searched == [sub.split(" of ", 1)[1] for sub in kept]
        wrong += actions[-1].content != q.answer
        carried += any(  # a later subtask asks about a guessed value
            v == sub2.split(" of ", 1)[1]
            for i, (sub, v) in enumerate(plan)
            if guessed(small_task, sub, 0.3, 7) is not None
            for sub2, _ in plan[i + 1 :]
        )
    assert wrong > 0 and carried > 0


def test_the_planner_may_see_the_sub_agents_guesses_and_carry_on_from_them(small_task, tokenizer):
    """`WarmstartConfig.planner_sees_guesses` (issue 43): the planner's demonstration is told the sub-
    agent demonstrator's guess where it guessed (the same seeded draw), delegates on from it and answers
    what the guesses lead to — the whole pair learns from one flawed demonstrator, as the single agent."""
    world, qs = small_task.world, make_questions(small_task.world, "train", 2, 40)

    def told(sub):
        return guessed(small_task, sub, 0.3, 7)

    wrong = 0
    for q in qs:
        plan = gold_plan(world, q, told=told)
        tr = planner_demo(small_task, tokenizer, q, told=told)
        actions = [parse_planner_turn(s) for s in generated_segments(tokenizer, tr)]
        assert [a.content for a in actions[:-1]] == [sub for sub, _ in plan]
        assert actions[-1].kind == "answer" and actions[-1].content == plan_answer(q, plan)
        text = tokenizer.decode(tr.token_ids)
        assert all(value in text for _, value in plan)  # the guesses are what the planner was told
        wrong += actions[-1].content != q.answer
    assert wrong > 0
    with pytest.raises(ValueError, match="team"):
        planner_demo(small_task, tokenizer, qs[0], team=True, told=told)


def test_a_plan_of_the_facts_leads_to_the_questions_answer(small_task):
    for stage in (1, 2):
        for q in make_questions(small_task.world, "train", stage, 60):
            assert plan_answer(q, gold_plan(small_task.world, q)) == q.answer
