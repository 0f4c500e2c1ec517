"""A tiny random Llama/Qwen2 that engine tests write themselves: as GGUF (with llama.cpp's
Q/K permutation) and as a Hugging Face folder (config.json + safetensors + tokenizer.json)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("e", "ll"), ("h", "ell"), ("Ġ", "w")]
TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def byte_alphabet() -> list[str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def vocab_tokens() -> list[str]:
    return byte_alphabet() + ["".join(m) for m in MERGES] + SPECIALS


def tiny_config(arch: str = "llama", tied: bool = False) -> dict:
    tokens = vocab_tokens()
    return {
        "model_type": arch,
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": len(tokens), "max_position_embeddings": 96, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": tied, "attention_bias": arch == "qwen2",
        "bos_token_id": tokens.index("<|im_start|>"), "eos_token_id": tokens.index("<|im_end|>"),
        "torch_dtype": "float32",
    }


def tiny_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, h, kv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def r(*shape, s=0.08):
        return (torch.randn(*shape, generator=g) * s).contiguous()

    w = {"model.embed_tokens.weight": r(v, d, s=0.5), "model.norm.weight": 1 + r(d, s=0.1)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = r(v, d, s=0.2)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + r(d, s=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + r(d, s=0.1)
        w[p + "self_attn.q_proj.weight"] = r(h * hd, d)
        w[p + "self_attn.k_proj.weight"] = r(kv * hd, d)
        w[p + "self_attn.v_proj.weight"] = r(kv * hd, d)
        w[p + "self_attn.o_proj.weight"] = r(d, h * hd)
        if cfg["attention_bias"]:
            w[p + "self_attn.q_proj.bias"] = r(h * hd, s=0.2)
            w[p + "self_attn.k_proj.bias"] = r(kv * hd, s=0.2)
            w[p + "self_attn.v_proj.bias"] = r(kv * hd, s=0.2)
        w[p + "mlp.gate_proj.weight"] = r(f, d)
        w[p + "mlp.up_proj.weight"] = r(f, d)
        w[p + "mlp.down_proj.weight"] = r(d, f)
    return w


def tokenizer_backend():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = vocab_tokens()
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return tk


def write_hf_folder(folder: Path, cfg: dict, weights: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    tokenizer_backend().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": TEMPLATE, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
    }))
    return folder


_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


# fp16 scale magnitudes for random blocks: weights of a few hundredths, as a trained model's
_BLOCK_SCALES = {"Q4_1": (3e-3, 1e-2), "Q8_0": (2e-4, 6e-4), "Q5_0": (1e-3, 4e-3), "Q4_K": (5e-5, 2e-4),
                 "Q5_K": (2.5e-5, 1e-4), "Q6_K": (1e-5, 4e-5)}


def random_blocks(fmt: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """GGUF rows [n, bytes] uint8 of type `fmt` (one of _BLOCK_SCALES) with random quant bytes
    (scales, minimums, high bits: every bit pattern) and random fp16 scales of either sign,
    subnormal ones included: valid blocks that gguf's quantizer need not have written."""
    import gguf

    inputs, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt]]
    nb = k // inputs
    raw = rng.integers(0, 256, size=(n, nb, nbytes), dtype=np.uint8)
    lo, hi = _BLOCK_SCALES[fmt]

    def put(offset: int, signed: bool = True) -> None:
        vals = rng.uniform(lo, hi, (n, nb)) * (rng.choice([-1.0, 1.0], (n, nb)) if signed else 1.0)
        raw[:, :, offset:offset + 2] = vals.astype(np.float16).view(np.uint8).reshape(n, nb, 2)

    if fmt == "Q6_K":
        put(208)
    else:
        put(0)
        if fmt in ("Q4_1", "Q4_K", "Q5_K"):
            put(2)  # Q4_1's minimum, the K-quants' dmin
    return raw.reshape(n, nb * nbytes)


def gguf_tensor(name: str, t, arch: str, heads: int, kv_heads: int, layer_names: dict = _GGUF_LAYER):
    """A Hugging Face tensor as llama.cpp's converter writes it: its GGUF name, and its fp32
    values (q/k rows permuted for arch "llama")."""
    from tttr.engine.inference.loader_gguf import permute_qk

    a = t.numpy().astype(np.float32)
    if name == "model.embed_tokens.weight":
        return "token_embd.weight", a
    if name == "model.norm.weight":
        return "output_norm.weight", a
    if name == "lm_head.weight":
        return "output.weight", a
    _, _, idx, rest = name.split(".", 3)
    if arch == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
        a = permute_qk(a, heads if "q_proj" in rest else kv_heads)
    return f"blk.{idx}.{layer_names[rest]}", a


def write_gguf(path: Path, cfg: dict, weights: dict[str, torch.Tensor], arch: str | None = None,
               quant=None) -> Path:
    """`quant` ("Q4_1", "Q8_0", ...): store the 2-D weights quantized as llama.cpp would (the
    embedding as Q8_0, as the default model's file does); norms stay F32. A type gguf cannot
    quantize (the K-quants) is written as random blocks of that type in the weight's shape
    (random_blocks: the file's weights are then those blocks' values). `quant` may also be a
    function of the GGUF tensor name giving its type (a file of mixed types)."""
    import gguf

    arch = arch or cfg["model_type"]
    tokens = vocab_tokens()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-" + arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    write_tensors(w, weights, arch, cfg["num_attention_heads"], cfg["num_key_value_heads"], quant)
    return path


def write_tensors(w, weights: dict[str, torch.Tensor], arch: str, heads: int, kv_heads: int, quant=None,
                  layer_names: dict = _GGUF_LAYER) -> None:
    """Add `weights` to the GGUFWriter `w` as llama.cpp's converter writes them (gguf_tensor;
    `quant` as write_gguf takes it) and write the file."""
    import gguf

    for name, t in weights.items():
        gname, a = gguf_tensor(name, t, arch, heads, kv_heads, layer_names)
        if quant and a.ndim == 2:
            fmt = "Q8_0" if gname == "token_embd.weight" else quant(gname) if callable(quant) else quant
            qtype = gguf.GGMLQuantizationType[fmt]
            if fmt in ("Q4_K", "Q5_K", "Q6_K"):
                rng = np.random.default_rng(zlib.crc32(gname.encode()))
                raw = random_blocks(fmt, a.shape[0], a.shape[1], rng)
            else:
                raw = gguf.quants.quantize(np.ascontiguousarray(a), qtype)
            w.add_tensor(gname, raw, raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
