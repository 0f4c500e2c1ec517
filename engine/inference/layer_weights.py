"""One decoder layer's weights, as the model (model.py, torch tensors) and the torch-free
generation path (lite.py, numpy arrays) hold them, and as the compiled decode step
(kernels.cdecode) reads them."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    import torch

    Tensor = torch.Tensor | np.ndarray


class LayerWeights(NamedTuple):
    """One decoder layer's weights, d = d_model, hd = head_dim; the query, key and value
    projections are one product, and so are the gate and up projections. A product's weight
    is an fp32 tensor or, for a GGUF file's block-typed weights (Q4_1, Q8_0, K-quants, Q5_0),
    the blocks alone (ops.QuantWeight, taken by ops.linear in its place)."""

    input_norm: Tensor  # [d]
    qkv: Tensor  # [(H + 2 KVH) * hd, d]
    qkv_bias: Tensor | None  # [(H + 2 KVH) * hd] (Qwen2-style attention bias), else None
    o: Tensor  # [d, H * hd]
    post_attention_norm: Tensor  # [d]
    gate_up: Tensor  # [2 * ffn, d]
    down: Tensor  # [d, ffn]
    q_norm: Tensor | None = None  # [hd] (Qwen3: RMSNorm of each query head before rotary), else None
    k_norm: Tensor | None = None  # [hd] (the same for each key head)
