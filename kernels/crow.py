"""The decoder's row-local steps as compiled C (built on first use, cached, called through
ctypes): RMSNorm (alone and fused with the residual add before it), rotary embedding in
place, and SwiGLU. At decode sizes each was several PyTorch ops of a few microseconds'
dispatch on a few hundred numbers; one call each costs about one dispatch.

Each row is computed on its own, in an order fixed by the row's length alone, so these are
batch-invariant as they stand and serve both kernel modes:

- rms_norm: lane l of 16 sums x_i * x_i for i = l, l+16, l+32, ... in order (products rounded,
  then added: compiled without contraction), the 16 lanes are added in a fixed pairwise tree,
  r = 1 / sqrt(sum / D + eps), y_i = (x_i * r) * w_i;
- rotary: y_i = x_i * cos_i + x_(i+D/2 mod D) * sin'_i (sin' with its first half negated: the
  model's tables), three rounded operations as in the PyTorch formulation, same bits;
- topk: one scan a row keeping the k largest (3x torch.topk on the vocabulary here);
- draw: a sampler's inverse CDF, summed in double entry by entry as torch.cumsum does;
- silu_mul: g * sigmoid(g) * u with sigmoid from one exp of -|g| (Cephes' polynomial, plain
  float arithmetic the compiler vectorises: vector body and scalar tail agree).

Without a compiler or with `TTTR_NO_C_KERNELS=1`, `available()` is False and kernels.ops keeps
the PyTorch formulations.

Importing this module does not import torch (the torch-free generation path,
engine/inference/lite.py, calls the library through `load()` with numpy arrays); the
wrappers below import it when called."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ctypes
from pathlib import Path

from tttr.sessions.cache import CLibrary, c_source

if TYPE_CHECKING:  # the wrappers import torch when called: the torch-free path never does
    import torch

SOURCE = c_source(Path(__file__).with_name("crow.c"))  # with exp_neg.h

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-fast-math", "-fno-trapping-math", "-ffp-contract=off", "-shared", "-fPIC"]


def _declare(lib) -> None:
    p, i, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.tttr_rms_norm.argtypes = [p, p, p, i, i, f]
    lib.tttr_add_rms_norm.argtypes = [p, p, p, p, i, i, f]
    lib.tttr_rope.argtypes = [p, i, i, i, i, p, p, i, p]
    lib.tttr_rope.restype = ctypes.c_int
    lib.tttr_silu_mul.argtypes = [p, p, i, i]
    lib.tttr_draw.argtypes = [p, p, i, i, p, ctypes.c_int]
    lib.tttr_topk.argtypes = [p, i, i, i, p, p, ctypes.c_int]
    lib.tttr_log_softmax.argtypes = lib.tttr_softmax.argtypes = [p, p, i, i, ctypes.c_int]
    for fn in (lib.tttr_rms_norm, lib.tttr_add_rms_norm, lib.tttr_silu_mul, lib.tttr_draw, lib.tttr_topk,
               lib.tttr_log_softmax, lib.tttr_softmax):
        fn.restype = None


_library = CLibrary("rowwise", SOURCE, _FLAGS, "the compiled row-local kernels", _declare)
load, available, why_unavailable = _library.load, _library.available, _library.why_unavailable


def _rows(x: torch.Tensor) -> torch.Tensor:
    import torch

    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError("row-local kernels take contiguous fp32 tensors")
    return x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    import torch

    d = x.shape[-1]
    x, w = _rows(x), _rows(weight)
    y = torch.empty_like(x)
    load().tttr_rms_norm(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel() // d, d, eps)
    return y


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x += delta in place; returns rms_norm(x) * weight."""
    import torch

    d = x.shape[-1]
    x, delta, w = _rows(x), _rows(delta), _rows(weight)
    if delta.shape != x.shape:
        raise ValueError(f"add_rms_norm: {tuple(delta.shape)} added to {tuple(x.shape)}")
    y = torch.empty_like(x)
    load().tttr_add_rms_norm(x.data_ptr(), delta.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel() // d, d, eps)
    return y


def rope_(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> None:
    """Rotate the first `heads` heads of x [R, >= heads, D] (heads contiguous, rows any stride)
    in place by the table rows cos/sin [P, D] at `positions` [R] (int64)."""
    import torch

    r, _, d = x.shape
    if x.dtype != torch.float32 or x.stride(2) != 1 or x.stride(1) != d:
        raise ValueError("rope_: heads must be contiguous fp32 rows")
    cos, sin, positions = _rows(cos), _rows(sin), positions.to(torch.int64).contiguous()
    if load().tttr_rope(x.data_ptr(), r, x.stride(0), heads, d, cos.data_ptr(), sin.data_ptr(), cos.shape[0],
                        positions.data_ptr()):
        raise ValueError(f"rope_: a position is past the {cos.shape[0]}-row table")


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [R, 2F] (gate then up) -> silu(gate) * up [R, F]."""

    gate_up = _rows(gate_up)
    r, f2 = gate_up.shape
    y = gate_up.new_empty(r, f2 // 2)
    load().tttr_silu_mul(gate_up.data_ptr(), y.data_ptr(), r, f2 // 2)
    return y


def draw(probs: torch.Tensor, u: torch.Tensor) -> list[int]:
    """probs [n, m] fp32 (unnormalised), u [n] float64 in [0, 1): each row's inverse-CDF index
    (see tttr_draw), rows in parallel."""
    import torch

    probs, u = _rows(probs), u.to(torch.float64).contiguous()
    n, m = probs.shape
    out = torch.empty(n, dtype=torch.int64)
    load().tttr_draw(probs.data_ptr(), u.data_ptr(), n, m, out.data_ptr(), torch.get_num_threads())
    return out.tolist()


TOPK_MAX = 64


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest of each row of a 2-D fp32 tensor, largest first
    (the lower index first among equals), like torch.topk(x, k) for k <= TOPK_MAX."""
    import torch

    x = _rows(x)
    n, m = x.shape
    if not 0 < k <= min(m, TOPK_MAX):
        raise ValueError(f"topk: k={k} must be in 1..{min(m, TOPK_MAX)}")
    vals = torch.empty(n, k, dtype=torch.float32)
    idx = torch.empty(n, k, dtype=torch.int64)
    load().tttr_topk(x.data_ptr(), n, m, k, vals.data_ptr(), idx.data_ptr(), torch.get_num_threads())
    return vals, idx


def log_softmax(x: "torch.Tensor") -> "torch.Tensor":
    """log_softmax of each row of a 2-D fp32 tensor (tttr_log_softmax: each row on its own,
    in an order fixed by its length; the invariant mode's CPU log-softmax)."""
    import torch

    x = _rows(x)
    y = torch.empty_like(x)
    load().tttr_log_softmax(x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], torch.get_num_threads())
    return y


def softmax(x: "torch.Tensor") -> "torch.Tensor":
    """softmax of each row of a 2-D fp32 tensor (tttr_softmax, as log_softmax)."""
    import torch

    x = _rows(x)
    y = torch.empty_like(x)
    load().tttr_softmax(x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], torch.get_num_threads())
    return y
