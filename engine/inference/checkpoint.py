"""What a loader hands the model: config, fp32 tensors with Hugging Face names, tokenizer, and
for a GGUF file the stored blocks of its quantized weights (see kernels.cquant)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tttr.engine.inference.config import ModelConfig
from tttr.engine.inference.tokenizer import Tokenizer


@dataclass
class Checkpoint:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    name: str
    path: Path
    # Hugging Face name -> (GGUF type name, raw rows [N, bytes] uint8) for Q4_1/Q8_0 weights,
    # rows permuted as the fp32 tensor's are
    quantized: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
