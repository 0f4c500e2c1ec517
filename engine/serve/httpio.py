"""What every route of `tttr serve` shares: the request body read within its bound, the run
header, an error as a JSON response, and a stream of server-sent events."""

from __future__ import annotations

import json

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from tttr.engine.serve.errors import APIError

RUN_HEADER = "x-tttr-run"
MAX_RUN_NAME = 512  # above the names the recorder gives: a program's run is program:NAME, NAME up to 255 bytes


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.to_json(), status_code=exc.status)


def _too_large(limit: int, size: str) -> APIError:
    return APIError(f"the request body is {size} bytes; this server takes at most {limit >> 20} MiB "
                    "(tttr serve --max-body-mb)", status=413, code="request_too_large")


async def read_body(request: Request, limit: int) -> object:
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


def events(stream) -> Response:
    """A stream of server-sent events. sse-starlette is imported here, by the first streamed
    answer: a `tttr replay` of a program that never streams does not pay for it."""
    from sse_starlette.sse import EventSourceResponse

    return EventSourceResponse(stream, ping=15, send_timeout=30)


def sse(obj: dict) -> dict:
    """One server-sent event whose data is `obj` as JSON."""
    return {"data": json.dumps(obj, ensure_ascii=False)}


def run_name(request: Request) -> str | None:
    """The run the call belongs to (the X-TTTR-Run header), or None."""
    name = request.headers.get(RUN_HEADER)
    if name is None:
        return None
    name = name.strip()
    if not name or len(name) > MAX_RUN_NAME or not name.isprintable():
        raise APIError(f"the {RUN_HEADER} header must be 1..{MAX_RUN_NAME} printable characters", param=RUN_HEADER)
    return name
