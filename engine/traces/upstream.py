"""Model calls that a program replayed against an imported trace makes after the divergence,
sent to another OpenAI-compatible server (`--upstream URL`) instead of the engine here: the
model the trace was recorded with, a vLLM or SGLang box, any hosted API.

Each call is sent as the program sent it (a streamed one whole: the replay's server streams the
answer back as the program asked), and written into the new run as a recording writes a call:
its request and its answer, with the upstream named (without any user:password part). No
tensor or token is seen here. The API key comes from the environment variable
`--upstream-key-env` names, sent as `Authorization: Bearer`, never recorded."""

from __future__ import annotations

import os

from tttr.engine.serve.errors import APIError
from tttr.engine.traces.errors import TraceError

ROUTES = {"chat": "/chat/completions", "completion": "/completions"}
TIMEOUT_S = 600.0


def check_upstream(url: str, key_env: str | None) -> tuple[str, str | None]:
    """(the API root, the key) of `--upstream URL [--upstream-key-env NAME]`; TraceError (one line)
    for a URL that is not http(s) or a variable that is not set."""
    from tttr.engine.serve.proxy import base_url

    try:
        base = base_url(url)
    except APIError as exc:
        raise TraceError(str(exc)) from None
    key = None
    if key_env is not None:
        key = os.environ.get(key_env)
        if not key:
            raise TraceError(f"--upstream-key-env {key_env}: that environment variable is not set (or empty); "
                             "export the API key in it, or drop --upstream-key-env")
    return base, key


class UpstreamCalls:
    """The live model calls of a replay (engine/program/live.py's LiveCalls' place), upstream."""

    def __init__(self, base: str, key: str | None, recorder):
        from tttr.engine.serve.proxy import shown_url

        self.base, self.key, self.recorder = base, key, recorder
        self.shown = shown_url(base)
        self.logits_computed = 0  # none here: the upstream computes
        self.calls_generated = 0

    def start_loading(self) -> None:
        """Nothing loads here."""

    def generate(self, name, endpoint: str, body: dict, *, forced: dict | None = None, settings: dict | None = None):
        """The upstream's answer to the program's request `body`, recorded; an APIError (which the
        program gets) when there is none."""
        try:  # the HTTP client the `openai` package is built on (httpx2 where it has moved to it), as proxy.py's
            import httpx2 as httpx
        except ImportError:  # pragma: no cover - depends on the installed openai
            import httpx

        if forced is not None:
            return APIError("a token fork's call cannot be forced on an upstream", status=422, code="unsupported")
        send = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        try:
            r = httpx.post(self.base + ROUTES.get(endpoint, ROUTES["chat"]), json=send, headers=headers, timeout=TIMEOUT_S)
        except httpx.HTTPError as exc:
            return APIError(f"--upstream {self.shown} did not answer: {exc}", status=502, code="upstream_unreachable")
        try:
            answer = r.json()
        except ValueError:
            answer = None
        if r.status_code >= 400 or not isinstance(answer, dict) or not isinstance(answer.get("choices"), list) \
                or not answer["choices"] or not isinstance(answer["choices"][0], dict):
            return APIError(f"--upstream {self.shown} answered {r.status_code} without a completion: {r.text[:200]}",
                            status=502, code="upstream_error")
        choice = answer["choices"][0]
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        text = message.get("content") if endpoint == "chat" else choice.get("text")
        value = {"text": text if isinstance(text, str) else "", "finish_reason": choice.get("finish_reason"),
                 "model": answer.get("model"), "upstream": self.shown}
        if isinstance(message.get("tool_calls"), list) and message["tool_calls"]:
            value["tool_calls"] = message["tool_calls"]
        self.recorder.record_copy(name, [("prompt", None, {"request": body, "endpoint": endpoint, "upstream": self.shown}),
                                         ("message", None, value)])
        self.calls_generated += 1
        return answer

    def close(self) -> None:
        """Nothing to close: each call is one request."""


__all__ = ["UpstreamCalls", "check_upstream"]
