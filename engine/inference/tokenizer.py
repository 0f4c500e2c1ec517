"""Byte-level BPE tokenizer (the `tokenizers` package), built from GGUF metadata or from a
Hugging Face tokenizer.json. Special tokens (GGUF token type 3, or `special` added tokens)
are matched whole in the text, so a rendered chat template keeps its markers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

from tttr.engine.inference.chat_template import render_chat_template
from tttr.engine.errors import EngineError

# GGUF token types
_CONTROL = 3
_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
           "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}

# Tokens that end a turn in common chat formats; used as default stop ids when present.
_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<|end|>")


def _pre_tokenizer(pre: str | None):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        # SmolLM's tokenizer.json: every digit on its own, then GPT-2's byte-level split.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = _SPLITS.get(pre or "")
    if split is not None:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    return byte_level


class Tokenizer:
    """`encode`, `decode`, `apply_chat_template`, and the ids a caller needs to stop on."""

    def __init__(self, backend: HFTokenizer, *, bos_token_id: int | None, eos_token_id: int | None,
                 add_bos: bool, chat_template: str | None, vocab_size: int):
        self._tk = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.vocab_size = vocab_size
        ends = {backend.token_to_id(t) for t in _END_TOKENS} - {None}
        if eos_token_id is not None:
            ends.add(eos_token_id)
        self.stop_token_ids: tuple[int, ...] = tuple(sorted(ends))

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_gguf_fields(cls, fields: dict) -> "Tokenizer":
        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise EngineError(
                f"unsupported GGUF tokenizer {kind!r}: only byte-level BPE ('gpt2') is supported; "
                "use a Hugging Face folder with tokenizer.json instead"
            )
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
        vocab = {t: i for i, t in enumerate(tokens)}
        bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=False)
        tk = HFTokenizer(bpe)
        tk.pre_tokenizer = _pre_tokenizer(fields.get("tokenizer.ggml.pre"))
        tk.decoder = decoders.ByteLevel()
        special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == _CONTROL]
        user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
        if special:
            tk.add_special_tokens(special)
        if user:
            tk.add_tokens(user)
        return cls(
            tk,
            bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=fields.get("tokenizer.ggml.eos_token_id"),
            add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=fields.get("tokenizer.chat_template"),
            vocab_size=len(tokens),
        )

    @classmethod
    def from_hf_folder(cls, folder: Path, config: dict, vocab_size: int) -> "Tokenizer":
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise EngineError(f"{folder} has no tokenizer.json: a Hugging Face model folder needs one")
        tk = HFTokenizer.from_file(str(path))
        tcfg = _read_json(folder / "tokenizer_config.json")
        gen = _read_json(folder / "generation_config.json")
        template = tcfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja = folder / "chat_template.jinja"
        if template is None and jinja.is_file():
            template = jinja.read_text()

        def token_id(name: str) -> int | None:
            for source in (gen, config):
                value = source.get(f"{name}_token_id")
                if isinstance(value, list):
                    value = value[0] if value else None
                if value is not None:
                    return int(value)
            tok = tcfg.get(f"{name}_token")
            if isinstance(tok, dict):
                tok = tok.get("content")
            return tk.token_to_id(tok) if tok else None

        return cls(tk, bos_token_id=token_id("bos"), eos_token_id=token_id("eos"),
                   add_bos=bool(tcfg.get("add_bos_token", False)), chat_template=template,
                   vocab_size=vocab_size)

    # -- use ---------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; special tokens written in the text are matched whole.
        `add_bos=None` follows the model (and never doubles a BOS the text already has)."""
        ids = self._tk.encode(text, add_special_tokens=False).ids
        if add_bos is None:
            add_bos = self.add_bos and not (ids and ids[0] == self.bos_token_id)
        if add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self._tk.decode([int(token_id)], skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        def text(tid):
            return self._tk.id_to_token(tid) if tid is not None else ""

        return render_chat_template(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=text(self.bos_token_id), eos_token=text(self.eos_token_id))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineError(f"cannot read {path}: {exc}") from exc
