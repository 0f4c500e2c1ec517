"""The OTLP/JSON file is written from the span model directly (engine/traces/otlp_json.py), not
through protobuf's json_format: it must be what json_format writes of the messages that
`--endpoint` sends (with OTLP/JSON's hex ids), and protobuf's own parser must read it back as
those messages. And the reader's short path reads what its general path reads."""

from __future__ import annotations

import base64
import json

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tttr.engine.bench.export import synthetic_trace
from tttr.engine.traces.errors import TraceError
from tttr.engine.traces.otlp import read_json, to_json, to_request
from tttr.engine.traces.otlp_json import to_dict
from tttr.engine.traces.spans import Bytes, Span, SpanEvent, SpanLink, Trace, span_id_of, trace_id_of

ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _odd() -> Trace:
    """Every field and every kind of value, at their defaults and beyond."""
    t = trace_id_of("odd")
    r = span_id_of(t, "root")
    attrs = {"": "no key", "s": "", "b": False, "i": 0, "neg": -7, "big": 2**70, "nan": float("nan"),
             "inf": float("-inf"), "z": -0.0, "e": 1e16, "by": Bytes(b"\x00\xff"), "l": [], "d": {}, "n": None,
             "nl": [None, 1, "a", [2.5, {"q": None}]], "kv": {"a": {"b": [True]}, "": 3}, "t": (1, 2),
             "u": "ünï \u2028 \x00\x1b[31m <b>[red]x[/red]</b>"}
    root = Span(t, r, "", "", 0, 0, 0, attrs,
                [SpanEvent("", 0, {}), SpanEvent("tttr.clock", 5, {"tttr.clock.t": 1.5})],
                [SpanLink(t, span_id_of(t, "p"), {}), SpanLink(t, span_id_of(t, "q"), {"tttr.link": "fork"})],
                2, "", "vendor=1", 257)
    kid = Span(t, span_id_of(t, "kid"), r, "kid", 3, 10, 20, {"x": 1}, status_code=0, status_message="only a message")
    return Trace(t, [root, kid], [{}, {"service.name": "a"}],
                 [{"name": "", "version": ""}, {"name": "s", "version": "1", "attributes": {"a": 1}}], [(1, 1), (0, 0)])


CASES = {"synthetic": lambda: [synthetic_trace(30)], "odd": lambda: [_odd()],
         "two traces": lambda: [_odd(), synthetic_trace(7, "other")], "none": lambda: []}


def _by_json_format(traces: list[Trace]) -> dict:
    body = json_format.MessageToDict(to_request(traces), use_integers_for_enums=True)
    for rs in body.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for obj in [span, *span.get("links", [])]:
                    for key in ID_KEYS:
                        if key in obj:
                            obj[key] = base64.b64decode(obj[key]).hex()
    return body


@pytest.mark.parametrize("case", CASES)
def test_the_file_is_what_json_format_writes_of_the_messages(case):
    traces = CASES[case]()
    direct = to_dict(traces)
    assert json.dumps(direct) == json.dumps(_by_json_format(traces))  # keys, their order, every value ("NaN" too)
    if traces:
        span = direct["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        assert len(span["traceId"]) == 32 and int(span["traceId"], 16)  # hex, as OTLP/JSON says


@pytest.mark.parametrize("case", CASES)
def test_protobuf_parses_the_file_into_the_message_endpoint_sends(case):
    traces = CASES[case]()
    body = json.loads(to_json(traces))
    for rs in body.get("resourceSpans", []):  # protobuf's parser reads ids as base64: OTLP/JSON's hex, turned back
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for obj in [span, *span.get("links", [])]:
                    for key in ID_KEYS:
                        if key in obj:
                            obj[key] = base64.b64encode(bytes.fromhex(obj[key])).decode()
    parsed = json_format.ParseDict(body, trace_service_pb2.ExportTraceServiceRequest())
    sent = to_request(traces)
    # bytes, not ==: a NaN attribute is not equal to itself
    assert parsed.SerializeToString(deterministic=True) == sent.SerializeToString(deterministic=True)
    assert len(parsed.resource_spans) == len(sent.resource_spans)


def test_a_file_reads_back_as_the_spans_it_was_written_from():
    trace = synthetic_trace(40)
    (back,) = read_json(to_json([trace]))
    assert back.spans == trace.spans and back.trace_id == trace.trace_id


def _one(span: dict) -> str:
    base = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "s", "startTimeUnixNano": "1", "endTimeUnixNano": "2"}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{**base, **span}]}]}]})


def test_the_readers_short_path_reads_what_the_general_one_does():
    (t,) = read_json(_one({"traceId": "AB" * 16, "spanId": base64.b64encode(bytes.fromhex("cd" * 8)).decode()}))
    assert (t.spans[0].trace_id, t.spans[0].span_id) == ("ab" * 16, "cd" * 8)  # upper case and base64: lower hex
    (t,) = read_json(_one({"startTimeUnixNano": "18446744073709551615", "endTimeUnixNano": 3,
                           "attributes": [{"key": "a", "value": {"intValue": "-5"}},
                                          {"key": "b", "value": {"intValue": "9223372036854775807"}},
                                          {"key": "c", "value": {"intValue": 7}},
                                          {"key": "d", "value": {"stringValue": "7"}}]}))
    s = t.spans[0]
    assert (s.start_ns, s.end_ns) == (2**64 - 1, 3)
    assert s.attributes == {"a": -5, "b": 2**63 - 1, "c": 7, "d": "7"}


@pytest.mark.parametrize("span, says", [
    ({"startTimeUnixNano": "18446744073709551616"}, "is not nanoseconds"),
    ({"endTimeUnixNano": "１２"}, "is not nanoseconds"),  # digits, but not ASCII ones
    ({"attributes": [{"key": "a", "value": {"intValue": "9223372036854775808"}}]}, "is not what OTLP/JSON allows"),
    ({"attributes": [{"key": "a", "value": {"intValue": "--5"}}]}, "is not what OTLP/JSON allows"),
    ({"attributes": [{"key": "a", "value": {"intValue": "²"}}]}, "is not what OTLP/JSON allows"),
    ({"spanId": "00" * 8}, "all zeros"),
    ({"traceId": "ab cd" * 6 + "ab"}, "is not 32 hex digits"),
    ({"parentSpanId": "xy" * 8}, "is not 16 hex digits"),
    ({"name": 5}, "name is not text"),
])
def test_a_bad_value_is_one_line_on_either_path(span, says):
    with pytest.raises(TraceError) as err:
        read_json(_one(span))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_orjson_and_the_standard_library_write_the_same_file(monkeypatch):
    from tttr.engine.traces import otlp_json

    traces = [_odd(), synthetic_trace(20)]
    small = [Trace(trace_id_of("s"), [Span(trace_id_of("s"), "ab" * 8, "", "s", 1, 1, 2, {"f": 1e-07, "g": 2.5e-5})])]
    fast, fast_small = otlp_json.to_bytes(traces), otlp_json.to_bytes(small)
    monkeypatch.setattr(otlp_json, "orjson", None)
    assert otlp_json.to_bytes(traces) == fast
    plain_small = otlp_json.to_bytes(small)  # a small float's exponent is the one difference (1e-07, 1e-7)
    assert read_json(plain_small)[0].spans == read_json(fast_small)[0].spans == small[0].spans


def test_text_with_a_lone_surrogate_exports_and_reads_back(tmp_path):
    t = trace_id_of("surrogate")
    trace = Trace(t, [Span(t, span_id_of(t, "r"), "", "name \ud800 x", 1, 1, 2, {"a": "\udfff"})])
    data = to_json([trace])
    data.encode("ascii")  # escaped, so the file is UTF-8 (ASCII even)
    (back,) = read_json(data)
    assert back.spans == trace.spans


@pytest.mark.parametrize("text", ['{"a": [1, 2.5, "x"]}', '[NaN, Infinity, -Infinity]', '[123456789012345678901234567890]', '[-9223372036854775809, 18446744073709551615]',
                                  '"\\ud800"', '{"a": 1, "a": 2}', '[1e400, -0.0, 5e-324]'])
def test_fastjson_reads_what_json_reads(text):
    from tttr.engine.traces.fastjson import loads

    assert repr(loads(text)) == repr(json.loads(text))


@pytest.mark.parametrize("text", ['{"a": ', "[" * 5000 + "]" * 5000, "\xff", ""])
def test_fastjson_fails_where_json_fails(text):
    from tttr.engine.traces.fastjson import loads

    with pytest.raises((ValueError, RecursionError)) as ours:
        loads(text)
    with pytest.raises((ValueError, RecursionError)) as theirs:
        json.loads(text)
    assert type(ours.value) is type(theirs.value)
