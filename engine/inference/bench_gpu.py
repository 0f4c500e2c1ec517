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
import torch.nn.functional as F

from tttr.engine.inference import bench, determinism
from tttr.engine.inference.device import to_device
from tttr.engine.inference.model import load_model
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence
from tttr.kernels.mode import kernel_mode


class KernelShape:
    def __init__(self, layers, d, heads, kv_heads, head_dim, ffn, vocab):
        self.layers, self.d, self.heads, self.kv_heads, self.head_dim = layers, d, heads, kv_heads, head_dim
        self.ffn, self.vocab = ffn, vocab

    def products(self) -> dict[str, tuple[int, int]]:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"qkv": (q + 2 * kv, self.d), "o": (self.d, q), "gate_up": (2 * self.ffn, self.d),
                "down": (self.d, self.ffn)}


SHAPES = {"smollm2-135m": KernelShape(30, 576, 9, 3, 64, 1536, 49152),
          "llama-1b": KernelShape(16, 2048, 32, 8, 64, 8192, 49152)}
TINY = {"tiny": KernelShape(2, 64, 4, 2, 16, 96, 256)}


def _timer(device: torch.device):
    if device.type == "cuda":
        from triton.testing import do_bench

        def cuda(fn) -> float:
            return do_bench(fn, warmup=10, rep=50) * 1e3  # ms -> us

        return cuda

    def cpu(fn) -> float:  # the interpreter: one call, a figure that only shows the script runs
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6

    return cpu


def _sdpa(q, k, v, pos, scale):
    """Stock attention over one sequence's keys 0..max(pos): q [T, H, D], k/v [S, KVH, D]."""
    h, kvh = q.shape[1], k.shape[1]
    n = int(pos.max()) + 1
    mask = torch.arange(n, device=q.device)[None, :] <= pos[:, None]
    return F.scaled_dot_product_attention(q.transpose(0, 1), k[:n].transpose(0, 1), v[:n].transpose(0, 1),
                                          attn_mask=mask, scale=scale, enable_gqa=h != kvh).transpose(0, 1)


def _sdpa_decode(q, k, v, pos, scale):
    """Stock attention for N one-query sequences at once: q [N, H, D], k/v [N, S, KVH, D]."""
    s = int(pos.max()) + 1
    mask = (torch.arange(s, device=q.device)[None, :] <= pos[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(q[:, :, None, :], k[:, :s].transpose(1, 2), v[:, :s].transpose(1, 2),
                                          attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[2])[:, :, 0]


def kernels(device: torch.device, dtype: torch.dtype, shapes: dict, decode_rows=(1, 8), prefill: int = 512,
            ctx: int = 1024) -> dict:
    """Per model shape and phase: microseconds of each kernel, invariant and stock, and the
    forward pass's invariant_over_cublas."""
    from tttr.kernels import invariant
    from tttr.kernels import triton_kernels as tk

    if device.type == "cuda":  # as the engine calls them: invariant.py routes CUDA tensors to Triton
        linear, attention, decode = invariant.linear, invariant.attention, invariant.decode_attention
    else:  # CPU tensors would take the CPU kernels: call the Triton ones (interpreter) as invariant.py does
        linear, attention = tk.linear, tk.attention

        def decode(q, k, v, pos, scale):
            return torch.cat([tk.attention(q[i:i + 1], k[i], v[i], pos[i:i + 1], scale) for i in range(q.shape[0])])
    timer = _timer(device)
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    out: dict = {}
    for name, s in shapes.items():
        weights = {k: rnd(n, kk) / kk**0.5 for k, (n, kk) in s.products().items()}
        head = rnd(s.vocab, s.d) / s.d**0.5
        scale = s.head_dim**-0.5
        phases = {f"decode_{m}": m for m in decode_rows}
        phases[f"prefill_{prefill}"] = prefill
        res = {}
        for phase, rows in phases.items():
            ops_us: dict[str, dict[str, float]] = {}
            for key, w in weights.items():
                x = rnd(rows, w.shape[1])
                ops_us[key] = {"invariant": timer(lambda: linear(x, w)), "stock": timer(lambda: F.linear(x, w))}
            if phase.startswith("decode"):
                n_ctx = ctx
                q, k, v = rnd(rows, s.heads, s.head_dim), rnd(rows, n_ctx, s.kv_heads, s.head_dim), rnd(
                    rows, n_ctx, s.kv_heads, s.head_dim)
                pos = torch.full((rows,), n_ctx - 1, device=device)
                ops_us["attention"] = {"invariant": timer(lambda: decode(q, k, v, pos, scale)),
                                       "stock": timer(lambda: _sdpa_decode(q, k, v, pos, scale))}
                head_rows = rows
            else:
                q, k, v = rnd(rows, s.heads, s.head_dim), rnd(rows, s.kv_heads, s.head_dim), rnd(
                    rows, s.kv_heads, s.head_dim)
                pos = torch.arange(rows, device=device)
                ops_us["attention"] = {"invariant": timer(lambda: attention(q, k, v, pos, scale)),
                                       "stock": timer(lambda: _sdpa(q, k, v, pos, scale))}
                head_rows = 1
            xh = rnd(head_rows, s.d)
            ops_us["head"] = {"invariant": timer(lambda: linear(xh, head)), "stock": timer(lambda: F.linear(xh, head))}
            totals = {side: s.layers * sum(v[side] for k, v in ops_us.items() if k != "head") + ops_us["head"][side]
                      for side in ("invariant", "stock")}
            res[phase] = {"us": {k: {side: round(t, 1) for side, t in v.items()} for k, v in ops_us.items()},
                          "forward_us": {side: round(t, 1) for side, t in totals.items()},
                          "invariant_over_cublas": round(totals["stock"] / totals["invariant"], 3)}
        out[name] = res
    return out


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
            kernels(device, dtype, SHAPES) if cuda else kernels(device, dtype, TINY, decode_rows=(1, 2), prefill=40,
                                                                ctx=64))
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
