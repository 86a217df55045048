"""The `judge` reward: an LLM the job serves grades each final answer against its reference.

The root role's trainer loads the judge's folder (`reward.judge_path`: any HF causal LM, with its
chat template when it has one) once per job, frozen, on the trainer's device, and puts
`reward.judge_prompt` to it for every item. The reward is the judge's probability of its yes-token
against its no-token as the first token of its reply,

    r = p(yes) / (p(yes) + p(no)) = sigmoid(logit_yes − logit_no),

so it lies in [0, 1] by construction and is deterministic (one forward pass, no sampling), batched
over the step's items. The two tokens are the first tokens of "yes" and "no" in the judge's
tokenizer; a tokenizer that starts both alike cannot judge and is refused when the job starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from mgrpo.agents.chat import ChatFormat, is_chat_model
from mgrpo.models import load, place


class Item(Protocol):
    """What the judge reads of a scored item (`mgrpo.scoring.Item`)."""

    @property
    def query(self) -> str: ...

    @property
    def answer(self) -> str: ...

    @property
    def reference(self) -> str: ...


class Judge:
    def __init__(
        self,
        path: str,
        prompt: str,
        *,
        device: torch.device | str = "cpu",
        batch_size: int = 16,
        max_prompt_tokens: int = 1024,
    ) -> None:
        try:
            self.model, self.tok = load(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"reward.judge_path: {exc}") from None
        place(self.model, device).eval()
        self.model.requires_grad_(False)
        self.prompt, self.batch_size, self.max_prompt_tokens = prompt, batch_size, max_prompt_tokens
        self.chat = ChatFormat(self.tok, []) if is_chat_model(self.tok) else None
        self.yes, self.no = self._first_token("yes"), self._first_token("no")
        if self.yes == self.no:
            raise ValueError(
                f"reward.judge_path: the judge's tokenizer starts 'yes' and 'no' with the same token ({self.yes}); it cannot give a verdict"
            )
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        if pad is None:
            raise ValueError("reward.judge_path: the judge's tokenizer has neither a pad nor an eos token")
        self.pad = int(pad)

    def _first_token(self, word: str) -> int:
        ids = self.tok.encode(word, add_special_tokens=False)
        if not ids:
            raise ValueError(f"reward.judge_path: the judge's tokenizer encodes {word!r} as nothing")
        return int(ids[0])

    def prompt_ids(self, item: Item) -> list[int]:
        """The ids the judge reads before its reply (the user turn and generation prompt of its chat
        template, or the plain text and a newline); cut from the left to `max_prompt_tokens`."""
        text = self.prompt.format(query=item.query, reference=item.reference, answer=item.answer)
        ids = (
            self.chat.prompt_ids(text)
            if self.chat
            else list(self.tok.encode(text + "\n", add_special_tokens=False))
        )
        return ids[-self.max_prompt_tokens :]

    @torch.no_grad()
    def __call__(self, items: Sequence[Item]) -> list[float]:
        out: list[float] = []
        device = next(self.model.parameters()).device
        for start in range(0, len(items), self.batch_size):
            rows = [self.prompt_ids(i) for i in items[start : start + self.batch_size]]
            width = max(len(r) for r in rows)
            ids = torch.tensor([[self.pad] * (width - len(r)) + r for r in rows], device=device)
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: each row counts from its first id
            logits = (
                self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()
            )
            out += torch.sigmoid(logits[:, self.yes] - logits[:, self.no]).tolist()
        return out
