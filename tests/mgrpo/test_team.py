"""The deep-research team variant: comparison subtasks, the compare tool, routing to two sub-agent
roles, and each role's own K·D alignment on hand-built episodes."""

import pytest

from mgrpo.agents.agents import Delegation
from mgrpo.agents.format import parse_subagent_turn
from mgrpo.models import train_tokenizer
from mgrpo.records import Transcript
from mgrpo.tasks.deep_research import compare, comparison_fact, team_plan
from mgrpo.tasks.demos import comparer_demo
from mgrpo.workflows import DEEP_RESEARCH, DEEP_RESEARCH_TEAM
from mgrpo.workflows.deep_research import (
    CalleeQuery,
    Episode,
    Rollout,
    aligned_samples,
    subagent_outcome_reward,
)


def test_comparisons_and_the_compare_tool():
    assert comparison_fact("born first: Kir Nai 1971, Ana Bo 1968") == "Ana Bo"
    assert comparison_fact("born first: Kir Nai 1961, Ana Bo 1968") == "Kir Nai"
    assert comparison_fact("same: Naru, naru") == "yes" and comparison_fact("same: Naru, Veld") == "no"
    assert (
        comparison_fact("born first: A 1970, B 1970") is None and comparison_fact("birth year of A") is None
    )
    assert (
        compare("1971 1968") == "1971 > 1968"
        and compare("5 9") == "5 < 9"
        and compare("Naru Veld") == "different"
    )
    assert compare("1971") == "compare needs two values"


def test_team_plans_delegate_the_comparison(small_task):
    from mgrpo.tasks.deep_research import make_questions

    world = small_task.world
    by_kind = {q.kind: q for q in make_questions(world, "train", 2, 5)}
    earlier, same = team_plan(world, by_kind["earlier"]), team_plan(world, by_kind["same_country"])
    assert earlier[-1][0].startswith("born first: ") and earlier[-1][1] == by_kind["earlier"].answer
    assert same[-1][0].startswith("same: ") and same[-1][1] == by_kind["same_country"].answer
    assert [DEEP_RESEARCH_TEAM.callee_for(s) for s, _ in earlier] == ["searcher", "searcher", "comparer"]
    assert {DEEP_RESEARCH.callee_for(s) for s, _ in earlier} == {"subagent"}  # the paper's one sub-agent
    assert team_plan(world, by_kind["country"])[-1][0].startswith("country of")  # no comparison


def test_the_comparer_demo_is_a_well_formed_episode():
    tok = train_tokenizer(["born first: Kir Nai 1971, Ana Bo 1968 compare same"], 300)
    text = tok.decode(comparer_demo(tok, "born first: Kir Nai 1971, Ana Bo 1968").token_ids)
    call, result = text.split("<tool_response>")[0], text.split("</tool_response>")[1]
    assert parse_subagent_turn(call.split("\n", 1)[1]).tool() == ("compare", "1971 1968")
    assert parse_subagent_turn(result).content == "Ana Bo"


def test_each_sub_agent_role_aligns_its_own_episodes():
    tr_ = Transcript([1], [0.0], [0], 1)
    # one query, K = 2: rollout 0 delegated two lookups and a comparison, rollout 1 one lookup
    dels = [
        [
            Delegation("birth year of A", "1", "a", role="searcher"),
            Delegation("birth year of B", "2", "b", role="searcher"),
            Delegation("born first: A 1, B 2", "A", "c", role="comparer"),
        ],
        [Delegation("birth year of A", "1", "d", role="searcher")],
    ]
    per_rollout = [Rollout(tr_, d).episodes_by_role() for d in dels]
    assert per_rollout == [{"searcher": ["a", "b"], "comparer": ["c"]}, {"searcher": ["d"]}]
    tr = Transcript([1, 2], [0.0, -1.0], [0, 1], 1)
    eps = {e: Episode(tr, True, 1.0) for e in "abcd"}

    def samples_of(role):
        query = CalleeQuery("q0", [r.get(role, []) for r in per_rollout], [1.0, 0.0])
        return aligned_samples(
            role,
            [query],
            slots=2,
            mode="duplicate_drop",
            seed_of=lambda _q: 0,
            fetch=lambda ids: {e: eps[e] for e in ids},
            reward=subagent_outcome_reward,
        )[0]

    searcher, comparer = samples_of("searcher"), samples_of("comparer")
    assert [s.episode_id for s in searcher] == ["a", "b", "d", "d"]
    assert [s.episode_id for s in comparer] == [
        "c"
    ] * 4  # K·D = 4: rollout 1 made none and draws from the query's pool
    assert [s.role for s in searcher] == ["searcher"] * 4 and [s.group for s in searcher] == ["q0"] * 4
    assert [s.reward for s in searcher] == pytest.approx([1.0, 1.0, 0.6, 0.6])  # rollout 1's planner failed
    assert {s.role for s in comparer} == {"comparer"}
