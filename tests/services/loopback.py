"""A user's servers on loopback for the end-to-end tests: a reward endpoint and HTTP tools."""

from __future__ import annotations

import difflib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mgrpo.algo.rewards import normalize_answer
from mgrpo.config import JobConfig
from mgrpo.scoring import normalized
from mgrpo.workflows.deep_research_warmstart import job_task
from services.launcher import free_port


class RewardServer:
    """The user's reward endpoint on loopback: normalised exact match, or with `graded` partial credit
    (difflib's similarity of the normalised texts, in [0, 1]); every batch kept."""

    def score(self, answer: str, reference: str) -> float:
        if self.graded:
            return difflib.SequenceMatcher(
                None, normalize_answer(answer), normalize_answer(reference)
            ).ratio()
        return normalized(answer, reference)

    def __init__(self, *, graded: bool = False) -> None:
        self.batches: list[list[dict]] = []
        self.graded = graded
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
                outer.batches.append(items)
                body = json.dumps(
                    {"rewards": [outer.score(i["answer"], i["reference"]) for i in items]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/reward"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class FlakyToolServer:
    """The user's HTTP tools `search` and `open` over the built-in world's corpus (so the warm-started
    sub-agent uses them), failing on purpose: every 5th call sleeps past the job's timeout, every
    7th answers invalid JSON (unless `flaky` is false), and after `alive_calls` calls it is killed."""

    def __init__(self, alive_calls: int = 10**9, job: JobConfig | None = None, *, flaky: bool = True) -> None:
        self.calls, task = 0, job_task(job or JobConfig())
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls += 1
                n = outer.calls
                if n == alive_calls:
                    threading.Thread(target=outer.server.shutdown).start()
                if flaky and n % 5 == 0:
                    time.sleep(1.5)
                result = task.tools[body["name"]](body["argument"])
                payload = "{oops" if flaky and n % 7 == 0 else json.dumps({"result": result})
                try:
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(payload.encode())
                except BrokenPipeError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/tool"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
