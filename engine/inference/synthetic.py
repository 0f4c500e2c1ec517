"""GGUF files with random weights in a real model's shape, for speed measurements.

`tttr bench engine --synthetic SHAPE` needs a 0.5B-1B model to see how the engine does where
weights stream from memory at every token; a real one would be a download. This writes one
instead: the shape of a known model (layers, widths, heads, FFN, tied embeddings, biases), the
default model's tokenizer and chat template (so its vocabulary, 49,152, stands in for the real
one), weights drawn from a normal distribution with a fixed seed (the same file every time),
written as F16 (norms F32) by the `gguf` package's writer and, where llama-cpp-python is
installed, quantized to Q4_K_M by llama.cpp's own quantizer (in a process of its own). Random
weights measure speed, not text: what such a model writes means nothing.

Files are cached under the cache directory (`synthetic/`), named by shape, type, seed and
`VERSION`; a second call finds the file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tttr.engine.errors import EngineError
from tttr.engine.inference import llama_cpp_reference as lcpp
from tttr.engine.inference.loader import resolve_model_path
from tttr.sessions.cache import cache_dir

VERSION = 1  # bump when what is written changes: the cached files' names carry it
SEED = 20261202
STD = 0.02  # the weights' standard deviation (an initialiser's; keeps activations finite)


@dataclass(frozen=True, slots=True)
class Shape:
    """A decoder's shape as GGUF metadata names it (vocabulary: the default model's)."""

    name: str
    arch: str  # "llama" | "qwen2"
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_theta: float
    rms_eps: float
    attn_bias: bool = False
    context_length: int = 8192
    real: str = ""  # the model whose shape this is

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise EngineError(f"shape {self.name}: d_model must divide by n_heads and n_heads by n_kv_heads")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def tensors(self, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
        """(name, numpy shape) in file order: rows first, as the writer takes them."""
        d, kv, f = self.d_model, self.n_kv_heads * self.head_dim, self.ffn_dim
        out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, d))]
        for i in range(self.n_layers):
            b = f"blk.{i}."
            out += [(b + "attn_norm.weight", (d,)), (b + "attn_q.weight", (d, d)), (b + "attn_k.weight", (kv, d)),
                    (b + "attn_v.weight", (kv, d))]
            if self.attn_bias:
                out += [(b + "attn_q.bias", (d,)), (b + "attn_k.bias", (kv,)), (b + "attn_v.bias", (kv,))]
            out += [(b + "attn_output.weight", (d, d)), (b + "ffn_norm.weight", (d,)),
                    (b + "ffn_gate.weight", (f, d)), (b + "ffn_up.weight", (f, d)), (b + "ffn_down.weight", (d, f))]
        return [*out, ("output_norm.weight", (d,))]  # tied embeddings: no output.weight

    def parameters(self, vocab: int) -> int:
        return sum(int(np.prod(s)) for _, s in self.tensors(vocab))


SHAPES = {
    s.name: s for s in (
        # Llama-3.2-1B (its llama3 rope scaling left out: it changes the rotary table, not the cost)
        Shape("llama-1b", "llama", 16, 2048, 32, 8, 8192, 500000.0, 1e-5, real="Llama-3.2-1B"),
        Shape("qwen-0.5b", "qwen2", 24, 896, 14, 2, 4864, 1000000.0, 1e-6, attn_bias=True, real="Qwen2.5-0.5B"),
    )
}


def shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise EngineError(f"unknown synthetic shape {name!r}: use one of {', '.join(SHAPES)}") from None


def _tokenizer_fields(default_model: Path) -> list[tuple[str, object, object, object]]:
    """(key, value, type, item type) of every tokenizer.* field of the default model."""
    from gguf import GGUFReader, GGUFValueType

    out = []
    for key, field in GGUFReader(str(default_model)).fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        out.append((key, field.contents(), vtype, sub))
    return out


def write_f16(s: Shape, path: Path, seed: int = SEED, default_model: Path | None = None) -> int:
    """Write `s` with random weights (F16; norms F32 ones) to `path`; returns the parameter count.
    Tensors are drawn and written one at a time, so memory stays near the largest one."""
    import gguf

    fields = _tokenizer_fields(default_model or resolve_model_path(None))
    vocab = len(next(v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens"))
    w = gguf.GGUFWriter(str(path), s.arch)
    w.add_name(f"TTTR synthetic {s.name} (random weights, seed {seed}, shape of {s.real})")
    w.add_block_count(s.n_layers)
    w.add_context_length(s.context_length)
    w.add_embedding_length(s.d_model)
    w.add_feed_forward_length(s.ffn_dim)
    w.add_head_count(s.n_heads)
    w.add_head_count_kv(s.n_kv_heads)
    w.add_rope_freq_base(s.rope_theta)
    w.add_rope_dimension_count(s.head_dim)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value, vtype, sub in fields:
        w.add_key_value(key, value, vtype, sub)
    specs = s.tensors(vocab)
    rng = np.random.default_rng(seed)

    def data(name, dims):
        if name.endswith("norm.weight"):
            return np.ones(dims, dtype=np.float32)
        if name.endswith(".bias"):
            return (rng.standard_normal(dims, dtype=np.float32) * STD).astype(np.float32)
        return (rng.standard_normal(dims, dtype=np.float32) * STD).astype(np.float16)

    for name, dims in specs:
        f32 = name.endswith("norm.weight") or name.endswith(".bias")
        dtype = np.dtype(np.float32 if f32 else np.float16)
        w.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, dims in specs:
        w.write_tensor_data(data(name, dims))
    w.close()
    return s.parameters(vocab)


def path_for(s: Shape, ftype: str, seed: int = SEED) -> Path:
    return cache_dir() / "synthetic" / f"{s.name}-{ftype}-seed{seed}-v{VERSION}.gguf"


def ensure(name: str, quantized: bool | None = None, seed: int = SEED, progress=None) -> Path:
    """The cached file of shape `name`: Q4_K_M where llama.cpp's quantizer is installed (or
    `quantized` says so), else F16; written first if missing (a minute or two for llama-1b)."""
    s = shape(name)
    quantized = lcpp.available() if quantized is None else quantized
    ftype = "Q4_K_M" if quantized else "F16"
    target = path_for(s, ftype, seed)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    f16 = path_for(s, "F16", seed)
    if not f16.is_file():
        if progress:
            progress(f"writing {f16} (random weights in {s.real}'s shape)")
        tmp = f16.with_suffix(f".tmp{os.getpid()}")
        try:
            write_f16(s, tmp, seed)
            tmp.replace(f16)
        finally:
            tmp.unlink(missing_ok=True)
    if not quantized:
        return f16
    if progress:
        progress(f"quantizing to {target} with llama.cpp's quantizer")
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    try:  # a process of its own, as every llama.cpp call here (llama_cpp_reference.py)
        done = subprocess.run([sys.executable, "-m", lcpp.MODULE, "quantize", str(f16), str(tmp), "--type", ftype],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"llama.cpp's quantizer failed on {f16}: {done.stderr.strip()[-500:]}")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    f16.unlink(missing_ok=True)  # 2 GB for llama-1b; the quantized file is what is measured
    return target
