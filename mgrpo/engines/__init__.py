"""Rollout engines: `hf` (in-process transformers, batched; the CPU default) and `sglang` (HTTP)."""

from mgrpo.engines.base import RolloutEngine, Sample, SamplingParams

__all__ = ["RolloutEngine", "Sample", "SamplingParams"]
