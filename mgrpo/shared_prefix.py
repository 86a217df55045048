"""Teacher-forced log-probs with each shared prompt run once: the update's twin of the rollout engine's
forked prefill (issue 18).

The K rollouts of one query start with the same prompt, and every one of its tokens comes before the
first trained token. `shared_prefix_logprobs` runs each distinct prompt through the model once, with
its K/V kept (`DynamicCache`, still in the autograd graph), hands every row a view of its prompt's K/V,
and runs only the rows' own tokens after it. The result equals `token_logprobs` (to float tolerance)
on every target from the first trained token on, and is 0 before it — where the loss mask is 0. The
prompt's gradient is the sum of its rows' (the cache rows are gathered, so autograd adds them up).

Any HF causal LM whose layers all attend to the full context takes this path (`shares_prefixes`); a
sliding window would cut the cached prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from transformers import DynamicCache, PreTrainedModel

from mgrpo.models import cache_kwargs, target_logprobs, token_logprobs


def shares_prefixes(model: Any) -> str | None:
    """Why `model` cannot take the shared-prefix forward (None when it can)."""
    if not isinstance(model, PreTrainedModel):
        return "not a Hugging Face causal LM"
    if isinstance(model, FSDPModule):
        return "sharded by FSDP2 (two forwards before one backward are not tried there)"
    cfg = model.config
    types = getattr(cfg, "layer_types", None)
    if getattr(cfg, "use_sliding_window", False) or (types is None and getattr(cfg, "sliding_window", None)):
        return "sliding-window attention"
    if any(t != "full_attention" for t in types or ()):
        return "layers that do not attend to the full context"
    return None


def prefix_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[list[int], list[int]]:
    """Rows grouped by their prompt: the tokens before their first trained token (or all but their
    last, for a row without one). Returns (group of each row, in order of first appearance; prompt
    length of each group)."""
    lengths = attention_mask.sum(-1).tolist()
    trained = loss_mask.bool()
    firsts = (trained.float().argmax(-1) + 1).tolist()  # column t of loss_mask scores token t + 1
    any_trained = trained.any(-1).tolist()
    keys: dict[tuple[int, ...], int] = {}
    group_of: list[int] = []
    prompt_len: list[int] = []
    for row, (n, first, has) in enumerate(zip(lengths, firsts, any_trained, strict=True)):
        p = max(min(first if has else n - 1, n - 1), 1)
        key = tuple(input_ids[row, :p].tolist())
        if key not in keys:
            keys[key] = len(keys)
            prompt_len.append(p)
        group_of.append(keys[key])
    return group_of, prompt_len


def shared_prefix_logprobs(
    model: PreTrainedModel | Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """`token_logprobs` of a right-padded batch (B, T) → (B, T − 1), each distinct prompt run once
    (module docstring); columns before a row's first trained target are 0. A batch whose prompts are
    all different (or with a row of one token) takes `token_logprobs` itself."""
    group_of, prompt_len = prefix_groups(input_ids, attention_mask, loss_mask)
    lengths = attention_mask.sum(-1)
    if len(prompt_len) == len(group_of) or int(lengths.min()) < 2:
        return token_logprobs(model, input_ids, attention_mask, temperature=temperature)
    dev, n_rows = input_ids.device, input_ids.shape[0]
    first_row = {g: r for r, g in reversed(list(enumerate(group_of)))}
    width = max(prompt_len)
    pre_ids = input_ids.new_zeros((len(prompt_len), width))
    pre_mask = attention_mask.new_zeros((len(prompt_len), width))
    for g, p in enumerate(prompt_len):
        pre_ids[g, :p] = input_ids[first_row[g], :p]
        pre_mask[g, :p] = 1
    positions = torch.arange(width, device=dev).expand(len(prompt_len), -1)
    cache = DynamicCache(config=getattr(model, "config", None))
    pre = model(
        input_ids=pre_ids,
        attention_mask=pre_mask,
        position_ids=positions,
        use_cache=True,
        **cache_kwargs(model, cache),
    )
    rows = torch.tensor(group_of, device=dev)
    starts = torch.tensor(prompt_len, device=dev)[rows]  # (B,) each row's first own token
    last = pre.logits[torch.arange(len(prompt_len), device=dev), torch.tensor(prompt_len, device=dev) - 1]
    cache.batch_select_indices(rows)  # every row reads its prompt's K/V (gathered: their gradients add up)
    own = int((lengths - starts).max())
    cols = starts.unsqueeze(-1) + torch.arange(own, device=dev)  # (B, S) the rows' own tokens' columns
    inside = cols < lengths.unsqueeze(-1)
    own_ids = input_ids.gather(1, cols.clamp(max=input_ids.shape[1] - 1)) * inside
    mask = torch.cat([pre_mask[rows], inside.to(attention_mask.dtype)], dim=1)  # prompt (padded) + own
    out = model(input_ids=own_ids, attention_mask=mask, position_ids=cols, **cache_kwargs(model, cache))
    logits = torch.cat([last[rows].unsqueeze(1), out.logits[:, :-1]], dim=1)  # (B, S, V): predict own_ids
    logp = target_logprobs(logits, own_ids, temperature)  # (B, S)
    # column t of the result scores token t + 1: a row's own token j (at column starts + j) goes to starts + j − 1
    full = logp.new_zeros((n_rows, input_ids.shape[1] - 1 + own))
    full = full.scatter(1, cols - 1, logp * inside)
    return full[:, : input_ids.shape[1] - 1]
