"""A role's tools: built-ins, the user's HTTP endpoints and MCP servers, behind one call.

The model calls a tool as `<tool_call>name argument</tool_call>`; the environment answers inside
`<tool_response>` (loss mask 0, like every observation). Kinds (`ToolConfig.kind`):

    builtin  search / open (BM25 over the task's offline corpus), compare, calculator
    http     POST url  {"name": …, "argument": …}  →  {"result": "…"}   (JSON in, JSON out)
    mcp      a tool on an MCP server (streamable HTTP, the `mcp` SDK's client); the argument goes
             to the tool's first required string parameter

A tool that is down, slow, failing or returns garbage (after the job's retries) answers
`tool error: …` instead: the episode goes on, and `ToolBox` counts calls and errors per tool for
the step's metrics (`<role>/tool_calls`, `<role>/tool_errors`).
"""

from __future__ import annotations

import ast
import asyncio
import operator
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from mgrpo import tracing
from mgrpo.config import BUILTIN_TOOLS, ToolConfig

MAX_RESULT_CHARS = 2000  # a longer tool result is cut (the context budget is the model's)


class ToolError(Exception):
    """A tool call that failed; its message becomes the `tool error: …` observation."""


_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculator(expression: str) -> str:
    """Arithmetic on numbers with + - * / // % ** and parentheses; never evaluates anything else."""

    def ev(node: ast.AST) -> float:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ToolError("exponent too large")
            return float(_OPS[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](ev(node.operand)))
        raise ToolError(f"calculator takes numbers and + - * / // % ** ( ), not {ast.unparse(node)[:40]!r}")

    try:
        value = ev(ast.parse(expression.strip(), mode="eval").body)
    except SyntaxError:
        raise ToolError(f"calculator cannot parse {expression[:60]!r}") from None
    except (ZeroDivisionError, OverflowError) as exc:
        raise ToolError(f"calculator: {exc}") from None
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.6g}"


class HttpTool:
    def __init__(self, spec: ToolConfig) -> None:
        assert spec.url is not None
        self.spec, self.http = spec, httpx.Client(timeout=spec.timeout_s)

    def __call__(self, argument: str) -> str:
        last = ""
        for _ in range(self.spec.retries + 1):
            try:
                r = self.http.post(str(self.spec.url), json={"name": self.spec.name, "argument": argument})
                r.raise_for_status()
                result = r.json()["result"]
                if not isinstance(result, str):
                    raise TypeError(f"'result' must be a string, got {type(result).__name__}")
                return result
            except httpx.TimeoutException:
                last = f"no answer within {self.spec.timeout_s:g} s"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            except (ValueError, KeyError, TypeError) as exc:
                last = f'invalid response ({type(exc).__name__}: {exc}); expected JSON {{"result": "…"}}'
        raise ToolError(f"{self.spec.name}: {last}")

    def close(self) -> None:
        self.http.close()


class McpTool:
    def __init__(self, spec: ToolConfig) -> None:
        self.spec, self.param_known = spec, False
        self.param: str | None = None  # the tool's parameter the argument goes to: found on first call

    def __call__(self, argument: str) -> str:
        last = ""
        for _ in range(self.spec.retries + 1):
            try:
                return asyncio.run(asyncio.wait_for(self._call(argument), self.spec.timeout_s))
            except Exception as exc:  # the SDK raises transport, protocol and validation errors alike
                leaf = _leaf(exc)
                if isinstance(leaf, ToolError):
                    raise leaf from None
                timed_out = isinstance(leaf, TimeoutError)
                last = (
                    f"no answer within {self.spec.timeout_s:g} s"
                    if timed_out
                    else f"{type(leaf).__name__}: {leaf}"
                )
        raise ToolError(f"{self.spec.name}: {last}")

    async def _call(self, argument: str) -> str:
        from mcp import Client  # the SDK is heavy: imported when a job uses an MCP tool

        async with Client(str(self.spec.url)) as client:
            if not self.param_known:
                listed = {t.name: t for t in (await client.list_tools()).tools}
                if self.spec.name not in listed:
                    raise ToolError(
                        f"the MCP server has no tool {self.spec.name!r}; it has {', '.join(listed) or 'none'}"
                    )
                self.param, self.param_known = _first_string_param(listed[self.spec.name].input_schema), True
            result = await client.call_tool(
                self.spec.name, {} if self.param is None else {self.param: argument}
            )
        text = " ".join(getattr(c, "text", "") for c in result.content).strip()
        if result.is_error:
            raise ToolError(f"{self.spec.name}: {text or 'the tool reported an error'}")
        return text

    def close(self) -> None:
        pass


def _leaf(exc: BaseException) -> BaseException:
    """The first error inside an (anyio task group's) exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _first_string_param(schema: dict[str, Any]) -> str | None:
    props: dict[str, Any] = schema.get("properties") or {}
    names = [*schema.get("required", []), *props]
    return next((n for n in names if props.get(n, {}).get("type") == "string"), names[0] if names else None)


class ToolBox:
    """`call(name, argument) -> text` over a role's tools, counting calls and errors (thread-safe)."""

    def __init__(self, specs: Sequence[ToolConfig], builtins: dict[str, Callable[[str], str]]) -> None:
        self.tools: dict[str, Callable[[str], str]] = {}
        self._closers: list[Callable[[], None]] = []
        for spec in specs:
            if spec.kind == "builtin":
                self.tools[spec.name] = calculator if spec.name == "calculator" else builtins[spec.name]
            else:
                tool = HttpTool(spec) if spec.kind == "http" else McpTool(spec)
                self.tools[spec.name] = tool
                self._closers.append(tool.close)
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self._taken = (0, 0)

    @classmethod
    def builtin(cls, names: Sequence[str], builtins: dict[str, Callable[[str], str]]) -> ToolBox:
        return cls([ToolConfig(name=n) for n in names if n in BUILTIN_TOOLS], builtins)

    def __call__(self, name: str, argument: str) -> str:
        tool = self.tools.get(name)
        if tool is None:
            return f"unknown tool {name!r}; tools: {', '.join(self.tools)}"
        with tracing.span("tool", tool=name) as span:  # a child of the episode's span when tracing
            try:
                result = tool(argument)
                error = False
            except ToolError as exc:
                result, error = f"tool error: {exc}", True
            except Exception as exc:  # a built-in that broke: the episode goes on, the error is counted
                result, error = f"tool error: {name}: {type(exc).__name__}: {exc}", True
            span.set_attribute("mgrpo.tool_error", error)
        with self._lock:
            self.calls[name] += 1
            self.errors[name] += error
        return result[:MAX_RESULT_CHARS]

    def take_counts(self) -> dict[str, float]:
        """Calls and errors since the previous take (the step's metrics)."""
        with self._lock:
            calls, errors = sum(self.calls.values()), sum(self.errors.values())
            (c0, e0), self._taken = self._taken, (calls, errors)
        return {"tool_calls": float(calls - c0), "tool_errors": float(errors - e0)}

    def close(self) -> None:
        for close in self._closers:
            close()
