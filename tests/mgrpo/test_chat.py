"""Chat-template agents: Hermes tool calls parsed, tool results inserted as the template renders them,
and token-exact trajectories — every turn's prompt extends the previous prompt and sample id for id,
for each template, even when the sampled ids are not how the tokenizer would encode their text."""

from __future__ import annotations

import json

import pytest
import torch

from mgrpo.agents.chat import ChatAgent, ChatFormat, parse_hermes, retokenize_drift, tool_schema
from mgrpo.agents.format import FormatError
from mgrpo.engines.base import Sample, SamplingParams
from mgrpo.engines.hf import HFEngine
from mgrpo.models import build_model, token_logprobs
from tests.mgrpo.chat_models import TEMPLATES, chat_tokenizer

TOOLS = [
    tool_schema("search", "Search the corpus", "query"),
    tool_schema("open", "Open a document", "doc_id"),
]


def test_parse_hermes():
    content, calls = parse_hermes(
        '<think>x</think><tool_call>\n{"name": "search", "arguments": {"query": "Kir"}}\n</tool_call>'
    )
    assert content == "<think>x</think>" and [(c.name, c.arguments) for c in calls] == [
        ("search", {"query": "Kir"})
    ]
    assert parse_hermes("Lotham") == ("Lotham", [])
    for bad in (
        '<tool_call>{"name": "search"</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "s", "arguments": "Kir"}</tool_call>',
    ):
        with pytest.raises(FormatError):
            parse_hermes(bad)


class ScriptedEngine:
    """Stands in for a model's sampling (the loop, not the model, is under test): returns scripted
    turns encoded one character at a time — ids a policy may well sample, but not the ids the
    tokenizer gives their text — and records every prompt it was given."""

    shares_weights = True
    weights_version = 0

    def __init__(self, tokenizer, turns):
        self.tok, self.turns, self.prompts = tokenizer, list(turns), []

    def generate(self, prompts, params: SamplingParams):
        (prompt,) = prompts
        self.prompts.append(list(prompt))
        text = self.turns.pop(0)
        ids = [i for ch in text for i in self.tok.encode(ch, add_special_tokens=False)] + [
            self.tok.eos_token_id
        ]
        return [Sample(ids, [-0.5] * len(ids), "stop", str(self.tok.decode(ids, skip_special_tokens=False)))]


TURNS = [
    '<think>find the city</think><tool_call>{"name": "search", "arguments": {"query": "Kir Naibram"}}</tool_call>',
    '<tool_call>{"name": "open", "arguments": {"doc_id": "d12"}}</tool_call>',
    "<think>d12 says Lotham</think>Lotham",
]


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_turns_extend_the_previous_ids_exactly(template):
    tok = chat_tokenizer(TEMPLATES[template])
    fmt = ChatFormat(tok, TOOLS, terminal="result")
    engine = ScriptedEngine(tok, TURNS)
    calls = []

    def call(name, arguments):
        calls.append((name, arguments))
        return {"search": "d12 Kir Naibram", "open": "Kir Naibram was born in Lotham."}[name]

    tr = ChatAgent(engine, fmt, call).run("Where was Kir Naibram born?")
    assert tr.format_ok and tr.final == "Lotham" and tr.finish == "result"
    assert calls == [("search", {"query": "Kir Naibram"}), ("open", {"doc_id": "d12"})]
    assert engine.prompts[0] == fmt.prompt_ids("Where was Kir Naibram born?")
    sampled = [
        [t for t, m in zip(tr.token_ids[a:b], tr.mask[a:b], strict=True) if m] for a, b in _turn_spans(tr)
    ]
    for n in range(
        len(engine.prompts) - 1
    ):  # turn n+1's prompt = turn n's prompt + its sample + the tool result
        grown = engine.prompts[n] + sampled[n]
        assert engine.prompts[n + 1][: len(grown)] == grown, f"turn {n + 1} does not extend turn {n}"
    assert tr.token_ids == engine.prompts[-1] + sampled[-1]
    inserted = [
        t for t, m in zip(tr.token_ids[tr.prompt_len :], tr.mask[tr.prompt_len :], strict=True) if not m
    ]
    assert "<tool_response>\nd12 Kir Naibram\n</tool_response>" in tok.decode(
        inserted, skip_special_tokens=False
    )
    assert sum(tr.mask) == sum(len(s) for s in sampled) and tr.logp.count(-0.5) == sum(tr.mask)
    # what a loop that re-tokenised the turns would have trained on is not what was sampled
    assert retokenize_drift(fmt, tr)


def test_a_retokenising_loop_fails_the_prefix_check():
    """The planted bug: rebuild each prompt by rendering the conversation and tokenising it. Under
    the Qwen3-style template (earlier thinking dropped) the next prompt no longer extends the last."""
    tok = chat_tokenizer(TEMPLATES["qwen3"])
    fmt = ChatFormat(tok, TOOLS)
    sample_ids = [i for ch in TURNS[0] for i in tok.encode(ch, add_special_tokens=False)] + [tok.eos_token_id]
    first = fmt.prompt_ids("Where was Kir Naibram born?")
    messages = [
        {"role": "user", "content": "Where was Kir Naibram born?"},
        {"role": "assistant", "content": TURNS[0]},
        {"role": "tool", "content": "d12 Kir Naibram"},
        {"role": "user", "content": "go on"},
    ]
    rerendered = fmt.encode(fmt.render(messages, generation_prompt=True))
    assert rerendered[: len(first) + len(sample_ids)] != first + sample_ids


def test_thinking_kept_or_stripped():
    tok = chat_tokenizer()
    assert ChatFormat(tok, []).parse("<think>a</think>Lotham<|im_end|>").content == "Lotham"
    assert (
        ChatFormat(tok, [], keep_thinking=True).parse("<think>a</think>Lotham<|im_end|>").content
        == "<think>a</think>Lotham"
    )
    with pytest.raises(FormatError):
        ChatFormat(tok, []).parse("<think>only thoughts</think><|im_end|>")
    with pytest.raises(ValueError, match="no chat template"):
        ChatFormat(chat_tokenizer(template=None), [])


def test_a_random_chat_model_through_the_real_engine():
    """The real `hf` engine on a random tiny chat model: the episode ends (an answer or a format
    error, never a crash), and the recorded log-probs are a teacher-forced pass's."""
    tok = chat_tokenizer()
    model = build_model("tiny", tok, seed=3).eval()
    engine = HFEngine(model, tok, max_batch=8)
    try:
        agent = ChatAgent(
            engine, ChatFormat(tok, TOOLS), lambda n, a: "no results", max_new_tokens_per_turn=24
        )
        for _ in range(3):
            tr = agent.run("Where was Kir Naibram born?")
            assert tr.finish in ("answer", "format_error", "max_turns") and len(tr.mask) == len(tr.token_ids)
            ids = torch.tensor([tr.token_ids])
            with torch.no_grad():
                ref = token_logprobs(model, ids, torch.ones_like(ids))[0]
            gen = [t - 1 for t, m in enumerate(tr.mask) if m]
            assert torch.allclose(torch.tensor([tr.logp[t + 1] for t in gen]), ref[gen], atol=1e-4)
    finally:
        engine.close()


def _turn_spans(tr):
    """(start, end) of each sampled turn in the transcript."""
    spans, i = [], tr.prompt_len
    while i < len(tr.mask):
        j = i
        while j < len(tr.mask) and tr.mask[j] == tr.mask[i]:
            j += 1
        if tr.mask[i]:
            spans.append((i, j))
        i = j
    return spans


def test_tool_results_as_the_template_renders_them():
    for template in TEMPLATES.values():
        tok = chat_tokenizer(template)
        ids = ChatFormat(tok, TOOLS).tool_result_ids([("search", "d1 A"), ("open", json.dumps({"x": 1}))])
        assert tok.decode(ids, skip_special_tokens=False) == (
            '\n<|im_start|>user\n<tool_response>\nd1 A\n</tool_response>\n<tool_response>\n{"x": 1}\n'
            "</tool_response><|im_end|>\n<|im_start|>assistant\n"
        )
