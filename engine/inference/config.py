"""The shape of a Llama-family decoder, read from GGUF metadata or a config.json."""

from __future__ import annotations

from dataclasses import dataclass

from tttr.engine.errors import EngineError

# Architectures this decoder implements (the names GGUF and config.json use).
GGUF_ARCHS = ("llama", "qwen2")
HF_ARCHS = {"llama": "llama", "qwen2": "qwen2", "mistral": "llama"}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    arch: str  # "llama" | "qwen2"
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_eps: float
    tied_embeddings: bool
    attn_bias: bool  # Qwen2 has biases on q/k/v
    # Llama 3.x "llama3" rope scaling: (factor, low_freq_factor, high_freq_factor, original_max_pos)
    rope_scaling: tuple[float, float, float, int] | None = None

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
        if rs and rs.get("rope_type", rs.get("type")) == "llama3":
            scaling = (float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"]),
                       int(rs["original_max_position_embeddings"]))
        elif rs and rs.get("rope_type", rs.get("type")) not in (None, "default"):
            raise EngineError(f"unsupported rope scaling {rs!r} in config.json: only 'llama3' and none are supported")
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
        )
