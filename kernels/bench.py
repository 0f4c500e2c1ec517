"""`tttr bench kernels`: invariant against fast, measured side by side in one run.

Per op at the default model's decode and prefill shapes, and end to end: decode tokens/s
of one stream and of 8 streams through the engine. Every figure alternates the two modes
round by round and keeps each mode's best round, so load from other processes on a shared
machine hits both alike. Ratios are invariant time / fast time (lower is better; the
target is <= 1.15)."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Callable

import torch

from tttr.kernels import ops
from tttr.kernels.mode import MODES, kernel_mode

D, FFN, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 49152, 9, 3, 64
LINEARS = {"qkv": (HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM, D), "o": (D, D), "gate_up": (2 * FFN, D),
           "down": (D, FFN), "lm_head": (VOCAB, D)}
DECODE_ROWS = (1, 8)
PREFILL_ROWS = 256
ATTN_CTX = 256


def _best_of(fns: dict[str, Callable[[], object]], rounds: int, inner: int) -> dict[str, float]:
    """Seconds per call of each fn, best round, rounds alternating between the fns."""
    best = {k: float("inf") for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            best[k] = min(best[k], (time.perf_counter() - t) / inner)
    return best


def _mode_fns(make: Callable[[], Callable[[], object]]) -> dict[str, Callable[[], object]]:
    def bound(mode):
        fn = make()

        def run():
            with kernel_mode(mode):
                return fn()

        return run

    return {m: bound(m) for m in MODES}


def op_timings(rounds: int = 5, progress: Callable[[int, int, str], None] | None = None) -> dict:
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    cases: list[tuple[str, Callable[[], Callable[[], object]], int]] = []
    for name, (n, k) in LINEARS.items():
        w = rnd(n, k) / k**0.5
        for rows in (*DECODE_ROWS, PREFILL_ROWS):
            if name == "lm_head" and rows == PREFILL_ROWS:
                continue  # the engine takes logits of the produced positions only
            x = rnd(rows, k)
            cases.append((f"linear {name} {n}x{k} rows={rows}", lambda x=x, w=w: (lambda: ops.linear(x, w)),
                          20 if rows < 64 and n < 10000 else 3))
    wn = rnd(D)
    for rows in (*DECODE_ROWS, PREFILL_ROWS):
        x = rnd(rows, D)
        cases.append((f"rms_norm {D} rows={rows}", lambda x=x: (lambda: ops.rms_norm(x, wn, 1e-5)), 50))
    for rows in DECODE_ROWS:
        z = rnd(rows, VOCAB)
        cases.append((f"log_softmax {VOCAB} rows={rows}", lambda z=z: (lambda: ops.log_softmax(z, -1)), 10))
    k, v = rnd(ATTN_CTX, KV_HEADS, HEAD_DIM), rnd(ATTN_CTX, KV_HEADS, HEAD_DIM)
    q1, p1 = rnd(1, HEADS, HEAD_DIM), torch.tensor([ATTN_CTX - 1])
    qp, pp = rnd(ATTN_CTX, HEADS, HEAD_DIM), torch.arange(ATTN_CTX)
    cases.append((f"attention decode ctx={ATTN_CTX}", lambda: (lambda: ops.attention(q1, k, v, p1, 0.125)), 20))
    cases.append((f"attention prefill {ATTN_CTX}", lambda: (lambda: ops.attention(qp, k, v, pp, 0.125)), 2))
    out = {}
    for i, (name, make, inner) in enumerate(cases):
        t = _best_of(_mode_fns(make), rounds, inner)
        out[name] = {"fast_us": t["fast"] * 1e6, "invariant_us": t["invariant"] * 1e6,
                     "ratio": t["invariant"] / t["fast"]}
        if progress:
            progress(i + 1, len(cases), "ops")
    return out


def _decode_seconds_per_token(engine, prompt: list[int], streams: int, tokens: int, mode: str) -> float:
    from tttr.engine.sequence import Sequence  # noqa: PLC0415

    stamps: list[float] = []
    seqs = [Sequence(prompt, max_tokens=tokens, stop_token_ids=(), on_token=lambda r: stamps.append(time.perf_counter()))
            for _ in range(streams)]
    with kernel_mode(mode):
        engine.generate(seqs)
    # Decode only: from the first produced token (end of the prefill pass) to the last.
    return (stamps[-1] - stamps[streams - 1]) / (streams * (tokens - 1))


def end_to_end(model, tokens: int = 32, rounds: int = 3,
               progress: Callable[[int, int, str], None] | None = None) -> dict:
    from tttr.engine.scheduler import Engine  # noqa: PLC0415

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
        from tttr.engine.model import load_model  # noqa: PLC0415

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
