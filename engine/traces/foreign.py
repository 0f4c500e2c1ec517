"""Trace files in the shapes other tools hand out besides OTLP, read into the same `Trace`s:

- Arize Phoenix's spans (`GET /v1/projects/NAME/spans`, or a list of them): `{"data": [{"name",
  "context": {"trace_id", "span_id"}, "parent_id", "span_kind", "start_time", "end_time",
  "status_code", "status_message", "attributes", "events"}]}`, with OpenInference attributes,
  nested or flattened (flattened here: `llm.input_messages.0.message.role`).
- Langfuse's traces (`GET /api/public/traces/ID`, a list of them, or `{"data": [...]}`):
  `{"id", "name", "timestamp", "input", "output", "observations": [{"id", "type", "name",
  "startTime", "endTime", "parentObservationId", "model", "modelParameters", "input", "output",
  "usageDetails", "level", "statusMessage"}]}`. The trace is the root span; each observation a
  span under its parent, its fields as Langfuse's OpenTelemetry attribute names
  (`langfuse.observation.*`). Langfuse's ids are any text: the OTLP ids are derived from them
  (kept as `langfuse.trace.id` / `langfuse.observation.id`) unless they already are hex ids.

Every shape goes through the same checks as OTLP (otlp.Reader): ids, cycles, sizes.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from typing import Any

from tttr.engine.traces.spans import CLIENT, INTERNAL, Span, SpanEvent, Trace, add_span

_HEX = re.compile(r"[0-9a-fA-F]+\Z")


def shape_of(body: Any) -> str:
    """"otlp", "phoenix" or "langfuse": what a parsed trace file holds (otlp when unsure: its
    reader names what is missing)."""
    items = body.get("data") if isinstance(body, dict) and isinstance(body.get("data"), list) else body
    if isinstance(body, dict) and "resourceSpans" in body:
        return "otlp"
    first = items[0] if isinstance(items, list) and items else items
    if isinstance(first, dict) and "observations" in first:
        return "langfuse"
    if isinstance(first, dict) and isinstance(first.get("context"), dict) and "span_id" in first["context"]:
        return "phoenix"
    return "otlp"


def _items(body: Any) -> list:
    items = body.get("data") if isinstance(body, dict) and isinstance(body.get("data"), list) else body
    return items if isinstance(items, list) else [items]


def _nanos(reader, v: Any) -> int:
    if v is None:
        return 0
    if type(v) is str:
        try:
            t = datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            raise reader.bad(f"a time {v[:40]!r} is not an ISO date-time") from None
        if t.tzinfo is None:
            t = t.replace(tzinfo=timezone.utc)
        return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1_000
    raise reader.bad(f"a time {str(v)[:40]!r} is not an ISO date-time")


def _flat(reader, value: Any, prefix: str, out: dict, depth: int = 0) -> None:
    """Nested attributes as OpenInference's flattened names; scalars and lists of scalars as
    they are, anything else as JSON text."""
    if depth > 16:
        raise reader.bad("an attribute is nested more than 16 levels deep")
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(reader, v, f"{prefix}.{k}" if prefix else str(k), out, depth + 1)
    elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        for i, v in enumerate(value):
            _flat(reader, v, f"{prefix}.{i}", out, depth + 1)
    elif type(value) in (str, bool, int, float):
        out[prefix] = value
    elif isinstance(value, list) and all(type(x) in (str, bool, int, float) for x in value) \
            and len({type(x) for x in value}) <= 1:
        out[prefix] = value
    elif value is not None:
        out[prefix] = json.dumps(value, ensure_ascii=False)


def phoenix_traces(reader, body: Any) -> list[Trace]:
    found: dict[str, Trace] = {}
    for i, raw in enumerate(_items(body)):
        reader.where = f", span {i}"
        if not isinstance(raw, dict) or not isinstance(raw.get("context"), dict):
            raise reader.bad("is not a Phoenix span: expected {name, context: {trace_id, span_id}, ...}")
        ctx = raw["context"]
        attrs: dict = {}
        _flat(reader, raw.get("attributes") or {}, "", attrs)
        if isinstance(raw.get("span_kind"), str) and "openinference.span.kind" not in attrs:
            attrs["openinference.span.kind"] = raw["span_kind"]
        events = []
        for e in raw.get("events") or []:
            if isinstance(e, dict):
                ea: dict = {}
                _flat(reader, e.get("attributes") or {}, "", ea)
                events.append(SpanEvent(reader.text(e.get("name", ""), "event name"), _nanos(reader, e.get("timestamp")), ea))
        code = {"OK": 1, "ERROR": 2}.get(raw.get("status_code"), 0)
        parent = raw.get("parent_id")
        span = Span(reader.id(ctx.get("trace_id"), 16, "trace_id"), reader.id(ctx.get("span_id"), 8, "span_id"),
                    "" if not parent else reader.id(parent, 8, "parent_id"), reader.text(raw.get("name", ""), "name"),
                    CLIENT if attrs.get("openinference.span.kind") == "LLM" else INTERNAL,
                    _nanos(reader, raw.get("start_time")), _nanos(reader, raw.get("end_time")), attrs, events,
                    status_code=code, status_message=str(raw.get("status_message") or ""))
        add_span(found, span, {"service.name": "phoenix"}, {"name": "phoenix", "version": ""})
    return list(found.values())


def _id(v: Any, digits: int) -> str:
    text = str(v)
    if len(text) == digits and _HEX.match(text) and text.strip("0"):
        return text.lower()
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:digits]


def _json_text(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def langfuse_traces(reader, body: Any) -> list[Trace]:
    found: dict[str, Trace] = {}
    resource, scope = {"service.name": "langfuse"}, {"name": "langfuse", "version": ""}
    for ti, raw in enumerate(_items(body)):
        reader.where = f", trace {ti}"
        if not isinstance(raw, dict) or not isinstance(raw.get("observations"), list):
            raise reader.bad("is not a Langfuse trace: expected {id, observations: [...]}")
        if raw.get("id") in (None, ""):
            raise reader.bad("a trace has no id")
        trace_id = _id(raw["id"], 32)
        root_id = _id(f"trace:{raw['id']}", 16)
        start = _nanos(reader, raw.get("timestamp"))
        observations = [o for o in raw["observations"] if isinstance(o, dict)]
        end = max([start] + [_nanos(reader, o.get("endTime") or o.get("startTime")) for o in observations])
        attrs = {"langfuse.trace.id": str(raw["id"]), "langfuse.observation.type": "trace"}
        for key, name in (("input", "langfuse.trace.input"), ("output", "langfuse.trace.output")):
            if raw.get(key) is not None:
                attrs[name] = _json_text(raw[key])
        add_span(found, Span(trace_id, root_id, "", reader.text(raw.get("name") or "trace", "name"), INTERNAL,
                             start, end, attrs), resource, scope)
        for oi, o in enumerate(observations):
            reader.where = f", trace {ti}, observation {oi}"
            if o.get("id") in (None, ""):
                raise reader.bad("an observation has no id")
            kind = str(o.get("type") or "span").lower()
            a: dict = {"langfuse.observation.id": str(o["id"]), "langfuse.observation.type": kind}
            for key, name in (("input", "langfuse.observation.input"), ("output", "langfuse.observation.output"),
                              ("modelParameters", "langfuse.observation.model.parameters"),
                              ("usageDetails", "langfuse.observation.usage_details")):
                if o.get(key) is not None:
                    a[name] = _json_text(o[key])
            if o.get("usageDetails") is None and isinstance(o.get("usage"), dict):
                a["langfuse.observation.usage_details"] = json.dumps(o["usage"])
            if isinstance(o.get("model"), str):
                a["langfuse.observation.model.name"] = o["model"]
            if isinstance(o.get("level"), str):
                a["langfuse.observation.level"] = o["level"]
            parent = o.get("parentObservationId")
            s = _nanos(reader, o.get("startTime"))
            span = Span(trace_id, _id(o["id"], 16), _id(parent, 16) if parent else root_id,
                        reader.text(o.get("name") or kind, "name"), CLIENT if kind == "generation" else INTERNAL,
                        s, _nanos(reader, o.get("endTime")) or s, a,
                        status_code=2 if o.get("level") == "ERROR" else 0,
                        status_message=str(o.get("statusMessage") or "") if o.get("level") == "ERROR" else "")
            add_span(found, span, resource, scope)
    return list(found.values())
