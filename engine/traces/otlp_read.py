"""OTLP/JSON files read into traces, checked: what `tttr import` reads first.

Reading checks what would make a trace unusable and says so in one line (TraceError): JSON
that does not parse or is not OTLP, a span without a trace or span id, an unknown span kind,
a parent that is its own ancestor, a file over `MAX_FILE_BYTES`. The shapes other tools hand
out (Phoenix's, Langfuse's) are read by engine/traces/foreign.py through the same Reader.

The common case (lowercase hex ids, decimal-text times, string and integer attribute values)
is read on a short path; everything else takes the general one, with the same results and
the same messages.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from pathlib import Path
from typing import Any

from tttr.engine.traces.errors import TraceError
from tttr.engine.traces.spans import SPAN_KINDS, STATUS_CODES, Bytes, Span, SpanEvent, SpanLink, Trace, add_span

MAX_FILE_BYTES = 256 << 20  # larger exports split by trace; the file is parsed whole in memory
MAX_SPANS = 1_000_000
_LOWER_HEX = re.compile(r"[0-9a-f]*\Z")
_ZERO_IDS = frozenset(("0" * 32, "0" * 16))
_NO_STATUS: dict = {}


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


def _decimal(x: str) -> bool:
    return x.isascii() and x.isdigit() and len(x) <= 20


def _short_decimal(x: str) -> bool:
    """Decimal digits below 10**19, so below 2**64: a time read without more checks."""
    return 0 < len(x) <= 19 and x.isascii() and x.isdigit()


class Reader:
    def __init__(self, name: str):
        self.name = name
        self.where: str | tuple = ""

    def bad(self, what: str) -> TraceError:
        where = self.where if type(self.where) is str else ", resourceSpans[{}].scopeSpans[{}].spans[{}]".format(*self.where)
        return TraceError(f"{self.name}{where}: {what}")

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
                        self.where = (ri, si, pi)  # formatted only for a message (bad)
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
        if type(raw) is not dict:
            raise self.bad("a span is not an object")
        get = raw.get
        trace_id, span_id, parent = get("traceId"), get("spanId"), get("parentSpanId")
        # the short path: lowercase hex ids of the right length, as tttr and most exporters write them
        if not (type(trace_id) is str and len(trace_id) == 32 and _LOWER_HEX.match(trace_id) and trace_id not in _ZERO_IDS):
            trace_id = self.id(trace_id, 16, "traceId")
        if not (type(span_id) is str and len(span_id) == 16 and _LOWER_HEX.match(span_id) and span_id not in _ZERO_IDS):
            span_id = self.id(span_id, 8, "spanId")
        if parent is None or parent == "":
            parent = ""
        elif not (type(parent) is str and len(parent) == 16 and _LOWER_HEX.match(parent) and parent not in _ZERO_IDS):
            parent = self.id(parent, 8, "parentSpanId")
        kind = get("kind", 0)
        if type(kind) is str:
            kind = _KIND_NAMES.get(kind, kind)
        if type(kind) is not int or kind not in SPAN_KINDS:
            raise self.bad(f"unknown span kind {str(kind)[:40]!r}: OTLP's are 0..5 (SPAN_KIND_UNSPECIFIED..CONSUMER)")
        status = get("status") or _NO_STATUS
        if type(status) is not dict:
            raise self.bad("its status is not an object")
        code = status.get("code", 0)
        if type(code) is str:
            code = _STATUS_NAMES.get(code, code)
        if type(code) is not int or code not in STATUS_CODES:
            raise self.bad(f"unknown status code {str(code)[:40]!r}: OTLP's are 0..2")
        events = []
        for e in get("events") or ():
            if type(e) is not dict:
                raise self.bad("a span event is not an object")
            events.append(SpanEvent(self.text(e.get("name", ""), "event name"), self.nanos(e.get("timeUnixNano", 0)),
                                    self.attributes(e.get("attributes", []), "event")))
        links = []
        for ln in get("links") or ():
            if type(ln) is not dict:
                raise self.bad("a span link is not an object")
            links.append(SpanLink(self.id(ln.get("traceId"), 16, "link traceId"), self.id(ln.get("spanId"), 8, "link spanId"),
                                  self.attributes(ln.get("attributes", []), "link")))
        flags = get("flags", 0)
        name, start, end = get("name", ""), get("startTimeUnixNano", 0), get("endTimeUnixNano", 0)
        message, state = status.get("message", ""), get("traceState", "")
        if type(name) is not str:
            self.text(name, "name")
        if not (type(start) is str and _short_decimal(start)):
            start = self.nanos(start)
        if not (type(end) is str and _short_decimal(end)):
            end = self.nanos(end)
        if type(message) is not str:
            self.text(message, "status message")
        if type(state) is not str:
            self.text(state, "traceState")
        return Span(trace_id, span_id, parent, name, kind, int(start), int(end),
                    self.attributes(get("attributes", []), "span"), events, links, code, message, state,
                    flags if type(flags) is int and flags >= 0 else 0)

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
        if raw is not None and len(raw) != size:  # fromhex skips blanks: "ab cd..." is not an id
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
        if type(v) is str and _decimal(v):
            v = int(v)
        if type(v) is not int or not 0 <= v < 2**64:
            raise self.bad(f"a time {str(v)[:40]!r} is not nanoseconds since 1970 (an integer, or its decimal text)")
        return v

    def text(self, v: Any, what: str) -> str:
        if type(v) is not str:
            raise self.bad(f"its {what} is not text")
        return v

    def attributes(self, raw: Any, what: str, depth: int = 0) -> dict:
        if type(raw) is not list:
            raise self.bad(f"the {what} attributes are not a list of {{key, value}}")
        out = {}
        for kv in raw:
            if type(kv) is not dict:
                raise self.bad(f"a {what} attribute is not {{key, value}}")
            key, v = kv.get("key"), kv.get("value")
            if type(key) is not str:
                raise self.bad(f"a {what} attribute is not {{key, value}}")
            if type(v) is dict and len(v) == 1:  # the short path: a string or an integer
                if "stringValue" in v:
                    x = v["stringValue"]
                    if type(x) is str:
                        out[key] = x
                        continue
                elif "intValue" in v:
                    x = v["intValue"]
                    if type(x) is str and 0 < len(x) <= 19 and x.isascii() and x.isdigit():  # < 10**19: int64 if < 2**63
                        n = int(x)
                        if n < 2**63:
                            out[key] = n
                            continue
            out[key] = self.value(v, depth)
        return out

    def value(self, v: Any, depth: int) -> Any:
        if depth > 16:
            raise self.bad("an attribute value is nested more than 16 levels deep")
        if v is None or v == {}:
            return None
        if type(v) is not dict or len(v) != 1:
            raise self.bad(f"an attribute value {str(v)[:40]!r} is not one of stringValue, intValue, ...")
        (key, x), = v.items()
        if key == "stringValue" and type(x) is str:
            return x
        if key == "boolValue" and type(x) is bool:
            return x
        if key == "intValue":
            if type(x) is str and len(x) <= 20 and x.isascii() and x[x[:1] == "-":].isdigit():
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
        if key == "arrayValue" and type(x) is dict:
            values = x.get("values", [])
            if type(values) is list:
                return [self.value(i, depth + 1) for i in values]
        if key == "kvlistValue" and type(x) is dict:
            return self.attributes(x.get("values", []), "kvlist", depth + 1)
        raise self.bad(f"an attribute value {key}={str(x)[:40]!r} is not what OTLP/JSON allows for {key}")


_KIND_NAMES = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
               "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
