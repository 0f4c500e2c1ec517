"""Tools through the model's own chat template, and tool calls read back from its text.

A template supports tools when it reads the `tools` variable (Hugging Face passes the
tool definitions as `tools`); then it also defines how the model writes a call. Two
formats are read back: Hermes/Qwen's `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
blocks (when the template mentions `<tool_call>`), and otherwise a message that is one JSON
object (or list of them) with `name` and `arguments`/`parameters` (Llama 3.1's format)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tttr.engine.serve.errors import bad_request

_TOOLS_VAR = re.compile(r"\btools\b")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def supports_tools(template: str | None) -> bool:
    return bool(template) and bool(_TOOLS_VAR.search(template))


def call_format(template: str | None) -> str:
    """"hermes" or "json": how this template's model writes a tool call."""
    return "hermes" if template and "<tool_call>" in template else "json"


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI returns it

    def to_json(self, call_id: str) -> dict:
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _one(obj) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        text = args
    else:
        text = json.dumps(args, ensure_ascii=False)
    return ToolCall(obj["name"], text)


def parse_tool_calls(text: str, fmt: str, names: set[str] | None = None) -> tuple[str, list[ToolCall]]:
    """(content left over, calls) from a message. Text that is not a well-formed call of a
    known tool stays content: a model that writes half a call has not called anything."""
    calls: list[ToolCall] = []
    if fmt == "hermes":
        rest = text
        for m in _HERMES.finditer(text):
            try:
                call = _one(json.loads(m.group(1)))
            except ValueError:
                call = None
            if call is None or (names is not None and call.name not in names):
                continue
            calls.append(call)
            rest = rest.replace(m.group(0), "", 1)
        return (rest.strip() if calls else text), calls
    body = text.strip()
    for prefix in ("<|python_tag|>", "```json", "```"):
        body = body.removeprefix(prefix)
    body = body.removesuffix("```").strip()
    try:
        obj = json.loads(body)
    except ValueError:
        return text, []
    found = [_one(o) for o in (obj if isinstance(obj, list) else [obj])]
    if not found or any(c is None or (names is not None and c.name not in names) for c in found):
        return text, []
    return "", found


def merge_tool_call(calls: list[dict], part: dict) -> None:
    """A streamed tool call's piece (a chat chunk's `delta.tool_calls[j]`) into the call at its
    `index` in `calls`: the id and name once, the arguments in parts."""
    i = part.get("index", len(calls))
    while len(calls) <= i:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call, fn = calls[i], part.get("function") or {}
    call["id"] = part.get("id") or call["id"]
    call["function"]["name"] += fn.get("name") or ""
    call["function"]["arguments"] += fn.get("arguments") or ""


def function_tool(i: int, tool: dict, parameters_key: str) -> dict:
    """The chat form of tool `i` of another API's request (a Responses function tool's
    `parameters`, a Messages tool's `input_schema`): its name checked, the rest carried."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"tools[{i}].name", f"tools[{i}] needs a name")
    function = {"name": name, "parameters": tool.get(parameters_key) or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}
