"""A trace from elsewhere as a run of the imported kind, and that run back as its trace.

Each trace becomes one run (task `trace:NAME`, NAME the root span's name; meta.source
`IMPORTED_BY`). Its spans are walked in causal order (a parent before its children, siblings
by start time): each model call span is one step with a `message` event, each tool call span
one step with a `tool` event, the way a recorded program's calls and SDK tools are steps:

- `S:message`: `text`, `tool_calls`, `finish_reason`, `model`, `input` (the request's messages,
  OpenAI-shaped), `sampling`, `usage`, `missing` (what the span did not hold: "input messages",
  "output message"), and `span`, the span as it was read (spans.Span.record()).
- `S:tool`: `function`, `args` ([]), `kwargs` (the arguments when they are a JSON object, else
  `arguments`), `result`, `error`, `call_id`, and `span`.

The other spans (the agent's, chains', the root) and the trace's resources and scopes are kept
in the run's meta (`meta.trace`), so the run is written back as the very trace it was read
from: export → import → export gives the same file. Nothing is written unless every trace of
the file was read and checked.
"""

from __future__ import annotations

from pathlib import Path

from tttr.engine.traces.conventions import FORMATS, chat_call, role_of, tool_call
from tttr.engine.traces.errors import TraceError
from tttr.engine.traces.from_run import is_content
from tttr.engine.traces.spans import Span, Trace, from_json_value, to_json_value
from tttr.sessions.records import RECORDED_BY

IMPORTED_BY = RECORDED_BY["imported"]
TASK_PREFIX = "trace:"
# What a trace cannot hold that a recorded run has: named by `tttr info` and the kind's refusals.
LACKS = ("clock reads", "randomness (seeds, RNG coordinates)", "file trees", "token ids and logits")
NAME_CHARS = 200


def is_imported_run(run) -> bool:
    return run.meta.kind == "imported"


def causal_order(trace: Trace) -> list[int]:
    """Indexes of the trace's spans, each parent before its children, siblings (and roots) by
    start time, then by their order in the file."""
    ids = {s.span_id: i for i, s in enumerate(trace.spans)}
    children: dict[int, list[int]] = {}
    roots = []
    for i, s in enumerate(trace.spans):
        p = ids.get(s.parent_id) if s.parent_id else None
        (children.setdefault(p, []) if p is not None else roots).append(i)
    key = lambda i: (trace.spans[i].start_ns, i)  # noqa: E731
    out: list[int] = []
    stack = sorted(roots, key=key, reverse=True)
    while stack:
        i = stack.pop()
        out.append(i)
        stack.extend(sorted(children.get(i, ()), key=key, reverse=True))
    return out


class Planned:
    """One trace checked into what its run will hold: columns and (step, kind, value) events."""

    def __init__(self, trace: Trace, fmt: str, source: str):
        self.trace = trace
        self.events: list[tuple[int, str, dict]] = []
        others = []
        chats = 0
        missing: set[str] = set()
        model = None
        order = causal_order(trace)
        for i in order:
            span = trace.spans[i]
            role = role_of(span)
            kept = {"i": i, "at": list(trace.where(i)), "span": span.record()}
            if role == "chat":
                call = chat_call(span, fmt)
                value = {"text": call.text or "", "tool_calls": call.tool_calls, "finish_reason": call.finish_reason,
                         "model": call.model, "sampling": call.sampling, "usage": call.usage, **kept}
                gone = []
                if call.input is not None:
                    value["input"] = call.input
                else:
                    gone.append("input messages")
                if call.text is None and not call.tool_calls:
                    gone.append("output message")
                if gone:
                    value["missing"] = gone
                    missing.update(gone)
                model = model or call.model
                chats += 1
                self.events.append((len(self.events), "message", value))
            elif role == "tool":
                call = tool_call(span, fmt)
                value = {"function": call.name, "args": [], "call_id": call.call_id, "error": call.error, **kept}
                args = call.arguments
                if isinstance(args, dict) and set(args) == {"args", "kwargs"} and isinstance(args["args"], list) \
                        and isinstance(args["kwargs"], dict):  # a Python function's call, as tttr exports it
                    value["args"], value["kwargs"] = args["args"], args["kwargs"]
                elif isinstance(args, dict) and call.name == "shell" and set(args) == {"cmd"} \
                        and isinstance(args["cmd"], str):  # a command, as tttr exports one: as its tool events read
                    del value["function"], value["args"]
                    value["cmd"] = args["cmd"]
                    if isinstance(call.result, str):
                        value["stdout"] = call.result
                    code = span.attributes.get("tttr.exit_code")
                    if type(code) is int:
                        value["exit_code"] = code
                elif isinstance(args, dict):
                    value["kwargs"] = args
                elif args is not None:
                    value["arguments"] = args
                if "cmd" in value:
                    pass
                elif call.has_result:
                    value["result"] = call.result
                else:
                    missing.add("tool results")
                self.events.append((len(self.events), "tool", value))
            else:
                others.append(kept)
        self.events = _tttr_steps(self.events)
        root = next((trace.spans[i] for i in order if not trace.spans[i].parent_id), trace.spans[order[0]])
        name = root.name or "trace"
        self.columns = dict(
            task=TASK_PREFIX + (name if len(name) <= NAME_CHARS else name[:NAME_CHARS] + "…"),
            model_id=model, kernel_mode=None, sampling={}, seed=None, fingerprint={},
            meta={"source": IMPORTED_BY, "format": fmt, "file": source,
                  "trace": {"trace_id": trace.trace_id, "root": root.span_id, "spans": len(trace.spans),
                            "resources": to_json_value(trace.resources), "scopes": to_json_value(trace.scopes),
                            "others": others},
                  "lacks": list(LACKS), "missing": sorted(missing),
                  "model_calls": chats, "tool_calls": len(self.events) - chats},
        )
        # `reason` is what the runs list and the app's title show of an outcome that is no verdict
        self.outcome = {"reason": "imported trace: messages only", "spans": len(trace.spans), "model_calls": chats,
                        "tool_calls": len(self.events) - chats, "lacks": list(LACKS), "missing": sorted(missing)}


def _tttr_steps(events: list[tuple[int, str, dict]]) -> list[tuple[int, str, dict]]:
    """The events at the steps their spans name (`tttr.step`, a run tttr exported), so that its
    sites are the recorded run's (`2:message` is `2:message`) and `tttr diff` matches them site
    by site; numbered 0, 1, 2, ... when any span names none, or the steps go back or name a
    site twice."""
    steps = [value["span"]["attributes"].get("tttr.step") for _, _, value in events]
    if not steps or not all(type(s) is int and 0 <= s < 2**31 for s in steps) \
            or any(b < a for a, b in zip(steps, steps[1:])) \
            or len({(s, kind) for s, (_, kind, _) in zip(steps, events)}) != len(events):
        return events  # a shell agent's step holds its message and its command: one of each kind
    return [(step, kind, value) for step, (_, kind, value) in zip(steps, events)]


def plan_import(traces: list[Trace], fmt: str, source: str) -> list[Planned]:
    if fmt not in FORMATS:
        raise TraceError(f"unknown --format {fmt!r}: use one of {', '.join(FORMATS)}")
    return [Planned(t, fmt, Path(source).name) for t in traces]


def write_import(store, planned: list[Planned]) -> list[int]:
    """Write each planned trace as a run; its id each. One transaction per run."""
    from tttr.sessions.vocabulary import site

    ids = []
    for p in planned:
        run_id = store.begin_run(**p.columns)
        for step, kind, value in p.events:
            store.append(run_id, site(step, kind), value)
        store.finish_run(run_id, status="complete", outcome=p.outcome)
        ids.append(run_id)
    return ids


def kept_trace(store, run, *, content: bool) -> Trace:
    """The trace an imported run was read from, rebuilt from what it kept (without the
    content attributes unless `content`)."""
    from tttr.sessions.errors import StoreError

    try:
        _, events = store.load_run(run.id)
    except StoreError as exc:
        raise TraceError(str(exc)) from None
    kept = run.meta.trace
    if kept is None or not isinstance(kept.get("others"), list):
        raise TraceError(f"run {run.id} is an imported trace whose kept spans are missing from its metadata")
    records = list(kept["others"]) + [e.value for e in events if e.kind in ("message", "tool") and isinstance(e.value, dict)]
    try:
        records.sort(key=lambda r: r["i"])
        spans, placement = [], []
        for r in records:
            span = Span.from_record(r["span"])
            if not content:
                span.attributes = {k: v for k, v in span.attributes.items() if not is_content(k)}
                for e in span.events:
                    e.attributes = {k: v for k, v in e.attributes.items() if not is_content(k)}
            spans.append(span)
            placement.append((int(r["at"][0]), int(r["at"][1])))
        resources, scopes = from_json_value(list(kept["resources"])), from_json_value(list(kept["scopes"]))
        if any(not (0 <= a < len(resources) and 0 <= b < len(scopes)) for a, b in placement):
            raise TypeError("a span's resource or scope is not kept")
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise TraceError(f"run {run.id} is an imported trace whose kept spans are damaged ({str(exc)[:80]})") from None
    return Trace(kept.get("trace_id", spans[0].trace_id if spans else ""), spans, resources, scopes, placement)
