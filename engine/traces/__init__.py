"""Traces in and out: a run as OpenTelemetry GenAI spans, and a trace from elsewhere as a run.

- `spans`: the trace and span values both directions share, and the stable ids of a run's spans.
- `from_run`: a recorded run (any kind) as one trace: `invoke_agent`, `chat`, `execute_tool`.
- `otlp`: traces to OTLP's protobuf messages, sent to a collector over OTLP/HTTP; `otlp_json`
  the same traces as OTLP/JSON (what json_format writes of those messages, built directly);
  `otlp_read` OTLP/JSON files back to traces, checked.
- `conventions`: reading a span's model call or tool call by the GenAI conventions' names,
  then OpenInference's (Phoenix) and Langfuse's.
- `imported`: a trace written into a session database as a run of the imported kind, and that
  kind (engine/kinds.py registers it).
- `against`: a user's program replayed or forked against an imported run (`tttr replay IMPORTED
  -- PROGRAM`): the checked plan; `trace_replayer` meets the program's requests with the trace's
  steps, `matching` says what is compared, `upstream` sends live calls to `--upstream URL`.

`tttr bench export` is tttr.engine.bench.export.

Nothing here imports the app; only this package imports `opentelemetry`, and only when a
trace is written as OTLP (the `otel` extra).
"""
