"""`tttr bench engine`: decode speed measured side by side in one run.

- single stream: one greedy sequence, N new tokens, prompt prefill included, tokens / wall time;
- 8-way: eight sequences (same prompt, different seeds, temperature 0.8) submitted together;
  aggregate tokens / wall time (the engine prefills their common prompt once, as for any
  n-samples request, then decodes all eight in one pass per step);
- reference: transformers' `generate` (greedy, fp32) on the same GGUF and prompt ids;
- llama.cpp reference (when llama-cpp-python is installed): greedy on the same GGUF file and
  prompt ids, in a process of its own (llama_cpp_reference.py), its single stream beside ours
  and beside our 8-way aggregate; and greedy agreement: the token ids of both on three prompts;
- cold start: a whole `tttr generate "Hello" --max-tokens 1` process (interpreter, imports,
  model load, one token: the torch-free path, engine/inference/lite.py, on the default
  model; under the bench's kernel mode where that is an invariant one, else `invariant`; with
  the bench's threads, OMP_NUM_THREADS), its wall time (median of 3) and peak resident memory, after two unmeasured runs
  that leave what a first start makes once (compiled kernels, the GGUF header, rotary tables,
  packed blocks) in the cache, as any later start finds it; and the same for llama.cpp
  (`llama_cpp_reference cold`: import, load, one chat reply token).
Rounds alternate ours and the references; each figure is its best round.
Stop tokens are ignored so every sequence produces exactly N tokens."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch

from tttr.engine.errors import EngineError
from tttr.engine.inference import llama_cpp_reference as lcpp
from tttr.engine.inference.loader import resolve_model_path
from tttr.engine.inference.model import load_model
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence
from tttr.kernels.mode import is_invariant, kernel_mode

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
# greedy agreement with llama.cpp: each chat-templated as `tttr generate` does, AGREE_TOKENS each
AGREE_PROMPTS = (
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that reverses a string.",
)
AGREE_TOKENS = 30


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


COLD_START_RUNS = 3
WARM_RUNS = 2

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


def measure_process(cmd: list[str], env: dict | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one whole process running `cmd` (stdout discarded;
    `env`: its environment, else this one's)."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _LAUNCHER, *cmd], capture_output=True, text=True,
                          env=env)
    try:
        seconds, peak_kib, rc = done.stdout.split()
    except ValueError:
        rc = "?"
    last = (done.stderr.strip().splitlines() or [""])[-1]
    if rc == "2" and last.startswith("tttr: error: "):  # the measured command refused the user's input (the model)
        raise EngineError(f"cold start: {last.removeprefix('tttr: error: ')}")
    if done.returncode or rc != "0":
        raise RuntimeError(f"cold start: {' '.join(cmd)} exited {rc}: {done.stderr.strip()[-500:]}")
    return float(seconds), int(peak_kib) / 1024


def generate_command(model_path=None, kernels: str = "invariant") -> list[str]:
    cmd = [sys.executable, "-m", "tttr.app", "generate", "Hello", "--max-tokens", "1", "--kernels", kernels]
    return cmd if model_path is None else [*cmd, "--model", str(model_path)]


def _summary(measured: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(t for t, _ in measured), max(m for _, m in measured)


def cold_start(model_path=None, runs: int = COLD_START_RUNS, llama_cpp_path=None, kernels: str = "invariant",
               threads: int | None = None) -> tuple:
    """(seconds, peak RSS in MiB) of whole `tttr generate "Hello" --max-tokens 1 --kernels
    KERNELS` processes: the median wall time of `runs`, and the largest peak resident set; with
    `llama_cpp_path`, the same of llama.cpp's cold-start process on that file after them, the two
    alternating. Each process gets `threads` threads (default: torch's count here)."""
    threads = threads or torch.get_num_threads()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}  # the compiled kernels' and torch's count
    cmd = generate_command(model_path, kernels)
    ours, theirs = [], []
    for _ in range(WARM_RUNS):  # a first start fills the caches: torch once, then the blocks packed once
        measure_process(cmd, env)
    for _ in range(runs):
        ours.append(measure_process(cmd, env))
        if llama_cpp_path is not None:
            # the bench's threads: llama.cpp's threads wait for each other at every operation, and
            # with as many as there are cores, a busy machine stalls them (3 s here, 0.9 s on one)
            try:
                theirs.append(measure_process(lcpp.cold_command(llama_cpp_path, threads)))
            except RuntimeError:  # the reference's own start says why (run_bench's llama_cpp status)
                llama_cpp_path, theirs = None, []
    return (*_summary(ours), *(_summary(theirs) if theirs else (None, None)))


def llama_cpp_status(model_path) -> str:
    """'measured' when llama.cpp can run on this model, else why not."""
    if not lcpp.available():
        return "not installed"
    if model_path is None or not model_path.is_file():
        return "skipped (llama.cpp loads GGUF files only)"
    return "measured"


def agreement(a: list[int], b: list[int]) -> dict:
    first = lcpp.first_difference(a, b)
    return {"identical": first is None, "first_difference": first}


def run_bench(model_path=None, tokens: int = 100, kernels: str = "fast", reference: bool = True,
              rounds: int = 3, cold: bool = True) -> dict:
    """Each round measures ours (single, 8-way) and the reference back to back; the best round
    of each counts, so a burst of load from elsewhere on a shared machine hurts both sides alike.
    `cold`: first measure the cold start (whole processes, before this one loads anything)."""
    gguf = resolve_model_path(model_path)
    llama_status = llama_cpp_status(gguf)
    llama_file = gguf if llama_status == "measured" else None
    cold_kernels = kernels if is_invariant(kernels) else "invariant"  # the torch-free path runs those
    cold_s, peak_mib, lcold_s, lpeak_mib = (cold_start(model_path, llama_cpp_path=llama_file, kernels=cold_kernels)
                                            if cold else (None,) * 4)
    model = load_model(model_path)
    tok = model.tokenizer

    def chat_ids(text):
        return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))

    ids = chat_ids(PROMPT)
    agree_ids = [chat_ids(p) for p in AGREE_PROMPTS]

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

    llama = None
    if llama_file is not None:  # a process of its own: loaded beside torch, llama.cpp has died
        longest = max(len(ids), *(len(x) for x in agree_ids))
        try:
            llama = lcpp.LlamaCppProcess(llama_file, lcpp.context_size(longest, max(tokens, AGREE_TOKENS)),
                                         threads=torch.get_num_threads())
            llama.run(ids, 8)  # warm-up; a build this CPU cannot run dies here (shared/NOTES.md)
        except RuntimeError as exc:
            if llama is not None:
                llama.close()
            llama, llama_status = None, f"failed: {str(exc)[-300:]}"
    singles, batch8s, refs, llamas = [], [], [], []
    ours_ids = theirs_ids = None
    agreements = []
    try:
        with kernel_mode(kernels):
            engine = Engine(model)
            engine.generate([seq(n=8)])  # warm-up: first-call allocations, packing
            if ref_generate is not None:
                ref_generate(8)
            for _ in range(rounds):
                s = seq()
                singles.append(tokens / _timed(lambda: engine.generate([s])))
                ours_ids = s.output_ids
                if ref_generate is not None:
                    refs.append(tokens / _timed(lambda: ref_generate(tokens)))
                if llama is not None:
                    theirs_ids, seconds = llama.run(ids, tokens)
                    llamas.append(tokens / seconds)
                batch8s.append(8 * tokens / _timed(
                    lambda: engine.generate([seq(seed=i, temperature=0.8) for i in range(8)])))
            if llama is not None:
                for text, prompt_ids in zip(AGREE_PROMPTS, agree_ids):
                    s = Sequence(prompt_ids, SamplingParams(temperature=0.0), AGREE_TOKENS, stop_token_ids=())
                    engine.generate([s])
                    theirs, _ = llama.run(prompt_ids, AGREE_TOKENS)
                    agreements.append({"prompt": text, **agreement(s.output_ids, theirs),
                                       "tttr": tok.decode(s.output_ids), "llama_cpp": tok.decode(theirs)})
            engine.close()
    finally:
        llama_peak = llama.close() if llama is not None else None
    single, batch8, ref = max(singles), max(batch8s), max(refs, default=0.0)
    lbest = max(llamas, default=0.0)
    measured = llama is not None
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
        "llama_cpp": llama_status,
        "llama_cpp_tok_s": round(lbest, 2) if measured else None,
        "ratio_vs_llama_cpp": round(single / lbest, 2) if measured else None,
        "batch8_vs_llama_cpp": round(batch8 / lbest, 2) if measured else None,
        "rounds_llama_cpp_tok_s": [round(x, 2) for x in llamas] if measured else None,
        "llama_cpp_load_s": llama.load_s if measured else None,
        "llama_cpp_peak_rss_mib": llama_peak,  # its bench process: loaded, after every round
        "llama_cpp_cold_start_s": None if lcold_s is None else round(lcold_s, 2),
        "llama_cpp_cold_peak_rss_mib": None if lpeak_mib is None else round(lpeak_mib),
        # the bench prompt's greedy ids (last round) and AGREE_TOKENS on each of AGREE_PROMPTS
        "greedy_agreement": ({"bench_prompt": agreement(ours_ids, theirs_ids), "prompts": agreements}
                             if measured else None),
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
    lines += _llama_cpp_lines(r)
    per_round = " ".join(f"{b / a:.2f}x" for a, b in zip(r["rounds_single_tok_s"], r["rounds_batch8_tok_s"]))
    lines.append(f"8-way / single by round: {per_round}")
    lines += _agreement_lines(r)
    if r.get("cold_start_s") is not None:
        lines.append(f"cold start             {r['cold_start_s']:8.2f} s      peak RSS {r['peak_rss_mib']} MiB   "
                     f"(generate 1 token, whole process, median of {COLD_START_RUNS}; "
                     "target <= 0.81 s, <= 406 MiB: 1.5x/2x llama.cpp's)")
    if r.get("llama_cpp_cold_start_s") is not None:
        lines.append(f"llama.cpp cold start   {r['llama_cpp_cold_start_s']:8.2f} s      "
                     f"peak RSS {r['llama_cpp_cold_peak_rss_mib']} MiB   (same, llama-cpp-python; TTTR takes "
                     f"{r['cold_start_s'] / r['llama_cpp_cold_start_s']:.2f}x its time, "
                     f"{r['peak_rss_mib'] / r['llama_cpp_cold_peak_rss_mib']:.2f}x its memory; target <= 1.5x, 2x)")
    return "\n".join(lines)


def _llama_cpp_lines(r: dict) -> list[str]:
    status = r.get("llama_cpp", "not installed")
    if r.get("llama_cpp_tok_s") is None:
        why = f"not measured: llama-cpp-python is not installed; {lcpp.BUILD_HINT}" if status == "not installed" else status
        return [f"llama.cpp reference      ({why})"]
    per_round = " ".join(f"{a / b:.2f}x" for a, b in zip(r["rounds_single_tok_s"], r["rounds_llama_cpp_tok_s"]))
    return [f"llama.cpp reference    {r['llama_cpp_tok_s']:8.2f} tok/s   (single-stream is {r['ratio_vs_llama_cpp']:.2f}x, "
            f"target >= 0.8x; 8-way aggregate is {r['batch8_vs_llama_cpp']:.2f}x, target >= 2x)",
            f"single / llama.cpp by round: {per_round}"]


def _agreement_lines(r: dict) -> list[str]:
    agree = r.get("greedy_agreement")
    if not agree:
        return []
    prompts = agree["prompts"]
    same = sum(p["identical"] for p in prompts)
    firsts = ", ".join("-" if p["identical"] else str(p["first_difference"]) for p in prompts)
    bench = agree["bench_prompt"]
    bench_text = ("identical" if bench["identical"] else f"first difference at token {bench['first_difference']}")
    return [f"greedy ids vs llama.cpp: {same}/{len(prompts)} prompts identical over {AGREE_TOKENS} tokens "
            f"(first difference at: {firsts}); bench prompt over {r['tokens']}: {bench_text}"]
