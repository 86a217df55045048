"""The megatron-core backend's weights: a Qwen3 HF checkpoint as the shares of a megatron-core
`GPTModel` on T tensor-parallel ranks and P pipeline stages, and back, exactly.

Names and layouts (HF `Qwen3ForCausalLM` → megatron-core local spec, per tensor-parallel rank t of T):

    model.embed_tokens.weight [V, h]            → embedding.word_embeddings.weight   rows of t (V padded to a multiple of T)
    layers.i.input_layernorm.weight             → decoder.layers.i.input_layernorm.weight          (every rank)
    layers.i.self_attn.{q,k,v}_proj.weight      → decoder.layers.i.self_attention.linear_qkv.weight
        per query group g (G = num_key_value_heads, Q = num_attention_heads, d = head_dim):
        [q heads g·Q/G … (g+1)·Q/G − 1; k head g; v head g] stacked, d rows each; rank t holds groups t·G/T …
    layers.i.self_attn.{q,k}_norm.weight        → …self_attention.{q,k}_layernorm.weight           (every rank)
    layers.i.self_attn.o_proj.weight [h, Q·d]   → …self_attention.linear_proj.weight              columns of t
    layers.i.post_attention_layernorm.weight    → …pre_mlp_layernorm.weight                         (every rank)
    layers.i.mlp.{gate,up}_proj.weight [f, h]   → …mlp.linear_fc1.weight                            [gate rows of t; up rows of t]
    layers.i.mlp.down_proj.weight [h, f]        → …mlp.linear_fc2.weight                            columns of t
    model.norm.weight                           → decoder.final_layernorm.weight                    (every rank)
    lm_head.weight (untied only)                → output_layer.weight                                rows of t

Pipeline parallelism (P stages; global rank = stage · T + t, megatron-core's order): stage p holds
the HF layers p·L/P … (p+1)·L/P − 1 under the local names `decoder.layers.0 …`, the embedding is on
the first stage, the final norm and the output layer on the last; with tied embeddings the last stage
holds a copy of the embedding as `output_layer.weight` (its gradient is summed with the first stage's,
so the two stay equal; the way back takes the first stage's).

Mixture of experts (HF `Qwen3MoeForCausalLM`, every layer sparse; tensor and pipeline parallel 1):
the router `mlp.gate.weight` [E, h] → `mlp.router.weight` (every rank); expert e's `gate_up_proj[e]`
[2f, h] ([gate; up], as megatron's fc1) and `down_proj[e]` [h, f] → `mlp.experts.local_experts.j.
linear_fc1.weight` / `linear_fc2.weight` on expert-parallel rank e // (E / EP), j = e mod (E / EP).

Every move is a slice or a concatenation, so HF → Megatron → HF gives back the same tensors bit for
bit, for every T that divides the heads, the groups and the MLP width and every P that divides the
layers.

The model itself (megatron-core's config, parallel state, GPTModel, the CPU shim) is
`mgrpo.parallel.megatron_model`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM

PREFIX = "decoder.layers"


def attention_shape(cfg: Any) -> tuple[int, int, int]:
    """(query heads Q, query groups G, head dim d) of an HF Qwen3 config."""
    heads = cfg.num_attention_heads
    return heads, cfg.num_key_value_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // heads


def padded_vocab(cfg: Any, tp: int) -> int:
    """The embedding rows on T ranks: the vocabulary rounded up to a multiple of T."""
    return -(-cfg.vocab_size // tp) * tp


def is_moe(cfg: Any) -> bool:
    """Whether an HF config is a mixture of experts (Qwen3-MoE)."""
    return bool(getattr(cfg, "num_experts", 0))


def check_split(cfg: Any, tp: int, pp: int = 1, ep: int = 1) -> None:
    """Refuse a tensor-parallel, pipeline or expert-parallel size that does not fit the model, saying
    what would."""
    heads, groups, _ = attention_shape(cfg)
    if is_moe(cfg):
        if tp > 1 or pp > 1:
            raise ValueError(
                "a mixture-of-experts model splits its experts over the ranks (expert parallel): leave MGRPO_PIPELINE_STAGES at 1; tensor and pipeline parallelism of its experts is not built"
            )
        if cfg.num_experts % ep:
            raise ValueError(
                f"expert parallel size {ep} must divide the model's experts (num_experts), {cfg.num_experts}"
            )
        if getattr(cfg, "mlp_only_layers", None) or getattr(cfg, "decoder_sparse_step", 1) != 1:
            raise ValueError(
                "every layer of a mixture-of-experts model must be sparse (mlp_only_layers [], decoder_sparse_step 1)"
            )
    if cfg.num_hidden_layers % pp:
        raise ValueError(
            f"pipeline parallel size {pp} must divide the model's layers (num_hidden_layers), {cfg.num_hidden_layers}"
        )
    for what, n in (
        ("query groups (num_key_value_heads)", groups),
        ("MLP width (intermediate_size)", cfg.intermediate_size),
    ):
        if n % tp:
            raise ValueError(f"tensor parallel size {tp} must divide the model's {what}, {n}")
    if heads % groups:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}")


def _rows(t: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    return t.chunk(tp, dim=0)[rank]


def _cols(t: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    return t.chunk(tp, dim=1)[rank]


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])]) if rows > t.shape[0] else t


def hf_to_megatron(
    hf: dict[str, torch.Tensor],
    cfg: Any,
    tp: int = 1,
    rank: int = 0,
    pp: int = 1,
    stage: int = 0,
    ep: int = 1,
    expert_rank: int = 0,
) -> dict[str, torch.Tensor]:
    """Tensor-parallel rank `rank` of `tp` on pipeline stage `stage` of `pp` (and expert-parallel rank
    `expert_rank` of `ep`): its share of an HF Qwen3 (or Qwen3-MoE) state dict, in megatron-core names."""
    check_split(cfg, tp, pp, ep)
    heads, groups, d = attention_shape(cfg)
    per_group = heads // groups
    first, last = stage == 0, stage == pp - 1
    out = {}
    if first:
        out["embedding.word_embeddings.weight"] = _rows(
            _pad_rows(hf["model.embed_tokens.weight"], padded_vocab(cfg, tp)), tp, rank
        )
    if last:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        if not cfg.tie_word_embeddings or not first:  # tied on one stage: the embedding itself
            head = hf["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]
            out["output_layer.weight"] = _rows(_pad_rows(head, padded_vocab(cfg, tp)), tp, rank)
    for j, i in enumerate(stage_layers(cfg, pp, stage)):
        src, dst = f"model.layers.{i}", f"{PREFIX}.{j}"
        q = hf[f"{src}.self_attn.q_proj.weight"].view(groups, per_group * d, -1)
        k = hf[f"{src}.self_attn.k_proj.weight"].view(groups, d, -1)
        v = hf[f"{src}.self_attn.v_proj.weight"].view(groups, d, -1)
        qkv = torch.cat([q, k, v], dim=1)  # [G, (Q/G + 2)·d, h]
        out |= _mlp(hf, cfg, src, dst, tp, rank, ep, expert_rank)
        out |= {
            f"{dst}.input_layernorm.weight": hf[f"{src}.input_layernorm.weight"],
            f"{dst}.self_attention.linear_qkv.weight": _rows(qkv, tp, rank).reshape(-1, qkv.shape[-1]),
            f"{dst}.self_attention.q_layernorm.weight": hf[f"{src}.self_attn.q_norm.weight"],
            f"{dst}.self_attention.k_layernorm.weight": hf[f"{src}.self_attn.k_norm.weight"],
            f"{dst}.self_attention.linear_proj.weight": _cols(hf[f"{src}.self_attn.o_proj.weight"], tp, rank),
            f"{dst}.pre_mlp_layernorm.weight": hf[f"{src}.post_attention_layernorm.weight"],
        }
    return {name: t.clone() for name, t in out.items()}


def _mlp(
    hf: dict[str, torch.Tensor], cfg: Any, src: str, dst: str, tp: int, rank: int, ep: int, expert_rank: int
) -> dict[str, torch.Tensor]:
    """A layer's MLP share: the dense one split by tensor parallelism, or the router and this expert-
    parallel rank's experts."""
    if not is_moe(cfg):
        gate, up = hf[f"{src}.mlp.gate_proj.weight"], hf[f"{src}.mlp.up_proj.weight"]
        return {
            f"{dst}.mlp.linear_fc1.weight": torch.cat([_rows(gate, tp, rank), _rows(up, tp, rank)]),
            f"{dst}.mlp.linear_fc2.weight": _cols(hf[f"{src}.mlp.down_proj.weight"], tp, rank),
        }
    local = cfg.num_experts // ep
    out = {f"{dst}.mlp.router.weight": hf[f"{src}.mlp.gate.weight"]}
    for j in range(local):
        e, expert = expert_rank * local + j, f"{dst}.mlp.experts.local_experts.{j}"
        out[f"{expert}.linear_fc1.weight"] = hf[f"{src}.mlp.experts.gate_up_proj"][e]
        out[f"{expert}.linear_fc2.weight"] = hf[f"{src}.mlp.experts.down_proj"][e]
    return out


def stage_layers(cfg: Any, pp: int, stage: int) -> range:
    """The HF layer indices pipeline stage `stage` of `pp` holds."""
    per = cfg.num_hidden_layers // pp
    return range(stage * per, (stage + 1) * per)


def place(global_rank: int, tp: int, dp: int = 1) -> tuple[int, int, int]:
    """(tensor-parallel rank, data-parallel rank, pipeline stage) of a global rank: megatron-core's
    order, tensor-parallel ranks fastest, then data parallel, then stages."""
    rest = global_rank // tp
    return global_rank % tp, rest % dp, rest // dp


def hf_shapes(cfg: Any) -> dict[str, torch.Size]:
    """The HF state dict's names and shapes of a config (worked out on the meta device)."""
    with torch.device("meta"):
        return {name: t.shape for name, t in AutoModelForCausalLM.from_config(cfg).state_dict().items()}


def _put_rows(dst: torch.Tensor, t: torch.Tensor, rank: int) -> None:
    """Rank `rank`'s row chunk `t` into `dst` (rows past `dst`'s end, the padded vocabulary's, dropped)."""
    lo = rank * t.shape[0]
    hi = min(lo + t.shape[0], dst.shape[0])
    if hi > lo:
        dst[lo:hi].copy_(t[: hi - lo])


def _put_cols(dst: torch.Tensor, t: torch.Tensor, rank: int) -> None:
    dst[:, rank * t.shape[1] : (rank + 1) * t.shape[1]].copy_(t)


def _put_qkv(hf: dict[str, torch.Tensor], src: str, t: torch.Tensor, cfg: Any, tp: int, rank: int) -> None:
    """A rank's fused QKV (its query groups, each [q heads; k; v]) into the HF q/k/v projections."""
    heads, groups, d = attention_shape(cfg)
    per_group, local = heads // groups, groups // tp
    q, k, v = t.view(local, (per_group + 2) * d, -1).split([per_group * d, d, d], dim=1)
    g = slice(rank * local, (rank + 1) * local)
    hf[f"{src}.self_attn.q_proj.weight"].view(groups, per_group * d, -1)[g].copy_(q)
    hf[f"{src}.self_attn.k_proj.weight"].view(groups, d, -1)[g].copy_(k)
    hf[f"{src}.self_attn.v_proj.weight"].view(groups, d, -1)[g].copy_(v)


# Row- and column-split tensors: megatron name (after the layer's prefix) → HF name.
_ROWS = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "output_layer.weight": "lm_head.weight",
}
_COLS = {
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}


def copy_into_hf(
    part: dict[str, torch.Tensor],
    cfg: Any,
    tp: int,
    rank: int,
    hf: dict[str, torch.Tensor],
    pp: int = 1,
    stage: int = 0,
    ep: int = 1,
    expert_rank: int = 0,
) -> None:
    """Copy the megatron-named tensors `part` (any of its names) of tensor-parallel rank `rank` of `tp`
    on pipeline stage `stage` of `pp` (expert-parallel rank `expert_rank` of `ep`) into their places in
    the full HF tensors `hf`, in place: every element once, no intermediate tensor (the weight sync's
    path). The tensors every tensor-parallel rank holds (the norms) are taken from rank 0's; a tied
    embedding from the first stage's."""
    offset = stage_layers(cfg, pp, stage).start
    local = cfg.num_experts // ep if is_moe(cfg) else 0
    for name, t in part.items():
        layer, _, suffix = name.removeprefix(f"{PREFIX}.").partition(".")
        if not name.startswith(f"{PREFIX}."):  # outside the layers: the whole name
            layer, suffix = "", name
        src = f"model.layers.{int(layer) + offset}" if layer else ""
        if name == "output_layer.weight" and cfg.tie_word_embeddings:
            continue  # the last stage's copy of the embedding
        if name in _ROWS:
            _put_rows(hf[_ROWS[name]][: cfg.vocab_size], t, rank)
        elif suffix == "self_attention.linear_qkv.weight":
            _put_qkv(hf, src, t, cfg, tp, rank)
        elif suffix in _COLS:
            _put_cols(hf[f"{src}.{_COLS[suffix]}"], t, rank)
        elif suffix.startswith("mlp.experts.local_experts."):
            j, _, fc = suffix.removeprefix("mlp.experts.local_experts.").partition(".")
            which = "gate_up_proj" if fc == "linear_fc1.weight" else "down_proj"
            hf[f"{src}.mlp.experts.{which}"][expert_rank * local + int(j)].copy_(t)
        elif suffix == "mlp.linear_fc1.weight":
            gate, up = t.chunk(2)
            _put_rows(hf[f"{src}.mlp.gate_proj.weight"], gate, rank)
            _put_rows(hf[f"{src}.mlp.up_proj.weight"], up, rank)
        elif rank == 0:
            hf[_REPLICATED[suffix].format(src=src)].copy_(t)


# The tensors every tensor-parallel rank holds whole: megatron name (after the layer) → HF name.
_REPLICATED = {
    "decoder.final_layernorm.weight": "model.norm.weight",
    "input_layernorm.weight": "{src}.input_layernorm.weight",
    "self_attention.q_layernorm.weight": "{src}.self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "{src}.self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "{src}.post_attention_layernorm.weight",
    "mlp.router.weight": "{src}.mlp.gate.weight",
}


def empty_hf(cfg: Any, like: torch.Tensor) -> dict[str, torch.Tensor]:
    """Uninitialised HF tensors of a config, with `like`'s dtype and device; a tied `lm_head.weight`
    is left out (it is the embedding: `tie_hf`)."""
    return {
        name: torch.empty(shape, dtype=like.dtype, device=like.device)
        for name, shape in hf_shapes(cfg).items()
        if not (cfg.tie_word_embeddings and name == "lm_head.weight")
    }


def tie_hf(hf: dict[str, torch.Tensor], cfg: Any) -> dict[str, torch.Tensor]:
    if cfg.tie_word_embeddings:
        hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
    return hf


def megatron_to_hf(shards: list[dict[str, torch.Tensor]], cfg: Any, pp: int = 1) -> dict[str, torch.Tensor]:
    """The HF Qwen3 state dict of a model held as `shards`, one per rank in global order (T = len / `pp`
    tensor-parallel ranks on each of `pp` stages; a mixture of experts: len expert-parallel ranks), in
    fresh memory."""
    if is_moe(cfg):
        ep = len(shards)
        check_split(cfg, 1, 1, ep)
        out = empty_hf(cfg, next(iter(shards[0].values())))
        for r, shard in enumerate(shards):
            copy_into_hf(shard, cfg, 1, 0, out, ep=ep, expert_rank=r)
        return tie_hf(out, cfg)
    tp = len(shards) // pp
    check_split(cfg, tp, pp)
    out = empty_hf(cfg, next(iter(shards[0].values())))
    for r, shard in enumerate(shards):
        t, _, stage = place(r, tp)
        copy_into_hf(shard, cfg, tp, t, out, pp, stage)
    return tie_hf(out, cfg)
