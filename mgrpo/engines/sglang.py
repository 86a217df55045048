"""`sglang` engine: an HTTP client for an SGLang server (GPU nodes).

- `POST {url}/generate` with `input_ids` (a batch), `sampling_params` and `return_logprob: true`;
  each response's `meta_info.output_token_logprobs` is a list of `[logprob, token_id, text]`.
- `POST {url}/update_weights_from_disk` with `{"model_path": …}` loads a `save_pretrained` folder.
- `weight_sync="distributed"`: the trainer pushes its parameters by torch.distributed broadcast
  instead (NCCL on GPUs, gloo on the CPU). At the first push, `POST /init_weights_update_group` has the
  server's ranks (`/get_server_info`'s `tp_size`, offset 1) join a group at `sync_host` with the
  trainer as rank 0 (`mgrpo.parallel.weight_group`); each push is `POST /update_weights_from_distributed`
  with the names, dtypes and shapes, answered once the server received them. The tensors go packed:
  `load_format: "flattened_bucket"`, one broadcast of their bytes per bucket of at most
  `weight_bucket_mb` (one call each), as SGLang takes them since its PR 13824 (late 2025); one
  broadcast per tensor costs a round trip each, and on `mgrpo engine` a wait for the interpreter lock
  each. `weight_bucket_mb` (default `MGRPO_SGLANG_WEIGHT_BUCKET_MB`, 512) 0 sends one tensor per
  broadcast, for SGLang releases before it.
- A LoRA role (`mgrpo.lora`) sends its adapter, not its weights: `load_adapter(folder, version)` is
  SGLang's `POST /load_lora_adapter` `{"lora_name": "mgrpo-<role>-v<version>", "lora_path": folder}`
  (a peft adapter folder the server can read; the server started with `--enable-lora`), and every
  later `/generate` names it (`lora_path`, SGLang's field for the adapter's name); the adapter before
  the previous one is unloaded (`/unload_lora_adapter`), so rows still running on the previous one
  finish. A sample's version is the named adapter's (or the server's `meta_info.lora_version` where
  it says, as `mgrpo engine` does). The role in the name lets roles on one base (`share_model_with`)
  share the servers: each role's requests name its own adapters, and a role whose servers another
  role loaded the base onto (`load_base=False` in `mgrpo.runtime.rollout_engine`) never reloads it.
- Concurrent `generate` calls (an agent loop's episodes, each on its own thread) are sent together:
  calls that arrive within `coalesce_ms` of the first go as one `/generate` batch with one sampling
  dict per prompt, so a step's 64 rollouts cost one request, not 64 that reach the server's batch one
  by one. `coalesce_ms` 0 sends each call as it comes.

SGLang reports log-probs of the sampling distribution; train at the temperature you sample with
(1.0 by default) so they are the `logp_old` the trainer needs. CI tests this client against a
stand-in HTTP server that speaks the same JSON (backed by the `hf` engine); a `gpu`-marked test runs
it against a real SGLang server. SGLang itself is the optional `gpu` extra (it pins a CUDA torch).
"""

from __future__ import annotations

import os
import queue
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import torch

from mgrpo.engines.base import FinishReason, Sample, SamplingParams
from mgrpo.parallel.weight_group import (
    broadcast_tensors,
    byte_buckets,
    close_weight_group,
    flatten_bytes,
    open_weight_group,
)

WeightSync = Literal["disk", "distributed"]


class SGLangError(RuntimeError):
    pass


def bucket_mb() -> float:
    """`MGRPO_SGLANG_WEIGHT_BUCKET_MB`: the largest bucket of a push by broadcast, in MB (0: a tensor
    per broadcast)."""
    raw = os.environ.get("MGRPO_SGLANG_WEIGHT_BUCKET_MB", "512")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise SGLangError(
            f"MGRPO_SGLANG_WEIGHT_BUCKET_MB={raw!r}: set a size in MB, or 0 for a tensor per broadcast"
        )
    return value


class SGLangEngine:
    shares_weights = False  # its own copy of the weights: the trainer pushes every checkpoint

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 300.0,
        eos_token_id: int | None = None,
        weight_sync: WeightSync = "disk",
        sync_host: str = "",
        coalesce_ms: float = 5.0,
        weight_bucket_mb: float | None = None,
        adapter_family: str = "mgrpo",
    ) -> None:
        """`weight_sync`, `sync_host`, `coalesce_ms`, `weight_bucket_mb`: see the module docstring
        (`sync_host` '' = this host's address by its name, which the server must reach).
        `adapter_family`: what a LoRA role's adapters are named by before their version
        (`adapter_name`; `mgrpo-<role>` for a role's trainer)."""
        self.base_url = base_url.rstrip("/")
        self.adapter_family = adapter_family
        self.eos_token_id = eos_token_id
        self.weights_version = 0  # the policy version last loaded with update_weights
        self.weight_sync = weight_sync
        self.broadcasts = weight_sync == "distributed"  # each policy pushed by broadcast, not from disk
        self.sync_host = sync_host
        self._group: Any = None  # the weight group, opened at the first push
        self._group_name = f"mgrpo-weights-{uuid.uuid4().hex[:8]}"
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s)
        self.coalesce_s = coalesce_ms / 1000
        self.weight_bucket_bytes = int(
            (bucket_mb() if weight_bucket_mb is None else weight_bucket_mb) * 2**20
        )
        self.requests = 0  # /generate requests sent
        self.adapters: list[tuple[str, int]] = []  # the loaded LoRA adapters (name, version), newest last
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._sender: threading.Thread | None = None
        self._sender_lock = threading.Lock()
        self._closed = False
        self._senders = ThreadPoolExecutor(16, thread_name_prefix="sglang-generate")  # batches in flight

    def _post(self, path: str, payload: dict[str, Any]) -> Any:
        try:
            resp = self._client.post(path, json=payload)
        except httpx.HTTPError as exc:
            raise SGLangError(
                f"SGLang server at {self.base_url} is unreachable ({exc}); is it running?"
            ) from exc
        if resp.status_code != 200:
            raise SGLangError(f"SGLang {path} answered {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        if self.coalesce_s <= 0:
            return self._generate([(p, params) for p in prompts])
        with self._sender_lock:
            if self._closed:
                raise SGLangError(f"the engine for {self.base_url} is closed")
            if self._sender is None:
                self._sender = threading.Thread(target=self._coalesce, name="sglang-coalesce", daemon=True)
                self._sender.start()
        call = _Call(prompts, params, Future())
        self._calls.put(call)
        return call.future.result()

    def _coalesce(self) -> None:
        """The sender thread: the first waiting call and every call that arrives within `coalesce_s`
        of it go as one request (sent from a pool, so the next batch gathers meanwhile)."""
        while True:
            first = self._calls.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.coalesce_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    call = self._calls.get(timeout=left)
                except queue.Empty:
                    break
                if call is None:
                    self._calls.put(None)  # close() after this batch
                    break
                batch.append(call)
            self._senders.submit(self._send, batch)

    def _send(self, batch: list[_Call]) -> None:
        try:
            samples = self._generate([(p, c.params) for c in batch for p in c.prompts])
        except BaseException as exc:
            for c in batch:
                c.future.set_exception(exc)
            return
        start = 0
        for c in batch:
            c.future.set_result(samples[start : start + len(c.prompts)])
            start += len(c.prompts)

    def _generate(self, requests: list[tuple[list[int], SamplingParams]]) -> list[Sample]:
        """One `/generate` request: a batch of prompts, one sampling dict each (one for all when equal)."""
        prompts = [p for p, _ in requests]
        per = [_sampling(params) for _, params in requests]
        body: dict[str, Any] = {
            "input_ids": prompts,
            "sampling_params": per[0] if all(d == per[0] for d in per) else per,
            "return_logprob": True,
        }
        adapter = self.adapters[-1] if self.adapters else None
        if adapter is not None:
            body["lora_path"] = [adapter[0]] * len(prompts)
        self.requests += 1
        out = self._post("/generate", body)
        version = self.weights_version  # after the call: a push during it makes samples newer, not older
        if adapter is not None:
            version = adapter[1]  # the adapter named is the one that sampled
        if isinstance(out, dict):
            out = [out]
        if len(out) != len(prompts):
            raise SGLangError(f"SGLang returned {len(out)} results for {len(prompts)} prompts")
        return [self._sample(o, params, version) for o, (_, params) in zip(out, requests, strict=True)]

    def _sample(self, o: dict[str, Any], params: SamplingParams, version: int) -> Sample:
        meta = o.get("meta_info", {})
        pairs = meta.get("output_token_logprobs") or []
        ids = [int(p[1]) for p in pairs]
        logps = [float(p[0]) for p in pairs]
        said = meta.get("lora_version") if self.adapters else meta.get("weight_version")
        version = weight_version(said, version)  # the server's word, where it says
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type") if isinstance(finish, dict) else str(finish)
        return Sample(ids, logps, self._reason(kind, ids, params), str(o.get("text", "")), version)

    def _reason(self, kind: str | None, ids: list[int], params: SamplingParams) -> FinishReason:
        """Same precedence as the hf engine: a stop token, then EOS, then the length limit."""
        if kind == "length" or not ids:
            return "length"
        if ids[-1] in params.stop_token_ids or params.stop:
            return "stop"
        if self.eos_token_id is None or ids[-1] == self.eos_token_id:
            return "eos"
        return "stop"

    def update_weights(self, path: str, version: int | None = None) -> None:
        """Load a saved HF folder the server can read; `version`: the policy version it holds."""
        version = self.weights_version + 1 if version is None else version
        out = self._post("/update_weights_from_disk", {"model_path": path, "weight_version": str(version)})
        if isinstance(out, dict) and out.get("success") is False:
            raise SGLangError(f"SGLang refused the weights at {path}: {out.get('message')}")
        self.weights_version = version

    def load_adapter(self, path: str, version: int) -> None:
        """Load a LoRA role's adapter folder (the server can read it) as policy `version`: later
        requests name it (module docstring)."""
        name = adapter_name(self.adapter_family, version)
        out = self._post("/load_lora_adapter", {"lora_name": name, "lora_path": path})
        if isinstance(out, dict) and out.get("success") is False:
            raise SGLangError(
                f"SGLang refused the adapter at {path}: {out.get('error_message') or out.get('message')} "
                "(is the server started with --enable-lora and a --max-lora-rank ≥ the role's rank?)"
            )
        self.adapters.append((name, version))
        self.weights_version = version
        while len(self.adapters) > 2:  # the previous one may still be sampling: keep it
            old, _ = self.adapters.pop(0)
            self._post("/unload_lora_adapter", {"lora_name": old})

    def push_weights(self, model: torch.nn.Module, version: int) -> None:
        """Broadcast `model`'s parameters (HF names; tied ones once) into the server (module
        docstring); the server samples from them once this returns."""
        params = [(name, p.detach().contiguous()) for name, p in model.named_parameters()]
        if self._group is None:
            self._group = self._open_group(params[0][1].device)
        sizes = [p.numel() * p.element_size() for _, p in params]
        bucketed = self.weight_bucket_bytes > 0
        for part in byte_buckets(sizes, self.weight_bucket_bytes) if bucketed else [range(len(params))]:
            chunk = [params[i] for i in part]
            body = {
                "names": [n for n, _ in chunk],
                "dtypes": [str(p.dtype).removeprefix("torch.") for _, p in chunk],
                "shapes": [list(p.shape) for _, p in chunk],
                "group_name": self._group_name,
                "flush_cache": True,
                "weight_version": str(version),
            }
            if bucketed:
                body["load_format"] = "flattened_bucket"
            with ThreadPoolExecutor(1) as pool:  # the server receives while the call is open
                answer = pool.submit(self._post, "/update_weights_from_distributed", body)
                if bucketed:
                    torch.distributed.broadcast(
                        flatten_bytes([p for _, p in chunk]), src=0, group=self._group
                    )
                else:
                    broadcast_tensors([p for _, p in chunk], self._group)
                out = answer.result()
            if isinstance(out, dict) and out.get("success") is False:
                raise SGLangError(f"SGLang refused the pushed weights: {out.get('message')}")
        self.weights_version = version

    def _open_group(self, device: torch.device) -> Any:
        try:
            info = self._client.get("/get_server_info")
        except httpx.HTTPError as exc:
            raise SGLangError(
                f"SGLang server at {self.base_url} is unreachable ({exc}); is it running?"
            ) from exc
        ranks = int(info.json().get("tp_size", 1)) if info.status_code == 200 else 1
        host = self.sync_host or socket.gethostbyname(socket.gethostname())
        with socket.socket() as sock:  # a free port on this host for the group's store
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        backend = "nccl" if device.type == "cuda" else "gloo"
        body = {
            "master_address": host,
            "master_port": port,
            "rank_offset": 1,
            "world_size": 1 + ranks,
            "group_name": self._group_name,
            "backend": backend,
        }
        with ThreadPoolExecutor(1) as pool:  # the server joins while this side opens the store
            answer = pool.submit(self._post, "/init_weights_update_group", body)
            try:
                group = open_weight_group(backend, host, port, 1 + ranks, 0, self._group_name, timeout_s=120)
            except RuntimeError as exc:
                raise SGLangError(
                    f"SGLang at {self.base_url} did not join the weight group at {host}:{port} ({exc}); set "
                    "the trainer's MGRPO_SGLANG_SYNC_HOST to an address the server reaches, or empty to push by disk"
                ) from exc
            out = answer.result()
        if isinstance(out, dict) and out.get("success") is False:
            raise SGLangError(f"SGLang could not join the weight group: {out.get('message')}")
        return group

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing to hold: the server's weights change only through `update_weights`."""
        yield

    def close(self) -> None:
        with self._sender_lock:
            self._closed = True
        if self._sender is not None:
            self._calls.put(None)
            self._sender.join(timeout=5)
        self._senders.shutdown(wait=True)
        if self._group is not None:
            close_weight_group(self._group)
            self._group = None
        self._client.close()


def adapter_name(family: str, version: int) -> str:
    """The name policy `version`'s LoRA adapter of `family` (`mgrpo-<role>`) is loaded under on a
    rollout server."""
    return f"{family}-v{version}"


def adapter_version(name: str, default: int) -> int:
    """The policy version an adapter's name says (`adapter_name`), else `default`."""
    found = re.fullmatch(r".*-v(\d+)", name)
    return int(found.group(1)) if found else default


def adapter_family(name: str) -> str:
    """Whose adapter a name is (`adapter_name`): the name without its `-v<N>`."""
    found = re.fullmatch(r"(.*)-v\d+", name)
    return found.group(1) if found else name


def weight_version(given: object, default: int) -> int:
    """A policy version sent as SGLang's `weight_version` string (a whole number), else `default`."""
    text = str(given or "")
    return int(text) if text.isdigit() else default


@dataclass
class _Call:
    prompts: list[list[int]]
    params: SamplingParams
    future: Future[list[Sample]]


def _sampling(params: SamplingParams) -> dict[str, Any]:
    """SGLang's sampling dict for `params`."""
    out: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.stop:
        out["stop"] = list(params.stop)
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    return out
