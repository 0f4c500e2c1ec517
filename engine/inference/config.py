"""The shape of a Llama-family decoder, read from GGUF metadata or a config.json."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from tttr.engine.errors import EngineError

# Architectures this decoder implements (the names GGUF and config.json use).
GGUF_ARCHS = ("llama", "qwen2", "qwen3")
HF_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama"}
ROPE_SCALINGS = ("none", "linear", "llama3")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Rotary frequency scaling. "linear": every frequency divided by `factor`. "llama3"
    (Llama 3.1+): low frequencies divided by `factor`, high ones kept, those between
    interpolated, the bands set by `original_context` / `low_freq_factor` and / `high_freq_factor`."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "llama3"):
            raise EngineError(f"rope scaling {self.kind!r} is not supported: supported are {', '.join(ROPE_SCALINGS)}")
        if not self.factor > 0:
            raise EngineError(f"rope scaling factor={self.factor!r} must be positive")
        if self.kind == "llama3" and not (0 < self.low_freq_factor < self.high_freq_factor and self.original_context > 0):
            raise EngineError(
                f"llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and original_context > 0, "
                f"got {self.low_freq_factor!r}, {self.high_freq_factor!r}, {self.original_context!r}")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    arch: str  # "llama" | "qwen2" | "qwen3"
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # may differ from d_model / n_heads (Qwen3)
    ffn_dim: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_eps: float
    tied_embeddings: bool
    attn_bias: bool  # Qwen2 has biases on q/k/v
    rope_scaling: RopeScaling | None = None
    qk_norm: bool = False  # Qwen3: an RMSNorm over each query and key head before the rotary embedding

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size",
                     "context_length"):
            if getattr(self, name) <= 0:
                raise EngineError(f"model config field {name}={getattr(self, name)!r} must be positive")
        if self.n_heads % self.n_kv_heads:
            raise EngineError(
                f"model config: n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise EngineError(f"model config: head_dim={self.head_dim} must be even for rotary embeddings")

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        model_type = cfg.get("model_type", "")
        arch = HF_ARCHS.get(model_type)
        if arch is None:
            raise EngineError(
                f"unsupported architecture {model_type!r} in config.json: supported are "
                f"{', '.join(sorted(HF_ARCHS))} (Llama-family decoders)"
            )
        n_heads = int(cfg["num_attention_heads"])
        d = int(cfg["hidden_size"])
        scaling = None
        rs = cfg.get("rope_scaling") or cfg.get("rope_parameters")
        kind = rs.get("rope_type", rs.get("type")) if rs else None
        if kind == "llama3":
            scaling = RopeScaling("llama3", float(rs["factor"]), float(rs["low_freq_factor"]),
                                  float(rs["high_freq_factor"]), int(rs["original_max_position_embeddings"]))
        elif kind == "linear":
            scaling = RopeScaling("linear", float(rs["factor"]))
        elif kind not in (None, "default"):
            raise EngineError(f"unsupported rope scaling {kind!r} in config.json: supported are {', '.join(ROPE_SCALINGS)}")
        theta = cfg.get("rope_theta")
        if theta is None and rs:
            theta = rs.get("rope_theta")
        return cls(
            arch=arch,
            n_layers=int(cfg["num_hidden_layers"]),
            d_model=d,
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or d // n_heads),
            ffn_dim=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            context_length=int(cfg.get("max_position_embeddings") or 2048),
            rope_theta=float(theta or 10000.0),
            rms_eps=float(cfg.get("rms_norm_eps") or 1e-6),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attn_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            rope_scaling=scaling,
            qk_norm=arch == "qwen3",
        )

    @classmethod
    def from_gguf(cls, fields: Mapping, tensors: Collection[str], source: str) -> "ModelConfig":
        """From a GGUF file's metadata (`fields`, keys as llama.cpp's converter writes them)
        and the names of its tensors; `source` names the file in errors."""
        arch = fields.get("general.architecture")
        if arch not in GGUF_ARCHS:
            raise EngineError(
                f"unsupported architecture {arch!r} in {source}: supported are {', '.join(GGUF_ARCHS)} "
                "(Llama-family decoders: Llama 3.x, SmolLM2, Qwen2/2.5, Qwen3)"
            )

        def meta(key, default=None):
            value = fields.get(f"{arch}.{key}")
            return default if value is None else value

        def need(key):
            value = meta(key)
            if value is None:
                raise EngineError(f"{source} lacks the metadata {arch}.{key}: not a complete {arch} GGUF file")
            return value

        n_heads = int(need("attention.head_count"))
        d = int(need("embedding_length"))
        head_dim = int(meta("attention.key_length", d // n_heads))
        for key in ("attention.value_length", "rope.dimension_count"):  # a rotary or value size of its own
            if meta(key) is not None and int(meta(key)) != head_dim:
                raise EngineError(f"unsupported {arch}.{key}={meta(key)} in {source}: this decoder needs it equal to "
                                  f"the head size {head_dim}")
        tokens = fields.get("tokenizer.ggml.tokens") or []
        return cls(
            arch=arch,
            n_layers=int(need("block_count")),
            d_model=d,
            n_heads=n_heads,
            n_kv_heads=int(meta("attention.head_count_kv", n_heads)),
            head_dim=head_dim,
            ffn_dim=int(need("feed_forward_length")),
            vocab_size=int(meta("vocab_size", len(tokens))),
            context_length=int(meta("context_length", 2048)),
            rope_theta=float(meta("rope.freq_base", 10000.0)),
            rms_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
            tied_embeddings="output.weight" not in tensors,
            attn_bias="blk.0.attn_q.bias" in tensors,
            rope_scaling=_gguf_rope_scaling(meta, "rope_freqs.weight" in tensors, f"{arch}.", source),
            qk_norm=arch == "qwen3",
        )


def _gguf_rope_scaling(meta, has_freqs: bool, prefix: str, source: str) -> RopeScaling | None:
    """`rope.scaling.*` as llama.cpp reads it. Llama 3.x files from llama.cpp's converter carry
    their "llama3" scaling as a `rope_freqs.weight` tensor of per-frequency divisors (the model
    applies it); a file that names the type instead gets it computed from factor and
    original_context_length (low/high_freq_factor default to Llama 3.x's 1 and 4, as the
    converter's do)."""
    kind = meta("rope.scaling.type")
    factor = meta("rope.scaling.factor")
    if kind in (None, "none"):
        linear = meta("rope.scale_linear")  # older files' linear factor
        return RopeScaling("linear", float(linear)) if linear not in (None, 1.0) else None
    if kind == "linear":
        if factor is None:
            raise EngineError(f"{source} has linear rope scaling but no {prefix}rope.scaling.factor")
        return RopeScaling("linear", float(factor))
    if kind == "llama3":
        if has_freqs:
            return None
        missing = [prefix + k for k in ("rope.scaling.factor", "rope.scaling.original_context_length") if meta(k) is None]
        if missing:
            raise EngineError(f"{source} has llama3 rope scaling but neither a rope_freqs.weight tensor nor "
                              f"{' and '.join(missing)} to compute it from")
        return RopeScaling("llama3", float(factor), float(meta("rope.scaling.low_freq_factor", 1.0)),
                           float(meta("rope.scaling.high_freq_factor", 4.0)),
                           int(meta("rope.scaling.original_context_length")))
    raise EngineError(f"unsupported rope scaling {kind!r} in {source}: supported are {', '.join(ROPE_SCALINGS)}")
