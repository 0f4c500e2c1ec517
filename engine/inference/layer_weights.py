"""One decoder layer's weights, as the model (model.py, torch tensors) and the torch-free
generation path (lite.py, numpy arrays) hold them, and as the compiled decode step
(kernels.cdecode) reads them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

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


def from_checkpoint(p: str, cfg, *, norm: Callable[[str], Any], product: Callable[[list[str]], Any],
                    bias: Callable[[str], Any], concat: Callable[[list], Any]) -> LayerWeights:
    """Layer `p` (`model.layers.{i}.`) from a checkpoint's Hugging Face names, for the model
    (torch tensors) and the torch-free path (numpy arrays) alike: `norm(name)` reads a
    vector, `product(names)` one product of those weights stacked (q/k/v, gate/up),
    `bias(name)` an optional bias (None when absent), `concat(parts)` joins the q/k/v biases.
    What each returns for a missing tensor is the caller's to decide (raise, or None)."""
    qkv_bias = None
    if cfg.attn_bias:
        parts = [bias(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
        if all(b is not None for b in parts):
            qkv_bias = concat(parts)
    return LayerWeights(
        input_norm=norm(p + "input_layernorm.weight"),
        qkv=product([p + f"self_attn.{n}_proj.weight" for n in "qkv"]), qkv_bias=qkv_bias,
        o=product([p + "self_attn.o_proj.weight"]),
        post_attention_norm=norm(p + "post_attention_layernorm.weight"),
        gate_up=product([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]),
        down=product([p + "mlp.down_proj.weight"]),
        q_norm=norm(p + "self_attn.q_norm.weight") if cfg.qk_norm else None,
        k_norm=norm(p + "self_attn.k_norm.weight") if cfg.qk_norm else None,
    )
