"""`sglang` engine: an HTTP client for an SGLang server (GPU nodes).

- `POST {url}/generate` with `input_ids` (a batch), `sampling_params` and `return_logprob: true`;
  each response's `meta_info.output_token_logprobs` is a list of `[logprob, token_id, text]`.
- `POST {url}/update_weights_from_disk` with `{"model_path": …}` loads a `save_pretrained` folder.

SGLang reports log-probs of the sampling distribution; train at the temperature you sample with
(1.0 by default) so they are the `logp_old` the trainer needs. CI tests this client against a
stand-in HTTP server that speaks the same JSON (backed by the `hf` engine); a `gpu`-marked test runs
it against a real SGLang server. SGLang itself is the optional `gpu` extra (it pins a CUDA torch).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from mgrpo.engines.base import FinishReason, Sample, SamplingParams


class SGLangError(RuntimeError):
    pass


class SGLangEngine:
    shares_weights = False  # its own copy of the weights: the trainer pushes every checkpoint

    def __init__(self, base_url: str, *, timeout_s: float = 300.0, eos_token_id: int | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.eos_token_id = eos_token_id
        self.weights_version = 0  # the policy version last loaded with update_weights
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

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing to hold: the server's weights change only through `update_weights`."""
        yield

    def close(self) -> None:
        self._client.close()
