"""The `hf` engine's decoders: the rows it is generating, their KV cache, and one forward per step.

A decoder holds an ordered set of rows. `admit(prompts)` prefills new rows (appended at the end) and
returns their next-token logits; `step(tokens)` feeds one token to every row and returns every row's
logits; `keep(rows)` retires all other rows. The engine schedules; a decoder only computes.

- `StaticDecoder` (`mgrpo.engines.static_decoder`), the default for Llama-family models: a plain-torch
  forward over a preallocated KV cache, with prefix reuse (forked group prompts, an episode's next
  turn prefilling only its new tokens).
- `DynamicDecoder` (any other causal LM, or `static=False`: `MGRPO_HF_STATIC_CACHE=0`): the model's
  own HF forward with a `DynamicCache`, rows left-padded to one length, joined by padding and
  concatenating, and trimmed when long rows retire.

Both give log-probs equal (to float tolerance) to a teacher-forced pass of the model
(`tests/mgrpo/test_decoders.py`).
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from mgrpo.engines.static_decoder import StaticDecoder, static_unsupported
from mgrpo.models import cache_kwargs

__all__ = ["Decoder", "DynamicDecoder", "StaticDecoder", "make_decoder", "static_unsupported"]


class Decoder(Protocol):
    model: PreTrainedModel
    prefilled_tokens: int  # prompt tokens run through the model (the rest came from a cache)

    def admit(self, prompts: list[list[int]]) -> torch.Tensor:
        """Prefill new rows (appended after the current ones): their next-token logits (n, V)."""
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed tokens (B,) to the rows in order: logits (B, V)."""
        ...

    def keep(self, rows: list[int]) -> None:
        """Retire every row not listed (indices in the current order, ascending)."""
        ...

    def __len__(self) -> int: ...


def make_decoder(model: PreTrainedModel, pad_id: int, *, static: bool = True) -> Decoder:
    """The static decoder where the model supports it (`static_unsupported`), else the dynamic one."""
    if static and static_unsupported(model) is None:
        return StaticDecoder(model)
    return DynamicDecoder(model, pad_id)


class DynamicDecoder:
    """See the module docstring: any HF causal LM, through its own forward and a `DynamicCache`."""

    def __init__(self, model: PreTrainedModel, pad_id: int) -> None:
        self.model, self.pad_id = model, pad_id
        self.prefilled_tokens = 0
        self.cache: DynamicCache | None = None
        self.attn = torch.zeros((0, 0), dtype=torch.long)  # (B, L) 1 on real tokens, left-padded
        self.pos = torch.zeros(0, dtype=torch.long)  # (B,) the position of each row's next token

    def __len__(self) -> int:
        return int(self.attn.shape[0])

    @torch.no_grad()
    def admit(self, prompts: list[list[int]]) -> torch.Tensor:
        n, width = len(prompts), max(len(p) for p in prompts)
        self.prefilled_tokens += sum(len(p) for p in prompts)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p) :] = torch.tensor(p)
            attn[i, width - len(p) :] = 1
        dev = self.model.device
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        cache = DynamicCache()
        logits = self._forward(ids, attn, pos, cache)
        if self.cache is None or len(self) == 0:
            self.cache, self.attn, self.pos = cache, attn, pos[:, -1] + 1
        else:
            self._join(cache, attn, pos[:, -1] + 1)
        return logits

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.cache is not None
        self.attn = torch.cat([self.attn, self.attn.new_ones((len(self), 1))], dim=-1)
        logits = self._forward(tokens.unsqueeze(-1), self.attn, self.pos.unsqueeze(-1), self.cache)
        self.pos = self.pos + 1
        return logits

    def keep(self, rows: list[int]) -> None:
        if len(rows) == len(self):
            return
        if not rows:
            self.cache, self.attn, self.pos = None, self.attn[:0, :0], self.pos[:0]
            return
        assert self.cache is not None
        idx = torch.tensor(rows, device=self.attn.device)
        self.cache.batch_select_indices(idx)
        self.attn, self.pos = self.attn[idx], self.pos[idx]
        lead = int(self.attn.any(0).int().argmax())  # columns that are padding in every row
        if lead > 0:
            self.attn = self.attn[:, lead:]
            for layer in _layers(self.cache):
                layer.keys, layer.values = _t(layer.keys)[:, :, lead:], _t(layer.values)[:, :, lead:]

    def _forward(
        self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **cache_kwargs(self.model, cache),
        )
        return out.logits[:, -1].float()  # (B, V)

    def _join(self, cache: DynamicCache, attn: torch.Tensor, pos: torch.Tensor) -> None:
        """Append rows, both sides left-padded to the longer cache."""
        assert self.cache is not None
        width = max(self.attn.shape[1], attn.shape[1])

        def pad(t: torch.Tensor, dim_from_end: int) -> torch.Tensor:  # left-pad the sequence dim
            missing = width - t.shape[-dim_from_end]
            return t if missing == 0 else F.pad(t, (0, 0) * (dim_from_end - 1) + (missing, 0))

        for la, lb in zip(_layers(self.cache), _layers(cache), strict=True):
            la.keys = torch.cat([pad(_t(la.keys), 2), pad(_t(lb.keys), 2)])  # (B, H, L, D)
            la.values = torch.cat([pad(_t(la.values), 2), pad(_t(lb.values), 2)])
        self.attn = torch.cat([pad(self.attn, 1), pad(attn, 1)])
        self.pos = torch.cat([self.pos, pos])


def _t(x: torch.Tensor | None) -> torch.Tensor:
    assert x is not None, "a cache layer without tensors: every layer is filled by the prefill"
    return x


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The per-layer K/V of a `DynamicCache()` (plain `DynamicLayer`s)."""
    return [cast(DynamicLayer, layer) for layer in cache.layers]
