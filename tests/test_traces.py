"""`tttr import` and `tttr export` without a model: traces written as other tools write them
(OpenTelemetry GenAI, OpenInference/Phoenix, Langfuse attribute names), imported as runs of the
imported kind, exported back identically; bad input refused in one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serve_helpers import free_port
from tttr.app.cli import main
from tttr.engine.kinds import IMPORTED, kind_of
from tttr.sessions.store import Store

TRACE = "5b8aa5a2d2c872e8321cf37308d69df2"


def _kv(attrs: dict) -> list[dict]:
    out = []
    for k, v in attrs.items():
        if isinstance(v, bool):
            out.append({"key": k, "value": {"boolValue": v}})
        elif isinstance(v, int):
            out.append({"key": k, "value": {"intValue": str(v)}})
        elif isinstance(v, float):
            out.append({"key": k, "value": {"doubleValue": v}})
        elif isinstance(v, list):
            out.append({"key": k, "value": {"arrayValue": {"values": [{"stringValue": x} for x in v]}}})
        else:
            out.append({"key": k, "value": {"stringValue": v}})
    return out


def _span(sid: str, name: str, start: int, attrs: dict, parent: str | None = "a" * 16, **more) -> dict:
    s = {"traceId": TRACE, "spanId": sid, "name": name, "kind": 1, "startTimeUnixNano": str(start),
         "endTimeUnixNano": str(start + 500), "attributes": _kv(attrs), **more}
    if parent:
        s["parentSpanId"] = parent
    return s


def _file(tmp_path: Path, spans: list[dict], name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"resourceSpans": [{"resource": {"attributes": _kv({"service.name": "shop-agent"})},
                                                   "scopeSpans": [{"scope": {"name": "openinference"}, "spans": spans}]}]}))
    return path


def _openinference(tmp_path: Path) -> Path:
    """A Phoenix-style agent trace, its spans listed out of order: chat, tool, chat under a chain."""
    spans = [
        _span("d" * 16, "ChatOpenAI", 3_000, {
            "openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini",
            "llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": "What is in stock?",
            "llm.input_messages.1.message.role": "tool", "llm.input_messages.1.message.content": "3 apples",
            "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "Three apples.",
            "llm.invocation_parameters": json.dumps({"temperature": 0.2, "seed": 5}),
            "llm.token_count.prompt": 20, "llm.token_count.completion": 3}),
        _span("c" * 16, "stock", 2_000, {"openinference.span.kind": "TOOL", "tool.name": "stock",
                                         "input.value": json.dumps({"item": "apple"}), "output.value": "3 apples"}),
        _span("b" * 16, "ChatOpenAI", 1_000, {
            "openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini",
            "llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": "What is in stock?",
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "stock",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": json.dumps({"item": "apple"})}),
        _span("a" * 16, "AgentExecutor", 500, {"openinference.span.kind": "CHAIN"}, parent=None),
    ]
    return _file(tmp_path, spans)


def _run(capsys, argv) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_an_openinference_trace_imports_in_causal_order_as_an_imported_run(tmp_path, capsys):
    db = tmp_path / "i.db"
    code, out, err = _run(capsys, ["import", str(_openinference(tmp_path)), "--db", str(db), "--format", "openinference"])
    assert code == 0, err
    assert f"imported trace {TRACE} as run 1: 4 spans, 2 model call(s), 1 tool call(s)" in out
    with Store.open(db, readonly=True) as store:
        run = store.run(1)
        assert kind_of(run) is IMPORTED and run.task == "trace:AgentExecutor" and run.model_id == "gpt-4o-mini"
        events = store.events(1)
    assert [(e.site, e.kind) for e in events] == [("0:message", "message"), ("1:tool", "tool"), ("2:message", "message")]
    first, tool, second = (e.value for e in events)
    assert first["tool_calls"][0]["function"] == {"name": "stock", "arguments": json.dumps({"item": "apple"})}
    assert first["input"] == [{"role": "user", "content": "What is in stock?"}]
    assert tool["function"] == "stock" and tool["kwargs"] == {"item": "apple"} and tool["result"] == "3 apples"
    assert second["text"] == "Three apples." and second["sampling"] == {"temperature": 0.2, "seed": 5}
    assert second["usage"] == {"input_tokens": 20, "output_tokens": 3}


def test_langfuse_names_are_read_and_a_trace_without_content_says_what_it_lacks(tmp_path, capsys):
    spans = [
        _span("a" * 16, "agent", 100, {"langfuse.observation.type": "agent"}, parent=None),
        _span("b" * 16, "generation", 200, {
            "langfuse.observation.type": "generation", "langfuse.observation.model.name": "claude-x",
            "langfuse.observation.input": json.dumps([{"role": "user", "content": "hi"}]),
            "langfuse.observation.output": json.dumps({"role": "assistant", "content": "hello"})}),
        _span("c" * 16, "chat m", 300, {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}),
    ]
    db = tmp_path / "l.db"
    code, out, err = _run(capsys, ["import", str(_file(tmp_path, spans)), "--db", str(db), "--format", "langfuse"])
    assert code == 0, err
    assert "the trace lacks input messages, output message" in out
    with Store.open(db, readonly=True) as store:
        lf, bare = (e.value for e in store.events(1))
        assert lf["text"] == "hello" and lf["input"] == [{"role": "user", "content": "hi"}] and lf["model"] == "claude-x"
        assert bare["missing"] == ["input messages", "output message"] and "input" not in bare
        assert store.run(1).meta["missing"] == ["input messages", "output message"]


def test_a_foreign_trace_round_trips_and_keeps_its_ids(tmp_path, capsys):
    src = _openinference(tmp_path)
    db, again = tmp_path / "r.db", tmp_path / "r2.db"
    out1, out2 = tmp_path / "1.json", tmp_path / "2.json"
    assert _run(capsys, ["import", str(src), "--db", str(db)])[0] == 0
    assert _run(capsys, ["export", "1", "--db", str(db), "--otlp", str(out1), "--content"])[0] == 0
    assert _run(capsys, ["import", str(out1), "--db", str(again)])[0] == 0
    assert _run(capsys, ["export", "1", "--db", str(again), "--otlp", str(out2), "--content"])[0] == 0
    assert out1.read_bytes() == out2.read_bytes()
    spans = json.loads(out1.read_text())["resourceSpans"][0]["scopeSpans"][0]["spans"]
    original = json.loads(src.read_text())["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert [(s["traceId"], s["spanId"], s.get("parentSpanId")) for s in spans] == \
        [(s["traceId"], s["spanId"], s.get("parentSpanId")) for s in original]
    bare = tmp_path / "bare.json"
    assert _run(capsys, ["export", "1", "--db", str(db), "--otlp", str(bare)])[0] == 0
    assert "What is in stock?" in out1.read_text() and "What is in stock?" not in bare.read_text()


def test_control_characters_and_markup_in_content_are_data(tmp_path, capsys):
    hostile = "\x1b[31mred\x1b[0m [bold red]x[/bold red] \x07"
    spans = [_span("a" * 16, "chat \x1b]0;title\x07m", 1, {"gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps(
        [{"role": "assistant", "parts": [{"type": "text", "content": hostile}]}])}, parent=None)]
    db = tmp_path / "h.db"
    assert _run(capsys, ["import", str(_file(tmp_path, spans)), "--db", str(db)])[0] == 0
    with Store.open(db, readonly=True) as store:
        assert store.events(1)[0].value["text"] == hostile
    for argv in (["events", str(db), "1"], ["events", str(db), "1", "--json"], ["runs", str(db)]):
        code, out, _ = _run(capsys, argv)
        assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert "[bold " in _run(capsys, ["events", str(db), "1"])[1]  # shown as text, not taken as markup
    assert "[bold red]x[/bold red]" in _run(capsys, ["events", str(db), "1", "--json"])[1]


def _bad(tmp_path: Path, name: str) -> Path:
    ok = _span("a" * 16, "root", 1, {}, parent=None)
    cases = {
        "not JSON": "{\"resourceSpans\": [",
        "not OTLP": json.dumps({"traces": []}),
        "no trace id": None,
        "unknown span kind": None,
        "a parent cycle": None,
        "an all-zero span id": None,
        "a bad attribute value": None,
        "no spans": json.dumps({"resourceSpans": []}),
    }
    if cases.get(name) is not None:
        path = tmp_path / "bad.json"
        path.write_text(cases[name])
        return path
    if name == "no trace id":
        spans = [ok, {**_span("b" * 16, "x", 2, {}), "traceId": ""}]
    elif name == "unknown span kind":
        spans = [ok, {**_span("b" * 16, "x", 2, {}), "kind": 9}]
    elif name == "a parent cycle":
        spans = [_span("b" * 16, "x", 2, {}, parent="c" * 16), _span("c" * 16, "y", 3, {}, parent="b" * 16)]
    elif name == "an all-zero span id":
        spans = [_span("0" * 16, "x", 2, {}, parent=None)]
    else:
        spans = [{**ok, "attributes": [{"key": "k", "value": {"intValue": "twelve"}}]}]
    return _file(tmp_path, spans, "bad.json")


@pytest.mark.parametrize("case", ["not JSON", "not OTLP", "no trace id", "unknown span kind", "a parent cycle",
                                  "an all-zero span id", "a bad attribute value", "no spans"])
def test_a_bad_file_is_one_line_exit_2_and_no_database(tmp_path, capsys, case):
    db = tmp_path / "never.db"
    code, out, err = _run(capsys, ["import", str(_bad(tmp_path, case)), "--db", str(db)])
    assert code == 2 and out == "" and err.startswith("tttr: error: ") and err.count("\n") == 1, err
    assert not db.exists()


def test_a_1_gb_file_is_refused_before_it_is_read(tmp_path, capsys):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: no gigabyte written
    db = tmp_path / "never.db"
    code, _, err = _run(capsys, ["import", str(big), "--db", str(db)])
    assert code == 2 and "1,024 MiB" in err and "up to 256 MiB" in err and err.count("\n") == 1
    assert not db.exists()


def test_an_existing_database_is_left_as_it_was_by_a_bad_file(tmp_path, capsys):
    db = tmp_path / "i.db"
    assert _run(capsys, ["import", str(_openinference(tmp_path)), "--db", str(db)])[0] == 0
    before = db.read_bytes()
    assert _run(capsys, ["import", str(_bad(tmp_path, "a parent cycle")), "--db", str(db)])[0] == 2
    assert db.read_bytes() == before


def test_a_collector_that_does_not_answer_is_one_line_and_nothing_is_lost(tmp_path, capsys):
    db = tmp_path / "i.db"
    assert _run(capsys, ["import", str(_openinference(tmp_path)), "--db", str(db)])[0] == 0
    before = db.read_bytes()
    code, out, err = _run(capsys, ["export", "1", "--db", str(db), "--endpoint", f"http://127.0.0.1:{free_port()}"])
    assert code == 2 and out == "" and "did not answer" in err and "--otlp FILE.json" in err and err.count("\n") == 1
    assert db.read_bytes() == before
    code, _, err = _run(capsys, ["export", "7", "--db", str(db), "--otlp", str(tmp_path / "no.json")])
    assert code == 2 and "no run 7" in err and not (tmp_path / "no.json").exists()


def test_an_imported_run_takes_a_program_to_replay_and_refuses_triage_in_one_line(tmp_path, capsys):
    db = tmp_path / "i.db"
    assert _run(capsys, ["import", str(_openinference(tmp_path)), "--db", str(db)])[0] == 0
    assert _run(capsys, ["import", str(_openinference(tmp_path)), "--db", str(db)])[0] == 0
    before = db.read_bytes()
    for argv in (["replay", "1", "--db", str(db)], ["fork", "1", "--at", "1:tool", "--set", "x", "--db", str(db)],
                 ["triage", "1", "2", "--db", str(db)]):
        code, out, err = _run(capsys, argv)
        assert code == 2 and err.count("\n") == 1 and "imported trace" in err, (argv, err)
        assert "-- python3 agent.py" in err or argv[0] == "triage"  # how to run a program against it
    assert db.read_bytes() == before
    code, out, _ = _run(capsys, ["info", str(db), "--json"])
    assert code == 0 and "2 run(s) imported from traces (1, 2)" in out and "no clock reads" in out
    assert "a program replays and forks against one" in out
    code, out, _ = _run(capsys, ["diff", "1", "2", "--db", str(db), "--json"])
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["identical"] is True


def test_the_bench_round_trips_a_trace_it_times(tmp_path):
    from tttr.engine.bench.export import run_bench

    r = run_bench(spans=1000)
    assert r["round_trip_identical"] is True and r["spans"] == 1000
    assert r["import_spans_per_s"] > 0 and r["export_spans_per_s"] > 0


def test_the_app_shows_an_imported_run_on_its_timeline(tmp_path, capsys):
    from tests.app_helpers import run_app
    from tttr.app.widgets.detail import DetailPane
    from tttr.app.widgets.timeline import Timeline

    db = tmp_path / "i.db"
    assert _run(capsys, ["import", str(_openinference(tmp_path)), "--db", str(db)])[0] == 0

    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        await pilot.press("z")  # every step expanded: one row per event
        lines = "\n".join(timeline.render_line(y).text.rstrip() for y in range(timeline.size.height))
        assert 'stock(item="apple")  → "3 apples"' in lines and "Three apples." in lines
        assert "imported trace: messages only" in str(app.screen.query_one("#run-title").render())
        timeline.cursor = timeline.view.at("0:message").seq
        await pilot.pause()
        assert '"name": "stock"' in app.screen.query_one(DetailPane).text  # the tool call the model asked for

    run_app(db, flow, run_id=1, load_tokenizer=False)


def test_export_refuses_a_run_it_cannot_read_and_writes_no_file(tmp_path, capsys):
    db = tmp_path / "d.db"
    with Store.open(db) as store:
        rid = store.begin_run(task="write-line", model_id="m", seed=1)
        store.append(rid, "0:message", {"text": 12})  # not text: unreadable
        store.finish_run(rid)
    assert _run(capsys, ["import", str(_openinference(tmp_path)), "--db", str(db)])[0] == 0
    import sqlite3

    with sqlite3.connect(db) as conn:  # an imported run whose kept spans a hand-edited file damaged
        conn.execute("UPDATE runs SET meta = json_set(meta, '$.trace.others', 'x') WHERE id = 2")
    assert _run(capsys, ["import", str(_openinference(tmp_path)), "--db", str(db)])[0] == 0  # run 3, sound
    out = tmp_path / "o.json"
    for rid, why in ((1, "0:message"), (2, "kept spans")):
        code, _, err = _run(capsys, ["export", str(rid), "--db", str(db), "--otlp", str(out)])
        assert code == 2 and why in err and err.count("\n") == 1, err
        assert not out.exists()
    code, _, err = _run(capsys, ["export", "3", "--db", str(db), "--otlp", str(tmp_path / "no" / "o.json")])
    assert code == 2 and "does not exist" in err
    code, _, err = _run(capsys, ["export", "3", "--db", str(db), "--endpoint", "ftp://x"])
    assert code == 2 and "not an http(s) URL" in err


def test_message_json_nested_beyond_reason_is_kept_as_text(tmp_path, capsys):
    deep = "[" * 100_000 + "]" * 100_000
    spans = [_span("a" * 16, "chat m", 1, {"gen_ai.operation.name": "chat", "gen_ai.input.messages": deep,
                                           "gen_ai.output.messages": "[" * 60 + "]" * 60}, parent=None),
             _span("b" * 16, "execute_tool t", 2, {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t",
                                                   "gen_ai.tool.call.result": deep})]
    db = tmp_path / "deep.db"
    code, out, err = _run(capsys, ["import", str(_file(tmp_path, spans)), "--db", str(db)])
    assert code == 0, err
    with Store.open(db, readonly=True) as store:
        chat, tool = store.events(1)
    assert chat.problem is None and tool.problem is None
    assert tool.value["result"] == deep and "input" not in chat.value


def test_a_langfuse_api_trace_imports_with_its_observations_in_order(tmp_path, capsys):
    trace = {"id": "trace-1", "name": "support-bot", "timestamp": "2026-03-02T10:00:00Z", "input": {"q": "refund?"},
             "observations": [
                 {"id": "obs-3", "type": "GENERATION", "name": "answer", "startTime": "2026-03-02T10:00:03Z",
                  "endTime": "2026-03-02T10:00:04Z", "parentObservationId": "obs-0", "model": "claude-x",
                  "modelParameters": {"temperature": 0}, "usageDetails": {"input": 30, "output": 5},
                  "input": [{"role": "user", "content": "refund?"}, {"role": "tool", "content": "order 7: paid"}],
                  "output": {"role": "assistant", "content": "Refunded."}},
                 {"id": "obs-2", "type": "TOOL", "name": "lookup_order", "startTime": "2026-03-02T10:00:02Z",
                  "parentObservationId": "obs-0", "input": {"order": 7}, "output": "order 7: paid"},
                 {"id": "obs-1", "type": "GENERATION", "name": "plan", "startTime": "2026-03-02T10:00:01Z",
                  "parentObservationId": "obs-0", "model": "claude-x", "input": [{"role": "user", "content": "refund?"}],
                  "output": {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "lookup_order", "arguments": "{\"order\": 7}"}}]}},
                 {"id": "obs-0", "type": "AGENT", "name": "agent", "startTime": "2026-03-02T10:00:00Z"},
                 {"id": "obs-9", "type": "TOOL", "name": "notify", "startTime": "2026-03-02T10:00:05Z",
                  "parentObservationId": "obs-0", "level": "ERROR", "statusMessage": "mail server down"},
             ]}
    path = tmp_path / "langfuse.json"
    path.write_text(json.dumps({"data": [trace]}))
    db = tmp_path / "lf.db"
    code, out, err = _run(capsys, ["import", str(path), "--db", str(db), "--format", "langfuse", "--json"])
    assert code == 0, err
    (done,) = json.loads(out)["runs"]
    assert done["model_calls"] == 2 and done["tool_calls"] == 2 and done["spans"] == 6
    with Store.open(db, readonly=True) as store:
        assert store.run(1).task == "trace:support-bot"
        plan, lookup, answer, notify = (e.value for e in store.events(1))
    assert plan["tool_calls"][0]["function"]["name"] == "lookup_order"
    assert lookup["function"] == "lookup_order" and lookup["kwargs"] == {"order": 7} and lookup["result"] == "order 7: paid"
    assert answer["text"] == "Refunded." and answer["usage"] == {"input_tokens": 30, "output_tokens": 5}
    assert answer["input"][1] == {"role": "tool", "content": "order 7: paid"} and answer["sampling"] == {"temperature": 0}
    assert notify["error"] == {"message": "mail server down"} and "result" not in notify
    assert _run(capsys, ["export", "1", "--db", str(db), "--otlp", str(tmp_path / "o.json"), "--content"])[0] == 0
    assert _run(capsys, ["import", str(tmp_path / "o.json"), "--db", str(tmp_path / "again.db")])[0] == 0


def test_phoenix_spans_with_nested_attributes_import(tmp_path, capsys):
    spans = {"data": [
        {"name": "ChatOpenAI", "context": {"trace_id": TRACE, "span_id": "b" * 16}, "parent_id": "a" * 16,
         "span_kind": "LLM", "start_time": "2026-03-02T10:00:01+00:00", "end_time": "2026-03-02T10:00:02+00:00",
         "status_code": "OK", "attributes": {"llm": {"model_name": "gpt-x", "input_messages": [
             {"message": {"role": "user", "content": "hi"}}], "output_messages": [
             {"message": {"role": "assistant", "content": "hello"}}]}}},
        {"name": "agent", "context": {"trace_id": TRACE, "span_id": "a" * 16}, "parent_id": None,
         "span_kind": "AGENT", "start_time": "2026-03-02T10:00:00+00:00", "end_time": "2026-03-02T10:00:03+00:00",
         "status_code": "UNSET", "attributes": {}},
    ]}
    path = tmp_path / "phoenix.json"
    path.write_text(json.dumps(spans))
    db = tmp_path / "px.db"
    assert _run(capsys, ["import", str(path), "--db", str(db), "--format", "openinference"])[0] == 0
    with Store.open(db, readonly=True) as store:
        (call,) = (e.value for e in store.events(1))
        assert store.run(1).task == "trace:agent"
    assert call["text"] == "hello" and call["input"] == [{"role": "user", "content": "hi"}] and call["model"] == "gpt-x"


def test_steps_named_by_the_spans_are_kept_only_when_they_make_sites(tmp_path, capsys):
    def spans(steps):
        return [_span("a" * 16, "root", 0, {}, parent=None)] + [
            _span(f"{i + 1:016x}", "chat m", 10 * (i + 1), {"gen_ai.operation.name": "chat", "tttr.step": step})
            for i, step in enumerate(steps)]

    for steps, sites in (([2, 5], ["2:message", "5:message"]), ([5, 2], ["0:message", "1:message"]),
                         ([3, 3], ["0:message", "1:message"])):
        db = tmp_path / f"s{steps[0]}{steps[1]}.db"
        assert _run(capsys, ["import", str(_file(tmp_path, spans(steps))), "--db", str(db)])[0] == 0
        with Store.open(db, readonly=True) as store:
            assert [e.site for e in store.events(1)] == sites, steps
