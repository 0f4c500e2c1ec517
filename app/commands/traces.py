"""`tttr export` and `tttr import`: runs out as OpenTelemetry GenAI traces (OTLP/JSON or a
collector over OTLP/HTTP), and traces in as runs of the imported kind.

A thin layer over `tttr.engine.traces.transfer`; what it prints of a trace (its names come
from a file) is printed with control characters made visible."""

from __future__ import annotations

import argparse

from tttr.app.commands import args as argtypes

FORMATS = ("otlp", "openinference", "langfuse")  # engine.traces.conventions.FORMATS, without importing it


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "export",
        help="runs as OpenTelemetry GenAI traces: an OTLP/JSON file or a collector",
        description="Each run as one trace by the OpenTelemetry GenAI conventions: invoke_agent (the run), chat per "
                    "model call, execute_tool per tool call, clock reads and the end as span events, TTTR's own "
                    "facts under tttr.*; a fork or replay links to its parent. The same run exports with the same "
                    "ids. Messages, arguments and results only with --content. Read-only.",
    )
    p.add_argument("runs", nargs="+", type=argtypes.run_id, metavar="RUN", help="run ids (see `tttr runs DB`)")
    p.add_argument("--db", required=True, metavar="DB", help="session database file")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--otlp", metavar="FILE.json", help="write OTLP/JSON to this file")
    where.add_argument("--endpoint", metavar="URL",
                       help="send OTLP/HTTP (protobuf) to a collector, e.g. http://127.0.0.1:4318/v1/traces")
    p.add_argument("--content", action="store_true",
                   help="include messages, tool arguments and results (off by default, as the conventions say)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=export)

    p = sub.add_parser(
        "import",
        help="an OTLP/JSON trace file as runs (one per trace) of the imported kind",
        description="Each trace of an OTLP/JSON file (tttr export, an OpenTelemetry collector's file exporter, "
                    "Phoenix, Langfuse) as a run: one event per model call and per tool call, in causal order. "
                    "GenAI attribute names first; OpenInference's and Langfuse's as fallbacks (--format picks "
                    "which is read first). Nothing is written unless the whole file reads.",
    )
    p.add_argument("file", metavar="FILE.json", help="the OTLP/JSON file")
    p.add_argument("--db", required=True, metavar="DB", help="session database file (made if missing)")
    p.add_argument("--format", choices=FORMATS, default="otlp",
                   help="whose attribute names to read first (default otlp: the GenAI conventions); the file may be OTLP/JSON, Phoenix's spans JSON or Langfuse's traces JSON")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=import_)


def export(args: argparse.Namespace) -> int:
    from tttr.engine.traces import transfer

    if args.otlp is not None:
        done = transfer.export_file(args.db, args.runs, args.otlp, content=args.content)
        trace_ids, spans, where = done.trace_ids, done.spans, args.otlp
    else:
        from tttr.engine.traces.otlp import endpoint_url, send

        traces = transfer.run_traces(args.db, args.runs, content=args.content)
        trace_ids, spans = [t.trace_id for t in traces], send(traces, args.endpoint)
        where = endpoint_url(args.endpoint)
    if args.json:
        from tttr.sessions.export import safe_json

        print(safe_json({"runs": list(dict.fromkeys(args.runs)), "traces": trace_ids,
                         "spans": spans, "to": where, "content": args.content}))
    else:
        from tttr.sessions.safe_text import visible

        print(f"exported {len(trace_ids)} run(s) as {len(trace_ids)} trace(s), {spans} spans, to "
              f"{visible(where, newlines=False)}" + ("" if args.content else " (no content: add --content for messages)"))
    return 0


def import_(args: argparse.Namespace) -> int:
    from tttr.engine.traces import transfer
    from tttr.sessions.safe_text import visible

    done = transfer.import_file(args.file, args.db, args.format)
    if args.json:
        from tttr.sessions.export import safe_json

        print(safe_json({"db": args.db, "runs": [d.to_json() for d in done]}))
        return 0
    for d in done:
        missing = f"; the trace lacks {', '.join(d.missing)}" if d.missing else ""
        print(f"imported trace {d.trace_id} as run {d.run_id}: {d.spans} spans, {d.model_calls} model call(s), "
              f"{d.tool_calls} tool call(s){visible(missing, newlines=False)}")
    return 0
