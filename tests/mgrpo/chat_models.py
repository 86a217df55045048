"""Tiny random chat models for the tests: a byte-level BPE tokenizer with ChatML tokens and a chat
template in the Qwen/Hermes tool-call format, written for them (no hub is reachable). Two templates:
`QWEN25` renders every turn as written; `QWEN3` drops the thinking of assistant turns before the
last user message (as Qwen3's does), which breaks any loop that re-renders the conversation."""

from __future__ import annotations

from pathlib import Path

import torch

from mgrpo.models import build_model, save, train_tokenizer

_TOOLS = """{%- if tools %}{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n' }}{%- endif %}
{{- 'You can call these tools:\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\nCall one as <tool_call>{"name": "<name>", "arguments": {...}}</tool_call>.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}"""

_TURNS = """{%- for m in messages %}{%- if m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- elif m.role != 'system' %}{%- set content = m.content %}CONTENT
{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

QWEN25 = _TOOLS + _TURNS.replace("CONTENT", "")
_LAST_USER = "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
QWEN3 = (
    _LAST_USER
    + _TOOLS
    + _TURNS.replace(
        "CONTENT",
        "{%- if m.role == 'assistant' and loop.index0 < ns.last and '</think>' in content %}"
        "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}",
    )
)
TEMPLATES = {"qwen2.5": QWEN25, "qwen3": QWEN3}

TEXTS = [
    '<tool_call>{"name": "search", "arguments": {"query": "birth city of Kir Naibram"}}</tool_call>',
    "<think>look it up</think>The answer is Lotham. Kir Naibram was born in 1971 in Lotham.",
    "You can call these tools: search, open, calculator. user assistant system tool_response",
] * 20


def chat_tokenizer(template: str = QWEN25, vocab_size: int = 400):
    tok = train_tokenizer(TEXTS, vocab_size, extra_special=("<|im_start|>", "<|im_end|>"), eos="<|im_end|>")
    tok.chat_template = template
    return tok


def chat_model_folder(path: Path, template: str = QWEN25, *, seed: int = 0, eos_logit: float = 0.0) -> Path:
    """A random tiny chat model saved as an HF folder (what a job's `roles.<r>.model.path` names).
    `eos_logit` > 0 points the end-of-turn token's (tied) embedding along the model's mean final
    hidden state, so a typical position scores it about that high: the random model then ends most
    turns within a few dozen tokens, as a chat model does, instead of running to its token budget."""
    tok = chat_tokenizer(template)
    model = build_model("tiny", tok, seed=seed)
    if eos_logit:
        with torch.no_grad():
            h = (
                model.model(input_ids=torch.tensor([tok.encode(" ".join(TEXTS[:3]))]))
                .last_hidden_state[0]
                .mean(0)
            )
            model.model.embed_tokens.weight[tok.eos_token_id] = h / h.dot(h) * eos_logit
    return save(model, tok, path)
