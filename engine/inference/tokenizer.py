"""Byte-level BPE tokenizer (the `tokenizers` package), built from GGUF metadata (the
pre-tokenizer split, BOS and end-of-turn rules llama.cpp applies per `tokenizer.ggml.pre`) or
from a Hugging Face tokenizer.json. Special tokens (GGUF token type 3, or `special` added tokens)
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

# Pre-tokenizer splits per `tokenizer.ggml.pre`, as llama.cpp's llama-vocab.cpp assigns them
# (its regexes, written the way the models' tokenizer.json files do).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Llama 3's group: the regex above, a word found whole in the vocabulary is one token
# (ignore_merges), and a BOS unless tokenizer.ggml.add_bos_token says otherwise.
_LLAMA3_PRES = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")
_SPLITS: dict[str, tuple[str, ...]] = {
    **{pre: (_LLAMA3_SPLIT,) for pre in (*_LLAMA3_PRES, "dbrx", "smaug-bpe")},
    **{pre: (_QWEN2_SPLIT,) for pre in ("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2")},
    # every digit on its own, then GPT-2's split (SmolLM's tokenizer.json does the same)
    **{pre: (r"\p{N}", _GPT2_SPLIT) for pre in ("smollm", "starcoder", "refact", "command-r", "codeshell",
                                                "exaone", "minerva-7b")},
    **{pre: (_GPT2_SPLIT,) for pre in ("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de",
                                       "trillion", "granite-docling", "exaone4")},
    # no type (or "default"): GPT-2's split, as transformers reads such a file. llama.cpp's
    # "default" also cuts runs of digits into threes and punctuation apart; no converter
    # writes it for a byte-level BPE vocabulary it knows.
    "default": (_GPT2_SPLIT,),
}

# Tokens that end a turn in common chat formats; used as stop ids when present (llama.cpp's
# end-of-generation list: Llama 3's <|eot_id|> and <|eom_id|>, ChatML's <|im_end|>, ...).
_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>", "<|end|>",
               "<end_of_turn>")


def supported_pre_tokenizers() -> tuple[str, ...]:
    return tuple(sorted(_SPLITS))


def _pre_tokenizer(pre: str | None):
    splits = _SPLITS.get(pre or "default")
    if splits is None:
        raise EngineError(
            f"unsupported pre-tokenizer {pre!r} (tokenizer.ggml.pre): supported are {', '.join(supported_pre_tokenizers())}"
        )
    return pre_tokenizers.Sequence([
        *(pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


class Tokenizer:
    """`encode`, `decode`, `apply_chat_template`, and the ids a caller needs to stop on."""

    def __init__(self, backend: HFTokenizer, *, bos_token_id: int | None, eos_token_id: int | None,
                 add_bos: bool, chat_template: str | None, vocab_size: int, end_token_ids: Sequence[int] = ()):
        self._tk = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.vocab_size = vocab_size
        self.end_token_ids = tuple(int(t) for t in end_token_ids)
        # generation stops at the EOS, at the turn ends the file names (GGUF eot/eom ids) and at
        # the known turn-end tokens it has: a Llama 3 file's EOS may be <|end_of_text|> while
        # its chat turns end with <|eot_id|>
        ends = {backend.token_to_id(t) for t in _END_TOKENS} - {None}
        ends.update(self.end_token_ids)
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
        pre = fields.get("tokenizer.ggml.pre")
        llama3 = pre in _LLAMA3_PRES
        bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=llama3)
        tk = HFTokenizer(bpe)
        tk.pre_tokenizer = _pre_tokenizer(pre)
        tk.decoder = decoders.ByteLevel()
        special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == _CONTROL]
        user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
        if special:
            tk.add_special_tokens(special)
        if user:
            tk.add_tokens(user)
        add_bos = fields.get("tokenizer.ggml.add_bos_token")
        return cls(
            tk,
            bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=fields.get("tokenizer.ggml.eos_token_id"),
            add_bos=llama3 if add_bos is None else bool(add_bos),  # llama.cpp's default per pre-tokenizer
            chat_template=fields.get("tokenizer.chat_template"),
            vocab_size=len(tokens),
            end_token_ids=[fields[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
                           if isinstance(fields.get(k), int) and 0 <= fields[k] < len(tokens)],
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

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, **extra) -> str:
        """The model's template rendered as Hugging Face renders it; `tools` (OpenAI function
        definitions) and `extra` (e.g. enable_thinking, date_string) reach the template."""
        def text(tid):
            return self._tk.id_to_token(tid) if tid is not None else ""

        return render_chat_template(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=text(self.bos_token_id), eos_token=text(self.eos_token_id),
                                    tools=tools, **extra)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineError(f"cannot read {path}: {exc}") from exc
