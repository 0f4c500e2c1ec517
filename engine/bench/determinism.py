"""The determinism proof behind `tttr bench determinism` (the kernels' property, shown
through the engine: so it lives above both).

The same prompt is generated `runs` times, each time co-batched with 0..15 other random
prompts (random lengths, random generation lengths) at a random row of the pass, once
greedy and once sampled at temperature 0.8 with a fixed seed, under each kernel mode. For
each: how many distinct completions and distinct logits-digest sequences came out, and the
first position where digests differ. Then the same prompt (and its completion) goes
through the model in one prefill, in chunks, and token by token, and the logits digests
of every position are compared.

With `fast` kernels the batch composition leaks into the arithmetic (differing digests,
sometimes differing text); with `invariant` kernels there is exactly one of each. Config's
`kernels` names the invariant mode shown beside `fast`: `invariant`, or `invariant-q8` (8-bit
activations in the block products, integer sums: invariant too).
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from tttr.engine.inference.digest import logits_digest
from tttr.engine.inference.model import Segment, load_model
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence
from tttr.kernels.mode import MODES as KERNEL_MODES, is_invariant, kernel_mode

TARGET_MESSAGES = [
    {"role": "user", "content": "Write a shell command that lists the five largest files in /var/log."}
]
CHUNK_SIZES = (7, 16)  # chunked prefill: these chunk sizes (the rest of the prompt in one pass each)


@dataclass(frozen=True, slots=True)
class Config:
    runs: int = 100
    tokens: int = 40
    max_others: int = 15
    temperature: float = 0.8
    seed: int = 1234
    prefill_tokens: int | None = None  # cap on the sequence compared across prefill paths (None: all)
    kernels: str = "invariant"  # the invariant mode shown beside `fast` (invariant or invariant-q8)

    @property
    def modes(self) -> tuple[str, ...]:
        return ("fast", self.kernels)

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError(f"runs={self.runs} is out of range: use at least 1")
        if self.tokens < 1:
            raise ValueError(f"tokens={self.tokens} is out of range: use at least 1")
        if not 0 <= self.max_others <= 63:
            raise ValueError(f"max_others={self.max_others} is out of range: use 0..63")
        if self.kernels not in KERNEL_MODES or not is_invariant(self.kernels):
            raise ValueError(f"kernels={self.kernels!r} is not an invariant mode: use one of "
                             + ", ".join(m for m in KERNEL_MODES if is_invariant(m)))


def _progress_stderr(done: int, total: int, message: str) -> None:
    print(f"\r[{done}/{total}] {message}   ", end="" if done < total else "\n", file=sys.stderr, flush=True)


def _summary(completions: list[tuple[int, ...]], digests: list[tuple[str, ...]]) -> dict:
    first = None
    ref = digests[0]
    for seq in digests[1:]:
        for i, (a, b) in enumerate(zip(ref, seq)):
            if a != b:
                first = i if first is None else min(first, i)
                break
        else:
            if len(ref) != len(seq):
                i = min(len(ref), len(seq))
                first = i if first is None else min(first, i)
    return {
        "unique_completions": len(set(completions)),
        "unique_digest_sequences": len(set(digests)),
        "first_differing_position": first,
    }


def _other_prompt(rng: random.Random, vocab: int) -> list[int]:
    # Random ids from the ordinary-token range, random length: a random batch neighbour
    # (short, so the bench spends its time on the decode steps it is about).
    return [rng.randrange(100, min(vocab, 40000)) for _ in range(rng.randint(2, 24))]


def generations(model, cfg: Config, progress: Callable[[int, int, str], None] | None = None,
                modes: tuple[str, ...] | None = None) -> dict:
    """{"greedy"|"sampled": {mode: summary}} over cfg.runs co-batched generations per cell.

    Each run draws one batch composition (0..max_others random neighbours, the target at
    a random row) and generates the greedy and the sampled target in it, one after the
    other; both modes see the same compositions."""

    modes = modes or cfg.modes
    tok = model.tokenizer
    target = tok.encode(tok.apply_chat_template(TARGET_MESSAGES, add_generation_prompt=True))
    vocab = model.config.vocab_size
    samplings = {"greedy": SamplingParams(), "sampled": SamplingParams(temperature=cfg.temperature, seed=cfg.seed)}
    total = len(modes) * cfg.runs
    done = 0
    cells = {s: {m: ([], [], set()) for m in modes} for s in samplings}
    engine = Engine(model, max_running=cfg.max_others + 1)
    try:
        for mode in modes:
            rng = random.Random(cfg.seed)  # the same batch compositions for both modes
            for _ in range(cfg.runs):
                n_others = rng.randint(0, cfg.max_others)
                at = rng.randint(0, n_others)
                others = [(_other_prompt(rng, vocab), rng.randint(1, cfg.tokens)) for _ in range(n_others)]
                for sname, params in samplings.items():
                    seqs = [Sequence(ids, SamplingParams(), n, stop_token_ids=()) for ids, n in others]
                    me = Sequence(target, params, cfg.tokens, stop_token_ids=())
                    seqs.insert(at, me)
                    with kernel_mode(mode):
                        engine.generate(seqs)
                    completions, digests, layouts = cells[sname][mode]
                    completions.append(tuple(r.token_id for r in me.records))
                    digests.append(tuple(r.digest for r in me.records))
                    layouts.add((me.records[0].batch_rows, me.records[0].row))
                done += 1
                if progress:
                    progress(done, total, f"co-batched generations, {mode}")
    finally:
        engine.close()
    return {s: {m: {**_summary(c, d), "batch_layouts": len(l)} for m, (c, d, l) in per.items()}
            for s, per in cells.items()}


def _forward_digests(model, ids: list[int], chunk: int | None) -> list[str]:
    """Logits digests of every position of `ids`, fed in chunks of `chunk` tokens (None = one pass)."""

    cache = model.new_cache(len(ids))
    step = chunk or len(ids)
    out: list[str] = []
    with torch.inference_mode():
        for start in range(0, len(ids), step):
            part = ids[start : start + step]
            logits = model.forward(
                torch.tensor(part, dtype=torch.int64),
                torch.arange(start, start + len(part), dtype=torch.int64),
                [Segment(0, len(part), cache)],
            )
            cache.length += len(part)
            out.extend(logits_digest(row) for row in logits)
    return out


def prefill_paths(model, cfg: Config, completion: list[int] | None = None,
                  progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Per mode: are the logits of every position identical for one prefill, chunked prefill
    (CHUNK_SIZES) and token by token? The sequence is the target prompt plus `completion`."""
    tok = model.tokenizer
    ids = tok.encode(tok.apply_chat_template(TARGET_MESSAGES, add_generation_prompt=True)) + list(completion or [])
    ids = ids[: cfg.prefill_tokens] if cfg.prefill_tokens else ids
    out = {}
    ways = [("one prefill", None), *((f"chunks of {c}", c) for c in CHUNK_SIZES), ("token by token", 1)]
    total = len(cfg.modes) * len(ways)
    done = 0
    for mode in cfg.modes:
        with kernel_mode(mode):
            results = {}
            for name, chunk in ways:
                results[name] = _forward_digests(model, ids, chunk)
                done += 1
                if progress:
                    progress(done, total, f"prefill paths {mode}")
        ref = results["one prefill"]
        first = None
        for digests in results.values():
            for i, (a, b) in enumerate(zip(ref, digests)):
                if a != b:
                    first = i if first is None else min(first, i)
                    break
        out[mode] = {"identical": first is None, "first_differing_position": first, "positions": len(ids),
                     "ways": [name for name, _ in ways]}
    return out


def run(cfg: Config, model=None, progress: Callable[[int, int, str], None] | None = _progress_stderr) -> dict:
    model = model or load_model()
    t0 = time.perf_counter()
    gens = generations(model, cfg, progress)
    # Feed the invariant greedy completion through the prefill paths too: positions past the prompt.
    tok = model.tokenizer
    target = tok.encode(tok.apply_chat_template(TARGET_MESSAGES, add_generation_prompt=True))
    with Engine(model, kernel_mode=cfg.kernels) as eng:
        greedy_completion = [r.token_id for r in eng.generate([Sequence(target, SamplingParams(), cfg.tokens,
                                                                        stop_token_ids=())])[0]]
    paths = prefill_paths(model, cfg, greedy_completion[:-1], progress)
    result = {
        "runs": cfg.runs,
        "tokens": cfg.tokens,
        "max_others": cfg.max_others,
        "temperature": cfg.temperature,
        "seed": cfg.seed,
        "model": model.model_id,
        "threads": torch.get_num_threads(),
        "greedy": gens["greedy"],
        "sampled": gens["sampled"],
        "kernels": cfg.kernels,
        "prefill_chunked_decode_identical": {m: paths[m]["identical"] for m in cfg.modes},
        "prefill_paths": paths,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    # The issue's top-level keys: the greedy half, with the sampled half's counts folded in.
    for mode in cfg.modes:
        result[mode] = {
            "unique_completions": max(gens[s][mode]["unique_completions"] for s in gens),
            "unique_digest_sequences": max(gens[s][mode]["unique_digest_sequences"] for s in gens),
        }
    return result


def lines(result: dict) -> list[str]:
    modes = tuple(result["prefill_paths"])
    out = [
        f"determinism: {result['runs']} generations x {result['tokens']} tokens per cell, each co-batched with "
        f"0-{result['max_others']} random prompts at a random row ({result['model']}, {result['threads']} threads)",
        f"{'sampling':<22} {'mode':<12} {'completions':>11} {'digest seqs':>11} {'first diff':>10} {'layouts':>8}",
    ]
    for sname, label in (("greedy", "greedy"), ("sampled", f"T={result['temperature']} seed={result['seed']}")):
        for mode in modes:
            s = result[sname][mode]
            first = "-" if s["first_differing_position"] is None else str(s["first_differing_position"])
            out.append(f"{label:<22} {mode:<12} {s['unique_completions']:>11} {s['unique_digest_sequences']:>11} "
                       f"{first:>10} {s['batch_layouts']:>8}")
    for mode in modes:
        p = result["prefill_paths"][mode]
        verdict = "identical" if p["identical"] else f"differ from position {p['first_differing_position']}"
        out.append(f"prefill vs chunks ({', '.join(str(c) for c in CHUNK_SIZES)}) vs token by token, {mode}: "
                   f"{verdict} ({p['positions']} positions)")
    out.append(f"({result['seconds']} s)")
    return out
