"""`tttr bench engine --synthetic SHAPE`: a 1B-class model (random weights in a real model's
shape, engine/inference/synthetic.py) against llama.cpp on the same file and against the
machine's own limits (kernels/machine.py), side by side in one run.

Figures, each for TTTR and for llama.cpp (a process of its own, the same file, prompt ids and
threads), each the best of `rounds` rounds that alternate the two sides:

- single-stream decode: tokens/s between the first and the last of `tokens` greedy tokens after
  the chat-templated bench prompt (the prefill left out), and its time to first token (prefill
  of that prompt and one step);
- 8-way decode (TTTR): eight sequences at T=0.8 submitted together, tokens/wall time with their
  shared prefill, beside llama.cpp's single stream;
- prefill of P tokens for each P in `prefill` (random ids, fixed seed): P / seconds to the first
  token;
- cold start and peak memory: whole processes (bench.cold_start);
- the machine's limits, measured before and after the rounds (the better of the two): memory
  read bandwidth and fp32 FMA peak on the bench's threads; the fraction of each a figure reaches:
  decode, the file's weight bytes x tok/s / bandwidth (each token reads every weight once, the
  tied embedding as the output projection); prefill, its FLOPs (2 per weight per token for the
  layers, the output projection once, attention's QK and PV over the causal triangle) / seconds
  / peak.

Random weights measure speed, not text: no greedy agreement is measured on them."""

from __future__ import annotations

import time

import numpy as np
import torch

from tttr.engine.bench import engine as bench
from tttr.engine.inference import llama_cpp_reference as lcpp
from tttr.engine.inference import synthetic
from tttr.engine.inference.model import load_model
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence
from tttr.kernels import machine
from tttr.kernels.mode import is_invariant, kernel_mode

PREFILL = (512, 2048)
PROMPT_SEED = 7


def weight_bytes(path) -> int:
    """Bytes of every weight in the file (what one decode step reads)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def prefill_flops(cfg, tokens: int) -> float:
    """FLOPs of a prefill of `tokens` positions producing one row of logits."""
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    q = cfg.n_heads * cfg.head_dim
    layer = d * q + 2 * d * kv + q * d + 3 * d * cfg.ffn_dim
    attention = 2 * 2 * cfg.n_heads * cfg.head_dim * tokens * (tokens + 1) / 2
    return cfg.n_layers * (2.0 * layer * tokens + attention) + 2.0 * cfg.vocab_size * d


def random_prompt(n: int, vocab: int, avoid: set[int]) -> list[int]:
    """n ids drawn with a fixed seed above the default vocabulary's special tokens (its first
    few dozen ids), none of `avoid` (end-of-turn ids)."""
    rng = np.random.default_rng(PROMPT_SEED)
    ids = [int(t) for t in rng.integers(100, vocab, size=2 * n + 64) if int(t) not in avoid]
    return ids[:n]


def _ours_timed(engine: Engine, ids: list[int], n: int) -> tuple[float, float, float]:
    """(seconds to the first token, seconds from the first to the last, this process's CPU
    seconds from the first to the last) of one greedy sequence."""
    stamps: list[tuple[float, float]] = []
    seq = Sequence(ids, SamplingParams(temperature=0.0), n, stop_token_ids=(),
                   on_token=lambda _: stamps.append((time.perf_counter(), time.process_time())))
    t = time.perf_counter()
    engine.generate([seq])
    return stamps[0][0] - t, stamps[-1][0] - stamps[0][0], stamps[-1][1] - stamps[0][1]


def _best_limits(a: dict, b: dict) -> dict:
    if "unavailable" in a:
        return a
    return {k: max(a[k], b[k]) if k != "threads" else a[k] for k in a}


def run(shape: str, tokens: int = 32, prefill: tuple[int, ...] = PREFILL, rounds: int = 1,
        kernels: str = "invariant", cold: bool = True, progress=None) -> dict:
    say = progress or (lambda _: None)
    path = synthetic.ensure(shape, progress=say)
    threads = torch.get_num_threads()
    llama_status = bench.llama_cpp_status(path)
    say(f"machine limits on {threads} threads")
    limits_before = machine.limits(threads)
    cold_s = peak = lcold_s = lpeak = None
    if cold:
        say("cold starts (whole processes)")
        cold_s, peak, lcold_s, lpeak = bench.cold_start(
            path, llama_cpp_path=path if llama_status == "measured" else None,
            kernels=kernels if is_invariant(kernels) else "invariant", threads=threads)
    model = load_model(path)
    cfg, tok = model.config, model.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": bench.PROMPT}]))
    prompts = {p: random_prompt(p, cfg.vocab_size, set(tok.stop_token_ids)) for p in prefill}
    llama = None
    if llama_status == "measured":
        try:
            llama = lcpp.LlamaCppProcess(path, lcpp.context_size(max((*prefill, len(ids))), tokens), threads=threads)
            llama.run(ids, 4)  # warm-up
        except RuntimeError as exc:
            llama, llama_status = None, f"failed: {str(exc)[-300:]}"
    ours: dict[str, list[float]] = {"ttft": [], "decode": [], "decode_cpu": [], "batch8": [],
                                    **{f"p{p}": [] for p in prefill}}
    theirs: dict[str, list[float]] = {"ttft": [], "decode": [], "decode_cpu": [], **{f"p{p}": [] for p in prefill}}
    llama_peak = None
    try:
        with kernel_mode(kernels):
            engine = Engine(model)
            _ours_timed(engine, ids, 4)  # warm-up: first-call allocations, packing
            for r in range(rounds):
                say(f"round {r + 1}/{rounds}: single stream")
                first, rest, cpu = _ours_timed(engine, ids, tokens)
                ours["ttft"].append(first)
                ours["decode"].append((tokens - 1) / rest)
                ours["decode_cpu"].append((tokens - 1) / cpu)
                if llama is not None:
                    got = llama.timed(ids, tokens)
                    theirs["ttft"].append(got["first_s"])
                    theirs["decode"].append((tokens - 1) / (got["seconds"] - got["first_s"]))
                    if got.get("decode_cpu_s"):
                        theirs["decode_cpu"].append((tokens - 1) / got["decode_cpu_s"])
                say(f"round {r + 1}/{rounds}: 8-way")
                batch = [Sequence(ids, SamplingParams(temperature=0.8, seed=i), tokens, stop_token_ids=())
                         for i in range(8)]
                ours["batch8"].append(8 * tokens / bench._timed(lambda: engine.generate(batch)))
                for p, prompt in prompts.items():
                    say(f"round {r + 1}/{rounds}: prefill {p}")
                    ours[f"p{p}"].append(p / _ours_timed(engine, prompt, 1)[0])
                    if llama is not None:
                        theirs[f"p{p}"].append(p / llama.timed(prompt, 1)["first_s"])
            engine.close()
    finally:
        if llama is not None:
            llama_peak = llama.close()
    say("machine limits again")
    limits = _best_limits(limits_before, machine.limits(threads))
    return _report(shape, path, cfg, kernels, tokens, rounds, threads, limits, ours, theirs if llama else None,
                   llama_status, (cold_s, peak, lcold_s, lpeak, llama_peak))


def _report(shape, path, cfg, kernels, tokens, rounds, threads, limits, ours, theirs, llama_status, mem) -> dict:
    cold_s, peak, lcold_s, lpeak, llama_peak = mem
    nbytes = weight_bytes(path)
    bw = limits.get("bandwidth_gbs")
    peak_flops = limits.get("fma_peak_gflops")

    def best(d, key, low=False):
        return None if d is None or not d[key] else round(min(d[key]) if low else max(d[key]), 3)

    def side(d) -> dict | None:
        if d is None:
            return None
        out = {"decode_tok_s": best(d, "decode"), "decode_tok_per_cpu_s": best(d, "decode_cpu"),
               "ttft_s": best(d, "ttft", low=True)}
        if bw:
            out["decode_bandwidth_fraction"] = round(nbytes * out["decode_tok_s"] / (bw * 1e9), 3)
        for key in d:
            if key.startswith("p"):
                p = int(key[1:])
                out[f"prefill_{p}_tok_s"] = best(d, key)
                if peak_flops:
                    out[f"prefill_{p}_fma_fraction"] = round(
                        prefill_flops(cfg, p) * out[f"prefill_{p}_tok_s"] / p / (peak_flops * 1e9), 3)
        out["rounds"] = {k: [round(x, 3) for x in v] for k, v in d.items()}
        return out

    t, ll = side(ours), side(theirs)
    t["batch8_tok_s"] = best(ours, "batch8")

    def ratio(a, b):
        return round(a / b, 2) if a and b else None

    vs = None
    if ll is not None:
        vs = {"decode": ratio(t["decode_tok_s"], ll["decode_tok_s"]),
              "decode_cpu": ratio(t["decode_tok_per_cpu_s"], ll["decode_tok_per_cpu_s"]),
              "ttft": ratio(ll["ttft_s"], t["ttft_s"]),  # > 1: ours is sooner
              "batch8_vs_llama_single": ratio(t["batch8_tok_s"], ll["decode_tok_s"]),
              **{k: ratio(t[k], ll[k]) for k in t if k.startswith("prefill_") and k.endswith("_tok_s")},
              "cold_start": ratio(cold_s, lcold_s), "peak_rss": ratio(peak, lpeak)}
    return {
        "synthetic": shape, "file": str(path), "random_weights": True,
        "shape": {"arch": cfg.arch, "layers": cfg.n_layers, "d_model": cfg.d_model, "heads": cfg.n_heads,
                  "kv_heads": cfg.n_kv_heads, "ffn": cfg.ffn_dim, "vocab": cfg.vocab_size},
        "file_types": lcpp.tensor_types(path), "weight_bytes": nbytes,
        "kernel_mode": kernels, "tokens": tokens, "rounds": rounds, "threads": threads,
        "limits": limits, "tttr": t, "llama_cpp_status": llama_status, "llama_cpp": ll,
        "tttr_over_llama_cpp": vs,
        "cold_start_s": None if cold_s is None else round(cold_s, 2),
        "peak_rss_mib": None if peak is None else round(peak),
        "llama_cpp_cold_start_s": None if lcold_s is None else round(lcold_s, 2),
        "llama_cpp_cold_peak_rss_mib": None if lpeak is None else round(lpeak),
        "llama_cpp_bench_peak_rss_mib": llama_peak,
    }


def _f(x, spec=".2f", none="-") -> str:
    return none if x is None else format(x, spec)


def format_report(r: dict) -> str:
    s, t, ll, vs, lim = r["shape"], r["tttr"], r["llama_cpp"], r["tttr_over_llama_cpp"] or {}, r["limits"]
    types = ", ".join(f"{k} {v}" for k, v in r["file_types"].items())
    lines = [
        f"synthetic {r['synthetic']}: {s['arch']}, {s['layers']} layers, d {s['d_model']}, {s['heads']}/{s['kv_heads']} "
        f"heads, FFN {s['ffn']}, vocab {s['vocab']} (the default model's tokenizer); {types}; "
        f"{r['weight_bytes'] / 2**20:.0f} MiB of weights",
        "RANDOM WEIGHTS: these figures measure speed, not text (what this model writes means nothing)",
        f"kernels {r['kernel_mode']}  {r['threads']} threads  {r['tokens']} tokens/sequence  best of {r['rounds']} "
        f"round(s)  limits: {_f(lim.get('bandwidth_gbs'), '.1f')} GB/s read, "
        f"{_f(lim.get('fma_peak_gflops'), '.0f')} GFLOP/s fp32 FMA" + (f" ({lim['unavailable']})" if "unavailable" in lim else ""),
        f"{'':24}{'TTTR':>10}{'llama.cpp':>11}{'ratio':>8}",
    ]

    def row(label, key, unit, vs_key, frac_key=None, target=""):
        ours, theirs = t.get(key), (ll or {}).get(key)
        frac = ""
        if frac_key and t.get(frac_key) is not None:
            frac = f"  {t[frac_key]:.0%} / {_f((ll or {}).get(frac_key), '.0%')} of the limit"
        lines.append(f"{label:24}{_f(ours):>10}{_f(theirs):>11}{_f(vs.get(vs_key), '.2f') + 'x':>8}  {unit}{frac}{target}")

    row("single-stream decode", "decode_tok_s", "tok/s", "decode", "decode_bandwidth_fraction",
        "  (target >= 1.0x, >= 60% of bandwidth)")
    row("decode by CPU time", "decode_tok_per_cpu_s", "tok per CPU-second", "decode_cpu",
        target="  (each process's own CPU time: what a loaded machine's waits leave out)")
    row("time to first token", "ttft_s", "s", "ttft", target="  (ratio > 1: TTTR sooner)")
    # invariant-q8's products multiply integers: the fp32 FMA peak is not their bound
    integer = "  (of the fp32 FMA peak: integer products)" if r["kernel_mode"] == "invariant-q8" else ""
    for key in [k for k in t if k.startswith("prefill_") and k.endswith("_tok_s")]:
        p = key.split("_")[1]
        row(f"prefill {p}", key, "tok/s", key, f"prefill_{p}_fma_fraction",
            integer + ("  (2,048: target >= 1.0x)" if p == "2048" else ""))
    lines.append(f"{'8-way decode':24}{_f(t['batch8_tok_s']):>10}{'':11}{_f(vs.get('batch8_vs_llama_single')) + 'x':>8}"
                 "  tok/s aggregate, over llama.cpp's single stream (target >= 3x)")
    if r["cold_start_s"] is not None:
        lines.append(f"{'cold start':24}{_f(r['cold_start_s']):>10}{_f(r['llama_cpp_cold_start_s']):>11}"
                     f"{_f(vs.get('cold_start')) + 'x':>8}  s (target <= 1.2x)")
        lines.append(f"{'peak memory':24}{_f(r['peak_rss_mib'], '.0f'):>10}{_f(r['llama_cpp_cold_peak_rss_mib'], '.0f'):>11}"
                     f"{_f(vs.get('peak_rss')) + 'x':>8}  MiB, whole process (target <= 1.2x)")
    if ll is None:
        lines.append(f"llama.cpp: {r['llama_cpp_status']}" + ("" if r["llama_cpp_status"] != "not installed"
                                                              else f"; {lcpp.BUILD_HINT}"))
    return "\n".join(lines)
