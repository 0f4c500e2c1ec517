"""`tttr bench gpu`: the GPU path, as one script for a CUDA machine.

1. Kernels: the Triton invariant products and attention (kernels/triton_kernels.py, through
   kernels/invariant.py as the engine calls them) against stock torch (cuBLAS, SDPA) at the
   decode (1 and 8 rows, one query per sequence over `ctx` keys) and prefill (`prefill` rows)
   shapes of the default model and `llama-1b`; per phase, a forward pass's kernel time (each
   layer's q/k/v, o, gate/up and down products and attention, times the layers, and the output
   projection for the rows that produce logits) stock over invariant: `invariant_over_cublas`
   (1.0: as fast as cuBLAS; target >= 0.8).
2. Replay: `runs` generations of the default model on the GPU under the invariant kernels, each
   co-batched with 0-15 random prompts at a random row (determinism.generations), greedy and
   sampled: one digest sequence each is the replay contract on that device.
3. Decisions: the bench prompts (bench.AGREE_PROMPTS) greedy on the CPU and on the GPU; bits
   differ between devices, the greedy ids should not (what a replay on another device needs).

Without CUDA (`--cpu`, or no GPU) the same script runs on the CPU: kernels under the Triton
interpreter at a tiny shape (not a speed figure), the engine's device copy on the CPU (its
plumbing, not the Triton path), so it is known to run before it meets a GPU."""

from __future__ import annotations

import os
import time

import torch

from tttr.engine.bench import determinism, engine as bench
from tttr.engine.inference.device import to_device
from tttr.engine.inference.model import load_model
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence
from tttr.engine.bench import gpu_kernels as kernel_bench
from tttr.kernels.mode import kernel_mode


def replay(model, runs: int, tokens: int, progress=None) -> dict:
    """determinism.generations under the invariant kernels only, on the model's device."""
    cfg = determinism.Config(runs=runs, tokens=tokens)
    got = determinism.generations(model, cfg, progress, modes=("invariant",))
    return {s: got[s]["invariant"] for s in got}


def decisions(cpu_model, gpu_model, tokens: int = bench.AGREE_TOKENS) -> list[dict]:
    tok = cpu_model.tokenizer
    out = []
    for text in bench.AGREE_PROMPTS:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
        got = []
        for m in (cpu_model, gpu_model):
            s = Sequence(ids, SamplingParams(temperature=0.0), tokens, stop_token_ids=())
            with kernel_mode("invariant"), Engine(m) as engine:
                engine.generate([s])
            got.append(s.output_ids)
        out.append({"prompt": text, **bench.agreement(*got)})
    return out


def run(cpu: bool = False, runs: int = 100, tokens: int = 24, progress=None) -> dict:
    say = progress or (lambda _: None)
    cuda = torch.cuda.is_available() and not cpu
    device = torch.device("cuda" if cuda else "cpu")
    t0 = time.perf_counter()
    report: dict = {"device": torch.cuda.get_device_name(device) if cuda else "cpu (Triton interpreter; plumbing only)",
                    "torch": torch.__version__, "triton": __import__("triton").__version__, "cuda": cuda}
    dtypes = (torch.float32, torch.bfloat16) if cuda else (torch.float32,)
    report["kernels"] = {}
    for dtype in dtypes:
        say(f"kernels, {dtype}")
        report["kernels"][str(dtype).removeprefix("torch.")] = (
            kernel_bench.kernels(device, dtype, kernel_bench.SHAPES) if cuda
            else kernel_bench.kernels(device, dtype, kernel_bench.TINY, decode_rows=(1, 2), prefill=40, ctx=64))
    say("the default model on the device")
    cpu_model = load_model()
    dev_model = to_device(cpu_model, device)
    report["replay"] = replay(dev_model, runs, tokens, (lambda d, t, m: say(f"{d}/{t} {m}")) if progress else None)
    report["replay"]["runs"], report["replay"]["tokens"] = runs, tokens
    say("greedy decisions, CPU and device")
    report["decisions"] = decisions(cpu_model, dev_model)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report


def lines(r: dict) -> list[str]:
    out = [f"bench gpu: {r['device']} · torch {r['torch']} · triton {r['triton']}"]
    if not r["cuda"]:
        out.append("NO CUDA: kernels under the Triton interpreter at a tiny shape and the engine on the CPU; "
                   "the figures show the script runs, not the GPU")
    for dtype, shapes in r["kernels"].items():
        for name, phases in shapes.items():
            cells = "  ".join(f"{p} {v['invariant_over_cublas']:.2f}x" for p, v in phases.items())
            out.append(f"[{dtype}] {name:<13} invariant_over_cublas (stock time / invariant, a forward pass; "
                       f"target >= 0.8): {cells}")
    rp = r["replay"]
    for s in ("greedy", "sampled"):
        v = rp[s]
        out.append(f"replay {s:<8} {rp['runs']} co-batched generations x {rp['tokens']} tokens: "
                   f"{v['unique_digest_sequences']} digest sequence(s), {v['unique_completions']} completion(s), "
                   f"{v['batch_layouts']} batch layouts (target: 1 and 1)")
    same = sum(d["identical"] for d in r["decisions"])
    firsts = ", ".join("-" if d["identical"] else str(d["first_difference"]) for d in r["decisions"])
    out.append(f"greedy decisions CPU vs device: {same}/{len(r['decisions'])} prompts identical over "
               f"{bench.AGREE_TOKENS} tokens (first difference at: {firsts})")
    out.append(f"({r['seconds']} s)")
    return out


def cuda_available() -> bool:
    return torch.cuda.is_available()


def interpreter_env() -> dict | None:
    """The environment a child needs to run the Triton kernels on the CPU (the interpreter is
    chosen when triton is imported), or None when this process already has it."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return {**os.environ, "TRITON_INTERPRET": "1"}
