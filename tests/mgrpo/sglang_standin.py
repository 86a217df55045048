"""A stand-in for an SGLang server: the same `/generate`, `/update_weights_from_disk`,
`/get_server_info`, `/init_weights_update_group` and `/update_weights_from_distributed` JSON, answered
by the real `hf` engine; the pushed weights come over a real torch.distributed group (gloo). Used by
CI, which has no GPU to run SGLang on. `python -m tests.mgrpo.sglang_standin MODEL_DIR PORT` serves one
in its own process (a weight group needs the trainer and the server in different processes)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI

from mgrpo.engines.base import SamplingParams
from mgrpo.engines.hf import HFEngine
from mgrpo.parallel.weight_group import broadcast_tensors, open_weight_group
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

    groups: dict[str, Any] = {}

    @app.get("/get_server_info")
    def server_info() -> Any:
        return {"tp_size": 1}

    @app.post("/init_weights_update_group")
    def init_group(body: dict[str, Any]) -> Any:
        calls.setdefault("init_group", []).append(body)
        groups[body["group_name"]] = open_weight_group(
            body["backend"], body["master_address"], body["master_port"], body["world_size"],
            body["rank_offset"], body["group_name"], timeout_s=60,
        )  # fmt: skip
        return {"success": True, "message": "joined"}

    @app.post("/update_weights_from_distributed")
    def update_distributed(body: dict[str, Any]) -> Any:
        calls.setdefault("update_distributed", []).append(body["weight_version"])
        received = [torch.empty(shape, dtype=getattr(torch, dtype))
                    for dtype, shape in zip(body["dtypes"], body["shapes"], strict=True)]  # fmt: skip
        broadcast_tensors(received, groups[body["group_name"]])
        params = dict(engine.model.named_parameters())
        missing = [n for n in body["names"] if n not in params]
        if missing:
            return {"success": False, "message": f"unknown parameters {missing[:3]}"}
        with engine.paused(), torch.no_grad():
            for name, t in zip(body["names"], received, strict=True):
                params[name].copy_(t)
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


if __name__ == "__main__":
    from mgrpo.models import load

    model, tokenizer = load(sys.argv[1])
    calls: dict[str, list[Any]] = {}
    uvicorn.run(make_app(HFEngine(model, tokenizer), calls), port=int(sys.argv[2]), log_level="warning")
