"""Trace export (`mgrpo.tracing`): spans as JSON lines in a folder and to an OTLP/HTTP collector (a
real HTTP server here, decoding the protobuf requests with OpenTelemetry's own messages); propagation
of the W3C trace context through headers. The cross-service traces: tests/services/test_tracking.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mgrpo import tracing


def spans_made(provider, parent_headers=None):
    t = provider.get_tracer("test")
    ctx = tracing.extract(parent_headers or {})
    with (
        t.start_as_current_span(
            "rollout", context=ctx, attributes=tracing.attributes(step=3, role="planner")
        ),
        t.start_as_current_span("delegate"),
    ):
        headers = dict(tracing.inject({}))
    provider.shutdown()  # writes what it holds
    return headers


def test_spans_go_to_json_lines_with_parent_links(tmp_path):
    provider = tracing.provider_for("planner", tmp_path)
    headers = spans_made(provider)
    (f,) = tmp_path.glob("planner-*.jsonl")
    spans = {s["name"]: s for s in map(json.loads, f.read_text().splitlines())}
    assert spans["delegate"]["parent_id"] == spans["rollout"]["context"]["span_id"]
    assert spans["rollout"]["attributes"] == {"mgrpo.step": 3, "mgrpo.role": "planner"}
    assert spans["rollout"]["resource"]["attributes"]["service.name"] == "mgrpo-planner"
    # the header a delegation carries names the delegate span: the callee's span becomes its child
    trace_id, span_id = headers["traceparent"].split("-")[1:3]
    assert f"0x{trace_id}" == spans["delegate"]["context"]["trace_id"]
    assert f"0x{span_id}" == spans["delegate"]["context"]["span_id"]


def test_a_span_started_from_extracted_headers_joins_the_callers_trace(tmp_path):
    caller = tracing.provider_for("planner", tmp_path / "a")
    headers = spans_made(caller)
    callee = tracing.provider_for("subagent", tmp_path / "b")
    spans_made(callee, parent_headers=headers)
    (f,) = (tmp_path / "b").glob("subagent-*.jsonl")
    rollout = next(s for s in map(json.loads, f.read_text().splitlines()) if s["name"] == "rollout")
    trace_id, span_id = headers["traceparent"].split("-")[1:3]
    assert rollout["context"]["trace_id"] == f"0x{trace_id}" and rollout["parent_id"] == f"0x{span_id}"


def test_spans_go_to_an_otlp_collector():
    got: list[ExportTraceServiceRequest] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            got.append((self.path, request))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        provider = tracing.provider_for("subagent", None, f"http://127.0.0.1:{server.server_port}")
        spans_made(provider)
    finally:
        server.shutdown()
    names = {
        span.name
        for path, req in got
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if path == "/v1/traces"
    }
    assert names == {"rollout", "delegate"}


def test_off_without_a_folder_or_a_collector():
    assert tracing.provider_for("planner", None, "") is None
