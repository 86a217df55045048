"""The job's scorer: the built-in rules, the HTTP reward endpoint (batched; down, slow or garbage →
counted errors, never a crash), and rejection of rewards outside [0, 1] or NaN."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mgrpo.config import RewardConfig
from mgrpo.scoring import Item, Scorer, exact, math_equal, normalized, numeric, regex
from services.launcher import free_port


def test_builtin_rules():
    assert exact(" Paris ", "Paris") == 1.0 and exact("paris", "Paris") == 0.0
    assert normalized("The Paris.", "paris") == 1.0 and normalized("Rome", "paris") == 0.0
    assert numeric("1,000", "1000.0") == 1.0 and numeric("12%", "12") == 1.0
    assert numeric("3.0000001", "3", rel_tol=1e-6) == 1.0 and numeric("3.1", "3") == 0.0
    assert numeric("three", "3") == 0.0
    assert regex("Lotham City", r"lotham( city)?") == 1.0 and regex("in Lotham", r"lotham") == 0.0
    assert math.isnan(regex("x", "(unclosed"))
    assert math_equal(r"\frac{1}{2}", "0.5") == 1.0 and math_equal("2/4", r"\frac{1}{2}") == 1.0
    assert math_equal("3", "0.5") == 0.0 and math_equal("no number", "1") == 0.0


def test_math_runs_off_the_main_thread():
    """math-verify's own timeouts use signal.alarm (main thread only); rollouts score on worker threads."""
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(math_equal("1/2", "0.5")))
    t.start()
    t.join(60)
    assert out == [1.0]


class Endpoint:
    """A reward server on loopback whose behaviour the test sets: ok, garbage, slow, out of range."""

    def __init__(self) -> None:
        self.mode, self.batches = "ok", []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
                outer.batches.append(items)
                if outer.mode == "slow":
                    time.sleep(1.0)
                rewards = [float(i["answer"] == i["reference"]) for i in items]
                body = {
                    "ok": json.dumps({"rewards": rewards}),
                    "garbage": "{not json",
                    "short": json.dumps({"rewards": rewards[:-1]}),
                    "range": json.dumps({"rewards": [1.5, *rewards[1:]]}),
                    "slow": json.dumps({"rewards": rewards}),
                }[outer.mode]
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/reward"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def endpoint():
    e = Endpoint()
    yield e
    e.server.shutdown()


ITEMS = [Item("q0", "a", "a"), Item("q1", "b", "c"), Item("q2", "c", "c")]


def test_http_reward_is_one_batch(endpoint):
    scorer = Scorer(RewardConfig(kind="http", url=endpoint.url, retries=0))
    scores = scorer(ITEMS)
    assert scores.values == [1.0, 0.0, 1.0] and (scores.rejected, scores.errors) == (0, 0)
    assert len(endpoint.batches) == 1 and [i["query"] for i in endpoint.batches[0]] == ["q0", "q1", "q2"]


@pytest.mark.parametrize("mode", ["garbage", "short", "slow"])
def test_a_failing_endpoint_is_counted_not_fatal(endpoint, mode):
    endpoint.mode = mode
    scorer = Scorer(RewardConfig(kind="http", url=endpoint.url, retries=1, timeout_s=0.3))
    scores = scorer(ITEMS)
    assert all(math.isnan(v) for v in scores.values) and scores.errors == 3
    assert len(endpoint.batches) == 2  # the first try and one retry
    assert "failed 2 times" in scores.messages[0]


def test_a_down_endpoint_is_counted():
    scorer = Scorer(RewardConfig(kind="http", url=f"http://127.0.0.1:{free_port()}/r", retries=0))
    scores = scorer(ITEMS)
    assert scores.errors == 3 and "ConnectError" in scores.messages[0]


def test_out_of_range_rewards_are_rejected(endpoint):
    endpoint.mode = "range"
    scores = Scorer(RewardConfig(kind="http", url=endpoint.url))(ITEMS)
    assert math.isnan(scores.values[0]) and scores.values[1:] == [0.0, 1.0]
    assert scores.rejected == 1 and "outside [0, 1]" in scores.messages[0] and "1.5" in scores.messages[0]
