"""The SDK (`tttr.recorders.sdk`) for a user's agent program: outside a recording it just
does the work; inside one (TTTR_RECORDER_URL, TTTR_RUN) it posts tool calls and clock reads
to `tttr serve --db`, which records them as trace-layer events of the same run as the
program's model calls. The SDK routes need no model; the test marked slow makes real calls."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import datetime

import pytest

from tttr.recorders import sdk
from serve_helpers import Running, free_port


@pytest.fixture(autouse=True)
def _no_recorder(monkeypatch):
    for name in (sdk.URL_ENV, sdk.RUN_ENV, sdk.REPLAY_ENV):
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------------------- outside a recording
def test_the_sdk_imports_without_torch():
    code = ("import sys; from tttr.recorders import sdk; "
            "print(json.dumps(sorted(m for m in ('torch', 'numpy', 'textual', 'tttr.engine', 'tttr.sessions', "
            "'subprocess', 'urllib.request') if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import json; " + code],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert "tttr.recorders.sdk" in done.stderr  # -X importtime saw it (its cost is `tttr bench`'s to report)


def test_outside_a_recording_every_call_just_does_its_work(tmp_path):
    @sdk.tool
    def add(a, b=1):
        return a + b

    @sdk.tool(name="fails")
    def boom():
        raise KeyError("nope")

    assert add(2, b=3) == 5 and add.__name__ == "add"
    with pytest.raises(KeyError, match="nope"):
        boom()
    out = sdk.shell("echo hi; echo err >&2; pwd; exit 3", timeout=30, cwd=str(tmp_path))
    assert (out.stdout, out.stderr, out.exit_code, out.timed_out) == (f"hi\n{tmp_path}\n", "err\n", 3, False)
    slow = sdk.shell("echo started; sleep 5", timeout=0.5)
    assert slow.timed_out and slow.exit_code is None
    assert isinstance(sdk.now(), datetime) and abs((sdk.now() - datetime.now()).total_seconds()) < 60
    with pytest.raises(ValueError, match="timeout"):
        sdk.shell("true", timeout=-1)
    assert not sdk.recording()


# ---------------------------------------------------------------------------- a server
@pytest.fixture()
def unloaded(tmp_path):
    """A `tttr serve --db` whose model never loads: the SDK routes do not need it."""
    from tttr.engine.serve.modes import Live
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.engine.serve.service import Service

    db = tmp_path / "sdk.db"
    service = Service()
    recorder = CallRecorder(db, service)
    running = Running(create_app(Live(service), recorder), lifespan="off")
    running.db, running.recorder = db, recorder
    yield running
    running.stop()
    recorder.close()


def _post(url: str, data: bytes, headers: dict | None = None, method: str = "POST") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _events(db, run_name: str):
    from tttr.sessions.store import Store

    with Store.open(db, readonly=True) as store:
        run = next(r for r in store.runs() if r.task == run_name)
        return run, list(store.events(run.id))


def test_sdk_events_are_recorded_into_the_named_run(unloaded, monkeypatch, tmp_path, capsys):
    from tttr.app.cli import main

    monkeypatch.setenv(sdk.URL_ENV, unloaded.url + "/v1")
    monkeypatch.setenv(sdk.RUN_ENV, "my-program")

    @sdk.tool
    def lookup(city, *, units="C"):
        return {"city": city, "temp": 21, "units": units}

    @sdk.tool
    def broken(path):
        raise FileNotFoundError(path)

    assert lookup("Paris", units="F") == {"city": "Paris", "temp": 21, "units": "F"}
    with pytest.raises(FileNotFoundError):
        broken("/nowhere")
    out = sdk.shell("echo recorded; exit 2", timeout=30, cwd=str(tmp_path))
    assert (out.stdout, out.exit_code) == ("recorded\n", 2)
    t = sdk.now()
    assert isinstance(t, datetime) and abs((t - datetime.now()).total_seconds()) < 60
    unloaded.recorder.flush()
    assert unloaded.recorder.steps("my-program") == 4 and unloaded.recorder.steps("another") == 0

    run, events = _events(unloaded.db, "my-program")
    assert [(e.site, e.layer, e.problem) for e in events] == [
        ("0:tool", "trace", None), ("1:tool", "trace", None), ("2:tool", "trace", None), ("3:clock", "trace", None)]
    call, failed, command, clock = (e.value for e in events)
    assert call["function"].endswith("lookup") and call["args"] == ["Paris"] and call["kwargs"] == {"units": "F"}
    assert call["result"] == {"city": "Paris", "temp": 21, "units": "F"} and call["source"] == "sdk"
    assert failed["error"] == {"type": "FileNotFoundError", "message": "/nowhere"} and "result" not in failed
    assert (command["cmd"], command["stdout"], command["exit_code"], command["cwd"]) == (
        "echo recorded; exit 2", "recorded\n", 2, str(tmp_path))
    assert datetime.fromisoformat(clock["t"]).astimezone().replace(tzinfo=None) == t

    capsys.readouterr()
    assert main(["events", str(unloaded.db), str(run.id)]) == 0
    shown = capsys.readouterr().out
    assert "0:tool" in shown and "3:clock" in shown


def test_malformed_sdk_posts_get_openai_shaped_400s(unloaded):
    tool, clock = unloaded.url + "/tttr/v1/tool", unloaded.url + "/tttr/v1/clock"
    run = {"X-TTTR-Run": "bad-posts"}
    cases = [
        (tool, b"{not json", run, "invalid_json"),
        (tool, b"[1, 2]", run, "invalid_value"),
        (tool, json.dumps({"args": []}).encode(), run, "invalid_value"),
        (tool, json.dumps({"function": "f", "cmd": "ls"}).encode(), run, "invalid_value"),
        (tool, json.dumps({"function": "", "result": 1}).encode(), run, "invalid_value"),
        (tool, json.dumps({"function": "f", "args": {"a": 1}, "result": 1}).encode(), run, "invalid_value"),
        (tool, json.dumps({"function": "f", "result": 1, "error": {"type": "E", "message": ""}}).encode(), run,
         "invalid_value"),
        (tool, json.dumps({"function": "f", "error": "boom"}).encode(), run, "invalid_value"),
        (tool, json.dumps({"cmd": "ls", "exit_code": "0", "stdout": ""}).encode(), run, "invalid_value"),
        (tool, json.dumps({"cmd": "ls", "stdout": "x"}).encode(), run, "invalid_value"),
        (tool, json.dumps({"cmd": "ls", "exit_code": None}).encode(), run, "invalid_value"),
        (tool, json.dumps({"function": "f", "result": 1, "duration_ms": -1}).encode(), run, "invalid_value"),
        (tool, json.dumps({"function": "f", "result": 1}).encode(), {}, "missing_run"),
        (tool, json.dumps({"function": "f", "result": 1}).encode(), {"X-TTTR-Run": " "}, None),
        (clock, b"null", run, "invalid_value"),
    ]
    for url, data, headers, code in cases:
        status, got = _post(url, data, headers)
        assert status == 400, (data, got)
        assert set(got["error"]) == {"message", "type", "param", "code"} and got["error"]["code"] == code, (data, got)
    status, got = _post(clock, None, run, method="GET")
    assert status == 405 and "error" in got
    unloaded.recorder.flush()
    from tttr.sessions.store import Store

    with Store.open(unloaded.db, readonly=True) as store:
        assert not list(store.runs())  # nothing refused was recorded
    status, got = _post(tool, json.dumps({"function": "f", "result": [1]}).encode(), run)
    assert status == 200 and got == {"recorded": False, "run": "bad-posts", "stored": True}


def test_a_replaying_server_answers_tool_calls_and_clock_reads_from_the_recording(unloaded, monkeypatch):
    """The replay hook: a query (a post without the outcome) answered from a recording means
    the tool never runs; an unanswered query means run it live and post the outcome."""
    from tttr.engine.serve.modes import FromRecording
    from tttr.engine.serve.server import create_app

    asked = []

    def answer(name, kind, value):
        asked.append((name, kind, value))
        if kind == "clock":
            return {"t": "2030-01-02T03:04:05+00:00"}
        if value.get("function", "").endswith("pinned"):
            return {"result": [1, 2, 3]}
        if value.get("cmd") == "date":
            return {"stdout": "recorded\n", "stderr": "", "exit_code": 0}
        return None

    replaying = Running(create_app(FromRecording(None, answer, {"id": "tttr"}), unloaded.recorder), lifespan="off")
    monkeypatch.setenv(sdk.URL_ENV, replaying.url)
    monkeypatch.setenv(sdk.RUN_ENV, "replayed")
    monkeypatch.setenv(sdk.REPLAY_ENV, "1")
    ran = []

    @sdk.tool
    def pinned(x):
        ran.append(x)
        return "live"

    @sdk.tool
    def live(x):
        ran.append(x)
        return x * 2

    assert pinned(5) == [1, 2, 3] and live(4) == 8 and ran == [4]
    assert sdk.shell("date").stdout == "recorded\n"
    assert sdk.now() == datetime.fromisoformat("2030-01-02T03:04:05+00:00").astimezone().replace(tzinfo=None)
    assert [k for _, k, _ in asked] == ["tool", "tool", "tool", "clock"] and asked[1][2]["args"] == [4]
    unloaded.recorder.flush()
    _, events = _events(unloaded.db, "replayed")
    assert [(e.site, e.value.get("result")) for e in events] == [("0:tool", 8)]  # only the live call
    replaying.stop()


def test_an_unreachable_recorder_is_said_once_and_the_program_goes_on(monkeypatch, capsys):
    monkeypatch.setenv(sdk.URL_ENV, f"http://127.0.0.1:{free_port()}")

    @sdk.tool
    def double(x):
        return 2 * x

    assert double(21) == 42
    assert isinstance(sdk.now(), datetime)
    err = capsys.readouterr().err
    assert "tttr sdk: the recorder at" in err and "unreachable" in err


def test_posts_share_one_kept_alive_connection_and_a_refusal_is_said(unloaded, monkeypatch, capsys):
    """A program's posts go over one connection (a connect each, through the sandbox's relay,
    cost more than the post); a post the server refuses is said in one line, as before."""
    monkeypatch.setenv(sdk.URL_ENV, unloaded.url)
    monkeypatch.setenv(sdk.RUN_ENV, "kept")
    sdk.now()
    conn = sdk._conns.held[1]
    sock = conn.sock
    for _ in range(3):
        sdk.now()
    assert sock is not None and conn.sock is sock and sdk._conns.held[1] is conn
    assert sdk._post(sdk.TOOL_ROUTE, {"function": "f", "result": 1, "error": {"type": "E", "message": "m"}}) is None
    err = capsys.readouterr().err
    assert "refused the event" in err and "not both" in err and len(err.strip().splitlines()) == 1, err
    unloaded.recorder.flush()
    assert unloaded.recorder.steps("kept") == 4  # the four clock reads, each once


def test_a_kept_connection_the_server_closed_is_opened_again_and_the_post_sent_once(monkeypatch):
    """A server that closes each connection after one answer (as one does with a connection
    left idle past its keep-alive): the next post fails on the old connection before the
    server reads it, and goes once over a new one."""
    import socket
    import threading

    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(4)
    requests: list[bytes] = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = lsn.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                size = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                if line.lower().startswith(b"content-length")))
                while len(body) < size:
                    body += conn.recv(65536)
                requests.append(body)
                answer = json.dumps({"t": f"2026-03-02T10:00:0{len(requests)}+00:00"}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer))

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    monkeypatch.setenv(sdk.URL_ENV, f"http://127.0.0.1:{lsn.getsockname()[1]}")
    try:
        first = sdk.now()
        second = sdk.now()
    finally:
        server.join(timeout=30)
        lsn.close()
    local = [datetime.fromisoformat(f"2026-03-02T10:00:0{i}+00:00").astimezone().replace(tzinfo=None) for i in (1, 2)]
    assert [first, second] == local  # both answered by the server
    assert requests == [b"{}", b"{}"]  # each post reached the server once


# ---------------------------------------------------------------------------- with the model
@pytest.mark.slow
def test_model_calls_and_sdk_events_share_one_run(tmp_path, monkeypatch, capsys):
    import openai

    from tttr.app.cli import main
    from tttr.engine.serve.modes import Live
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.engine.serve.service import Service

    db = tmp_path / "program.db"
    service = Service(kernel_mode="invariant")
    recorder = CallRecorder(db, service)
    running = Running(create_app(Live(service), recorder))
    try:
        assert service.wait_ready(300), service.load_error
        monkeypatch.setenv(sdk.URL_ENV, running.url)
        monkeypatch.setenv(sdk.RUN_ENV, "agent-1")
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="tttr", max_retries=0,
                               default_headers={"X-TTTR-Run": "agent-1"})

        @sdk.tool
        def weather(city):
            return f"sunny in {city}"

        def ask(content):
            return client.chat.completions.create(model=service.model_id, max_tokens=3, seed=5, temperature=0.7,
                                                  messages=[{"role": "user", "content": content}])

        ask("Pick a city.")
        observation = weather("Paris")
        ask(f"Today it is {sdk.now():%Y-%m-%d} and {observation}. Say ok.")
    finally:
        running.stop()  # the lifespan's shutdown closes the recorder: the named run is finished
    run, events = _events(db, "agent-1")
    kinds = [(e.step, e.kind) for e in events if e.kind not in ("token", "logits")]
    assert kinds == [(0, "prompt"), (0, "message"), (1, "tool"), (2, "clock"), (3, "prompt"), (3, "message")]
    assert run.status == "complete" and run.outcome == {"calls": 2, "sdk_events": 2}
    assert events[-1].value["text"] is not None and next(e for e in events if e.kind == "tool").value["result"] == \
        "sunny in Paris"
    capsys.readouterr()
    assert main(["events", str(db), str(run.id), "--kind", "tool"]) == 0
    assert "1:tool" in capsys.readouterr().out
