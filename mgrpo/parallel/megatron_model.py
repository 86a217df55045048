"""The megatron-core backend's model: megatron-core's `TransformerConfig` and parallel state for an HF
Qwen3 config, the `GPTModel` share of one rank (`build_gpt`), and `MegatronCausalLM`, the calls the
trainer makes of it. The weights' names and layouts, and their conversion, are
`mgrpo.parallel.megatron`.

On CPU the model runs inside `mgrpo.parallel.megatron_cpu.cpu_shim` (its docstring says what it
changes).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mgrpo.parallel.megatron import attention_shape, check_split, is_moe, padded_vocab
from mgrpo.parallel.megatron_cpu import causal_mask, cpu_shim, router_without_te
from mgrpo.parallel.megatron_pipeline import pipeline_logprobs, train_pipeline
from mgrpo.parallel.transport import all_reduce_in_buckets


def transformer_config(
    cfg: Any, tp: int = 1, dtype: torch.dtype = torch.float32, pp: int = 1, ep: int = 1
) -> Any:
    """megatron-core's TransformerConfig for an HF Qwen3 config (no dropout: RL fine-tuning); with
    `pp` stages, activations of any length pass between them (`variable_seq_lengths`); a Qwen3-MoE
    config's experts split over `ep` ranks (dropless, no auxiliary loss; HF's `norm_topk_prob`:
    softmax over the top k, else over all experts before the top k)."""
    # megatron-core: optional and heavy
    from megatron.core.transformer.transformer_config import TransformerConfig

    heads, groups, d = attention_shape(cfg)
    experts: dict[str, Any] = {}
    if is_moe(cfg):
        experts = dict(
            num_moe_experts=cfg.num_experts,
            moe_router_topk=cfg.num_experts_per_tok,
            moe_ffn_hidden_size=cfg.moe_intermediate_size,
            moe_router_pre_softmax=not cfg.norm_topk_prob,
            moe_aux_loss_coeff=0.0,
            moe_router_load_balancing_type="none",
            expert_model_parallel_size=ep,
            moe_token_dispatcher_type="allgather",
        )
    return TransformerConfig(
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.intermediate_size,
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=d,
        normalization="RMSNorm",
        layernorm_epsilon=cfg.rms_norm_eps,
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=dtype,
        variable_seq_lengths=pp > 1,
        **({"moe_token_dispatcher_type": "alltoall"} | experts),  # alltoall: the default refuses variable
        # lengths (pipeline stages); experts use allgather, whose dispatch runs on the CPU
    )


def rope_theta(cfg: Any) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def model_parallel(tp: int, pp: int = 1, seed: int = 1234, ep: int = 1) -> None:
    """megatron-core's parallel state for `tp` tensor-parallel ranks on each of `pp` pipeline stages
    over the whole group, the rest data parallel, `ep` of them expert parallel (once per process); on
    GPUs also its tensor-parallel CUDA RNG states (the CPU shim needs none)."""
    from megatron.core import parallel_state  # megatron-core: optional and heavy
    from megatron.core import tensor_parallel as mtp  # megatron-core: optional and heavy

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep
        )
        if torch.cuda.is_available():
            mtp.model_parallel_cuda_manual_seed(seed)
        return
    have = (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_world_size(),
        parallel_state.get_expert_model_parallel_world_size(),
    )
    if have != (tp, pp, ep):
        raise RuntimeError(
            f"megatron-core is set up for (tensor, pipeline, expert) parallel {have}, not {(tp, pp, ep)}: "
            "one process holds one split"
        )


def tensor_parallel(tp: int, seed: int = 1234) -> None:
    """`model_parallel` with one pipeline stage."""
    model_parallel(tp, 1, seed)


def build_gpt(
    cfg: Any, tp: int = 1, dtype: torch.dtype = torch.float32, pp: int = 1, stage: int = 0, ep: int = 1
) -> torch.nn.Module:
    """An (untrained) megatron-core GPTModel shaped like the HF Qwen3 (or Qwen3-MoE) config: this
    rank's share of T tensor-parallel ranks on pipeline stage `stage` of `pp` (of `ep` expert-parallel
    ranks) (megatron's parallel state must be initialised so)."""
    # megatron-core: optional and heavy
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    check_split(cfg, tp, pp, ep)
    spec = get_gpt_layer_local_spec(
        num_experts=cfg.num_experts if is_moe(cfg) else None,
        moe_grouped_gemm=False,
        qk_layernorm=True,
        normalization="RMSNorm",
    )
    return GPTModel(
        transformer_config(cfg, tp, dtype, pp, ep),
        spec,
        vocab_size=padded_vocab(cfg, tp),
        max_sequence_length=cfg.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=int(rope_theta(cfg)),
        share_embeddings_and_output_weights=cfg.tie_word_embeddings,
        parallel_output=False,
        pre_process=stage == 0,
        post_process=stage == pp - 1,
    )


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


def _padded_to_group(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`ids` and `mask` padded (rows and columns, masked out) to the largest batch of the data-parallel
    group: a padded token attends only itself and no real token attends it, so the real tokens'
    logits are unchanged."""
    from megatron.core import parallel_state as ps  # megatron-core: optional and heavy

    shape = torch.tensor(ids.shape, dtype=torch.long, device=ids.device)
    dist.all_reduce(shape, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
    rows, cols = (int(shape[0]) - ids.shape[0], int(shape[1]) - ids.shape[1])
    return F.pad(ids, (0, cols, 0, rows)), F.pad(mask, (0, cols, 0, rows))


class MegatronCausalLM(torch.nn.Module):
    """A GPTModel on T tensor-parallel ranks (on one of P pipeline stages) behind the calls the trainer
    makes, so `ppo_update` trains it with the one loss. With one stage, the HF causal-LM call
    (`model(input_ids=…, attention_mask=…, position_ids=…).logits`); with P > 1 (`pipelined`),
    megatron-core's 1F1B schedule over the micro-batches (`train_pipeline`, `logprobs`;
    `mgrpo.parallel.megatron_pipeline`). Every rank runs the same update on the same rows, except
    data-parallel ranks (experts split over the ranks), which split them; the gradient norm it clips
    by is the whole model's (`clip_grad_norm_`)."""

    def __init__(
        self,
        cfg: Any,
        tp: int = 1,
        dtype: torch.dtype = torch.float32,
        pp: int = 1,
        stage: int = 0,
        ep: int = 1,
        dp: int = 1,
    ) -> None:
        """`dp`: the data-parallel ranks (a mixture of experts: the expert-parallel ranks, each
        training its own rows of every minibatch, `ppo_update`'s `shard`)."""
        super().__init__()
        router_without_te()
        self.config, self.vocab = cfg, cfg.vocab_size
        self.pp, self.stage, self.dp = pp, stage, dp
        self.gpt = build_gpt(cfg, tp, dtype, pp, stage, ep)

    @property
    def pipelined(self) -> bool:
        return self.pp > 1

    def train_pipeline(
        self, inputs: list[tuple[torch.Tensor, torch.Tensor]], loss_fn: Any
    ) -> list[dict[str, float]]:
        return train_pipeline(self, inputs, loss_fn)

    def logprobs(
        self, inputs: list[tuple[torch.Tensor, torch.Tensor]], temperature: float
    ) -> list[torch.Tensor]:
        return pipeline_logprobs(self, inputs, temperature)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: Any = None, **_: Any
    ) -> Any:
        b, s = input_ids.shape
        if self.dp > 1:  # the experts' dispatch gathers equal shapes from every data-parallel rank
            input_ids, attention_mask = _padded_to_group(input_ids, attention_mask)
        with cpu_shim() if self.device.type == "cpu" else contextlib.nullcontext():
            logits = causal_logits(self.gpt, input_ids, attention_mask, self.vocab)  # position_ids: see there
            return SimpleNamespace(logits=logits[:b, :s])

    def _average_over_data_parallel(self) -> None:
        """Every gradient as the mean of the data-parallel ranks': a replicated weight's summed over
        them; an expert's already holds every rank's tokens (the dispatcher brought them), summed
        over its replicas (the expert-data-parallel group; one rank here); both divided by dp."""
        from megatron.core import parallel_state as ps  # megatron-core: optional and heavy

        for expert in (False, True):
            grads = [
                p.grad
                for p in self.parameters()
                if p.grad is not None and (not getattr(p, "allreduce", True)) == expert
            ]
            group = ps.get_expert_data_parallel_group() if expert else ps.get_data_parallel_group()
            if grads and dist.get_world_size(group) > 1:
                all_reduce_in_buckets(grads, group)
            for g in grads:
                g.div_(self.dp)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Finish the gradients, then clip them by the whole model's norm. Finishing is what
        megatron-core's `finalize_model_grads` does for this layout: a q/k layernorm weight is held by
        every tensor-parallel rank but each sees only its own heads, so its gradient is summed over the
        group; a tied embedding's two copies (first and last stage) get the sum of their gradients.
        The norm: a tensor-parallel shard's squares summed over the group, a replicated weight counted
        once, the last stage's copy of a tied embedding not at all, the stages' parts summed."""
        from megatron.core import parallel_state as ps  # megatron-core: optional and heavy

        tp_group, tp = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size()
        for name, p in self.gpt.named_parameters():
            if tp > 1 and p.grad is not None and ("q_layernorm" in name or "k_layernorm" in name):
                dist.all_reduce(p.grad, group=tp_group)
        if self.dp > 1:  # each rank's loss is its rows' times dp (ppo_update's shard): the mean over ranks
            self._average_over_data_parallel()
        if self.pp > 1 and self.config.tie_word_embeddings and ps.is_rank_in_embedding_group():
            shared: torch.Tensor = self.gpt.shared_embedding_or_output_weight()  # type: ignore[operator]
            dist.all_reduce(shared.grad, group=ps.get_embedding_group())
        grads = [
            (p.grad, getattr(p, "tensor_model_parallel", False), not getattr(p, "allreduce", True))
            for p in self.parameters()
            if p.grad is not None and not getattr(p, "shared", False)  # `shared`: the last stage's copy
        ]  # (gradient, split by tensor parallelism, an expert's: megatron marks them allreduce=False)
        split = sum((g.float().pow(2).sum() for g, t, e in grads if t and not e), torch.zeros(()))
        whole = sum((g.float().pow(2).sum() for g, t, e in grads if not t and not e), torch.zeros(()))
        experts = sum((g.float().pow(2).sum() for g, _, e in grads if e), torch.zeros(()))
        if tp > 1:
            dist.all_reduce(split, group=tp_group)
        if ps.get_expert_model_parallel_world_size() > 1:  # each expert on one rank of the group
            dist.all_reduce(experts, group=ps.get_expert_model_parallel_group())
        squares = split + whole + experts
        if self.pp > 1:
            dist.all_reduce(squares, group=ps.get_pipeline_model_parallel_group())
        norm = squares.sqrt()
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for p in self.parameters():
            if p.grad is not None:
                p.grad.mul_(scale.to(p.grad.dtype))
        return norm
