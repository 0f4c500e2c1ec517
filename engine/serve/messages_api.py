"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) over the
chat machinery.

A Messages request is translated into the chat completions request it means — `system` into
a system message, text blocks into message text, an assistant turn's `tool_use` blocks into its
tool calls, a user turn's `tool_result` blocks into tool messages, `stop_sequences` into
`stop`, tools' `input_schema` into function parameters — and that chat call runs, is recorded
and is replayed exactly as a `/v1/chat/completions` call (the translation is deterministic, so
a replayed program's request matches its recording). The chat answer is then shaped as a
`message` object, or, when `stream` is true, as Anthropic's stream of events (`message_start`,
`content_block_start`, `content_block_delta`, `content_block_stop`, `message_delta`,
`message_stop`), made from the chat stream as its text comes.

Errors are Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`. What has no
chat counterpart is refused with one line naming the field: content blocks other than text,
tool_use and tool_result (images, documents, thinking …), server tools, extended thinking.
`metadata`, `service_tier`, `cache_control`, `context_management`, `output_config`'s effort and
`thinking: {"type": "adaptive"}` (the model decides whether to think: this one never does) are
accepted and have no effect; `output_config.format` (structured outputs) is refused. A `system`
message inside `messages` (the Claude Code CLI sends its environment as one after the first user
turn) is a system message at that place."""

from __future__ import annotations

import json
import re
from typing import AsyncIterator

from tttr.engine.serve.errors import APIError, bad_request
from tttr.engine.serve.tools import function_tool, merge_tool_call

BLOCKS = ("text", "tool_use", "tool_result")  # the content blocks this server reads
ROLES = ("user", "assistant")
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}  # a chat finish_reason's Messages name
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}
# A chat parameter's name in the Messages request it came from (errors name what the program sent).
NAMES = {"stop": "stop_sequences", "max_tokens": "max_tokens", "tools": "tools", "tool_choice": "tool_choice"}


# ---------------------------------------------------------------------------- the request
def to_chat(body: object, *, counting: bool = False) -> dict:
    """The chat completions body a Messages request means; APIError (400) for what the
    translation cannot carry. `counting`: a count_tokens body (no `max_tokens`, no sampling).
    A streamed request's chat call streams too, usage included."""
    if not isinstance(body, dict):
        raise bad_request(None, f"the request body is {type(body).__name__}; send a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise bad_request("model", "model: a string is required (the served model's name; any name under tttr record)",
                          "missing_required_parameter")
    messages = _system(body.get("system")) + _messages(body.get("messages"))
    chat: dict = {"model": body["model"], "messages": messages}
    tools = body.get("tools")
    if tools:
        chat["tools"] = _tools(tools)
    if body.get("tool_choice") is not None:
        chat.update(_tool_choice(body["tool_choice"]))
    _thinking(body.get("thinking"))
    _output_format(body.get("output_config"))
    if counting:
        return chat
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise bad_request("max_tokens", "max_tokens: an integer is required (the most tokens to generate)",
                          "missing_required_parameter")
    chat["max_tokens"] = max_tokens
    temperature = body.get("temperature")
    if temperature is not None:
        if type(temperature) not in (int, float) or not 0 <= temperature <= 1:
            raise bad_request("temperature", f"temperature: {temperature!r} is not a number in 0..1")
        chat["temperature"] = temperature
    for name in ("top_p", "top_k", "seed"):  # seed: tttr's extension, as on the chat route
        if body.get(name) is not None:
            chat[name] = body[name]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad_request("stop_sequences", "stop_sequences must be a list of non-empty strings")
        if stops:
            chat["stop"] = list(stops)
    if body.get("stream") is True:
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    return chat


def _text_blocks(content: object, where: str) -> str:
    """A system prompt or tool result: a string, or text blocks joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(where, f"{where} must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise bad_request(f"{where}[{j}]", f"{where}[{j}] of type {kind!r} is not supported here: send text "
                              "blocks ({\"type\": \"text\", \"text\": ...})")
        texts.append(block["text"])
    return "".join(texts)


def _system(system: object) -> list[dict]:
    if system is None:
        return []
    text = _text_blocks(system, "system")
    return [{"role": "system", "content": text}] if text else []


def _messages(messages: object) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", "messages must be a non-empty list of {role, content}",
                          "missing_required_parameter" if messages is None else "invalid_value")
    out: list[dict] = []
    called: set[str] = set()  # the ids of the tool_use blocks so far
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(where, f"{where} must be an object, not {type(message).__name__}")
        role = message.get("role")
        if role == "system":  # a system message between turns (the Claude Code CLI sends its environment so)
            text = _text_blocks(message.get("content"), f"{where}.content")
            out.append({"role": "system", "content": text})
            continue
        if role not in ROLES:
            raise bad_request(f"{where}.role", f"{where}.role={role!r}: use user, assistant or system (the system "
                              "prompt is the top-level `system` field)")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad_request(f"{where}.content", f"{where}.content must be a string or a list of content blocks")
        out += _blocks(role, content, f"{where}.content", called)
    return out


def _blocks(role: str, blocks: list, where: str, called: set[str]) -> list[dict]:
    """One turn's content blocks as chat messages: a user turn's tool results become tool
    messages (in order, around its text), an assistant turn's tool_use blocks its tool calls."""
    out: list[dict] = []
    texts: list[str] = []
    calls: list[dict] = []

    def flush_text() -> None:
        if texts:
            out.append({"role": role, "content": "".join(texts)})
            texts.clear()

    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in BLOCKS:
            raise bad_request(f"{at}.type", f"{at}.type={kind!r} is not supported: this server reads "
                              f"{', '.join(BLOCKS)} blocks")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise bad_request(f"{at}.text", f"{at}.text must be a string")
            texts.append(block["text"])
        elif kind == "tool_use":
            if role != "assistant":
                raise bad_request(at, f"{at}: a tool_use block belongs in an assistant turn")
            call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(args, dict):
                raise bad_request(at, f"{at}: a tool_use block needs a string id and name and an object input")
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
            called.add(call_id)
        else:  # tool_result
            if role != "user":
                raise bad_request(at, f"{at}: a tool_result block belongs in a user turn")
            call_id = block.get("tool_use_id")
            if call_id not in called:
                raise bad_request(f"{at}.tool_use_id", f"{at}.tool_use_id={call_id!r} answers no tool_use block "
                                  "before it; send the whole conversation, the assistant's tool_use first")
            flush_text()
            result = block.get("content", "")
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text_blocks(result, f"{at}.content")})
    if role == "assistant":
        message: dict = {"role": "assistant", "content": "".join(texts) or None}
        if calls:
            message["tool_calls"] = calls
        elif message["content"] is None:
            message["content"] = ""
        return out + [message]
    flush_text()
    if not out:
        out.append({"role": role, "content": ""})
    return out


def _tools(tools: object) -> list[dict]:
    if not isinstance(tools, list):
        raise bad_request("tools", "tools must be a list of {name, description, input_schema}")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad_request(f"tools[{i}]", f"tools[{i}] must be an object")
        kind = tool.get("type", "custom")
        if kind not in ("custom", None):
            raise bad_request(f"tools[{i}].type", f"tools[{i}].type={kind!r} is not supported: this server offers "
                              "the model client tools only ({name, description, input_schema}), no server tools")
        out.append(function_tool(i, tool, "input_schema"))
    return out


def _tool_choice(choice: object) -> dict:
    kind = choice.get("type") if isinstance(choice, dict) else None
    out: dict = {}
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "any":
        out["tool_choice"] = "required"  # refused by the chat check, which says why
    elif kind == "tool" and isinstance(choice.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise bad_request("tool_choice", f"tool_choice={choice!r}: use {{\"type\": \"auto\"}}, none, any or "
                          "{\"type\": \"tool\", \"name\": ...}")
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def _thinking(thinking: object) -> None:
    """`adaptive` lets the model decide whether to think: one without thinking answers as it is."""
    if thinking is None or (isinstance(thinking, dict) and thinking.get("type") in ("disabled", "adaptive")):
        return
    raise bad_request("thinking", "thinking is not supported: the served model has no extended thinking; "
                      "drop `thinking` or set it to {\"type\": \"disabled\"}")


# ---------------------------------------------------------------------------- over a mode's chat call
async def over_chat(mode, server, request, body: object):
    """The response to Messages request `body` where `mode` answers it as the chat call it
    means (`mode.answer(..., "chat", chat)`): that answer shaped as a message or Anthropic's
    stream, its error in Anthropic's shape."""
    from starlette.responses import JSONResponse

    from tttr.engine.serve.httpio import events

    try:
        chat = to_chat(body)
    except APIError as exc:
        return JSONResponse(error_of(exc), status_code=exc.status)
    answered = await mode.answer(server, request, "chat", chat)
    if answered.status_code != 200:  # the chat route's error, in Anthropic's shape
        return JSONResponse(error_from_chat(json.loads(answered.body or b"{}"), answered.status_code),
                            status_code=answered.status_code)
    if chat.get("stream"):
        return events(from_chat_stream(body, answered.body_iterator))
    return JSONResponse(to_message(body, json.loads(answered.body)))


def _output_format(config: object) -> None:
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is not None:
        raise bad_request("output_config.format", "output_config.format (structured outputs) is not supported: this "
                          "server returns plain text; ask for the format in the prompt and parse the text")


# ---------------------------------------------------------------------------- errors
def error_json(message: str, status: int) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def error_from_chat(answer: object, status: int) -> dict:
    """The chat call's error answer in Anthropic's shape, in the names of the Messages request
    that made it (`stop` is `stop_sequences`)."""
    error = answer.get("error") if isinstance(answer, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        message = f"the request failed with HTTP {status}"
    message = re.sub(r"\bstop\b(?= must| has| is|:)", "stop_sequences", message)
    return error_json(message, status)


def error_of(exc: APIError) -> dict:
    return error_json(exc.message, exc.status)


# ---------------------------------------------------------------------------- the answer
def _suffix(chat: dict) -> str:
    return str(chat.get("id", "")).split("-", 1)[-1] or "0"


def _stop(body: dict, finish: str | None, said: object) -> tuple[str, str | None]:
    """stop_reason and stop_sequence for a chat call that finished with `finish`: a `stop`
    finish is a stop sequence when the answer's `tttr.stop_sequence` (`said`: the engine's, or
    the recording's on replay) is one the request sent."""
    if finish in STOP_REASONS:
        return STOP_REASONS[finish], None
    if isinstance(said, str) and said in (body.get("stop_sequences") or []):
        return "stop_sequence", said
    return "end_turn", None


def _input(arguments: object) -> dict:
    """A tool call's arguments as the tool_use block's input (an object)."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _content(text: str, calls: list[dict]) -> list[dict]:
    content: list[dict] = [{"type": "text", "text": text}] if text or not calls else []
    for call in calls:
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"),
                        "input": _input(fn.get("arguments"))})
    return content


def _usage(usage: dict | None) -> dict:
    usage = usage or {}
    return {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)}


def to_message(body: dict, chat: dict) -> dict:
    """The `message` object for a chat completion `chat` answering `body`."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    reason, sequence = _stop(body, choice.get("finish_reason"), (chat.get("tttr") or {}).get("stop_sequence"))
    out = {"id": f"msg_{_suffix(chat)}", "type": "message", "role": "assistant", "model": chat.get("model"),
           "content": _content(text, list(message.get("tool_calls") or [])), "stop_reason": reason,
           "stop_sequence": sequence, "usage": _usage(chat.get("usage"))}
    if "tttr" in chat:
        out["tttr"] = chat["tttr"]
    return out


def _event(kind: str, **fields) -> dict:
    return {"event": kind, "data": json.dumps({"type": kind, **fields}, ensure_ascii=False)}


async def from_chat_stream(body: dict, chunks) -> AsyncIterator[dict]:
    """Anthropic's stream for `body`, made as the chat stream `chunks` (its server-sent events:
    dicts with a JSON `data`, usage asked for) comes: each text delta is sent on as it is
    generated; tool_use blocks, whose arguments are known at the end, follow the text. An
    error in the chat stream ends it with an `error` event."""
    try:
        async for e in _from_chat(body, chunks):
            yield e
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:  # a client gone: the chat call it started is cancelled with its stream
            await close()


async def _from_chat(body: dict, chunks) -> AsyncIterator[dict]:
    chat: dict = {}
    text: list[str] = []
    calls: list[dict] = []
    said = None  # the stop string that ended the text (the last chunk's tttr.stop_sequence)
    opened = False  # the text block
    async for sse in chunks:
        data = sse.get("data") if isinstance(sse, dict) else None
        if not isinstance(data, str) or data.startswith("[DONE]"):
            continue
        chunk = json.loads(data)
        if "error" in chunk:  # as the chat stream reports a failure
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            yield _event("error", error={"type": "api_error", "message": str(err.get("message"))})
            return
        if not chat:
            chat = {k: chunk.get(k) for k in ("id", "created", "model")}
            start = {"id": f"msg_{_suffix(chat)}", "type": "message", "role": "assistant", "model": chat.get("model"),
                     "content": [], "stop_reason": None, "stop_sequence": None,
                     "usage": {"input_tokens": 0, "output_tokens": 0}}
            if "tttr" in chunk:
                start["tttr"] = chunk["tttr"]
            yield _event("message_start", message=start)
        if chunk.get("usage"):
            chat["usage"] = chunk["usage"]
        said = (chunk.get("tttr") or {}).get("stop_sequence", said)
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            for piece in delta.get("tool_calls") or []:
                merge_tool_call(calls, piece)
            if choice.get("finish_reason"):
                chat["finish_reason"] = choice["finish_reason"]
            piece = delta.get("content")
            if piece:
                if not opened:
                    opened = True
                    yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                text.append(piece)
                yield _event("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
    if not chat:
        yield _event("error", error={"type": "api_error", "message": "the model's stream ended before its first chunk"})
        return
    if not opened and not calls:  # as the whole answer has it: one text block, empty
        opened = True
        yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
    if opened:
        yield _event("content_block_stop", index=0)
    for i, call in enumerate(calls, start=1 if opened else 0):
        fn = call.get("function") or {}
        yield _event("content_block_start", index=i,
                     content_block={"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": {}})
        arguments = json.dumps(_input(fn.get("arguments")), ensure_ascii=False)
        yield _event("content_block_delta", index=i, delta={"type": "input_json_delta", "partial_json": arguments})
        yield _event("content_block_stop", index=i)
    reason, sequence = _stop(body, chat.get("finish_reason"), said)
    yield _event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                 usage=_usage(chat.get("usage")))
    yield _event("message_stop")
