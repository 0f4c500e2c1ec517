"""`tttr serve`'s HTTP layer: OpenAI's routes on Starlette, streaming as server-sent events.

It only speaks HTTP: a body is checked by `engine.serve.requests`, prepared and run by
`engine.serve.service`, shaped by `engine.serve.responses` and recorded by
`engine.serve.recorder`; in proxy mode (`upstream`) a call is forwarded by
`engine.serve.proxy` instead, and its stream relayed chunk by chunk. The SDK's routes
(`/tttr/v1/tool`, `/tttr/v1/clock`; bodies checked by `engine.serve.sdk_events`) record what a
program got from outside the model into its run (see docs/serve.md). Every error is OpenAI's error object with its status, never a
traceback. The engine's token callback runs on the engine's thread and only hands the
token to the event loop, so a slow client never slows the batch."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tttr.engine.serve import responses as shape
from tttr.engine.serve.errors import APIError
from tttr.engine.serve.requests import MAX_BODY_MB, ROUTES, parse_chat, parse_completion
from tttr.engine.serve.sdk_events import parse_clock, parse_tool
from tttr.engine.serve.service import Call, Cancelled, Service

if TYPE_CHECKING:
    from tttr.engine.serve import proxy

RUN_HEADER = "x-tttr-run"
MAX_RUN_NAME = 512  # above the names the recorder gives: a program's run is program:NAME, NAME up to 255 bytes


def _error(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.to_json(), status_code=exc.status)


def _too_large(limit: int, size: str) -> APIError:
    return APIError(f"the request body is {size} bytes; this server takes at most {limit >> 20} MiB "
                    "(tttr serve --max-body-mb)", status=413, code="request_too_large")


async def _body(request: Request, limit: int) -> object:
    """The body as JSON, read only while it is within `limit` bytes: Content-Length is checked
    before anything is read, a chunked body as it arrives. A client that goes away mid-body
    gets a 499 that nobody reads (its call is simply not made)."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise _too_large(limit, size)
    raw = bytearray()
    try:
        async for part in request.stream():
            raw += part
            if len(raw) > limit:
                raise _too_large(limit, f"over {limit}")
    except ClientDisconnect:
        raise APIError("the client went away before sending the whole body", status=499,
                       code="client_closed_request") from None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(f"the request body is not valid JSON ({exc}); send a JSON object", code="invalid_json") from None
    except RecursionError:  # arrays or objects nested past the parser's depth
        raise APIError("the request body nests arrays or objects too deeply to read; send a flatter JSON object",
                       code="invalid_json") from None


def _events(stream) -> Response:
    """A stream of server-sent events. sse-starlette is imported here, by the first streamed
    answer: a `tttr replay` of a program that never streams does not pay for it."""
    from sse_starlette.sse import EventSourceResponse

    return EventSourceResponse(stream, ping=15, send_timeout=30)


def _run_name(request: Request) -> str | None:
    name = request.headers.get(RUN_HEADER)
    if name is None:
        return None
    name = name.strip()
    if not name or len(name) > MAX_RUN_NAME or not name.isprintable():
        raise APIError(f"the {RUN_HEADER} header must be 1..{MAX_RUN_NAME} printable characters", param=RUN_HEADER)
    return name


class Server:
    """The routes, over one Service and (with --db) one CallRecorder."""

    def __init__(self, service: Service | None, recorder=None, *, announce=None, upstream=None,
                 max_body_mb: int = MAX_BODY_MB):
        self.service = service
        self.max_body = max_body_mb << 20
        self.upstream: proxy.Upstream | None = upstream
        self.recorder = recorder
        self.announce = announce or (lambda text: None)
        self.active: set[Call] = set()
        self._loader: threading.Thread | None = None
        # The run's clock for SDK clock reads (a runner with a virtual clock replaces it).
        self.clock = lambda: datetime.now(timezone.utc)
        # The replay hook: (run name, kind, the post's value) -> the recorded answer (a dict
        # for the SDK: a tool's "result"/"error" or a command's output, a clock's "t"), or
        # None to let the call run live. None here: the server records, it never answers.
        self.answer_from_recording = None
        # The model calls' replay hook: (run name, endpoint, body) -> the recorded response
        # (a chat.completion or text_completion object) or an APIError; None: served live.
        self.answer_call = None
        self.replay_model: dict | None = None  # GET /v1/models' entry while replaying without a model
        # The program's tree (an engine.serve.sdk_tree.SDKTree), set by a runner: SDK tool events
        # then carry the tree's digests and snapshot, and a pinned call's effects are put back.
        self.sdk_tree = None

    # -- lifecycle -------------------------------------------------------------------------
    def _load(self) -> None:
        t0 = time.perf_counter()
        if self.upstream is not None:
            try:
                self.upstream.load()
            except Exception as exc:  # noqa: BLE001 - recorded tokens then get id 0
                self.announce(f"tttr serve: warning: the local tokenizer failed to load ({exc}); recorded token ids will be 0")
            return
        try:
            self.service.load()
        except Exception as exc:  # noqa: BLE001 - /health and every request say so
            self.announce(f"tttr serve: error: the model failed to load: {exc}")
            return
        self.announce(f"tttr serve: ready (model loaded in {time.perf_counter() - t0:.1f} s)")

    def startup(self) -> None:
        """Start loading the model in the background (requests get 503 until it is ready)."""
        if (self.upstream is not None or not self.service.ready) and self._loader is None:
            self._loader = threading.Thread(target=self._load, name="tttr-serve-load", daemon=True)
            self._loader.start()

    def shutdown(self) -> None:
        """Cancel what is running (each stops at the engine's next step), write every call
        to the database, stop the engine."""
        if self._loader is not None:
            self._loader.join()  # a load cannot be interrupted; torch must not die mid-load at exit
        for call in list(self.active):
            call.cancel()
        if self.recorder is not None:
            self.recorder.close()
        if self.service is not None:
            self.service.close()

    @asynccontextmanager
    async def lifespan(self, app):
        self.startup()
        try:
            yield
        finally:
            await run_in_threadpool(self.shutdown)

    # -- routes ----------------------------------------------------------------------------
    async def health(self, request: Request) -> JSONResponse:
        if self.upstream is not None:
            return JSONResponse({"status": "ok", "mode": "proxy", "upstream": self.upstream.shown})
        s = self.service
        status = "ok" if s.ready else ("error" if s.load_error else "loading")
        body = {"status": status, "model": s.model_id, "kernel_mode": s.kernel_mode, "prefix_cache": s.prefix_stats()}
        if s.load_error:
            body["error"] = s.load_error
        return JSONResponse(body, status_code=200 if s.ready else 503)

    async def models(self, request: Request) -> JSONResponse:
        if self.upstream is not None:
            try:
                return JSONResponse(await self.upstream.models())
            except APIError as exc:
                return _error(exc)
        if self.service is None and self.replay_model is not None:
            return JSONResponse({"object": "list", "data": [self.replay_model]})
        return JSONResponse(shape.models(self.service))

    async def chat(self, request: Request):
        if self.answer_call is not None:
            return await self._replayed(request, "chat")
        if self.upstream is not None:
            return await self._proxy(request, "chat")
        return await self._call(request, parse_chat, "chat")

    async def completions(self, request: Request):
        if self.answer_call is not None:
            return await self._replayed(request, "completion")
        if self.upstream is not None:
            return await self._proxy(request, "completion")
        return await self._call(request, parse_completion, "completion")

    async def responses(self, request: Request):
        """OpenAI's Responses API: the chat call its request means (engine/serve/responses_api.py),
        run, recorded and replayed as one; its answer shaped as a Response (or its stream)."""
        from tttr.engine.serve import responses_api

        try:
            body = await _body(request, self.max_body)
            chat = responses_api.to_chat(body)
        except APIError as exc:
            return _error(exc)
        if self.answer_call is not None:
            answered = await self._replayed(request, "chat", chat)
        elif self.upstream is not None:
            answered = await self._proxy(request, "chat", chat)
        else:
            answered = await self._call(request, parse_chat, "chat", chat)
        if answered.status_code != 200:  # an error, as the chat route would answer it, in this request's names
            return JSONResponse(responses_api.error_from_chat(json.loads(answered.body or b"{}")),
                                status_code=answered.status_code)
        if chat.get("stream"):  # the chat call's events, made into the Responses stream as they come
            return _events(responses_api.from_chat_stream(body, answered.body_iterator))
        return JSONResponse(responses_api.to_response(body, json.loads(answered.body)))

    # -- the SDK -------------------------------------------------------------------------
    def _sdk_run(self, request: Request) -> str:
        name = _run_name(request)
        if name is None and self.recorder is not None:
            name = getattr(self.recorder, "default_run", None)
        if name is None:
            raise APIError(f"an SDK event needs the run it belongs to: send the {RUN_HEADER} header "
                           "(the SDK sends $TTTR_RUN)", param=RUN_HEADER, code="missing_run")
        return name

    def _recorded_answer(self, name: str, kind: str, value: dict) -> dict | None:
        hook = self.answer_from_recording
        return hook(name, kind, value) if hook is not None else None

    async def sdk_tool(self, request: Request) -> JSONResponse:
        """A tool call: recorded as the run's next step; a query (no outcome yet) is answered
        from the recording when replaying, else {"recorded": false}: run it, then post it."""
        try:
            name = self._sdk_run(request)
            post = parse_tool(await _body(request, self.max_body))
        except APIError as exc:
            return _error(exc)
        tree = self.sdk_tree
        if post.query:
            value = post.value
            if tree is not None and "cmd" in value:  # the cassette's key includes the tree before
                value = await run_in_threadpool(tree.asked, name, value)
            answer = self._recorded_answer(name, "tool", value)
            if answer is not None:
                if tree is not None:
                    await run_in_threadpool(self._put_back, tree, answer)
                answer = {k: self._text(v) if k in ("stdout", "stderr") else v for k, v in answer.items()
                          if k not in ("tree_after", "snapshot")}
                return JSONResponse({"recorded": True, "run": name, **answer})
            return JSONResponse({"recorded": False, "run": name})
        value = {**post.value, "source": "sdk"}
        if tree is not None:
            value = await run_in_threadpool(self._with_tree, tree, name, value)
        if self.recorder is not None:
            self.recorder.record_event(name, "tool", value)
        return JSONResponse({"recorded": False, "run": name, "stored": self.recorder is not None})

    def _text(self, value):
        """A recorded output as the SDK gets it: a large one is read back from its blob."""
        if isinstance(value, dict) and "$blob" in value and self.recorder is not None:
            from tttr.engine.replay.events import read_text

            return read_text(self.recorder.store, value)
        return value

    def _with_tree(self, tree, name: str, value: dict) -> dict:
        try:
            return tree.outcome(name, value)
        except Exception as exc:  # noqa: BLE001 - the event is still worth recording without its tree
            print(f"tttr serve: could not snapshot the program's tree for an SDK tool event: {exc}", file=sys.stderr)
            return value

    def _put_back(self, tree, answer: dict) -> None:
        try:
            tree.move_to(answer)
        except Exception as exc:  # noqa: BLE001 - the program goes on; its end tree will differ
            print(f"tttr serve: could not put back a pinned SDK tool's effects on the tree: {exc}", file=sys.stderr)

    async def sdk_clock(self, request: Request) -> JSONResponse:
        """A clock read: the recording's value when replaying, else the server's clock, recorded."""
        try:
            name = self._sdk_run(request)
            parse_clock(await _body(request, self.max_body))
        except APIError as exc:
            return _error(exc)
        answer = self._recorded_answer(name, "clock", {})
        if answer is not None:
            return JSONResponse({"recorded": True, "run": name, **answer})
        t = self.clock().isoformat()
        if self.recorder is not None:
            self.recorder.record_event(name, "clock", {"t": t, "source": "sdk"})
        return JSONResponse({"recorded": False, "run": name, "t": t, "stored": self.recorder is not None})

    # -- replay mode -----------------------------------------------------------------------
    async def _replayed(self, request: Request, endpoint: str, body: object = None):
        """A model call answered by the replay hook, from the recording: no model, no compute.
        `body`: the request's, read already (else it is read here), as for `_proxy` and `_call`."""
        try:
            name = _run_name(request)
            body = await _body(request, self.max_body) if body is None else body
            if type(body) is not dict:
                raise APIError(f"the request body is a JSON object, not {type(body).__name__}")
            if name is None and self.recorder is not None:
                name = getattr(self.recorder, "default_run", None)
            answer = await run_in_threadpool(self.answer_call, name, endpoint, body)
            if isinstance(answer, APIError):
                raise answer
        except APIError as exc:
            return _error(exc)
        if body.get("stream") is True:
            usage = isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage") is True
            return _events(_replayed_stream(answer, endpoint, usage))
        return JSONResponse(answer)

    # -- proxy mode ------------------------------------------------------------------------
    async def _proxy(self, request: Request, endpoint: str, body: object = None):
        """Forward the call upstream; record it (token layer only) once answered."""
        from tttr.engine.serve import proxy  # loaded already where there is an upstream; its HTTP client is not cheap
        try:
            name = _run_name(request)
            plan = self.upstream.plan(endpoint, await _body(request, self.max_body) if body is None else body)
            if plan.stream:
                response = await self.upstream.open_stream(plan)
            else:
                answer = await self.upstream.complete(plan)
        except APIError as exc:
            return _error(exc)
        call = proxy.ProxiedCall(plan, name, self.upstream)
        if plan.stream:
            return _events(self._relay(call, response))
        call.add_response(answer)
        if self.recorder is not None:
            self.recorder.record_proxied(call)
        return JSONResponse(proxy.for_client(plan, answer))

    async def _relay(self, call: proxy.ProxiedCall, response):
        """The upstream's chunks, passed on as they come; recorded when the stream ends
        (cut off: finish_reason "cancelled")."""
        from tttr.engine.serve import proxy

        done = False
        chunks = self.upstream.chunks(response)
        try:
            async for chunk in chunks:
                call.add_chunk(chunk)
                if not proxy.is_usage_only(call.plan, chunk):
                    yield _sse(proxy.for_client(call.plan, chunk))
            done = True
            yield {"data": "[DONE]"}
        except Exception as exc:  # noqa: BLE001 - the upstream broke off: say so in the stream
            err = APIError(f"the upstream {self.upstream.shown} broke off the stream: {type(exc).__name__}: {exc}",
                           status=502, code="upstream_error")
            call.finish_reason = "error"
            yield _sse(err.to_json())
        finally:
            await chunks.aclose()  # a client that went away: the upstream's stream is closed too
            if not done and call.finish_reason != "error":
                call.finish_reason = "cancelled"
            if self.recorder is not None:
                self.recorder.record_proxied(call)

    async def _call(self, request: Request, parse, endpoint: str, body: object = None):
        try:
            name = _run_name(request)
            req = parse(await _body(request, self.max_body) if body is None else body)
            prepared = await run_in_threadpool(self.service.prepare, req)
        except APIError as exc:
            return _error(exc)
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()

        def on_token(record) -> None:  # the engine's thread: hand over, nothing more
            loop.call_soon_threadsafe(tokens.put_nowait, record)

        try:
            call = self.service.start(prepared, on_token if req.stream else None)
        except APIError as exc:
            return _error(exc)
        self.active.add(call)
        if req.stream:
            call.future.add_done_callback(lambda _: _post(loop, tokens, None))
        response_id = shape.new_id("chatcmpl" if endpoint == "chat" else "cmpl")
        if self.recorder is not None:
            self.recorder.record(call, name=name, response_id=response_id)
        if req.stream:
            return _events(self._stream(call, tokens, response_id, endpoint))
        try:
            finished = await self._wait(request, call)
        finally:
            self.active.discard(call)
        if not finished:
            return JSONResponse({}, status_code=499)  # nobody is listening
        failure = _failure(call)
        if failure is not None:
            return _error(failure)
        out = shape.output(call, self.service.tokenizer)
        make = shape.chat_response if endpoint == "chat" else shape.completion_response
        return JSONResponse(make(self.service, call, out, response_id))

    async def _wait(self, request: Request, call: Call) -> bool:
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
                yield _sse(shape.chat_chunk(service, call, response_id, {"role": "assistant", "content": ""}))
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
                yield _sse(_chunk(service, call, response_id, chat, delta, pending))
                pending = []
            failure = _failure(call)
            if failure is not None:
                yield _sse(failure.to_json())
                return
            out = shape.output(call, tok)
            last = text.flush()
            if chat:
                delta = {"content": out.text} if buffered and out.text else ({"content": last} if last else {})
                if out.tool_calls:
                    delta["tool_calls"] = [dict(c.to_json(f"call_{response_id[-12:]}_{i}"), index=i)
                                           for i, c in enumerate(out.tool_calls)]
                yield _sse(shape.chat_chunk(service, call, response_id, delta, finish=out.finish_reason,
                                            records=pending))
            else:
                yield _sse(shape.completion_chunk(service, call, response_id, last, finish=out.finish_reason,
                                                  records=pending))
            if req.include_usage:
                yield _sse(shape.usage_chunk(service, call, response_id, out.completion_tokens,
                                             "chat.completion.chunk" if chat else "text_completion"))
            yield {"data": "[DONE]"}
        finally:
            if not call.future.done():
                call.cancel()  # the client went away (or the server is stopping)
            self.active.discard(call)


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
            yield _sse({**head, "object": obj, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        yield _sse({**head, "object": obj, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    else:
        obj = "text_completion"
        for piece in _pieces(choice.get("text", ""), answer):
            yield _sse({**head, "object": obj, "choices": [{"index": 0, "text": piece, "finish_reason": None}]})
        yield _sse({**head, "object": obj, "choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"]}]})
    if usage:
        yield _sse({**head, "object": obj, "choices": [], "usage": answer.get("usage")})
    yield {"data": "[DONE]"}


def _chunk(service, call, response_id, chat: bool, delta: str, records: list) -> dict:
    if chat:
        return shape.chat_chunk(service, call, response_id, {"content": delta}, records=records)
    return shape.completion_chunk(service, call, response_id, delta, records=records)


def _sse(obj: dict) -> dict:
    return {"data": json.dumps(obj, ensure_ascii=False)}


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


def create_app(service: Service | None, recorder=None, *, announce=None, upstream=None,
               max_body_mb: int = MAX_BODY_MB) -> Starlette:
    """The ASGI app. The model loads in the background at startup; until then the model
    routes answer 503. With `upstream` (a `proxy.Upstream`; `service` None) every call is
    forwarded there instead. A request body over `max_body_mb` MiB is refused (413) unread."""
    server = Server(service, recorder, announce=announce, upstream=upstream, max_body_mb=max_body_mb)

    async def not_found(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err = APIError(f"no route {request.method} {request.url.path}; the routes are GET /v1/models, "
                           "POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, GET /health, and the SDK's "
                           "POST /tttr/v1/tool and POST /tttr/v1/clock", status=404,
                           code="not_found")
        else:
            err = APIError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code)
        return JSONResponse(err.to_json(), status_code=exc.status_code)

    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        print(f"tttr serve: internal error on {request.url.path}: {type(exc).__name__}: {exc}", file=sys.stderr)
        err = APIError(f"internal error: {type(exc).__name__}: {exc}", status=500, code="internal_error")
        return JSONResponse(err.to_json(), status_code=500)

    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route(ROUTES["chat"], server.chat, methods=["POST"]),
        Route(ROUTES["completion"], server.completions, methods=["POST"]),
        Route(ROUTES["responses"], server.responses, methods=["POST"]),
        Route("/tttr/v1/tool", server.sdk_tool, methods=["POST"]),
        Route("/tttr/v1/clock", server.sdk_clock, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=server.lifespan,
                    exception_handlers={HTTPException: not_found, Exception: crashed})
    app.state.server = server
    return app
