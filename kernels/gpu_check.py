"""`python -m kernels.gpu_check`: the GPU half of the batch-invariance proof, in one run.

On an NVIDIA GPU, for bf16 and fp32: are the Triton kernels bit-for-bit invariant over
batch sizes 1..256 (and stock cuBLAS, for contrast), is attention identical for one
prefill, chunked prefill and token-by-token decode, and how fast are the Triton kernels
against stock cuBLAS / SDPA at the default model's decode and prefill shapes. Needs only
torch and triton, no network; finishes in well under 5 minutes on an H200.

Without a GPU (or with --tiny) it runs the same report on the CPU under the Triton
interpreter at tiny shapes and in fp32 only (the interpreter has no bf16), so the script
itself is known to work before it meets a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from tttr.kernels import invariant as inv
from tttr.kernels import triton_kernels as tk

FULL = {
    "linears": [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)],
    "batches": [1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 32, 33, 64, 100, 128, 255, 256],
    "norm_dims": [576, 49152],
    "attn": {"heads": 9, "kv_heads": 3, "head_dim": 64, "prompt": 600, "chunk": 64, "decode_steps": 24},
    "time_rows": {"decode": [1, 8], "prefill": [512]},
    "attn_ctx": 1024,
}
TINY = {
    "linears": [(96, 80), (64, 48)],
    "batches": [1, 2, 3, 5, 8, 31, 32, 33, 40],
    "norm_dims": [100, 1100],
    "attn": {"heads": 4, "kv_heads": 2, "head_dim": 16, "prompt": 40, "chunk": 13, "decode_steps": 4},
    "time_rows": {"decode": [1], "prefill": [40]},
    "attn_ctx": 40,
}


def _need_interpreter_child(argv: list[str]) -> int | None:
    """No GPU: the interpreter flag must be set before triton is imported. If triton is
    already loaded without it, run this check again in a fresh interpreter."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
        return None
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.call([sys.executable, "-m", "tttr.kernels.gpu_check", *argv], env=env)


def _timer(device: torch.device):
    if device.type == "cuda":
        from triton.testing import do_bench  # noqa: PLC0415 - on a GPU only

        return lambda fn: do_bench(fn, warmup=10, rep=40) * 1e3  # ms -> us

    def cpu(fn) -> float:  # the interpreter: one call, a figure that only shows the script runs
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6

    return cpu


def _invariance_rows(op, x: torch.Tensor, batches: list[int]) -> list[int]:
    """Batch sizes whose rows differ from the same rows in the largest call."""
    full = op(x)
    bad = [b for b in batches if not torch.equal(op(x[:b]), full[:b])]
    if x.shape[0] > 3 and not torch.equal(op(x[2:3]), full[2:3]):
        bad.append(-3)  # row 2 alone (a row away from the start of the call)
    return bad


def check(tiny: bool, device: torch.device) -> dict:
    shapes = TINY if tiny else FULL
    if tiny:
        tk.KV_BLOCK, tk.KV_SPLIT = 16, 16  # several splits within a tiny prompt
    dtypes = [torch.bfloat16, torch.float32] if device.type == "cuda" else [torch.float32]
    timer = _timer(device)
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, dtype):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    report: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "tiny": tiny,
        "kv_split": tk.KV_SPLIT,
        "dtypes": {},
    }
    batches = shapes["batches"]
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        res: dict = {"linear": {}, "rows": {}, "attention": {}, "timings": {}}
        report["dtypes"][name] = res
        top = max(batches)
        for n, k in shapes["linears"]:
            w = rnd(n, k, dtype=dtype) / k**0.5
            x = rnd(top, k, dtype=dtype)
            entry = {"triton_bad_batches": _invariance_rows(lambda t: tk.linear(t, w), x, batches),
                     "stock_bad_batches": _invariance_rows(lambda t: F.linear(t, w), x, batches),
                     "max_abs_err_vs_stock": float((tk.linear(x, w).float() - F.linear(x, w).float()).abs().max())}
            for phase, rows in shapes["time_rows"].items():
                for m in rows:
                    xm = rnd(m, k, dtype=dtype)
                    entry[f"us_{phase}_{m}"] = {"triton": timer(lambda: tk.linear(xm, w)),
                                                "stock": timer(lambda: F.linear(xm, w))}
            res["linear"][f"{n}x{k}"] = entry
        for d in shapes["norm_dims"]:
            x = rnd(top, d, dtype=dtype) * 3
            wn = rnd(d, dtype=dtype)
            res["rows"][f"rms_norm {d}"] = {
                "triton_bad_batches": _invariance_rows(lambda t: tk.rms_norm(t, wn, 1e-5), x, batches),
                "max_abs_err": float((tk.rms_norm(x, wn, 1e-5).float() - inv.rms_norm(x.float().cpu(), wn.float().cpu(), 1e-5).to(device)).abs().max()),
            }
            res["rows"][f"log_softmax {d}"] = {
                "triton_bad_batches": _invariance_rows(tk.log_softmax, x, batches),
                "stock_bad_batches": _invariance_rows(lambda t: torch.log_softmax(t, -1), x, batches),
                "max_abs_err": float((tk.log_softmax(x).float() - torch.log_softmax(x.float(), -1)).abs().max()),
            }
        res["attention"] = _attention(tk, shapes, dtype, device, rnd, timer)
    return report


def _attention(tk, shapes, dtype, device, rnd, timer) -> dict:
    a = shapes["attn"]
    h, kvh, d, s = a["heads"], a["kv_heads"], a["head_dim"], a["prompt"]
    q, k, v = rnd(s, h, d, dtype=dtype), rnd(s, kvh, d, dtype=dtype), rnd(s, kvh, d, dtype=dtype)
    pos = torch.arange(s, device=device)
    scale = d**-0.5
    full = tk.attention(q, k, v, pos, scale)
    c = a["chunk"]
    chunked = torch.cat([tk.attention(q[i:i + c], k[:i + c], v[:i + c], pos[i:i + c], scale) for i in range(0, s, c)])
    kc, vc = torch.zeros_like(k), torch.zeros_like(v)
    first = s - a["decode_steps"]
    kc[:first], vc[:first] = k[:first], v[:first]
    decode_same = True
    for t in range(first, s):
        out = tk.decode_attention(q[t:t + 1], kc, vc, k[t:t + 1], v[t:t + 1], pos[t:t + 1], scale)
        decode_same &= torch.equal(out, full[t:t + 1])

    def sdpa(qq, kk, vv, pp):
        n = int(pp.max()) + 1
        kk, vv = kk[:n].repeat_interleave(h // kvh, 1), vv[:n].repeat_interleave(h // kvh, 1)
        mask = torch.arange(n, device=device)[None, :] <= pp[:, None]
        return F.scaled_dot_product_attention(qq.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1),
                                              attn_mask=mask, scale=scale).transpose(0, 1)

    stock_full = sdpa(q, k, v, pos)
    stock_chunked = torch.cat([sdpa(q[i:i + c], k, v, pos[i:i + c]) for i in range(0, s, c)])
    stock_decode = all(torch.equal(sdpa(q[t:t + 1], k, v, pos[t:t + 1]), stock_full[t:t + 1]) for t in range(first, s))
    ctx = shapes["attn_ctx"]
    kl, vl = rnd(ctx, kvh, d, dtype=dtype), rnd(ctx, kvh, d, dtype=dtype)
    q1, p1 = rnd(1, h, d, dtype=dtype), torch.tensor([ctx - 1], device=device)
    qp, pp = rnd(min(ctx, 512), h, d, dtype=dtype), torch.arange(min(ctx, 512), device=device)
    return {
        "prefill_vs_chunked_identical": bool(torch.equal(chunked, full)),
        "prefill_vs_decode_identical": bool(decode_same),
        "stock_prefill_vs_chunked_identical": bool(torch.equal(stock_chunked, stock_full)),
        "stock_prefill_vs_decode_identical": bool(stock_decode),
        "max_abs_err_vs_stock": float((full.float() - stock_full.float()).abs().max()),
        f"us_decode_ctx{ctx}": {"triton": timer(lambda: tk.attention(q1, kl, vl, p1, scale)),
                                "stock": timer(lambda: sdpa(q1, kl, vl, p1))},
        f"us_prefill_{len(pp)}": {"triton": timer(lambda: tk.attention(qp, kl, vl, pp, scale)),
                                  "stock": timer(lambda: sdpa(qp, kl, vl, pp))},
    }


def _bad(lst: list[int], total: int) -> str:
    if not lst:
        return f"invariant ({total}/{total} batch sizes)"
    shown = ", ".join("row 2 alone" if b == -3 else str(b) for b in lst[:6])
    return f"VARIES at {shown}{'…' if len(lst) > 6 else ''}"


def lines(report: dict) -> list[str]:
    out = [f"gpu_check: {report['device']} · torch {report['torch']} · triton {report['triton']}"
           + (" · tiny shapes" if report["tiny"] else "")]
    for dtype, res in report["dtypes"].items():
        n_b = len(FULL["batches"] if not report["tiny"] else TINY["batches"])
        out.append(f"[{dtype}] invariance over batch sizes")
        for shape, e in res["linear"].items():
            out.append(f"  linear {shape:<10} triton: {_bad(e['triton_bad_batches'], n_b)}; "
                       f"stock: {_bad(e['stock_bad_batches'], n_b)}; max|Δ| vs stock {e['max_abs_err_vs_stock']:.1e}")
        for name, e in res["rows"].items():
            stock = f"; stock: {_bad(e['stock_bad_batches'], n_b)}" if "stock_bad_batches" in e else ""
            out.append(f"  {name:<17} triton: {_bad(e['triton_bad_batches'], n_b)}{stock}; max|Δ| {e['max_abs_err']:.1e}")
        a = res["attention"]
        yes = {True: "identical", False: "DIFFER"}
        out.append(f"  attention        triton: prefill vs chunked {yes[a['prefill_vs_chunked_identical']]}, "
                   f"prefill vs decode {yes[a['prefill_vs_decode_identical']]}; stock SDPA: "
                   f"{yes[a['stock_prefill_vs_chunked_identical']]} / {yes[a['stock_prefill_vs_decode_identical']]}; "
                   f"max|Δ| {a['max_abs_err_vs_stock']:.1e}")
        note = " (interpreter: not a speed figure)" if report["tiny"] and "interpreter" in report["device"] else ""
        out.append(f"[{dtype}] time, µs (triton invariant / stock, ratio){note}")
        for shape, e in res["linear"].items():
            cells = [f"{key.removeprefix('us_')} {t['triton']:.0f}/{t['stock']:.0f} ({t['triton'] / t['stock']:.2f}×)"
                     for key, t in e.items() if key.startswith("us_")]
            out.append(f"  linear {shape:<10} " + "  ".join(cells))
        cells = [f"{key.removeprefix('us_')} {t['triton']:.0f}/{t['stock']:.0f} ({t['triton'] / t['stock']:.2f}×)"
                 for key, t in a.items() if key.startswith("us_")]
        out.append("  attention        " + "  ".join(cells))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m tttr.kernels.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (automatic without a GPU)")
    parser.add_argument("--cpu", action="store_true", help="run under the Triton interpreter even with a GPU")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda:
        code = _need_interpreter_child(argv)
        if code is not None:
            return code
    device = torch.device("cuda" if cuda else "cpu")
    t0 = time.perf_counter()
    report = check(tiny=args.tiny or not cuda, device=device)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print("\n".join(lines(report)))
        print(f"({report['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
