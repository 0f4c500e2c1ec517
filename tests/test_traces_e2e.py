"""Runs of all three recorded kinds (the shell agent's, with a fork; a served API call; a
recorded program) exported as OpenTelemetry GenAI traces, read back by a real Arize Phoenix,
and round-tripped through `tttr import`. Real model, real sandbox, real Phoenix."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from program_helpers import cli_json, program_tree
from serve_helpers import free_port
from tttr.sessions.store import Store

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def _wait(url: str, deadline_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{url}: the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {deadline_s:.0f} s")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A database holding an agent run (1), its clock fork, a served call and a recorded program."""
    tmp = tmp_path_factory.mktemp("traces")
    db = tmp / "s.db"
    runs = {}
    runs["agent"] = _cli(["record", "--task", "write-line", "--seed", "1", "--db", str(db), "--json"])["run_id"]
    runs["fork"] = _cli(["fork", str(runs["agent"]), "--at", "setup:clock", "--set", "+30d", "--db", str(db), "--json"])["run_id"]
    runs["calls"] = _served_call(db)
    tree = program_tree(tmp, "work", (ROOT / "assets" / "examples" / "openai_agent.py").read_text())
    runs["program"] = _cli(["record", "--db", str(db), "--tree", str(tree), "--seed", "7", "--clock",
                            "2026-03-02T10:00:00", "--json", "--", "python3", "prog.py"])["run_id"]
    return db, runs


def _cli(argv: list[str]) -> dict:
    """`tttr ARGV --json` in a child process: its last line of output as JSON."""
    out = subprocess.run([sys.executable, "-m", "tttr.app.cli", *argv], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _served_call(db: Path) -> int:
    """One chat call through a real `tttr serve --db` process: the run it recorded."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tttr.app.cli", "serve", "--db", str(db), "--port", str(port), "--any-model"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait(f"http://127.0.0.1:{port}/health", 300, proc)  # 200 once the model is loaded
        body = json.dumps({"model": "any", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6,
                           "temperature": 0.5, "seed": 3}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    with Store.open(db, readonly=True) as store:
        return max(r.id for r in store.runs() if (r.task or "").startswith("api:"))


def _spans(path: Path) -> list[dict]:
    body = json.loads(path.read_text())
    return [s for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def _attrs(span: dict) -> dict:
    def value(v):
        (k, x), = v.items() if v else ((None, None),)
        if k == "intValue":
            return int(x)
        if k == "arrayValue":
            return [value(i) for i in x.get("values", [])]
        return x
    return {kv["key"]: value(kv.get("value") or {}) for kv in span.get("attributes", [])}


def _export(capsys, db, out: Path, *runs, content=True) -> dict:
    argv = ["export", *map(str, runs), "--db", str(db), "--otlp", str(out), "--json"] + (["--content"] if content else [])
    return cli_json(capsys, argv)


def test_every_kind_exports_as_one_genai_trace_with_tttr_facts(recorded, tmp_path, capsys):
    db, runs = recorded
    out = tmp_path / "all.json"
    answer = _export(capsys, db, out, *runs.values())
    spans = _spans(out)
    assert len(answer["traces"]) == 4 and answer["spans"] == len(spans)
    by_trace: dict[str, list[dict]] = {}
    for s in spans:
        by_trace.setdefault(s["traceId"], []).append(s)
    assert list(by_trace) == answer["traces"]
    with Store.open(db, readonly=True) as store:
        for (name, rid), trace_id in zip(runs.items(), answer["traces"]):
            trace = by_trace[trace_id]
            roots = [s for s in trace if "parentSpanId" not in s]
            assert len(roots) == 1 and roots[0]["name"].startswith("invoke_agent "), name
            root = roots[0]
            assert all(s.get("parentSpanId") == root["spanId"] for s in trace if s is not root)
            ra = _attrs(root)
            assert ra["gen_ai.operation.name"] == "invoke_agent" and ra["tttr.run.id"] == rid
            events = store.events(rid)
            messages = [e for e in events if e.kind == "message"]
            chats = [s for s in trace if _attrs(s).get("gen_ai.operation.name") == "chat"]
            assert [_attrs(s)["tttr.site"] for s in chats] == [e.site for e in messages], name
            for s, e in zip(chats, messages):
                a = _attrs(s)
                tokens = [t for t in events if t.kind == "token" and t.step == e.step]
                assert a["gen_ai.usage.output_tokens"] == len(tokens) and a["tttr.tokens.ids_digest"]
                assert a["tttr.logits.digest"] and a["tttr.kernel.mode"] == "invariant"
                assert a["tttr.rng.seed"] == tokens[0].value["rng"][0]
                out_msgs = json.loads(a["gen_ai.output.messages"])
                assert out_msgs[0]["parts"][0]["content"] == e.value["text"]
            tools = [s for s in trace if _attrs(s).get("gen_ai.operation.name") == "execute_tool"]
            clocks = [ev for ev in root.get("events", []) if ev["name"] == "tttr.clock"]
            assert len(clocks) == sum(1 for e in events if e.kind == "clock")
            if name in ("agent", "fork"):
                assert [_attrs(s)["gen_ai.tool.name"] for s in tools] == ["shell"] * sum(
                    1 for e in events if e.kind == "tool")
                assert ra["tttr.tree.start"] and ra["gen_ai.request.seed"] == 1
            if name == "calls":
                a = _attrs(chats[0])
                assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.seed"] == 3
                assert a["gen_ai.request.max_tokens"] == 6
                assert json.loads(a["gen_ai.input.messages"])[0]["parts"][0]["content"] == "Say hi."
            if name == "program":
                assert {_attrs(s)["gen_ai.tool.name"] for s in tools} == {"list_files", "write_file", "shell"}
                write = next(s for s in tools if _attrs(s)["gen_ai.tool.name"] == "write_file")
                assert json.loads(_attrs(write)["gen_ai.tool.call.arguments"])["args"] == ["greeting.txt", "hello world"]
                assert [ev["name"] for ev in root["events"]].count("tttr.program.end") == 1
            if name == "fork":
                (link,) = root["links"]
                parent_root = next(s for s in by_trace[answer["traces"][0]] if "parentSpanId" not in s)
                assert (link["traceId"], link["spanId"]) == (parent_root["traceId"], parent_root["spanId"])
                assert _attrs(link)["tttr.fork.site"] == "setup:clock"


def test_the_same_run_exports_with_the_same_ids_and_content_only_when_asked(recorded, tmp_path, capsys):
    db, runs = recorded
    a, b, bare = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "bare.json"
    _export(capsys, db, a, runs["program"])
    _export(capsys, db, b, runs["program"])
    assert a.read_bytes() == b.read_bytes()
    _export(capsys, db, bare, runs["program"], content=False)
    ids = lambda p: [(s["traceId"], s["spanId"]) for s in _spans(p)]  # noqa: E731
    assert ids(bare) == ids(a)
    names = {k for s in _spans(bare) for k in _attrs(s)}
    assert not names & {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments",
                        "gen_ai.tool.call.result"}
    assert "Task: Write the line" in a.read_text() and "Task: Write the line" not in bare.read_text()


def test_export_import_export_is_the_same_file_and_the_runs_read_like_any(recorded, tmp_path, capsys):
    db, runs = recorded
    first, second, imported = tmp_path / "1.json", tmp_path / "2.json", tmp_path / "imported.db"
    _export(capsys, db, first, *runs.values())
    done = cli_json(capsys, ["import", str(first), "--db", str(imported), "--json"])["runs"]
    assert [d["trace_id"] for d in done] == [s["traceId"] for s in _spans(first) if "parentSpanId" not in s]
    _export(capsys, imported, second, *[d["run"] for d in done])
    assert first.read_bytes() == second.read_bytes()
    with Store.open(db, readonly=True) as src, Store.open(imported, readonly=True) as dst:
        for (name, rid), d in zip(runs.items(), done):
            want = [(e.site, e.kind, e.value["text"] if e.kind == "message" else e.value.get("result", e.value.get("stdout")))
                    for e in src.events(rid) if e.kind == "message" or (e.kind == "tool" and "program" not in e.value)]
            got = [(e.site, e.kind, e.value["text"] if e.kind == "message" else e.value.get("result", e.value.get("stdout")))
                   for e in dst.events(d["run"])]
            assert got == want, name  # the recorded run's sites (tttr.step), its messages and tool results
    diff = cli_json(capsys, ["diff", str(done[0]["run"]), str(done[1]["run"]), "--db", str(imported), "--json"])
    assert diff["rows"]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    """A real Arize Phoenix (`phoenix serve`) on loopback ports, its data in a temporary folder."""
    work = tmp_path_factory.mktemp("phoenix")
    port, grpc = free_port(), free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(work), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc)}
    exe = shutil.which("phoenix")
    assert exe, "arize-phoenix is not installed: bash .ci/install --tests installs it"
    log = open(work / "log", "w")
    proc = subprocess.Popen([exe, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(f"http://127.0.0.1:{port}/healthz", 300, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_phoenix_receives_a_run_and_gives_back_its_spans_tree_and_attributes(recorded, phoenix, capsys, tmp_path):
    db, runs = recorded
    answer = cli_json(capsys, ["export", str(runs["program"]), str(runs["agent"]), "--db", str(db),
                               "--endpoint", phoenix, "--content", "--json"])
    deadline, got = time.time() + 60, []
    while time.time() < deadline and len(got) < answer["spans"]:
        with urllib.request.urlopen(f"{phoenix}/v1/projects/default/spans?limit=1000", timeout=10) as r:
            got = json.load(r)["data"]
        time.sleep(0.5)
    assert len(got) == answer["spans"]
    program = [s for s in got if s["context"]["trace_id"] == answer["traces"][0]]
    root = next(s for s in program if not s.get("parent_id"))
    assert root["name"] == "invoke_agent program:python3" and root["span_kind"] == "AGENT"
    children = [s for s in program if s is not root]
    assert all(s["parent_id"] == root["context"]["span_id"] for s in children)
    chats = [s for s in children if s["name"].startswith("chat ")]
    tools = sorted(s["name"] for s in children if s["name"].startswith("execute_tool "))
    assert len(chats) == 2 and tools == ["execute_tool list_files", "execute_tool shell", "execute_tool write_file"]
    a = chats[0]["attributes"]
    assert a["gen_ai.operation.name"] == "chat" and a["tttr.kernel.mode"] == "invariant"
    assert a["tttr.site"] in ("2:message", "3:message") and a["gen_ai.request.max_tokens"] == 12
    assert "Task: Write the line" in a["gen_ai.input.messages"]
    with Store.open(db, readonly=True) as store:
        assert root["attributes"]["tttr.run.id"] == runs["program"] == store.run(runs["program"]).id
        recorded_texts = [e.value["text"] for e in store.events(runs["program"]) if e.kind == "message"]
    # What Phoenix hands back (its spans API, OpenInference names) imports as a run with the same calls
    back = tmp_path / "phoenix.json"
    back.write_text(json.dumps({"data": program}))
    done = cli_json(capsys, ["import", str(back), "--db", str(tmp_path / "back.db"), "--format", "openinference",
                             "--json"])["runs"]
    assert [(d["trace_id"], d["model_calls"], d["tool_calls"]) for d in done] == [(answer["traces"][0], 2, 3)]
    with Store.open(tmp_path / "back.db", readonly=True) as store:
        events = store.events(done[0]["run"])
    assert [e.value["text"] for e in events if e.kind == "message"] == recorded_texts
    assert [e.value.get("function") or f"$ {e.value['cmd']}" for e in events if e.kind == "tool"] == \
        ["list_files", "write_file", "$ cat greeting.txt"]
