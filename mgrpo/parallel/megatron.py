"""The megatron-core backend's model side: a Qwen3 HF checkpoint as a megatron-core `GPTModel` on T
tensor-parallel ranks and back, exactly.

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

Every move is a slice or a concatenation, so HF → Megatron → HF gives back the same tensors bit for
bit, for every T that divides the heads, the groups and the MLP width and every P that divides the
layers.

On CPU (`cpu_shim`): megatron-core places a few buffers with `torch.cuda.current_device()` (RoPE's
frequencies, the tensor-parallel all-gathers, the pipeline's receive buffers) and forks a CUDA RNG
state around attention dropout; the shim answers the first with the CPU and makes the fork a no-op
(dropout is 0 here). For pipeline parallelism it also makes `torch.cuda.synchronize()` (after each
exchange of activation shapes) a no-op, `Tensor.cuda()` (where the last stage's copy of a tied
embedding is moved before its first all-reduce) the tensor itself, and places the 1F1B schedule's
token counter (`torch.zeros(…, device="cuda")`) on the CPU. Nothing else of megatron-core changes:
the same modules, the same schedule, the same collectives (gloo), the same numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

PREFIX = "decoder.layers"


def _attention_shape(cfg: Any) -> tuple[int, int, int]:
    """(query heads Q, query groups G, head dim d) of an HF Qwen3 config."""
    heads = cfg.num_attention_heads
    return heads, cfg.num_key_value_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // heads


def padded_vocab(cfg: Any, tp: int) -> int:
    """The embedding rows on T ranks: the vocabulary rounded up to a multiple of T."""
    return -(-cfg.vocab_size // tp) * tp


def check_split(cfg: Any, tp: int, pp: int = 1) -> None:
    """Refuse a tensor-parallel (or pipeline) size that does not divide the model, saying what would."""
    heads, groups, _ = _attention_shape(cfg)
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
    hf: dict[str, torch.Tensor], cfg: Any, tp: int = 1, rank: int = 0, pp: int = 1, stage: int = 0
) -> dict[str, torch.Tensor]:
    """Tensor-parallel rank `rank` of `tp` on pipeline stage `stage` of `pp`: its share of an HF Qwen3
    state dict, in megatron-core names."""
    check_split(cfg, tp, pp)
    heads, groups, d = _attention_shape(cfg)
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
        gate, up = hf[f"{src}.mlp.gate_proj.weight"], hf[f"{src}.mlp.up_proj.weight"]
        out |= {
            f"{dst}.input_layernorm.weight": hf[f"{src}.input_layernorm.weight"],
            f"{dst}.self_attention.linear_qkv.weight": _rows(qkv, tp, rank).reshape(-1, qkv.shape[-1]),
            f"{dst}.self_attention.q_layernorm.weight": hf[f"{src}.self_attn.q_norm.weight"],
            f"{dst}.self_attention.k_layernorm.weight": hf[f"{src}.self_attn.k_norm.weight"],
            f"{dst}.self_attention.linear_proj.weight": _cols(hf[f"{src}.self_attn.o_proj.weight"], tp, rank),
            f"{dst}.pre_mlp_layernorm.weight": hf[f"{src}.post_attention_layernorm.weight"],
            f"{dst}.mlp.linear_fc1.weight": torch.cat([_rows(gate, tp, rank), _rows(up, tp, rank)]),
            f"{dst}.mlp.linear_fc2.weight": _cols(hf[f"{src}.mlp.down_proj.weight"], tp, rank),
        }
    return {name: t.clone() for name, t in out.items()}


def stage_layers(cfg: Any, pp: int, stage: int) -> range:
    """The HF layer indices pipeline stage `stage` of `pp` holds."""
    per = cfg.num_hidden_layers // pp
    return range(stage * per, (stage + 1) * per)


def place(global_rank: int, tp: int) -> tuple[int, int]:
    """(tensor-parallel rank, pipeline stage) of a global rank: megatron-core's order, T fastest."""
    return global_rank % tp, global_rank // tp


def hf_shapes(cfg: Any) -> dict[str, torch.Size]:
    """The HF state dict's names and shapes of a config (worked out on the meta device)."""
    from transformers import AutoModelForCausalLM

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
    heads, groups, d = _attention_shape(cfg)
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
) -> None:
    """Copy the megatron-named tensors `part` (any of its names) of tensor-parallel rank `rank` of `tp`
    on pipeline stage `stage` of `pp` into their places in the full HF tensors `hf`, in place: every
    element once, no intermediate tensor (the weight sync's path). The tensors every tensor-parallel
    rank holds (the norms) are taken from rank 0's; a tied embedding from the first stage's."""
    offset = stage_layers(cfg, pp, stage).start
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
    tensor-parallel ranks on each of `pp` stages), in fresh memory."""
    tp = len(shards) // pp
    check_split(cfg, tp, pp)
    out = empty_hf(cfg, next(iter(shards[0].values())))
    for r, shard in enumerate(shards):
        t, stage = place(r, tp)
        copy_into_hf(shard, cfg, tp, t, out, pp, stage)
    return tie_hf(out, cfg)


def transformer_config(cfg: Any, tp: int = 1, dtype: torch.dtype = torch.float32, pp: int = 1) -> Any:
    """megatron-core's TransformerConfig for an HF Qwen3 config (no dropout: RL fine-tuning); with
    `pp` stages, activations of any length pass between them (`variable_seq_lengths`)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    heads, groups, d = _attention_shape(cfg)
    return TransformerConfig(
        num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, ffn_hidden_size=cfg.intermediate_size,
        num_attention_heads=heads, num_query_groups=groups, kv_channels=d,
        normalization="RMSNorm", layernorm_epsilon=cfg.rms_norm_eps, qk_layernorm=True,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
        hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=tp,
        params_dtype=dtype, bf16=dtype == torch.bfloat16, use_cpu_initialization=True,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        pipeline_model_parallel_size=pp, pipeline_dtype=dtype, variable_seq_lengths=pp > 1,
        moe_token_dispatcher_type="alltoall",  # no experts here; the default refuses variable lengths
    )  # fmt: skip


def rope_theta(cfg: Any) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def model_parallel(tp: int, pp: int = 1, seed: int = 1234) -> None:
    """megatron-core's parallel state for `tp` tensor-parallel ranks on each of `pp` pipeline stages
    over the whole group (once per process); on GPUs also its tensor-parallel CUDA RNG states (the CPU
    shim needs none)."""
    from megatron.core import parallel_state
    from megatron.core import tensor_parallel as mtp

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
        )
        if torch.cuda.is_available():
            mtp.model_parallel_cuda_manual_seed(seed)
        return
    have = (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_world_size(),
    )
    if have != (tp, pp):
        raise RuntimeError(f"megatron-core is set up for (tensor, pipeline) parallel {have}, not {(tp, pp)}")


def tensor_parallel(tp: int, seed: int = 1234) -> None:
    """`model_parallel` with one pipeline stage."""
    model_parallel(tp, 1, seed)


def build_gpt(
    cfg: Any, tp: int = 1, dtype: torch.dtype = torch.float32, pp: int = 1, stage: int = 0
) -> torch.nn.Module:
    """An (untrained) megatron-core GPTModel shaped like the HF Qwen3 config: this rank's share of T
    tensor-parallel ranks on pipeline stage `stage` of `pp` (megatron's parallel state must be
    initialised so)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    check_split(cfg, tp, pp)
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    return GPTModel(
        transformer_config(cfg, tp, dtype, pp), spec, vocab_size=padded_vocab(cfg, tp),
        max_sequence_length=cfg.max_position_embeddings, position_embedding_type="rope",
        rotary_base=int(rope_theta(cfg)), share_embeddings_and_output_weights=cfg.tie_word_embeddings,
        parallel_output=False, pre_process=stage == 0, post_process=stage == pp - 1,
    )  # fmt: skip


def load_into(model: torch.nn.Module, shard: dict[str, torch.Tensor]) -> None:
    """Copy a rank's converted shard into its GPTModel; every parameter must be covered."""
    missing, unexpected = model.load_state_dict(shard, strict=False)
    missing = [m for m in missing if not m.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(
            f"the converted state does not fit the model: missing {missing}, unexpected {unexpected}"
        )


def causal_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab: int
) -> torch.Tensor:
    """Next-token logits [b, s, vocab] of a GPTModel over left-padded rows, as the HF model gives them:
    a token sees only earlier real tokens. No positions are passed: megatron's RoPE numbers the tokens
    by their index, and RoPE's attention depends only on the distance between two tokens, so a left-
    padded row's offset changes nothing (HF's positions counted from the first real token give the
    same logits on every real token; tested)."""
    return model(input_ids, None, attention_mask=causal_mask(attention_mask))[..., :vocab]


def causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """megatron-core's attention mask [b, 1, s, s] (True = not attended) of left-padded rows: a token
    sees itself and earlier real tokens; a padding token only itself (not NaN)."""
    real = attention_mask.bool()
    s = attention_mask.shape[1]
    future = torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).triu(1)
    masked = future[None, None] | ~real[:, None, None, :]
    return masked & ~torch.eye(s, dtype=torch.bool, device=attention_mask.device)


def _zeros_on_cpu(zeros: Any) -> Any:
    def placed(*args: Any, **kwargs: Any) -> torch.Tensor:
        if str(kwargs.get("device")) == "cuda":
            kwargs["device"] = "cpu"
        return zeros(*args, **kwargs)

    return placed


@contextlib.contextmanager
def cpu_shim() -> Iterator[None]:
    """Run megatron-core on the CPU (see the module docstring) while inside: `torch.cuda.current_device()`
    is the CPU, `torch.cuda.synchronize()` and the tensor-parallel RNG fork no-ops, `Tensor.cuda()`
    the tensor itself, and `torch.zeros(…, device="cuda")` a CPU tensor."""
    from megatron.core import tensor_parallel

    tracker = tensor_parallel.get_cuda_rng_tracker()
    saved = torch.cuda.current_device, tracker.fork, torch.cuda.synchronize, torch.Tensor.cuda, torch.zeros
    setattr(torch.cuda, "current_device", lambda: torch.device("cpu"))  # noqa: B010
    setattr(torch.cuda, "synchronize", lambda *a, **k: None)  # noqa: B010
    setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)  # noqa: B010
    setattr(torch, "zeros", _zeros_on_cpu(saved[4]))  # noqa: B010
    tracker.fork = lambda *a, **k: contextlib.nullcontext()
    try:
        yield
    finally:
        setattr(torch.cuda, "current_device", saved[0])  # noqa: B010
        tracker.fork = saved[1]
        setattr(torch.cuda, "synchronize", saved[2])  # noqa: B010
        setattr(torch.Tensor, "cuda", saved[3])  # noqa: B010
        setattr(torch, "zeros", saved[4])  # noqa: B010


class MegatronCausalLM(torch.nn.Module):
    """A GPTModel on T tensor-parallel ranks (on one of P pipeline stages) behind the calls the trainer
    makes, so `ppo_update` trains it with the one loss. With one stage, the HF causal-LM call
    (`model(input_ids=…, attention_mask=…, position_ids=…).logits`); with P > 1 (`pipelined`),
    megatron-core's 1F1B schedule over the micro-batches (`train_pipeline`, `logprobs`;
    `mgrpo.parallel.megatron_pipeline`). Every rank runs the same update on the same rows; the
    gradient norm it clips by is the whole model's (`clip_grad_norm_`)."""

    def __init__(
        self, cfg: Any, tp: int = 1, dtype: torch.dtype = torch.float32, pp: int = 1, stage: int = 0
    ) -> None:
        super().__init__()
        self.config, self.vocab = cfg, cfg.vocab_size
        self.pp, self.stage = pp, stage
        self.gpt = build_gpt(cfg, tp, dtype, pp, stage)

    @property
    def pipelined(self) -> bool:
        return self.pp > 1

    def train_pipeline(
        self, inputs: list[tuple[torch.Tensor, torch.Tensor]], loss_fn: Any
    ) -> list[dict[str, float]]:
        from mgrpo.parallel.megatron_pipeline import train_pipeline

        return train_pipeline(self, inputs, loss_fn)

    def logprobs(
        self, inputs: list[tuple[torch.Tensor, torch.Tensor]], temperature: float
    ) -> list[torch.Tensor]:
        from mgrpo.parallel.megatron_pipeline import pipeline_logprobs

        return pipeline_logprobs(self, inputs, temperature)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: Any = None, **_: Any
    ) -> Any:
        from types import SimpleNamespace

        with cpu_shim() if self.device.type == "cpu" else contextlib.nullcontext():
            logits = causal_logits(self.gpt, input_ids, attention_mask, self.vocab)  # position_ids: see there
            return SimpleNamespace(logits=logits)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Finish the gradients, then clip them by the whole model's norm. Finishing is what
        megatron-core's `finalize_model_grads` does for this layout: a q/k layernorm weight is held by
        every tensor-parallel rank but each sees only its own heads, so its gradient is summed over the
        group; a tied embedding's two copies (first and last stage) get the sum of their gradients.
        The norm: a tensor-parallel shard's squares summed over the group, a replicated weight counted
        once, the last stage's copy of a tied embedding not at all, the stages' parts summed."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        tp_group, tp = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size()
        for name, p in self.gpt.named_parameters():
            if tp > 1 and p.grad is not None and ("q_layernorm" in name or "k_layernorm" in name):
                dist.all_reduce(p.grad, group=tp_group)
        if self.pp > 1 and self.config.tie_word_embeddings and ps.is_rank_in_embedding_group():
            shared: torch.Tensor = self.gpt.shared_embedding_or_output_weight()  # type: ignore[operator]
            dist.all_reduce(shared.grad, group=ps.get_embedding_group())
        grads = [
            (p.grad, getattr(p, "tensor_model_parallel", False))
            for p in self.parameters()
            if p.grad is not None and not getattr(p, "shared", False)  # `shared`: the last stage's copy
        ]
        split = sum((g.float().pow(2).sum() for g, tp_split in grads if tp_split), torch.zeros(()))
        whole = sum((g.float().pow(2).sum() for g, tp_split in grads if not tp_split), torch.zeros(()))
        if tp > 1:
            dist.all_reduce(split, group=tp_group)
        squares = split + whole
        if self.pp > 1:
            dist.all_reduce(squares, group=ps.get_pipeline_model_parallel_group())
        norm = squares.sqrt()
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for p in self.parameters():
            if p.grad is not None:
                p.grad.mul_(scale.to(p.grad.dtype))
        return norm
