"""Proxy mode for an upstream that speaks Anthropic's Messages API (`tttr serve --upstream URL
--upstream-format anthropic`; a URL on anthropic.com is detected).

A client's `POST /v1/messages` is sent on as it came (less `seed`, which Anthropic refuses; with
`x-api-key` and `anthropic-version`), and the upstream's message, or its stream relayed event by
event, is what the client gets, with the `tttr` extension (the seed the call is recorded with).
The call is recorded at the token layer as the chat call the request means
(engine/serve/messages_api.py), exactly as a proxied OpenAI call is (engine/serve/proxy.py):
`S:prompt` holds that chat body as the request (so that a replay, which translates the same
way, matches it) and the Messages body as `sent`; `S:message` the text, the tool calls (a
tool_use block's input as arguments), the finish reason in chat terms and the usage. Anthropic
reports no per-token logprobs, so the tokens are the text retokenized locally
(`"id_source": "retokenized"`). OpenAI's routes are refused with a line that says to send
Messages; `count_tokens` is forwarded."""

from __future__ import annotations

import json
import secrets
import time
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tttr.engine.serve import messages_api
from tttr.engine.serve.errors import APIError
from tttr.engine.serve.httpio import events, run_name
from tttr.engine.serve.modes import Proxied
from tttr.engine.serve.proxy import Plan, ProxiedCall, Upstream
from tttr.engine.serve.requests import SEED_LIMIT

ANTHROPIC_VERSION = "2023-06-01"
FORMATS = ("openai", "anthropic")
# A Messages stop_reason in chat terms (what the recording's finish_reason says).
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
          "pause_turn": "stop", "refusal": "content_filter"}


def upstream_format(url: str, given: str | None) -> str:
    """The wire format of the upstream at `url`: `given`, else "anthropic" for a host on
    anthropic.com, else "openai"."""
    if given is not None:
        return given
    host = (urlsplit(url.strip()).hostname or "").lower()
    return "anthropic" if host == "anthropic.com" or host.endswith(".anthropic.com") else "openai"


class AnthropicUpstream(Upstream):
    """An upstream Messages API (its root, e.g. https://api.anthropic.com: `/v1` is added),
    with the local tokenizer that gives recorded tokens their ids."""

    def _http(self):
        if self._client is None:
            from tttr.engine.serve.proxy import httpx

            headers = {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": self._key} if self._key else {})}
            self._client = httpx.AsyncClient(base_url=self.url, headers=headers,
                                             timeout=httpx.Timeout(self.timeout, connect=10.0))
        return self._client

    async def models(self) -> dict:
        listed = (await self._send("GET", "/models")).json()
        return {"object": "list", "data": [{"id": m.get("id"), "object": "model", "created": 0, "owned_by": "anthropic"}
                                           for m in listed.get("data") or [] if isinstance(m, dict)]}

    async def message(self, sent: dict) -> dict:
        response = await self._send("POST", "/messages", sent)
        try:
            return response.json()
        except ValueError:
            raise APIError(f"the upstream {self.shown} answered with a body that is not JSON", status=502,
                           code="upstream_error") from None

    async def open_messages(self, sent: dict):
        """The upstream's streamed answer, its status checked (APIError if it failed)."""
        return await self._send("POST", "/messages", sent, stream=True)

    async def count_tokens(self, body: dict) -> int:
        counted = (await self._send("POST", "/messages/count_tokens", body)).json()
        if type(counted.get("input_tokens")) is not int:
            raise APIError(f"the upstream {self.shown} answered count_tokens without input_tokens", status=502,
                           code="upstream_error")
        return counted["input_tokens"]


def add_message(call: ProxiedCall, message: dict) -> None:
    """A whole Messages answer into the chat-shaped call the recorder writes."""
    call.response_id = message.get("id") or call.response_id
    call.model = message.get("model") or call.model
    for block in message.get("content") or []:
        if block.get("type") == "text":
            call.text += block.get("text") or ""
        elif block.get("type") == "tool_use":
            call.tool_calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"), "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}})
    _finish(call, message.get("stop_reason"), message.get("usage"), message.get("stop_sequence"))


def _finish(call: ProxiedCall, stop_reason: str | None, usage: dict | None, stop_sequence: object = None) -> None:
    if stop_reason is not None:
        call.finish_reason = FINISH.get(stop_reason, stop_reason)
    if isinstance(stop_sequence, str):
        call.stop_sequence = stop_sequence
    if isinstance(usage, dict):
        before = call.usage or {}
        prompt = usage.get("input_tokens", before.get("prompt_tokens", 0)) or 0
        completion = usage.get("output_tokens", before.get("completion_tokens", 0)) or 0
        call.usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def add_event(call: ProxiedCall, event: dict, arguments: dict[int, str]) -> None:
    """One streamed event into the call (`arguments`: each tool_use block's JSON so far, by index)."""
    kind = event.get("type")
    if kind == "message_start":
        message = event.get("message") or {}
        call.response_id = message.get("id") or call.response_id
        call.model = message.get("model") or call.model
        _finish(call, None, message.get("usage"))
    elif kind == "content_block_start":
        block = event.get("content_block") or {}
        if block.get("type") == "tool_use":
            arguments[event.get("index", 0)] = ""
            call.tool_calls.append({"id": block.get("id"), "type": "function",
                                    "function": {"name": block.get("name"), "arguments": ""}})
    elif kind == "content_block_delta":
        delta = event.get("delta") or {}
        if delta.get("type") == "text_delta":
            call.text += delta.get("text") or ""
        elif delta.get("type") == "input_json_delta" and event.get("index", 0) in arguments:
            arguments[event["index"]] += delta.get("partial_json") or ""
            call.tool_calls[list(arguments).index(event["index"])]["function"]["arguments"] = arguments[event["index"]]
    elif kind == "message_delta":
        delta = event.get("delta") or {}
        _finish(call, delta.get("stop_reason"), event.get("usage"), delta.get("stop_sequence"))


class ProxiedMessages(Proxied):
    """Mode (engine/serve/modes.py): an upstream Messages API answers (loading, models and
    the rest as any proxied upstream's; the routes its wire format changes, here)."""

    upstream: AnthropicUpstream

    def health(self) -> tuple[dict, int]:
        return {"status": "ok", "mode": "proxy", "format": "anthropic", "upstream": self.upstream.shown}, 200

    async def count_tokens(self, body: object) -> int:
        messages_api.to_chat(body, counting=True)  # refused here as it would be by the engine
        return await self.upstream.count_tokens(body)

    async def answer(self, server, request: Request, endpoint: str, body: object = None) -> Response:
        from tttr.engine.serve.httpio import error_response

        return error_response(APIError(f"the upstream {self.upstream.shown} speaks Anthropic's Messages API: send "
                                       "POST /v1/messages (the `anthropic` client), or start the proxy with "
                                       "--upstream-format openai for an OpenAI-compatible upstream",
                                       code="unsupported"))

    async def messages(self, server, request: Request, body: object) -> Response:
        try:
            name = run_name(request)
            chat = messages_api.to_chat(body)  # checked as for the engine, and what the recording holds
            seed = chat.get("seed")
            drawn = seed is None
            if drawn:
                seed = secrets.randbelow(SEED_LIMIT)
            elif type(seed) is not int or not 0 <= seed < SEED_LIMIT:
                raise APIError(f"seed must be an integer in 0..{SEED_LIMIT - 1}, not {seed!r}", code="invalid_value")
            sent = {k: v for k, v in body.items() if k != "seed"}  # Anthropic refuses what it does not know
            plan = Plan("chat", chat, sent, seed, drawn, bool(chat.get("stream")), False, False)
            started = time.perf_counter()
            if plan.stream:
                response = await self.upstream.open_messages(sent)
            else:
                answer = await self.upstream.message(sent)
        except APIError as exc:
            return JSONResponse(messages_api.error_of(exc), status_code=exc.status)
        call = ProxiedCall(plan, name, self.upstream, started=started)
        tttr = {"seed": seed, "seed_drawn": drawn}
        if plan.stream:
            return events(self._relay(server.recorder, call, response, tttr))
        add_message(call, answer)
        if server.recorder is not None:
            server.recorder.record_proxied(call)
        return JSONResponse({**answer, "tttr": tttr})

    async def _relay(self, recorder, call: ProxiedCall, response, tttr: dict):
        """The upstream's events, passed on as they come; the call recorded when the stream
        ends (cut off: finish_reason "cancelled")."""
        done = False
        arguments: dict[int, str] = {}
        chunks = self.upstream.chunks(response)
        try:
            async for event in chunks:
                add_event(call, event, arguments)
                if event.get("type") == "message_start" and isinstance(event.get("message"), dict):
                    event = {**event, "message": {**event["message"], "tttr": tttr}}
                yield {"event": str(event.get("type")), "data": json.dumps(event, ensure_ascii=False)}
            done = True
        except Exception as exc:  # noqa: BLE001 - the upstream broke off: say so in the stream
            call.finish_reason = "error"
            message = f"the upstream {self.upstream.shown} broke off the stream: {type(exc).__name__}: {exc}"
            yield {"event": "error", "data": json.dumps(messages_api.error_json(message, 502))}
        finally:
            await chunks.aclose()
            if not done and call.finish_reason != "error":
                call.finish_reason = "cancelled"
            if recorder is not None:
                recorder.record_proxied(call)
