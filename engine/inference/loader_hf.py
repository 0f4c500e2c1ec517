"""Read a Hugging Face checkpoint folder: config.json + *.safetensors + tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from tttr.engine.inference.checkpoint import Checkpoint
from tttr.engine.inference.config import ModelConfig
from tttr.engine.errors import EngineError
from tttr.engine.inference.tokenizer import Tokenizer


def load_hf(folder: Path) -> Checkpoint:

    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineError(f"cannot read {folder / 'config.json'}: {exc}") from exc
    config = ModelConfig.from_hf(cfg)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise EngineError(f"{folder} has no *.safetensors weights: convert the checkpoint to safetensors")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            tensors[name] = t.to(torch.float32).contiguous()
    if "lm_head.weight" not in tensors and not config.tied_embeddings:
        # Some exports drop the head when it equals the embedding.
        config = ModelConfig(**{**_asdict(config), "tied_embeddings": True})
    tokenizer = Tokenizer.from_hf_folder(folder, cfg, config.vocab_size)
    return Checkpoint(config=config, tensors=tensors, tokenizer=tokenizer, name=folder.name, path=folder)


def _asdict(config: ModelConfig) -> dict:
    return {f: getattr(config, f) for f in config.__slots__}
