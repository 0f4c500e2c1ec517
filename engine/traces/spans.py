"""The values a trace is made of, both directions: a `Trace` of `Span`s, each with its attributes,
events and links, as plain Python values (attributes: str, bool, int, float, lists of those,
a dict for OpenTelemetry's kvlist, `Bytes` for its bytes).

A span also has a record form (`Span.record()` / `Span.from_record`): a JSON object kept in
an imported run's event, from which the same span is rebuilt for export, so that export →
import → export gives the same file.

Stable ids: a run's trace id is derived from the run's identity in its database (its id, when
it was created, its task, model and seed) and each span id from the trace id and the site the
span stands for, so exporting the same run twice gives the same ids.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from tttr.engine.traces.errors import TraceError

INTERNAL, SERVER, CLIENT = 1, 2, 3  # OTLP span kinds (0..5 are defined)
SPAN_KINDS = range(0, 6)
STATUS_CODES = range(0, 3)  # unset, ok, error


@dataclass(frozen=True, slots=True)
class Bytes:
    """An attribute's bytes value (OTLP's bytesValue)."""

    data: bytes


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict = field(default_factory=dict)


@dataclass(slots=True)
class SpanLink:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    attributes: dict = field(default_factory=dict)


@dataclass(slots=True)
class Span:
    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    parent_id: str  # "" for a root
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    links: list[SpanLink] = field(default_factory=list)
    status_code: int = 0
    status_message: str = ""
    trace_state: str = ""
    flags: int = 0

    def record(self) -> dict:
        """The span as JSON, as an imported run keeps it."""
        out = {"traceId": self.trace_id, "spanId": self.span_id, "name": self.name, "kind": self.kind,
               "start": self.start_ns, "end": self.end_ns, "attributes": to_json_value(self.attributes)}
        for key, value, empty in (("parentSpanId", self.parent_id, ""), ("statusCode", self.status_code, 0),
                                  ("statusMessage", self.status_message, ""), ("traceState", self.trace_state, ""),
                                  ("flags", self.flags, 0)):
            if value != empty:
                out[key] = value
        if self.events:
            out["events"] = [{"name": e.name, "time": e.time_ns, "attributes": to_json_value(e.attributes)}
                             for e in self.events]
        if self.links:
            out["links"] = [{"traceId": ln.trace_id, "spanId": ln.span_id, "attributes": to_json_value(ln.attributes)}
                            for ln in self.links]
        return out

    @classmethod
    def from_record(cls, r: dict) -> "Span":
        """The span an imported run kept (`record()`); TraceError when the record is not one."""
        try:
            get = r.get
            return cls(
                _hex(r["traceId"], 32), _hex(r["spanId"], 16), _hex(get("parentSpanId", ""), 16, empty=True),
                _str(r["name"]), _int(r["kind"]), _int(r["start"]), _int(r["end"]),
                from_json_value(get("attributes", {})),
                [SpanEvent(_str(e["name"]), _int(e["time"]), from_json_value(e.get("attributes", {})))
                 for e in get("events", ())],
                [SpanLink(_hex(ln["traceId"], 32), _hex(ln["spanId"], 16), from_json_value(ln.get("attributes", {})))
                 for ln in get("links", ())],
                _int(get("statusCode", 0)), _str(get("statusMessage", "")), _str(get("traceState", "")),
                _int(get("flags", 0)),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise TraceError(f"a kept span record is damaged ({type(exc).__name__}: {str(exc)[:60]})") from None


@dataclass(slots=True)
class Trace:
    """One trace: its spans (in the order they are written), and per span the resource and
    instrumentation scope it was reported under (indexes into `resources` / `scopes`)."""

    trace_id: str
    spans: list[Span]
    resources: list[dict] = field(default_factory=lambda: [{}])  # each: attributes
    scopes: list[dict] = field(default_factory=lambda: [{"name": "tttr", "version": ""}])
    placement: list[tuple[int, int]] = field(default_factory=list)  # per span: (resource, scope); empty: all (0, 0)

    def where(self, i: int) -> tuple[int, int]:
        return self.placement[i] if self.placement else (0, 0)


_SCALARS = (str, int, float, bool, type(None))


def _plain(attrs: dict) -> bool:
    """Whether every value is a scalar or a list of scalars (JSON as it is: the usual case)."""
    for v in attrs.values():
        t = type(v)
        if t in _SCALARS:
            continue
        if t is list and all(type(x) in _SCALARS for x in v):
            continue
        return False
    return True


def to_json_value(v: Any) -> Any:
    """An attribute value as JSON (bytes as {"$bytes": base64})."""
    if type(v) is dict and _plain(v):
        return v
    if isinstance(v, dict):
        return {k: to_json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_json_value(x) for x in v]
    if isinstance(v, Bytes):
        return {"$bytes": base64.b64encode(v.data).decode("ascii")}
    return v


def from_json_value(v: Any) -> Any:
    if type(v) is dict and _plain(v):
        return v
    if isinstance(v, dict):
        if len(v) == 1 and isinstance(v.get("$bytes"), str):
            return Bytes(base64.b64decode(v["$bytes"]))
        return {k: from_json_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json_value(x) for x in v]
    return v


_HEX = re.compile(r"[0-9a-f]+\Z")


def _hex(v: Any, digits: int, empty: bool = False) -> str:
    if type(v) is not str or len(v) != digits or not _HEX.match(v):
        if empty and v == "":
            return ""
        raise TypeError(f"{str(v)[:40]!r} is not {digits} hex digits")
    return v


def _int(v: Any) -> int:
    if type(v) is not int:
        raise TypeError(f"{str(v)[:40]!r} is not an integer")
    return v


def _str(v: Any) -> str:
    if type(v) is not str:
        raise TypeError(f"{str(v)[:40]!r} is not text")
    return v


# ---------------------------------------------------------------------------- stable ids
def run_identity(run) -> str:
    """What names a run across exports: its id in its database, when it was created, its task,
    model and seed (a fork's or replay's parent with it)."""
    return "\x1f".join(str(x) for x in ("tttr-run", run.id, run.created, run.task, run.model_id, run.seed, run.parent))


def trace_id_of(identity: str) -> str:
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def span_id_of(trace_id: str, what: str) -> str:
    """The id of the span that stands for `what` ("run", a site) in trace `trace_id`; never 0."""
    digest = hashlib.sha256(f"{trace_id}\x1f{what}".encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return digest if digest != "0" * 16 else "0" * 15 + "1"


def add_span(found: dict[str, Trace], span: Span, resource: dict, scope: dict) -> None:
    """Put `span` into its trace in `found` (by trace id, in first-seen order), reported under
    `resource` and `scope`."""
    trace = found.get(span.trace_id)
    if trace is None:
        trace = found[span.trace_id] = Trace(span.trace_id, [], [], [], [])
    trace.spans.append(span)
    trace.placement.append((_index(trace.resources, resource), _index(trace.scopes, scope)))


def _index(items: list[dict], item: dict) -> int:
    try:
        return items.index(item)
    except ValueError:
        items.append(item)
        return len(items) - 1
