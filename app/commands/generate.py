"""`tttr generate PROMPT`."""

from __future__ import annotations

import json
import sys

from tttr.app.commands import args as argtypes
from tttr.kernels.mode import MODES, is_invariant


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
