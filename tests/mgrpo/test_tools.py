"""A role's tools: the calculator evaluates arithmetic and nothing else; HTTP and MCP tools answer,
and one that is down, slow, failing or returns garbage becomes a counted `tool error:` observation,
never an exception; a job's tool config is checked (unknown built-in, a role that calls no tools)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from mgrpo.config import JobConfig, ToolConfig
from mgrpo.tools import ToolBox, ToolError, calculator
from mgrpo.workflows import job_spec
from services.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_calculator():
    assert (
        calculator("2 + 3 * (4 - 1)") == "11"
        and calculator("7 / 2") == "3.5"
        and calculator("-2 ** 3") == "-8"
    )
    for bad in ("__import__('os').system('true')", "x + 1", "2 ** 1000", "1 / 0", "2 +"):
        with pytest.raises(ToolError):
            calculator(bad)


class ToolServer:
    """An HTTP tool on loopback: `echo` answers, then the test switches it to slow or garbage."""

    def __init__(self) -> None:
        self.mode, self.calls = "ok", 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls += 1
                if outer.mode == "slow":
                    time.sleep(1.0)
                payload = {
                    "ok": json.dumps({"result": f"echo {body['argument']}"}),
                    "slow": "{}",
                    "garbage": "<html>oops",
                    "wrong": json.dumps({"result": 3}),
                }[outer.mode]
                try:
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(payload.encode())
                except BrokenPipeError:  # the slow mode's caller timed out and left
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/tool"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def tool_server():
    s = ToolServer()
    yield s
    s.server.shutdown()


def test_http_tool_and_its_failures(tool_server):
    box = ToolBox(
        [
            ToolConfig(name="echo", kind="http", url=tool_server.url, timeout_s=0.3, retries=1),
            ToolConfig(name="calculator"),
        ],
        {},
    )
    assert box("echo", "hi") == "echo hi" and box("calculator", "1+1") == "2"
    assert box.take_counts() == {"tool_calls": 2.0, "tool_errors": 0.0}
    for mode, says in (
        ("slow", "no answer within 0.3 s"),
        ("garbage", "invalid response"),
        ("wrong", "must be a string"),
    ):
        tool_server.mode, before = mode, tool_server.calls
        out = box("echo", "hi")
        assert out.startswith("tool error: echo:") and says in out, out
        assert tool_server.calls - before == 2  # one retry
    tool_server.server.shutdown()
    tool_server.server.server_close()
    assert box("echo", "hi").startswith("tool error: echo: ConnectError")
    assert box("calculator", "1/0").startswith("tool error: calculator")
    assert box("fly", "x").startswith("unknown tool 'fly'")
    assert box.take_counts() == {"tool_calls": 5.0, "tool_errors": 5.0}  # since the last take
    assert box.take_counts() == {"tool_calls": 0.0, "tool_errors": 0.0}


@pytest.fixture(scope="module")
def mcp_url():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.mgrpo.mcp_server", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    yield url
    proc.kill()
    proc.wait()


def test_mcp_tool(mcp_url):
    box = ToolBox(
        [
            ToolConfig(name="shout", kind="mcp", url=mcp_url),
            ToolConfig(name="fail", kind="mcp", url=mcp_url),
            ToolConfig(name="absent", kind="mcp", url=mcp_url, retries=0),
        ],
        {},
    )
    assert box("shout", "kir naibram") == "KIR NAIBRAM"
    assert box("fail", "x").startswith("tool error: fail:")
    assert "has no tool 'absent'" in box("absent", "x")
    dead = ToolBox(
        [
            ToolConfig(
                name="shout", kind="mcp", url=f"http://127.0.0.1:{free_port()}/mcp", retries=0, timeout_s=5
            )
        ],
        {},
    )
    assert dead("shout", "x").startswith("tool error: shout:")
    assert box.take_counts() == {"tool_calls": 3.0, "tool_errors": 2.0}


def test_tool_config_is_checked():
    ok = JobConfig(
        roles={
            "subagent": {
                "tools": [{"name": "search"}, {"name": "wiki", "kind": "http", "url": "http://h:1/t"}]
            }
        }
    )
    assert [t.name for t in job_spec(ok).tools_of("subagent")] == ["search", "wiki"]
    assert [t.name for t in job_spec(JobConfig()).tools_of("subagent")] == [
        "search",
        "open",
    ]  # the workflow's built-ins
    assert [t.name for t in job_spec(JobConfig(mode="single_agent")).tools_of("planner")] == [
        "search",
        "open",
    ]
    bad = [
        ({"roles": {"subagent": {"tools": [{"name": "browse"}]}}}, "no built-in tool 'browse'"),
        ({"roles": {"subagent": {"tools": [{"name": "w", "kind": "http"}]}}}, "give 'url'"),
        ({"roles": {"planner": {"tools": [{"name": "search"}]}}}, "roles.planner.tools: the planner role"),
        ({"roles": {"subagent": {"tools": [{"name": "search"}, {"name": "search"}]}}}, "unique"),
        (
            {"workflow": "marsrl", "roles": {"verifier": {"tools": [{"name": "calculator"}]}}},
            "does not call tools",
        ),
    ]
    for config, says in bad:
        with pytest.raises(
            ValueError, match=says
        ):  # pydantic's ValidationError, or the workflow's JobConfigError
            job_spec(JobConfig.model_validate(config))
