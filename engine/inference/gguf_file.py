"""A GGUF file without torch: its header (metadata fields and tensor table, cached), its
tensors under Hugging Face names, the block-typed ones (kernels.cquant.FORMATS) kept as stored
blocks read on request, the rest as fp32 numpy arrays, its config and tokenizer. What
`loader_gguf.load_gguf` makes a Checkpoint of, and what the torch-free generation path
(lite.py) runs from. llama.cpp stores the Q/K rows of `llama` models permuted for its
interleaved rotary embedding; we undo that so one rotary implementation serves both formats."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tttr.engine.errors import EngineError
from tttr.engine.inference.config import ModelConfig
from tttr.engine.inference.tokenizer import Tokenizer
from tttr.kernels.array_ops import QUANT_FORMATS
from tttr.sessions.cache import cache_dir

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",  # Qwen3
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
}
_GGUF_MAGIC = b"GGUF"


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == _GGUF_MAGIC
    except OSError:
        return False


def open_reader(path: Path):
    """gguf's reader of `path`. Any parse failure (a text file, an empty or truncated one)
    means the file is not a usable GGUF: the user's mistake, said in one line."""
    try:
        import gguf  # ~0.1 s: imported only where a file is parsed

        return gguf.GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a usable GGUF"
        raise EngineError(f"{path} is not a readable GGUF file ({exc}): pass a .gguf model or a model folder") from exc


def _field(field):
    try:
        return field.contents()
    except Exception:  # noqa: BLE001 - a field we cannot parse is a field we do not use
        return None


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute` (convert_hf_to_gguf.py) for q/k rows."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `permute`, for writing test files the way the converter does."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass(frozen=True)
class _Tensor:
    name: str
    tensor_type: str  # a gguf.GGMLQuantizationType name: F32, Q4_1, ...
    shape: tuple[int, ...]
    data: np.ndarray  # a view of the mapped file, as GGUFReader gives it
    offset: int  # of data in the file


_HEADER_FORMAT = 1  # bump when what _read_header caches changes


def _read_header(path: Path) -> tuple[dict, list[_Tensor]]:
    """The file's metadata fields and its tensors (views of the mapped file). GGUFReader
    parses every metadata item through numpy (~5 s for the default model's 49k-token
    vocabulary); what it found is cached under the cache directory, keyed by the file's path,
    size and mtime, so later loads map the file and slice it at the recorded offsets."""
    st = path.stat()
    key = hashlib.blake2b(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode(), digest_size=12).hexdigest()
    cache = cache_dir() / "gguf" / f"{path.stem}-{key}.json"
    header = None
    try:
        header = json.loads(cache.read_text())
        if header.get("format") != _HEADER_FORMAT:
            header = None
    except (OSError, ValueError, AttributeError):
        header = None
    if header is None:
        reader = open_reader(path)  # a parse only on a cache miss
        fields = {name: _field(f) for name, f in reader.fields.items()}
        header = {"format": _HEADER_FORMAT, "fields": fields, "tensors": [
            {"name": t.name, "type": t.tensor_type.name, "shape": [int(d) for d in t.shape],
             "offset": int(t.data_offset), "dtype": t.data.dtype.str, "data_shape": list(t.data.shape)}
            for t in reader.tensors]}
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(header))
            os.replace(tmp, cache)
        except (OSError, TypeError, ValueError):
            pass  # an unwritable cache (or a field JSON cannot hold) only costs a parse next time
    mapped = np.memmap(path, mode="r")
    tensors = []
    for t in header["tensors"]:
        dtype = np.dtype(t["dtype"])
        count = int(np.prod(t["data_shape"]))
        if t["offset"] + count * dtype.itemsize > mapped.size:
            raise EngineError(f"{path} is truncated: tensor {t['name']!r} runs past the end of the file")
        data = np.ndarray(t["data_shape"], dtype=dtype, buffer=mapped, offset=t["offset"])
        tensors.append(_Tensor(t["name"], t["type"], tuple(t["shape"]), data, t["offset"]))
    return header["fields"], tensors


def _read(path: Path, t: _Tensor) -> np.ndarray:
    """A tensor's bytes read from the file, not touched through the mapping: a mapped page
    stays in the process's resident set (in 1 MB steps here) until the whole file is unmapped."""
    return np.fromfile(path, dtype=t.data.dtype, count=t.data.size, offset=t.offset).reshape(t.data.shape)


def _dense(data: np.ndarray, tensor_type: str) -> np.ndarray:
    """fp32 values of a tensor's stored data (F32 and F16 as numpy holds them, others by gguf)."""
    if tensor_type in ("F32", "F16"):
        return data.astype(np.float32, copy=False)
    import gguf

    return np.asarray(gguf.quants.dequantize(data, gguf.GGMLQuantizationType[tensor_type]), dtype=np.float32)


class _StoredBlocks(Mapping):
    """Checkpoint.quantized for a GGUF file: name -> (format, raw rows), each read from the file
    when asked (rows un-permuted where llama's Q/K need it), so that a weight's bytes are held
    only while the model packs them, never all at once beside the packed copies (a mapped
    file's pages count as the process's memory once touched, until it is unmapped)."""

    def __init__(self, path: Path):
        self.path = path
        self.where: dict[str, tuple[str, _Tensor, int | None]] = {}  # name -> (format, tensor, Q/K heads)

    def __getitem__(self, name: str) -> tuple[str, np.ndarray]:
        fmt, t, heads = self.where[name]
        raw = _read(self.path, t)
        return fmt, raw if heads is None else unpermute_qk(raw, heads)  # whole rows move, blocks intact

    def __contains__(self, name) -> bool:
        return name in self.where  # without reading the tensor (Mapping's default would)

    def __iter__(self):
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


@dataclass
class GGUFContents:
    """What a GGUF file holds, in the engine's terms (Hugging Face tensor names)."""

    config: ModelConfig
    arrays: dict[str, np.ndarray]  # fp32 C-contiguous arrays, the names not in `quantized`
    quantized: _StoredBlocks  # name -> (GGUF type, raw rows), read when asked
    tokenizer: Tokenizer


def read_gguf(path: Path) -> GGUFContents:
    fields, reader_tensors = _read_header(path)
    config = ModelConfig.from_gguf(fields, {t.name for t in reader_tensors}, path.name)
    arch, n_heads = config.arch, config.n_heads
    arrays: dict[str, np.ndarray] = {}
    quantized = _StoredBlocks(path)
    for t in reader_tensors:
        if t.name in _GLOBAL_NAMES:
            hf = _GLOBAL_NAMES[t.name]
        elif t.name.startswith("blk."):
            _, idx, rest = t.name.split(".", 2)
            if rest not in _LAYER_NAMES:
                raise EngineError(f"unexpected tensor {t.name!r} in {path.name}: not a plain {arch} decoder")
            hf = f"model.layers.{idx}.{_LAYER_NAMES[rest]}"
        else:
            continue
        heads = None
        if arch == "llama" and (".attn_q." in t.name or ".attn_k." in t.name):
            heads = n_heads if ".attn_q." in t.name else config.n_kv_heads
        if t.tensor_type in QUANT_FORMATS and len(t.shape) == 2:
            # kept as stored: the model runs its products from these blocks, and expands them
            # (Checkpoint.dense) only where it needs the fp32 values
            quantized.where[hf] = (t.tensor_type, t, heads)
            continue
        try:
            arr = _dense(_read(path, t), t.tensor_type)
        except NotImplementedError:  # gguf reads the type's name but cannot dequantize it (Q8_1, Q8_K, I8, ...)
            raise EngineError(
                f"unsupported quantization type {t.tensor_type} (tensor {t.name!r} in {path.name}): products run "
                f"from {', '.join(QUANT_FORMATS)} blocks, and F32, F16, BF16 and the types the gguf package "
                "dequantizes (Q2_K, Q3_K, IQ*, TQ*, ...) load as fp32") from None
        if heads is not None:
            arr = unpermute_qk(arr, heads)
        arrays[hf] = np.array(arr, dtype=np.float32, order="C", copy=True)
    return GGUFContents(config, arrays, quantized, Tokenizer.from_gguf_fields(fields))
