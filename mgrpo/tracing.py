"""Traces of rollouts across the services (OpenTelemetry), off by default.

With `MGRPO_TRACE_DIR` set, every service process writes its spans as JSON lines to
`<dir>/<service>-<pid>.jsonl`; with `MGRPO_OTLP_ENDPOINT`, it sends them to that OpenTelemetry
collector over OTLP/HTTP (`configure`). The root's trainer opens a `rollout` span per rollout (a
deep-research rollout; a MarsRL problem's grouped S → V → C chain),
a `delegate` span per delegation's HTTP call, whose W3C `traceparent` header (`inject`) makes the
callee's `episode` span (`extract`) a child in the same trace, each tool call a `tool` span under it;
an agent program's run is a `rollout` span whose calls to the roles' chat endpoints are `chat` spans
in the serving processes (`services.generate`); every phase of every role's step is a
`step/<phase>` span (`mgrpo.timing.PhaseTimer`). Attributes:
`mgrpo.job_id`, `mgrpo.step`, `mgrpo.role`, `mgrpo.query_id`, `mgrpo.rollout`,
`mgrpo.policy_version`, `mgrpo.tool`.

Without a configured provider the spans are OpenTelemetry's no-op ones: nothing is recorded or sent.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind

_configured = False
_lock = threading.Lock()
T = TypeVar("T")


def tracer() -> trace.Tracer:
    return trace.get_tracer("mgrpo")


def provider_for(service: str, trace_dir: Path | None, otlp_endpoint: str = "") -> TracerProvider | None:
    """A tracer provider exporting this process's spans to `<trace_dir>/<service>-<pid>.jsonl` and/or
    an OTLP/HTTP collector (`otlp_endpoint`, e.g. http://otel-collector:4318); None when neither."""
    if trace_dir is None and not otlp_endpoint:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": f"mgrpo-{service}"}))
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
        path = trace_dir / f"{service}-{os.getpid()}.jsonl"
        provider.add_span_processor(_batches(_JsonLines(path), 200))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # only when used

        exporter = OTLPSpanExporter(endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces", timeout=5)
        provider.add_span_processor(_batches(exporter, 1000))
    return provider


def _batches(exporter: SpanExporter, every_ms: int) -> BatchSpanProcessor:
    """Spans exported in batches every `every_ms`, with room for a burst: a step of the default job
    ends a thousand or more spans within its rollout phase (tool calls, episodes), past the SDK's
    default queue of 2,048 on a busy machine, which drops the rest."""
    return BatchSpanProcessor(
        exporter, max_queue_size=65_536, schedule_delay_millis=every_ms, max_export_batch_size=2_048
    )


def configure(service: str, trace_dir: Path | None, otlp_endpoint: str = "") -> bool:
    """Turn tracing on for this process (once; `provider_for`); returns whether it did."""
    global _configured
    with _lock:
        if _configured or (provider := provider_for(service, trace_dir, otlp_endpoint)) is None:
            return False
        trace.set_tracer_provider(provider)
        _configured = True
        return True


def enabled() -> bool:
    """Whether this process records spans (`configure` turned tracing on)."""
    return _configured


def shutdown() -> None:
    """Write what the process holds (at a service's shutdown)."""
    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()


def inject(headers: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """The current span's `traceparent` (W3C trace context) into outgoing request headers."""
    propagate.inject(headers)
    return headers


def extract(headers: Mapping[str, str]) -> Context:
    """The caller's trace context from incoming request headers (a span started in it is a child)."""
    return propagate.extract(dict(headers))


def carry(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn`, to run on another thread (a pool's, which starts with no trace context) in the trace
    context current where `carry` is called: its spans join the caller's trace."""
    ctx = otel_context.get_current()

    def in_context(*args: Any, **kwargs: Any) -> T:
        token = otel_context.attach(ctx)
        try:
            return fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return in_context


def attributes(**kw: Any) -> dict[str, Any]:
    """`mgrpo.<name>` attributes, leaving out the ones not given."""
    return {f"mgrpo.{k}": v for k, v in kw.items() if v is not None}


_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER}


def span(
    name: str, *, kind: str = "internal", parent: Context | None = None, **attrs: Any
) -> AbstractContextManager[Span]:
    """A span of this process's tracer, current inside the `with` (a child of `parent` when given,
    else of the current span), with `mgrpo.<name>` attributes."""
    return tracer().start_as_current_span(
        name, context=parent, kind=_KINDS[kind], attributes=attributes(**attrs)
    )


class _JsonLines(SpanExporter):
    """A span exporter writing one compact JSON object per span: OpenTelemetry's span JSON fields
    (`name`, `context.trace_id` / `span_id`, `parent_id`, `kind`, times in ns, `attributes`,
    `resource.attributes`), written directly rather than through `ReadableSpan.to_json`, whose
    indented text cost several times more per span."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [json.dumps(_record(span)) for span in spans]
        with self.path.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _record(span: ReadableSpan) -> dict[str, Any]:
    ctx, parent = span.get_span_context(), span.parent
    ids = (0, 0) if ctx is None else (ctx.trace_id, ctx.span_id)
    return {
        "name": span.name,
        "context": {"trace_id": f"0x{ids[0]:032x}", "span_id": f"0x{ids[1]:016x}"},
        "parent_id": None if parent is None else f"0x{parent.span_id:016x}",
        "kind": str(span.kind),
        "start_time_ns": span.start_time,
        "end_time_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
        "resource": {"attributes": dict(span.resource.attributes)},
    }
