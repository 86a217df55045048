"""`hf` engine: in-process transformers generation with a KV cache, left padding, and batching of
concurrent requests.

Callers on any thread `submit` prompts; one worker thread gathers whatever is pending (up to
`max_batch`, waiting at most `gather_ms` for more), runs one batched decode loop — one forward pass
per new token for the whole batch — and resolves each request's future. So 64 concurrent episodes
cost about as many forward passes as one, not 64 times as many (`forward_passes` counts them).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from mgrpo.engines.base import Sample, SamplingParams


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: Future[Sample]


class HFEngine:
    shares_weights = True  # samples from the trainer's model object

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch: int = 64,
        gather_ms: float = 5.0,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.gather_s = gather_ms / 1000
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.eos_id = tokenizer.eos_token_id
        self.forward_passes = 0
        self.batches = 0
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._lock = threading.Lock()  # held while the model runs or its weights change
        self._worker = threading.Thread(target=self._loop, name="hf-engine", daemon=True)
        self._worker.start()

    # ---- public API -------------------------------------------------------------------------------
    def submit(self, prompt: list[int], params: SamplingParams) -> Future[Sample]:
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        fut: Future[Sample] = Future()
        self._queue.put(_Request(list(prompt), params, fut))
        return fut

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        futures = [self.submit(p, params) for p in prompts]
        return [f.result() for f in futures]

    def update_weights(self, path: str) -> None:
        with self._lock:
            state: dict[str, torch.Tensor] = {}
            for f in sorted(Path(path).glob("*.safetensors")):
                state.update(load_file(str(f)))
            if not state:
                raise ValueError(
                    f"no *.safetensors weights in {path}; save the checkpoint with save_pretrained"
                )
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            if unexpected or [m for m in missing if "lm_head" not in m]:
                raise ValueError(
                    f"checkpoint {path} does not fit the model: missing {missing}, unexpected {unexpected}"
                )

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold generation while the trainer changes the weights in place (no batch sees half an update)."""
        with self._lock:
            yield

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=5)

    # ---- worker -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.gather_s
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            self._run(batch)

    def _run(self, batch: list[_Request]) -> None:
        groups: dict[tuple[float, float], list[_Request]] = {}
        for r in batch:
            groups.setdefault((r.params.temperature, r.params.top_p), []).append(r)
        for reqs in groups.values():
            try:
                with self._lock:
                    samples = self._decode(reqs)
                for r, s in zip(reqs, samples, strict=True):
                    r.future.set_result(s)
            except Exception as exc:  # a failed batch fails its callers, never the worker
                for r in reqs:
                    if not r.future.done():
                        r.future.set_exception(exc)

    @torch.no_grad()
    def _decode(self, reqs: list[_Request]) -> list[Sample]:
        self.batches += 1
        temp, top_p = reqs[0].params.temperature, reqs[0].params.top_p
        n = len(reqs)
        width = max(len(r.prompt) for r in reqs)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(reqs):  # left padding
            ids[i, width - len(r.prompt) :] = torch.tensor(r.prompt)
            attn[i, width - len(r.prompt) :] = 1
        dev = self.model.device
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        gens = [_generator(r.params.seed) for r in reqs]
        max_new = [r.params.max_new_tokens for r in reqs]
        out = [Sample() for _ in reqs]
        done = [False] * n
        cache = DynamicCache()
        step_ids, step_pos = ids, pos
        for t in range(max(max_new)):
            logits = self.model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos, cache=cache,
                                use_cache=True, logits_to_keep=1).logits[:, -1].float()  # (B, V)  # fmt: skip
            self.forward_passes += 1
            next_ids, logps = _sample(logits, temp, top_p, gens)
            toks, lps = next_ids.tolist(), logps.tolist()  # one device sync per step, not per row
            for i, r in enumerate(reqs):
                if done[i]:
                    continue
                out[i].token_ids.append(toks[i])
                out[i].logprobs.append(lps[i])
                tok = toks[i]
                done[i] = self._finished(out[i], tok, r.params, t + 1 >= max_new[i])
            if all(done):
                break
            step_ids = next_ids.unsqueeze(-1)  # (B, 1)
            attn = torch.cat([attn, torch.ones((n, 1), dtype=torch.long, device=dev)], dim=-1)
            step_pos = step_pos[:, -1:] + 1
        for s in out:
            s.text = str(self.tokenizer.decode(s.token_ids, skip_special_tokens=False))
        return out

    def _finished(self, s: Sample, tok: int, params: SamplingParams, at_limit: bool) -> bool:
        if tok in params.stop_token_ids:
            s.finish_reason = "stop"
            return True
        if self.eos_id is not None and tok == self.eos_id:
            s.finish_reason = "eos"
            return True
        if params.stop:
            tail = str(self.tokenizer.decode(s.token_ids[-16:], skip_special_tokens=False))
            if any(stop in tail for stop in params.stop):
                s.finish_reason = "stop"
                return True
        if at_limit:
            s.finish_reason = "length"
            return True
        return False


def _generator(seed: int | None) -> torch.Generator | None:
    return None if seed is None else torch.Generator().manual_seed(seed)


def _sample(
    logits: torch.Tensor, temperature: float, top_p: float, gens: list[torch.Generator | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (ids (B,), logp (B,) under softmax(logits / T))."""
    logp_all = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), -1)  # (B, V)
    if temperature == 0:
        ids = logits.argmax(-1)
    else:
        probs = logp_all.exp()
        if top_p < 1.0:
            sorted_p, order = probs.sort(-1, descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the top token
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
        cdf = probs.cumsum(-1)  # (B, V)
        u = torch.stack([torch.rand((), generator=g) for g in gens]).to(cdf.device) * cdf[:, -1]  # (B,)
        ids = torch.searchsorted(cdf, u.unsqueeze(-1)).squeeze(-1).clamp(max=logits.shape[-1] - 1)
    return ids, logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
