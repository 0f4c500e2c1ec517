"""The model on another device (a CUDA GPU): a copy whose weights are dense tensors there.

The engine is written for the CPU, where products run from a GGUF file's blocks; on a GPU every
weight is expanded to `dtype` (fp32 by default: the values the CPU path multiplies by) and the
products, norms and attention take the Triton invariant kernels (kernels/invariant.py routes CUDA
tensors there) or stock cuBLAS under `fast`. `Model.forward` moves the scheduler's index tensors
to the model's device and hands back CPU logits, so the scheduler, the sampler and the records
are the same code on either device. Bits differ between devices; the greedy decisions are what
a replay on another device needs (`tttr bench gpu` compares them)."""

from __future__ import annotations

import copy

import torch

from tttr.engine.inference.model import Model
from tttr.kernels import ops


def to_device(model: Model, device: str | torch.device, dtype: torch.dtype = torch.float32) -> Model:
    device = torch.device(device)

    def move(t):
        return None if t is None else ops.dense(t).to(device=device, dtype=dtype).contiguous()

    m = copy.copy(model)
    m.device, m.dtype = device, dtype
    m.layers = [layer._replace(**{f: move(getattr(layer, f)) for f in layer._fields}) for layer in model.layers]
    m.embed = move(model.embed)
    m.lm_head = m.embed if model.lm_head is model.embed else move(model.lm_head)
    m.norm = move(model.norm)
    m._cos, m._sin = model._cos.to(device=device, dtype=dtype), model._sin.to(device=device, dtype=dtype)
    m.block_weights = 0
    return m
