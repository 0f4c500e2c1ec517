"""How a replayed program's first differing model call is reported (engine/program/replay.py):
what differs, named as the program sent it, and both values.

A call that came through OpenAI's Responses API (`POST /v1/responses`) is compared as the chat
call it means (engine/serve/responses_api.py: `instructions` is message 0, then the messages
of the `input` items), but named in the program's terms: `instructions`, `input[2]`,
`max_output_tokens`. The server hands the replayer only the chat call, so the replay's endpoint
notes each Responses request's body on its way in (`noting_responses`).

Two values that differ after a long common start (a prompt whose question changed after its
task, a tool list whose last description changed) are shown from a little before their first
differing character, where a report cut to its first 60 characters would show the same text
twice."""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import dataclass
from typing import NamedTuple

from tttr.engine.replay.divergence import Divergence
from tttr.engine.serve.requests import ROUTES
from tttr.engine.serve.responses_api import RESPONSES_NAMES
from tttr.sessions.safe_text import brief

RESPONSES_ROUTE = ROUTES["responses"]
SHOWN_BEFORE = 12  # characters of the common start shown before the first difference
WIDTH = 60  # as Divergence.describe shows a value


class _Asked:
    """The body of one POST /v1/responses request, as it is read."""

    __slots__ = ("chunks",)

    def __init__(self):
        self.chunks: list[bytes] = []

    def body(self) -> dict | None:
        try:
            value = json.loads(b"".join(self.chunks))
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


_ASKED: ContextVar[_Asked | None] = ContextVar("tttr_responses_request", default=None)


def noting_responses(app):
    """ASGI `app` that notes the body of each POST /v1/responses request for `responses_body`,
    which the replayer calls while answering it (the server's thread pool carries the context)."""

    async def noted(scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") != RESPONSES_ROUTE:
            return await app(scope, receive, send)
        asked = _Asked()

        async def reading():
            message = await receive()
            if message.get("type") == "http.request":
                asked.chunks.append(message.get("body", b""))
            return message

        token = _ASKED.set(asked)
        try:
            await app(scope, reading, send)
        finally:
            _ASKED.reset(token)

    return noted


def responses_body() -> dict | None:
    """The Responses request the model call being answered came as; None for a chat or
    completion call."""
    asked = _ASKED.get()
    return asked.body() if asked is not None else None


def message_sources(body: dict) -> list[str]:
    """For each message of the chat call Responses request `body` means, the field it comes
    from: "instructions", "input", or "input[i]" (an assistant turn's several function calls
    are one message, named after its first item)."""
    from tttr.engine.serve.errors import APIError
    from tttr.engine.serve.responses_api import to_chat

    out = ["instructions"] if isinstance(body.get("instructions"), str) and body["instructions"] else []
    items = body.get("input")
    if isinstance(items, str):
        return out + ["input"]
    if not isinstance(items, list):
        return out
    before = len(out)
    for i in range(len(items)):
        try:  # the translation itself, item by item: how many messages the items so far make
            made = len(to_chat({"input": items[: i + 1]})["messages"])
        except APIError:
            continue  # none yet (a reasoning item first), or an item it refuses
        out += [f"input[{i}]"] * (made - (len(out) - before))
    return out


def in_responses_terms(what: str, recorded, live, body: dict) -> tuple[str, object, object]:
    """`what` differs (as `first_difference` names it for the chat call), named for the
    Responses request `body`; `instructions` compared as the texts themselves."""
    kind, _, name = what.partition(" ")
    if kind == "message" and name.isdigit():
        i = int(name)
        sources = message_sources(body)
        field = sources[i] if i < len(sources) else None
        if field is None:
            return f"{what} (which the request no longer sends)", recorded, live
        if field == "instructions":
            was = recorded.get("content") if isinstance(recorded, dict) and recorded.get("role") == "system" else recorded
            return "instructions", was, body["instructions"]
        return f"{field} (its chat message {i})", recorded, live
    if kind == "parameter":
        return f"parameter {RESPONSES_NAMES.get(name, name)}", recorded, live
    return what, recorded, live


class _Texts(NamedTuple):
    a: str
    b: str
    part: str  # what of the values the texts are: "" (themselves), "its content", "as JSON"


def _texts(recorded, live) -> _Texts | None:
    """Two values as the texts their difference is found in: strings as they are, two
    messages by their contents where those differ, anything else as JSON."""
    if isinstance(recorded, str) and isinstance(live, str):
        return _Texts(recorded, live, "")
    a, b = (v.get("content") if isinstance(v, dict) else None for v in (recorded, live))
    if isinstance(a, str) and isinstance(b, str) and a != b:
        return _Texts(a, b, "its content")
    try:
        return _Texts(json.dumps(recorded, default=str), json.dumps(live, default=str), "as JSON")
    except (ValueError, RecursionError):
        return None


def parted_at(recorded, live) -> tuple[int, _Texts] | None:
    """Where two values first differ (`_texts`), when it is past what a 60-character report
    of each shows; else None."""
    texts = _texts(recorded, live)
    if texts is None or texts.a == texts.b:
        return None
    at = next((i for i, (x, y) in enumerate(zip(texts.a, texts.b)) if x != y), min(len(texts.a), len(texts.b)))
    return (at, texts) if at >= WIDTH // 3 else None


@dataclass(frozen=True, slots=True)
class CallDivergence(Divergence):
    """A model call's divergence. Its report shows two values with a long common start from
    just before where they part, and its site says where (`call_divergence`); the values
    themselves, in JSON, stay whole."""

    def describe(self) -> str:
        parted = parted_at(self.a, self.b)
        if parted is None:
            return Divergence.describe(self)
        (at, texts), (first, second) = parted, self.names
        a, b = ("…" + t[at - SHOWN_BEFORE:] for t in (texts.a, texts.b))
        return f"{self.site} ({self.layer} layer): {first} {brief(a, WIDTH)}, {second} {brief(b, WIDTH)}"


def call_divergence(where: str, what: str, recorded, live, names: tuple[str, str]) -> CallDivergence:
    """The divergence of call `where` ("call 2 (step 5)") at `what` ("message 1")."""
    parted = parted_at(recorded, live)
    if parted is not None:
        at, texts = parted
        what += f", {texts.part + ' ' if texts.part else ''}from character {at}"
    return CallDivergence(f"{where}, {what}", "trace", recorded, live, names)
