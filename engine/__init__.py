"""The engine, for its two audiences.

- `tttr.engine.inference`: the model and everything that runs it — loading a GGUF file or a
  Hugging Face folder, the tokenizer and chat template, the KV caches, the sampler and the
  continuous-batching scheduler.
- `tttr.engine.replay`: record, replay, fork and diff of agent runs — the shell agent's loop,
  the oracle it asks for every value it could not predict, the replay policy, mutations.
- `tttr.engine.serve`: the OpenAI API over the engine, without HTTP (requests, prompts and
  tools, responses, recording each call as a run); `tttr.engine.serve.server` is its HTTP face.
- `tttr.engine.bench`: every `tttr bench NAME` (but `bench app`, the app's) as its module NAME,
  the determinism proof among them; its docstring is the index. Nothing else here imports it.

`replay` and `serve` use `inference`; `inference` imports neither.
"""
