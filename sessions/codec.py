"""How an event's site and value are stored, compactly.

A recorded run is mostly `token` and `logits` events, one of each per generated position,
so their size and the cost of encoding them decide the store's size and speed.

Sites: the canonical site of an event is `<step>:<kind>` or `<step>:<kind>:<pos>`. Such a
site is stored as nothing but `pos` (an integer, or NULL); any other site is stored verbatim.

Values are JSON. Two kinds have a fixed binary record, used only when the value has
exactly the shape of the contract (keys in that order, types exact) so that decoding
gives back an equal value; anything else is stored as compact JSON text. A record's first
byte names its format, so a format is never reinterpreted once written.

  token  {"id", "text", "forced", "logprob", "rng": [seed, step, pos]}
         <B tag=1> <B flags> <I id> <f logprob | d if it is not exact in float32>
         [<qqq rng> unless rng == [run seed, step, pos]] <text as UTF-8 to the end>
  logits {"digest": hex, "topk": [[id, lp], ...], "batch": [rows, [row, ...]], "mode"}
         <B tag=2> <B flags> <B digest bytes> digest <B k> k x <I id><f|d lp>
         <H rows> <H n> n x <H row>

Logprobs come out of float32 tensors, so storing them as float32 is exact; a value that
is not exactly a float32 keeps 8 bytes.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from tttr.sessions.vocabulary import site as make_site
from tttr.sessions.vocabulary import site_parts

TOKEN_TAG = 1
LOGITS_TAG = 2
TOKEN_KEYS = ("id", "text", "forced", "logprob", "rng")
LOGITS_KEYS = ("digest", "topk", "batch", "mode")
MODES = ("fast", "invariant", "invariant-q8")  # kernels.mode.MODES (sessions imports nothing above it)

_F_FORCED = 1  # token: sampled or forced
_F_F64 = 2  # logprob(s) need 8 bytes
_F_RNG = 4  # token: rng stored, not derived
_F_INVARIANT = 8  # logits: mode
_F_Q8 = 16  # logits: mode invariant-q8 (alone: a reader that predates it decodes the record as "fast", never as "invariant")
_MODE_FLAGS = {"fast": 0, "invariant": _F_INVARIANT, "invariant-q8": _F_Q8}

_TOKEN32 = struct.Struct("<BBIf")
_TOKEN64 = struct.Struct("<BBId")
_RNG = struct.Struct("<qqq")
_F32 = struct.Struct("<f")
_HEAD = struct.Struct("<BBB")
_U16 = struct.Struct("<H")
_U16x2 = struct.Struct("<HH")


# ---------------------------------------------------------------------------- sites
def split_site(site: str, step: int, kind: str) -> tuple[int | None, str | None]:
    """(pos, verbatim site or None) to store for `site`: nothing but the position when the
    site is the one `vocabulary.site` writes for this step and kind."""
    prefix = f"{step}:{kind}:"  # the usual case, a position of this step, without a full parse
    if site.startswith(prefix):
        tail = site[len(prefix):]
        if tail.isascii() and tail.isdigit() and (tail == "0" or tail[0] != "0"):
            return int(tail), None
    parts = site_parts(site)
    if parts is not None and parts[0] == step and parts[1] == kind:
        return parts[2], None
    return None, site


def join_site(step: int, kind: str, pos: int | None, stored: str | None) -> str:
    return stored if stored is not None else make_site(step, kind, pos)


# ---------------------------------------------------------------------------- values
def _f32_exact(x: float) -> bool:
    try:
        return _F32.unpack(_F32.pack(x))[0] == x
    except OverflowError:
        return False


def _json(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except TypeError as exc:
        raise ValueError(f"value is not JSON: {exc}") from None


def encode(kind: str, value: Any, seed: int | None, step: int, pos: int | None) -> str | bytes:
    """The stored form of `value`: bytes for a binary record, str for JSON text."""
    if kind == "token" and type(value) is dict:
        record = _encode_token(value, seed, step, pos)
    elif kind == "logits" and type(value) is dict:
        record = _encode_logits(value)
    else:
        record = None
    if record is not None:
        return record
    text = _json(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: escape them rather than fail
        text = json.dumps(value, separators=(",", ":"))
    return text


def decode(stored: str | bytes, seed: int | None, step: int, pos: int | None) -> Any:
    if isinstance(stored, str):
        return json.loads(stored)
    tag = stored[0]
    if tag == TOKEN_TAG:
        return _decode_token(stored, seed, step, pos)
    if tag == LOGITS_TAG:
        return _decode_logits(stored)
    raise ValueError(f"unknown value record format {tag}; this database needs a newer tttr")


def peek(stored: Any) -> tuple[str, Any] | None:
    """("token", id) or ("logits", digest hex) read straight from a binary record's bytes,
    without decoding or checking the rest: for readers that compare long runs quickly (a
    token's id is the uint32 at byte 2; a logits record's digest follows its length at byte
    2). None for anything else (JSON, another tag, a record too short to hold the field)."""
    if type(stored) is not bytes or len(stored) < 4:
        return None
    if stored[0] == TOKEN_TAG and len(stored) >= 10:  # tag, flags, uint32 id, float32 logprob
        return "token", int.from_bytes(stored[2:6], "little")
    if stored[0] == LOGITS_TAG and len(stored) > 3 + stored[2]:
        return "logits", stored[3:3 + stored[2]].hex()
    return None


def _encode_token(v: dict, seed: int | None, step: int, pos: int | None) -> bytes | None:
    if tuple(v) != TOKEN_KEYS:
        return None
    tid, text, forced, lp, rng = v.values()  # in TOKEN_KEYS order, checked above
    if not (type(tid) is int and type(text) is str and type(forced) is bool and type(lp) is float
            and type(rng) in (list, tuple) and len(rng) == 3):
        return None
    r0, r1, r2 = rng
    if not (type(r0) is int and type(r1) is int and type(r2) is int):
        return None
    flags = _F_FORCED if forced else 0
    if not _f32_exact(lp):
        flags |= _F_F64
    try:
        if r0 == seed and r1 == step and r2 == pos:
            extra = b""
        else:
            flags |= _F_RNG
            extra = _RNG.pack(r0, r1, r2)
        head = (_TOKEN64 if flags & _F_F64 else _TOKEN32).pack(TOKEN_TAG, flags, tid, lp)
        return head + extra + text.encode("utf-8")
    except (struct.error, UnicodeEncodeError):  # out-of-range ints, lone surrogates: JSON keeps them
        return None


def _decode_token(b: bytes, seed: int | None, step: int, pos: int | None) -> dict:
    flags = b[1]
    if flags & _F_F64:
        _, _, tid, lp = _TOKEN64.unpack_from(b)
        at = _TOKEN64.size
    else:
        _, _, tid, lp = _TOKEN32.unpack_from(b)
        at = _TOKEN32.size
    if flags & _F_RNG:
        rng = list(_RNG.unpack_from(b, at))
        at += _RNG.size
    else:
        rng = [seed, step, pos]
    return {"id": tid, "text": b[at:].decode("utf-8"), "forced": bool(flags & _F_FORCED), "logprob": lp, "rng": rng}


def _encode_logits(v: dict) -> bytes | None:
    if tuple(v) != LOGITS_KEYS:
        return None
    digest, topk, batch, mode = v["digest"], v["topk"], v["batch"], v["mode"]
    if type(digest) is not str or len(digest) % 2 or len(digest) > 510 or mode not in MODES:
        return None
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        return None
    if raw.hex() != digest:  # upper case or spaces would not come back equal
        return None
    if type(topk) not in (list, tuple) or len(topk) > 255:
        return None
    flat: list = []
    for pair in topk:
        if type(pair) not in (list, tuple) or len(pair) != 2:
            return None
        tid, lp = pair
        if type(tid) is not int or not 0 <= tid < 1 << 32 or type(lp) is not float:
            return None
        flat += (tid, lp)
    if type(batch) not in (list, tuple) or len(batch) != 2:
        return None
    rows_in_pass, rows = batch
    if type(rows_in_pass) is not int or not 0 <= rows_in_pass < 1 << 16 or type(rows) not in (list, tuple):
        return None
    if len(rows) >= 1 << 16 or not all(type(r) is int and 0 <= r < 1 << 16 for r in rows):
        return None
    wide = not all(_f32_exact(x) for x in flat[1::2])
    flags = (_F_F64 if wide else 0) | _MODE_FLAGS[mode]
    pairs = struct.pack("<" + ("Id" if wide else "If") * len(topk), *flat)
    tail = _U16x2.pack(rows_in_pass, len(rows)) + struct.pack(f"<{len(rows)}H", *rows)
    return _HEAD.pack(LOGITS_TAG, flags, len(raw)) + raw + bytes((len(topk),)) + pairs + tail


def _decode_logits(b: bytes) -> dict:
    _, flags, n = _HEAD.unpack_from(b)
    at = _HEAD.size
    digest = b[at : at + n].hex()
    at += n
    k = b[at]
    at += 1
    fmt = "<" + ("Id" if flags & _F_F64 else "If") * k
    flat = struct.unpack_from(fmt, b, at)
    at += struct.calcsize(fmt)
    rows_in_pass, nrows = _U16x2.unpack_from(b, at)
    at += _U16x2.size
    rows = list(struct.unpack_from(f"<{nrows}H", b, at))
    return {
        "digest": digest,
        "topk": [[flat[i], flat[i + 1]] for i in range(0, len(flat), 2)],
        "batch": [rows_in_pass, rows],
        "mode": "invariant-q8" if flags & _F_Q8 else "invariant" if flags & _F_INVARIANT else "fast",
    }
