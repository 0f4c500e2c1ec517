"""Block products of long prompts go through the rows in tiles (cquant.c's ROW_TILE, 64 rows,
once x is over TILE_MIN_BYTES): a row's outputs are the same bits wherever the tiles fall, for
every block format and for a weight stacked from parts of different formats (Q4_K_M's q/k/v).
The tests' inputs are small, so they run a build that tiles every x (-DTILE_MIN_BYTES=0)."""

from __future__ import annotations

import pytest
import torch

import ctypes

from tttr.kernels import cquant
from tttr.sessions.cache import build_shared
from tests.kernel_helpers import random_weight

ROW_TILE = 64


@pytest.fixture(autouse=True)
def always_tiled(monkeypatch):
    """cquant's products through a build that tiles every x, and the module's own build to compare."""
    path, why = build_shared("qlinear-test-tiled", cquant.SOURCE, cquant._FLAGS + ["-DTILE_MIN_BYTES=0"], "a test build",
                             subdir="kernels")
    assert path is not None, why
    lib = ctypes.CDLL(str(path))
    cquant._declare(lib)
    untiled = cquant.load()
    monkeypatch.setattr(cquant, "load", lambda: lib)
    return untiled


@pytest.mark.skipif(not cquant.available(), reason="no C compiler for the block products")
@pytest.mark.parametrize("fmt", cquant.FORMATS)
def test_rows_past_the_row_tile_get_the_bits_they_get_alone(fmt, always_tiled, monkeypatch):
    n, k = 48, 256
    raw, values = random_weight(fmt, n, k, seed=3)
    qw = cquant.pack(fmt, raw, n, k)
    x = torch.randn(3 * ROW_TILE + 5, k, generator=torch.Generator().manual_seed(1))
    full = cquant.linear(x, qw)
    for rows in (1, 7, ROW_TILE - 1, ROW_TILE, ROW_TILE + 1):  # tiles starting elsewhere than in `full`
        for start in (0, 3, ROW_TILE - 2, x.shape[0] - rows):
            assert torch.equal(cquant.linear(x[start:start + rows], qw), full[start:start + rows]), (rows, start)
    assert torch.allclose(full, x @ torch.from_numpy(values).T, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(cquant, "load", lambda: always_tiled)  # small x: taken whole by the shipped build
    assert torch.equal(cquant.linear(x, qw), full)


@pytest.mark.skipif(not cquant.available(), reason="no C compiler for the block products")
def test_a_stacked_weight_of_mixed_formats_tiles_the_same():
    parts, values = [], []
    for fmt, n, seed in (("Q4_K", 32, 1), ("Q6_K", 16, 2), ("Q4_K", 16, 3)):
        raw, v = random_weight(fmt, n, 256, seed)
        parts.append(cquant.pack_part(fmt, raw, n, 256))
        values.append(torch.from_numpy(v))
    qw = cquant.stack(parts)
    x = torch.randn(2 * ROW_TILE + 9, 256, generator=torch.Generator().manual_seed(2))
    full = cquant.linear(x, qw)
    assert torch.equal(cquant.linear(x[ROW_TILE - 3:], qw), full[ROW_TILE - 3:])
    assert torch.equal(torch.cat([cquant.linear(x[i:i + 1], qw) for i in range(0, x.shape[0], 17)]), full[::17])
    assert torch.allclose(full, x @ torch.cat(values).T, rtol=1e-4, atol=1e-4)
