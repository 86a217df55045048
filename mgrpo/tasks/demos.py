"""Demonstrations of the built-in task in the agents' exact token layout (for the warm start)."""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cache

from transformers import PreTrainedTokenizerBase

from mgrpo.agents.agents import demo_transcript, planner_prompt, subagent_prompt
from mgrpo.agents.format import OBSERVATION_TAGS
from mgrpo.records import Transcript
from mgrpo.tasks.deep_research import (
    _SUBTASK,
    COMPARISON,
    DeepResearchTask,
    Question,
    compare,
    comparison_fact,
    fact,
    gold_plan,
    plan_answer,
    team_plan,
)


def planner_demo(
    task: DeepResearchTask,
    tokenizer: PreTrainedTokenizerBase,
    q: Question,
    *,
    team: bool = False,
    told: Callable[[str], str | None] | None = None,
) -> Transcript:
    """The gold plan's delegations, then the answer; `team`: with the comparison delegated too.
    `told`: what the sub-agent reports for a subtask where its demonstrator guessed (`guessed`): the
    plan goes on from the guess, to the answer it leads to (`gold_plan(told=)`)."""
    if team and told is not None:
        raise ValueError(
            "the team's planner demonstrations see the facts: a guessed fact is the pair's lever"
        )
    plan = team_plan(task.world, q) if team else gold_plan(task.world, q, told=told)
    turns: list[tuple[str, str | None]] = [(f"<delegate>{sub}</delegate>", value) for sub, value in plan]
    turns.append((f"<answer>{plan_answer(q, plan) if told else q.answer}</answer>", None))
    return demo_transcript(tokenizer, planner_prompt(tokenizer, q.text), turns, OBSERVATION_TAGS["planner"])


def subagent_demo(
    task: DeepResearchTask, tokenizer: PreTrainedTokenizerBase, subtask: str, *, guess: str | None = None
) -> Transcript:
    """Search the subtask's entity, open its document, report the fact; `guess`: a flawed
    demonstrator's, which reports `guess` at once without looking anything up (`guessed`)."""
    m = _SUBTASK.match(subtask)
    value = fact(task.world, subtask)
    if m is None or value is None:
        raise ValueError(f"no demonstration for subtask {subtask!r}")
    lookups = [] if guess is not None else _tool_turns(task, m.group(2))
    turns = [*lookups, (f"<result>{value if guess is None else guess}</result>", None)]
    return demo_transcript(
        tokenizer, subagent_prompt(tokenizer, subtask), turns, OBSERVATION_TAGS["subagent"]
    )


def guessed(task: DeepResearchTask, subtask: str, share: float, seed: int) -> str | None:
    """The flawed demonstrator of `WarmstartConfig.guess_share`: for a `share` of subtasks (a seeded
    draw per subtask) it answers with a guess of the right kind (a city, a year, an employer, a
    country: drawn from all the world's values of that kind, so rarely the fact) instead of looking
    it up. None: this subtask's demonstration looks the fact up."""
    if share <= 0.0:
        return None
    rng = random.Random(f"{seed}:guess:{subtask}")
    if rng.random() >= share:
        return None
    m, world = _SUBTASK.match(subtask), task.world
    if m is None:
        raise ValueError(f"no demonstration for subtask {subtask!r}")
    values = {
        "birth city": list(world.cities),
        "birth year": sorted({str(p.birth_year) for p in world.people.values()}),
        "employer": list(world.orgs),
        "country": list(world.countries),
        "base": list(world.cities),
    }[m.group(1)]
    return rng.choice(values)


def comparer_demo(tokenizer: PreTrainedTokenizerBase, subtask: str) -> Transcript:
    """The team variant's comparer: one `compare` call on the two values, then the answer."""
    m, value = COMPARISON.match(subtask), comparison_fact(subtask)
    if m is None or value is None:
        raise ValueError(f"no demonstration for comparison {subtask!r}")
    a, b = m.group(2), m.group(3)
    if m.group(1) == "born first":
        a, b = a.rpartition(" ")[2], b.rpartition(" ")[2]
    argument = f"{a} {b}"
    turns = [
        (f"<tool_call>compare {argument}</tool_call>", compare(argument)),
        (f"<result>{value}</result>", None),
    ]
    return demo_transcript(
        tokenizer, subagent_prompt(tokenizer, subtask), turns, OBSERVATION_TAGS["subagent"]
    )


def _tool_turns(task: DeepResearchTask, entity: str) -> list[tuple[str, str | None]]:
    doc = next(d for d in task.world.docs if d.title == entity)
    return [
        (f"<tool_call>search {entity}</tool_call>", task.search(entity)),
        (f"<tool_call>open {doc.doc_id}</tool_call>", task.open(doc.doc_id)),
    ]


def single_agent_demo(
    task: DeepResearchTask,
    tokenizer: PreTrainedTokenizerBase,
    q: Question,
    *,
    guess_share: float = 0.0,
    seed: int = 0,
) -> Transcript:
    """The single agent does every lookup of the gold plan itself, then answers; with `guess_share`
    the same flawed demonstrator as the sub-agent's (`guessed`, the same draws and guesses): a guessed
    subtask's lookups are left out and the plan goes on from the guess, to the answer it leads to."""

    @cache  # asked by the plan, then to leave the guessed lookups out: one draw per subtask
    def guess(subtask: str) -> str | None:
        return guessed(task, subtask, guess_share, seed)

    plan = gold_plan(task.world, q, told=guess)
    turns: list[tuple[str, str | None]] = []
    for sub, _ in plan:
        m = _SUBTASK.match(sub)
        if m is None:  # pragma: no cover - gold plans are always in the subtask language
            raise ValueError(sub)
        if guess(sub) is None:
            turns += _tool_turns(task, m.group(2))
    turns.append((f"<answer>{plan_answer(q, plan)}</answer>", None))
    return demo_transcript(tokenizer, planner_prompt(tokenizer, q.text), turns, OBSERVATION_TAGS["single"])


def subtasks_of(task: DeepResearchTask, questions: list[Question], *, team: bool = False) -> list[str]:
    plan = team_plan if team else gold_plan
    return [sub for q in questions for sub, _ in plan(task.world, q)]
