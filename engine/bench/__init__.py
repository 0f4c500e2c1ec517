"""The benchmarks: one module per `tttr bench NAME`, named after it. Each measures its ratios
side by side in one run and prints them (`--json`: one object); none is asserted in a test.
The current figures, the machine and the date are in docs/benchmarks.md. The commands are
registered in `tttr.app.commands.bench`; `tttr bench app` drives the terminal app, so it is
`tttr.app.bench`. Nothing below the app imports this package (tests/test_layering.py).

| bench | module | measures | targets |
|---|---|---|---|
| store | `store` | token events appended per second (50 a step), a 200-event window read from the middle of a 1M-event file, bytes per event on disk | >= 100,000 events/s, <= 20 ms, <= 120 B |
| engine | `engine` (`--synthetic`: `engine_synthetic`) | decode tok/s single stream and 8-way, cold start of `tttr generate`, against transformers and llama.cpp (synthetic: a 0.5-1B shape's decode, prefill, TTFT against llama.cpp and the machine's bandwidth and FMA peak) | 8-way / transformers >= 1.3x, / llama.cpp >= 0.8x; cold start <= 1.5x llama.cpp's |
| determinism | `determinism` | the same prompt co-batched with random neighbours: distinct completions and logits-digest sequences per kernel mode; one prefill = chunks = token by token | `invariant`: exactly 1 and 1, identical |
| kernels | `kernels` (per op: `kernel_ops`) | invariant against fast kernels: per-op time and end-to-end decode | invariant / fast <= 1.15x |
| gpu | `gpu` (the kernel half: `gpu_kernels`) | Triton invariant kernels against cuBLAS, co-batched generations on the device, greedy ids CPU against GPU | invariant_over_cublas >= 0.8; one digest sequence |
| sandbox | `sandbox` (one mechanism at a time: `sandbox_shares`) | per-command overhead against `bash -c`, snapshot and restore of a 1,000-file tree | <= 20 ms, <= 50 ms, <= 100 ms |
| replay | `replay` | replay fidelity per layer (faithful, tensor freed, token freed) and faithful replay, late fork and recording overhead against recording | 10/10 identical; replay >= 50x; recording <= 5% |
| agent | `agent` | a user's agent program recorded, run unrecorded, replayed and forked; the SDK's import time | replay >= 50x, fork >= 3x; recording <= 5% |
| fidelity | `fidelity` | faithful replays under CPU load, forks' world reuse, the world answering otherwise in the same state | identical_fraction 1.0 |
| bisect | `bisect` | triage and bisect against planted causes: layer named, site found, replays, batching | 1.0 and 1.0; replays <= 2*log2(n)+2; batched >= 2x |
| suite | `suite` | a small suite in process and as Ray tasks; merge rate; pinned runs identical | ray_over_local >= 0.9; >= 100,000 events/s |
| serve | `serve` (the conversation: `serve_conversation`) | HTTP with 1 and 8 streaming clients against the engine alone, answers under load, TTFT, recording overhead, prefix reuse over a conversation | >= 0.9x; identical 1.0; `--db` <= 5% |
| export | `export` | a 10,000-span trace exported and imported, per second, and the round trip byte for byte | >= 20,000 spans/s each way |
"""
