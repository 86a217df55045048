"""SGLang's place in CI, which has no GPU to run it on: mgrpo's own engine server
(`services.engine_server`, the real `hf` engine behind SGLang's `/generate`, `/update_weights_from_disk`,
`/get_server_info`, `/init_weights_update_group` and `/update_weights_from_distributed` JSON; pushed
weights come over a real torch.distributed group, gloo), here on a thread of the test process with
every request recorded. `python -m tests.mgrpo.sglang_standin MODEL_DIR PORT` serves one in its own
process, on an engine that shares its model's weights (a weight group needs the trainer and the server in
different processes)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import uvicorn

from mgrpo.engines.hf import HFEngine
from services.engine_server import make_app
from shared_store.embedded import free_port


def recorder(calls: dict[str, list[Any]]) -> Any:
    """calls["generate"]: the prompt count of each request; ["update"]: the paths; and so on."""
    return lambda endpoint, got: calls.setdefault(endpoint, []).append(got)


class StandIn:
    def __init__(self, engine: HFEngine, staging: Any = None) -> None:
        """`staging`: an own-weights engine's model to receive pushed weights into (`make_app`)."""
        self.port = free_port()
        self.calls: dict[str, list[Any]] = {}
        app = make_app(engine, staging=staging, on_request=recorder(self.calls))
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="warning"))
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
    uvicorn.run(make_app(HFEngine(model, tokenizer)), port=int(sys.argv[2]), log_level="warning")
