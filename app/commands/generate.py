"""`tttr generate PROMPT` and `tttr bench engine`."""

from __future__ import annotations

import argparse
import json
import sys

from tttr.app.commands import args as argtypes
from tttr.kernels.mode import MODES, is_invariant

SYNTHETIC_SHAPES = ("llama-1b", "qwen-0.5b")  # engine/inference/synthetic.py's SHAPES (not imported: numpy, gguf)


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "generate", help="generate text with the engine (streams tokens)",
        description="Generate a continuation of PROMPT with the embedded default model (or --model), "
                    "streaming the text. --json prints one JSON record per token: id, text, forced, "
                    "logprob, rng coordinates, logits digest, top-k alternatives, batch composition, "
                    "kernel mode. Under the invariant kernels (the default, or invariant-q8) a GGUF model "
                    "whose products all run from its blocks generates without loading torch (greedy, or a "
                    "temperature without --top-k/--top-p), with the same bits.",
    )
    p.add_argument("prompt", help="the prompt text (with --chat: the user message)")
    p.add_argument("--model", default=None,
                   help="a .gguf file or a Hugging Face model folder (default: $TTTR_MODEL, else the "
                        "embedded SmolLM2-135M-Instruct)")
    p.add_argument("--chat", action="store_true", help="wrap PROMPT as a user message in the model's chat template")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1.0)")
    p.add_argument("--top-k", type=argtypes.count, default=0, help="keep the k most likely tokens (default 0 = all)")
    p.add_argument("--seed", type=argtypes.seed, default=0, help="sampling seed in [0, 2^63) (default 0)")
    p.add_argument("--max-tokens", type=argtypes.positive, default=128, help="tokens to generate at most (default 128)")
    p.add_argument("--kernels", choices=MODES, default="invariant",
                   help="kernel mode (default invariant, as record and serve; invariant-q8: 8-bit activations "
                        "in block products, as llama.cpp)")
    p.add_argument("--json", action="store_true", help="one JSON record per token instead of text")
    p.set_defaults(func=cmd_generate)

    b = bench_sub.add_parser(
        "engine", help="engine decode speed: single stream, 8-way batch, cold start, against transformers and llama.cpp",
        description="On the default model (or --model), side by side in one run: single-stream "
                    "decode tokens/s, aggregate tokens/s with 8 concurrent sequences, the cold start "
                    "of `tttr generate` (time and peak memory), and as references transformers' generate "
                    "and llama.cpp (llama-cpp-python) on the same file, prompt ids and threads, each "
                    "when installed, with greedy agreement against llama.cpp.",
    )
    b.add_argument("--model", default=None, help="a .gguf file (default: the embedded default)")
    b.add_argument("--synthetic", choices=SYNTHETIC_SHAPES, default=None,
                   help="instead of --model: random weights (fixed seed) in a real model's shape, written and "
                        "cached on first use (Q4_K_M by llama.cpp's quantizer where installed, else F16); "
                        "measures decode, 8-way, prefill, time to first token, cold start and memory against "
                        "llama.cpp and the machine's bandwidth and FMA peak (speed only: the text means nothing)")
    b.add_argument("--prefill", type=_prompt_lengths, default=(512, 2048),
                   help="with --synthetic: prompt lengths whose prefill is measured, comma-separated (default 512,2048)")
    b.add_argument("--tokens", type=argtypes.positive, default=None,
                   help="tokens per sequence (default 100; 32 with --synthetic)")
    b.add_argument("--kernels", choices=MODES, default="invariant",
                   help="kernel mode (default invariant, as generate, record and serve)")
    b.add_argument("--threads", type=argtypes.threads, default=None,
                   help="threads for every side: torch's intra-op threads, the compiled kernels', the "
                        "cold-start processes' and llama.cpp's (default: torch's default, the core count)")
    b.add_argument("--rounds", type=argtypes.positive, default=None,
                   help="measurement rounds, alternating ours and the reference; the best of each counts "
                        "(default 3; 1 with --synthetic)")
    b.add_argument("--no-cold", action="store_true", help="skip the cold-start processes")
    b.add_argument("--no-reference", action="store_true", help="skip the transformers reference (llama.cpp still runs when installed)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_bench)


def cmd_generate(args) -> int:
    from tttr.engine.inference.loader import resolve_model_path
    from tttr.engine.inference.sampling import SamplingParams

    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    model_path = resolve_model_path(args.model)  # a wrong path is refused before torch loads
    out = sys.stdout
    produced: list[int] = []
    shown = [""]
    tok = None

    def on_token(rec) -> None:
        if args.json:
            out.write(json.dumps(rec.to_json()) + "\n")
            out.flush()
            return
        produced.append(rec.token_id)
        if rec.token_id in tok.stop_token_ids:
            return
        full = tok.decode([t for t in produced if t not in tok.stop_token_ids])
        if full.endswith("\ufffd"):
            return  # half of a multi-byte character: wait for the rest
        out.write(full[len(shown[0]):])
        out.flush()
        shown[0] = full

    def prompt_ids() -> list[int]:
        text = tok.apply_chat_template([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
        return tok.encode(text)

    done = None
    if is_invariant(args.kernels) and not sampling.top_k and sampling.top_p >= 1.0:
        from tttr.engine.inference import lite  # no torch: the same bits where it applies (lite.py)

        small = lite.load(model_path, args.kernels)
        if small is not None:
            tok = small.tokenizer
            done = lite.generate(small, prompt_ids(), sampling, args.max_tokens, on_token)
    if done is None:
        from tttr.engine.inference.model import load_model
        from tttr.engine.inference.scheduler import Engine
        from tttr.engine.inference.sequence import Sequence
        from tttr.kernels.mode import kernel_mode

        model = load_model(model_path)
        tok = model.tokenizer
        seq = Sequence(prompt_ids(), sampling, args.max_tokens, on_token=on_token)
        with kernel_mode(args.kernels):
            engine = Engine(model)
            try:
                engine.generate([seq])
            finally:
                engine.close()
    if not args.json:
        out.write("\n")
    return 0


def _prompt_lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(x) for x in text.split(","))
    except ValueError:
        lengths = ()
    if not lengths or any(not 1 <= n <= 8000 for n in lengths):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of prompt lengths in 1..8000")
    return lengths


def cmd_bench(args) -> int:
    if args.synthetic is not None and args.model is not None:
        print("tttr: error: --synthetic and --model are exclusive: the synthetic bench writes its own file",
              file=sys.stderr)
        return 2
    if args.synthetic is None:
        from tttr.engine.inference.loader import model_source

        model_path = model_source(args.model)  # a wrong path or a file that is no model: refused before any work
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.synthetic is not None:
        from tttr.engine.inference import bench_synthetic

        report = bench_synthetic.run(args.synthetic, tokens=max(2, args.tokens or 32), prefill=args.prefill,
                                     rounds=args.rounds or 1, kernels=args.kernels, cold=not args.no_cold,
                                     progress=lambda line: print(line, file=sys.stderr, flush=True))
        print(json.dumps(report) if args.json else bench_synthetic.format_report(report))
        return 0

    from tttr.engine.inference.bench import format_report, run_bench

    report = run_bench(model_path=model_path, tokens=args.tokens or 100, kernels=args.kernels,
                       reference=not args.no_reference, rounds=args.rounds or 3, cold=not args.no_cold)
    if args.json:
        print(json.dumps(report))
    else:
        print(format_report(report))
    return 0
