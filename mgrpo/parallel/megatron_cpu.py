"""megatron-core on the CPU: what the megatron backend changes of it there, and the attention mask of
left-padded rows both its model and its pipeline schedule use.

On CPU (`cpu_shim`): megatron-core places a few buffers with `torch.cuda.current_device()` (RoPE's
frequencies, the tensor-parallel all-gathers, the pipeline's receive buffers) and forks a CUDA RNG
state around attention dropout; the shim answers the first with the CPU and makes the fork a no-op
(dropout is 0 here). For pipeline parallelism it also makes `torch.cuda.synchronize()` (after each
exchange of activation shapes) a no-op, `Tensor.cuda()` (where the last stage's copy of a tied
embedding is moved before its first all-reduce) the tensor itself, and places the 1F1B schedule's
token counter (`torch.zeros(…, device="cuda")`) on the CPU. For experts, megatron-core 0.16's router
tests `te_general_gemm`, a name it imports only with TransformerEngine (a NameError without it, on
the GPU too, seen 2026-12-04): building the model sets it to None, so the router takes its torch path.
Nothing else of megatron-core changes:
the same modules, the same schedule, the same collectives (gloo), the same numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


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


def router_without_te() -> None:
    """megatron-core 0.16's MoE router tests `te_general_gemm`, which it defines only when
    TransformerEngine imports: None sends it down its torch path (module docstring)."""
    from megatron.core.transformer.moe import moe_utils  # megatron-core: an optional, heavy dependency

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


@contextlib.contextmanager
def cpu_shim() -> Iterator[None]:
    """Run megatron-core on the CPU (see the module docstring) while inside: `torch.cuda.current_device()`
    is the CPU, `torch.cuda.synchronize()` and the tensor-parallel RNG fork no-ops, `Tensor.cuda()`
    the tensor itself, and `torch.zeros(…, device="cuda")` a CPU tensor."""
    from megatron.core import tensor_parallel  # megatron-core: an optional, heavy dependency

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
