"""Hugging Face causal LMs: load by path or name, tiny presets built from a config, offline tokenizers.

No model hub is reachable on the development machines, so tests and the demo build tiny Qwen3-style
models from a config plus a byte-level BPE tokenizer trained offline on the task's text (both in
under a second), save them as ordinary HF folders, and load them back with `from_pretrained` — the
same code that loads a real checkpoint.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
)
from transformers.utils import logging as hf_logging

from mgrpo.presets import PRESETS

hf_logging.disable_progress_bar()  # shard-writing bars would drown our own progress display

# The agents' tags are single special tokens, so stopping and parsing never depend on BPE merges.
SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<think>",
    "</think>",
    "<delegate>",
    "</delegate>",
    "<delegate_result>",
    "</delegate_result>",
    "<answer>",
    "</answer>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<result>",
    "</result>",
]


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 320,
    *,
    extra_special: tuple[str, ...] = (),
    eos: str = "<eos>",
    digits: bool = False,
) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained offline on `texts`, tags as special tokens, left padding for batched
    generation. `extra_special`, `eos`: e.g. a chat template's `<|im_start|>`, `<|im_end|>`.
    `digits`: numbers split into single digits before BPE (as Qwen's and Llama's tokenizers do), so
    "31" is never one token in one place and two in another."""
    specials = [*SPECIAL_TOKENS, *extra_special]
    if vocab_size < 256 + len(specials):
        raise ValueError(
            f"vocab_size must be >= {256 + len(specials)} (bytes + special tokens), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if digits
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token=eos,
        padding_side="left",
        additional_special_tokens=specials[2:],
    )


def build_model(
    preset: str, tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, max_positions: int = 1024
) -> PreTrainedModel:
    """A freshly initialised Qwen3-style causal LM of a named preset, sized to the tokenizer."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **PRESETS[preset],
    )
    torch.manual_seed(seed)
    return cast(PreTrainedModel, AutoModelForCausalLM.from_config(config))


def save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: str | Path) -> Path:
    """An ordinary HF folder (safetensors + config + tokenizer) that transformers, SGLang and vLLM load."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load(path_or_name: str | Path, **kwargs: Any) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a causal LM and its tokenizer with `from_pretrained` (a local folder, or a hub name where
    reachable). A peft adapter folder (a LoRA role's checkpoint, `mgrpo.lora`) loads as its base with
    the adapter merged in: a plain model, as every reader of checkpoints expects."""
    source = str(path_or_name)
    try:
        if (Path(source) / ADAPTER_CONFIG).is_file():
            model, base = _merged_adapter(source, **kwargs)
            if not (Path(source) / "tokenizer_config.json").is_file():
                source = base  # an adapter saved without its tokenizer: the base's
        else:
            model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(source, padding_side="left")
    except OSError as exc:
        raise ValueError(f"cannot load a model from {source!r}: {exc}") from exc
    return model, cast(PreTrainedTokenizerFast, tokenizer)


ADAPTER_CONFIG = "adapter_config.json"  # what makes a folder a peft adapter


def _merged_adapter(folder: str, **kwargs: Any) -> tuple[PreTrainedModel, str]:
    """An adapter folder's base (its `base_model_name_or_path`) with the adapter merged into it, and
    that base's path."""
    from peft import PeftConfig, PeftModel  # peft costs a second at import: only where an adapter is

    base_path = PeftConfig.from_pretrained(folder).base_model_name_or_path
    if not base_path:
        raise ValueError(
            f"adapter folder {folder} names no base model (adapter_config.json's base_model_name_or_path)"
        )
    base = AutoModelForCausalLM.from_pretrained(base_path, **kwargs)
    with quiet_peft():
        merged: PreTrainedModel = PeftModel.from_pretrained(base, folder).merge_and_unload()
    return merged, base_path


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """peft 0.21 asks transformers 5 a question it deprecated: the FutureWarning says nothing to a user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def place(model: PreTrainedModel, device: torch.device | str) -> PreTrainedModel:
    """Move a model to `device` in place and return it (typed: transformers' own `.to` is not)."""
    torch.nn.Module.to(model, device)
    return model


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """The keyword a model's forward takes its KV cache by: `cache` in recent transformers 5.x, where
    `past_key_values` is its deprecated alias, and `past_key_values` before (5.17 has no `cache`: it
    would land in `**kwargs` and be ignored, silently recomputing nothing from the cache)."""
    cls = type(model)
    if cls not in _CACHE_KEYWORD:
        params = inspect.signature(cls.forward).parameters
        _CACHE_KEYWORD[cls] = "cache" if "cache" in params else "past_key_values"
    return {_CACHE_KEYWORD[cls]: cache}


_CACHE_KEYWORD: dict[type, str] = {}


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def token_logprobs(
    model: PreTrainedModel | Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Teacher-forced log-probs of each next token: out[:, t] = log p(input_ids[:, t+1] | prefix).

    input_ids, attention_mask: (B, T) with left or right padding. Returns (B, T-1). The same
    temperature scaling as the rollout engine (logits / T), so these match the recorded `logp_old`.
    `model` may also be a compiled forward of one (`mgrpo.training.compiled_forward`).
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).logits  # (B, T, V)
    return logits_logprobs(logits, input_ids, temperature)


def logits_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """`token_logprobs` from the logits (B, T, V) of `input_ids` (B, T): (B, T-1)."""
    return target_logprobs(logits[:, :-1], input_ids[:, 1:], temperature)


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) of each target token: logits (B, S, V) predicting targets (B, S) → (B, S)."""
    logits = logits.float() / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
