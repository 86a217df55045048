"""A process group between a trainer and the inference servers it pushes weights to (SGLang's
`/init_weights_update_group`, `/update_weights_from_distributed`), apart from any group the trainer
already belongs to (its own ranks).

Both sides make it the same way, so that NCCL's (or gloo's) rendezvous keys match: a TCP store at
`host:port` kept by rank 0 (the trainer), a store prefix of the group's name, and torch's process-group
constructor for a group of `world_size` ranks — SGLang's `init_custom_process_group` does this on the
server side, with its ranks `rank_offset + tp_rank`. Only private torch functions build such a group
(`_new_process_group_helper`), as in SGLang, verl and OpenRLHF; `open_weight_group` is the one place
that calls them.
"""

from __future__ import annotations

import inspect
import math
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    Backend,
    PrefixStore,
    _new_process_group_helper,
    _world,
)
from torch.distributed.rendezvous import rendezvous


def open_weight_group(
    backend: str, host: str, port: int, world_size: int, rank: int, group_name: str, timeout_s: float = 300.0
) -> dist.ProcessGroup:
    """Join (rank 0: open, keeping the store) the group; returns when all `world_size` ranks joined."""
    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{host}:{port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    params = inspect.signature(_new_process_group_helper).parameters  # torch renamed pg_options
    options = "backend_options" if "backend_options" in params else "pg_options"
    group, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        PrefixStore(group_name, store),
        group_name=cast(Any, group_name),
        timeout=timeout,
        **{options: None},
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}  # its ranks are its own
    return group


def broadcast_tensors(tensors: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Rank 0's `tensors`, in order, into every rank's tensors of the same shapes and dtypes."""
    for t in tensors:
        dist.broadcast(t, src=0, group=group)


def close_weight_group(group: dist.ProcessGroup) -> None:
    dist.destroy_process_group(group)


def byte_buckets(sizes: list[int], cap_bytes: int) -> list[range]:
    """Consecutive index ranges of tensors whose byte `sizes` add up to at most `cap_bytes` each (a
    larger tensor alone), in order: the buckets of one flattened broadcast each."""
    out: list[range] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > cap_bytes:
            out.append(range(start, i))
            start, total = i, 0
        total += size
    if sizes:
        out.append(range(start, len(sizes)))
    return out


def flatten_bytes(tensors: list[torch.Tensor]) -> torch.Tensor:
    """`tensors` (contiguous, any dtypes) as one uint8 buffer, in order: SGLang's `flattened_bucket`."""
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def unflatten_bytes(
    buffer: torch.Tensor, dtypes: list[torch.dtype], shapes: list[list[int]]
) -> list[torch.Tensor]:
    """The tensors `flatten_bytes` packed into `buffer`, as views of it."""
    out, offset = [], 0
    for dtype, shape in zip(dtypes, shapes, strict=True):
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        out.append(buffer[offset : offset + size].view(dtype).view(shape))
        offset += size
    if offset != buffer.numel():
        raise ValueError(f"a bucket of {buffer.numel()} bytes does not hold tensors of {offset} bytes")
    return out
