"""Block products of long prompts go through the rows in tiles (cquant.c's ROW_TILE, 64 rows):
a row's outputs are the same bits wherever the tiles fall, for every block format and for a
weight stacked from parts of different formats (Q4_K_M's q/k/v)."""

from __future__ import annotations

import pytest
import torch

from tttr.kernels import cquant
from tests.kernel_helpers import random_weight

ROW_TILE = 64


@pytest.mark.skipif(not cquant.available(), reason="no C compiler for the block products")
@pytest.mark.parametrize("fmt", cquant.FORMATS)
def test_rows_past_the_row_tile_get_the_bits_they_get_alone(fmt):
    n, k = 48, 256
    raw, values = random_weight(fmt, n, k, seed=3)
    qw = cquant.pack(fmt, raw, n, k)
    x = torch.randn(3 * ROW_TILE + 5, k, generator=torch.Generator().manual_seed(1))
    full = cquant.linear(x, qw)
    for rows in (1, 7, ROW_TILE - 1, ROW_TILE, ROW_TILE + 1):  # tiles starting elsewhere than in `full`
        for start in (0, 3, ROW_TILE - 2, x.shape[0] - rows):
            assert torch.equal(cquant.linear(x[start:start + rows], qw), full[start:start + rows]), (rows, start)
    assert torch.allclose(full, x @ torch.from_numpy(values).T, rtol=1e-4, atol=1e-4)


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
