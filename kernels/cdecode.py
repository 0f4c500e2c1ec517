"""A decode step's layers in one compiled call: the per-op path's kernels, driven from C.

When every row of a pass decodes one token (a single stream, or the engine's running
sequences each at their next position), `Model.forward` spends most of a step on Python
between kernels: each of a layer's ten ops is a ctypes call plus tensor allocation and
views, about 4 ms a step for the default model's 30 layers. `decode` runs all the layers
in one call instead: C code that calls the very same compiled functions the per-op path
calls (kernels.crow's norms, rotary and SwiGLU, kernels.cquant's block products,
kernels.cattention's attention, reached through their function pointers) on the same
inputs in the same order, and does the rest itself (copies, and the bias add, one
rounding as in PyTorch). So its results are the per-op path's bits, in every kernel
mode (on this path `fast` and `invariant` run those same compiled kernels, and
`invariant-q8` the same with kernels.cq8's 8-bit-activation products in place of
cquant's: one function pointer, the same arguments, the parts' layouts carrying their
activation kinds), and it is batch-invariant exactly as they are.

Per layer: qkv product (+ bias) (-> Qwen3's RMSNorm of each query and key head) -> rotary on the query and key heads -> the new key and
value written to the cache -> attention -> o product -> residual add + norm -> gate/up
product -> SwiGLU -> down product -> residual add + the next norm. The embedding before and
the head after stay in `Model.forward`.

It applies (`decode` returns None otherwise and the model runs its ops one by one) to fp32
models whose layer products are all block weights (under `invariant-q8`, all of types
kernels.cq8 takes, when it is built) and whose layers hold nothing else the
per-op path would use, when the compiled kernels are there, and to passes
whose rows each decode one token, in caches that are slots of one KV pool or in one
sequence's own cache.

Importing this module does not import torch: the torch-free generation path
(engine/inference/lite.py) makes a `_Plan` of its numpy-held model and calls `tttr_decode`
itself; `_plan` and `decode` import torch when called."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ctypes
import weakref
from pathlib import Path

from tttr.kernels import cattention, cq8, cquant, crow
from tttr.sessions.cache import CLibrary, c_source

if TYPE_CHECKING:  # the wrappers import torch when called: the torch-free path never does
    import torch

SOURCE = c_source(Path(__file__).with_name("cdecode.c"))

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-fast-math", "-fno-trapping-math", "-ffp-contract=off", "-shared", "-fPIC"]

_p, _i64 = ctypes.c_void_p, ctypes.c_int64


class _Product(ctypes.Structure):
    _fields_ = [("nparts", ctypes.c_int), ("layouts", _p), ("blocks", _p), ("rows", _p), ("n", _i64), ("k", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", _p), ("post_norm", _p), ("qkv_bias", _p), ("q_norm", _p), ("k_norm", _p),
                ("qkv", _Product), ("o", _Product), ("gate_up", _Product), ("down", _Product)]


class _Model(ctypes.Structure):
    _fields_ = [("qparts", _p), ("qone", _p), ("rms", _p), ("add_rms", _p), ("rope", _p), ("silu", _p), ("attn", _p),
                ("n_layers", _i64), ("d", _i64), ("H", _i64), ("KVH", _i64), ("D", _i64), ("F", _i64),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("layers", _p), ("final_norm", _p)]


def _declare(lib) -> None:
    p, i = _p, _i64
    lib.tttr_decode.argtypes = [p, p, p, i, p, p, p, p, p, i, i, i, i, i, p, p, i, ctypes.c_int]
    lib.tttr_decode.restype = ctypes.c_int


_library = CLibrary("decode", SOURCE, _FLAGS, "the compiled decode step", _declare)


def available() -> bool:
    return _library.available() and crow.available() and cquant.available() and cattention.available()


# the layer fields the compiled step runs; any other a model's layers hold must be None
_LAYER_FIELDS = {"input_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o", "post_attention_norm", "gate_up", "down"}
_PRODUCTS = ("qkv", "o", "gate_up", "down")


def _fn(lib, name: str) -> int | None:
    f = getattr(lib, name, None)
    return None if f is None else ctypes.cast(f, ctypes.c_void_p).value


class _Plan:
    """The model as the compiled step reads it, made once per model and product kind: the
    structures and every array they point into (kept alive here). `q8`: the products are
    kernels.cq8's (8-bit activations, `invariant-q8`), each part's layout code carrying its
    activation kind; else kernels.cquant's."""

    def __init__(self, model, q8: bool = False) -> None:
        cfg = model.config
        keep = self._keep = []

        def arr(ctype, values):
            a = (ctype * len(values))(*values)
            keep.append(a)
            return ctypes.addressof(a)

        def product(qw) -> _Product:
            parts = getattr(qw, "parts", None)
            if parts is None:  # one part (kernels.cquant before stacked parts)
                layouts, blocks, rows = [cquant.FORMATS.index(qw.fmt)], [qw.data.ctypes.data], [qw.shape[0]]
            else:
                layouts = cq8.formats(qw) if q8 else [p.layout for p in parts]
                blocks, rows = [p.data.ctypes.data for p in parts], [p.n for p in parts]
            keep.append(qw)
            return _Product(len(layouts), arr(ctypes.c_int, layouts), arr(ctypes.c_void_p, blocks),
                            arr(ctypes.c_int64, rows), qw.shape[0], qw.shape[1])

        def tensor(t):
            if t is None:
                return None
            keep.append(t)
            return t.data_ptr() if hasattr(t, "data_ptr") else t.ctypes.data  # a tensor, or a numpy array

        layers = (_Layer * len(model.layers))()
        for dst, w in zip(layers, model.layers):
            dst.input_norm, dst.post_norm = tensor(w.input_norm), tensor(w.post_attention_norm)
            dst.qkv_bias = tensor(w.qkv_bias)
            dst.q_norm, dst.k_norm = tensor(getattr(w, "q_norm", None)), tensor(getattr(w, "k_norm", None))
            dst.qkv, dst.o, dst.gate_up, dst.down = product(w.qkv), product(w.o), product(w.gate_up), product(w.down)
        keep.append(layers)
        ql, rl, al = cquant.load(), crow.load(), cattention.load()
        qparts, qone = ((_fn(cq8.load(), "tttr_q8_linear_parts"), None) if q8
                        else (_fn(ql, "tttr_qlinear_parts"), _fn(ql, "tttr_qlinear")))
        self.model = _Model(
            qparts, qone, _fn(rl, "tttr_rms_norm"),
            _fn(rl, "tttr_add_rms_norm"), _fn(rl, "tttr_rope"), _fn(rl, "tttr_silu_mul"), _fn(al, "tttr_attention"),
            cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, model.layers[0].down.shape[1],
            cfg.rms_eps, model.scale, ctypes.addressof(layers), tensor(model.norm))


def q8_applies(layers) -> bool:
    """Whether kernels.cq8 is built and takes every product of `layers` (block weights): then
    the `invariant-q8` plan multiplies with 8-bit activations, as that mode's ops do one by one."""
    return cq8.available() and all(getattr(getattr(w, f), "parts", None) is not None and cq8.supports(getattr(w, f))
                                   for w in layers for f in _PRODUCTS)


# model -> ((its layers list, its final norm) when the plans were made, {q8: the plan or None})
_plans: "weakref.WeakKeyDictionary[object, tuple[tuple, dict[bool, _Plan | None]]]" = weakref.WeakKeyDictionary()


def _plan(model, q8: bool = False) -> _Plan | None:
    """The model's plan (`q8`: with kernels.cq8's products), or None when the compiled step
    cannot run it (decided once per model and kind, again if its layers or final norm are
    replaced)."""
    made = _plans.get(model)
    if made is None or made[0][0] is not model.layers or made[0][1] is not model.norm:
        made = _plans[model] = ((model.layers, model.norm), {})
    if q8 not in made[1]:
        made[1][q8] = _make_plan(model, q8)
    return made[1][q8]


def _make_plan(model, q8: bool) -> _Plan | None:
    import torch

    plan = None
    layers = model.layers
    if model.dtype == torch.float32 and model.device.type == "cpu" and available() and layers \
            and all((getattr(w, "q_norm", None) is None) == (getattr(w, "k_norm", None) is None) for w in layers) \
            and all(getattr(w, f) is None for w in layers for f in w._fields if f not in _LAYER_FIELDS) \
            and all(getattr(w, f).__class__ is cquant.QuantWeight for w in layers for f in _PRODUCTS) \
            and all(t.dtype == torch.float32 and t.is_contiguous() for w in layers
                    for t in (w.input_norm, w.post_attention_norm, w.qkv_bias, getattr(w, "q_norm", None),
                              getattr(w, "k_norm", None)) if t is not None) \
            and model.norm.dtype == torch.float32 and model.norm.is_contiguous() \
            and (_fn(cquant.load(), "tttr_qlinear_parts") is not None
                 or all(len(getattr(getattr(w, f), "parts", (0,))) == 1 for w in layers for f in _PRODUCTS)) \
            and (not q8 or q8_applies(layers)):
        plan = _Plan(model, q8)
    return plan


def _kv(t: torch.Tensor) -> bool:
    """fp32 with contiguous [KVH, D] rows, as the attention kernel reads them in place."""
    import torch

    return t is not None and t.dtype == torch.float32 and t.stride(-1) == 1 and t.stride(-2) == t.shape[-1]


def decode(model, x: torch.Tensor, positions: torch.Tensor, segments, q8: bool = False) -> torch.Tensor | None:
    """The layers of a pass whose rows each decode one token, compiled: x [R, d] is the
    embedded tokens (a fresh tensor: the residual stream is updated in it); returns the final
    norm's output [R, d] (what the head multiplies), the per-op path's bits (`q8`: those of
    `invariant-q8`, kernels.cq8's products). None when this pass or model is not one the
    compiled step runs (see the module docstring): the caller runs the ops one by one."""
    import torch

    R = x.shape[0]
    if not segments or len(segments) != R or any(s.end - s.start != 1 for s in segments) \
            or x.dtype != torch.float32 or not x.is_contiguous() or tuple(x.shape) != (R, model.config.d_model):
        return None
    plan = _plan(model, q8)
    if plan is None:
        return None
    caches = [s.cache for s in segments]
    pool = caches[0].pool
    if pool is not None and pool.k is not None and all(c.pool is pool for c in caches):
        k, v = pool.k, pool.v  # [layers, slots, capacity, KVH, D]
        seq, n_seq = [c.slot for c in caches], k.shape[1]
        layer_stride, seq_stride, row_stride, n_keys = k.stride(0), k.stride(1), k.stride(2), k.shape[2]
    elif len(caches) == 1 and pool is None:
        k, v = caches[0].k, caches[0].v  # [layers, capacity, KVH, D]
        seq, n_seq = [0], 1
        layer_stride, seq_stride, row_stride, n_keys = k.stride(0), 0, k.stride(1), k.shape[1]
    else:
        return None
    if not (_kv(k) and _kv(v) and k.stride() == v.stride() and k.shape == v.shape) \
            or any(c.length >= c.capacity for c in caches):
        return None
    order = [s.start for s in segments]
    kv_pos = torch.tensor([c.length for c in caches], dtype=torch.int64)
    seq_t = torch.tensor(seq, dtype=torch.int64)
    if order != list(range(R)):  # arrays are by row
        inv = torch.tensor(order, dtype=torch.int64).argsort()
        kv_pos, seq_t = kv_pos[inv].contiguous(), seq_t[inv].contiguous()
    rope_pos = positions.to(torch.int64).contiguous()
    cos, sin = model._cos, model._sin
    h = torch.empty_like(x)
    status = _library.load().tttr_decode(
        ctypes.addressof(plan.model), x.data_ptr(), h.data_ptr(), R, rope_pos.data_ptr(), kv_pos.data_ptr(),
        seq_t.data_ptr(), k.data_ptr(), v.data_ptr(), layer_stride, seq_stride, row_stride, n_seq, n_keys,
        cos.data_ptr(), sin.data_ptr(), cos.shape[0], torch.get_num_threads())
    if status:
        raise ValueError(f"compiled decode step failed (status {status}): a size or position out of range")
    return h
