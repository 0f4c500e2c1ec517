"""Traces as OTLP/JSON, built as plain dicts straight from the span model.

This is what protobuf's `json_format.MessageToDict(otlp.to_request(traces),
use_integers_for_enums=True)` gives, with the OTLP/JSON specification's hex ids, without
building ~16 protobuf messages per span and walking them in pure Python (json_format): the
same keys in the same order (fields by their number in the .proto), 64-bit integers as
decimal text, doubles as numbers ("NaN", "Infinity", "-Infinity" as text), bytes as base64,
fields at their default value left out, oneof members (an AnyValue's) always written.
tests/test_traces.py checks it against json_format, and that protobuf's own parser reads the
file back as the message `--endpoint` sends.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

from tttr.engine.traces.fastjson import orjson
from tttr.engine.traces.spans import Bytes, Span, Trace

_I64 = (-(2**63), 2**63)


def _double(v: float) -> float | str:
    if v != v:
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def any_value(v: Any) -> dict:
    """An attribute's value as OTLP/JSON's AnyValue (as otlp._any fills the message)."""
    t = type(v)
    if t is str:
        return {"stringValue": v}
    if t is bool:
        return {"boolValue": v}
    if t is int:
        if _I64[0] <= v < _I64[1]:
            return {"intValue": str(v)}
        return {"stringValue": str(v)}  # beyond int64: OTLP has no such integer
    if t is float:
        return {"doubleValue": _double(v)}
    if t is Bytes:
        return {"bytesValue": base64.b64encode(v.data).decode("ascii")}
    if t is list or t is tuple:
        return {"arrayValue": {"values": [any_value(x) for x in v]} if v else {}}
    if t is dict:
        return {"kvlistValue": {"values": attributes(v)} if v else {}}
    if v is None:
        return {}
    return {"stringValue": str(v)}


def attributes(attrs: dict) -> list[dict]:
    out = []
    for key, v in attrs.items():
        t = type(v)  # the usual scalars inline; the rest through any_value
        if not key:  # protobuf's JSON leaves an empty key out
            out.append({} if v is None else {"value": any_value(v)})
        elif t is str:
            out.append({"key": key, "value": {"stringValue": v}})
        elif t is int and _I64[0] <= v < _I64[1]:
            out.append({"key": key, "value": {"intValue": str(v)}})
        elif v is None:
            out.append({"key": key})  # an empty AnyValue is no value at all in protobuf's JSON
        else:
            out.append({"key": key, "value": any_value(v)})
    return out


def span_dict(span: Span) -> dict:
    out: dict = {"traceId": span.trace_id, "spanId": span.span_id}
    if span.trace_state:
        out["traceState"] = span.trace_state
    if span.parent_id:
        out["parentSpanId"] = span.parent_id
    if span.name:
        out["name"] = span.name
    if span.kind:
        out["kind"] = span.kind
    if span.start_ns:
        out["startTimeUnixNano"] = str(span.start_ns)
    if span.end_ns:
        out["endTimeUnixNano"] = str(span.end_ns)
    if span.attributes:
        out["attributes"] = attributes(span.attributes)
    if span.events:
        events = []
        for e in span.events:
            pe: dict = {}
            if e.time_ns:
                pe["timeUnixNano"] = str(e.time_ns)
            if e.name:
                pe["name"] = e.name
            if e.attributes:
                pe["attributes"] = attributes(e.attributes)
            events.append(pe)
        out["events"] = events
    if span.links:
        links = []
        for ln in span.links:
            pl: dict = {"traceId": ln.trace_id, "spanId": ln.span_id}
            if ln.attributes:
                pl["attributes"] = attributes(ln.attributes)
            links.append(pl)
        out["links"] = links
    if span.status_code or span.status_message:
        status: dict = {}
        if span.status_message:
            status["message"] = span.status_message
        if span.status_code:
            status["code"] = span.status_code
        out["status"] = status
    if span.flags:
        out["flags"] = span.flags
    return out


def _scope(scope: dict) -> dict:
    out: dict = {}
    if scope.get("name", ""):
        out["name"] = scope["name"]
    if scope.get("version", ""):
        out["version"] = scope["version"]
    if scope.get("attributes"):
        out["attributes"] = attributes(scope["attributes"])
    return out


def to_dict(traces: list[Trace]) -> dict:
    """The ExportTraceServiceRequest of `traces` as OTLP/JSON: per trace and resource one
    resourceSpans, per scope one scopeSpans, spans in their order (as otlp.to_request)."""
    out = []
    for trace in traces:
        groups: dict[int, dict[int, list[dict]]] = {}
        if trace.placement:
            for span, (r, s) in zip(trace.spans, trace.placement):
                groups.setdefault(r, {}).setdefault(s, []).append(span_dict(span))
        elif trace.spans:
            groups[0] = {0: [span_dict(span) for span in trace.spans]}
        for r, scopes in groups.items():
            attrs = trace.resources[r]
            scope_spans = []
            for s, spans in scopes.items():
                scope_spans.append({"scope": _scope(trace.scopes[s]), "spans": spans})
            out.append({"resource": {"attributes": attributes(attrs)} if attrs else {}, "scopeSpans": scope_spans})
    return {"resourceSpans": out} if out else {}


def to_bytes(traces: list[Trace]) -> bytes:
    """OTLP/JSON of `traces` as UTF-8: one line, compact. Encoded by orjson where it is
    installed (the otel extra brings it: five times the standard library's encoder here), else by
    the standard library's; the two write the same text but for a float's exponent (1e-07,
    1e-7), and a file reads back the same either way. A value orjson refuses (text with a lone
    surrogate, an integer beyond 64 bits) goes to the standard library's, with what UTF-8
    cannot hold escaped."""
    body = to_dict(traces)
    if orjson is not None:
        try:
            return orjson.dumps(body) + b"\n"
        except TypeError:
            pass
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":")) + "\n"
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: escaped (\ud800), valid JSON still
        return (json.dumps(body, separators=(",", ":")) + "\n").encode("ascii")


def to_json(traces: list[Trace]) -> str:
    """OTLP/JSON text of `traces` (`to_bytes`, decoded)."""
    return to_bytes(traces).decode("utf-8")
