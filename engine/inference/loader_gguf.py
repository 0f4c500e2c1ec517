"""Read a GGUF file: metadata -> ModelConfig + Tokenizer, tensors with Hugging Face names:
weights in a block type the products take (ops.QUANT_FORMATS: Q4_1, Q8_0, Q4_K, Q5_0, Q5_K,
Q6_K) as their stored blocks (the model runs products from them, see
kernels.ops.block_weight; Checkpoint.dense expands one on request), the rest dequantized to
fp32 (F16, BF16 and the other types the gguf package dequantizes: Q2_K, Q3_K, IQ*, TQ*, ...;
a type it cannot read is refused in one line). llama.cpp stores the Q/K rows of `llama`
models permuted for its interleaved rotary embedding; we undo that so one rotary
implementation serves both formats."""

from __future__ import annotations

from pathlib import Path

import torch

from tttr.engine.inference.checkpoint import Checkpoint
from tttr.engine.inference.gguf_file import (  # noqa: F401 - named here too (tests, replay)
    _field, is_gguf, permute_qk, read_gguf, unpermute_qk)


def load_gguf(path: Path) -> Checkpoint:
    g = read_gguf(path)
    tensors = {name: torch.from_numpy(arr) for name, arr in g.arrays.items()}
    return Checkpoint(config=g.config, tensors=tensors, tokenizer=g.tokenizer, name=path.stem, path=path,
                      quantized=g.quantized)
