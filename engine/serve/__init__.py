"""The OpenAI-compatible API over the engine, without HTTP: validating a request, rendering
its prompt (tools included), running it as a Sequence, shaping OpenAI's response objects,
and recording each call as a run. `tttr.engine.serve.server` puts this behind HTTP."""
