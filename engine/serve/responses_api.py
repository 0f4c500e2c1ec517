"""OpenAI's Responses API (`POST /v1/responses`) over the chat machinery.

A Responses request is translated into the chat completions request it means — `instructions`
and `input` items into messages, function tools into chat tools, `max_output_tokens` into
`max_tokens` — and that chat call runs, is recorded and is replayed exactly as a
`/v1/chat/completions` call (the translation is deterministic, so a replayed program's
request matches its recording). The chat answer is then shaped as a `Response` object, or, when
`stream` is true, as the Responses stream's events, made from the chat call's stream as its
text comes. This is what the OpenAI Agents SDK and other Responses clients send by default.

What has no chat counterpart is refused with one line naming the parameter: responses kept on
the server (`previous_response_id`, `conversation`, `background`), built-in tools (web search,
file search, computer use …), images and files in the input, and structured-output formats.
Fields that steer only OpenAI's own service (`store`, `metadata`, `reasoning`, `include`,
`truncation`, `text.verbosity` …) are accepted and have no effect."""

from __future__ import annotations

import json
import re
from typing import AsyncIterator, Iterator

from tttr.engine.serve.errors import bad_request
from tttr.engine.serve.requests import check_text
from tttr.engine.serve.tools import function_tool, merge_tool_call

INPUT_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text")
SKIPPED_ITEMS = ("reasoning",)  # a reasoning model's own notes: nothing a chat template reads
UNKEPT = ("previous_response_id", "conversation", "prompt")  # state kept by OpenAI's service
LOGPROBS = "message.output_text.logprobs"  # the `include` entry asking for the text's logprobs; others add nothing here


# ---------------------------------------------------------------------------- the request
def to_chat(body: object) -> dict:
    """The chat completions body a Responses request means; APIError (400) for what the
    translation cannot carry. A streamed request's chat call streams too, usage included
    (`from_chat_stream` makes the Responses stream from it)."""
    if not isinstance(body, dict):
        raise bad_request(None, f"the request body is {type(body).__name__}; send a JSON object")
    check_text(body)  # in this request's names (`input[0].content`), not the chat call's
    for name in UNKEPT:
        if body.get(name) is not None:
            raise bad_request(name, f"{name} is not supported: this server keeps no responses or prompts; send the "
                       "whole conversation in `input` (the Agents SDK does unless told to chain responses)")
    if body.get("background") is True:
        raise bad_request("background", "background=true is not supported: this server answers while you wait")
    messages: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("instructions", "instructions must be a string")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    messages += _input_messages(body.get("input"))
    chat: dict = {"messages": messages}
    for name in ("model", "temperature", "top_p", "seed", "top_k", "stop", "parallel_tool_calls"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("top_logprobs") or LOGPROBS in _include(body.get("include")):
        chat["logprobs"], chat["top_logprobs"] = True, body.get("top_logprobs") or 0
    if body.get("stream") is True:
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    _text_format(body.get("text"))
    tools = body.get("tools")
    if tools:
        chat["tools"] = _tools(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = choice if isinstance(choice, str) else _forced(choice)
    return chat


def _include(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request("include", "include must be a list of strings")
    return value


def _input_messages(items: object) -> list[dict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("input", "input must be a non-empty string or a list of items",
                   "missing_required_parameter" if items is None else "invalid_value")
    out: list[dict] = []
    called: set[str] = set()  # the call ids of the function_call items so far
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(where, f"{where} must be an object, not {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "message":
            role = INPUT_ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None
            if role is None:
                raise bad_request(f"{where}.role", f"{where}.role={item.get('role')!r}: use one of {', '.join(INPUT_ROLES)}")
            out.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # one assistant turn may call several tools
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            called.add(call["id"])
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            if call_id not in called:  # as OpenAI refuses it: an answer to no call
                raise bad_request(f"{where}.call_id", f"{where}.call_id={call_id!r} answers no function_call item before "
                           "it; send the whole conversation, the function_call item first")
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind in SKIPPED_ITEMS:
            continue
        else:
            raise bad_request(f"{where}.type", f"{where}.type={kind!r} is not supported: this server reads messages, "
                       "function_call and function_call_output items")
    if not out:
        raise bad_request("input", "input holds no message to answer")
    return out


def _string(item: dict, name: str, where: str) -> str:
    v = item.get(name)
    if not isinstance(v, str):
        raise bad_request(f"{where}.{name}", f"{where}.{name} must be a string, not {type(v).__name__}",
                   "missing_required_parameter" if v is None else "invalid_value")
    return v


def _content(content: object, where: str) -> str:
    """A message's content as text: a string, or text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(where, f"{where} must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise bad_request(f"{where}[{j}]", f"{where}[{j}] of type {kind!r} is not supported: this server reads "
                       "text parts (input_text, output_text) only")
    return "".join(texts)


def _text_format(text: object) -> None:
    if text is None:
        return
    if not isinstance(text, dict):
        raise bad_request("text", "text must be an object such as {\"format\": {\"type\": \"text\"}}")
    fmt = text.get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        raise bad_request("text.format", f"text.format of type {kind!r} is not supported: this server returns plain "
                   "text; ask for the format in the instructions and parse the text")


def _tools(tools: object) -> list[dict]:
    if not isinstance(tools, list):
        raise bad_request("tools", "tools must be a list of {type: function, name, parameters}")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise bad_request(f"tools[{i}]", f"tools[{i}] of type {kind!r} is not supported: this server offers the "
                       "model function tools only (no built-in tools)")
        out.append(function_tool(i, tool, "parameters"))
    return out


def _forced(choice: object) -> dict:
    """A tool_choice object in the chat form (the chat check refuses forcing, with its reason)."""
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice  # type: ignore[return-value]  - refused by the chat check, which names it


# ---------------------------------------------------------------------------- the answer
# A chat parameter's name in the Responses request it was translated from, where the translation renames it
# (errors and a replay's divergence reports name what the program sent).
RESPONSES_NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "logprobs": "top_logprobs",
                   "stream_options": "stream"}


def error_from_chat(answer: dict) -> dict:
    """The chat call's error answer told in the names of the Responses request that made it:
    `param` (`messages…` is `input`, `max_tokens` is `max_output_tokens`), and `max_tokens` in its
    message (the context error's "lower max_tokens")."""
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return answer
    param = error.get("param")
    if isinstance(param, str):  # `messages[2].content` too: the input's items are not the messages one for one
        param = RESPONSES_NAMES.get(re.split(r"[.\[]", param, maxsplit=1)[0], param)
    message = error.get("message")
    if isinstance(message, str):
        message = re.sub(r"\bmax_tokens\b", "max_output_tokens", message)
    return {**answer, "error": {**error, "param": param, "message": message}}


def to_response(body: dict, chat: dict) -> dict:
    """The `Response` object for a chat completion `chat` answering `body`."""
    suffix = _suffix(chat)
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output: list[dict] = []
    if message.get("content") or not message.get("tool_calls"):
        part = {"type": "output_text", "text": message.get("content") or "", "annotations": []}
        if (choice.get("logprobs") or {}).get("content") is not None:
            part["logprobs"] = choice["logprobs"]["content"]
        output.append({"type": "message", "id": f"msg_{suffix}", "status": "completed", "role": "assistant",
                       "content": [part]})
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        output.append({"type": "function_call", "id": f"fc_{suffix}_{i}", "call_id": call.get("id"),
                       "name": fn.get("name"), "arguments": fn.get("arguments", ""), "status": "completed"})
    usage = chat.get("usage") or {}
    cut = choice.get("finish_reason") == "length"
    response = {
        "id": f"resp_{suffix}", "object": "response", "created_at": chat.get("created", 0),
        "status": "incomplete" if cut else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "model": chat.get("model"), "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True), "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None}, "store": False,
        "temperature": body.get("temperature", 1.0), "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0), "truncation": "disabled", "metadata": body.get("metadata") or {},
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": usage.get("completion_tokens", 0),
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": usage.get("total_tokens", 0)},
    }
    if "tttr" in chat:
        response["tttr"] = chat["tttr"]
    return response


class _Events:
    """Numbered server-sent events of one Responses stream: each with its event name and a
    JSON body carrying `type` and `sequence_number`."""

    def __init__(self):
        self.seq = 0

    def __call__(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"event": kind, "data": json.dumps({"type": kind, "sequence_number": self.seq - 1, **fields},
                                                  ensure_ascii=False)}


async def from_chat_stream(body: dict, chunks) -> AsyncIterator[dict]:
    """The Responses stream for `body`, made as the chat stream `chunks` (its server-sent
    events: dicts with a JSON `data`, a request with usage asked for) comes: each text delta
    is sent on as it is generated; the items are closed and the Response completed when the chat
    stream ends. An error in the chat stream ends it with an `error` event."""
    event = _Events()
    try:
        async for e in _from_chat(body, chunks, event):
            yield e
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:  # a client gone: the chat call it started is cancelled with its stream
            await close()


async def _from_chat(body: dict, chunks, event: _Events) -> AsyncIterator[dict]:
    chat: dict = {}
    text: list[str] = []
    calls: list[dict] = []  # by index: a proxied stream sends a call's arguments in pieces
    logprobs: list[dict] = []  # the text's, when asked for (`top_logprobs`)
    held: list[dict] = []  # those of tokens with no text yet: sent with the next delta
    opened = False
    async for sse in chunks:
        data = sse.get("data") if isinstance(sse, dict) else None
        if not isinstance(data, str) or data.startswith("[DONE]"):
            continue
        chunk = json.loads(data)
        if "error" in chunk:  # as the chat stream reports a failure
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            err = error_from_chat({"error": err})["error"]
            yield event("error", message=str(err.get("message")), code=err.get("code"), param=err.get("param"))
            return
        if not chat:
            chat = {k: chunk.get(k) for k in ("id", "created", "model")}
            opening = to_response(body, {**chat, "choices": [{"message": {}}]})
            opening.update(status="in_progress", output=[], incomplete_details=None)
            yield event("response.created", response=opening)
            yield event("response.in_progress", response=opening)
        if chunk.get("usage"):
            chat["usage"] = chunk["usage"]
        if "tttr" in chunk:
            chat["tttr"] = chunk["tttr"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            for piece in delta.get("tool_calls") or []:
                merge_tool_call(calls, piece)
            if choice.get("finish_reason"):
                chat["finish_reason"] = choice["finish_reason"]
            probs = (choice.get("logprobs") or {}).get("content") or []
            logprobs += probs
            held += probs
            piece = delta.get("content")
            if piece:
                if not opened:  # the message item opens with its first text
                    opened = True
                    for e in _open_message(event, _message_id(chat)):
                        yield e
                text.append(piece)
                yield event("response.output_text.delta", item_id=_message_id(chat), output_index=0, content_index=0,
                            delta=piece, logprobs=held)
                held = []
    if not chat:
        yield event("error", message="the model's stream ended before its first chunk", code="server_error",
                    param=None)
        return
    message = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    final = to_response(body, {**chat, "choices": [{"message": message, "finish_reason": chat.get("finish_reason"),
                                                    "logprobs": {"content": logprobs} if logprobs else None}]})
    for e in _items(event, final, opened=opened):
        yield e


def _suffix(chat: dict) -> str:
    """What the ids of a Response's items end with: its chat answer's id, less its kind."""
    return str(chat.get("id", "")).split("-", 1)[-1] or "0"


def _message_id(chat: dict) -> str:
    return f"msg_{_suffix(chat)}"


def _open_message(event: _Events, item_id: str, index: int = 0) -> Iterator[dict]:
    item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
    yield event("response.output_item.added", output_index=index, item=item)
    yield event("response.content_part.added", item_id=item_id, output_index=index, content_index=0,
                part={"type": "output_text", "text": "", "annotations": []})


def _items(event: _Events, response: dict, *, opened: bool) -> Iterator[dict]:
    """The events that add (unless `opened`: the message's are out already, its text
    included), fill and close each output item of `response`, then its end."""
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            if not (opened and index == 0):
                yield from _open_message(event, item["id"], index)
                if part["text"]:
                    yield event("response.output_text.delta", **where, delta=part["text"],
                                logprobs=part.get("logprobs", []))
            yield event("response.output_text.done", **where, text=part["text"], logprobs=part.get("logprobs", []))
            yield event("response.content_part.done", **where, part=part)
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
            where = {"item_id": item["id"], "output_index": index}
            if item["arguments"]:
                yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **where, arguments=item["arguments"],
                        name=item["name"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.incomplete" if response["status"] == "incomplete" else "response.completed",
                response=response)
