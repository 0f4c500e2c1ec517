"""What a loader hands the model: config, fp32 tensors with Hugging Face names, tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.tokenizer import Tokenizer


@dataclass
class Checkpoint:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    name: str
    path: Path
