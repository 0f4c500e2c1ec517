"""`tttr bench engine`: decode speed measured side by side in one run.

- single stream: one greedy sequence, N new tokens, prompt prefill included, tokens / wall time;
- 8-way: eight sequences (same prompt, different seeds, temperature 0.8) submitted together;
  aggregate tokens / wall time (the engine prefills their common prompt once, as for any
  n-samples request, then decodes all eight in one pass per step);
- reference: transformers' `generate` (greedy, fp32) on the same GGUF and prompt ids;
- cold start: a whole `tttr generate "Hello" --max-tokens 1` process (interpreter, imports,
  model load, one token), its wall time (median of 3) and peak resident memory.
Rounds alternate ours and the reference; each figure is its best round.
Stop tokens are ignored so every sequence produces exactly N tokens."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import torch

from tttr.engine.inference.model import load_model
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence
from tttr.kernels.mode import kernel_mode

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


COLD_START_RUNS = 3

# Runs one command and prints its wall time, peak RSS (KiB) and exit status. A child's
# ru_maxrss includes the RSS of the process it was forked from (the kernel keeps the old
# memory's high-water mark across exec), so the command is started from this small launcher,
# not from the bench's own process, whose torch alone is ~220 MiB.
_LAUNCHER = """import os, sys, time
t = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(time.perf_counter() - t, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def measure_process(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one whole process running `cmd` (stdout discarded)."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _LAUNCHER, *cmd], capture_output=True, text=True)
    try:
        seconds, peak_kib, rc = done.stdout.split()
    except ValueError:
        rc = "?"
    if done.returncode or rc != "0":
        raise RuntimeError(f"cold start: {' '.join(cmd)} exited {rc}: {done.stderr.strip()[-500:]}")
    return float(seconds), int(peak_kib) / 1024


def generate_command(model_path=None) -> list[str]:
    cmd = [sys.executable, "-m", "tttr.app", "generate", "Hello", "--max-tokens", "1"]
    return cmd if model_path is None else [*cmd, "--model", str(model_path)]


def cold_start(model_path=None, runs: int = COLD_START_RUNS) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of whole `tttr generate "Hello" --max-tokens 1` processes:
    the median wall time of `runs`, and the largest peak resident set."""
    measured = [measure_process(generate_command(model_path)) for _ in range(runs)]
    return statistics.median(t for t, _ in measured), max(m for _, m in measured)


def run_bench(model_path=None, tokens: int = 100, kernels: str = "fast", reference: bool = True,
              rounds: int = 3, cold: bool = True) -> dict:
    """Each round measures ours (single, 8-way) and the reference back to back; the best round
    of each counts, so a burst of load from elsewhere on a shared machine hurts both sides alike.
    `cold`: first measure the cold start (whole processes, before this one loads anything)."""
    cold_s, peak_mib = cold_start(model_path) if cold else (None, None)
    model = load_model(model_path)
    tok = model.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]))

    def seq(seed=0, temperature=0.0, n=tokens):
        return Sequence(ids, SamplingParams(temperature=temperature, seed=seed), n, stop_token_ids=())

    ref_generate = None
    ref_status = "skipped" if not reference else "not installed"
    if reference and not model.path.is_file():
        ref_status = "skipped (the reference loads GGUF files only)"
    if reference and model.path.is_file():
        from tttr.engine.inference.reference import load_reference  # lazy: transformers is optional and slow to load

        loaded = load_reference(model.path)
        if loaded is not None:
            ref_status = "measured"
            ref_model = loaded[0]
            x = torch.tensor([ids])
            kw = dict(do_sample=False, pad_token_id=tok.eos_token_id)

            def ref_generate(n):
                with torch.inference_mode():
                    out = ref_model.generate(x, min_new_tokens=n, max_new_tokens=n, **kw)
                assert out.shape[1] - x.shape[1] == n

    singles, batch8s, refs = [], [], []
    with kernel_mode(kernels):
        engine = Engine(model)
        engine.generate([seq(n=8)])  # warm-up: first-call allocations, packing
        if ref_generate is not None:
            ref_generate(8)
        for _ in range(rounds):
            singles.append(tokens / _timed(lambda: engine.generate([seq()])))
            if ref_generate is not None:
                refs.append(tokens / _timed(lambda: ref_generate(tokens)))
            batch8s.append(8 * tokens / _timed(
                lambda: engine.generate([seq(seed=i, temperature=0.8) for i in range(8)])))
        engine.close()
    single, batch8, ref = max(singles), max(batch8s), max(refs, default=0.0)
    return {
        "model": model.model_id,
        "kernel_mode": kernels,
        "tokens": tokens,
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "single_stream_tok_s": round(single, 2),
        "batch8_tok_s": round(batch8, 2),
        "batch8_vs_single": round(batch8 / single, 2),
        "cold_start_s": None if cold_s is None else round(cold_s, 2),
        "peak_rss_mib": None if peak_mib is None else round(peak_mib),
        "reference": ref_status,
        "reference_tok_s": round(ref, 2) if ref_generate is not None else None,
        "ratio_vs_reference": round(single / ref, 2) if ref_generate is not None else None,
        # each round's figures, in order: how much the machine moved during the run
        "rounds_single_tok_s": [round(x, 2) for x in singles],
        "rounds_batch8_tok_s": [round(x, 2) for x in batch8s],
        "rounds_reference_tok_s": [round(x, 2) for x in refs] if ref_generate is not None else None,
    }


def format_report(r: dict) -> str:
    lines = [
        f"model {r['model']}  kernels {r['kernel_mode']}  {r['tokens']} tokens/sequence  "
        f"{r['threads']} threads  best of {r['rounds']} rounds",
        f"single-stream decode   {r['single_stream_tok_s']:8.2f} tok/s",
        f"8-way aggregate        {r['batch8_tok_s']:8.2f} tok/s   ({r['batch8_vs_single']:.2f}x single-stream; target >= 4x)",
    ]
    if r["reference_tok_s"] is None:
        why = "not installed: pip install transformers" if r["reference"] == "not installed" else r["reference"]
        lines.append(f"transformers reference   ({why})")
    else:
        lines.append(f"transformers reference {r['reference_tok_s']:8.2f} tok/s   "
                     f"(single-stream is {r['ratio_vs_reference']:.2f}x; target >= 1.3x)")
        per_round = " ".join(f"{a / b:.2f}x" for a, b in zip(r["rounds_single_tok_s"], r["rounds_reference_tok_s"]))
        lines.append(f"single / reference by round: {per_round}   (the machine's spread; the figures above are bests)")
    per_round = " ".join(f"{b / a:.2f}x" for a, b in zip(r["rounds_single_tok_s"], r["rounds_batch8_tok_s"]))
    lines.append(f"8-way / single by round: {per_round}")
    if r.get("cold_start_s") is not None:
        lines.append(f"cold start             {r['cold_start_s']:8.2f} s      peak RSS {r['peak_rss_mib']} MiB   "
                     f"(generate 1 token, whole process, median of {COLD_START_RUNS}; "
                     "target <= 0.81 s, <= 406 MiB: 1.5x/2x llama.cpp's)")
    return "\n".join(lines)
