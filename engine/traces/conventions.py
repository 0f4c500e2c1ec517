"""What a span says, read by the conventions that write it: OpenTelemetry's GenAI semantic
conventions (`gen_ai.*`), OpenInference's (`llm.*`, `input.value`: Arize Phoenix, OpenLLMetry's
older `gen_ai.prompt.N.*`) and Langfuse's (`langfuse.observation.*`). Like Langfuse's own
mapper, each value is looked up under the preferred convention's name first and the others'
as fallbacks; `--format` picks which one is preferred.

A span is a model call (`chat`), a tool call (`tool`) or something else (`other`: the agent,
a chain, a retriever), kept as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tttr.engine.traces.fastjson import loads
from tttr.engine.traces.spans import Span
from tttr.sessions.values import MAX_DEPTH, depth_problem

FORMATS = ("otlp", "openinference", "langfuse")
CHAT_OPERATIONS = ("chat", "text_completion", "generate_content")


def role_of(span: Span) -> str:
    """"chat", "tool" or "other"."""
    a = span.attributes
    op = a.get("gen_ai.operation.name")
    oi = a.get("openinference.span.kind")
    lf = a.get("langfuse.observation.type")
    if op in CHAT_OPERATIONS or oi == "LLM" or lf == "generation":
        return "chat"
    if op == "execute_tool" or oi == "TOOL" or lf == "tool":
        return "tool"
    return "other"


_DEPTH = MAX_DEPTH - 8


def _loads(v: Any) -> Any:
    """An attribute's JSON text parsed, or the text itself when it is no JSON a run can keep
    (not JSON, or nested deeper than the store reads)."""
    if isinstance(v, str) and v[:1] in ("[", "{", '"'):
        try:
            parsed = loads(v)
        except (ValueError, RecursionError):
            return v
        if v.count("[") + v.count("{") <= _DEPTH:  # no deeper than its brackets: nothing to measure
            return parsed
        return v if depth_problem(parsed, _DEPTH) else parsed
    return v


@dataclass(slots=True)
class ChatCall:
    model: str | None
    input: list | None  # OpenAI-shaped messages, or None when the span holds none
    text: str | None  # the answer's text, or None when the span holds no output
    tool_calls: list = field(default_factory=list)
    finish_reason: str | None = None
    sampling: dict = field(default_factory=dict)
    usage: dict = field(default_factory=dict)


@dataclass(slots=True)
class ToolCall:
    name: str
    call_id: str | None
    arguments: Any  # parsed JSON where it is JSON, else the text, or None
    result: Any
    has_result: bool
    error: dict | None


# ---------------------------------------------------------------------------- messages
def _from_parts(messages: Any) -> list | None:
    """GenAI conventions' messages ([{role, parts}]) as OpenAI chat messages."""
    if not isinstance(messages, list):
        return None
    out = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        if "parts" not in m:  # already OpenAI-shaped
            out.append(m)
            continue
        texts, calls, msg = [], [], {"role": m.get("role")}
        for p in m.get("parts") or []:
            if not isinstance(p, dict):
                continue
            if p.get("type") == "text" and isinstance(p.get("content"), str):
                texts.append(p["content"])
            elif p.get("type") == "tool_call":
                args = p.get("arguments")
                calls.append({"id": p.get("id"), "type": "function", "function": {
                    "name": p.get("name"), "arguments": args if isinstance(args, str) else json.dumps(args)}})
            elif p.get("type") == "tool_call_response":
                msg["tool_call_id"] = p.get("id")
                r = p.get("response")
                texts.append(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False))
        msg["content"] = "".join(texts)
        if calls:
            msg["tool_calls"] = calls
        if isinstance(m.get("finish_reason"), str):
            msg["finish_reason"] = m["finish_reason"]
        out.append(msg)
    return out


def _indexed(a: dict, prefix: str) -> list[dict]:
    """OpenInference's flattened lists (`llm.input_messages.0.message.role`) as a list of dicts
    of their remaining names (`message.role`)."""
    found: dict[int, dict] = {}
    cut = len(prefix)
    for key, value in a.items():
        if key.startswith(prefix):
            head, _, rest = key[cut:].partition(".")
            if head.isdigit() and rest:
                found.setdefault(int(head), {})[rest] = value
    return [found[i] for i in sorted(found)]


def _oi_messages(a: dict, prefix: str) -> list | None:
    items = _indexed(a, prefix)
    if not items:
        return None
    out = []
    for item in items:
        msg = {"role": item.get("message.role"), "content": item.get("message.content") or ""}
        calls = []
        for key in sorted(k for k in item if k.startswith("message.tool_calls.") and k.endswith(".tool_call.function.name")):
            j = key.split(".")[2]
            calls.append({"id": item.get(f"message.tool_calls.{j}.tool_call.id"), "type": "function", "function": {
                "name": item[key], "arguments": item.get(f"message.tool_calls.{j}.tool_call.function.arguments") or "{}"}})
        if calls:
            msg["tool_calls"] = calls
        if item.get("message.tool_call_id"):
            msg["tool_call_id"] = item["message.tool_call_id"]
        out.append(msg)
    return out


def _legacy_messages(a: dict, prefix: str) -> list | None:
    """OpenLLMetry's `gen_ai.prompt.0.role` / `.content`."""
    items = _indexed(a, prefix)
    if not items:
        return None
    return [{"role": i.get("role"), "content": i.get("content") or "",
             **({"finish_reason": i["finish_reason"]} if isinstance(i.get("finish_reason"), str) else {})}
            for i in items]


def _lf_messages(v: Any, output: bool = False) -> list | None:
    v = _loads(v)
    if isinstance(v, dict) and isinstance(v.get("messages"), list):
        v = v["messages"]
    if isinstance(v, list):
        return _from_parts(v)
    if isinstance(v, dict) and "role" in v:
        return _from_parts([v])
    if isinstance(v, str):
        return [{"role": "assistant" if output else "user", "content": v}]
    return None


def _input(a: dict, order: tuple[str, ...]) -> list | None:
    for name in order:
        if name == "otlp":
            found = _from_parts(_loads(a.get("gen_ai.input.messages"))) or _legacy_messages(a, "gen_ai.prompt.")
        elif name == "openinference":
            found = _oi_messages(a, "llm.input_messages.") or _lf_messages(a.get("input.value"))
        else:
            found = _lf_messages(a.get("langfuse.observation.input"))
        if found:
            return found
    return None


def _output(a: dict, order: tuple[str, ...]) -> list | None:
    for name in order:
        if name == "otlp":
            found = _from_parts(_loads(a.get("gen_ai.output.messages"))) or _legacy_messages(a, "gen_ai.completion.")
        elif name == "openinference":
            found = _oi_messages(a, "llm.output_messages.") or _lf_messages(a.get("output.value"), True)
        else:
            found = _lf_messages(a.get("langfuse.observation.output"), True)
        if found:
            return found
    return None


def _first(a: dict, *names: str) -> Any:
    for n in names:
        if a.get(n) is not None:
            return a[n]
    return None


def order_for(fmt: str) -> tuple[str, ...]:
    return _ORDERS.get(fmt) or (fmt, *(f for f in FORMATS if f != fmt))


_ORDERS = {fmt: (fmt, *(f for f in FORMATS if f != fmt)) for fmt in FORMATS}
_SAMPLING = tuple((key, f"gen_ai.request.{key}") for key in ("temperature", "top_p", "top_k", "seed", "max_tokens"))
_USAGE = (("input_tokens", ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"), "input"),
          ("output_tokens", ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion"), "output"))
_TOOL_NAMES = {"otlp": ("gen_ai.tool.name",), "openinference": ("tool.name",), "langfuse": ()}
_TOOL_ARGS = {"otlp": ("gen_ai.tool.call.arguments",), "openinference": ("tool.parameters", "input.value"),
              "langfuse": ("langfuse.observation.input",)}
_TOOL_RESULTS = {"otlp": ("gen_ai.tool.call.result",), "openinference": ("output.value",),
                 "langfuse": ("langfuse.observation.output",)}
# per --format: the names of a tool's name, arguments and result, the preferred convention's first
_TOOL_ORDER = {fmt: tuple(tuple(n for f in order for n in names[f]) for names in (_TOOL_NAMES, _TOOL_ARGS, _TOOL_RESULTS))
               for fmt, order in _ORDERS.items()}


def chat_call(span: Span, fmt: str = "otlp") -> ChatCall:
    a = span.attributes
    order = order_for(fmt)
    model = _first(a, "gen_ai.response.model", "gen_ai.request.model", "llm.model_name", "langfuse.observation.model.name")
    outputs = _output(a, order)
    text, calls, finish = None, [], None
    if outputs:
        last = outputs[-1] if isinstance(outputs[-1], dict) else {}
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        calls = [c for c in last.get("tool_calls") or [] if isinstance(c, dict)]
        finish = last.get("finish_reason") if isinstance(last.get("finish_reason"), str) else None
    reasons = a.get("gen_ai.response.finish_reasons")
    if finish is None and isinstance(reasons, list) and reasons and isinstance(reasons[0], str):
        finish = reasons[0]
    sampling = {}
    params = _loads(_first(a, "llm.invocation_parameters", "langfuse.observation.model.parameters"))
    params = params if isinstance(params, dict) else {}
    otlp_first = order[0] == "otlp"
    for key, name in _SAMPLING:
        p = params.get(key)
        v = a.get(name) if p is None or otlp_first else None
        v = v if v is not None else p
        if type(v) in (int, float):
            sampling[key] = v
    usage = {}
    lf_usage = _loads(a.get("langfuse.observation.usage_details"))
    lf_usage = lf_usage if isinstance(lf_usage, dict) else {}
    for key, names, lf in _USAGE:
        v = _first(a, *names)
        v = v if v is not None else lf_usage.get(lf)
        if type(v) is int:
            usage[key] = v
    return ChatCall(model if isinstance(model, str) else None, _input(a, order), text, calls, finish, sampling, usage)


def tool_call(span: Span, fmt: str = "otlp") -> ToolCall:
    a = span.attributes
    names, args_names, result_names = _TOOL_ORDER.get(fmt) or _TOOL_ORDER["otlp"]
    name = _first(a, *names)
    if not isinstance(name, str) or not name:
        name = span.name.removeprefix("execute_tool ").strip() or "tool"
    arguments = _loads(_first(a, *args_names))
    result_name = next((n for n in result_names if a.get(n) is not None), None)
    result = _loads(a[result_name]) if result_name else None
    call_id = _first(a, "gen_ai.tool.call.id", "tool_call.id", "tool.id")
    error = {"message": span.status_message or "error"} if span.status_code == 2 else None
    return ToolCall(name, call_id if isinstance(call_id, str) else None, arguments, result, result_name is not None, error)
