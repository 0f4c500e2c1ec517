"""Parse and validate one mutation — a new value for one recorded site — without running
anything. The app's edit dialog and `tttr fork --set` both come through here, so a bad
value is refused with the same reason in both places and nothing is written.

Values, by site:
- `STEP:clock`: an ISO date-time (`2026-03-01T09:00:00`), or a shift of the recorded
  value: `+90`, `-3600` (seconds), `+2h`, `-1d`, `+15m`.
- `STEP:tool`: plain text replaces stdout; `exit=N` replaces the exit code (`exit=` and no
  integer is refused); a JSON object may set any of `stdout`, `stderr`, `exit_code`.
- `STEP:token:POS`: a token id (`1234` or `id:1234`), or text that is exactly one token of
  the model's vocabulary (`" rm"`; quote it as JSON to force text: `"5"`).
- `STEP:message`: the model's whole answer at the step, as text (quote it as JSON for
  escapes); it is taken token by token as the model's, and the message ends there.
- `setup:file:PATH`: the text of a file of the start tree (quote it as JSON for escapes); a
  new file where its folder exists, or an existing regular file's content.
- `setup:env:NAME`: the value of a variable the run's commands start with (`export`ed
  before the first step).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from tttr.engine.replay.runtime import Runtime
from tttr.recorders.clock import normalize_clock
from tttr.recorders.errors import RecorderError, SandboxError, SnapshotError
from tttr.sessions.errors import TTTRError
from tttr.sessions.safe_text import visible
from tttr.sessions.values import ValueProblem, load_json
from tttr.sessions.vocabulary import MUTABLE, SETUP, SETUP_VALUES, Site, SiteError, site


class MutationError(TTTRError, ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Mutation:
    """One recorded value replaced. `value` is already validated and typed:
    clock -> datetime; tool -> dict of replaced fields; token -> int token id."""

    site: Site
    value: Any
    text: str  # as the user wrote it, for the record

    def at(self, kind: str, step: int) -> bool:
        """Whether this mutation replaces the `kind` value of `step` (the one test of "is
        this the mutated site?")."""
        return self.site.at(kind, step)

    @property
    def first_site(self) -> str:
        """The site of the first recorded event this mutation replaces, where a fork parts
        from its parent: a whole answer replaces its step's tokens from the first."""
        if self.site.name == "message":
            return site(self.site.step, "token", 0)
        if self.site.name in SETUP_VALUES:
            return site(self.site.step, "setup")
        return str(self.site)

    def to_json(self) -> dict:
        v = self.value.isoformat() if isinstance(self.value, datetime) else self.value
        return {"site": str(self.site), "value": v, "input": self.text}


_SHIFT = re.compile(r"^([+-])(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_mutation(store, run_id: int, site_text: str, value_text: str, tokenizer=None) -> Mutation:
    try:
        site = Site.parse(site_text)
    except SiteError as exc:
        raise MutationError(str(exc)) from None
    if site.name in SETUP_VALUES:
        return Mutation(site, _setup_value(store, run_id, site, value_text), value_text)
    if site.name not in MUTABLE:
        raise MutationError(
            f"site {site} cannot be edited: edit a clock (STEP:clock), a tool result (STEP:tool), "
            "a sampled token (STEP:token:POS) or a whole answer (STEP:message)"
        )
    event = store.event_at(run_id, str(site))
    if event is not None and event.problem:
        raise MutationError(f"run {run_id}, site {site}: {visible(event.problem, newlines=False)}")
    if event is None:
        steps = store.steps(run_id)
        raise MutationError(
            f"site {site} does not exist in run {run_id} (it has steps 0..{max(steps - 1, 0)}); "
            f"`tttr events DB {run_id} --json` lists its sites"
        )
    if site.name == "clock":
        return Mutation(site, clock_value(value_text, event.value), value_text)
    if site.name == "tool":
        return Mutation(site, tool_value(value_text), value_text)
    if site.name == "message":
        return Mutation(site, _message(value_text, tokenizer), value_text)
    return Mutation(site, _token(value_text, tokenizer), value_text)


def clock_value(text: str, recorded: dict) -> datetime:
    text = text.strip()
    m = _SHIFT.match(text)
    if m:
        seconds = float(m.group(2)) * _UNITS[m.group(3)] * (1 if m.group(1) == "+" else -1)
        try:
            t = datetime.fromisoformat(recorded["t"]) + timedelta(seconds=seconds)
        except (OverflowError, ValueError):  # beyond year 1..9999, or an infinite float
            raise MutationError(
                f"clock shift {text[:40]!r} goes beyond the calendar from {recorded['t']}; "
                f"the virtual clock shows years {_YEARS}"
            ) from None
        return _in_range(t, text)
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise MutationError(
            f"clock value {text[:60]!r} does not parse: give an ISO date-time like 2026-03-01T09:00:00 "
            "or a shift like +90, -3600, +2h, -1d"
        ) from None
    if t.tzinfo is not None:
        try:
            t = t.astimezone(timezone.utc).replace(tzinfo=None)  # the sandbox clock is UTC
        except OverflowError:
            raise MutationError(f"clock value {text!r} is beyond the calendar in UTC") from None
    return _in_range(t, text)


_YEARS = "1971–2999"


def _in_range(t: datetime, text: str) -> datetime:
    """The sandbox's virtual clock shows only these years: refuse the rest here, not as a
    run that dies at its first command."""
    try:
        normalize_clock(t)
    except SandboxError:
        raise MutationError(
            f"clock value {text[:40]!r} gives {t.isoformat()}, outside the virtual clock's years {_YEARS}"
        ) from None
    return t


def tool_value(text: str) -> dict:
    stripped = text.strip()
    m = re.fullmatch(r"exit(?:_code)?\s*=\s*(-?\d+)", stripped)
    if m:
        return {"exit_code": _exit_code(m.group(1))}
    if re.match(r"exit(?:_code)?\s*=", stripped):  # a mistyped exit code, not the text stdout is meant to be
        raise MutationError(f"{stripped[:40]!r} is not exit=N with an integer N (e.g. exit=1); for stdout that "
                            f"reads so, give JSON: {json.dumps({'stdout': stripped[:40]})}")
    if stripped.startswith("{"):
        try:
            value = load_json(stripped, "the tool result")  # bounded depth: a user's text is input too
        except ValueProblem as exc:
            raise MutationError(f"{exc}: {stripped[:60]!r}") from None
        if not isinstance(value, dict):
            raise MutationError(f"tool result JSON must be an object with stdout, stderr or exit_code: {stripped[:60]!r}")
        unknown = set(value) - {"stdout", "stderr", "exit_code"}
        if unknown:
            raise MutationError(
                f"tool result has unknown field(s) {', '.join(sorted(unknown))}: use stdout, stderr, exit_code"
            )
        for key in ("stdout", "stderr"):
            if key in value and not isinstance(value[key], str):
                raise MutationError(f"tool result field {key} must be a string, got {type(value[key]).__name__}")
        if "exit_code" in value and (not isinstance(value["exit_code"], int) or isinstance(value["exit_code"], bool)):
            raise MutationError(f"tool result field exit_code must be an integer, got {value['exit_code']!r}")
        if "exit_code" in value:
            _exit_code(str(value["exit_code"]))
        if not value:
            raise MutationError("tool result JSON is empty: set stdout, stderr or exit_code")
        return value
    return {"stdout": text}


def _exit_code(digits: str) -> int:
    """An exit status as a shell could report one (a process's status is 0..255; negative
    and larger values are kept for experiments, within 32 bits)."""
    if len(digits.lstrip("-")) > 10 or not -(2**31) <= int(digits) < 2**31:
        raise MutationError(f"exit code {digits[:20]} is out of range: give an integer in -2147483648..2147483647")
    return int(digits)


def _token(text: str, tokenizer) -> int:
    if tokenizer is None:
        tokenizer = Runtime().tokenizer  # the default model's (TTTR_MODEL, then the embedded one)
    vocab = tokenizer.vocab_size
    stripped = text.strip()
    m = re.fullmatch(r"(?:id:)?(-?\d+)", stripped)
    if m:
        if len(m.group(1)) > 19:
            raise MutationError(f"token id {m.group(1)[:20]}… is outside the vocabulary (0..{vocab - 1})")
        token_id = int(m.group(1))
        if not 0 <= token_id < vocab:
            raise MutationError(f"token id {token_id} is outside the vocabulary (0..{vocab - 1})")
        return token_id
    if stripped.startswith('"'):
        try:
            text = json.loads(stripped)
        except json.JSONDecodeError:
            raise MutationError(f"token text {stripped!r} is not a valid JSON string") from None
    if text == "":
        raise MutationError("token text is empty: give one token's text or its id")
    ids = tokenizer.encode(text)
    if len(ids) != 1:
        pieces = ", ".join(repr(tokenizer.decode([i])) for i in ids[:6])
        raise MutationError(
            f"text {text!r} is {len(ids)} tokens ({pieces}), not one: give a single token's text or its id"
        )
    return ids[0]


MAX_MESSAGE_TOKENS = 4096  # a whole answer longer than this is not one a step could have generated


def _message(text: str, tokenizer) -> str:
    """A whole answer: text, or a JSON string for escapes; refused when empty or longer than
    any message a step generates."""
    text = _text_value(text, "message text")
    if not text.strip():
        raise MutationError("message text is empty: give the model's whole answer as text")
    if tokenizer is None:
        tokenizer = Runtime().tokenizer
    n = len(tokenizer.encode(text))
    if n > MAX_MESSAGE_TOKENS:
        raise MutationError(f"message text is {n} tokens: give at most {MAX_MESSAGE_TOKENS}")
    return text


MAX_FILE_TEXT = 8 << 20  # a start tree file's new text, at most
MAX_ENV_TEXT = 64 << 10
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_ENV = ("TTTR_", "LD_")  # the sandbox's own: a run cannot start without them as they are


def _setup_value(store, run_id: int, at: Site, text: str) -> dict:
    """A setup value's new text: a start-tree file's (`setup:file:PATH`) or a variable's
    (`setup:env:NAME`), checked against the run's recorded setup."""
    setup = store.event_at(run_id, str(Site(at.step, "setup")))
    if setup is not None and setup.problem:
        raise MutationError(f"run {run_id}: its setup is unreadable ({visible(setup.problem, newlines=False)}), "
                            f"so {at} cannot be changed")
    if setup is None or not isinstance(setup.value, dict) or not setup.value.get("tree"):
        raise MutationError(f"run {run_id}: it has no recorded start tree, so {at} cannot be changed")
    value = _text_value(text, f"{at.name} text")
    if at.name == "env":
        if not _ENV_NAME.match(at.arg) or at.arg.startswith(_RESERVED_ENV):
            raise MutationError(f"{SETUP}:env:{at.arg[:40]} is not a variable a run can start with: give a name of "
                                "letters, digits and _ (not TTTR_… or LD_…)")
        if "\0" in value or len(value.encode()) > MAX_ENV_TEXT:
            raise MutationError(f"the value of {at.arg} holds a NUL byte or is over {MAX_ENV_TEXT >> 10} KiB")
        return {"name": at.arg, "value": value}
    parts = at.arg.split("/")
    if at.arg.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise MutationError(f"{SETUP}:file:{at.arg[:60]!r} is not a path inside the start tree: give one like "
                            "notes/a.txt (relative, no . or .. parts)")
    if len(value.encode("utf-8", "surrogateescape")) > MAX_FILE_TEXT:
        raise MutationError(f"the new text of {at.arg[:60]} is over {MAX_FILE_TEXT >> 20} MiB")
    _check_start_tree(store, run_id, at.arg)
    return {"path": at.arg, "text": value}


def _check_start_tree(store, run_id: int, path: str) -> None:
    """The file can be written in the run's start tree: its folder is there (a folder, not a
    link) and it is a regular file or nothing yet."""
    from tttr.recorders.treestate import tree_at  # noqa: PLC0415 - reads snapshots; only a file edit needs it

    try:
        start = tree_at(store, run_id, -1)
    except (RecorderError, SnapshotError) as exc:
        raise MutationError(f"run {run_id}: its start tree cannot be read ({exc})") from None
    if start.note:
        raise MutationError(f"run {run_id}: its start tree cannot be read ({start.note})")
    files = start.files
    folder = path.rpartition("/")[0]
    if folder and (folder not in files or files[folder].kind != "d"):
        raise MutationError(f"setup:file:{path[:60]}: the start tree has no folder {folder[:60]!r} to put it in")
    entry = files.get(path)
    if entry is not None and entry.kind != "f":
        what = {"d": "a folder", "l": "a symbolic link"}.get(entry.kind, "not a regular file")
        raise MutationError(f"setup:file:{path[:60]} is {what} in the start tree: only a regular file's text can be set")


def _text_value(text: str, what: str) -> str:
    stripped = text.strip()
    if stripped.startswith('"'):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            raise MutationError(f"{what} {stripped[:60]!r} is not a valid JSON string") from None
        if not isinstance(value, str):
            raise MutationError(f"{what} {stripped[:60]!r} must be a JSON string")
        return value
    return text
