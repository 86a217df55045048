"""`sglang` engine: an HTTP client for an SGLang server (GPU nodes).

- `POST {url}/generate` with `input_ids` (a batch), `sampling_params` and `return_logprob: true`;
  each response's `meta_info.output_token_logprobs` is a list of `[logprob, token_id, text]`.
- `POST {url}/update_weights_from_disk` with `{"model_path": …}` loads a `save_pretrained` folder.
- `weight_sync="distributed"`: the trainer pushes its parameters by torch.distributed broadcast
  instead (NCCL on GPUs, gloo on the CPU). At the first push, `POST /init_weights_update_group` has the
  server's ranks (`/get_server_info`'s `tp_size`, offset 1) join a group at `sync_host` with the
  trainer as rank 0 (`mgrpo.parallel.weight_group`); each push is `POST /update_weights_from_distributed`
  with the names, dtypes and shapes, answered once the server received every tensor in that order.

SGLang reports log-probs of the sampling distribution; train at the temperature you sample with
(1.0 by default) so they are the `logp_old` the trainer needs. CI tests this client against a
stand-in HTTP server that speaks the same JSON (backed by the `hf` engine); a `gpu`-marked test runs
it against a real SGLang server. SGLang itself is the optional `gpu` extra (it pins a CUDA torch).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Literal

import httpx
import torch

from mgrpo.engines.base import FinishReason, Sample, SamplingParams

WeightSync = Literal["disk", "distributed"]


class SGLangError(RuntimeError):
    pass


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
    ) -> None:
        """`weight_sync`, `sync_host`: see the module docstring (`sync_host` '' = this host's address
        by its name, which the server must reach)."""
        self.base_url = base_url.rstrip("/")
        self.eos_token_id = eos_token_id
        self.weights_version = 0  # the policy version last loaded with update_weights
        self.weight_sync = weight_sync
        self.sync_host = sync_host
        self._group: Any = None  # the weight group, opened at the first push
        self._group_name = f"mgrpo-weights-{uuid.uuid4().hex[:8]}"
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s)

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
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        }
        if params.stop_token_ids:
            sampling["stop_token_ids"] = list(params.stop_token_ids)
        if params.stop:
            sampling["stop"] = list(params.stop)
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        body = {"input_ids": prompts, "sampling_params": sampling, "return_logprob": True}
        out = self._post("/generate", body)
        if isinstance(out, dict):
            out = [out]
        if len(out) != len(prompts):
            raise SGLangError(f"SGLang returned {len(out)} results for {len(prompts)} prompts")
        version = (
            self.weights_version
        )  # read before the call: a push during it makes samples newer, not older
        return [self._sample(o, params, version) for o in out]

    def _sample(self, o: dict[str, Any], params: SamplingParams, version: int) -> Sample:
        meta = o.get("meta_info", {})
        pairs = meta.get("output_token_logprobs") or []
        ids = [int(p[1]) for p in pairs]
        logps = [float(p[0]) for p in pairs]
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
        out = self._post("/update_weights_from_disk", {"model_path": path})
        if isinstance(out, dict) and out.get("success") is False:
            raise SGLangError(f"SGLang refused the weights at {path}: {out.get('message')}")
        self.weights_version = self.weights_version + 1 if version is None else version

    def push_weights(self, model: torch.nn.Module, version: int) -> None:
        """Broadcast `model`'s parameters (HF names; tied ones once) into the server (module
        docstring); the server samples from them once this returns."""
        from mgrpo.parallel.weight_group import broadcast_tensors

        params = [(name, p.detach().contiguous()) for name, p in model.named_parameters()]
        if self._group is None:
            self._group = self._open_group(params[0][1].device)
        body = {"names": [n for n, _ in params], "dtypes": [str(p.dtype).removeprefix("torch.") for _, p in params],
                "shapes": [list(p.shape) for _, p in params], "group_name": self._group_name, "flush_cache": True,
                "weight_version": str(version)}  # fmt: skip
        with ThreadPoolExecutor(1) as pool:  # the server receives while the call is open
            answer = pool.submit(self._post, "/update_weights_from_distributed", body)
            broadcast_tensors([p for _, p in params], self._group)
            out = answer.result()
        if isinstance(out, dict) and out.get("success") is False:
            raise SGLangError(f"SGLang refused the pushed weights: {out.get('message')}")
        self.weights_version = version

    def _open_group(self, device: torch.device) -> Any:
        from mgrpo.parallel.weight_group import open_weight_group

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
        body = {"master_address": host, "master_port": port, "rank_offset": 1, "world_size": 1 + ranks,
                "group_name": self._group_name, "backend": backend}  # fmt: skip
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
        if self._group is not None:
            from mgrpo.parallel.weight_group import close_weight_group

            close_weight_group(self._group)
            self._group = None
        self._client.close()
