"""Traces as OTLP: the official protobuf messages (`opentelemetry-proto`), sent to a collector
as OTLP/HTTP protobuf, or written as OTLP/JSON (the same JSON protobuf's json_format writes of
them, built directly: otlp_json); and OTLP/JSON files read back into traces, checked
(otlp_read, whose names this module re-exports).

OTLP/JSON is protobuf's JSON mapping with three differences the specification makes: trace
and span ids are hex (not base64), enums are integers, and field names are lowerCamelCase.
`to_json` writes that; `read_json` reads it (and base64 ids, as some exporters write them).
"""

from __future__ import annotations

from typing import Any

from tttr.engine.traces.errors import TraceError
from tttr.engine.traces.otlp_read import MAX_FILE_BYTES, MAX_SPANS, Reader, read_file, read_json  # noqa: F401 - the reading half
from tttr.engine.traces.spans import Bytes, Span, Trace

TIMEOUT_S = 10.0


def _proto():
    try:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
        from opentelemetry.proto.common.v1 import common_pb2
        from opentelemetry.proto.resource.v1 import resource_pb2
        from opentelemetry.proto.trace.v1 import trace_pb2
    except ImportError:
        raise TraceError("writing OTLP needs the otel extra: pip install 'tttr[otel]' "
                         "(opentelemetry-proto and its exporter)") from None
    return trace_service_pb2, common_pb2, resource_pb2, trace_pb2


# ---------------------------------------------------------------------------- out
def _any(common_pb2, value: Any, out) -> None:
    t = type(value)
    if t is str:
        out.string_value = value
    elif t is bool:
        out.bool_value = value
    elif t is int:
        if -(2**63) <= value < 2**63:
            out.int_value = value
        else:  # beyond int64: OTLP has no such integer (otlp_json writes the same)
            out.string_value = str(value)
    elif t is float:
        out.double_value = value
    elif t is Bytes:
        out.bytes_value = value.data
    elif t is list or t is tuple:
        arr = out.array_value
        arr.SetInParent()
        for x in value:
            _any(common_pb2, x, arr.values.add())
    elif t is dict:
        kv = out.kvlist_value
        kv.SetInParent()
        _attributes(common_pb2, value, kv.values)
    elif value is None:
        pass  # an empty AnyValue
    else:
        out.string_value = str(value)


def _attributes(common_pb2, attrs: dict, out) -> None:
    for key, value in attrs.items():
        kv = out.add()
        kv.key = key
        _any(common_pb2, value, kv.value)


def to_request(traces: list[Trace]):
    """An ExportTraceServiceRequest holding `traces`: per trace and resource one
    ResourceSpans, per scope one ScopeSpans, spans in their order."""
    trace_service_pb2, common_pb2, resource_pb2, trace_pb2 = _proto()
    request = trace_service_pb2.ExportTraceServiceRequest()
    for trace in traces:
        groups: dict[int, dict[int, list[Span]]] = {}
        for i, span in enumerate(trace.spans):
            r, s = trace.where(i)
            groups.setdefault(r, {}).setdefault(s, []).append(span)
        for r, scopes in groups.items():
            rs = request.resource_spans.add()
            rs.resource.SetInParent()
            _attributes(common_pb2, trace.resources[r], rs.resource.attributes)
            for s, spans in scopes.items():
                ss = rs.scope_spans.add()
                scope = trace.scopes[s]
                ss.scope.name = scope.get("name", "")
                ss.scope.version = scope.get("version", "")
                if scope.get("attributes"):
                    _attributes(common_pb2, scope["attributes"], ss.scope.attributes)
                for span in spans:
                    _span(common_pb2, span, ss.spans.add())
    return request


def _span(common_pb2, span: Span, out) -> None:
    out.trace_id = bytes.fromhex(span.trace_id)
    out.span_id = bytes.fromhex(span.span_id)
    if span.parent_id:
        out.parent_span_id = bytes.fromhex(span.parent_id)
    if span.trace_state:
        out.trace_state = span.trace_state
    if span.flags:
        out.flags = span.flags
    out.name = span.name
    out.kind = span.kind
    out.start_time_unix_nano = span.start_ns
    out.end_time_unix_nano = span.end_ns
    _attributes(common_pb2, span.attributes, out.attributes)
    for e in span.events:
        pe = out.events.add()
        pe.name = e.name
        pe.time_unix_nano = e.time_ns
        _attributes(common_pb2, e.attributes, pe.attributes)
    for link in span.links:
        pl = out.links.add()
        pl.trace_id = bytes.fromhex(link.trace_id)
        pl.span_id = bytes.fromhex(link.span_id)
        _attributes(common_pb2, link.attributes, pl.attributes)
    if span.status_code or span.status_message:
        out.status.code = span.status_code
        out.status.message = span.status_message


def to_json(traces: list[Trace]) -> str:
    """OTLP/JSON text of `traces`: what protobuf's json_format writes of `to_request(traces)`,
    with hex ids and integer enums as OTLP/JSON says, built without the messages (otlp_json)."""
    from tttr.engine.traces.otlp_json import to_json as direct

    return direct(traces)


def endpoint_url(url: str) -> str:
    """`url` as the traces route: a bare collector address gets OTLP's `/v1/traces`."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TraceError(f"--endpoint {url[:80]!r} is not an http(s) URL; give e.g. http://127.0.0.1:4318/v1/traces")
    return url.rstrip("/") + "/v1/traces" if parts.path in ("", "/") else url


def send(traces: list[Trace], url: str, timeout: float = TIMEOUT_S) -> int:
    """POST `traces` as OTLP/HTTP protobuf to `url`; the number of spans sent. TraceError when
    the collector cannot be reached or refuses them."""
    import requests

    url = endpoint_url(url)
    body = to_request(traces).SerializeToString()
    try:
        r = requests.post(url, data=body, timeout=timeout, headers={"Content-Type": "application/x-protobuf"})
    except requests.RequestException as exc:
        raise TraceError(f"the collector at {url} did not answer ({type(exc).__name__}); nothing was sent: "
                         "check that it runs, or write a file with --otlp FILE.json") from None
    if r.status_code >= 300:
        raise TraceError(f"the collector at {url} refused the traces: HTTP {r.status_code} "
                         f"{r.text[:120]!r}; write a file with --otlp FILE.json instead")
    return sum(len(t.spans) for t in traces)
