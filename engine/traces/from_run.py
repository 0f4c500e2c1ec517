"""A recorded run as one OpenTelemetry trace, by the GenAI semantic conventions.

- the run: one `invoke_agent {task}` span (the root), with the run's model, sampling and seed,
  and TTTR's facts under `tttr.*` (run id and kind, status, kernel mode, a digest of the
  kernel fingerprint, the start and end trees, the outcome); clock reads, the setup, the
  program's end and the outcome are its span events; a fork or replay links to its parent's root.
- each model call (a step with a message: the shell agent's turn, a served or a program's
  call): one `chat {model}` span with the sampling parameters, seed, token usage and finish
  reason; `tttr.*` the site, the digests of its token ids, of its logits and of its prompt
  ids, the batch rows of each position, the kernel mode and the RNG coordinates. The messages
  (`gen_ai.input.messages`, `gen_ai.output.messages`) only with `content`, as the conventions say.
- each tool call (a shell command, an SDK tool or `sdk.shell`): one `execute_tool {name}` span,
  its arguments and result only with `content`; `tttr.*` the exit code and the trees before
  and after.
- a step's stored timing (`Store.step_times`, in ms): `tttr.step.model_ms` and
  `tttr.step.wait_ms` on its chat span, `tttr.step.tool_ms` on its tool span.

A run has no wall-clock times per event, so span times are the run's created time plus one
microsecond per event seq: ordered, stable, and inside the run's span. A run of the imported
kind is written back as the spans it was imported from (engine/traces/imported.py).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any

from tttr.engine.traces.errors import TraceError
from tttr.engine.traces.spans import (
    CLIENT, INTERNAL, Span, SpanEvent, SpanLink, Trace, run_identity, span_id_of, trace_id_of,
)

US = 1_000  # nanoseconds per event seq
PROVIDER = "tttr"
# The attributes that carry content (messages, arguments, results), left out without --content,
# in the GenAI conventions' names and the fallbacks an imported span may hold them under.
CONTENT_ATTRIBUTES = (
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.prompt", "gen_ai.completion",
    "input.value", "output.value", "langfuse.observation.input", "langfuse.observation.output",
    "tttr.action", "tttr.stdout",
)
CONTENT_PREFIXES = ("llm.input_messages.", "llm.output_messages.", "gen_ai.prompt.", "gen_ai.completion.")


def is_content(name: str) -> bool:
    return name in CONTENT_ATTRIBUTES or name.startswith(CONTENT_PREFIXES)


def root_ids(run) -> tuple[str, str]:
    """(trace id, root span id) of `run` as exported: an imported run keeps its trace's."""
    kept = run.meta.trace
    if kept is not None and isinstance(kept.get("trace_id"), str) and isinstance(kept.get("root"), str):
        return kept["trace_id"], kept["root"]
    trace_id = trace_id_of(run_identity(run))
    return trace_id, span_id_of(trace_id, "run")


def _ns(iso: Any) -> int | None:
    if type(iso) is not str:
        return None
    try:
        t = datetime.fromisoformat(iso)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1_000


def _digest(parts) -> str:
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=16).hexdigest()


def _json(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, sort_keys=True, default=str)


def _set(attrs: dict, name: str, value: Any) -> None:
    """Set an attribute that OTLP can carry: scalars and homogeneous lists as they are, None
    left out, anything else as JSON text."""
    if value is None:
        return
    if type(value) in (str, bool, int, float):
        if type(value) is int and not -(2**63) <= value < 2**63:
            value = str(value)
        attrs[name] = value
    elif isinstance(value, list) and value and len({type(x) for x in value}) == 1 \
            and type(value[0]) in (str, bool, int, float) and (type(value[0]) is not int or all(-(2**63) <= x < 2**63 for x in value)):
        attrs[name] = list(value)
    elif isinstance(value, list) and not value:
        attrs[name] = []
    else:
        attrs[name] = _json(value)


def run_trace(store, run, kind, *, content: bool = False) -> Trace:
    """`run` (a sessions Run of `kind`, from `store`) as one trace; TraceError naming the site
    when one of its values cannot be read."""
    from tttr.sessions.errors import StoreError

    try:
        _, events = store.load_run(run.id)
    except StoreError as exc:
        raise TraceError(str(exc)) from None
    return _Builder(store, run, kind, events, content).build()


class _Builder:
    def __init__(self, store, run, kind, events, content: bool):
        self.store, self.run, self.kind, self.events, self.content = store, run, kind, events, content
        self.trace_id, self.root_id = root_ids(run)
        self.base = _ns(run.created) or 0
        last = self.base + (len(events) + 1) * US
        self.end = max(_ns(run.finished) or last, last)
        self.times = {t.step: t for t in store.step_times(run.id)}

    def t(self, seq: int) -> int:
        return self.base + (seq + 1) * US

    def build(self) -> Trace:
        run = self.run
        root = Span(self.trace_id, self.root_id, "", f"invoke_agent {run.task or 'run'}", INTERNAL, self.base, self.end)
        a = root.attributes
        _set(a, "gen_ai.operation.name", "invoke_agent")
        _set(a, "gen_ai.provider.name", PROVIDER)
        _set(a, "gen_ai.agent.name", run.task)
        _set(a, "gen_ai.request.model", run.model_id)
        self._sampling(a, run.sampling if isinstance(run.sampling, dict) else {}, run.seed)
        _set(a, "openinference.span.kind", "AGENT")
        _set(a, "tttr.run.id", run.id)
        _set(a, "tttr.run.kind", self.kind.name)
        _set(a, "tttr.run.status", run.status)
        _set(a, "tttr.run.name", run.name)
        _set(a, "tttr.task", run.task)
        _set(a, "tttr.kernel.mode", run.kernel_mode)
        fingerprint = run.fingerprint if isinstance(run.fingerprint, dict) else {}
        if fingerprint:
            _set(a, "tttr.kernel.fingerprint", _digest([_json(fingerprint)]))
            _set(a, "tttr.kernel.device", fingerprint.get("device_name") or fingerprint.get("device"))
        if run.outcome is not None:
            _set(a, "tttr.outcome", run.outcome.to_json())
        if run.parent is not None:
            self._link(root)
        spans = [root]
        steps: dict[int, list] = {}
        for e in self.events:
            steps.setdefault(e.step, []).append(e)
        for step in sorted(steps):
            spans.extend(self._step(root, step, steps[step]))
        return Trace(self.trace_id, spans, resources=[{"service.name": "tttr"}], scopes=[{"name": "tttr", "version": _version()}])

    def _sampling(self, a: dict, sampling: dict, seed: Any) -> None:
        for key in ("temperature", "top_p", "top_k"):
            if type(sampling.get(key)) in (int, float):
                _set(a, f"gen_ai.request.{key}", sampling[key])
        if type(seed) is int:
            _set(a, "gen_ai.request.seed", seed)

    def _link(self, root: Span) -> None:
        run = self.run
        try:
            parent = self.store.run(run.parent)
        except Exception:  # noqa: BLE001 - a parent not in the file: no link rather than no export
            return
        trace_id, span_id = root_ids(parent)
        attrs: dict = {}
        mutation = run.mutation
        _set(attrs, "tttr.link", "fork" if mutation else "replay")
        _set(attrs, "tttr.parent.run.id", parent.id)
        _set(attrs, "tttr.fork.seq", run.fork_seq)
        _set(attrs, "tttr.fork.site", run.fork_site)
        if mutation:
            _set(attrs, "tttr.mutation", mutation)
        root.links.append(SpanLink(trace_id, span_id, attrs))

    def _step(self, root: Span, step: int, events: list) -> list[Span]:
        by_kind: dict[str, list] = {}
        for e in events:
            by_kind.setdefault(e.kind, []).append(e)
        out = []
        for e in by_kind.get("clock", []):
            attrs = {"tttr.site": e.site}
            _set(attrs, "tttr.clock.t", e.value.get("t"))
            _set(attrs, "tttr.clock.source", e.value.get("source"))
            root.events.append(SpanEvent("tttr.clock", self.t(e.seq), attrs))
        for e in by_kind.get("setup", []):
            attrs = {"tttr.site": e.site}
            for key in ("task", "clock", "tree", "snapshot"):
                _set(attrs, f"tttr.setup.{key}", e.value.get(key))
            root.events.append(SpanEvent("tttr.setup", self.t(e.seq), attrs))
            _set(root.attributes, "tttr.tree.start", e.value.get("tree"))
        if by_kind.get("message"):
            out.append(self._chat(step, by_kind))
        for e in by_kind.get("tool", []):
            if isinstance(e.value.get("program"), list):
                root.events.append(self._program_end(e))
            else:
                out.append(self._tool(e))
        for e in by_kind.get("outcome", []):
            attrs = {"tttr.site": e.site}
            for key, value in e.value.items():
                _set(attrs, f"tttr.outcome.{key}", value)
            root.events.append(SpanEvent("tttr.outcome", self.t(e.seq), attrs))
            _set(root.attributes, "tttr.tree.end", e.value.get("tree"))
        return out

    def _chat(self, step: int, by_kind: dict) -> Span:
        run = self.run
        message = by_kind["message"][-1]
        prompt = by_kind.get("prompt", [None])[0]
        tokens = sorted(by_kind.get("token", []), key=lambda e: e.seq)
        logits = sorted(by_kind.get("logits", []), key=lambda e: e.seq)
        first = min(e.seq for kind in ("prompt", "token", "logits", "message", "action")
                    for e in by_kind.get(kind, []))
        last = max(e.seq for kind in ("prompt", "token", "logits", "message", "action") for e in by_kind.get(kind, []))
        m = message.value
        p = prompt.value if prompt is not None else {}
        model = m.get("model") if isinstance(m.get("model"), str) else run.model_id
        span = Span(self.trace_id, span_id_of(self.trace_id, message.site), self.root_id, f"chat {model or ''}".strip(),
                    CLIENT, self.t(first), self.t(last) + US // 2)
        a = span.attributes
        _set(a, "gen_ai.operation.name", "chat")
        _set(a, "gen_ai.provider.name", PROVIDER)
        _set(a, "gen_ai.request.model", run.model_id)
        _set(a, "gen_ai.response.model", model)
        sampling = p.get("sampling") if isinstance(p.get("sampling"), dict) else (
            run.sampling if isinstance(run.sampling, dict) else {})
        self._sampling(a, sampling, sampling.get("seed") if "seed" in sampling else run.seed)
        _set(a, "gen_ai.request.max_tokens", p.get("max_tokens") if type(p.get("max_tokens")) is int else None)
        _set(a, "gen_ai.response.id", p.get("response_id") or None)
        if type(p.get("n_tokens")) is int:
            _set(a, "gen_ai.usage.input_tokens", p["n_tokens"])
        usage = m.get("usage") if isinstance(m.get("usage"), dict) else {}
        if type(usage.get("prompt_tokens")) is int and "gen_ai.usage.input_tokens" not in a:
            _set(a, "gen_ai.usage.input_tokens", usage["prompt_tokens"])
        output_tokens = len(tokens) or usage.get("completion_tokens")
        _set(a, "gen_ai.usage.output_tokens", output_tokens if type(output_tokens) is int else None)
        if isinstance(m.get("finish_reason"), str):
            _set(a, "gen_ai.response.finish_reasons", [m["finish_reason"]])
        _set(a, "openinference.span.kind", "LLM")
        _set(a, "tttr.site", message.site)
        _set(a, "tttr.step", step)
        if step in self.times:
            _set(a, "tttr.step.model_ms", self.times[step].model_ms)
            _set(a, "tttr.step.wait_ms", self.times[step].wait_ms)
        _set(a, "tttr.prompt.ids_digest", p.get("ids_digest"))
        if tokens:
            ids = [e.value.get("id") for e in tokens]
            _set(a, "tttr.tokens.ids_digest", _digest(str(i) for i in ids))
            _set(a, "tttr.tokens.forced", sum(1 for e in tokens if e.value.get("forced")))
            rng = tokens[0].value.get("rng")
            if isinstance(rng, list) and len(rng) == 3:
                _set(a, "tttr.rng.seed", rng[0])
                _set(a, "tttr.rng.step", rng[1])
        if logits:
            _set(a, "tttr.logits.digest", _digest(str(e.value.get("digest")) for e in logits))
            rows = [e.value["batch"][0] for e in logits if isinstance(e.value.get("batch"), list)]
            _set(a, "tttr.batch.rows", rows or None)
            _set(a, "tttr.kernel.mode", logits[0].value.get("mode"))
        if self.content:
            request = p.get("request") if isinstance(p.get("request"), dict) else {}
            if isinstance(request.get("messages"), list):
                _set(a, "gen_ai.input.messages", _json(input_messages(request["messages"])))
            elif isinstance(request.get("prompt"), str):
                _set(a, "gen_ai.input.messages", _json([{"role": "user", "parts": [{"type": "text", "content": request["prompt"]}]}]))
            _set(a, "gen_ai.output.messages", _json([output_message(m)]))
            for e in by_kind.get("action", []):
                _set(a, "tttr.action", e.value.get("cmd") if not e.value.get("done") else "done")
        return span

    def _tool(self, e) -> Span:
        v = e.value
        name = v.get("function") if isinstance(v.get("function"), str) else "shell"
        span = Span(self.trace_id, span_id_of(self.trace_id, e.site), self.root_id, f"execute_tool {name}", INTERNAL,
                    self.t(e.seq), self.t(e.seq) + US // 2)
        a = span.attributes
        _set(a, "gen_ai.operation.name", "execute_tool")
        _set(a, "gen_ai.tool.name", name)
        _set(a, "gen_ai.tool.type", "function")
        _set(a, "gen_ai.tool.call.id", e.site)
        _set(a, "openinference.span.kind", "TOOL")
        _set(a, "tttr.site", e.site)
        _set(a, "tttr.step", e.step)
        _set(a, "tttr.step.tool_ms", self.times[e.step].tool_ms if e.step in self.times else None)
        for key in ("exit_code", "duration_ms", "limit_hit", "tree_before", "tree_after", "snapshot", "source"):
            _set(a, f"tttr.{key.replace('tree_', 'tree.')}", v.get(key))
        if isinstance(v.get("reused_from"), dict):
            _set(a, "tttr.reused_from", v["reused_from"])
        if isinstance(v.get("error"), dict):
            span.status_code, span.status_message = 2, str(v["error"].get("message") or v["error"].get("type") or "error")[:500]
        if self.content:
            if "function" in v:
                _set(a, "gen_ai.tool.call.arguments", _json({"args": v.get("args") or [], "kwargs": v.get("kwargs") or {}}))
                if "result" in v:
                    _set(a, "gen_ai.tool.call.result", _json(v.get("result")))
            else:
                _set(a, "gen_ai.tool.call.arguments", _json({"cmd": v.get("cmd")}))
                _set(a, "gen_ai.tool.call.result", self._text(v.get("stdout")))
        return span

    def _program_end(self, e) -> SpanEvent:
        v = e.value
        attrs = {"tttr.site": e.site}
        _set(attrs, "tttr.program", [str(x) for x in v["program"]])
        for key in ("exit_code", "limit_hit", "tree_before", "tree_after", "snapshot"):
            _set(attrs, f"tttr.{key.replace('tree_', 'tree.')}", v.get(key))
        if self.content:
            _set(attrs, "tttr.stdout", self._text(v.get("stdout")))
        return SpanEvent("tttr.program.end", self.t(e.seq), attrs)

    def _text(self, value: Any) -> str | None:
        from tttr.engine.replay.events import read_text

        if value is None:
            return None
        try:
            return read_text(self.store, value)
        except Exception as exc:  # noqa: BLE001 - a blob missing from a hand-edited file
            raise TraceError(f"run {self.run.id}: a tool output's blob cannot be read ({str(exc)[:80]})") from None


def input_messages(messages: list) -> list[dict]:
    """OpenAI chat messages as the GenAI conventions' input messages (role, parts)."""
    out = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        parts = []
        content = msg.get("content")
        if isinstance(content, str):
            parts.append({"type": "text", "content": content})
        elif isinstance(content, list):
            parts.extend({"type": "text", "content": c.get("text")} for c in content
                         if isinstance(c, dict) and isinstance(c.get("text"), str))
        for call in msg.get("tool_calls") or []:
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                parts.append({"type": "tool_call", "id": call.get("id"), "name": call["function"].get("name"),
                              "arguments": call["function"].get("arguments")})
        if msg.get("role") == "tool":
            parts = [{"type": "tool_call_response", "id": msg.get("tool_call_id"), "response": content}]
        out.append({"role": msg.get("role"), "parts": parts})
    return out


def output_message(m: dict) -> dict:
    parts = [{"type": "text", "content": m.get("text") if isinstance(m.get("text"), str) else ""}]
    for call in m.get("tool_calls") or []:
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            parts.append({"type": "tool_call", "id": call.get("id"), "name": call["function"].get("name"),
                          "arguments": call["function"].get("arguments")})
    out = {"role": "assistant", "parts": parts}
    if isinstance(m.get("finish_reason"), str):
        out["finish_reason"] = m["finish_reason"]
    return out


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tttr")
    except PackageNotFoundError:
        return ""
