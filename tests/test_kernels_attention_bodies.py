"""The compiled attention's 16-key score body (AVX-512: scores16) gives every score the bits of
the one-key body (dot_lanes), so the attention's output is the same bit for bit: built both ways
from kernels/cattention.c (-DTTTR_ONE_KEY: dot_lanes only) and compared on grouped heads and key
counts that are not a multiple of 16. Without AVX-512 both builds are the one-key body."""

from __future__ import annotations

import ctypes

import pytest
import torch

from tttr.kernels import cattention
from tttr.sessions.cache import build_shared


def _build(extra: list[str]):
    path, why = build_shared("attention-test" + "".join(extra).replace("-", "_"), cattention.SOURCE,
                             cattention._FLAGS + extra, "a test build", subdir="kernels")
    assert path is not None, why
    lib = ctypes.CDLL(str(path))
    cattention._declare(lib)
    return lib


def _run(lib, q, k, v, pos, scale):
    n, h, d = q.shape
    seq = torch.zeros(n, dtype=torch.int64)
    out = torch.empty(n, h, d)
    assert lib.tttr_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), v.stride(0),
                              v.stride(1), seq.data_ptr(), pos.data_ptr(), n, 1, k.shape[1], h, k.shape[2], d,
                              scale, out.data_ptr(), 2) == 0
    return out


@pytest.mark.skipif(not cattention.available(), reason="no C compiler for the compiled attention")
@pytest.mark.parametrize("d", [64, 128, 48])
def test_multi_key_scores_equal_one_key_scores_bit_for_bit(d):
    multi, one = _build([]), _build(["-DTTTR_ONE_KEY"])
    g = torch.Generator().manual_seed(d)
    s, h, kvh = 203, 8, 2
    q = torch.randn(s, h, d, generator=g)
    k = torch.randn(1, s, kvh, d, generator=g) * 3
    v = torch.randn(1, s, kvh, d, generator=g)
    pos = torch.arange(s, dtype=torch.int64)
    a, b = _run(multi, q, k, v, pos, d**-0.5), _run(one, q, k, v, pos, d**-0.5)
    assert torch.equal(a, b)
    # and through the module as the engine calls it (the cached build of the same source)
    assert torch.equal(cattention.attention(q, k, v, torch.zeros(s, dtype=torch.int64), pos, d**-0.5), a)
