"""The process group of a role's ranks, from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT): gloo on CPU, NCCL on GPU. W = 1 (no WORLD_SIZE, or 1) is today's single process and
starts no group."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

# Ranks > 0 wait in a broadcast for rank 0's next call for as long as the service is idle (between
# jobs), so the group's timeout is long; a dead peer still fails a collective at once (its socket closes).
IDLE_TIMEOUT_S = 7 * 24 * 3600.0


def world_size() -> int:
    """The ranks torchrun started (before the group exists)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def joined_world() -> int:
    """The size of the group this process has joined (1 when none)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def one_machine() -> bool:
    """Whether every rank of the group runs on this machine (torchrun's LOCAL_WORLD_SIZE = WORLD_SIZE)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size())) == world_size()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def init_from_env(timeout_s: float = IDLE_TIMEOUT_S) -> bool:
    """Join the group torchrun described (once); False when W = 1."""
    if world_size() <= 1:
        return False
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return True


def device() -> torch.device:
    """This rank's device: its local GPU, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
