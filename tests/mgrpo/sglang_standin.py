"""A stand-in for an SGLang server: the same `/generate` and `/update_weights_from_disk` JSON,
answered by the real `hf` engine. Used by CI, which has no GPU to run SGLang on."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI

from mgrpo.engines.base import SamplingParams
from mgrpo.engines.hf import HFEngine
from shared_store.embedded import free_port


def make_app(engine: HFEngine, calls: dict[str, list[Any]]) -> FastAPI:
    """`calls` records every request: calls["generate"] the prompt counts, calls["update"] the paths."""
    app = FastAPI()

    @app.post("/generate")
    def generate(body: dict[str, Any]) -> Any:
        sp = body["sampling_params"]
        params = SamplingParams(
            max_new_tokens=sp["max_new_tokens"], temperature=sp["temperature"], top_p=sp["top_p"],
            stop_token_ids=tuple(sp.get("stop_token_ids", ())), seed=sp.get("sampling_seed"),
        )  # fmt: skip
        calls.setdefault("generate", []).append(len(body["input_ids"]))
        samples = engine.generate(body["input_ids"], params)
        return [
            {
                "text": s.text,
                "output_ids": s.token_ids,
                "meta_info": {
                    "finish_reason": {"type": "length" if s.finish_reason == "length" else "stop"},
                    "output_token_logprobs": [
                        [lp, t, None] for lp, t in zip(s.logprobs, s.token_ids, strict=True)
                    ],
                    "completion_tokens": len(s.token_ids),
                },
            }
            for s in samples
        ]

    @app.post("/update_weights_from_disk")
    def update(body: dict[str, Any]) -> Any:
        calls.setdefault("update", []).append(body["model_path"])
        try:
            engine.update_weights(body["model_path"])
        except ValueError as exc:
            return {"success": False, "message": str(exc)}
        return {"success": True, "message": "ok"}

    return app


class StandIn:
    def __init__(self, engine: HFEngine) -> None:
        self.port = free_port()
        self.calls: dict[str, list[Any]] = {}
        self.server = uvicorn.Server(
            uvicorn.Config(make_app(engine, self.calls), port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
