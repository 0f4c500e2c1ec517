"""llama.cpp (through llama-cpp-python) as a second reference for `tttr bench engine`, and its
quantizer to make K-quant copies of a model.

llama-cpp-python is an optional, test-only dependency (`pip install -e ".[llama-cpp]"`; it builds
llama.cpp from source, see `BUILD_HINT`). It always runs in a process of its own: loaded in the
same process as torch it has died, and a process of its own is what a user compares against.
Nothing here imports torch or llama_cpp at module level; the parent side (`available`,
`LlamaCppProcess`) only starts and talks to the child.

    python -m tttr.engine.inference.llama_cpp_reference generate FILE N (--ids 1,2,3 | --prompt TEXT) [--rounds R]
    python -m tttr.engine.inference.llama_cpp_reference quantize IN OUT [--type Q4_K_M]
    python -m tttr.engine.inference.llama_cpp_reference cold FILE    # the cold-start process
    python -m tttr.engine.inference.llama_cpp_reference serve FILE   # JSON lines on stdin/stdout

`generate` prints one JSON object: load_s, tok_s (best round), rounds_tok_s, ids (the N greedy
token ids), peak_rss_mib. Every run is greedy (llama.cpp's own greedy sampler), ignores
end-of-sequence and produces exactly N tokens; tokens/s counts the prompt's prefill, as
`tttr bench engine` does for TTTR. `--ids` gives the prompt as token ids (the bench passes
TTTR's chat-templated ids, so both sides see the same tokens); `--prompt` goes through the
model's own chat template."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

MODULE = "tttr.engine.inference.llama_cpp_reference"
BUILD_HINT = ('CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
              "pip install llama-cpp-python")


def available() -> bool:
    """Whether llama_cpp can be imported (found without importing it)."""
    return importlib.util.find_spec("llama_cpp") is not None


def context_size(prompt_tokens: int, new_tokens: int) -> int:
    return max(512, prompt_tokens + new_tokens + 16)


# ---- the child side: these import llama_cpp -------------------------------------------------

def _peak_rss_mib() -> float:
    """This process's own peak resident set: VmHWM, not ru_maxrss, which keeps the high-water
    mark of the process it was forked from (the bench, with torch and transformers) across exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _load(path: str, n_ctx: int = 512, threads: int | None = None):
    from llama_cpp import Llama

    threads = threads or os.cpu_count() or 1
    return Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)


def _greedy(llm, ids: list[int], n: int) -> tuple[list[int], float, float, float]:
    """(n greedy token ids after `ids`, seconds, seconds to the first token, this process's CPU
    seconds from the first token to the last): from an empty cache, prefill included."""
    llm.reset()  # no prefix reuse: every run prefills the whole prompt
    out: list[int] = []
    t = time.perf_counter()
    first = cpu = 0.0
    if n:
        for token in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0):
            out.append(int(token))
            if len(out) == 1:
                first, cpu = time.perf_counter() - t, time.process_time()
            if len(out) == n:
                break
    return out, time.perf_counter() - t, first, (time.process_time() - cpu if n else 0.0)


def _cmd_generate(a) -> int:
    t = time.perf_counter()
    if a.ids is not None:
        ids = [int(x) for x in a.ids.split(",") if x.strip()]
        llm = _load(a.file, context_size(len(ids), a.n), a.threads)
    else:
        llm = _load(a.file, 2048, a.threads)
        ids = _chat_ids(llm, a.prompt)
    load_s = time.perf_counter() - t
    _greedy(llm, ids, min(a.n, 8))  # warm-up, as the bench warms TTTR up
    rounds, out = [], []
    for _ in range(a.rounds):
        out, seconds, _, _ = _greedy(llm, ids, a.n)
        rounds.append(a.n / seconds if a.n else 0.0)
    print(json.dumps({"load_s": round(load_s, 3), "tok_s": round(max(rounds, default=0.0), 2),
                      "rounds_tok_s": [round(x, 2) for x in rounds], "prompt_ids": ids, "ids": out,
                      "threads": llm.n_threads, "peak_rss_mib": round(_peak_rss_mib())}))
    return 0


def _chat_ids(llm, prompt: str) -> list[int]:
    """The prompt through the model's own chat template (as `tttr generate PROMPT` does)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    meta = llm.metadata
    eos = llm.detokenize([llm.token_eos()]).decode("utf-8", "replace")
    bos = llm.detokenize([llm.token_bos()]).decode("utf-8", "replace")
    formatter = Jinja2ChatFormatter(meta["tokenizer.chat_template"], eos_token=eos, bos_token=bos)
    text = formatter(messages=[{"role": "user", "content": prompt}]).prompt
    return llm.tokenize(text.encode(), add_bos=False, special=True)


def _cmd_cold(a) -> int:
    """What `tttr generate "Hello" --max-tokens 1` does, with llama.cpp: load, one chat reply token."""
    llm = _load(a.file, threads=a.threads)
    out = llm.create_chat_completion(messages=[{"role": "user", "content": a.prompt}], max_tokens=1, temperature=0.0)
    print(out["choices"][0]["message"]["content"])
    return 0


def _cmd_serve(a) -> int:
    """First line out: {"load_s"}. Then for each line in: {"ids": [...], "n": N} -> {"ids", "seconds",
    "first_s", "decode_cpu_s"} (first_s: to the first token; decode_cpu_s: CPU time after it);
    an empty line (or end of input) -> {"peak_rss_mib"} and exit."""
    t = time.perf_counter()
    llm = _load(a.file, a.ctx, a.threads)
    print(json.dumps({"load_s": round(time.perf_counter() - t, 3), "threads": llm.n_threads}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        req = json.loads(line)
        out, seconds, first, cpu = _greedy(llm, req["ids"], req["n"])
        print(json.dumps({"ids": out, "seconds": seconds, "first_s": first, "decode_cpu_s": cpu}), flush=True)
    print(json.dumps({"peak_rss_mib": round(_peak_rss_mib())}), flush=True)
    return 0


FTYPES = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0")


def quantize(src: str | Path, dst: str | Path, ftype: str = "Q4_K_M") -> None:
    """Re-quantize a GGUF file with llama.cpp's quantizer (requantizing an already quantized file
    is allowed: the weights go through its dequantization first)."""
    import llama_cpp

    if ftype not in FTYPES:
        raise ValueError(f"unknown type {ftype!r}: use one of {', '.join(FTYPES)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {dst} ({ftype}) returned {rc}")


def tensor_types(path: str | Path) -> dict[str, int]:
    """How many tensors of each GGML type a GGUF file holds (the gguf package's reader)."""
    from gguf import GGUFReader

    return dict(Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors).most_common())


def _cmd_quantize(a) -> int:
    # llama.cpp logs every tensor (and each fallback type) on stderr: kept, and shown on failure
    with tempfile.TemporaryFile() as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            quantize(a.src, a.dst, a.type)
        except Exception:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-3000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    print(json.dumps({"file": str(a.dst), "type": a.type, "bytes": Path(a.dst).stat().st_size,
                      "tensor_types": tensor_types(a.dst)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="greedy N tokens; prints JSON (tokens/s, ids, load time, peak RSS)")
    g.add_argument("file")
    g.add_argument("n", type=int)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="prompt token ids, comma-separated")
    src.add_argument("--prompt", help="prompt text, through the model's chat template")
    g.add_argument("--rounds", type=int, default=1)
    s = sub.add_parser("serve", help="JSON lines: a request {ids, n} per line")
    s.add_argument("file")
    s.add_argument("--ctx", type=int, default=1024)
    c = sub.add_parser("cold", help="load and answer one chat token (the cold-start process)")
    c.add_argument("file")
    c.add_argument("--prompt", default="Hello")
    for q in (g, s, c):
        q.add_argument("--threads", type=int, default=None, help="default: the core count")
    qz = sub.add_parser("quantize", help="re-quantize a GGUF file with llama.cpp's quantizer")
    qz.add_argument("src")
    qz.add_argument("dst")
    qz.add_argument("--type", default="Q4_K_M", choices=FTYPES)
    a = p.parse_args(argv)
    if not available():
        print(f"llama_cpp is not installed: {BUILD_HINT}", file=sys.stderr)
        return 2
    if getattr(a, "n", 0) < 0 or getattr(a, "rounds", 1) < 1:
        p.error("N must be >= 0 and --rounds >= 1")
    return {"generate": _cmd_generate, "serve": _cmd_serve, "cold": _cmd_cold, "quantize": _cmd_quantize}[a.cmd](a)


# ---- the parent side ------------------------------------------------------------------------

class LlamaCppProcess:
    """llama.cpp loaded in a child process (`serve`), so the bench can alternate its rounds with
    TTTR's. `run(ids, n)` -> (ids, seconds); `close()` -> the child's peak RSS in MiB."""

    def __init__(self, model_path: str | Path, n_ctx: int = 1024, threads: int | None = None):
        cmd = [sys.executable, "-m", MODULE, "serve", str(model_path), "--ctx", str(n_ctx)]
        if threads:
            cmd += ["--threads", str(threads)]
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                      text=True, bufsize=1)
        first = self._read()
        self.load_s, self.threads = first["load_s"], first["threads"]
        self.peak_rss_mib: float | None = None

    def _read(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            rc = self._proc.wait()
            self._stderr.seek(0)
            raise RuntimeError(f"llama.cpp reference exited {rc}: {self._stderr.read().strip()[-500:]}")
        return json.loads(line)

    def run(self, ids: list[int], n: int) -> tuple[list[int], float]:
        got = self.timed(ids, n)
        return got["ids"], got["seconds"]

    def timed(self, ids: list[int], n: int) -> dict:
        """{"ids", "seconds", "first_s"}: the n greedy ids, the whole run's seconds and the
        seconds to the first token (the prompt's prefill and one step)."""
        try:
            self._proc.stdin.write(json.dumps({"ids": list(ids), "n": n}) + "\n")
        except OSError:  # it died: _read says how
            pass
        return self._read()

    def close(self) -> float | None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write("\n")
                self._proc.stdin.flush()
                self.peak_rss_mib = self._read()["peak_rss_mib"]
            except (OSError, RuntimeError, ValueError):
                self._proc.kill()
            self._proc.wait()
        self._stderr.close()
        return self.peak_rss_mib

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def cold_command(model_path: str | Path, threads: int | None = None) -> list[str]:
    return [sys.executable, "-m", MODULE, "cold", str(model_path), *(["--threads", str(threads)] if threads else [])]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two id lists differ (a length difference counts), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


if __name__ == "__main__":
    sys.exit(main())
