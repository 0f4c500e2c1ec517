"""What a program's request is compared with in a trace (engine/traces/against.py): a model
call's messages with the trace's input messages, an SDK tool query with the trace's tool call;
and what the program gets back for a tool the trace answers.

Compared (`COMPARED`): each message's role, its text (text parts joined), its tool calls' names
and arguments (as JSON values, so spacing does not count) and a tool message's text; not the
model name, the sampling parameters, the tools offered (another server's) nor tool call ids (a
live model's are new each time). A tool matches by name, then by its arguments in the form the
trace holds them: a tttr export's `{args, kwargs}` exactly, another tool's arguments object by
keyword, or its values in order for the call's positional arguments; `sdk.shell` by its command.
"""

from __future__ import annotations

import json

from tttr.engine.program.replay import request_field

COMPARED = ("each message's role, text, tool calls (names and arguments) and tool results' text; not the model "
            "name, sampling parameters, tools offered or tool call ids")


# ---------------------------------------------------------------------------- messages compared
def _text(content) -> str:
    """A message's text: a string, or its text parts joined (as the trace's reader joins them)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str)
                       else p.get("content") if isinstance(p, dict) and isinstance(p.get("content"), str)
                       else "" for p in content)
    return "" if content is None else json.dumps(content, ensure_ascii=False, sort_keys=True)


def _arguments(value):
    """Tool call arguments as a JSON value (text that is JSON parsed), so spacing does not count."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def canonical(messages) -> list:
    """Messages (OpenAI chat shaped) as compared: role, text, tool calls' names and arguments,
    nothing else (see COMPARED)."""
    out = []
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict):
            out.append({"message": m})
            continue
        c = {"role": m.get("role"), "content": _text(m.get("content"))}
        calls = []
        for call in m.get("tool_calls") or []:
            f = call.get("function") if isinstance(call, dict) else None
            f = f if isinstance(f, dict) else {}
            calls.append({"name": f.get("name"), "arguments": _arguments(f.get("arguments"))})
        if calls:
            c["tool_calls"] = calls
        out.append(c)
    return out


def asked_messages(endpoint: str, body: dict) -> list:
    """The messages of a request as the trace's exporter writes them (a completion's prompt as
    one user message)."""
    if endpoint != "chat" and isinstance(body.get("prompt"), str):
        return [{"role": "user", "content": body["prompt"]}]
    return body.get("messages") if isinstance(body.get("messages"), list) else []


def trace_messages(value: dict) -> list:
    """A trace's model call's input messages, with its system instructions first where the
    input holds no system message (the conventions keep them apart)."""
    messages = list(value.get("input") or [])
    attrs = (value.get("span") or {}).get("attributes") if isinstance(value.get("span"), dict) else None
    system = attrs.get("gen_ai.system_instructions") if isinstance(attrs, dict) else None
    if system is not None and not any(isinstance(m, dict) and m.get("role") == "system" for m in messages):
        parts = _arguments(system)
        text = _text(parts) if isinstance(parts, list) else parts if isinstance(parts, str) else ""
        messages.insert(0, {"role": "system", "content": text})
    return messages


def message_difference(trace_input: list, asked: list) -> tuple[str, object, object] | None:
    """(where, the trace's value, the program's) of the first compared difference, or None."""
    found = request_field(canonical(trace_input), canonical(asked))
    if found is None:
        return None
    path, a, b = found
    return f"messages{path}", a, b


# ---------------------------------------------------------------------------- tools compared
def tool_difference(t: dict, asked: dict) -> tuple[str, object, object] | None:
    """(field, the trace's value, the program's) where SDK tool query `asked` is not trace
    tool step `t` (see the module's text), or None when it is."""
    if "cmd" in t:
        if "cmd" not in asked:
            return "function", f"sdk.shell {t['cmd']!r}", asked.get("function")
        return None if asked["cmd"] == t["cmd"] else ("cmd", t["cmd"], asked["cmd"])
    name = t.get("function")
    if "function" not in asked:
        return "function", name, f"sdk.shell {asked.get('cmd')!r}"
    if asked["function"] != name:
        return "function", name, asked["function"]
    args, kwargs = asked.get("args") or [], asked.get("kwargs") or {}
    if "arguments" in t:  # arguments that are no JSON object: the one positional argument
        expected = ([t["arguments"]], {})
    elif t.get("args") or not args:
        expected = (list(t.get("args") or []), dict(t.get("kwargs") or {}))
    else:  # an object's values, in order, for the positional arguments; the rest by keyword
        items = list((t.get("kwargs") or {}).items())
        expected = ([v for _, v in items[:len(args)]], dict(items[len(args):]))
    if list(args) != expected[0]:
        return "args", expected[0], list(args)
    if dict(kwargs) != expected[1]:
        return "kwargs", expected[1], dict(kwargs)
    return None


def tool_answer(t: dict, asked: dict) -> dict:
    """What the SDK gets for trace tool step `t`: its result or error, a command's output."""
    if "cmd" in t:
        code = t.get("exit_code")
        return {"stdout": t.get("stdout") if isinstance(t.get("stdout"), str) else "", "stderr": "",
                "exit_code": code if type(code) is int else 0, "limit_hit": None, "truncated": False}
    if isinstance(t.get("error"), dict):
        e = t["error"]
        return {"error": {"type": e.get("type") if isinstance(e.get("type"), str) else "Exception",
                          "message": str(e.get("message") or "error")}}
    return {"result": t.get("result")}


__all__ = ["COMPARED", "asked_messages", "canonical", "message_difference", "tool_answer",
           "tool_difference", "trace_messages"]
