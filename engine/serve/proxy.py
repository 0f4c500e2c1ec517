"""Proxy mode: forward OpenAI calls to another OpenAI-compatible server and record them at
the token layer.

`Upstream` sends a call's body on (with a seed drawn when it had none, and logprobs asked
for so that they can be recorded; the client still gets only what it asked for), maps the
upstream's failures to OpenAI's error shape (502 unreachable or 5xx, 504 timed out, 4xx
passed through), and turns the answer — whole or streamed — into a `ProxiedCall`, which
the recorder writes. No tensor is seen, so no `logits` event is written: the run's meta says
`"tensor": "not recorded"` and names the upstream.

Token ids: the upstream reports text, not ids. Each position's id is the local model's
token with exactly the bytes the upstream reports (`"id_source": "vocab"`; exact when the
upstream serves the same model), else 0 (`"id_source": "none"`). Where the upstream gives
no per-token logprobs, the text is tokenized locally (`"id_source": "retokenized"`,
`logprob` null). The API key is sent in a header and never recorded."""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

try:  # the HTTP client the `openai` package is built on (httpx2 where it has moved to it)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed openai
    import httpx

from tttr.engine.serve.errors import APIError
from tttr.engine.serve.requests import SEED_LIMIT
from tttr.engine.serve.tools import merge_tool_call
from tttr.sessions.records import token_value

ASKED_TOP_LOGPROBS = 5  # alternatives asked for per position when the client asked for none
ENDPOINTS = {"chat": "/chat/completions", "completion": "/completions"}


def base_url(url: str) -> str:
    """The upstream's API root, as the openai client's base_url: `http://host:8000` means
    `http://host:8000/v1`."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise APIError(f"--upstream {url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8001/v1")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def shown_url(url: str) -> str:
    """The URL as recorded: without any user:password part."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass(frozen=True, slots=True)
class UpstreamToken:
    text: str
    logprob: float | None
    bytes: tuple[int, ...] | None
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """A call as it goes upstream."""

    endpoint: str  # "chat" | "completion"
    request: dict  # the body as received
    sent: dict  # the body as sent upstream
    seed: int
    seed_drawn: bool
    stream: bool
    client_logprobs: bool  # the client asked for logprobs itself
    client_usage: bool  # the client asked for a usage chunk


@dataclass(slots=True)
class ProxiedCall:
    """Everything recorded of one proxied call (built from the answer as it arrives)."""

    plan: Plan
    name: str | None
    upstream: "Upstream"
    response_id: str = ""
    model: str | None = None
    system_fingerprint: str | None = None
    text: str = ""
    finish_reason: str | None = None
    tokens: list[UpstreamToken] = field(default_factory=list)
    tool_calls: list[dict] = field(default_factory=list)
    usage: dict | None = None
    stop_sequence: str | None = None  # an Anthropic upstream's: the stop string that ended the text
    started: float | None = None  # perf_counter when it was sent upstream, and when its answer ended (issue 29)
    ended: float | None = None

    # -- building ------------------------------------------------------------------------
    def _head(self, obj: dict) -> None:
        self.response_id = obj.get("id") or self.response_id
        self.model = obj.get("model") or self.model
        self.system_fingerprint = obj.get("system_fingerprint") or self.system_fingerprint
        if obj.get("usage"):
            self.usage = obj["usage"]

    def add_response(self, obj: dict) -> None:
        self._head(obj)
        choice = (obj.get("choices") or [{}])[0]
        self.finish_reason = choice.get("finish_reason")
        if self.plan.endpoint == "chat":
            message = choice.get("message") or {}
            self.text = message.get("content") or ""
            self.tool_calls = list(message.get("tool_calls") or [])
        else:
            self.text = choice.get("text") or ""
        self.tokens = _tokens(choice.get("logprobs"))

    def add_chunk(self, obj: dict) -> None:
        self._head(obj)
        for choice in obj.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            self.tokens += _tokens(choice.get("logprobs"))
            if self.plan.endpoint != "chat":
                self.text += choice.get("text") or ""
                continue
            delta = choice.get("delta") or {}
            self.text += delta.get("content") or ""
            for part in delta.get("tool_calls") or []:
                merge_tool_call(self.tool_calls, part)

    # -- recording -----------------------------------------------------------------------
    def token_values(self) -> list[dict]:
        """The `token` events' values, position by position (see the module's docstring)."""
        seed = self.plan.seed
        tok = self.upstream.tokenizer()
        out = []
        if self.tokens:
            table = self.upstream.vocab_by_bytes()
            for p, t in enumerate(self.tokens):
                raw = bytes(t.bytes) if t.bytes is not None else t.text.encode("utf-8")
                token_id = table.get(raw)
                value = token_value(token_id if token_id is not None else 0, t.text, False, t.logprob, [seed, 0, p],
                                    upstream=True, id_source="vocab" if token_id is not None else "none")
                if t.bytes is not None:
                    value["bytes"] = list(t.bytes)
                if t.top:
                    value["top_logprobs"] = [[text, lp] for text, lp in t.top]
                out.append(value)
        elif tok is not None and self.text:
            for p, token_id in enumerate(tok.encode(self.text)):
                out.append(token_value(token_id, tok.token_text(token_id), False, None, [seed, 0, p],
                                       upstream=True, id_source="retokenized"))
        return out

    def served_by(self) -> dict:
        up = self.upstream
        return {"upstream": up.shown, "model": self.model, "system_fingerprint": self.system_fingerprint,
                "same_model": self.model is not None and self.model in up.local_names()}


def _tokens(logprobs: dict | None) -> list[UpstreamToken]:
    if not logprobs:
        return []
    if logprobs.get("content") is not None:  # chat
        return [UpstreamToken(e.get("token", ""), e.get("logprob"), tuple(e["bytes"]) if e.get("bytes") is not None else None,
                              tuple((a.get("token", ""), a.get("logprob")) for a in e.get("top_logprobs") or []))
                for e in logprobs["content"]]
    tokens = logprobs.get("tokens") or []  # legacy completions
    lps = logprobs.get("token_logprobs") or [None] * len(tokens)
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    return [UpstreamToken(t, lp, None, tuple((top or {}).items())) for t, lp, top in zip(tokens, lps, tops)]


class Upstream:
    """Another OpenAI-compatible server that answers the calls (and the local model's
    tokenizer, loaded in the background, that gives recorded tokens their ids)."""

    def __init__(self, url: str, *, key: str | None = None, model: str | None = None, timeout: float = 600.0):
        from tttr.engine.inference.loader import resolve_model_path
        from tttr.engine.inference.model_id import model_id as compute_model_id

        self.url = base_url(url)
        self.shown = shown_url(self.url)
        self._key = key
        self.timeout = timeout
        self.path = resolve_model_path(model)
        self.model_id = compute_model_id(self.path, self.path.stem)
        self._tokenizer = None
        self._vocab: dict[bytes, int] | None = None
        self._loaded = threading.Event()
        self._client = None

    def __repr__(self) -> str:  # never shows the key
        return f"Upstream({self.shown!r})"

    # -- the local tokenizer ---------------------------------------------------------------
    def load(self) -> None:
        try:
            from tttr.engine.inference.loader import load_checkpoint

            self._tokenizer = load_checkpoint(self.path).tokenizer
        finally:
            self._loaded.set()

    def tokenizer(self):
        """The local tokenizer once loaded (waits), or None if it could not be loaded."""
        self._loaded.wait()
        return self._tokenizer

    def vocab_by_bytes(self) -> dict[bytes, int]:
        if self._vocab is None:
            from tttr.engine.serve.responses import token_bytes

            tok = self.tokenizer()
            table: dict[bytes, int] = {}
            if tok is not None:
                for i in reversed(range(tok.vocab_size)):  # the lowest id wins a tie
                    table[bytes(token_bytes(tok, i))] = i
            self._vocab = table
        return self._vocab

    def local_names(self) -> set[str]:
        return {self.model_id, self.path.stem, self.path.name}

    # -- calls -----------------------------------------------------------------------------
    def plan(self, endpoint: str, body: object) -> Plan:
        """What to send upstream for this body: the body, plus a seed when it has none and
        logprobs (recorded, not shown to a client that did not ask)."""
        if not isinstance(body, dict):
            raise APIError(f"the request body must be a JSON object, not {type(body).__name__}", code="invalid_value")
        sent = dict(body)
        seed = body.get("seed")
        drawn = seed is None
        if drawn:
            seed = secrets.randbelow(SEED_LIMIT)
            sent["seed"] = seed
        elif type(seed) is not int or not 0 <= seed < SEED_LIMIT:
            raise APIError(f"seed must be an integer in 0..{SEED_LIMIT - 1}, not {seed!r}", param="seed",
                           code="invalid_value")
        stream = bool(body.get("stream"))
        if endpoint == "chat":
            client_logprobs = bool(body.get("logprobs"))
            if not client_logprobs and "logprobs" not in body:
                sent["logprobs"], sent["top_logprobs"] = True, ASKED_TOP_LOGPROBS
        else:
            client_logprobs = body.get("logprobs") is not None
            if not client_logprobs:
                sent["logprobs"] = ASKED_TOP_LOGPROBS
        options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
        client_usage = bool(options.get("include_usage"))
        if stream:
            sent["stream_options"] = {**options, "include_usage": True}
        return Plan(endpoint, body, sent, seed, drawn, stream, client_logprobs, client_usage)

    def _http(self):
        if self._client is None:
            headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
            self._client = httpx.AsyncClient(base_url=self.url, headers=headers,
                                             timeout=httpx.Timeout(self.timeout, connect=10.0))
        return self._client

    async def models(self) -> dict:
        response = await self._send("GET", "/models")
        return response.json()

    async def complete(self, plan: Plan) -> dict:
        response = await self._send("POST", ENDPOINTS[plan.endpoint], plan.sent)
        try:
            return response.json()
        except ValueError:
            raise APIError(f"the upstream {self.shown} answered with a body that is not JSON", status=502,
                           code="upstream_error") from None

    async def open_stream(self, plan: Plan):
        """The upstream's streamed response, its status checked (APIError if it failed)."""
        return await self._send("POST", ENDPOINTS[plan.endpoint], plan.sent, stream=True)

    @staticmethod
    async def chunks(response) -> AsyncIterator[dict]:
        """The JSON chunks of a server-sent event stream, until `[DONE]`."""
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    yield json.loads(data)
                except ValueError:
                    continue
        finally:
            await response.aclose()

    async def _send(self, method: str, path: str, body: dict | None = None, *, stream: bool = False):
        client = self._http()
        try:
            request = client.build_request(method, path, json=body)
            response = await client.send(request, stream=stream)
        except httpx.TimeoutException as exc:
            raise APIError(f"the upstream {self.shown} did not answer in time ({type(exc).__name__})", status=504,
                           code="upstream_timeout") from None
        except httpx.HTTPError as exc:
            raise APIError(f"the upstream {self.shown} cannot be reached: {type(exc).__name__}: {exc}; is it "
                           "running, and is --upstream right?", status=502, code="upstream_unreachable") from None
        if response.status_code < 400:
            return response
        raw = await response.aread()
        await response.aclose()
        raise _upstream_error(self.shown, response.status_code, raw)


def _upstream_error(shown: str, status: int, raw: bytes) -> APIError:
    """A 4xx passes through as the upstream said it; a 5xx is a 502 that quotes it."""
    try:
        err = json.loads(raw).get("error") or {}
        if not isinstance(err, dict):
            err = {"message": str(err)}
    except (ValueError, AttributeError):
        err = {"message": raw.decode("utf-8", "replace")[:500]}
    message = err.get("message") or f"HTTP {status}"
    if status < 500:
        return APIError(message, status=status, param=err.get("param"), code=err.get("code"), type=err.get("type"))
    return APIError(f"the upstream {shown} failed with HTTP {status}: {message}", status=502, code="upstream_error")


def for_client(plan: Plan, obj: dict) -> dict:
    """The upstream's response or chunk as the client gets it: without the logprobs or the
    usage chunk the proxy asked for itself, with the `tttr` extension (the seed)."""
    obj = dict(obj)
    if not plan.client_logprobs:
        obj["choices"] = [{**c, "logprobs": None} for c in obj.get("choices") or []]
    if plan.stream and not plan.client_usage:
        obj.pop("usage", None)
    obj["tttr"] = {"seed": plan.seed, "seed_drawn": plan.seed_drawn}
    return obj


def is_usage_only(plan: Plan, obj: dict) -> bool:
    """A streamed usage chunk (no choices) the client did not ask for."""
    return plan.stream and not plan.client_usage and not obj.get("choices")
