"""Parser, loop and masks. `ScriptedEngine` replays hand-written turns in place of a model so the
exact expected token layout and masks can be written down; the real engine is tested elsewhere."""

import pytest

from mgrpo.agents.agents import Delegation, PlannerAgent, SubAgent
from mgrpo.agents.format import FormatError, parse_planner_turn, parse_subagent_turn, strip_tags
from mgrpo.engines.base import Sample


class ScriptedEngine:
    def __init__(self, tokenizer, turns, finish="stop"):
        self.tokenizer, self.turns, self.finish, self.prompts = tokenizer, list(turns), finish, []

    def generate(self, prompts, params):
        self.prompts.append(list(prompts[0]))
        text = self.turns.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: params.max_new_tokens]
        finish = self.finish if len(ids) < params.max_new_tokens or self.finish != "stop" else "length"
        return [Sample(ids, [-0.5] * len(ids), finish, self.tokenizer.decode(ids))]

    def update_weights(self, path):  # pragma: no cover
        pass


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize(
    ("text", "kind", "content"),
    [
        ("<delegate>birth city of Kir Naibram</delegate>", "delegate", "birth city of Kir Naibram"),
        ("<think>two hops</think><answer> Seibrukia </answer>", "answer", "Seibrukia"),
        ("  <answer>no</answer>\n", "answer", "no"),
    ],
)
def test_planner_parser_accepts(text, kind, content):
    a = parse_planner_turn(text)
    assert (a.kind, a.content) == (kind, content)


@pytest.mark.parametrize(
    "text",
    [
        "birth city of X",  # no tags
        "<delegate>x</answer>",  # mismatched
        "<delegate></delegate>",  # empty
        "hello <answer>x</answer>",  # text outside the tags
        "<answer>x</answer><answer>y</answer>",  # two actions
        "<delegate>a <answer>b</answer></delegate>",  # nested tag
        "<tool_call>search x</tool_call>",  # the other agent's format
    ],
)
def test_planner_parser_rejects(text):
    with pytest.raises(FormatError):
        parse_planner_turn(text)


def test_subagent_parser():
    a = parse_subagent_turn("<tool_call>search Kir Naibram</tool_call>")
    assert a.tool() == ("search", "Kir Naibram") and not a.terminal
    assert parse_subagent_turn("<result>Dodus</result>").terminal
    with pytest.raises(FormatError, match="argument"):
        parse_subagent_turn("<tool_call>search</tool_call>")
    assert strip_tags("a <result>b</result> c") == "a  b  c"


def test_subagent_transcript_masks_are_exact(tokenizer):
    turns = ["<tool_call>search Kir</tool_call>", "<result>Dodus</result>"]
    engine = ScriptedEngine(tokenizer, turns)
    agent = SubAgent(engine, tokenizer, lambda name, arg: f"d1 {arg} <result>x</result>")
    tr = agent.run("birth city of Kir")
    prompt = enc(tokenizer, "T: birth city of Kir\n")
    g1 = enc(tokenizer, turns[0])
    obs = enc(tokenizer, "<tool_response>d1 Kir  x</tool_response>")  # injected tags stripped
    g2 = enc(tokenizer, turns[1])
    assert tr.token_ids == prompt + g1 + obs + g2
    assert tr.mask == [0] * len(prompt) + [1] * len(g1) + [0] * len(obs) + [1] * len(g2)
    assert tr.logp == [0.0] * len(prompt) + [-0.5] * len(g1) + [0.0] * len(obs) + [-0.5] * len(g2)
    assert (tr.format_ok, tr.finish, tr.final) == (True, "result", "Dodus")
    assert engine.prompts[1] == prompt + g1 + obs  # the second turn saw the tool's answer


def test_planner_delegates_and_records_episodes(tokenizer):
    turns = [
        "<delegate>birth city of Kir</delegate>",
        "<delegate>country of Dodus</delegate>",
        "<answer>Seibrukia</answer>",
    ]
    calls = []

    def delegate(subtask):
        calls.append(subtask)
        return Delegation(
            subtask, {"birth city of Kir": "Dodus"}.get(subtask, "Seibrukia"), f"ep{len(calls)}"
        )

    rollout = PlannerAgent(ScriptedEngine(tokenizer, turns), tokenizer, delegate).rollout(
        "In which country was Kir born?"
    )
    tr = rollout.transcript
    assert calls == ["birth city of Kir", "country of Dodus"]
    assert rollout.n_delegations == 2 and [d.episode_id for d in rollout.delegations] == ["ep1", "ep2"]
    res1 = enc(tokenizer, "<delegate_result>Dodus</delegate_result>")
    start = len(enc(tokenizer, "Q: In which country was Kir born?\n")) + len(enc(tokenizer, turns[0]))
    assert tr.token_ids[start : start + len(res1)] == res1
    assert tr.mask[start : start + len(res1)] == [0] * len(res1)  # delegated results are never trained
    assert sum(tr.mask) == sum(len(enc(tokenizer, t)) for t in turns)
    assert tr.final == "Seibrukia" and tr.format_ok


@pytest.mark.parametrize(
    ("turns", "finish", "why"),
    [
        (["I think it is Dodus"], "stop", "format_error"),  # malformed
        (["<delegate>birth city of Kir"], "length", "format_error"),  # ran out of tokens
        (["<delegate>a</delegate>"] * 6, "stop", "max_turns"),  # never answers
    ],
)
def test_failures_end_the_episode_without_crashing(tokenizer, turns, finish, why):
    engine = ScriptedEngine(tokenizer, turns, finish=finish)
    rollout = PlannerAgent(engine, tokenizer, lambda s: Delegation(s, "x")).rollout("q?")
    assert not rollout.transcript.format_ok and rollout.transcript.finish == why


def test_context_budget(tokenizer):
    from mgrpo.agents.agents import AgentLimits

    engine = ScriptedEngine(tokenizer, ["<delegate>birth city of Kir</delegate>"] * 6)
    limits = AgentLimits(max_turns=6, max_context_tokens=60, max_new_tokens_per_turn=48)
    rollout = PlannerAgent(engine, tokenizer, lambda s: Delegation(s, "Dodus " * 5), limits=limits).rollout(
        "q?"
    )
    assert not rollout.transcript.format_ok and len(rollout.transcript) <= 60 + 48
