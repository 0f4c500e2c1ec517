"""A run's steps as `tttr diff` and the app's compare screen align them, one list per kind
of step: the built-in agent's actions (`action_steps`), or the steps of a run of model calls
(`program_steps`: a recorded program's, served calls', an imported trace's). Each run kind
(engine/kinds.py) says which describes its runs; this module knows no kinds of run.

A low module (nothing above sessions/), so that the kinds, the replays and the diff can all
import it without a cycle.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple

ACTION_STEP_KINDS = ("action",)
PROGRAM_STEP_KINDS = ("message", "tool", "clock")


class Step(NamedTuple):
    """One step of a run as it is aligned against another run's."""

    step: int
    kind: str  # the event kind it is: "action", or one of PROGRAM_STEP_KINDS
    key: str  # what is aligned: the same key, the same step
    event: Any  # the event (its value, for whoever shows the step)


def action_text(value: dict) -> str:
    return "done" if value.get("done") else str(value.get("cmd", ""))


def action_steps(events: list) -> list[Step]:
    """The built-in agent's steps: one per action, in the order recorded."""
    return [Step(e.step, e.kind, action_text(e.value if isinstance(e.value, dict) else {}), e)
            for e in events if e.kind == "action"]


def program_steps(events: list) -> list[Step]:
    """The steps of a run of recorded API calls (a recorded program's), in the order they
    were recorded: a call's message, an SDK tool's call with its result, a clock read, the
    program's end. `tttr diff` and the compare screen align these (one row per step), so a
    fork at an SDK tool's result or a clock read differs on its own row."""
    picked = sorted((e for e in events if e.kind in PROGRAM_STEP_KINDS and e.step >= 0 and not _call_clock(e)),
                    key=lambda e: e.seq)
    return [Step(e.step, e.kind, _program_key(e.kind, e.value if isinstance(e.value, dict) else {}), e)
            for e in picked]


def _call_clock(e) -> bool:
    """A recorded program's own clock read before a model call (part of the call's step, not a
    row of its own: compared site by site, `S:clock`)."""
    return e.kind == "clock" and isinstance(e.value, dict) and e.value.get("source") == "program"


def _program_key(kind: str, v: dict) -> str:
    def text(x) -> str:
        return json.dumps(x, ensure_ascii=False, sort_keys=True, default=str)

    if kind == "message":
        calls = v.get("tool_calls")
        return str(v.get("text") or "") + (f" → tool calls {text(calls)}" if calls else "")
    if kind == "clock":
        return f"clock {v.get('t', '')}"
    if "function" in v:  # an @sdk.tool call
        args = [text(a) for a in v.get("args") or []]
        kwargs = v.get("kwargs") if isinstance(v.get("kwargs"), dict) else {}
        args += [f"{k}={text(a)}" for k, a in kwargs.items()]
        end = f" ✗ {text(v['error'])}" if v.get("error") is not None else f" → {text(v.get('result'))}"
        return f"{v['function']}({', '.join(args)}){end}"
    if isinstance(v.get("program"), list):  # the program's own end, with its output: a fork that prints otherwise differs here
        return f"end: {' '.join(str(a) for a in v['program'])} (exit {v.get('exit_code')}){_output(v.get('stdout'))}"
    return f"$ {v.get('cmd', '')} (exit {v.get('exit_code')})"  # sdk.shell


def _output(stdout) -> str:
    """The program's stdout in a few words: its last line (inline text), or its size and
    content hash (a blob), so that two different outputs never read the same."""
    if isinstance(stdout, dict) and isinstance(stdout.get("$blob"), str):
        return f" · stdout {stdout.get('size')} bytes #{stdout['$blob'][:12]}"
    if not isinstance(stdout, str) or not stdout.strip():
        return ""
    lines = stdout.rstrip("\n").split("\n")
    last = lines[-1] if len(lines[-1]) <= 60 else lines[-1][:59] + "…"
    more = f" ({len(lines)} lines, {hashlib.blake2b(stdout.encode('utf-8', 'surrogateescape'), digest_size=6).hexdigest()})" \
        if len(lines) > 1 or last != lines[-1] else ""
    return f" · stdout {json.dumps(last, ensure_ascii=False)}{more}"
