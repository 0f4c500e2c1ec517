"""The SDK's posts to `tttr serve` (`tttr.recorders.sdk`): checked and turned into the
trace-layer values the recorder writes.

`POST /tttr/v1/tool` carries either a function call (`function`, `args`, `kwargs`, then
`result` or `error`) or a command (`cmd`, `cwd`, `timeout_s`, then `stdout`, `stderr`,
`exit_code`, `limit_hit`, and `truncated`, `stdout_size`, `stderr_size` for an output the SDK
cut), with `duration_ms`. A post without its outcome is a *query*: the
SDK asks, before running, whether the call is answered from a recording (replay); it records
nothing. `POST /tttr/v1/clock` takes an empty object. Unknown fields are ignored, as on the
OpenAI routes; every value is also checked against the store's rule for its kind."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from tttr.engine.serve.errors import APIError
from tttr.sessions.values import check

MAX_NAME = 200  # characters of a tool's name


@dataclass(frozen=True, slots=True)
class ToolPost:
    """A checked tool post: `value` is what is recorded (or, for a query, what is asked)."""

    value: dict
    query: bool  # no outcome yet: "is this answered from the recording?"


def _need(cond: bool, message: str, param: str) -> None:
    if not cond:
        raise APIError(message, param=param, code="invalid_value")


def _number(v) -> bool:
    return type(v) in (int, float) and v >= 0


def parse_tool(body) -> ToolPost:
    _need(type(body) is dict, f"a tool post is a JSON object, not {type(body).__name__}", None)
    has_fn, has_cmd = "function" in body, "cmd" in body
    _need(has_fn != has_cmd, "a tool post names either 'function' (a decorated function's call) or 'cmd' "
          "(a shell command), exactly one", "function")
    value = _function(body) if has_fn else _command(body)
    query = not any(k in value for k in ("result", "error", "exit_code"))
    if "duration_ms" in body:
        _need(_number(body["duration_ms"]), f"'duration_ms' must be a number >= 0, not {body['duration_ms']!r}",
              "duration_ms")
        value["duration_ms"] = body["duration_ms"]
    if body.get("lossy") is True:
        value["lossy"] = True
    wrong = check("tool", value)
    _need(wrong is None, f"the tool post does not fit a tool event: {wrong}", None)
    return ToolPost(value, query)


def _function(body: dict) -> dict:
    name = body["function"]
    _need(type(name) is str and 0 < len(name.strip()) <= MAX_NAME,
          f"'function' must be the tool's name (1..{MAX_NAME} characters), not {str(name)[:60]!r}", "function")
    args, kwargs = body.get("args", []), body.get("kwargs", {})
    _need(type(args) is list, f"'args' must be a list (the positional arguments), not {type(args).__name__}", "args")
    _need(type(kwargs) is dict, f"'kwargs' must be an object (the keyword arguments), not {type(kwargs).__name__}",
          "kwargs")
    value = {"function": name, "args": args, "kwargs": kwargs}
    if "result" in body and "error" in body:
        raise APIError("a tool call has a 'result' or an 'error', not both", param="error", code="invalid_value")
    if "result" in body:
        value["result"] = body["result"]
    elif "error" in body:
        err = body["error"]
        _need(type(err) is dict and type(err.get("type")) is str and type(err.get("message")) is str,
              "'error' must be {\"type\": TEXT, \"message\": TEXT} (the exception's class name and message)", "error")
        value["error"] = {"type": err["type"], "message": err["message"]}
    return value


def _command(body: dict) -> dict:
    cmd = body["cmd"]
    _need(type(cmd) is str and cmd.strip() != "", f"'cmd' must be a command line (text), not {str(cmd)[:60]!r}", "cmd")
    value = {"cmd": cmd}
    for key in ("cwd", "stdout", "stderr", "limit_hit"):
        if body.get(key) is not None:
            _need(type(body[key]) is str, f"{key!r} must be text, not {type(body[key]).__name__}", key)
            value[key] = body[key]
    for key in ("stdout_size", "stderr_size"):  # an output the SDK cut (`truncated`): its whole size
        if body.get(key) is not None:
            _need(type(body[key]) is int and body[key] >= 0, f"{key!r} must be a byte count >= 0, not {body[key]!r}", key)
            value[key] = body[key]
    if body.get("truncated") is True:
        value["truncated"] = True
    timeout = body.get("timeout_s")
    if timeout is not None:
        _need(_number(timeout) and timeout > 0, f"'timeout_s' must be seconds > 0 or null, not {timeout!r}", "timeout_s")
        value["timeout_s"] = timeout
    if "exit_code" in body:
        code = body["exit_code"]
        _need(code is None or type(code) is int, f"'exit_code' must be an integer (or null after a timeout), "
              f"not {code!r}", "exit_code")
        _need(code is not None or "limit_hit" in value, "'exit_code' is null only with 'limit_hit' (e.g. \"timeout\")",
              "exit_code")
        value["exit_code"] = code
        value.setdefault("stdout", "")
        value.setdefault("stderr", "")
    else:
        _need("stdout" not in value and "stderr" not in value,
              "a command's outcome needs 'exit_code' along with 'stdout' and 'stderr'", "exit_code")
    return value


def parse_clock(body) -> None:
    _need(type(body) is dict, f"a clock post is a JSON object ({{}}), not {type(body).__name__}", None)


class ProgramClock:
    """What a program's SDK clock reads get: its virtual clock, `start` until `begin()` (called
    as the program starts), then running from `start` in whole seconds, as the sandbox's
    faketime clock runs from it in each process."""

    def __init__(self, start: datetime):
        self.start = start
        self._began: float | None = None

    def begin(self) -> ProgramClock:
        self._began = time.monotonic()
        return self

    def __call__(self) -> datetime:
        elapsed = int(time.monotonic() - self._began) if self._began is not None else 0
        return (self.start + timedelta(seconds=elapsed)).replace(tzinfo=timezone.utc)
