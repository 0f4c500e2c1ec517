"""How `tttr serve`'s HTTP layer answers a model call: its mode, a strategy passed to the server.

One interface, `Mode`, three implementations:

- `Live`: the engine here (a `Service`): the call runs on the shared batch, its tokens are
  streamed as they come, and the recorder (with --db) writes it.
- `Proxied`: another server (a `proxy.Upstream`) answers; its answer, whole or streamed, is
  passed on and recorded at the token layer.
- `FromRecording`: a replayer answers model calls and SDK queries from a recording (a
  `tttr replay` or fork of a program); nothing is computed unless the replayer does so itself.

(A fourth, `ProxiedMessages`, an upstream that speaks Anthropic's Messages API, is in
engine/serve/proxy_anthropic.py.) The three here answer Anthropic's Messages API as the chat call
a request means (engine/serve/messages_api.py).

The server (engine/serve/server.py) owns the routes, the body's bounds, the SDK's routes and the
recorder; a mode owns what stands behind a model call: loading, /health, /v1/models, and the
answer. The engine's token callback runs on the engine's thread and only hands the token to
the event loop, so a slow client never slows the batch."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Callable, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tttr.engine.serve import messages_api
from tttr.engine.serve import responses as shape
from tttr.engine.serve.errors import APIError
from tttr.engine.serve.httpio import error_response, events, read_body, run_name, sse
from tttr.engine.serve.requests import parse_chat, parse_completion
from tttr.engine.serve.service import Call, Cancelled, Service

if TYPE_CHECKING:
    from tttr.engine.serve import proxy

PARSE = {"chat": parse_chat, "completion": parse_completion}


class Server(Protocol):
    """What a mode uses of the server that asks it: the recorder (None: nothing is recorded)
    and the bound on a request body."""

    recorder: object | None
    max_body: int


class Mode(Protocol):
    """What answers the server's model calls."""

    def needs_loading(self) -> bool:
        """True while something must load in the background before calls are answered."""

    def load(self, announce: Callable[[str], None]) -> None:
        """Load it (on the server's loader thread); say how it went through `announce`."""

    def cancel(self) -> None:
        """Cancel the calls in flight (the server is stopping); they are still recorded."""

    def close(self) -> None:
        """Release what it holds (after the recorder has written every call)."""

    def health(self) -> tuple[dict, int]:
        """GET /health's body and status."""

    async def models(self) -> dict:
        """GET /v1/models' body (APIError if it cannot be had)."""

    async def answer(self, server: Server, request: Request, endpoint: str, body: object = None) -> Response:
        """The response to a model call on `endpoint` ("chat" or "completion"); `body` is the
        request's JSON when a route read (and translated) it already, else None: read here."""

    def recorded(self, run: str | None, kind: str, value: dict) -> dict | None:
        """An SDK query's answer from a recording ("tool": a result or a command's output,
        "clock": its "t"), or None: run it live, and record what it gave."""

    async def count_tokens(self, body: object) -> int:
        """The prompt tokens of Messages request `body` (POST /v1/messages/count_tokens); APIError
        where it is refused or this mode cannot count them."""

    async def messages(self, server: Server, request: Request, body: object) -> Response:
        """The response to Anthropic Messages request `body` (POST /v1/messages), in Anthropic's shapes."""


# ---------------------------------------------------------------------------- the engine
class Live:
    """The engine in this process answers (one `Service`)."""

    def __init__(self, service: Service):
        self.service = service
        self.active: set[Call] = set()

    def needs_loading(self) -> bool:
        return not self.service.ready

    def load(self, announce) -> None:
        t0 = time.perf_counter()
        try:
            self.service.load()
        except Exception as exc:  # noqa: BLE001 - /health and every request say so
            announce(f"tttr serve: error: the model failed to load: {exc}")
            return
        announce(f"tttr serve: ready (model loaded in {time.perf_counter() - t0:.1f} s)")

    def cancel(self) -> None:
        for call in list(self.active):
            call.cancel()

    def close(self) -> None:
        self.service.close()

    def health(self) -> tuple[dict, int]:
        s = self.service
        status = "ok" if s.ready else ("error" if s.load_error else "loading")
        body = {"status": status, "model": s.model_id, "kernel_mode": s.kernel_mode, "prefix_cache": s.prefix_stats()}
        if s.load_error:
            body["error"] = s.load_error
        return body, 200 if s.ready else 503

    async def models(self) -> dict:
        return shape.models(self.service)

    def recorded(self, run, kind, value):
        return None  # live: the server records, it never answers

    async def count_tokens(self, body: object) -> int:
        chat = messages_api.to_chat(body, counting=True)
        prepared = await run_in_threadpool(self.service.prepare, parse_chat(chat))
        return len(prepared.prompt_ids)

    async def messages(self, server, request, body):
        return await messages_api.over_chat(self, server, request, body)

    async def answer(self, server: Server, request: Request, endpoint: str, body: object = None) -> Response:
        try:
            name = run_name(request)
            req = PARSE[endpoint](await read_body(request, server.max_body) if body is None else body)
            prepared = await run_in_threadpool(self.service.prepare, req)
        except APIError as exc:
            return error_response(exc)
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()

        def on_token(record) -> None:  # the engine's thread: hand over, nothing more
            loop.call_soon_threadsafe(tokens.put_nowait, record)

        try:
            call = self.service.start(prepared, on_token if req.stream else None)
        except APIError as exc:
            return error_response(exc)
        self.active.add(call)
        if req.stream:
            call.future.add_done_callback(lambda _: _post(loop, tokens, None))
        response_id = shape.new_id("chatcmpl" if endpoint == "chat" else "cmpl")
        if server.recorder is not None:
            server.recorder.record(call, name=name, response_id=response_id)
        if req.stream:
            return events(self._stream(call, tokens, response_id, endpoint))
        try:
            finished = await wait(request, call)
        finally:
            self.active.discard(call)
        if not finished:
            return JSONResponse({}, status_code=499)  # nobody is listening
        failure = _failure(call)
        if failure is not None:
            return error_response(failure)
        out = shape.output(call, self.service.tokenizer)
        make = shape.chat_response if endpoint == "chat" else shape.completion_response
        return JSONResponse(make(self.service, call, out, response_id))

    async def _stream(self, call: Call, tokens: asyncio.Queue, response_id: str, endpoint: str):
        """The SSE events of a streamed call; a client that disconnects cancels it."""
        service, tok = self.service, self.service.tokenizer
        req = call.prepared.request
        chat = endpoint == "chat"
        buffered = call.prepared.tool_format is not None  # tool calls are known only at the end
        text = shape.TextStream(tok, req.stop)
        pending: list = []  # records whose text is not sent yet
        try:
            if chat:
                yield sse(shape.chat_chunk(service, call, response_id, {"role": "assistant", "content": ""}))
            while True:
                record = await tokens.get()
                if record is None:
                    break
                if record.token_id in tok.stop_token_ids:
                    continue
                delta = text.push(record.token_id)
                pending.append(record)
                if buffered or (not delta and not req.logprobs):
                    continue
                if text.stopped and not delta:
                    continue
                yield sse(_chunk(service, call, response_id, chat, delta, pending))
                pending = []
            failure = _failure(call)
            if failure is not None:
                yield sse(failure.to_json())
                return
            out = shape.output(call, tok)
            last = text.flush()
            if chat:
                delta = {"content": out.text} if buffered and out.text else ({"content": last} if last else {})
                if out.tool_calls:
                    delta["tool_calls"] = [dict(c.to_json(f"call_{response_id[-12:]}_{i}"), index=i)
                                           for i, c in enumerate(out.tool_calls)]
                yield sse(shape.chat_chunk(service, call, response_id, delta, finish=out.finish_reason,
                                           records=pending, stop_sequence=out.stop_sequence))
            else:
                yield sse(shape.completion_chunk(service, call, response_id, last, finish=out.finish_reason,
                                                 records=pending))
            if req.include_usage:
                yield sse(shape.usage_chunk(service, call, response_id, out.completion_tokens,
                                            "chat.completion.chunk" if chat else "text_completion"))
            yield {"data": "[DONE]"}
        finally:
            if not call.future.done():
                call.cancel()  # the client went away (or the server is stopping)
            self.active.discard(call)


async def wait(request: Request, call: Call) -> bool:
    """Wait for the call; False (and the call cancelled) if the client went away first."""
    done = asyncio.wrap_future(call.future)
    try:
        while True:
            finished, _ = await asyncio.wait({done}, timeout=0.5)
            if finished:
                return True
            if await request.is_disconnected():
                call.cancel()
                done.add_done_callback(_retrieved)
                return False
    except asyncio.CancelledError:
        call.cancel()
        done.add_done_callback(_retrieved)
        raise


def _chunk(service, call, response_id, chat: bool, delta: str, records: list) -> dict:
    if chat:
        return shape.chat_chunk(service, call, response_id, {"content": delta}, records=records)
    return shape.completion_chunk(service, call, response_id, delta, records=records)


def _post(loop: asyncio.AbstractEventLoop, q: asyncio.Queue, item) -> None:
    try:
        loop.call_soon_threadsafe(q.put_nowait, item)
    except RuntimeError:
        pass  # the loop is closed: the server has stopped


def _retrieved(future: asyncio.Future) -> None:
    """Reads an abandoned call's outcome, so that asyncio does not log a cancelled call's
    `Cancelled` as "Future exception was never retrieved" (the recorder reads it on its own)."""
    if not future.cancelled():
        future.exception()


def _failure(call: Call) -> APIError | None:
    exc = call.future.exception() if call.future.done() else None
    if exc is None or isinstance(exc, Cancelled):
        return None
    return APIError(f"generation failed: {exc}", status=500, code="engine_error")


# ---------------------------------------------------------------------------- an upstream
class Proxied:
    """Another server answers (a `proxy.Upstream`); the local tokenizer, loaded in the
    background, only gives recorded tokens their ids."""

    def __init__(self, upstream: proxy.Upstream):
        self.upstream = upstream

    def needs_loading(self) -> bool:
        return True

    def load(self, announce) -> None:
        try:
            self.upstream.load()
        except Exception as exc:  # noqa: BLE001 - recorded tokens then get id 0
            announce(f"tttr serve: warning: the local tokenizer failed to load ({exc}); recorded token ids will be 0")

    def cancel(self) -> None:
        pass  # a relayed stream ends with its client; each records itself

    def close(self) -> None:
        pass

    def health(self) -> tuple[dict, int]:
        return {"status": "ok", "mode": "proxy", "upstream": self.upstream.shown}, 200

    async def models(self) -> dict:
        return await self.upstream.models()

    def recorded(self, run, kind, value):
        return None

    async def count_tokens(self, body: object) -> int:
        raise APIError(f"count_tokens is not forwarded to an OpenAI-compatible upstream ({self.upstream.shown}): "
                       "it has no such route", status=400, code="unsupported")

    async def messages(self, server, request, body):
        return await messages_api.over_chat(self, server, request, body)

    async def answer(self, server: Server, request: Request, endpoint: str, body: object = None) -> Response:
        """Forward the call upstream; record it (token layer only) once answered."""
        from tttr.engine.serve import proxy  # loaded already where there is an upstream; its HTTP client is not cheap
        try:
            name = run_name(request)
            plan = self.upstream.plan(endpoint, await read_body(request, server.max_body) if body is None else body)
            started = time.perf_counter()
            if plan.stream:
                response = await self.upstream.open_stream(plan)
            else:
                answer = await self.upstream.complete(plan)
        except APIError as exc:
            return error_response(exc)
        call = proxy.ProxiedCall(plan, name, self.upstream, started=started)
        if plan.stream:
            return events(self._relay(server.recorder, call, response))
        call.add_response(answer)
        if server.recorder is not None:
            server.recorder.record_proxied(call)
        return JSONResponse(proxy.for_client(plan, answer))

    async def _relay(self, recorder, call: proxy.ProxiedCall, response):
        """The upstream's chunks, passed on as they come; recorded when the stream ends
        (cut off: finish_reason "cancelled")."""
        from tttr.engine.serve import proxy

        done = False
        chunks = self.upstream.chunks(response)
        try:
            async for chunk in chunks:
                call.add_chunk(chunk)
                if not proxy.is_usage_only(call.plan, chunk):
                    yield sse(proxy.for_client(call.plan, chunk))
            done = True
            yield {"data": "[DONE]"}
        except Exception as exc:  # noqa: BLE001 - the upstream broke off: say so in the stream
            err = APIError(f"the upstream {self.upstream.shown} broke off the stream: {type(exc).__name__}: {exc}",
                           status=502, code="upstream_error")
            call.finish_reason = "error"
            yield sse(err.to_json())
        finally:
            await chunks.aclose()  # a client that went away: the upstream's stream is closed too
            if not done and call.finish_reason != "error":
                call.finish_reason = "cancelled"
            if recorder is not None:
                recorder.record_proxied(call)


# ---------------------------------------------------------------------------- a recording
class FromRecording:
    """A replayer answers: `answer_call(run, endpoint, body)` gives a model call's recorded
    response (a chat.completion or text_completion object) or an APIError; `answer_sdk(run,
    kind, value)` an SDK query's recorded answer or None (run it live). `model`: GET /v1/models'
    entry (the recorded model's), as no model is loaded."""

    def __init__(self, answer_call: Callable[[str | None, str, dict], dict | APIError],
                 answer_sdk: Callable[[str, str, dict], dict | None], model: dict):
        self.answer_call, self.answer_sdk, self.model = answer_call, answer_sdk, model

    def needs_loading(self) -> bool:
        return False

    def load(self, announce) -> None:
        pass

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass

    def health(self) -> tuple[dict, int]:
        return {"status": "ok", "mode": "replay", "model": self.model.get("id")}, 200

    async def models(self) -> dict:
        return {"object": "list", "data": [self.model]}

    def recorded(self, run, kind, value):
        return self.answer_sdk(run, kind, value)

    async def count_tokens(self, body: object) -> int:
        messages_api.to_chat(body, counting=True)
        raise APIError("count_tokens is not recorded, so a replay cannot answer it (no model is loaded); count "
                       "on a live `tttr serve`", status=400, code="unsupported")

    async def messages(self, server, request, body):
        return await messages_api.over_chat(self, server, request, body)

    async def answer(self, server: Server, request: Request, endpoint: str, body: object = None) -> Response:
        """A model call answered from the recording: no model, no compute."""
        try:
            name = run_name(request)
            body = await read_body(request, server.max_body) if body is None else body
            if type(body) is not dict:
                raise APIError(f"the request body is a JSON object, not {type(body).__name__}")
            if name is None and server.recorder is not None:
                name = getattr(server.recorder, "default_run", None)
            answer = await run_in_threadpool(self.answer_call, name, endpoint, body)
            if isinstance(answer, APIError):
                raise answer
        except APIError as exc:
            return error_response(exc)
        if body.get("stream") is True:
            usage = isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage") is True
            return events(_replayed_stream(answer, endpoint, usage))
        return JSONResponse(answer)


def _pieces(text: str, answer: dict) -> list[str]:
    """The recorded answer's text in the pieces it was streamed in (`tttr.pieces`, their
    lengths, where recorded), else whole: what the recording says is untrusted, and pieces that
    are not positive whole numbers adding up to the text are not used."""
    sizes = (answer.get("tttr") or {}).get("pieces")
    if not (isinstance(sizes, list) and all(type(n) is int and n > 0 for n in sizes) and sum(sizes) == len(text)):
        return [text]
    out, at = [], 0
    for n in sizes:
        out.append(text[at:at + n])
        at += n
    return out


async def _replayed_stream(answer: dict, endpoint: str, usage: bool):
    """A recorded response as server-sent events: its text in the pieces the recording sent
    (one chunk each), then the end."""
    head = {k: answer[k] for k in ("id", "created", "model") if k in answer}
    choice = answer["choices"][0]
    if endpoint == "chat":
        obj, msg = "chat.completion.chunk", choice["message"]
        deltas = [{"role": "assistant", "content": ""}]  # as a live stream opens
        deltas += [{"content": piece} for piece in _pieces(msg.get("content") or "", answer) if piece]
        if msg.get("tool_calls"):
            deltas[-1]["tool_calls"] = [dict(c, index=i) for i, c in enumerate(msg["tool_calls"])]
        for delta in deltas:
            yield sse({**head, "object": obj, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        last = {**head, "object": obj, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
        if "stop_sequence" in (answer.get("tttr") or {}):  # what ended the recorded text, as a live stream says it
            last["tttr"] = {"stop_sequence": answer["tttr"]["stop_sequence"]}
        yield sse(last)
    else:
        obj = "text_completion"
        for piece in _pieces(choice.get("text", ""), answer):
            yield sse({**head, "object": obj, "choices": [{"index": 0, "text": piece, "finish_reason": None}]})
        yield sse({**head, "object": obj, "choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"]}]})
    if usage:
        yield sse({**head, "object": obj, "choices": [], "usage": answer.get("usage")})
    yield {"data": "[DONE]"}
