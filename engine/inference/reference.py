"""transformers' own GGUF loader as an independent reference (tests and `tttr bench engine`).
transformers is an optional, test-only dependency: `load_reference` returns None without it.

`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` needs `accelerate`; without it we go
through the same transformers GGUF code (`load_gguf_checkpoint`: dequantize, un-permute,
rename) and load the state dict into a model built from the GGUF's config."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path


def load_reference(gguf_path: Path):
    """(model, tokenizer) from transformers in fp32, eval mode, offline; None if not installed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    with contextlib.redirect_stderr(io.StringIO()):  # transformers' GGUF loader draws progress bars
        return _load(gguf_path, torch, AutoConfig, AutoModelForCausalLM, AutoTokenizer)


def _load(gguf_path: Path, torch, AutoConfig, AutoModelForCausalLM, AutoTokenizer):
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except ValueError as exc:
        if "accelerate" not in str(exc):
            raise
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]
        result = model.load_state_dict(state, strict=False)
        unexpected = [k for k in result.missing_keys if k != "lm_head.weight"]
        if unexpected or result.unexpected_keys:
            raise RuntimeError(f"reference load mismatch: {unexpected} {result.unexpected_keys}")
        model.tie_weights()
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model, tokenizer
