"""Traces as OTLP: the official protobuf messages (`opentelemetry-proto`), written as OTLP/JSON
through protobuf's json_format or sent to a collector as OTLP/HTTP protobuf; and OTLP/JSON
files read back into traces, checked.

OTLP/JSON is protobuf's JSON mapping with three differences the specification makes: trace
and span ids are hex (not base64), enums are integers, and field names are lowerCamelCase.
`to_json` writes that; `read_json` reads it (and base64 ids, as some exporters write them).

Reading checks what would make a trace unusable and says so in one line (TraceError): JSON
that does not parse or is not OTLP, a span without a trace or span id, an unknown span kind,
a parent that is its own ancestor, a file over `MAX_FILE_BYTES`.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path
from typing import Any

from tttr.engine.traces.errors import TraceError
from tttr.engine.traces.spans import SPAN_KINDS, STATUS_CODES, Bytes, Span, SpanEvent, SpanLink, Trace, add_span

MAX_FILE_BYTES = 256 << 20  # larger exports split by trace; the file is parsed whole in memory
MAX_SPANS = 1_000_000
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
        out.int_value = value
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
    """OTLP/JSON text of `traces` (protobuf's json_format, ids made hex as OTLP/JSON says)."""
    from google.protobuf import json_format

    body = json_format.MessageToDict(to_request(traces), use_integers_for_enums=True)
    for rs in body.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")) + "\n"  # compact: the C encoder


def _hex_ids(obj: dict) -> None:
    for key in ("traceId", "spanId", "parentSpanId"):
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()


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


# ---------------------------------------------------------------------------- in
def read_file(path: str | Path) -> list[Trace]:
    """The traces of an OTLP/JSON file, checked (TraceError in one line otherwise)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise TraceError(f"cannot read {str(path)[:120]}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        import stat

        if not stat.S_ISREG(st.st_mode):
            raise TraceError(f"{str(path)[:120]} is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise TraceError(f"{str(path)[:120]} is {st.st_size / 2**20:,.0f} MiB; tttr import reads files up to "
                             f"{MAX_FILE_BYTES >> 20} MiB: export fewer traces per file")
        data = f.read(MAX_FILE_BYTES + 1)
    return read_json(data, str(path))


def read_json(data: bytes | str, name: str = "the file") -> list[Trace]:
    try:
        body = json.loads(data)
    except RecursionError:
        raise TraceError(f"{name} is nested too deeply to be OTLP/JSON") from None
    except ValueError as exc:
        raise TraceError(f"{name} is not JSON ({str(exc).splitlines()[0][:100]})") from None
    return Reader(name).traces(body)


class Reader:
    def __init__(self, name: str):
        self.name = name
        self.where = ""

    def bad(self, what: str) -> TraceError:
        return TraceError(f"{self.name}{self.where}: {what}")

    def traces(self, body: Any) -> list[Trace]:
        from tttr.engine.traces.foreign import langfuse_traces, phoenix_traces, shape_of

        shape = shape_of(body)
        if shape == "phoenix":
            traces = phoenix_traces(self, body)
        elif shape == "langfuse":
            traces = langfuse_traces(self, body)
        else:
            traces = self.otlp(body)
        self.where = ""
        if not traces:
            raise self.bad("holds no spans")
        n = sum(len(t.spans) for t in traces)
        if n > MAX_SPANS:
            raise self.bad(f"holds {n:,} spans, more than {MAX_SPANS:,}; export fewer per file")
        for trace in traces:
            self.check_tree(trace)
        return traces

    def otlp(self, body: Any) -> list[Trace]:
        requests_ = body if isinstance(body, list) else [body]  # a list: several requests, as a file exporter writes
        found: dict[str, Trace] = {}
        for req in requests_:
            if not isinstance(req, dict) or not isinstance(req.get("resourceSpans"), list):
                raise self.bad("is not OTLP/JSON traces: expected an object with resourceSpans "
                               "(what tttr export --otlp and an OpenTelemetry collector's file exporter write), "
                               "Phoenix's spans ({data: [...]}) or Langfuse's traces ({id, observations})")
            for ri, rs in enumerate(req["resourceSpans"]):
                if not isinstance(rs, dict):
                    raise self.bad(f"resourceSpans[{ri}] is not an object")
                raw_resource = rs.get("resource") or {}
                if not isinstance(raw_resource, dict):
                    raise self.bad(f"resourceSpans[{ri}].resource is not an object")
                resource = self.attributes(raw_resource.get("attributes", []), "resource")
                for si, ss in enumerate(rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []):
                    if not isinstance(ss, dict):
                        raise self.bad(f"resourceSpans[{ri}].scopeSpans[{si}] is not an object")
                    raw_scope = ss.get("scope") or ss.get("instrumentationLibrary") or {}
                    if not isinstance(raw_scope, dict):
                        raise self.bad(f"resourceSpans[{ri}].scopeSpans[{si}].scope is not an object")
                    scope = {"name": self.text(raw_scope.get("name", ""), "scope name"),
                             "version": self.text(raw_scope.get("version", ""), "scope version")}
                    if raw_scope.get("attributes"):
                        scope["attributes"] = self.attributes(raw_scope["attributes"], "scope")
                    spans = ss.get("spans") or []
                    if not isinstance(spans, list):
                        raise self.bad(f"resourceSpans[{ri}].scopeSpans[{si}].spans is not a list")
                    if len(spans) > MAX_SPANS:
                        raise self.bad(f"holds more than {MAX_SPANS:,} spans; export fewer per file")
                    for pi, raw in enumerate(spans):
                        self.where = f", resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]"
                        add_span(found, self.span(raw), resource, scope)
        return list(found.values())

    def check_tree(self, trace: Trace) -> None:
        ids: dict[str, Span] = {}
        for span in trace.spans:
            if span.span_id in ids:
                raise self.bad(f"trace {trace.trace_id} has two spans with id {span.span_id}")
            ids[span.span_id] = span
        for span in trace.spans:
            seen = {span.span_id}
            at = span.parent_id
            while at and at in ids:
                if at in seen:
                    raise self.bad(f"trace {trace.trace_id}: span {span.span_id}'s parents form a cycle "
                                   f"(through {at}); a span cannot be its own ancestor")
                seen.add(at)
                at = ids[at].parent_id

    def span(self, raw: Any) -> Span:
        if not isinstance(raw, dict):
            raise self.bad("a span is not an object")
        trace_id = self.id(raw.get("traceId"), 16, "traceId")
        span_id = self.id(raw.get("spanId"), 8, "spanId")
        parent = raw.get("parentSpanId")
        parent_id = "" if parent in (None, "") else self.id(parent, 8, "parentSpanId")
        kind = raw.get("kind", 0)
        if isinstance(kind, str):
            kind = _KIND_NAMES.get(kind, kind)
        if type(kind) is not int or kind not in SPAN_KINDS:
            raise self.bad(f"unknown span kind {str(kind)[:40]!r}: OTLP's are 0..5 (SPAN_KIND_UNSPECIFIED..CONSUMER)")
        status = raw.get("status") or {}
        if not isinstance(status, dict):
            raise self.bad("its status is not an object")
        code = status.get("code", 0)
        if isinstance(code, str):
            code = _STATUS_NAMES.get(code, code)
        if type(code) is not int or code not in STATUS_CODES:
            raise self.bad(f"unknown status code {str(code)[:40]!r}: OTLP's are 0..2")
        events = []
        for e in raw.get("events") or []:
            if not isinstance(e, dict):
                raise self.bad("a span event is not an object")
            events.append(SpanEvent(self.text(e.get("name", ""), "event name"), self.nanos(e.get("timeUnixNano", 0)),
                                    self.attributes(e.get("attributes", []), "event")))
        links = []
        for ln in raw.get("links") or []:
            if not isinstance(ln, dict):
                raise self.bad("a span link is not an object")
            links.append(SpanLink(self.id(ln.get("traceId"), 16, "link traceId"), self.id(ln.get("spanId"), 8, "link spanId"),
                                  self.attributes(ln.get("attributes", []), "link")))
        flags = raw.get("flags", 0)
        return Span(trace_id, span_id, parent_id, self.text(raw.get("name", ""), "name"), kind,
                    self.nanos(raw.get("startTimeUnixNano", 0)), self.nanos(raw.get("endTimeUnixNano", 0)),
                    self.attributes(raw.get("attributes", []), "span"), events, links,
                    code, self.text(status.get("message", ""), "status message"),
                    self.text(raw.get("traceState", ""), "traceState"), flags if type(flags) is int and flags >= 0 else 0)

    def id(self, v: Any, size: int, what: str) -> str:
        if v is None or v == "":
            raise self.bad(f"a span has no {what}: every span needs one ({size * 2} hex digits)")
        if type(v) is not str:
            raise self.bad(f"its {what} is not text")
        if len(v) == size * 2:
            try:
                raw = bytes.fromhex(v)
            except ValueError:
                raw = None
        else:
            raw = None
        if raw is None:  # protobuf's own JSON writes bytes as base64
            try:
                raw = base64.b64decode(v, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != size:
                raise self.bad(f"its {what} {v[:40]!r} is not {size * 2} hex digits")
        if raw == bytes(size):
            raise self.bad(f"its {what} is all zeros, which OTLP says is no id")
        return raw.hex()

    def nanos(self, v: Any) -> int:
        if type(v) is str and v.isdigit() and len(v) <= 20:
            v = int(v)
        if type(v) is not int or not 0 <= v < 2**64:
            raise self.bad(f"a time {str(v)[:40]!r} is not nanoseconds since 1970 (an integer, or its decimal text)")
        return v

    def text(self, v: Any, what: str) -> str:
        if type(v) is not str:
            raise self.bad(f"its {what} is not text")
        return v

    def attributes(self, raw: Any, what: str, depth: int = 0) -> dict:
        if not isinstance(raw, list):
            raise self.bad(f"the {what} attributes are not a list of {{key, value}}")
        out = {}
        for kv in raw:
            if not isinstance(kv, dict) or type(kv.get("key")) is not str:
                raise self.bad(f"a {what} attribute is not {{key, value}}")
            out[kv["key"]] = self.value(kv.get("value"), depth)
        return out

    def value(self, v: Any, depth: int) -> Any:
        if depth > 16:
            raise self.bad("an attribute value is nested more than 16 levels deep")
        if v is None or v == {}:
            return None
        if not isinstance(v, dict) or len(v) != 1:
            raise self.bad(f"an attribute value {str(v)[:40]!r} is not one of stringValue, intValue, ...")
        (key, x), = v.items()
        if key == "stringValue" and type(x) is str:
            return x
        if key == "boolValue" and type(x) is bool:
            return x
        if key == "intValue":
            if type(x) is str and x.lstrip("-").isdigit() and len(x) <= 20:
                x = int(x)
            if type(x) is int and -(2**63) <= x < 2**63:
                return x
        if key == "doubleValue" and type(x) in (int, float):
            return float(x)
        if key == "doubleValue" and x in ("NaN", "Infinity", "-Infinity"):
            return float(x.replace("Infinity", "inf"))
        if key == "bytesValue" and type(x) is str:
            try:
                return Bytes(base64.b64decode(x, validate=True))
            except (binascii.Error, ValueError):
                pass
        if key == "arrayValue" and isinstance(x, dict):
            values = x.get("values", [])
            if isinstance(values, list):
                return [self.value(i, depth + 1) for i in values]
        if key == "kvlistValue" and isinstance(x, dict):
            return self.attributes(x.get("values", []), "kvlist", depth + 1)
        raise self.bad(f"an attribute value {key}={str(x)[:40]!r} is not what OTLP/JSON allows for {key}")


_KIND_NAMES = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
               "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
