"""`hf` engine: in-process transformers generation with a KV cache and continuous batching of
concurrent requests.

Callers on any thread `submit` prompts. One worker thread owns the running batch: between two decode
steps it admits every request that has arrived (its decoder prefills them into the running batch's
cache: `mgrpo.engines.decoders`, a static preallocated cache for Llama-family models, else the HF
forward with a dynamic one), samples one token for every row, and retires finished rows at once,
resolving their futures — so a request never waits for a whole batch to finish, and a
multi-turn episode's next turn joins the batch its previous turn left. Rows with different
temperatures and top-p share a step. `forward_passes` counts model calls (prefills and decode
steps), `prefills` the admissions; 64 concurrent episodes cost about as many passes as one.

Weights: by default the engine samples from the trainer's own model object (`shares_weights`), so
the trainer pauses it while it updates (`paused()`). With `own_weights=True` it samples from its own
copy and never pauses: `push_weights(model, version)` copies a finished update into a spare model and
hands it to the worker, which swaps it in between two decode steps. Rows already running finish on
the weights they started on (their batch keeps its model until it drains); rows admitted after the
swap use the new ones, and each sample records the version it was sampled from.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mgrpo.engines.base import Sample, SamplingParams
from mgrpo.engines.decoders import Decoder, make_decoder


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: Future[Sample]
    generator: torch.Generator | None = None
    version: int = 0
    sample: Sample = field(default_factory=Sample)


@dataclass
class _Batch:
    """The running rows of one weights version, in their decoder's row order; `last[i]` is row i's
    newest sampled token (fed at the next step)."""

    model: PreTrainedModel
    version: int
    rows: list[_Request]
    decoder: Decoder
    last: torch.Tensor  # (B,)


class HFEngine:
    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch: int = 64,
        gather_ms: float = 5.0,
        intraop_threads: int | None = 1,
        own_weights: bool = False,
        version: int = 0,
        static_cache: bool | None = None,
    ) -> None:
        self.shares_weights = not own_weights  # sampling from the trainer's model object
        self.model = _copy(model) if own_weights else model.eval()  # the weights new rows start on
        self.weights_version = version  # the version of `self.model`
        self._pending: tuple[PreTrainedModel, int] | None = None  # pushed, not swapped in yet
        self._spares: list[PreTrainedModel] = []  # drained old copies, reused by the next push
        self._swap_lock = threading.Lock()
        self.swaps = 0
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.gather_s = gather_ms / 1000  # an idle engine waits this long for company before its first step
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.eos_id = tokenizer.eos_token_id
        self.intraop_threads = intraop_threads
        # StaticDecoder where the model allows it (`mgrpo.engines.decoders`); MGRPO_HF_STATIC_CACHE=0: never
        self.static_cache = (
            os.environ.get("MGRPO_HF_STATIC_CACHE", "1") != "0" if static_cache is None else static_cache
        )
        self._decoders: dict[int, Decoder] = {}  # by id(model): each model's decoder, reused when idle
        self._empty = torch.zeros(0, dtype=torch.long, device=self.model.device)
        self.forward_passes = 0
        self.prefills = 0
        self.prompt_tokens = 0  # admitted
        self.prefilled_tokens = 0  # of those, run through the model (the others came from the cache)
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._lock = threading.Lock()  # held while rows are running or the weights change
        self._pauses = 0  # trainers waiting in paused(): admit nothing new, drain, let them in
        self._pauses_lock = threading.Lock()
        self._worker = threading.Thread(target=self._loop, name="hf-engine", daemon=True)
        self._worker.start()

    # ---- public API -------------------------------------------------------------------------------
    def submit(self, prompt: list[int], params: SamplingParams) -> Future[Sample]:
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        fut: Future[Sample] = Future()
        self._queue.put(_Request(list(prompt), params, fut, _generator(params.seed)))
        return fut

    def push_weights(self, model: PreTrainedModel, version: int) -> None:
        """Hand the engine a copy of `model`'s weights as policy `version` (own-weights engines only;
        call it from the thread that updates `model`, between updates). Returns at once: the worker
        swaps the copy in between two decode steps; running rows finish on their old weights."""
        if self.shares_weights:
            raise RuntimeError("push_weights needs an engine built with own_weights=True")
        with self._swap_lock:
            spare = self._spares.pop() if self._spares else None
            stale = self._pending[0] if self._pending else None  # pushed but never used: reuse it
            self._pending = None
        if stale is not None and spare is not None:
            with self._swap_lock:
                self._spares.append(spare)
        target = stale if stale is not None else spare if spare is not None else _copy(model)
        with torch.no_grad():
            dst = [*target.parameters(), *target.buffers()]
            src = [*model.parameters(), *model.buffers()]
            if len(dst) != len(src):
                raise ValueError(f"pushed weights have {len(src)} tensors, the engine's model {len(dst)}")
            torch._foreach_copy_(dst, src)  # one call: a copy per tensor waits for the lock each
        with self._swap_lock:
            self._pending = (target, version)

    @property
    def newest(self) -> PreTrainedModel:
        """The weights rows admitted from now on start on: the newest pushed, else the current."""
        with self._swap_lock:
            return self._pending[0] if self._pending else self.model

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        futures = [self.submit(p, params) for p in prompts]
        return [f.result() for f in futures]

    def update_weights(self, path: str, version: int | None = None) -> None:
        """Load a saved checkpoint's weights (own-weights engines: as a push, swapped in between steps)."""
        with self.paused():
            state: dict[str, torch.Tensor] = {}
            for f in sorted(Path(path).glob("*.safetensors")):
                state.update(load_file(str(f)))
            if not state:
                raise ValueError(
                    f"no *.safetensors weights in {path}; save the checkpoint with save_pretrained"
                )
            target = self.model if self.shares_weights else _copy(self.model)
            missing, unexpected = target.load_state_dict(state, strict=False)
            if unexpected or [m for m in missing if "lm_head" not in m]:
                raise ValueError(
                    f"checkpoint {path} does not fit the model: missing {missing}, unexpected {unexpected}"
                )
            version = self.weights_version + 1 if version is None else version
            if self.shares_weights:
                self.weights_version = version
            else:
                if "lm_head.weight" in missing and getattr(target.config, "tie_word_embeddings", False):
                    target.tie_weights()
                self.push_weights(target, version)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold generation while the trainer changes the weights in place: running rows finish on the
        old weights, queued ones start on the new (no sample sees half an update). An own-weights
        engine never holds: the trainer's changes do not touch its copies."""
        if not self.shares_weights:
            yield
            return
        with self._pauses_lock:
            self._pauses += 1
        try:
            with self._lock:
                yield
        finally:
            with self._pauses_lock:
                self._pauses -= 1

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=5)

    # ---- worker -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        if self.intraop_threads is not None:
            _set_thread_intraop_threads(self.intraop_threads)
        closing = False
        while not closing:
            first = self._queue.get()
            if first is None:
                return
            time.sleep(self.gather_s)
            with self._lock:
                closing = self._serve([first])

    def _take(self, limit: int) -> tuple[list[_Request], bool]:
        """Queued requests, at most `limit`, without waiting; and whether close() was called."""
        got: list[_Request] = []
        while len(got) < limit:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return got, True
            got.append(item)
        return got, False

    def _adopt_pushed(self) -> None:
        """Make the newest pushed weights the ones new rows start on (worker thread only)."""
        with self._swap_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self.model, self.weights_version = pending
            self.swaps += 1

    def _serve(self, first: list[_Request]) -> bool:
        """Step the running batches until they are empty, admitting queued requests between steps (not
        while a trainer waits to pause). Rows of one weights version share a batch; an older version's
        batch takes no new rows and its model is kept as a spare once it drains. Returns whether
        close() was called."""
        batches: list[_Batch] = []  # oldest version first; the last one may be the current version's
        new, closing = self._take(self.max_batch - len(first))
        new = first + new
        while batches or new:
            self._adopt_pushed()
            for r in new:
                r.version = self.weights_version
            current = batches[-1] if batches and batches[-1].model is self.model else None
            stepped: list[_Batch] = []
            for b in batches:
                joining = new if b is current else []
                try:
                    stepped.append(self._sample_and_retire(*self._step(b, joining)))
                except Exception as exc:  # a failed step fails its callers, never the worker
                    _fail(b.rows + joining, exc)
            if new and current is None:
                try:
                    stepped.append(self._sample_and_retire(*self._step(None, new)))
                except Exception as exc:
                    _fail(new, exc)
            batches = [b for b in stepped if b.rows]
            for b in stepped:
                if not b.rows and b.model is not self.model and not self.shares_weights:
                    with self._swap_lock:
                        self._spares.append(b.model)
            new = []
            room = self.max_batch - sum(len(b.rows) for b in batches)
            if not closing and not self._pauses and room > 0:
                new, closing = self._take(room)
        return closing

    def _step(self, batch: _Batch | None, new: list[_Request]) -> tuple[_Batch, torch.Tensor]:
        """One decode step of a batch's rows and a prefill of the new ones on the current weights:
        (joined batch, logits (B, V))."""
        logits: list[torch.Tensor] = []
        if batch is None:
            batch = _Batch(self.model, self.weights_version, [], self._decoder(self.model), self._empty)
        elif batch.rows:
            self.forward_passes += 1
            logits.append(batch.decoder.step(batch.last))
        if new:
            self.forward_passes += 1
            self.prefills += 1
            before = batch.decoder.prefilled_tokens
            logits.append(batch.decoder.admit([r.prompt for r in new]))
            self.prompt_tokens += sum(len(r.prompt) for r in new)
            self.prefilled_tokens += batch.decoder.prefilled_tokens - before
            batch.rows = batch.rows + new
            batch.last = torch.cat([batch.last, batch.last.new_zeros(len(new))])  # filled by the sampler
        return batch, logits[0] if len(logits) == 1 else torch.cat(logits)

    def _decoder(self, model: PreTrainedModel) -> Decoder:
        """A decoder for `model`: reused from the last batch of that model (its cache stays allocated)."""
        idle = self._decoders.get(id(model))
        if idle is not None and idle.model is model and len(idle) == 0:
            return idle
        live = {id(self.model), *(id(m) for m in self._spares)}
        self._decoders = {k: d for k, d in self._decoders.items() if k in live}  # none for dropped models
        self._decoders[id(model)] = decoder = make_decoder(model, self.pad_id, static=self.static_cache)
        return decoder

    def _sample_and_retire(self, batch: _Batch, logits: torch.Tensor) -> _Batch:
        """Sample every row's next token; resolve and drop finished rows (the batch may end empty)."""
        rows = batch.rows
        next_ids, logps = _sample(logits, rows)
        toks, lps = next_ids.tolist(), logps.tolist()  # one device sync per step, not per row
        keep: list[int] = []
        for i, r in enumerate(rows):
            s = r.sample
            s.token_ids.append(toks[i])
            s.logprobs.append(lps[i])
            if self._finished(s, toks[i], r.params, len(s.token_ids) >= r.params.max_new_tokens):
                s.text = str(self.tokenizer.decode(s.token_ids, skip_special_tokens=False))
                s.weights_version = r.version
                r.future.set_result(s)
            else:
                keep.append(i)
        if not keep:
            batch.decoder.keep([])
            batch.rows = []
            return batch
        batch.last = next_ids
        if len(keep) < len(rows):
            batch.decoder.keep(keep)
            batch.rows, batch.last = (
                [rows[i] for i in keep],
                next_ids[torch.tensor(keep, device=next_ids.device)],
            )
        return batch

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


def _fail(rows: list[_Request], exc: Exception) -> None:
    for r in rows:
        if not r.future.done():
            r.future.set_exception(exc)


def _copy(model: PreTrainedModel) -> PreTrainedModel:
    """An inference copy of `model` (eval, no gradients), without what the trainer hung on it."""
    memo = {id(v): None for k, v in vars(model).items() if k.startswith("_mgrpo")}
    clone = copy.deepcopy(model, memo)
    for p in clone.parameters():
        p.grad = None
    return clone.eval().requires_grad_(False)


def _set_thread_intraop_threads(n: int) -> None:
    """Run this thread's CPU ops on `n` OpenMP threads, leaving the trainer's threads as they are
    (`torch.set_num_threads` is process-wide). A decode step is many small ops: measured here, after a
    training step on another thread, two-thread decode steps took 7.8 ms and one-thread ones 4.2 ms
    (the trainer's team and the engine's contend for 2 cores), while the update keeps both cores.

    The large op first starts torch's per-thread setup and an OpenMP helper thread that lives on. With
    more OpenMP threads than cores, libgomp shortens every team's spin-wait between regions to almost
    nothing. Setting the size first (no helper) made one process's update 1.5x faster (0.14 against
    0.21 s) but the demo's updates 1.6-3.8x slower, most likely as its trainer processes then spin
    against each other on the 2 cores they share (docs/results.md, "Decode path"). So the helper
    stays, on purpose."""
    torch.zeros(1 << 20).add_(1)  # torch sets this thread's OpenMP team size at its first parallel op
    with contextlib.suppress(OSError, AttributeError):  # torch's OpenMP runtime is libgomp on Linux wheels
        ctypes.CDLL("libgomp.so.1").omp_set_num_threads(n)
    _set_thread_mkl_threads(n)


def _set_thread_mkl_threads(n: int) -> None:
    """MKL's team size for this thread's matmuls. MKL keeps its own count, process-wide, which
    `torch.set_num_threads` sets: a one-thread OpenMP team alone still ran every matmul on all cores.
    Measured here (64 rollouts of ≤ 48 tokens, torch on 2 threads): 0.36 s without this, 0.22 s with
    it, as with torch on 1 thread. torch's x86 wheels link MKL into libtorch_cpu, whose exported
    `mkl_set_num_threads_local` takes its argument by reference; elsewhere (no MKL) nothing to do."""
    if not torch.backends.mkl.is_available():
        return
    with contextlib.suppress(OSError, AttributeError):
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        lib.mkl_set_num_threads_local(ctypes.byref(ctypes.c_int(n)))


def _generator(seed: int | None) -> torch.Generator | None:
    return None if seed is None else torch.Generator().manual_seed(seed)


def _sample(logits: torch.Tensor, rows: list[_Request]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row at the row's own temperature and top-p; return (ids (B,), logp (B,)
    under softmax(logits / T), T = 1 for greedy rows)."""
    temps = [r.params.temperature for r in rows]
    top_ps = [r.params.top_p for r in rows]
    dev = logits.device
    scale = torch.tensor([t if t > 0 else 1.0 for t in temps], device=dev).unsqueeze(-1)  # (B, 1)
    logp_all = torch.log_softmax(logits / scale, -1)  # (B, V)
    probs = logp_all.exp()
    if min(top_ps) < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        top_p = torch.tensor(top_ps, device=dev).unsqueeze(-1)  # (B, 1)
        keep = (sorted_p.cumsum(-1) - sorted_p < top_p) | (top_p >= 1.0)  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    cdf = probs.cumsum(-1)  # (B, V)
    draws = [
        torch.rand((), generator=r.generator) if t > 0 else torch.zeros(())
        for r, t in zip(rows, temps, strict=True)
    ]
    u = torch.stack(draws).to(dev) * cdf[:, -1]  # (B,)
    ids = torch.searchsorted(cdf, u.unsqueeze(-1)).squeeze(-1).clamp(max=logits.shape[-1] - 1)
    if min(temps) == 0:
        greedy = torch.tensor([t == 0 for t in temps], device=dev)
        ids = torch.where(greedy, logits.argmax(-1), ids)
    return ids, logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
