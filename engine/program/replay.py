"""`tttr replay RUN` of a recorded program (task `program:NAME`, see engine/program/record.py).

The recorded command line runs again in the sandbox, on a tree restored from the recorded
start snapshot (setup:setup), with the recorded clock and seed, against an in-process server in
replay mode: the program's requests are met, in order, by the recorded steps.

- A model call whose request (its messages, then each other parameter) equals the recorded
  one is answered with the recorded message: no model is loaded, nothing is computed.
- An SDK tool query that names the recorded function (or command) with the same arguments
  gets the recorded result: the SDK returns it without running the tool. A clock read gets
  the recorded value.
- Each answered step's recorded events are written as the same step of the replay, a child
  run of the recording with its own events.

The first request that differs (another kind of step, another message, argument or
parameter, or a step the recording lacks) is the divergence, reported with the call's
index and both values (a call through OpenAI's Responses API in its own terms, `instructions`
or `input[i]`: engine/program/divergence.py). From there on SDK tools run live, the clock is live, and model calls
are generated live by the recorded model (engine/program/live.py; loaded then, not before), so
the program runs on as it would have. At the end the program's stdout, exit code and end tree are compared
with the recorded ones (an SDK tool answered from the recording has its recorded effects on the
files put back by the server: engine/serve/sdk_tree.py). The trees are compared by content:
paths, kinds, modes and bytes, not times (the start tree is restored, and the program's own
file comes with its time on disk now), and without the program's own file, as the SDK tools'
cassettes leave it out.

The program's own clock (the shim's realtime reads, recorders/logicalclock.py's ClockShare) is
compared call by call with each call's recorded `S:clock`: a read that differs before a request
that differs is named as the divergence (the first cause); one whose request still matches is
reported at the end. Before each recorded step the offset its reads were recorded under (a fork's
`offset_s`) is written again, so a replay of a fork reads what the fork read.

The program and its files come from the recorded start snapshot, never from a host path a
database names. `--code DIR` lays the files of DIR (the user's program as it is today) over
that tree (and `-- PROGRAM ARG...` runs another command line): an edited program replays against
the old recording and diverges where it asks for something else. Sealed (`--sealed`), nothing runs
live after the divergence: the program gets an error for each later call in place of an answer
(`Replayer.sealed`). The divergence's `detail` says where for a machine (call, step, site, field path)."""

from __future__ import annotations

from tttr.recorders.logicalclock import ClockShare
from tttr.recorders.scratch import scratch_dir
from tttr.recorders.treeio import remove_tree
import os
import stat
import threading
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

from tttr.engine.program.record import ProgramRunError, _Endpoint
from tttr.engine.program.setup_values import exports
from tttr.engine.program.divergence import (
    RESPONSES_ROUTE, call_divergence, in_responses_terms, noting_responses, responses_body,
)
from tttr.engine.replay.events import stored_text
from tttr.engine.replay.divergence import Divergence, first_request_difference
from tttr.engine.replay.result import ReplayResult
from tttr.engine.serve.errors import APIError
from tttr.recorders.tasks import task_env
from tttr.engine.serve.sdk_tree import SDKTree, program_file
from tttr.recorders.program import (
    SOCKET_NAME, HostPython, ProgramError, api_dir, check_program, endpoint_env, sandboxed_command,
)
from tttr.sessions.records import RECORDED_BY as RUN_RECORDERS
from tttr.sessions.vocabulary import SETUP_STEP, site, site_parts

RECORDED_BY = RUN_RECORDERS["program"]
DEFAULT_TIMEOUT_S = 600.0
NAMES = ("recorded", "live")


def is_program_run(run) -> bool:
    return run.meta.kind == "program"


class _Event(NamedTuple):
    """An event of a step written anew (the live clock read in place of the recorded one)."""

    kind: str
    value: object
    site: str


@dataclass(slots=True)
class _Step:
    step: int
    kind: str  # "call" | "tool" | "clock"
    events: list  # the recorded events of the step


def recorded_steps(events, end: int | None = None) -> list[_Step]:
    """The program's steps below step `end` (all where None), in order, each with its events: a
    model call (it has `S:prompt`), an SDK tool (`S:tool`) or a clock read; others are passed over."""
    by_step: dict[int, list] = {}
    for e in events:
        if e.step >= 0 and (end is None or e.step < end):
            by_step.setdefault(e.step, []).append(e)
    steps = []
    for s in sorted(by_step):
        kinds = {e.kind for e in by_step[s]}
        kind = "call" if "prompt" in kinds else ("tool" if "tool" in kinds else ("clock" if "clock" in kinds else None))
        if kind is not None:
            steps.append(_Step(s, kind, by_step[s]))
    return steps


# ---------------------------------------------------------------------------- the recording
@dataclass(frozen=True, slots=True)
class Recording:
    """A recorded program run, decoded and checked once (`load_recording`): a replay's or a
    fork's plan holds it, and acting on it decodes nothing again (`on`)."""

    run: object
    setup: dict
    steps: list  # _Step, in order
    final: dict  # N:tool: the program's output, exit code, end tree
    outcome: dict | None
    setup_clock: dict | None = None  # setup:clock; None in a recording made before it was recorded
    source: object = None  # the engine.replay.source.Source it was decoded from: its events by site

    def on(self, store) -> Recording:
        """This recording read through `store` (the connection a plan acts on, opened for
        writing), not decoded again: refused in one line when the run was deleted or
        replaced since it was checked (Source.on)."""
        return replace(self, source=self.source.on(store)) if self.source is not None else self


def load_recording(store, run_id: int) -> Recording:
    """Program run `run_id` of `store`, decoded once (one Source) and checked; ProgramRunError
    (one line) when it is not a complete recorded program with its start tree, command line
    and end."""
    from tttr.engine.replay.source import Source

    source = Source(store, run_id)
    run, events = source.run, source.events
    if not is_program_run(run):
        raise ProgramRunError(f"run {run_id} is not a recorded program")
    if run.status != "complete":
        raise ProgramRunError(f"run {run_id} is {run.status}: only complete runs can be replayed")
    setup = next((e.value for e in events if e.step == -1 and e.kind == "setup"), None)
    if not isinstance(setup, dict) or not isinstance(setup.get("snapshot"), str) \
            or not isinstance(setup.get("program"), list) or not setup["program"] \
            or not all(isinstance(a, str) for a in setup["program"]):
        raise ProgramRunError(f"run {run_id} has no setup:setup with the start tree and the command line")
    final_step = next((e.step for e in events if e.kind == "tool" and isinstance(e.value, dict)
                       and "program" in e.value), None)
    if final_step is None:
        raise ProgramRunError(f"run {run_id} has no record of the program's end (N:tool)")
    steps = recorded_steps(events, final_step)
    final = next(e.value for e in events if e.step == final_step and e.kind == "tool")
    outcome = next((e.value for e in events if e.step == final_step and e.kind == "outcome"), None)
    setup_clock = next((e.value for e in events if e.step == SETUP_STEP and e.kind == "clock"), None)
    return Recording(run, setup, steps, final, outcome, setup_clock, source)


_Recording = Recording


def check_recording(store, run_id: int, *, sealed: bool = False, code: str | None = None,
                    argv: list[str] | None = None) -> Recording:
    """What a replay of program run `run_id` checks read-only before it writes: the
    recording (decoded once), its clock, a sealed replay's SDK events and `--code DIR`."""
    rec = load_recording(store, run_id)
    recorded_clock(rec)
    if sealed:
        check_sealable(rec)
    if code is not None:
        recorded_argv = [str(a) for a in rec.setup["program"]]
        check_code(code, list(argv) if argv else recorded_argv, recorded_argv)
    return rec


def request_field(a, b, path: str = ""):
    """(path, a's value, b's value) of the first place two requests differ, as deep as they
    go (`messages[1].content`, `max_tokens`); None when they are the same. The messages first,
    then the other keys in order, as `first_request_difference` reads them."""
    if a == b:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b), key=lambda k: (k != "messages", str(k)))
        for key in keys:
            if key not in a or key not in b:
                return f"{path}.{key}".lstrip("."), a.get(key), b.get(key)
            found = request_field(a[key], b[key], f"{path}.{key}".lstrip("."))
            if found is not None:
                return found
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            if i >= len(a) or i >= len(b):
                return f"{path}[{i}]", a[i] if i < len(a) else None, b[i] if i < len(b) else None
            found = request_field(a[i], b[i], f"{path}[{i}]")
            if found is not None:
                return found
    return path, a, b


def recorded_clock_read(step: _Step) -> dict | None:
    """A model call's recorded `S:clock` (the program's last realtime read before it), if any."""
    if step.kind != "call":
        return None
    value = next((e.value for e in step.events if e.kind == "clock"), None)
    return value if isinstance(value, dict) and isinstance(value.get("t"), str) else None


def recorded_clock(rec: Recording) -> datetime:
    """The virtual clock the program started at, checked before anything is written (a
    hostile or damaged database gets one line, not a run left incomplete)."""
    from tttr.recorders.clock import normalize_clock
    from tttr.recorders.errors import SandboxError

    value = rec.setup.get("clock") or rec.run.meta.clock
    try:
        return normalize_clock(datetime.fromisoformat(value).replace(tzinfo=None))
    except (TypeError, ValueError, SandboxError) as exc:
        raise ProgramRunError(f"run {rec.run.id} records no clock the sandbox can show ({value!r}: {exc}); "
                              "the database is damaged or was not written by tttr record") from None


def recorded_timeout(run) -> float:
    """The --timeout the program ran under when recorded (600 s, the default, in a recording
    made before it was kept)."""
    value = run.meta.timeout_s
    return value if value is not None and 0 < value < float("inf") else DEFAULT_TIMEOUT_S


def _text(store, value) -> str:
    if isinstance(value, dict) and "$blob" in value:
        return store.get_blob(value["$blob"]).decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else ""


# ---------------------------------------------------------------------------- the answers
def _response(endpoint: str, step: _Step, prompt: dict, model: str) -> dict:
    by_kind = {e.kind: e.value for e in step.events if site_parts(e.site)[2] is None}
    message = by_kind.get("message") if isinstance(by_kind.get("message"), dict) else {}
    text, finish, tool_calls = message.get("text") or "", message.get("finish_reason") or "stop", message.get("tool_calls")
    n_out = sum(1 for e in step.events if e.kind == "token")
    n_in = prompt.get("n_tokens") if type(prompt.get("n_tokens")) is int else 0
    usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
    rid = prompt.get("response_id") or f"replay-{step.step}"
    if endpoint == "chat":
        msg: dict = {"role": "assistant", "content": text if (text or not tool_calls) else None}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        choice = {"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}
        obj = "chat.completion"
    else:
        choice, obj = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}, "text_completion"
    tttr: dict = {"replayed_from_step": step.step}
    if "pieces" in message:  # a streamed call's text, streamed again in the pieces it was sent in (checked there)
        tttr["pieces"] = message["pieces"]
    if isinstance(message.get("stop_sequence"), str):  # the stop string that ended it (Anthropic's stop_sequence)
        tttr["stop_sequence"] = message["stop_sequence"]
    return {"id": rid, "object": obj, "created": 0, "model": model, "choices": [choice], "usage": usage,
            "tttr": tttr}


class Replayer:
    """Meets the program's requests with the recording's steps, in order."""

    def __init__(self, rec: Recording, recorder, name: str, model: str | None = None):
        from tttr.engine.program.live import LiveCalls

        self.rec, self.recorder, self.name = rec, recorder, name
        self.live = LiveCalls(model, recorder, rec.run.model_id)  # model calls after the divergence
        self.cursor = 0
        self.calls = 0  # model calls met so far (the call index)
        self.answered = 0
        self.divergence: Divergence | None = None
        # The program's clock (recorders.logicalclock.ClockShare), set by the runner: what it read
        # before each call, compared with the recorded S:clock, and the offset each read is moved by.
        self.clock = None
        self.clock_divergence: Divergence | None = None  # the first differing clock read
        # A recording made before programs' clock reads were recorded has none to compare with
        # (one whose program read no clock before any call has none either, and nor does its replay).
        self._clock_recorded = any(recorded_clock_read(s) is not None for s in rec.steps)
        self.request_divergence: Divergence | None = None  # the first differing request
        self.detail: dict | None = None  # the divergence's ReplayResult.detail
        self._clock_detail: dict | None = None
        # Sealed (`--sealed`): nothing runs live. After the divergence a model call gets an error
        # (no model loads, nothing is computed), an SDK tool an error in its place (it never runs).
        self.sealed = False
        self.tree = None  # the program's tree (engine/serve/sdk_tree.py's SDKTree), set by the runner
        self._lock = threading.Lock()

    def _diverge(self, where: str, a, b, detail: dict | None = None) -> None:
        self.divergence = Divergence(where, "trace", a, b, NAMES)
        self.detail = detail

    def _take(self, kind: str, asked, via: str = "") -> _Step | None:
        """The next recorded step if it is a `kind`, else the divergence (and None). `via`:
        the route a call came through, where it is not its endpoint's own."""
        if self.divergence is not None:
            return None
        what = {"call": f"call {self.calls}{via}", "tool": "an SDK tool call", "clock": "an SDK clock read"}[kind]
        call = self.calls if kind == "call" else None
        if self.cursor >= len(self.rec.steps):
            last = self.rec.steps[-1].step + 1 if self.rec.steps else 0
            self._diverge(f"step {self.cursor}", "(the recording ends here)", f"{what}: {asked}",
                          {"call": call, "step": last, "at": None, "field": "step",
                           "recorded": None, "requested": {"kind": kind, "value": asked}})
            return None
        step = self.rec.steps[self.cursor]
        if step.kind != kind:
            recorded = {"call": "a model call", "tool": "an SDK tool call", "clock": "an SDK clock read"}[step.kind]
            self._diverge(f"step {step.step}", recorded, f"{what}: {asked}",
                          {"call": call, "step": step.step, "at": None, "field": "step",
                           "recorded": {"kind": step.kind}, "requested": {"kind": kind, "value": asked}})
            return None
        return step

    def _copy(self, step: _Step) -> None:
        self.recorder.record_copy(self.name, [(e.kind, site_parts(e.site)[2], e.value) for e in self._events(step)])
        self.cursor += 1
        self.answered += 1
        self.arm_clock()

    # -- the program's clock (a model call's S:clock) --------------------------------------
    def _events(self, step: _Step) -> list:
        """A recorded call step's events as this run has them: its clock read the live one."""
        if step.kind != "call" or self.clock is None:
            return step.events
        live = self.clock.event()
        out = [e for e in step.events if e.kind != "clock"]
        return out if live is None else [_Event("clock", live, f"{step.step}:clock"), *out]

    def _clock_at(self, step: _Step, index: int) -> None:
        """Compare the clock the program read before call `index` with the recorded one;
        the first that differs is kept as the clock's divergence."""
        if self.clock is None or self.clock_divergence is not None or not self._clock_recorded:
            return
        live = self.clock.current()
        a, b = self.expected_clock(step), live.get("t") if live else None
        if a != b:
            self.clock_divergence = Divergence(f"{step.step}:clock (the clock read before call {index})", "trace",
                                               a if a is not None else "(no clock read)",
                                               b if b is not None else "(no clock read)", NAMES)
            self._clock_detail = {"call": index, "step": step.step, "at": f"{step.step}:clock", "field": "t",
                                  "recorded": a, "requested": b}

    def expected_clock(self, step: _Step) -> str | None:
        """The clock value the program should read before recorded call `step`: the recorded one."""
        read = recorded_clock_read(step)
        return read["t"] if read else None

    def offset_at(self, step: _Step) -> float | None:
        """How far (s) the program's realtime reads before recorded step `step` are moved: as recorded."""
        read = recorded_clock_read(step)
        if read is None:
            return None
        offset = read.get("offset_s", 0)
        return float(offset) if type(offset) in (int, float) and abs(offset) < 1e11 else 0.0

    def arm_clock(self) -> None:
        """Before the program goes on to the next recorded step: the offset its clock reads then get."""
        if self.clock is None or self.divergence is not None:
            return
        for step in self.rec.steps[self.cursor:]:
            offset = self.offset_at(step)
            if offset is not None:
                self.clock.set_offset(timedelta(seconds=offset))
                return

    def answer_call(self, name, endpoint: str, body: dict):
        asked = responses_body()  # the Responses request this chat call means, if it came as one
        with self._lock:
            if asked is None:
                step = self._take("call", body.get("messages", body.get("prompt")))
            else:
                step = self._take("call", {k: asked.get(k) for k in ("instructions", "input") if k in asked},
                                  f" (POST {RESPONSES_ROUTE})")
            if step is not None:
                prompt = next(e.value for e in step.events if e.kind == "prompt")
                recorded = prompt.get("request") if isinstance(prompt.get("request"), dict) else {}
                index = self.calls
                self._clock_at(step, index)
                diff = first_request_difference(recorded, body)
                if prompt.get("endpoint", endpoint) != endpoint:
                    diff = ("endpoint", prompt.get("endpoint"), endpoint)
                if diff is None:
                    return self._answer_call(name, endpoint, body, step, prompt)
                where = f"call {index} (step {step.step})"
                if asked is not None:
                    where = f"call {index} (step {step.step}, POST {RESPONSES_ROUTE})"
                    diff = in_responses_terms(*diff, asked)
                # a changed clock read before it is the first cause: named first, the request then
                self.request_divergence = call_divergence(where, *diff, NAMES)
                self.divergence = self.clock_divergence or self.request_divergence
                path, was, now = request_field(recorded, body) or ("endpoint", prompt.get("endpoint"), endpoint)
                self.detail = self._clock_detail or {"call": index, "step": step.step, "at": f"{step.step}:prompt",
                                                     "field": path, "recorded": was, "requested": now}
            return self._live_call(name, endpoint, body)

    def _answer_call(self, name, endpoint: str, body: dict, step: _Step, prompt: dict):
        """A model call that matches recorded step `step`: the recorded answer."""
        self._copy(step)
        self.calls += 1
        return _response(endpoint, step, prompt, self.rec.run.model_id or "tttr")

    def _live_call(self, name, endpoint: str, body: dict):
        """A model call after the divergence: generated live, by the recorded model (sealed: refused)."""
        if self.sealed:
            return sealed_call_answer(self.divergence)
        return self.live.generate(name, endpoint, body)

    @property
    def logits_computed(self) -> int:
        return self.live.logits_computed

    def report(self) -> dict:
        return {"calls_generated": self.live.calls_generated}

    def close(self) -> None:
        self.live.close()

    def answer_sdk(self, name, kind: str, value: dict):
        with self._lock:
            step = self._take(kind, value)
            if step is None:
                return self._sealed_tool(value) if self.sealed and kind == "tool" else None  # live from here on
            recorded = next(e.value for e in step.events if e.kind == kind)
            if kind == "clock":
                return self._answer_clock(step, recorded)
            keys = ("function", "args", "kwargs") if "function" in value else ("cmd", "cwd", "timeout_s")
            if "tree_before" in recorded and "tree_before" in value:  # sdk.shell's cassette: the tree too
                keys += ("tree_before",)
            for key in keys:
                if recorded.get(key) != value.get(key):
                    label = recorded.get("function") or recorded.get("cmd")
                    self._diverge(f"step {step.step}, tool {label}: {key}", recorded.get(key), value.get(key),
                                  {"call": None, "step": step.step, "at": f"{step.step}:tool", "field": key,
                                   "recorded": recorded.get(key), "requested": value.get(key)})
                    return self._sealed_tool(value) if self.sealed else None
            answer = self._answer_sdk(step, recorded, value)
            # the recorded call's effects on the files, which the server puts back (a fork's new value too)
            return {**{k: recorded[k] for k in ("tree_after", "snapshot") if recorded.get(k)}, **answer}

    def _sealed_tool(self, value: dict) -> dict:
        return sealed_tool_answer(value, self.divergence)

    def _answer_clock(self, step: _Step, recorded: dict) -> dict:
        """A clock read at recorded step `step`: the recorded value."""
        self._copy(step)
        return {"t": recorded.get("t")}

    def _answer_sdk(self, step: _Step, recorded: dict, value: dict) -> dict:
        """An SDK tool query that matches recorded step `step`: the recorded result."""
        self._copy(step)
        return recorded_tool_answer(recorded, value)

    def finish(self) -> None:
        """A recording with steps the program never asked for diverges at the first of them;
        one whose requests all matched but whose clock reads did not, at the first such read."""
        with self._lock:
            if self.divergence is None and self.clock_divergence is not None:
                self.divergence, self.detail = self.clock_divergence, self._clock_detail
            if self.divergence is None and self.cursor < len(self.rec.steps):
                step = self.rec.steps[self.cursor]
                self._diverge(f"step {step.step}", f"a {'model call' if step.kind == 'call' else 'SDK ' + step.kind}",
                              "(the program ended)",
                              {"call": self.calls if step.kind == "call" else None, "step": step.step, "at": None,
                               "field": "step", "recorded": {"kind": step.kind}, "requested": None})


def recorded_tool_answer(recorded: dict, value: dict) -> dict:
    """An SDK tool query's recorded answer: a function's result or error, a command's output."""
    if "function" in value:
        return {"error": recorded["error"]} if recorded.get("error") else {"result": recorded.get("result")}
    return {k: recorded.get(k) for k in ("stdout", "stderr", "exit_code", "limit_hit", "truncated")}


def sealed_call_answer(divergence: Divergence) -> APIError:
    """What a model call gets in a sealed replay after the divergence, in place of a live answer:
    HTTP 422 `sealed_replay_miss`, naming the divergence."""
    return APIError(f"sealed replay: the recording has no answer for this call ({divergence.describe()})",
                    status=422, code="sealed_replay_miss")


def sealed_tool_answer(value: dict, divergence: Divergence) -> dict:
    """What an SDK tool gets in a sealed replay after the divergence, in place of running:
    an error the program can surface (a function's exception, a command's exit code 125)."""
    why = f"sealed replay: the recording has no answer for this tool call ({divergence.describe()})"
    if "function" in value:
        return {"error": {"type": "SealedReplayMiss", "message": why}}
    return {"stdout": "", "stderr": f"tttr: {why}\n", "exit_code": 125, "limit_hit": None, "truncated": False}


# ---------------------------------------------------------------------------- the run
_script = program_file  # the program's own file, relative to its tree


def same_files(store, recorded: str, manifest: str, program: str | None) -> bool:
    """Whether tree manifests `recorded` and `manifest` hold the same files: paths, kinds,
    modes, sizes and content, without times and without the program's own file `program`."""
    from tttr.recorders.errors import SnapshotError
    from tttr.recorders.snapshot import read_manifest

    try:
        a, b = read_manifest(recorded, store), read_manifest(manifest, store)
    except SnapshotError:
        return False

    def files(entries) -> list:
        return [(e.path, e.kind, e.mode, e.size, e.ref) for e in entries if e.path != program]

    return files(a) == files(b)


def lay_code(code: str, tree_dir: Path) -> list[str]:
    """`--code DIR`: the files of DIR, which the user names on the command line, laid over
    the restored start tree (their program as it is today against the recording). Nothing
    of a recording names a host path: without --code the program is the one in the start
    snapshot."""
    from tttr.recorders.program import check_tree
    from tttr.recorders.snapshot import overlay

    src = Path(code)
    if not src.is_dir():
        raise ProgramRunError(f"--code {code!r} is not a directory: give the folder that holds your program's files")
    check_tree(src)
    return overlay(src, tree_dir)


def check_code(code: str, argv: list[str], recorded_argv: list[str]) -> None:
    """`--code DIR` must hold the program it replays (the recorded one, or `-- PROGRAM`'s):
    a folder that is not there, or that holds the program under another name, is refused
    (today's code would not be what runs)."""
    folder = Path(code)
    if not folder.is_dir():
        raise ProgramRunError(f"--code {code!r} is not a directory: give the folder that holds your program's files")
    script = _script(argv)
    if script is None or (folder / script).is_file():
        return
    others = sorted(p.name for p in folder.iterdir() if p.suffix == Path(script).suffix and p.is_file())
    hint = (f" (it holds {', '.join(others[:3])}: name it with `-- {' '.join([argv[0], others[0]])}`)" if others
            else "")
    named = "the recorded program" if argv == recorded_argv else "the program after --"
    raise ProgramRunError(f"--code {code!r} holds no {script}, {named} ({' '.join(argv)}){hint}")


def renamed(code: str, tree_dir: Path, argv: list[str], recorded_argv: list[str]) -> str | None:
    """Today's program under another name (`--code DIR -- python3 NEW.py`, DIR without the
    recorded OLD.py): OLD.py leaves the restored start tree, as a rename would, so that the
    files an SDK command sees are the recorded ones (each tree's own program file left out);
    OLD.py, or None."""
    old, new = _script(recorded_argv), _script(argv)
    if old is None or new is None or old == new or (Path(code) / old).exists():
        return None
    _drop_file(tree_dir, old)
    return old


def _drop_file(tree_dir: Path, rel: str) -> None:
    """Remove regular file `rel` of `tree_dir` if it is there, following no link."""
    from tttr.recorders.treeio import lstat_at, open_dir, open_root, remove_at

    *folders, name = rel.split("/")
    fds = [open_root(str(tree_dir))]
    try:
        for folder in folders:
            fds.append(open_dir(fds[-1], folder))
        st = lstat_at(fds[-1], name)
        if st is not None and stat.S_ISREG(st.st_mode):
            remove_at(fds[-1], name)
    except OSError:  # not there as a file (the start tree never held it): nothing to rename
        pass
    finally:
        for fd in fds:
            os.close(fd)


class _RenamedTree(SDKTree):
    """The program's tree, whose recorded program file `old_name` (if any) was renamed: a
    recorded call's effects put back leave it out, as the start tree does (`renamed`)."""

    def __init__(self, *args, old_name: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.old_name = old_name

    def move_to(self, recorded: dict) -> bool:
        moved = super().move_to(recorded)
        if moved and self.old_name is not None:
            _drop_file(self.tree, self.old_name)
        return moved


def check_sealable(rec: Recording) -> None:
    """A sealed replay answers the program's tools from their SDK events: a run with none was
    recorded without the SDK (its tools, if any, ran inside the program, unrecorded)."""
    if not any(s.kind in ("tool", "clock") for s in rec.steps):
        raise ProgramRunError(f"run {rec.run.id} was recorded without the SDK (no tool or clock events): a sealed "
                              "replay could not keep its tools from running; replay it without --sealed, or record "
                              "it with `from tttr.recorders import sdk` (@sdk.tool, sdk.shell)")


def replay_program(db: str, run_id: int, *, unsafe_no_sandbox: bool = False, timeout_s: float | None = None,
                   progress=None, fork=None, model: str | None = None, code: str | None = None,
                   meta: dict | None = None, argv: list[str] | None = None, sealed: bool = False,
                   recording: Recording | None = None) -> ReplayResult:
    """Replay recorded program run `run_id` of `db` as a child run; see the module's text.
    `fork` (engine/program/fork.py's ForkPlan, checked already) makes it a fork at one site.
    `timeout_s`: the recording's --timeout unless given (a program that hung when recorded
    is stopped after as long again, not after the default 600 s). `code`: a folder whose
    files are laid over the recorded start tree (lay_code). `argv`: another command line
    (`tttr replay RUN -- PROGRAM ARG...`). `sealed`: nothing runs live (Replayer.sealed); a
    run whose program used no SDK (its tools ran unrecorded, so nothing could keep them from
    running again) is refused. `recording`: the run as a replay's check decoded it
    (check_recording; a fork's plan holds its own): the file is then opened once, for
    writing, and the run not decoded again."""
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.recorders.limits import Limits
    from tttr.recorders.sandbox import Executor
    from tttr.recorders.snapshot import restore
    from tttr.sessions.store import Store

    say = progress or (lambda text: None)
    rec = recording if recording is not None else getattr(fork, "recording", None)
    if rec is None:  # no plan handed in: checked here, read-only, before anything is written
        with Store.open(db, create=False, readonly=True) as reader:
            rec = check_recording(reader, run_id, sealed=sealed, code=code, argv=argv)
    host = HostPython.current()
    work = scratch_dir("tttr-replay-")
    tree_dir = work / "tree"
    recorder = None
    try:
        # The one connection that writes: the child run, and the start tree and recorded output read
        # through it; the recording is the checked one, refused if its run changed since the check.
        recorder = CallRecorder(db, None, default_run=rec.run.task)
        rec = rec.on(recorder.store)
        recorded_argv = [str(a) for a in rec.setup["program"]]
        argv = list(argv) if argv else recorded_argv
        if rec.setup.get("snapshot") is not None:
            restore(rec.setup["snapshot"], recorder.store, tree_dir)
        else:  # a recording with no start tree (an imported trace's, engine/traces/against.py): an empty one
            tree_dir.mkdir()
        # a fork's new start-tree files, written into the tree it runs from, and its variables
        setup = fork.lay_setup(rec.setup, tree_dir, recorder.store) if fork is not None else rec.setup
        old_name = None
        if code is not None:
            old_name = renamed(code, tree_dir, argv, recorded_argv)
            lay_code(code, tree_dir)
        try:
            program = check_program(argv, tree_dir, host)
        except ProgramError:
            if argv == recorded_argv:
                raise
            where = f"in the recorded start tree nor in --code {code}" if code is not None \
                else "in the recorded start tree (nor --code DIR given)"
            raise ProgramRunError(f"-- {' '.join(argv)} cannot start: {_script(argv) or argv[0]!r} is neither "
                                  f"{where}: put it in a folder and pass --code DIR") from None
        recorded_stdout = _text(recorder.store, rec.final.get("stdout"))
        if timeout_s is None:
            timeout_s = recorded_timeout(rec.run)
        clock = recorded_clock(rec)
        if fork is not None:  # a fork of the setup clock runs the whole program at another time
            clock = fork.start_clock(clock)
        sock_dir = api_dir(work / "api", host)
        seed = fork.run_seed(rec.run.seed) if fork is not None else rec.run.seed  # an experiment may change it
        share = ClockShare(work / "clock")
        executor = Executor(tree_dir, seed=seed or 0, unsafe_no_sandbox=unsafe_no_sandbox,
                            limits=Limits(timeout_s=timeout_s, tree_mb=1024),
                            binds=(*host.binds(sock_dir), share.bind()), logical_clock=True)
        try:
            owner, recorder = recorder, None  # _replay's server closes it
            return _replay(owner, rec, executor, host, program, argv, tree_dir, clock, sock_dir, recorded_stdout,
                           say, fork, model, code is not None, share, meta, sealed, old_name, setup)
        finally:
            executor.close()
            share.close()
    finally:
        if recorder is not None:  # refused before the program started: nothing of the child was written
            recorder.close()
        remove_tree(work)


def _replay(recorder, rec, executor, host, program, argv, tree_dir, clock, sock_dir, recorded_stdout, say,
            fork=None, model=None, new_code=False, share=None, meta=None, sealed=False,
            old_name=None, setup=None) -> ReplayResult:
    from tttr.engine.serve.modes import FromRecording
    from tttr.engine.serve.sdk_events import ProgramClock
    from tttr.engine.serve.server import create_app
    from tttr.recorders.clock import iso
    from tttr.recorders.shell import ShellState
    from tttr.recorders.snapshot import snapshot

    run = rec.run
    name = run.task
    store = recorder.store
    setup = rec.setup if setup is None else setup  # the start tree and variables this run starts with
    replayer = fork.replayer(rec, recorder, name) if fork is not None else Replayer(rec, recorder, name, model)
    replayer.clock = share  # the program's clock reads: compared per call, moved as recorded (or forked)
    replayer.sealed = sealed
    recorder.program_clock = share.event if share is not None else None  # a live call's clock read
    sdk_clock = ProgramClock(clock)  # live reads, after a divergence: as when recording
    app = create_app(FromRecording(replayer.answer_call, replayer.answer_sdk,
                                   {"id": run.model_id or "tttr", "object": "model", "created": 0, "owned_by": "tttr"}),
                     recorder, clock=sdk_clock,
                     tree=_RenamedTree(tree_dir, store, recorded_since=run.created, program=_script(argv),
                                       old_name=old_name))  # effects put back
    server = app.state.server
    replayer.tree = server.sdk_tree
    endpoint = None
    child = None
    try:
        replay = {"free": [], **({"code": True} if new_code else {}), **({"sealed": True} if sealed else {}),
                  **({"program": list(argv)} if argv != rec.setup.get("program") else {})}
        how = fork.columns() if fork is not None else {"fork_seq": 0, "meta": {**run.meta.to_json(), "replay": replay, **(meta or {})}}
        child = store.begin_run(task=run.task, model_id=run.model_id, kernel_mode=run.kernel_mode,
                                sampling=run.sampling, seed=fork.run_seed(run.seed) if fork is not None else run.seed,
                                fingerprint=run.fingerprint, parent=run.id, **how)
        if fork is None:
            recorder.adopt(name, child)
            if rec.setup_clock is not None:  # as recorded, so that diff finds the setup alike
                store.append(child, site(SETUP_STEP, "clock"), rec.setup_clock)
            written = setup
            if new_code:  # the start tree this replay ran from: the recorded one with --code laid over it
                start = snapshot(tree_dir, store)
                written = {**written, "tree": start, "snapshot": start}
            if argv != written.get("program"):  # `-- PROGRAM ARG...`: the command line it ran
                written = {**written, "program": list(argv)}
            store.append(child, site(SETUP_STEP, "setup"), written)
            store.commit_step(child)
        else:  # the setup and the steps before the site are the parent's, shared
            fork.adopt(recorder, child, setup, rec.setup_clock)
        sandboxed = executor.sandboxed
        endpoint = _Endpoint(noting_responses(app), str(sock_dir / SOCKET_NAME) if sandboxed else None)
        env = {**exports(setup),  # a fork's setup:env variables (tttr's own below win over a database's)
               **(host.env() if sandboxed else {"PATH": host.path, **(share.env() if share else {})}),
               **endpoint_env(endpoint.base, name), "TTTR_REPLAY": "1", **task_env(run.meta.task_env)}  # a suite task's
        replayer.arm_clock()  # the reads before the first call
        command = sandboxed_command(program, host) if sandboxed else program
        sdk_clock.begin()
        say(f"{getattr(fork, 'verb', 'forking') if fork is not None else 'replaying'} {program} …")  # a trace's: its own
        recorder.start_clock(name)  # the first step's wait counts from the program's start (issue 29)
        res = executor.run(command, clock=clock, step=0, state=ShellState(exports=env))
        endpoint.begin_stop()  # the program and what it started are gone: nothing asks any more
        recorder.flush()
        replayer.finish()
        last = store.steps(child)
        end = snapshot(tree_dir, store)
        end_digest = end  # the manifest's digest is the tree's (recorders/snapshot.py)
        store.append(child, site(last, "tool"), {
            "cmd": program, "cwd": res.cwd, "exports": dict(env), "env": res.env,
            "stdout": stored_text(store, res.stdout), "stderr": stored_text(store, res.stderr),
            "exit_code": res.exit_code, "duration_ms": round(res.duration_ms, 3), "stdout_size": res.stdout_size,
            "stderr_size": res.stderr_size, "truncated": res.truncated, "limit_hit": res.limit_hit,
            "tree_before": setup.get("tree"), "tree_after": end_digest, "snapshot": end,
            "program": list(argv),
        })
        tools_run = recorder.posted.get("tool", 0)
        # What the recording does not hold (an imported trace's end: engine/traces/against.py) is not compared.
        same_stdout = "stdout" not in rec.final or res.stdout == recorded_stdout
        same_exit = "exit_code" not in rec.final or res.exit_code == rec.final.get("exit_code")
        same_tree = (same_files(store, rec.final["snapshot"], end, _script(argv)) if rec.final.get("snapshot")
                     else end_digest == rec.final.get("tree_after") if "tree_after" in rec.final
                     else None)  # a recording without its end manifest; None: no end tree to compare with
        identical = replayer.divergence is None and same_stdout and same_exit
        logits = replayer.logits_computed
        outcome = {"exit_code": res.exit_code, "calls": replayer.calls, "tree": end_digest, "clock": iso(clock),
                   "identical": identical, "same_stdout": same_stdout, "same_tree": same_tree,
                   "logits_computed": logits, "tools_run": tools_run,
                   "divergence": replayer.divergence.to_json() if replayer.divergence else None}
        outcome.update(replayer.report())
        check = fork.check if fork is not None else run.meta.check
        # An experiment cancelled while this program ran (its model calls refused since): no verdict.
        cancelled = fork is not None and fork.cancel is not None and fork.cancel.is_set()
        if cancelled:
            outcome["reason"] = "cancelled while the program ran: its later model calls were refused"
        elif check and sealed:  # nothing runs live: the recorded verdict where the end tree is the recorded one
            recorded = rec.outcome if isinstance(rec.outcome, dict) else {}
            outcome |= ({"passed": recorded.get("passed"), "check": "the recorded verdict: the same end tree"}
                        if same_tree and "passed" in recorded else {"check": "not run (sealed): another end tree"})
        elif check:  # the recording's --check, on this run's end tree
            checker = executor.run(check, clock=clock, step=1)
            outcome |= {"passed": checker.exit_code == 0, "checker_exit": checker.exit_code,
                        "checker_output": (checker.stdout + checker.stderr)[-2000:]}
        if isinstance(rec.outcome, dict) and "passed" in rec.outcome:
            outcome["recorded_passed"] = rec.outcome["passed"]
        store.append(child, site(last, "outcome"), outcome)
        store.finish_run(child, status="incomplete" if cancelled else "complete", outcome=outcome)
        done, child = child, None
        return ReplayResult(done, "incomplete" if cancelled else "complete", outcome, identical=identical,
                            divergence=replayer.divergence, parent=run.id, logits_computed=logits,
                            extra=replayer.report(), exit_code=res.exit_code,
                            recorded_exit_code=rec.final.get("exit_code"), stdout=res.stdout, same_stdout=same_stdout,
                            same_tree=same_tree, calls_answered=replayer.answered, tools_run=tools_run,
                            detail=replayer.detail, sealed=sealed)
    finally:
        if endpoint is not None and child is not None:  # stopped early: wait for the server to go
            endpoint.stop()
        # Else it was asked to stop when the program ended, and nothing it serves is wanted now:
        # its thread ends by itself (uvicorn's 0.1 s tick and shutdown pause), unwaited, ~9% of a replay.
        if child is not None:
            try:
                store.finish_run(child, status="incomplete", outcome={"reason": "replay stopped early"})
            except Exception:  # noqa: BLE001 - the store is closed next either way
                pass
        server.shutdown()
        replayer.close()


__all__ = ["ReplayResult", "Replayer", "is_program_run", "replay_program"]
