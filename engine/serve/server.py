"""`tttr serve`'s HTTP layer: OpenAI's routes on Starlette, streaming as server-sent events.

It only speaks HTTP: what answers a model call is the server's mode (engine/serve/modes.py),
passed to it: `Live` (the engine here: a body is checked by `engine.serve.requests`, prepared and
run by `engine.serve.service`, shaped by `engine.serve.responses`), `Proxied` (forwarded by
`engine.serve.proxy`, its stream relayed chunk by chunk) or `FromRecording` (a replayer's
answers). The recorder (`engine.serve.recorder`, with --db) writes what is answered live. The
SDK's routes (`/tttr/v1/tool`, `/tttr/v1/clock`; bodies checked by `engine.serve.sdk_events`)
record what a program got from outside the model into its run (see docs/serve.md). Every error
is OpenAI's error object with its status, never a traceback."""

from __future__ import annotations

import json
import sys
import threading
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tttr.engine.serve.errors import APIError
from tttr.engine.serve.httpio import RUN_HEADER, error_response, events, read_body, run_name
from tttr.engine.serve.modes import Mode
from tttr.engine.serve.requests import MAX_BODY_MB, ROUTES
from tttr.engine.serve.sdk_events import parse_clock, parse_tool


class Server:
    """The routes, over one mode (what answers a model call) and (with --db) one CallRecorder.
    A program's runner passes `tree` (an engine.serve.sdk_tree.SDKTree: SDK tool events then
    carry the tree's digests and snapshot, and a pinned call's effects are put back) and `clock`
    (what SDK clock reads get; default the wall clock)."""

    def __init__(self, mode: Mode, recorder=None, *, announce=None, max_body_mb: int = MAX_BODY_MB,
                 tree=None, clock: Callable[[], datetime] | None = None):
        self.mode = mode
        self.recorder = recorder
        self.max_body = max_body_mb << 20
        self.announce = announce or (lambda text: None)
        self.sdk_tree = tree
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self._loader: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def startup(self) -> None:
        """Start loading what the mode needs in the background (model calls get 503 until it is ready)."""
        if self.mode.needs_loading() and self._loader is None:
            self._loader = threading.Thread(target=self.mode.load, args=(self.announce,), name="tttr-serve-load",
                                            daemon=True)
            self._loader.start()

    def shutdown(self) -> None:
        """Cancel what is running (each stops at the engine's next step), write every call
        to the database, release the mode."""
        if self._loader is not None:
            self._loader.join()  # a load cannot be interrupted; torch must not die mid-load at exit
        self.mode.cancel()
        if self.recorder is not None:
            self.recorder.close()
        self.mode.close()

    @asynccontextmanager
    async def lifespan(self, app):
        self.startup()
        try:
            yield
        finally:
            await run_in_threadpool(self.shutdown)

    # -- routes ----------------------------------------------------------------------------
    async def health(self, request: Request) -> JSONResponse:
        body, status = self.mode.health()
        return JSONResponse(body, status_code=status)

    async def models(self, request: Request) -> JSONResponse:
        try:
            return JSONResponse(await self.mode.models())
        except APIError as exc:
            return error_response(exc)

    async def chat(self, request: Request):
        return await self.mode.answer(self, request, "chat")

    async def completions(self, request: Request):
        return await self.mode.answer(self, request, "completion")

    async def responses(self, request: Request):
        """OpenAI's Responses API: the chat call its request means (engine/serve/responses_api.py),
        run, recorded and replayed as one; its answer shaped as a Response (or its stream)."""
        from tttr.engine.serve import responses_api

        try:
            body = await read_body(request, self.max_body)
            chat = responses_api.to_chat(body)
        except APIError as exc:
            return error_response(exc)
        answered = await self.mode.answer(self, request, "chat", chat)
        if answered.status_code != 200:  # an error, as the chat route would answer it, in this request's names
            return JSONResponse(responses_api.error_from_chat(json.loads(answered.body or b"{}")),
                                status_code=answered.status_code)
        if chat.get("stream"):  # the chat call's events, made into the Responses stream as they come
            return events(responses_api.from_chat_stream(body, answered.body_iterator))
        return JSONResponse(responses_api.to_response(body, json.loads(answered.body)))

    async def messages(self, request: Request):
        """Anthropic's Messages API, as the mode answers it: as the chat call the request means
        (engine/serve/messages_api.py), or forwarded to an upstream that speaks it; errors in
        Anthropic's shape."""
        from tttr.engine.serve import messages_api

        try:
            body = await read_body(request, self.max_body)
        except APIError as exc:
            return JSONResponse(messages_api.error_of(exc), status_code=exc.status)
        return await self.mode.messages(self, request, body)

    async def count_tokens(self, request: Request) -> JSONResponse:
        """POST /v1/messages/count_tokens: the prompt tokens the Messages request would take."""
        from tttr.engine.serve import messages_api

        try:
            body = await read_body(request, self.max_body)
            return JSONResponse({"input_tokens": await self.mode.count_tokens(body)})
        except APIError as exc:
            return JSONResponse(messages_api.error_of(exc), status_code=exc.status)

    # -- the SDK -------------------------------------------------------------------------
    def _sdk_run(self, request: Request) -> str:
        name = run_name(request)
        if name is None and self.recorder is not None:
            name = getattr(self.recorder, "default_run", None)
        if name is None:
            raise APIError(f"an SDK event needs the run it belongs to: send the {RUN_HEADER} header "
                           "(the SDK sends $TTTR_RUN)", param=RUN_HEADER, code="missing_run")
        return name

    async def sdk_tool(self, request: Request) -> JSONResponse:
        """A tool call: recorded as the run's next step; a query (no outcome yet) is answered
        from the recording when replaying, else {"recorded": false}: run it, then post it."""
        try:
            name = self._sdk_run(request)
            post = parse_tool(await read_body(request, self.max_body))
        except APIError as exc:
            return error_response(exc)
        tree = self.sdk_tree
        if post.query:
            value = post.value
            if tree is not None and "cmd" in value:  # the cassette's key includes the tree before
                value = await run_in_threadpool(tree.asked, name, value)
            answer = self.mode.recorded(name, "tool", value)
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
            parse_clock(await read_body(request, self.max_body))
        except APIError as exc:
            return error_response(exc)
        answer = self.mode.recorded(name, "clock", {})
        if answer is not None:
            return JSONResponse({"recorded": True, "run": name, **answer})
        t = self.clock().isoformat()
        if self.recorder is not None:
            self.recorder.record_event(name, "clock", {"t": t, "source": "sdk"})
        return JSONResponse({"recorded": False, "run": name, "t": t, "stored": self.recorder is not None})


def create_app(mode: Mode, recorder=None, *, announce=None, max_body_mb: int = MAX_BODY_MB, tree=None,
               clock: Callable[[], datetime] | None = None) -> Starlette:
    """The ASGI app over `mode` (engine/serve/modes.py: `Live(service)`, `Proxied(upstream)` or
    `FromRecording(...)`). What the mode needs loads in the background at startup; until then
    the model routes answer 503. A request body over `max_body_mb` MiB is refused (413) unread.
    `tree`, `clock`: a program's, as `Server` takes them."""
    server = Server(mode, recorder, announce=announce, max_body_mb=max_body_mb, tree=tree, clock=clock)

    async def not_found(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err = APIError(f"no route {request.method} {request.url.path}; the routes are GET /v1/models, "
                           "POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, POST /v1/messages (and "
                           "/v1/messages/count_tokens), GET /health, and the SDK's "
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
        Route(ROUTES["messages"], server.messages, methods=["POST"]),
        Route(ROUTES["messages"] + "/count_tokens", server.count_tokens, methods=["POST"]),
        Route("/tttr/v1/tool", server.sdk_tool, methods=["POST"]),
        Route("/tttr/v1/clock", server.sdk_clock, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=server.lifespan,
                    exception_handlers={HTTPException: not_found, Exception: crashed})
    app.state.server = server
    return app
