"""What a loader hands the model: config, tensors with Hugging Face names, tokenizer. A GGUF
file's block-typed weights (ops.QUANT_FORMATS) stay as their stored blocks (see kernels.cquant),
expanded to fp32 only when asked (`dense`): a model whose products run from the blocks never holds them dense."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tttr.engine.inference.config import ModelConfig
from tttr.engine.inference.tokenizer import Tokenizer


@dataclass
class Checkpoint:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]  # fp32 tensors, the names not in `quantized`
    tokenizer: Tokenizer
    name: str
    path: Path
    # Hugging Face name -> (GGUF type name, raw rows [N, bytes] uint8) for block-typed weights,
    # rows permuted as the weight's are (llama's Q/K); a GGUF loader reads each when asked
    quantized: Mapping[str, tuple[str, np.ndarray]] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors or name in self.quantized

    def names(self) -> set[str]:
        return set(self.tensors) | set(self.quantized)

    def dense(self, name: str) -> torch.Tensor:
        """The fp32 tensor `name`: a quantized weight dequantized by gguf now (a new tensor
        each call, 4 bytes a weight), any other as loaded."""
        if name in self.quantized:
            import gguf  # only for a weight that is asked for dense

            fmt, raw = self.quantized[name]
            arr = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[fmt])
            return torch.from_numpy(np.array(arr, dtype=np.float32, order="C", copy=True))
        return self.tensors[name]
