"""The differences between two recorded runs of one program (`tttr record -- PROGRAM`), as
deltas: each value the program got from outside that differs between the runs where it is
comparable, with its layer and its site as `tttr events` prints it, ready to apply to one run
as a change of a program fork (engine/program/fork.py's `Change`: the other run's value there).

Steps are compared by number (a program's steps are numbered in the order it made its
requests, and a fork keeps its parent's numbering):

- trace: the setup clock; each SDK clock read (`sdk.now()`) both runs made at that step; an
  SDK tool's result (`@sdk.tool`, `sdk.shell`) where the request — function and arguments,
  or command, directory and timeout — is the same in both (another request's result differs
  as a consequence, not a delta).
- token: per model call whose prompt (token ids) is the same in both, the first position
  whose sampled token differs, carried with the other run's seed for that call (so that the
  rest of the call samples as the other's did); and the run's seed (its sandbox's randomness:
  `random`, `uuid`, `/dev/urandom`).
- tensor: none. `tttr record` serves every call under invariant kernels; two runs under
  other kernel modes or kernels revisions are refused, as are two runs of different programs
  (command line, start tree, model) and a pair with no delta: DeltaError, one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tttr.engine.replay.deltas import Delta, DeltaError, nonempty, with_run_level
from tttr.sessions.vocabulary import SETUP_STEP, Site, site_order

_FUNCTION_REQUEST = ("function", "args", "kwargs")
_SHELL_REQUEST = ("cmd", "cwd", "timeout_s")
_FUNCTION_RESULT = ("result", "error")
_SHELL_RESULT = ("stdout", "stderr", "exit_code", "limit_hit")
_EFFECTS = ("tree_after", "snapshot")  # a tool's effects on the files, which a replay puts back


@dataclass(frozen=True, slots=True)
class ProgramPair:
    """Two recordings of one program, loaded (engine/program/replay.py's recordings): the base
    (deltas apply to it) and the other."""

    base: object
    other: object

    @classmethod
    def load(cls, store, base: int, other: int) -> "ProgramPair":
        from tttr.engine.program.record import ProgramRunError
        from tttr.engine.program.replay import is_program_run, load_recording

        if base == other:
            raise DeltaError(f"runs {base} and {other} are the same run: give two runs of one program")
        for rid in (base, other):
            if not is_program_run(store.run(rid)):
                raise DeltaError(f"run {rid} is not a recorded program, but run {base if rid == other else other} is: "
                                 "give two runs of the same program (tttr record -- PROGRAM)")
        try:
            pair = cls(load_recording(store, base), load_recording(store, other))
        except ProgramRunError as exc:
            raise DeltaError(str(exc)) from None
        pair.check()
        return pair

    def check(self) -> None:
        a, b = self.base, self.other
        ra, rb = a.run, b.run
        for what, get in (
            ("command lines", lambda r: r.setup.get("program")),
            ("start trees", lambda r: r.setup.get("tree")),
            ("models", lambda r: r.run.model_id),
            ("kernel modes", lambda r: r.run.kernel_mode),
            ("kernels revisions", lambda r: (r.run.fingerprint or {}).get("kernels_revision")),
        ):
            if get(a) != get(b):
                raise DeltaError(f"runs {ra.id} and {rb.id} have different {what} ({_short(get(a))} and "
                                 f"{_short(get(b))}): give two runs of the same program, start tree and model")

    @property
    def ids(self) -> tuple[int, int]:
        return self.base.run.id, self.other.run.id


def _short(value) -> str:
    from tttr.sessions.safe_text import brief

    return brief(" ".join(value) if isinstance(value, list) else value, 40)


def deltas(pair: ProgramPair) -> list[Delta]:
    """Every delta of `pair.other` against `pair.base`, in site order (the run's seed last).
    Each delta's `mutation` is the program fork `Change` that puts the other's value in place."""
    base, other = pair.base, pair.other
    out = _setup_clock(base, other)
    theirs = {s.step: s for s in other.steps}
    for mine in base.steps:
        step = theirs.get(mine.step)
        if step is None or step.kind != mine.kind:
            continue
        out += {"clock": _clock, "tool": _tool, "call": _token}[mine.kind](base, other, mine, step)
    return with_run_level(out, base.run, other.run)  # the seed (the kernel modes are equal: `check`)


def differing(pair: ProgramPair) -> list[Delta]:
    """`deltas(pair)`, refusing a pair with none."""
    return nonempty(deltas(pair), *pair.ids, "clock read, comparable SDK tool result, sampled token or seed")


def _value(step, kind: str):
    return next((e.value for e in step.events if e.kind == kind), None)


def _setup_clock(base, other) -> list[Delta]:
    from tttr.engine.program.fork import Change

    a, b = (r.setup.get("clock") or r.run.meta.clock for r in (base, other))
    if not (isinstance(a, str) and isinstance(b, str)) or a == b:
        return []
    shift = datetime.fromisoformat(b) - datetime.fromisoformat(a)
    at = Site(SETUP_STEP, "clock")
    return [Delta(str(at), "trace", a, b, Change(at, b, f"run {other.run.id}'s start clock", shift=shift))]


def _clock(base, other, mine, theirs) -> list[Delta]:
    from tttr.engine.program.fork import Change

    a, b = (_value(mine, "clock") or {}).get("t"), (_value(theirs, "clock") or {}).get("t")
    if not (isinstance(a, str) and isinstance(b, str)) or a == b:
        return []
    at = Site(mine.step, "clock")
    return [Delta(str(at), "trace", a, b, Change(at, b, f"run {other.run.id}'s read"))]


def _tool(base, other, mine, theirs) -> list[Delta]:
    from tttr.engine.program.fork import Change

    a, b = _value(mine, "tool"), _value(theirs, "tool")
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return []
    request, result = (_FUNCTION_REQUEST, _FUNCTION_RESULT) if "function" in a else (_SHELL_REQUEST, _SHELL_RESULT)
    if "tree_before" in a and "tree_before" in b:  # sdk.shell's cassette: the same command on the same files
        request += ("tree_before",)
    if any(a.get(k) != b.get(k) for k in request):
        return []  # another request: its result differs as a consequence
    if all(a.get(k) == b.get(k) for k in result) and a.get("tree_after") == b.get("tree_after"):
        return []
    value = {k: b[k] for k in result if k in b}
    if "function" in a:
        value = {"error": b["error"]} if b.get("error") else {"result": b.get("result")}
    value |= {k: b[k] for k in _EFFECTS if b.get(k)}  # the other's effects on the files come with its result
    at = Site(mine.step, "tool")
    return [Delta(str(at), "trace", _shown(a), _shown(b),
                  Change(at, value, f"run {other.run.id}'s result", request={k: b.get(k) for k in request}))]


def _shown(tool: dict):
    """A tool result as a delta shows it."""
    if "function" in tool:
        return {"error": tool["error"]} if tool.get("error") else tool.get("result")
    return {k: tool.get(k) for k in _SHELL_RESULT if tool.get(k) is not None}


def _token(base, other, mine, theirs) -> list[Delta]:
    from tttr.engine.program.fork import Change

    pa, pb = _value(mine, "prompt"), _value(theirs, "prompt")
    if not (isinstance(pa, dict) and isinstance(pb, dict)) or pa.get("ids_digest") != pb.get("ids_digest"):
        return []
    ta = sorted((e for e in mine.events if e.kind == "token"), key=lambda e: site_order(e.site))
    tb = sorted((e for e in theirs.events if e.kind == "token"), key=lambda e: site_order(e.site))
    for pos, (x, y) in enumerate(zip(ta, tb)):
        if x.value.get("id") == y.value.get("id"):
            continue
        ids = pa.get("ids")
        seed = (pb.get("sampling") or {}).get("seed")
        max_tokens = pb.get("max_tokens")
        before = [t.value.get("id") for t in ta[:pos]]
        if not (isinstance(ids, list) and type(seed) is int and type(max_tokens) is int and type(y.value.get("id")) is int
                and all(type(i) is int for i in before)):
            return []  # a call whose prompt ids or seed were not recorded cannot be generated again
        forced = {p: i for p, i in enumerate(before)} | {pos: y.value["id"]}
        at = Site(mine.step, "token", pos)
        seeds = "" if (pa.get("sampling") or {}).get("seed") == seed else f", seed {seed}"
        change = Change(at, y.value["id"], f"run {other.run.id}'s token{seeds}", forced,
                        {"ids": list(ids), "seed": seed, "max_tokens": max_tokens},
                        request=pb.get("request") if isinstance(pb.get("request"), dict) else None)
        return [Delta(str(at), "token", x.value.get("text", x.value.get("id")), y.value.get("text", y.value.get("id")),
                      change, (x.value.get("id"), y.value.get("id")))]
    return []


__all__ = ["ProgramPair", "deltas", "differing"]
