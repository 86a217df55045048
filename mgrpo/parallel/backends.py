"""What differs between the ways a role on W > 1 ranks holds its model, declared once per backend (as
the workflows are in `mgrpo.workflows.table`): nothing else compares backend names. Plain data, so the
service settings and the CLI check a backend without importing torch; the policy class each backend
builds on the ranks is looked up by name in `mgrpo.parallel.ranks`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BackendName = Literal["fsdp", "megatron"]


@dataclass(frozen=True)
class Backend:
    name: BackendName
    pipelines: bool  # may split the model's layers over pipeline stages
    min_ranks: int  # the fewest ranks it splits the model over (1: one process is fine)
    shards_optimizer: bool  # checkpoints its optimizer state as per-rank shards (DCP)
    trains_adapters: bool  # trains a LoRA role's adapter on its ranks' frozen base (mgrpo.lora)


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("fsdp", pipelines=False, min_ranks=1, shards_optimizer=True, trains_adapters=True),
        Backend("megatron", pipelines=True, min_ranks=2, shards_optimizer=False, trains_adapters=False),
    )
}


def backend(name: str) -> Backend:
    """The backend of this name, or a ValueError naming the choices."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: {' or '.join(BACKENDS)}")
    return BACKENDS[name]


def pipelining() -> list[str]:
    """The backends that split layers over pipeline stages (for error messages)."""
    return [b.name for b in BACKENDS.values() if b.pipelines]
