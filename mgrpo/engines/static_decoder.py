"""The `hf` engine's static decoder (`mgrpo.engines.decoders` has the interface): Llama-family models
(`qwen3`, `qwen2`, `llama`) through a plain-torch forward of their own weights over a preallocated KV
cache, with prefix reuse.

**Cache.** Row slots of one `(layers, slots, kv_heads, length, head_dim)` tensor, grown by doubling.
A new token's K/V is written in place at its row's length; a step's attention reads a view of the
first `hi` slots with a per-slot length mask; free slots below `hi` are refilled first and the rows
are compacted when more than half of `hi` is idle.

**Prefix reuse.** Prompts equal within one admission (the K rollouts of a group, the G outputs of a
MarsRL input) are prefilled once and their cache rows forked. A retired row's slot is *parked* with
its cache: a later prompt that extends it (the episode's next turn) takes the slot over and prefills
only its new tokens; a prompt sharing a prefix with a running row (a question template) copies that
prefix. Parked slots grow the cache up to `PARK_BYTES`, then the oldest is taken; all are dropped once
any weight changed (their K/V belong to the old weights).

**Forward.** q/k/v and gate/up fused into one matmul each (fused again when any weight changed),
one RoPE for q and k from the model's own rotary module (any scaling it implements), `F.rms_norm`,
and attention as batched matmuls. Measured on 2 cores (`bench/engine_bench.py`): docs/results.md,
"Decode path".
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

STATIC_MODEL_TYPES = ("qwen3", "qwen2", "llama")
PARK_BYTES = 256 * 2**20  # the K/V cache grows (doubling) up to this size to keep retired rows parked
MIN_REUSE = 8  # the shortest cached prefix a new prompt reuses (and the length of the slot index's key)


def static_unsupported(model: PreTrainedModel) -> str | None:
    """Why `StaticDecoder` cannot run `model` (None when it can)."""
    cfg = model.config
    if cfg.model_type not in STATIC_MODEL_TYPES:
        return f"model_type {cfg.model_type!r} is not one of {STATIC_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} is not silu"
    if getattr(cfg, "use_sliding_window", False) or any(
        t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()
    ):
        return "sliding-window attention"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    return None


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """The HF RMSNorm as one fused op (bit-equal to HF's in float32; half the time of its five ops)."""
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def _linear(x: torch.Tensor, layer: Any) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def _fuse(*layers: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight and bias of one linear layer doing the work of `layers` (q, k, v; gate, up)."""
    weight = torch.cat([layer.weight.detach() for layer in layers])
    if all(layer.bias is None for layer in layers):
        return weight, None
    return weight, torch.cat(
        [
            layer.bias.detach() if layer.bias is not None else layer.weight.new_zeros(layer.weight.shape[0])
            for layer in layers
        ]
    )


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention of (n, H, T, D) queries (already scaled) over (n, KV, W, D) keys and
    values, with an additive (n, 1, 1, T, W) mask (0 or -inf): (n, H, T, D). Plain batched matmuls: for a
    decode step's single query, torch's CPU flash-attention kernel measured 0.7 ms a layer here
    against ~0.2 ms for these."""
    n, heads, t, d = q.shape
    kv = k.shape[1]
    q = q.reshape(n, kv, heads // kv * t, d)  # the query heads of one KV head, as rows
    scores = torch.matmul(q, k.transpose(-1, -2)).view(n, kv, heads // kv, t, -1) + bias
    probs = torch.softmax(scores, dim=-1).view(n, kv, heads // kv * t, -1)
    return torch.matmul(probs, v).view(n, heads, t, d)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of `a` and `b`, at most `limit` (binary search on slices)."""
    lo, hi = 0, min(len(a), len(b), limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticDecoder:
    """See the module docstring. Reads the model's parameters at every call, so an update made in
    place (a trainer's optimizer step, `load_state_dict`) is seen by the next step."""

    def __init__(
        self, model: PreTrainedModel, *, slots: int = 8, length: int = 128, park_bytes: int = PARK_BYTES
    ) -> None:
        reason = static_unsupported(model)
        if reason is not None:
            raise ValueError(f"StaticDecoder cannot run this model: {reason}; use DynamicDecoder")
        self.model = model
        inner: Any = model.model  # HF's modules, read by attribute name (the Llama family's layout)
        self._embed: Any = inner.embed_tokens
        self._layers: list[Any] = list(inner.layers)
        self._norm, self._rotary = inner.norm, inner.rotary_emb
        self._head: Any = model.lm_head
        attn = self._layers[0].self_attn
        cfg = model.config
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = int(attn.head_dim)
        self.scaling = float(attn.scaling)
        self.has_qk_norm = hasattr(attn, "q_norm")
        self._qkv: list[tuple[torch.Tensor, torch.Tensor | None]] = []  # fused per layer by _sync_weights
        self._gate_up: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        w = self._embed.weight
        shape = (len(self._layers), slots, self.n_kv, length, self.head_dim)
        self.k = torch.zeros(shape, dtype=w.dtype, device=w.device)
        self.v = torch.zeros_like(self.k)
        self.tokens: list[list[int]] = [[] for _ in range(slots)]  # the tokens cached in each slot
        self.rows: list[int] = []  # row -> slot
        self._free = list(range(slots))  # a heap of empty slots: the lowest is taken first
        self._parked: OrderedDict[int, None] = OrderedDict()  # retired rows' slots, oldest first
        self._weights_seen: tuple[tuple[int, int], ...] = ()  # the parameters' ids and versions fused
        self._params: list[torch.Tensor] = []  # the parameters as last listed (at an admission)
        self.park_bytes = park_bytes  # the cache may grow to this size to keep retired rows parked
        self.forks = 0  # rows admitted by copying another row's prefill
        self.reused_tokens = 0  # prompt tokens taken from a parked row's cache instead of a prefill
        self.prefilled_tokens = 0

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def hi(self) -> int:
        """One past the highest slot in use: a step computes slots [0, hi)."""
        return max(self.rows) + 1 if self.rows else 0

    # ---- rows ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def admit(self, prompts: list[list[int]]) -> torch.Tensor:
        self._sync_weights()
        unique: dict[tuple[int, ...], int] = {}
        order = [unique.setdefault(tuple(p), len(unique)) for p in prompts]  # prompt -> its first row
        firsts = [list(p) for p in unique]
        by_start: dict[tuple[int, ...], list[int]] = {}  # slots holding a cache, by their first tokens
        for slot in [*self.rows, *self._parked]:
            if len(self.tokens[slot]) >= MIN_REUSE:
                by_start.setdefault(tuple(self.tokens[slot][:MIN_REUSE]), []).append(slot)
        lead = [self._reuse(p, by_start) for p in firsts]  # (slot, cached prefix length) per distinct prompt
        slots = []
        seen: set[int] = set()
        for u in order:
            slots.append(lead[u][0] if u not in seen else self._take())
            seen.add(u)
        self._reserve_length(
            max(st for _, st in lead) + max(len(p) - st for (_, st), p in zip(lead, firsts, strict=True))
        )
        logits = self._prefill(firsts, lead)
        for slot, u in zip(slots, order, strict=True):
            src = lead[u][0]
            if slot != src:  # a fork: copy the prefix's cache rows
                self._copy_prefix(src, slot, len(self.tokens[src]))
                self.forks += 1
        self.rows += slots
        return logits[order]

    def keep(self, rows: list[int]) -> None:
        """Retire the other rows; their slots are parked with their cache, for a later prompt that
        extends them (the next turn of an episode) until their room is needed."""
        kept = [self.rows[i] for i in rows]
        for slot in set(self.rows) - set(kept):
            self._park(slot)
        self.rows = kept
        if self.rows and 2 * len(self.rows) < self.hi:
            self._compact()

    def _reuse(self, prompt: list[int], by_start: dict[tuple[int, ...], list[int]]) -> tuple[int, int]:
        """A slot for `prompt` and how many of its first tokens are cached there already. The slot
        (running or parked) sharing the longest prefix with it (at least `MIN_REUSE` tokens, at most all
        but the last, whose logits are needed): a parked one is taken over, a running one's prefix is
        copied into an empty slot. Else an empty slot."""
        best, best_n = -1, MIN_REUSE - 1
        for slot in by_start.get(tuple(prompt[:MIN_REUSE]), ()):
            n = _common_prefix(self.tokens[slot], prompt, len(prompt) - 1)
            if n > best_n or (n == best_n and slot in self._parked):
                best, best_n = slot, n
        if best < 0:
            return self._take(), 0
        self.reused_tokens += best_n
        if best in self._parked:
            del self._parked[best]
            del self.tokens[best][best_n:]
            return best, best_n
        slot = self._take()
        self._copy_prefix(best, slot, best_n)
        return slot, best_n

    def _sync_weights(self, *, relist: bool = True) -> None:
        """Called before every forward. Once any parameter changed (in place, e.g. an optimizer step or a
        load: its `_version` moved; or replaced: its id), fuse the weights again and free every parked
        cache (their K/V belong to the old weights). A decode step (`relist=False`) checks the versions of
        the parameters listed at the last admission: walking the model's modules took 8 % of a step."""
        if relist or not self._params:
            self._params = list(self.model.parameters())
        seen = tuple((id(p), p._version) for p in self._params)
        if seen == self._weights_seen:
            return
        attns, mlps = [layer.self_attn for layer in self._layers], [layer.mlp for layer in self._layers]
        self._qkv = [_fuse(a.q_proj, a.k_proj, a.v_proj) for a in attns]
        self._gate_up = [_fuse(m.gate_proj, m.up_proj) for m in mlps]
        for slot in self._parked:
            self.tokens[slot] = []
            heapq.heappush(self._free, slot)
        self._parked.clear()
        self._weights_seen = seen

    def _take(self) -> int:
        """An empty slot: the lowest free one; else a new one (doubling) while the cache would stay
        within `park_bytes` or no slot is parked; else the oldest parked one."""
        grow_ok = 2 * (self.k.nbytes + self.v.nbytes) <= self.park_bytes
        if not self._free and self._parked and not grow_ok:
            slot = next(iter(self._parked))
            del self._parked[slot]
            self.tokens[slot] = []
            return slot
        if not self._free:
            self._grow(2 * self.k.shape[1], self.k.shape[3])
        return heapq.heappop(self._free)

    def _park(self, slot: int) -> None:
        if len(self.tokens[slot]) < MIN_REUSE:
            self.tokens[slot] = []
            heapq.heappush(self._free, slot)
            return
        self._parked[slot] = None

    def _compact(self) -> None:
        """Move every row into the lowest slots (their order kept), dropping parked caches there."""
        targets = range(len(self.rows))
        for slot in [s for s in self._parked if s in targets]:
            del self._parked[slot]
            self.tokens[slot] = []
        where = {}
        for target, slot in zip(targets, sorted(self.rows), strict=True):
            if slot != target:
                self._copy_prefix(slot, target, len(self.tokens[slot]))
                self.tokens[slot] = []
            where[slot] = target
        self.rows = [where[s] for s in self.rows]
        busy = set(self.rows) | set(self._parked)
        self._free = [s for s in range(self.k.shape[1]) if s not in busy]
        heapq.heapify(self._free)

    def _copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Slot `dst` holds the first `n` cached tokens of slot `src` (their K/V and ids)."""
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.tokens[dst] = self.tokens[src][:n]

    def _reserve_length(self, width: int) -> None:
        """Grow the cache (doubling) so every row can take `width` tokens, and one more each."""
        need = max([width, *(len(self.tokens[s]) + 1 for s in self.rows)])
        length = self.k.shape[3]
        while length < need:
            length *= 2
        if length != self.k.shape[3]:
            self._grow(self.k.shape[1], length)

    def _grow(self, slots: int, length: int) -> None:
        k = self.k.new_zeros((self.k.shape[0], slots, self.n_kv, length, self.head_dim))
        v = torch.zeros_like(k)
        old_slots, old_length = self.k.shape[1], self.k.shape[3]
        k[:, :old_slots, :, :old_length] = self.k
        v[:, :old_slots, :, :old_length] = self.v
        for s in range(old_slots, slots):
            heapq.heappush(self._free, s)
        self.tokens += [[] for _ in range(slots - old_slots)]
        self.k, self.v = k, v

    # ---- forward ------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self._sync_weights(relist=False)
        self._reserve_length(1)
        hi, dev = self.hi, self.k.device
        ids = torch.zeros((hi, 1), dtype=torch.long, device=dev)  # idle slots below hi compute on a pad
        slot_idx = torch.tensor(self.rows, device=dev)
        ids[slot_idx, 0] = tokens.to(dev)
        lens = torch.tensor([len(t) for t in self.tokens[:hi]], device=dev)  # where each slot's token goes
        width = max(len(self.tokens[s]) for s in self.rows) + 1
        mask = (torch.arange(width, device=dev) <= lens.unsqueeze(-1))[:, None, None, :]  # (hi, 1, 1, W)
        hidden = self._forward(ids, lens.unsqueeze(-1), mask, width, write=(slot_idx, lens[slot_idx]))
        for s, t in zip(self.rows, tokens.tolist(), strict=True):
            self.tokens[s].append(t)
        return self._logits(hidden[slot_idx, -1])

    def _prefill(self, prompts: list[list[int]], lead: list[tuple[int, int]]) -> torch.Tensor:
        """Each prompt's uncached tokens (right-padded) written after its cached prefix in its slot,
        attending to that prefix; the logits of each prompt's last token."""
        dev = self.k.device
        starts = [start for _, start in lead]
        rest = [p[start:] for p, start in zip(prompts, starts, strict=True)]
        n, t = len(rest), max(len(r) for r in rest)
        ids = torch.zeros((n, t), dtype=torch.long)
        for i, r in enumerate(rest):
            ids[i, : len(r)] = torch.tensor(r)
        pos = torch.tensor(starts, device=dev).unsqueeze(-1) + torch.arange(t, device=dev)  # (n, T)
        width = int(pos.max()) + 1
        mask = (torch.arange(width, device=dev) <= pos.unsqueeze(-1)).unsqueeze(1)  # (n, 1, T, W) causal
        slots = torch.tensor([slot for slot, _ in lead], device=dev)
        hidden = self._forward(ids.to(dev), pos, mask, width, write=(slots.unsqueeze(-1), pos), gather=slots)
        for (slot, _), p in zip(lead, prompts, strict=True):
            self.tokens[slot] = list(p)
        self.prefilled_tokens += sum(len(r) for r in rest)
        last = torch.tensor([len(r) - 1 for r in rest], device=dev)
        return self._logits(hidden[torch.arange(n, device=dev), last])

    def _forward(
        self,
        ids: torch.Tensor,  # (n, T)
        pos: torch.Tensor,  # (n, T) RoPE positions
        mask: torch.Tensor,  # (n, 1, T, W) True where a query may attend to a key
        width: int,
        *,
        write: tuple[torch.Tensor, torch.Tensor],  # (slots, positions) where the new K/V go
        gather: torch.Tensor | None = None,  # prefill: the rows' slots (else rows are slots 0..n-1)
    ) -> torch.Tensor:
        x = F.embedding(ids, self._embed.weight)
        cos, sin = self._rotary(x, pos)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (n, 1, T, D)
        bias = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~mask, float("-inf"))
        bias = bias.unsqueeze(1)  # (n, 1, 1, T, W): one mask for every layer and head
        n, t = ids.shape
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        for i, layer in enumerate(self._layers):
            attn = layer.self_attn
            h = _rms_norm(x, layer.input_layernorm)
            q, k, v = F.linear(h, *self._qkv[i]).split([q_dim, kv_dim, kv_dim], dim=-1)
            q, k = q.view(n, t, -1, self.head_dim), k.view(n, t, -1, self.head_dim)
            if self.has_qk_norm:
                q, k = _rms_norm(q, attn.q_norm), _rms_norm(k, attn.k_norm)
            qk = torch.cat([q, k], dim=2).transpose(1, 2)  # (n, H + KV, T, D): one rotation for both
            qk = qk * cos + _rotate_half(qk) * sin
            q, k = qk[:, : self.n_heads] * self.scaling, qk[:, self.n_heads :]
            v = v.view(n, t, -1, self.head_dim).transpose(1, 2)
            at = (i, write[0], slice(None), write[1])
            if gather is None:  # a decode step: only the rows write (idle slots keep what they hold)
                self.k[at], self.v[at] = k[write[0], :, 0], v[write[0], :, 0]
                keys, values = self.k[i, :n, :, :width], self.v[i, :n, :, :width]
            else:
                self.k[at], self.v[at] = k.transpose(1, 2), v.transpose(1, 2)
                keys, values = self.k[i, gather, :, :width], self.v[i, gather, :, :width]
            out = _attention(q, keys, values, bias)
            x = x + _linear(out.transpose(1, 2).reshape(n, t, -1), attn.o_proj)
            h = _rms_norm(x, layer.post_attention_layernorm)
            gate, up = F.linear(h, *self._gate_up[i]).chunk(2, dim=-1)
            x = x + _linear(F.silu(gate) * up, layer.mlp.down_proj)
        return x

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return _linear(_rms_norm(hidden, self._norm), self._head).float()
