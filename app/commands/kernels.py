"""`tttr bench determinism` and `tttr bench kernels`: the tensor layer's proof and its cost."""

from __future__ import annotations

import json
import sys

from tttr.app.commands import args as argtypes
from tttr.app.commands.generate import SYNTHETIC_SHAPES


def register(sub, bench_sub) -> None:
    d = bench_sub.add_parser(
        "determinism", help="same prompt, random batch neighbours: unique completions and digests per kernel mode",
        description="Generate the same prompt --runs times (greedy, and sampled at T=0.8 with a fixed seed), each "
                    "time co-batched with 0-15 random prompts at a random row, under each kernel mode; print the "
                    "number of unique completions and logits-digest sequences and the first differing position. "
                    "Then compare one prefill, chunked prefill and token-by-token decode. Expected: invariant gives "
                    "exactly 1 and 1 and identical prefill paths; fast differs in the prefill paths, and under "
                    "co-batching too where its products are stock (dense weights; a quantized GGUF's products are "
                    "invariant in both modes). Progress goes to stderr.",
    )
    d.add_argument("--runs", type=argtypes.positive, default=100, help="generations per mode and sampling (default 100)")
    d.add_argument("--tokens", type=argtypes.positive, default=40, help="tokens per generation (default 40)")
    d.add_argument("--seed", type=argtypes.seed, default=1234, help="seed of the batch compositions and the sampler (default 1234)")
    d.add_argument("--threads", type=argtypes.threads, help="torch threads (default: torch's)")
    d.add_argument("--synthetic", choices=SYNTHETIC_SHAPES, default=None,
                   help="on random weights in a real model's shape (as bench engine --synthetic) instead of the "
                        "default model")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=cmd_determinism)

    k = bench_sub.add_parser(
        "kernels", help="invariant vs fast kernels: per-op time and end-to-end decode tok/s, side by side",
        description="Per-op time at the default model's decode and prefill shapes and end-to-end decode tokens/s "
                    "(1 and 8 streams), invariant against fast, alternating round by round in one run. Ratios are "
                    "invariant time / fast time.",
    )
    k.add_argument("--rounds", type=argtypes.positive, default=5, help="alternating rounds per figure (default 5)")
    k.add_argument("--tokens", type=argtypes.positive, default=32, help="tokens per end-to-end generation (default 32)")
    k.add_argument("--ops-only", action="store_true", help="skip the end-to-end part (no model needed)")
    k.add_argument("--threads", type=argtypes.threads, help="torch threads (default: torch's)")
    k.add_argument("--json", action="store_true", help="print one JSON object")
    k.set_defaults(func=cmd_kernels)

    g = bench_sub.add_parser(
        "gpu", help="the GPU path: Triton invariant kernels vs cuBLAS, co-batched replays, CPU vs GPU decisions",
        description="On a CUDA machine, one script: the Triton invariant kernels against torch/cuBLAS at the decode "
                    "and prefill shapes of the default model and llama-1b (invariant_over_cublas, target >= 0.8), "
                    "--runs generations of the default model on the GPU co-batched with random prompts (one digest "
                    "sequence expected), and the bench prompts' greedy ids on CPU and GPU. Without CUDA it runs on "
                    "the CPU (Triton interpreter, tiny shapes) to show the script works; its figures are not the GPU's.",
    )
    g.add_argument("--runs", type=argtypes.positive, default=100, help="co-batched generations (default 100)")
    g.add_argument("--tokens", type=argtypes.positive, default=24, help="tokens per generation (default 24)")
    g.add_argument("--cpu", action="store_true", help="run on the CPU even where CUDA is available")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_gpu)


def _threads(args) -> None:
    if args.threads:
        import torch  # noqa: PLC0415 - torch loads in the handler so that `tttr --help` stays fast

        torch.set_num_threads(args.threads)


def cmd_determinism(args) -> int:
    _threads(args)
    from tttr.engine.inference import determinism  # noqa: PLC0415 - loads torch; only when this command runs

    model = None
    if args.synthetic:
        from tttr.engine.inference import synthetic  # noqa: PLC0415
        from tttr.engine.inference.model import load_model  # noqa: PLC0415

        model = load_model(synthetic.ensure(args.synthetic, progress=lambda line: print(line, file=sys.stderr)))
    result = determinism.run(determinism.Config(runs=args.runs, tokens=args.tokens, seed=args.seed), model=model)
    print(json.dumps(result, indent=1) if args.json else "\n".join(determinism.lines(result)))
    return 0


def cmd_kernels(args) -> int:
    _threads(args)
    from tttr.engine.inference import bench_kernels as bench  # noqa: PLC0415 - loads torch; only when this command runs

    result = bench.run(rounds=args.rounds, tokens=max(2, args.tokens), e2e=not args.ops_only,
                       progress=bench.progress_stderr)
    print(json.dumps(result, indent=1) if args.json else "\n".join(bench.lines(result)))
    return 0


def cmd_gpu(args) -> int:
    import subprocess  # noqa: PLC0415

    from tttr.engine.inference import bench_gpu  # noqa: PLC0415 - loads torch; only when this command runs

    if args.cpu or not bench_gpu.cuda_available():
        env = bench_gpu.interpreter_env()
        if env is not None:  # the Triton interpreter is chosen when triton is imported: a fresh process
            return subprocess.call([sys.executable, "-m", "tttr.app", "bench", "gpu", "--cpu",
                                    "--runs", str(args.runs), "--tokens", str(args.tokens),
                                    *(["--json"] if args.json else [])], env=env)
    result = bench_gpu.run(cpu=args.cpu, runs=args.runs, tokens=args.tokens,
                           progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result, indent=1) if args.json else "\n".join(bench_gpu.lines(result)))
    return 0
