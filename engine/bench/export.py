"""`tttr bench export`: how fast traces go out and come in, and whether the round trip holds.

A trace of N spans (default 10,000: a root agent span, then model calls and tool calls in
turn, with their messages, arguments and results, as an agent framework's exporter writes
them) is written as OTLP/JSON, imported into a fresh session database (`tttr import`: read,
checked, planned, written), and exported again from that database (`tttr export --content`:
read, rebuilt, written as OTLP/JSON). Reported: spans per second each way (target >= 20,000)
and whether the second file is the first, byte for byte.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tttr.engine.traces.spans import CLIENT, INTERNAL, Span, Trace, span_id_of, trace_id_of

TARGET = 20_000


def synthetic_trace(spans: int, seed: str = "bench") -> Trace:
    """A trace of `spans` spans: one agent root, then chat and execute_tool spans in turn."""
    import json

    trace_id = trace_id_of(seed)
    root_id = span_id_of(trace_id, "root")
    t0 = 1_767_225_600_000_000_000
    root = Span(trace_id, root_id, "", "invoke_agent bench", INTERNAL, t0, t0 + spans * 2_000,
                {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "bench"})
    out = [root]
    for i in range(1, spans):
        sid = span_id_of(trace_id, str(i))
        start = t0 + i * 2_000
        if i % 2:
            attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "bench-model",
                     "gen_ai.request.temperature": 0.7, "gen_ai.request.seed": i, "gen_ai.usage.input_tokens": 40 + i % 7,
                     "gen_ai.usage.output_tokens": 12, "gen_ai.response.finish_reasons": ["tool_calls"],
                     "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"step {i}: list the files"}]}]),
                     "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                         {"type": "tool_call", "id": f"call_{i}", "name": "list_files", "arguments": "{\"path\": \".\"}"}],
                         "finish_reason": "tool_calls"}])}
            out.append(Span(trace_id, sid, root_id, "chat bench-model", CLIENT, start, start + 1_500, attrs))
        else:
            attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "list_files",
                     "gen_ai.tool.call.id": f"call_{i - 1}", "gen_ai.tool.call.arguments": "{\"path\": \".\"}",
                     "gen_ai.tool.call.result": json.dumps(["a.txt", f"b{i}.txt"])}
            out.append(Span(trace_id, sid, root_id, "execute_tool list_files", INTERNAL, start, start + 1_000, attrs))
    return Trace(trace_id, out, [{"service.name": "bench"}], [{"name": "bench", "version": "1"}])


def run_bench(spans: int = 10_000) -> dict:
    from tttr.engine.traces.otlp import to_json
    from tttr.engine.traces.transfer import export_file, import_file

    from tttr.engine.traces.otlp import to_request
    from tttr.sessions.store import Store

    with tempfile.TemporaryDirectory(prefix="tttr-bench-export-") as tmp:
        first, second, db = Path(tmp) / "first.json", Path(tmp) / "second.json", Path(tmp) / "t.db"
        trace = synthetic_trace(spans)
        first.write_text(to_json([trace]), encoding="utf-8")  # also loads what both directions import
        Store.open(Path(tmp) / "warm.db").close()  # the store's modules, loaded before timing
        t = time.perf_counter()
        to_request([trace]).SerializeToString()
        protobuf_s = time.perf_counter() - t
        t, c = time.perf_counter(), time.process_time()
        (done,) = import_file(first, db)
        import_s, import_cpu = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        export_file(str(db), [done.run_id], second, content=True)
        export_s, export_cpu = time.perf_counter() - t, time.process_time() - c
        identical = first.read_bytes() == second.read_bytes()
    return {"spans": spans, "import_s": round(import_s, 3), "export_s": round(export_s, 3),
            "import_spans_per_s": round(spans / import_s), "export_spans_per_s": round(spans / export_s),
            "protobuf_spans_per_s": round(spans / protobuf_s),
            # per second of this process's CPU time: what the figures are on a core of its own
            "import_spans_per_cpu_s": round(spans / max(import_cpu, 1e-9)),
            "export_spans_per_cpu_s": round(spans / max(export_cpu, 1e-9)),
            "round_trip_identical": identical, "target_spans_per_s": TARGET}


def lines(r: dict) -> list[str]:
    return [
        f"trace of {r['spans']:,} spans (model calls and tool calls, with content)",
        f"import (OTLP/JSON file -> session database): {r['import_spans_per_s']:,} spans/s ({r['import_s']} s; "
        f"{r['import_spans_per_cpu_s']:,} per CPU second)",
        f"export (session database -> OTLP/JSON file): {r['export_spans_per_s']:,} spans/s ({r['export_s']} s; "
        f"{r['export_spans_per_cpu_s']:,} per CPU second)",
        f"  of which spans -> OTLP protobuf bytes (what --endpoint sends): {r['protobuf_spans_per_s']:,} spans/s",
        f"export -> import -> export identical: {str(r['round_trip_identical']).lower()}  (target >= {r['target_spans_per_s']:,} spans/s each way)",
    ]
