"""What a stored value must look like, per kind: the store's boundary against a hostile file.

A session database is data people share, so everything read from one is decoded and
checked here before anyone uses it. A value that cannot be decoded, is nested absurdly
deep, or has the wrong type or shape for its kind is not raised as an error: the store
hands out the event with `value=None` and `problem` naming what is wrong (see
`sessions.records.Event`). Readers that only show events mark it; readers that need the
value (replay, fork, diff) refuse the run with that line.

The rules check what consumers rely on: the fields they read have the types they expect.
Fields a rule does not name are left alone (values may grow fields), and kinds without a
rule may hold any JSON. Run metadata is checked the same way (`check_run_fields`).
"""

from __future__ import annotations

import json
import re
import struct
from datetime import datetime
from typing import Any, Callable

from . import codec

MAX_DEPTH = 64  # real values nest 3 deep; JSON nested 100,000 deep crashes json and Rich
MAX_INT = 2**63 - 1  # SQLite's INTEGER range
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")

Check = Callable[[Any], str | None]  # None when fine, else what is wrong


# ---------------------------------------------------------------------------- decoding
class ValueProblem(ValueError):
    """A stored value that cannot be used; the message says why, in a few words."""


def depth_problem(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """Nesting deeper than `limit`, measured without recursion, a level at a time."""
    level, depth = [value], 1
    while level:
        below: list = []
        for v in level:
            t = type(v)
            if t is dict:
                below.extend(v.values())
            elif t is list:
                below.extend(v)
            else:
                continue
            if depth > limit:
                return f"the value is nested more than {limit} levels deep"
        level, depth = below, depth + 1
    return None


def load_json(text: Any, what: str = "the value") -> Any:
    """Parse untrusted JSON text with bounded depth; raises ValueProblem. (Infinity stays:
    a forced token's logprob can be -inf.)"""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueProblem(f"{what} is bytes that are not UTF-8 JSON") from None
    if not isinstance(text, str):
        raise ValueProblem(f"{what} is stored as {_sql_type(text)}, not JSON text")
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueProblem(f"{what} is nested too deeply to read (more than {MAX_DEPTH} levels)") from None
    except ValueError as exc:  # JSONDecodeError, and ints of more than 4300 digits
        raise ValueProblem(f"{what} is not valid JSON ({_first_line(exc)})") from None
    deep = depth_problem(value)
    if deep:
        raise ValueProblem(deep if what == "the value" else f"{what}: {deep}")
    return value


def decode_value(kind: str, stored: Any, seed: Any, step: int, pos: Any) -> tuple[Any, str | None]:
    """(value, None), or (None, problem) for a value that cannot be decoded or does not fit its kind."""
    if isinstance(stored, bytes):  # a binary record (sessions.codec); its first byte names the format
        if not stored:
            return None, "the value is empty bytes"
        try:
            value = codec.decode(stored, seed, step, pos)
        except (ValueError, struct.error, IndexError, TypeError, OverflowError) as exc:
            return None, f"the binary record cannot be decoded ({_first_line(exc)})"
    else:
        try:
            value = load_json(stored)
        except ValueProblem as exc:
            return None, str(exc)
    # depth is bounded already: load_json measured it, and a binary record decodes to a fixed shape
    problem = check_fields(kind, value)
    return (None, problem) if problem else (value, None)


def _sql_type(v: Any) -> str:
    return {type(None): "NULL", int: "an integer", float: "a real number", bytes: "bytes", str: "text"}.get(
        type(v), type(v).__name__)


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()
    return (text[0] if text else type(exc).__name__)[:120]


# ---------------------------------------------------------------------------- field checks
def _name(v: Any) -> str:
    if v is None:
        return "null"
    if type(v) is bool:
        return "a boolean"
    if type(v) is int:
        return "an integer"
    if type(v) is float:
        return "a number"
    if type(v) is str:
        return "text"
    if type(v) is list:
        return "a list"
    if type(v) is dict:
        return "an object"
    return type(v).__name__


def is_int(v: Any, lo: int = -MAX_INT - 1, hi: int = MAX_INT) -> bool:
    return type(v) is int and lo <= v <= hi


def _text(v):
    return None if type(v) is str else f"is {_name(v)}, not text"


def _int(v):
    return None if is_int(v) else f"is {_name(v)}, not an integer" if type(v) is not int else "is beyond the 64-bit range"


def _count(v):
    return None if is_int(v, 0) else f"is {_name(v) if type(v) is not int else v}, not a count (an integer >= 0)"


def _bool(v):
    return None if type(v) is bool else f"is {_name(v)}, not true/false"


def _number(v):
    return None if type(v) in (int, float) else f"is {_name(v)}, not a number"


def _optional(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def _time(v):
    if type(v) is not str:
        return f"is {_name(v)}, not an ISO date-time"
    try:
        datetime.fromisoformat(v)
    except ValueError:
        return f"{v[:40]!r} is not an ISO date-time"
    return None


def _text_map(v):
    if type(v) is not dict:
        return f"is {_name(v)}, not an object of text"
    for k, x in v.items():
        if type(x) is not str:
            return f"has {k[:40]!r} = {_name(x)}, not text"
    return None


def _object(v):
    return None if type(v) is dict else f"is {_name(v)}, not an object"


def _list(v):
    return None if type(v) is list else f"is {_name(v)}, not a list"


def _text_or_blob(v):
    if type(v) is str:
        return None
    if type(v) is dict and "$blob" in v:
        digest, size = v.get("$blob"), v.get("size")
        if type(digest) is not str or not _HEX64.match(digest):
            return "refers to a blob whose digest is not 64 hex digits"
        if size is not None and not is_int(size, 0):
            return f"refers to a blob whose size is {_name(size)}, not a count"
        return None
    return f"is {_name(v)}, not text or a blob reference"


def _reused(v):
    if type(v) is not dict or not is_int(v.get("run"), 1) or type(v.get("site")) is not str:
        return "is not {run, site}: the run and site whose answer was taken"
    return None


def _rng(v):
    if type(v) is not list or len(v) != 3 or not all(x is None or type(x) is int for x in v):
        return "is not a list of three integers (seed, step, position)"
    return None


def _topk(v):
    if type(v) is not list:
        return f"is {_name(v)}, not a list of [token id, logprob] pairs"
    for pair in v:
        if type(pair) is not list or len(pair) != 2 or not is_int(pair[0], 0) or _number(pair[1]):
            return "holds an entry that is not a [token id, logprob] pair"
    return None


def _batch(v):
    if type(v) is not list or len(v) != 2 or not is_int(v[0], 0) or type(v[1]) is not list \
            or not all(is_int(r, 0) for r in v[1]):
        return "is not [rows in the pass, [this sequence's rows]]"
    return None


# kind -> ({field: check}, required fields). Fields not named are not checked.
RULES: dict[str, tuple[dict[str, Check], tuple[str, ...]]] = {
    "clock": ({"t": _time}, ("t",)),
    "tool": ({
        "cmd": _text, "cwd": _text, "exports": _text_map, "env": _text_map,
        "stdout": _optional(_text_or_blob), "stderr": _optional(_text_or_blob),
        "exit_code": _optional(_int), "duration_ms": _optional(_number),
        "stdout_size": _optional(_count), "stderr_size": _optional(_count), "truncated": _bool,
        "limit_hit": _optional(_text), "tree_before": _optional(_text), "tree_after": _optional(_text), "snapshot": _optional(_text),
        "cwd_after": _text, "exports_after": _text_map, "mutated": _bool, "off_record": _bool,
        "reused_from": _reused, "function": _text, "args": _list, "kwargs": _object, "error": _optional(_object),  # an SDK tool call
        "call_id": _optional(_text), "span": _object,  # an imported trace's tool call
    }, ()),
    "token": ({
        "id": _count, "text": _text, "forced": _bool, "logprob": _optional(_number), "rng": _rng,
        "mutated": _bool,
    }, ("id",)),
    "logits": ({"digest": _text, "topk": _topk, "batch": _batch, "mode": _text}, ("digest",)),
    "action": ({"cmd": _text, "done": _bool}, ()),
    "message": ({"text": _text, "input": _list, "sampling": _object, "missing": _list, "span": _object},  # the last four: an imported trace's
                ("text",)),
    "prompt": ({"ids_digest": _text, "n_tokens": _count}, ()),
    "setup": ({"task": _text, "clock": _time, "tree": _optional(_text), "snapshot": _optional(_text),
               "exports": _text_map, "mutated": _optional(_text)}, ()),
    "outcome": ({
        "passed": _bool, "checker_exit": _int, "checker_output": _text, "tree": _optional(_text),
        "clock": _time, "reason": _text,
    }, ()),
}


def check(kind: str, value: Any) -> str | None:
    """What is wrong with `value` as a value of `kind`, or None: its fields and its depth
    (for a value from anywhere: an edit, a user's text)."""
    return check_fields(kind, value) or depth_problem(value)


def check_fields(kind: str, value: Any) -> str | None:
    """What is wrong with the fields of `value` as a value of `kind`, or None; its depth is
    not measured (decode_value's values are bounded already)."""
    rule = RULES.get(kind)
    if rule is None:
        return None
    fields, required = rule
    if type(value) is not dict:
        return f"a {kind} value must be an object, not {_name(value)}"
    for name in required:
        if name not in value:
            return f"a {kind} value must have {name!r}"
    for name, field_check in fields.items():
        if name in value:
            wrong = field_check(value[name])
            if wrong:
                return f"{kind} field {name!r} {wrong}"
    return None


# ---------------------------------------------------------------------------- run metadata
_OBJECT_COLUMNS = ("sampling", "fingerprint", "meta")
_SAMPLING = {"temperature": _number, "top_p": _number, "top_k": _count}
_META = {"clock": _time, "limits": lambda v: _object(v) or next(
    (f"has {k[:40]!r} = {_name(x)}, not a count" for k, x in v.items() if not is_int(x, 1)), None)}


def check_run_fields(fields: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The columns of a runs row, decoded and checked: (safe fields, problems).

    A column of the wrong type is replaced by a safe value (None, or {} for the JSON
    objects) and named in the problems, so that the run can still be listed."""
    out = dict(fields)
    problems: list[str] = []

    def bad(name: str, what: str, safe: Any) -> None:
        problems.append(f"its {name} {what}")
        out[name] = safe

    for name in ("task", "model_id", "kernel_mode", "fork_site", "finished"):
        v = fields[name]
        if v is not None and type(v) is not str:
            bad(name, f"is {_sql_type(v)}, not text", None)
    if type(fields.get("name")) is not str:
        out["name"] = None  # a name is only shown: one that is not text is left out, and the run still replays
    if type(fields["created"]) is not str:
        bad("created", f"is {_sql_type(fields['created'])}, not text", "")
    if type(fields["status"]) is not str:
        bad("status", f"is {_sql_type(fields['status'])}, not text", "unknown")
    for name in ("seed", "parent"):
        v = fields[name]
        if v is not None and not is_int(v):
            bad(name, f"is {_sql_type(v)}, not an integer", None)
    v = fields["fork_seq"]
    if v is not None and not is_int(v, 0, 2**32):
        bad("fork_seq", f"is {_sql_type(v) if type(v) is not int else v}, not a seq", None)
    for name in (*_OBJECT_COLUMNS, "outcome", "mutation"):
        raw = fields[name]
        if raw is None:
            out[name] = {} if name in _OBJECT_COLUMNS else None
            continue
        try:
            value = load_json(raw, "JSON")
        except ValueProblem as exc:
            bad(name, f"cannot be read ({exc})", {} if name in _OBJECT_COLUMNS else None)
            continue
        if name in _OBJECT_COLUMNS and type(value) is not dict:
            bad(name, f"is {_name(value)}, not an object", {})
            continue
        out[name] = value
    for name, rule in (("sampling", _SAMPLING), ("meta", _META)):
        for key, field_check in rule.items():
            if key in out[name]:
                wrong = field_check(out[name][key])
                if wrong:
                    problems.append(f"its {name} field {key!r} {wrong}")
                    out[name] = {k: x for k, x in out[name].items() if k != key}
    return out, problems
