"""TTTR's SDK for a user's agent program: the values it gets from outside the model.

    from tttr.recorders import sdk

    @sdk.tool
    def read_file(path: str) -> str: ...

    out = sdk.shell("ls -la", timeout=30)   # .stdout .stderr .exit_code
    today = sdk.now()                        # a datetime, like datetime.now()

**Outside a recording** (`TTTR_RECORDER_URL` unset) every call just does its work: the
decorated function runs, `shell` runs `bash -c CMD` with the timeout, `now` is
`datetime.now()`. Nothing is sent anywhere, so the program runs unchanged without TTTR.

**Inside a recording** the runner (`tttr record -- PROGRAM`, or a person by hand) sets:

| variable | meaning |
|---|---|
| `TTTR_RECORDER_URL` | the `tttr serve --db` base URL, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is fine) |
| `TTTR_RUN` | the run name; sent as `X-TTTR-Run`, the header the program's model calls carry, so both land in one run (default `sdk`) |
| `TTTR_REPLAY` | `1` when replaying: ask the server before running (see below) |

and the SDK posts each value to the server, which records it as a trace-layer event of that
run at the next step (`S:tool`, `S:clock`; see docs/serve.md, "The SDK's routes"):

- `@sdk.tool`: the function runs here; then `POST /tttr/v1/tool` with `function`
  (its qualified name), `args`, `kwargs`, and `result` or `error` (`{"type", "message"}`, the
  exception is re-raised), `duration_ms`. Values that are not JSON are sent as their `repr`
  (and `lossy: true`).
- `sdk.shell`: first posted without its outcome (`cmd`, `cwd`, `timeout_s`: the server notes
  the program's tree before it), then the command runs **here, in the program's process**
  (not in the server's sandbox: under `tttr record` the program is itself in the sandbox;
  `bash -c CMD` in a process group of its own, all of it killed at the timeout), then is
  posted with `stdout`, `stderr`, `exit_code` (null and `limit_hit: "timeout"` when it timed
  out), `duration_ms`. An output past `MAX_OUTPUT` (1 MiB) keeps its first MiB, for the
  program as for the recording (`truncated: true`, `stdout_size`, `stderr_size`: the whole sizes).
- `sdk.now()`: `POST /tttr/v1/clock`; the server reads the run's clock and records it,
  and the answer's `t` (ISO 8601 with offset) is returned as a naive local datetime, as
  `datetime.now()` returns.

Replay (`TTTR_REPLAY=1`): a tool call is first posted without its outcome (a *query*); an
answer `{"recorded": true, "result": …}` (or `error`, or a shell's output) is returned without
running anything (the server puts back what the recorded call did to the files); `{"recorded":
false}` means run it live, then post the outcome as above.

If the server cannot be reached or refuses a post, the SDK says so on stderr in one line
and the program goes on with the value it computed (the recording lacks that event).

This module imports only the standard library, and the slow parts of it (HTTP, subprocess)
only when first used: a program pays a few milliseconds to import it. Its posts go over one
kept-alive connection per thread.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from datetime import datetime

__all__ = ["tool", "shell", "now", "ShellResult", "RecordedError", "recording"]

URL_ENV = "TTTR_RECORDER_URL"
RUN_ENV = "TTTR_RUN"
REPLAY_ENV = "TTTR_REPLAY"
RUN_HEADER = "X-TTTR-Run"
DEFAULT_RUN = "sdk"
TOOL_ROUTE = "/tttr/v1/tool"
CLOCK_ROUTE = "/tttr/v1/clock"
HTTP_TIMEOUT = 60.0  # seconds for one post; the server only records (or reads its clock)
# Bytes of a recorded command's stdout (and of its stderr) that are kept: the program gets
# these, in the recording and in its replays alike, with `truncated` set (outside a
# recording nothing is cut). Escaped as JSON the two stay under the server's 16 MiB body.
MAX_OUTPUT = 1 << 20


class ShellResult:
    """What `shell` returns: `stdout`, `stderr` (text), `exit_code` (None if it timed out);
    `truncated`: inside a recording, an output past `MAX_OUTPUT` bytes was cut there."""

    __slots__ = ("cmd", "stdout", "stderr", "exit_code", "timed_out", "truncated")

    def __init__(self, cmd: str, stdout: str, stderr: str, exit_code: int | None, timed_out: bool = False,
                 truncated: bool = False):
        self.cmd, self.stdout, self.stderr, self.exit_code, self.timed_out = cmd, stdout, stderr, exit_code, timed_out
        self.truncated = truncated

    def __repr__(self) -> str:
        return (f"ShellResult(cmd={self.cmd!r}, exit_code={self.exit_code!r}, timed_out={self.timed_out}, "
                f"stdout={self.stdout[:60]!r}, stderr={self.stderr[:60]!r})")


class RecordedError(Exception):
    """A tool's exception answered from a recording: its type's name and message (the
    original class is not rebuilt from a recording)."""

    def __init__(self, type_name: str, message: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message = type_name, message


# ---------------------------------------------------------------------------- the recorder
def recording() -> bool:
    """Whether SDK calls are recorded (the runner set `TTTR_RECORDER_URL`)."""
    return bool(os.environ.get(URL_ENV))


def _base_url() -> str:
    url = os.environ[URL_ENV].strip().rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _post(route: str, body: dict) -> dict | None:
    """POST to the recorder; the answer, or None (said on stderr) if it failed."""
    import http.client

    url = _base_url() + route
    data = json.dumps(body, ensure_ascii=False).encode()  # UTF-8: a command's output stays its size
    headers = {"Content-Type": "application/json", RUN_HEADER: os.environ.get(RUN_ENV) or DEFAULT_RUN}
    try:
        status, answer = _send(url, data, headers)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        _warn(f"the recorder at {url} is unreachable ({exc}); the event is not recorded")
        return None
    try:
        parsed = json.loads(answer)
    except ValueError:
        parsed = None
    if status >= 400:
        try:
            why = parsed["error"]["message"]
        except Exception:  # noqa: BLE001 - not an OpenAI error body
            why = f"HTTP {status}"
        _warn(f"the recorder at {url} refused the event ({why}); it is not recorded")
        return None
    if parsed is None:
        _warn(f"the recorder at {url} answered {answer[:80]!r}, not JSON; the event is not recorded")
    return parsed


# One kept-alive connection to the recorder per thread (and per process: a forked child opens
# its own). A new connection per post costs a connect, and in the sandbox a relay's start,
# for each of a program's events.
_conns = None  # a threading.local, made on the first post


def _connection(url: str, fresh: bool):
    import http.client
    import threading
    import urllib.parse

    global _conns
    if _conns is None:
        _conns = threading.local()
    parts = urllib.parse.urlsplit(url)
    key = (os.getpid(), parts.scheme, parts.netloc)
    held = getattr(_conns, "held", None)
    if held is not None and (fresh or held[0] != key):
        held[1].close()
        held = None
    if held is None:
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        held = (key, kind(parts.hostname, parts.port, timeout=HTTP_TIMEOUT))
        _conns.held = held
    return held[1], parts.path + (f"?{parts.query}" if parts.query else "")


def _send(url: str, data: bytes, headers: dict) -> tuple[int, bytes]:
    """The post's status and body, on this thread's kept-alive connection. A kept connection
    that the server closed while it sat idle fails before the server reads anything: the post
    then goes once more, on a new one."""
    import http.client

    conn, path = _connection(url, fresh=False)
    reused = conn.sock is not None
    try:
        return _exchange(conn, path, data, headers)
    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
        if not reused:
            raise
    conn, path = _connection(url, fresh=True)
    return _exchange(conn, path, data, headers)


def _exchange(conn, path: str, data: bytes, headers: dict) -> tuple[int, bytes]:
    try:
        conn.request("POST", path, body=data, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    except BaseException:
        conn.close()  # in an unknown state: the next post opens a new one
        raise


def _warn(text: str) -> None:
    print(f"tttr sdk: {text}", file=sys.stderr, flush=True)


def _replaying() -> bool:
    return os.environ.get(REPLAY_ENV, "") not in ("", "0")


def _jsonable(value, lossy: list[bool]):
    """`value` as JSON; what JSON cannot hold becomes its repr (and `lossy[0]` is set)."""
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        pass
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, lossy) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v, lossy) for k, v in value.items()}
    lossy[0] = True
    return repr(value)


# ---------------------------------------------------------------------------- tools
def tool(fn=None, *, name: str | None = None):
    """Decorator: record each call's arguments and result (or exception) as a tool event.
    `@sdk.tool` or `@sdk.tool(name="search")`."""
    if fn is None:
        return lambda f: tool(f, name=name)
    tool_name = name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "tool")

    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        if not recording():
            return fn(*args, **kwargs)
        lossy = [False]
        call = {"function": tool_name, "args": _jsonable(list(args), lossy), "kwargs": _jsonable(kwargs, lossy)}
        if _replaying():
            answer = _post(TOOL_ROUTE, call)
            if answer and answer.get("recorded"):
                if answer.get("error"):
                    err = answer["error"]
                    if not isinstance(err, dict):  # text, as a fork before one grammar could store it
                        err = {"message": err}
                    raise RecordedError(str(err.get("type", "Exception")), str(err.get("message", "")))
                return answer.get("result")
        t0 = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            call["error"] = {"type": type(exc).__name__, "message": str(exc)}
            _finish(call, t0, lossy)
            raise
        call["result"] = _jsonable(result, lossy)
        _finish(call, t0, lossy)
        return result

    return recorded


def _finish(call: dict, t0: float, lossy: list[bool]) -> None:
    call["duration_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    if lossy[0]:
        call["lossy"] = True
    _post(TOOL_ROUTE, call)


def shell(cmd: str, timeout: float | None = 60, *, cwd: str | None = None) -> ShellResult:
    """Run `bash -c CMD` (in `cwd`, default the current directory) with a timeout in
    seconds (None: no limit); recorded as a tool call inside a recording."""
    if not isinstance(cmd, str) or not cmd.strip():
        raise ValueError(f"sdk.shell needs a command line (text), not {cmd!r}")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"sdk.shell timeout must be a number of seconds > 0 or None, not {timeout!r}")
    where = os.path.abspath(cwd or os.getcwd())
    if not recording():
        return _run(cmd, timeout, where)[0]
    call = {"cmd": cmd, "cwd": where, "timeout_s": timeout}
    answer = _post(TOOL_ROUTE, call)  # asked first, recording too: the server notes the tree before it
    if _replaying():
        if answer and answer.get("recorded"):
            return ShellResult(cmd, answer.get("stdout") or "", answer.get("stderr") or "", answer.get("exit_code"),
                               answer.get("limit_hit") == "timeout", answer.get("truncated") is True)
    result, duration_ms, sizes = _run(cmd, timeout, where, cap=MAX_OUTPUT)
    call.update(stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code, duration_ms=duration_ms)
    if result.timed_out:
        call["limit_hit"] = "timeout"
    if result.truncated:
        call.update(truncated=True, stdout_size=sizes[0], stderr_size=sizes[1])
    _post(TOOL_ROUTE, call)
    return result


def _run(cmd: str, timeout: float | None, cwd: str, cap: int | None = None
         ) -> tuple[ShellResult, float, tuple[int, int]]:
    """`bash -c CMD` in a process group of its own: at the timeout the whole group is killed
    (a `sleep` it started, a server it left in the background), not only bash. With `cap`,
    each output keeps its first `cap` bytes. The result, milliseconds, the outputs' whole sizes."""
    import signal
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code, timed_out = proc.returncode, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:  # already gone
            pass
        out, err = proc.communicate()
        code, timed_out = None, True
    except BaseException:  # Ctrl-C in the program: the command goes with it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        raise
    out, err = out or b"", err or b""
    sizes = (len(out), len(err))
    cut = cap is not None and (len(out) > cap or len(err) > cap)
    if cut:
        out, err = out[:cap], err[:cap]
    ms = round((time.perf_counter() - t0) * 1000, 3)
    return ShellResult(cmd, _text(out), _text(err), code, timed_out, cut), ms, sizes


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace")


# ---------------------------------------------------------------------------- the clock
def now() -> datetime:
    """The run's clock (a naive local datetime, as `datetime.now()`), recorded as a clock read."""
    if not recording():
        return datetime.now()
    answer = _post(CLOCK_ROUTE, {})
    try:
        return datetime.fromisoformat(answer["t"]).astimezone().replace(tzinfo=None)
    except (TypeError, KeyError, ValueError):
        if answer is not None:
            _warn(f"the recorder's clock answer {str(answer)[:80]!r} has no ISO 't'; using the local clock")
        return datetime.now()
