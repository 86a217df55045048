"""The LoRA adapters `mgrpo engine` serves (`services.engine_server`), as SGLang serves them: a
`/generate` names a loaded adapter per prompt (`lora_path`) or none, which samples the base.

Each family of adapters (a name without its `-v<N>`: one per role, `mgrpo.engines.sglang.adapter_name`)
samples from an `hf` engine of its own: a copy of the base with the family's newest adapter merged in,
swapped in between two decode steps (rows already running finish on the adapter they started with).
So roles on one base (`share_model_with`) share the server, each sampling from its own adapter, while
the base engine keeps the base. SGLang applies adapters unmerged in its batches; a merged copy per
family is what a CPU runs fastest here, at a copy of the base per role.
"""

from __future__ import annotations

import copy

import torch

from mgrpo.engines.hf import HFEngine
from mgrpo.engines.sglang import adapter_family, adapter_version
from mgrpo.lora import adapter_deltas


class ServedAdapters:
    def __init__(self, base: HFEngine) -> None:
        self.base = base  # the engine of the base: requests naming no adapter
        self.loaded: dict[str, int] = {}  # adapter name → the version it was served as
        self.engines: dict[str, HFEngine] = {}  # family → the engine of its newest adapter
        self.adapted: dict[str, set[str]] = {}  # family → the base tensors its engine has changed

    def engine_for(self, name: str | None) -> HFEngine:
        """The engine a request naming `name` (a loaded adapter, or None for the base) samples from."""
        return self.base if name is None else self.engines[adapter_family(name)]

    def load(self, name: str, path: str) -> int:
        """Serve the adapter folder at `path` as `name`: merged into its family's engine (made at the
        family's first adapter); returns the version it is served as. ValueError: not an adapter of
        this server's base."""
        deltas = adapter_deltas(path)
        base = dict(self.base.newest.named_parameters())
        if missing := [n for n in deltas if n not in base or base[n].shape != deltas[n].shape]:
            raise ValueError(
                f"the adapter at {path} adapts {missing[:3]}, which this server's model does not have "
                "in that shape: was it trained on the base this server serves?"
            )
        family = adapter_family(name)
        engine = self.engines.get(family)
        if engine is None:
            model = copy.deepcopy(self.base.newest)
            engine = HFEngine(model, self.base.tokenizer, max_batch=self.base.max_batch)
            self.engines[family], self.adapted[family] = engine, set()
        version = adapter_version(name, engine.weights_version + 1)
        with engine.paused(), torch.no_grad():
            params = dict(engine.model.named_parameters())
            for n in self.adapted[family] | deltas.keys():
                delta = deltas.get(n)
                params[n].copy_(
                    base[n] if delta is None else base[n] + delta.to(base[n].device, base[n].dtype)
                )
            engine.weights_version = version
        self.adapted[family] = set(deltas)
        self.loaded[name] = version
        return version

    def unload(self, name: str) -> bool:
        """Stop serving `name` (its family's engine keeps the newest adapter merged); False: not loaded."""
        return self.loaded.pop(name, None) is not None

    def drop(self) -> None:
        """New full weights: every adapter was trained on the old base."""
        self.loaded.clear()
        self.adapted.clear()
        for served in self.engines.values():
            served.close()
        self.engines.clear()
