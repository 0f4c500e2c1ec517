"""Batch-invariant attention on the CPU as one compiled C loop nest (built with the system C
compiler on first use, cached, called through ctypes).

Every (query, head) is computed start to finish by the same loops, in an order fixed by the
head dim and the number of keys the query attends, whatever else the call holds: so a row's
bits do not depend on the batch, on how a prompt was chunked, nor on keys past its
position. The order, per query q and head h attending keys 0..pos:

- score_j: the head dim is split across 16 lanes (lane l sums elements l, l+16, l+32, ...,
  in that order), then the 16 lane sums are added in a fixed pairwise tree; times `scale`;
- softmax: the maximum (exact in any order), exp(score_j - max), and the denominator summed
  over j = 0..pos one by one;
- output_d: sum over j = 0..pos, one by one, of p_j * v_j,d, divided by the denominator.

One call against the ~15 PyTorch ops of the blocked formulation (`kernels.invariant`), it
costs about what stock attention does. Without a C compiler, `available()` is False and the
invariant kernels keep the blocked PyTorch formulation (their own bits, just as invariant);
the run fingerprint records which one ran (`attention_kernel`). Importing this module does
not import torch (the wrappers do, when called)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ctypes
from pathlib import Path

from tttr.sessions.cache import CLibrary, c_source

if TYPE_CHECKING:  # the wrappers import torch when called: the torch-free path never does
    import torch

SOURCE = c_source(Path(__file__).with_name("cattention.c"))  # with exp_neg.h

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-fast-math", "-fno-trapping-math", "-shared", "-fPIC"]


def _declare(lib) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.tttr_attention.argtypes = [p, p, p, i, i, i, i, p, p, i, i, i, i, i, i, ctypes.c_float, p, ctypes.c_int]
    lib.tttr_attention.restype = ctypes.c_int


_library = CLibrary("attention", SOURCE, _FLAGS, "the compiled invariant attention", _declare)
load, available, why_unavailable = _library.load, _library.available, _library.why_unavailable


def _kv_rows(x: torch.Tensor) -> torch.Tensor:
    """fp32 with contiguous [KVH, D] rows, as the loop nest reads them (a copy only if not)."""
    import torch

    if x.dtype != torch.float32:
        x = x.float()
    if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1]:
        x = x.contiguous()
    return x


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor,
              scale: float) -> torch.Tensor:
    """q [n, H, D]; k, v [N, S, KVH, D] (fp32 with contiguous [KVH, D] rows and any row and
    sequence strides are read in place: a KV pool view as it is; anything else is copied
    first); seq, pos [n] int64: query i attends keys 0..pos[i] of sequence seq[i]. Returns
    [n, H, D] fp32."""
    import torch

    lib = load()
    if lib is None:
        raise RuntimeError(why_unavailable())
    n, h, d = q.shape
    kvh = k.shape[2]
    if h % kvh:
        raise ValueError(f"attention: {h} query heads are not a multiple of {kvh} KV heads")
    k, v = _kv_rows(k), _kv_rows(v)
    q = q.to(torch.float32).contiguous()
    seq = seq.to(torch.int64).contiguous()
    pos = pos.to(torch.int64).contiguous()
    out = torch.empty(n, h, d, dtype=torch.float32)
    if n:
        status = lib.tttr_attention(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            seq.data_ptr(), pos.data_ptr(), n, k.shape[0], min(k.shape[1], v.shape[1]), h, kvh, d, float(scale),
            out.data_ptr(), torch.get_num_threads())  # each (query, head) is one thread's: any count, same bits
        if status == 1:
            raise ValueError(f"attention: a sequence index is out of range for {k.shape[0]} sequences")
        if status == 2:
            raise ValueError(f"attention: a position is past the {k.shape[1]} keys given")
    return out
