"""`tttr bench kernels`: invariant against fast, measured side by side in one run.

Per op (kernel_ops.py, no model needed) and end to end: decode tokens/s of one
stream and of 8 streams through the engine. Every figure alternates the two modes round by
round and keeps each mode's best round, so load from other processes on a shared machine
hits both alike. Ratios are invariant time / fast time (lower is better; the target is
<= 1.15)."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Callable

import torch

from tttr.engine.inference.model import load_model
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence
from tttr.engine.bench.kernel_ops import op_timings
from tttr.kernels.mode import BASE_MODES as MODES, kernel_mode  # the fp32 pair; invariant-q8: its own tests


def _decode_seconds_per_token(engine, prompt: list[int], streams: int, tokens: int, mode: str) -> float:
    stamps: list[float] = []
    seqs = [Sequence(prompt, max_tokens=tokens, stop_token_ids=(), on_token=lambda r: stamps.append(time.perf_counter()))
            for _ in range(streams)]
    with kernel_mode(mode):
        engine.generate(seqs)
    # Decode only: from the first produced token (end of the prefill pass) to the last.
    return (stamps[-1] - stamps[streams - 1]) / (streams * (tokens - 1))


def end_to_end(model, tokens: int = 32, rounds: int = 3,
               progress: Callable[[int, int, str], None] | None = None) -> dict:
    tok = model.tokenizer
    prompt = tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "List the files in /tmp, largest first."}], add_generation_prompt=True))
    out = {}
    step = 0
    with Engine(model) as engine:
        for streams in (1, 8):
            times: dict[str, list[float]] = {m: [] for m in MODES}
            for m in MODES:  # warm: packs the weights, fills the caches
                _decode_seconds_per_token(engine, prompt, streams, 4, m)
            for _ in range(rounds):
                for m in MODES:
                    times[m].append(_decode_seconds_per_token(engine, prompt, streams, tokens, m))
                    step += 1
                    if progress:
                        progress(step, 2 * rounds * 2, f"end to end, {streams} stream(s)")
            best = {m: min(ts) for m, ts in times.items()}
            out[f"streams_{streams}"] = {
                **{f"{m}_tok_s": 1.0 / best[m] for m in MODES},
                **{f"{m}_tok_s_median": 1.0 / statistics.median(times[m]) for m in MODES},
                "ratio": best["invariant"] / best["fast"],
            }
    return out


def run(model=None, rounds: int = 5, tokens: int = 32, e2e: bool = True,
        progress: Callable[[int, int, str], None] | None = None) -> dict:
    result: dict = {"threads": torch.get_num_threads(), "ops": op_timings(rounds, progress)}
    if e2e:
        model = model or load_model()
        result["model"] = model.model_id
        result["end_to_end"] = end_to_end(model, tokens=tokens, rounds=max(3, rounds // 2), progress=progress)
        result["invariant_over_fast_single"] = result["end_to_end"]["streams_1"]["ratio"]
        result["invariant_over_fast_batch8"] = result["end_to_end"]["streams_8"]["ratio"]
    return result


def lines(result: dict) -> list[str]:
    out = [f"kernels: invariant vs fast, side by side ({result['threads']} threads; best of alternating rounds)",
           f"{'op':<42} {'fast µs':>10} {'invariant µs':>13} {'ratio':>7}"]
    for name, r in result["ops"].items():
        out.append(f"{name:<42} {r['fast_us']:>10.1f} {r['invariant_us']:>13.1f} {r['ratio']:>6.2f}×")
    if "end_to_end" in result:
        for key, label in (("streams_1", "single stream"), ("streams_8", "8 streams")):
            e = result["end_to_end"][key]
            out.append(f"end to end decode, {label:<13} fast {e['fast_tok_s']:6.1f} tok/s   invariant "
                       f"{e['invariant_tok_s']:6.1f} tok/s   invariant/fast time {e['ratio']:.2f}×")
    return out


def progress_stderr(done: int, total: int, message: str) -> None:
    print(f"\r[{done}/{total}] {message}        ", end="" if done < total else "\n", file=sys.stderr, flush=True)
