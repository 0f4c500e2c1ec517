"""An OpenAI request body, checked field by field into a `CallRequest`.

Every refusal is an `APIError` naming the parameter and the offending value, answered with
status 400 — the check happens before any model work, so a bad request costs nothing.
Unknown fields are ignored, as OpenAI's own server and vLLM's do (clients send extras); but a
known OpenAI parameter that would change the answer and that this server cannot honour
(`response_format` other than text, penalties, `logit_bias`) is refused, never ignored."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from tttr.engine.serve.errors import bad_request

SEED_LIMIT = 2**63
MAX_TOP_LOGPROBS = 20
MAX_STOPS = 4
# A request body over this many MiB is refused (413) before it is read or parsed: `tttr serve
# --max-body-mb` sets it, and the in-process servers of `tttr record` and replay use it.
MAX_BODY_MB = 8
ROLES = ("system", "developer", "user", "assistant", "tool")
# The model routes, by endpoint (CallRequest.endpoint, and the Responses API translated into a chat call).
ROUTES = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "responses": "/v1/responses",
          "messages": "/v1/messages"}


@dataclass(frozen=True, slots=True)
class CallRequest:
    """One chat or completion call, as the engine will run it."""

    endpoint: str  # "chat" | "completion"
    model: str | None
    messages: tuple[dict, ...] = ()  # chat: normalised messages (content is text)
    prompt: str | tuple[int, ...] | None = None  # completion: text or token ids
    tools: tuple[dict, ...] = ()
    tool_choice: Any = None  # None | "auto" | "none"
    parallel_tool_calls: bool = True  # False: an answer keeps its first tool call only, as OpenAI's has one at most
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None  # None: the server draws one and returns it
    max_tokens: int | None = None  # None: the rest of the context
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    body: dict = field(default_factory=dict, compare=False, repr=False)  # as received, for the record

    def sampling_json(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


def _number(body: dict, name: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad_request(name, f"{name}={v!r} is not a number; use a number in {'(' if lo_open else '['}{lo}, {hi}]")
    if v > hi or v < lo or (lo_open and v == lo):
        raise bad_request(name, f"{name}={v!r} is out of range; use a number in {'(' if lo_open else '['}{lo}, {hi}]")
    return float(v)


def _integer(body: dict, name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(name, f"{name}={v!r} is not an integer; use an integer in [{lo}, {hi}]")
    if not lo <= v <= hi:
        raise bad_request(name, f"{name}={v!r} is out of range; use an integer in [{lo}, {hi}]")
    return v


def _bool(body: dict, name: str) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad_request(name, f"{name}={v!r} is not a boolean; use true or false")
    return v


def check_text(body: Any) -> None:
    """Refuses a string (or key) anywhere in the body that is not Unicode text: a lone UTF-16
    surrogate (JSON's `"\\ud83d"` without its pair) cannot be tokenized or stored. `param` is
    its path (`messages[0].content`)."""
    try:  # the common case, at C speed (a 16 MiB body: tens of ms, where walking it took a second)
        json.dumps(body, ensure_ascii=False).encode("utf-8")
        return
    except (UnicodeEncodeError, RecursionError, TypeError, ValueError):
        pass  # find where, walking it
    todo: list[tuple[Any, str]] = [(body, "")]
    while todo:  # iterative: the body may nest as deep as the JSON parser allows
        value, where = todo.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise bad_request(where or None, f"{where or 'the body'} holds a lone UTF-16 surrogate "
                                      f"({value[exc.start]!r} at character {exc.start}): send valid Unicode text") from None
        elif isinstance(value, dict):
            for k, v in value.items():
                todo.append((k, where or None))
                todo.append((v, f"{where}.{k}" if where else str(k)))
        elif isinstance(value, list):
            todo.extend((v, f"{where}[{i}]") for i, v in enumerate(value))


UNHONOURED_FORMATS = ("json_object", "json_schema")


def _unhonoured(body: dict) -> None:
    """OpenAI's parameters that change the answer and that this engine cannot apply: refused
    (400 naming it) unless they ask for nothing (0, {}, {"type": "text"}); ignoring them would
    answer something other than what was asked for, and record it as if it were."""
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind in UNHONOURED_FORMATS:
            raise bad_request("response_format", f"response_format of type {kind!r} is not supported: this server "
                              "cannot constrain the answer to JSON; leave it out, ask for JSON in the prompt and "
                              "parse the text")
        if kind != "text":
            raise bad_request("response_format", f"response_format={str(fmt)[:80]!r}: use {{\"type\": \"text\"}} or leave it out")
    for name in ("frequency_penalty", "presence_penalty"):
        v = _number(body, name, 0.0, -2.0, 2.0)
        if v != 0:
            raise bad_request(name, f"{name}={body[name]!r} is not supported: this server samples without "
                              "penalties; leave it out (or 0)")
    bias = body.get("logit_bias")
    if bias is not None and bias != {}:
        raise bad_request("logit_bias", "logit_bias is not supported: this server samples from the model's own "
                          "distribution; leave it out (or {})")
    for name in ("functions", "function_call"):  # the deprecated form of tools: ignored, the model would not see them
        if body.get(name) not in (None, [], "none", "auto"):
            raise bad_request(name, f"{name} (deprecated by OpenAI) is not supported: send the functions as `tools` "
                              "(and `tool_choice`)")
    modalities = body.get("modalities")
    if (modalities is not None and modalities != ["text"]) or body.get("audio") is not None:
        name = "audio" if body.get("audio") is not None else "modalities"
        raise bad_request(name, f"{name} is not supported: this server answers with text only; leave it out")
    if body.get("web_search_options") is not None:
        raise bad_request("web_search_options", "web_search_options is not supported: this server has no web "
                          "search; leave it out")


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts (joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                out.append(part["refusal"])  # an earlier assistant answer, sent back as OpenAI returned it
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{where}.content", f"{where}.content[{i}] is a {kind!r} part; this model takes text "
                           "parts only ({\"type\": \"text\", \"text\": ...})")
        return "".join(out)
    raise bad_request(f"{where}.content", f"{where}.content is {type(content).__name__}; use a string or a list of text parts")


def _messages(body: dict) -> tuple[dict, ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("messages", "messages must be a non-empty list of {role, content} objects",
                   "missing_required_parameter" if msgs is None else "invalid_value")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(where, f"{where} is {type(m).__name__}; each message is an object with role and content")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role", f"{where}.role={role!r} is not one of {', '.join(ROLES)}")
        content = m.get("content")
        if content is None and role == "assistant" and isinstance(m.get("refusal"), str):
            content = m["refusal"]  # an earlier refusal, sent back as OpenAI returned it
        if content is None and not (role == "assistant" and m.get("tool_calls")):
            raise bad_request(f"{where}.content", f"{where}.content is {'null' if 'content' in m else 'missing'}: "
                              f"a {role} message needs content (a string or a list of text parts); only an "
                              "assistant message with tool_calls may have none",
                              "invalid_value" if "content" in m else "missing_required_parameter")
        msg: dict = {"role": "system" if role == "developer" else role, "content": _text(content, where)}
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise bad_request(f"{where}.tool_calls", f"{where}.tool_calls must be a list, on an assistant message")
            msg["tool_calls"] = [_history_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
        if role == "tool":
            if not isinstance(m.get("tool_call_id", ""), str):
                raise bad_request(f"{where}.tool_call_id", f"{where}.tool_call_id must be a string")
            msg["tool_call_id"] = m.get("tool_call_id", "")
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return tuple(out)


def _history_call(c: Any, where: str) -> dict:
    """An earlier assistant tool call, as chat templates expect it (arguments as an object
    where it is JSON, the way Hugging Face templates read them)."""
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(where, f"{where} needs function.name")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            pass
    return {"id": c.get("id", ""), "type": "function", "function": {"name": fn["name"], "arguments": args}}


def _tools(body: dict) -> tuple[tuple[dict, ...], Any]:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice", f"tool_choice={choice!r} needs tools")
        return (), None
    if not isinstance(tools, list):
        raise bad_request("tools", "tools must be a list of {type: function, function: {name, parameters}}")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"tools[{i}]", f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                       "\"parameters\": {...}}}}")
    if choice is None:
        choice = "auto"
    if choice not in ("auto", "none"):
        raise bad_request("tool_choice", f"tool_choice={choice!r} is not supported: this server cannot force a call; "
                   "use \"auto\" or \"none\"")
    return tuple(tools), choice


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOPS:
        raise bad_request("stop", f"stop={stop!r}: use a non-empty string or a list of at most {MAX_STOPS} of them")
    return tuple(stop)


def _common(body: dict) -> dict:
    check_text(body)
    _unhonoured(body)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise bad_request("n", f"n={n!r} is not supported: this server returns one choice per request; send n=1 "
                   "(or several requests, each with its own seed)")
    if body.get("best_of") not in (None, 1):
        raise bad_request("best_of", f"best_of={body['best_of']!r} is not supported; leave it out")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model", f"model={model!r} is not a string")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad_request("stream_options", "stream_options must be an object such as {\"include_usage\": true}")
    stream = _bool(body, "stream")
    if opts is not None and not stream:  # as OpenAI answers it
        raise bad_request("stream_options", "stream_options is only allowed with stream=true")
    return dict(
        model=model,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=_top_k(body),
        seed=_integer(body, "seed", 0, SEED_LIMIT - 1),
        stop=_stop(body),
        stream=stream,
        include_usage=bool(stream and opts and opts.get("include_usage") is True),
        body=body,
    )


def _top_k(body: dict) -> int:
    # -1 is vLLM's "no limit"; 0 is TTTR's
    k = _integer(body, "top_k", -1, 2**31 - 1)
    return 0 if k is None or k == -1 else k


def _max_tokens(body: dict, *names: str) -> int | None:
    for name in names:
        v = _integer(body, name, 1, 2**31 - 1)
        if v is not None:
            return v
    return None


def parse_chat(body: Any) -> CallRequest:
    """A `/v1/chat/completions` body, checked."""
    if not isinstance(body, dict):
        raise bad_request(None, f"the request body is {type(body).__name__}; send a JSON object")
    common = _common(body)
    tools, choice = _tools(body)
    logprobs = _bool(body, "logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top and not logprobs:
        raise bad_request("top_logprobs", "top_logprobs needs logprobs=true")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls", f"parallel_tool_calls={parallel!r} is not a boolean; use true or false")
    return CallRequest(endpoint="chat", messages=_messages(body), tools=tools, tool_choice=choice,
                       parallel_tool_calls=parallel is not False,
                       max_tokens=_max_tokens(body, "max_completion_tokens", "max_tokens"),
                       logprobs=logprobs, top_logprobs=top, **common)


def parse_completion(body: Any) -> CallRequest:
    """A `/v1/completions` body, checked. `logprobs` is the legacy integer (0..20)."""
    if not isinstance(body, dict):
        raise bad_request(None, f"the request body is {type(body).__name__}; send a JSON object")
    common = _common(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt = tuple(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise bad_request("prompt", "prompt must be a non-empty string or a list of token ids (one prompt per request)",
                   "missing_required_parameter" if prompt is None else "invalid_value")
    if _bool(body, "echo"):
        raise bad_request("echo", "echo=true is not supported; leave it out")
    if body.get("suffix"):
        raise bad_request("suffix", "suffix is not supported; leave it out")
    top = _integer(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    return CallRequest(endpoint="completion", prompt=prompt, max_tokens=_max_tokens(body, "max_tokens") or 16,
                       logprobs=top is not None, top_logprobs=top or 0, **common)
