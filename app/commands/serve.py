"""`tttr serve`: the OpenAI-compatible API on the engine (see engine/serve/server.py)."""

from __future__ import annotations

import logging
import sys

from tttr.app.commands import args as argtypes
from tttr.kernels.mode import MODES
from tttr.sessions.errors import TTTRError

port_number = argtypes.bounded_int(0, 65535, "a port")
body_mb = argtypes.bounded_int(1, 4096, "a size in MiB")


class ServeError(TTTRError):
    """The server cannot start: one line, exit 2."""


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "serve", help="serve the OpenAI API (chat, completions, responses) and Anthropic's Messages API on the engine, recording each call",
        description="An OpenAI-compatible server on TTTR's engine: GET /v1/models, POST /v1/chat/completions, "
                    "POST /v1/completions, POST /v1/responses and Anthropic's POST /v1/messages (each run as the chat call it "
                    "means), GET /health. Requests share the model through continuous batching; "
                    "with the invariant kernels (the default) a seeded request gets the same tokens and logprobs "
                    "alone or under load. With --db every call is recorded as a run (header X-TTTR-Run: NAME "
                    "groups calls into one run). Ctrl-C stops it.",
    )
    p.add_argument("--model", default=None,
                   help="a .gguf file or a Hugging Face model folder (default: $TTTR_MODEL, else the "
                        "embedded SmolLM2-135M-Instruct)")
    p.add_argument("--db", default=None, help="record every call into this session database (created if missing; default: "
                        "none, nothing is recorded)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--kernels", choices=MODES, default=None,  # None: not given (the proxy refuses it)
                   help="kernel mode (default invariant: answers do not depend on what else is running; "
                        "invariant-q8 too, with 8-bit activations in block products as llama.cpp)")
    p.add_argument("--any-model", action="store_true",
                   help="answer requests whatever model name they send (\"gpt-4o-mini\", ...), kept in the record "
                        "as sent; without it a name other than the served model's is a 404")
    p.add_argument("--upstream", default=None, metavar="URL",
                   help="proxy mode: forward every call to this OpenAI-compatible server (e.g. "
                        "http://127.0.0.1:8001/v1, vLLM, SGLang, llama.cpp, a hosted API) and record it at the "
                        "token layer; the local model only gives recorded tokens their ids")
    p.add_argument("--upstream-format", choices=("openai", "anthropic"), default=None,
                   help="the upstream's wire format (default: anthropic for a host on anthropic.com, else openai); "
                        "with anthropic the proxy takes POST /v1/messages and forwards it as it came")
    p.add_argument("--upstream-key-env", default=None, metavar="NAME",
                   help="the environment variable that holds the upstream's API key (sent as a bearer "
                        "token, never recorded)")
    p.add_argument("--max-body-mb", type=body_mb, default=None, metavar="MB",  # None: requests.MAX_BODY_MB
                   help="refuse a request body over this many MiB with a 413, before reading it (default 8; "
                        "a prompt longer than the model's context is a 400 however large)")
    p.set_defaults(func=cmd_serve)


def _check_port(host: str, port: int) -> None:
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ServeError(f"cannot listen on {host!r}: {exc.strerror}; pass --host with an address of this machine") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port") from None


def _upstream(args):
    import os

    from tttr.engine.serve.errors import APIError
    from tttr.engine.serve.proxy import Upstream
    from tttr.engine.serve.proxy_anthropic import AnthropicUpstream, upstream_format

    kind = AnthropicUpstream if upstream_format(args.upstream, args.upstream_format) == "anthropic" else Upstream
    key = None
    if args.upstream_key_env:
        key = os.environ.get(args.upstream_key_env)
        if not key:
            raise ServeError(f"--upstream-key-env {args.upstream_key_env}: that environment variable is not set "
                             "(or empty); export it with the upstream's API key")
    try:
        return kind(args.upstream, key=key, model=args.model)
    except APIError as exc:
        raise ServeError(str(exc)) from None


def _passive_openmp() -> None:
    """OpenMP threads that sleep when idle instead of spinning. The model loads on a thread
    that then exits, and the compiled kernels bring a second OpenMP runtime: with spinning
    waits the two fight for the cores and decoding runs several times slower (measured: 8.8 s
    instead of 0.26 s for 16 tokens on 2 cores). Read once, when OpenMP starts: before torch
    is imported."""
    import os

    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def cmd_serve(args) -> int:
    from tttr.engine.serve.service import Service

    _passive_openmp()

    if (args.upstream_key_env or args.upstream_format) and args.upstream is None:
        raise ServeError(f"{'--upstream-key-env' if args.upstream_key_env else '--upstream-format'} needs --upstream URL")
    upstream = _upstream(args) if args.upstream is not None else None  # --upstream '' is refused there
    # a wrong model path is refused before torch loads
    if args.any_model and upstream is not None:
        raise ServeError("--any-model answers with the local model; in proxy mode the upstream decides")
    if args.kernels is not None and upstream is not None:
        raise ServeError(f"--kernels {args.kernels} picks the local model's kernels; in proxy mode the upstream "
                         "computes the answers: drop --kernels or --upstream")
    service = (Service(args.model, kernel_mode=args.kernels or "invariant", any_model=args.any_model)
               if upstream is None else None)
    _check_port(args.host, args.port)
    recorder = None
    if args.db:
        from tttr.engine.serve.recorder import CallRecorder

        recorder = CallRecorder(args.db, service)

    import uvicorn

    from tttr.engine.serve.modes import Live, Proxied
    from tttr.engine.serve.requests import MAX_BODY_MB
    from tttr.engine.serve.server import create_app

    def announce(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    from tttr.engine.serve.proxy_anthropic import AnthropicUpstream, ProxiedMessages

    if upstream is None:
        mode = Live(service)
    else:  # the upstream's wire format decides what answers
        mode = ProxiedMessages(upstream) if isinstance(upstream, AnthropicUpstream) else Proxied(upstream)
    app = create_app(mode, recorder, announce=announce, max_body_mb=args.max_body_mb or MAX_BODY_MB)
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    where = f"recording to {args.db}" if args.db else "not recording (pass --db FILE)"
    serving = (f"proxy to {upstream.shown} (token layer only)" if upstream is not None
               else f"model {service.model_id} · kernels {service.kernel_mode}")
    print(f"tttr serve: http://{shown_host}:{args.port}/v1 · {serving} · {where}"
          f"{'' if upstream is not None else ' · loading the model…'}", flush=True)
    # The app's startup and shutdown run here rather than in uvicorn's lifespan: uvicorn
    # re-raises Ctrl-C once it has stopped serving, and a lifespan task would die in it.
    server = app.state.server
    logging.getLogger("uvicorn.error").addFilter(quiet_shutdown)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=5)
    server.startup()
    try:
        uvicorn.Server(config).run()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    announce("tttr serve: stopped")
    return 0


def quiet_shutdown(record: logging.LogRecord) -> bool:
    """uvicorn's error log, less what Ctrl-C makes of calls in flight: sse-starlette ends open
    streams itself when the server stops, and uvicorn cancels the requests still running; it
    then reports each as an error ("without completing response", or "Exception in ASGI
    application" with a CancelledError traceback) although the call was cancelled and
    recorded as it should be."""
    import asyncio

    if "without completing response" in record.getMessage():
        return False
    return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))
