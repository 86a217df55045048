"""The tiny model presets (Qwen3-shaped, built from a config: no hub download here), as plain data so
that the job config can check a preset's name without importing torch. `mgrpo.models.build_model`
builds them."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # ~0.44M parameters at vocab 320: the planner default
    "tiny": dict(
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
    ),
    # ~0.5M, another shape: the sub-agent default (the two models differ on purpose)
    "tiny-wide": dict(
        hidden_size=128,
        intermediate_size=320,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
    # ~3.2M: the throughput / MFU preset
    "small": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
    ),
}
