"""LoRA roles: a role trains an adapter on its frozen base model (`roles.<r>.lora`, with peft).

`Adapter` wraps the role's base model. peft puts A and B beside each adapted layer; the base's tensors
are frozen and never reach the optimizer. The role trains `model`, the same Hugging Face model object
with the LoRA layers inside, so every path of the update (micro-batches, the shared-prefix forward,
compile) runs as for a full model. Rollouts sample from `merged`: a plain copy of the base whose
adapted layers hold W + (alpha / r)·B·A after each `merge()` (the hf engine's static decoder reads
weights by attribute, which would bypass an unmerged LoRA layer). The KL reference is the base itself
with the adapter switched off (`reference`), not a second copy.

Checkpoints are peft adapter folders (`peft.save_pretrained`: adapter_config.json naming the base's
path, adapter_model.safetensors), which `peft.PeftModel.from_pretrained`, transformers and SGLang's LoRA
loading read, and which `mgrpo.models.load` loads merged. The checkpoint's `mgrpo.json` records the
base's path and sha256 (`meta`); a resume onto another base is refused (`check_base`)."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from mgrpo.config import LoraSpec
from mgrpo.models import ADAPTER_CONFIG, quiet_peft

if TYPE_CHECKING:  # peft costs two seconds at import: every trainer would pay it, not only LoRA roles'
    from peft import LoraConfig, PeftModel

ADAPTER = "default"  # peft's name of a model's one adapter
WEIGHT_FILES = ("*.safetensors", "*.bin")
_NO_LAYER = (
    "lora.target_modules {!r} matches no linear layer of the model: name its layers (e.g. q_proj, "
    "v_proj) or give 'all-linear'"
)


def peft_config(spec: LoraSpec) -> LoraConfig:
    """peft's config of a role's `lora` (the output head is never adapted: it is tied to the embeddings)."""
    from peft import LoraConfig  # peft's import costs two seconds: only where a role has an adapter

    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,  # type: ignore[arg-type]  # peft annotates int, computes alpha / r in floats
        lora_dropout=spec.dropout,
        target_modules=spec.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def weights_sha256(path: str | Path) -> str:
    """The sha256 of a model folder's weight files (names and bytes, in name order): which base an
    adapter was trained on. '' for a name that is not a local folder (a hub model)."""
    folder = Path(path)
    files = sorted(f for pattern in WEIGHT_FILES for f in folder.glob(pattern)) if folder.is_dir() else []
    if not files:
        return ""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode())
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


class Adapter:
    def __init__(
        self,
        base: PreTrainedModel,
        spec: LoraSpec,
        *,
        base_path: str,
        resume: Path | None = None,
        seed: int = 0,
        base_sha256: str | None = None,
    ) -> None:
        """`base`: the role's starting model, loaded from `base_path`; the adapter is new (its A drawn
        with `seed`, B = 0, so the role starts as the base) or the one of a checkpoint (`resume`).
        `base_sha256`: the base's `weights_sha256` when already known (roles on one base: hashed once)."""
        from peft import PeftModel, get_peft_model  # two seconds at import: LoRA roles only
        from peft.tuners.lora import LoraLayer  # ditto

        self.spec, self.base_path = spec, base_path
        self.base_sha256 = weights_sha256(base_path) if base_sha256 is None else base_sha256
        self.merged = _plain_copy(base)
        with torch.random.fork_rng(devices=[]), quiet_peft():
            torch.manual_seed(seed)
            try:
                self.peft: PeftModel = (
                    cast(PeftModel, get_peft_model(base, peft_config(spec), adapter_name=ADAPTER))
                    if resume is None
                    else PeftModel.from_pretrained(base, str(resume), is_trainable=True)
                )
            except ValueError as exc:  # peft's "Target modules … not found in the base model"
                raise ValueError(f"{_NO_LAYER.format(spec.target_modules)} ({exc})") from None
        self.peft.peft_config[ADAPTER].base_model_name_or_path = base_path
        self.model = cast(PreTrainedModel, self.peft.get_base_model())
        self.layers: dict[str, Any] = {
            n: m for n, m in self.model.named_modules() if isinstance(m, LoraLayer)
        }
        if not self.layers:
            raise ValueError(_NO_LAYER.format(spec.target_modules))
        self.merge()

    def shared_base(self) -> PreTrainedModel:
        """A plain model whose every parameter is this adapter's frozen base's own tensor (shared, not
        copied): where a co-located role puts its adapter (roles on one base in one trainer)."""
        injected = dict(self.model.named_parameters())
        memo: dict[int, Any] = {}
        for name, p in self.merged.named_parameters():
            layer, _, leaf = name.rpartition(".")
            if layer in self.layers:  # an adapted layer: its base's tensor, not the merged one
                memo[id(p)] = getattr(self.layers[layer].get_base_layer(), leaf)
            else:
                memo[id(p)] = injected[name]
        clone: PreTrainedModel = copy.deepcopy(self.merged, memo)
        return clone

    def trainable(self) -> list[torch.nn.Parameter]:
        """The adapter's parameters: all that the optimizer holds."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def bytes(self) -> int:
        """The adapter's size: what a push to a rollout server moves per update (a role training all
        its weights moves the whole model)."""
        return sum(p.numel() * p.element_size() for p in self.trainable())

    @torch.no_grad()
    def merge(self) -> None:
        """Write base + adapter into `merged`'s adapted layers (the rollout engine's weights)."""
        for name, layer in self.layers.items():
            target = cast(torch.Tensor, self.merged.get_submodule(name).weight)
            base: torch.Tensor = layer.get_base_layer().weight
            target.copy_(base + layer.get_delta_weight(ADAPTER).to(base.dtype))

    def reference(self, **inputs: Any) -> Any:
        """The base model's forward (the adapter off): the KL penalty's frozen starting model."""
        return base_forward(self.model, **inputs)

    def meta(self) -> dict[str, Any]:
        """What a checkpoint records of the base (`check_base` compares it on resume)."""
        return {"lora_base": {"path": self.base_path, "sha256": self.base_sha256}}

    def check_base(self, meta: dict[str, Any], checkpoint: Path) -> None:
        """Refuse to resume an adapter onto a base other than the one it was trained on."""
        recorded = meta.get("lora_base", {}).get("sha256", "")
        if recorded and self.base_sha256 and recorded != self.base_sha256:
            raise RuntimeError(
                f"checkpoint {checkpoint} holds an adapter trained on a base with weights sha256 "
                f"{recorded[:16]}…, but {self.base_path} now has {self.base_sha256[:16]}…: restore that "
                "base, or start the job again under a new id"
            )


def inject(model: torch.nn.Module, spec: LoraSpec) -> None:
    """peft's LoRA layers put into `model` in place (adapter 'default', the base frozen), as `Adapter`
    has them: what each rank of a LoRA role on W ranks builds before it takes rank 0's weights."""
    from peft import inject_adapter_in_model  # two seconds at import: LoRA roles only

    with quiet_peft():
        inject_adapter_in_model(peft_config(spec), model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)


def base_forward(model: torch.nn.Module, **inputs: Any) -> Any:
    """`model`'s forward with its LoRA layers switched off: the frozen base. Only the layers' switch
    moves (peft's `disable_adapter` also flips the adapter's requires_grad, which FSDP2's sharded
    parameters must not see mid-update)."""
    from peft.tuners.tuners_utils import BaseTunerLayer  # LoRA roles only (peft's import is slow)

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        return model(**inputs)
    finally:
        for layer in layers:
            layer._disable_adapters = False


def adapter_deltas(folder: str | Path) -> dict[str, torch.Tensor]:
    """What a peft LoRA adapter folder adds to its base: {weight name in the base model: (alpha / r)·B·A}
    (alpha / √r with rslora). For a server that holds the base and merges each pushed adapter into it
    (`mgrpo engine`); a folder of another kind of adapter (DoRA, fan-in-fan-out layers) is refused."""
    path = Path(folder)
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text())
        tensors = load_file(str(path / "adapter_model.safetensors"))
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{folder} is not a peft adapter folder (adapter_config.json, adapter_model.safetensors): {exc}"
        ) from exc
    if config.get("peft_type") != "LORA" or config.get("use_dora") or config.get("fan_in_fan_out"):
        raise ValueError(f"{folder}: only plain LoRA adapters merge here (no DoRA, no fan-in-fan-out layers)")
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    out = {}
    for key, a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key.removesuffix(".lora_A.weight")
        b = tensors.get(f"{module}.lora_B.weight")
        if b is None:
            raise ValueError(f"{folder}: {module} has lora_A but no lora_B")
        out[f"{module.removeprefix('base_model.model.')}.weight"] = scale * (b.float() @ a.float())
    if not out:
        raise ValueError(f"{folder}: its adapter_model.safetensors holds no LoRA layer")
    return out


def _plain_copy(model: PreTrainedModel) -> PreTrainedModel:
    """An inference copy of the base (eval, no gradients) before peft changes it."""
    clone = copy.deepcopy(model)
    return clone.eval().requires_grad_(False)
