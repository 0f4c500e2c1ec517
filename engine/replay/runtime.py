"""The model a record/replay/fork session works with, loaded as late as possible.

The tokenizer comes first and alone (a faithful replay needs nothing more: no weights, no
logits); the weights and the engine load on the first position that must be computed. One
Runtime's engine is shared by every run that uses it, from any thread, so runs recorded or
replayed side by side share forward passes.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import replace
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from tttr.engine.inference.model_id import model_id
from tttr.engine.inference.tokenizer import Tokenizer
from tttr.sessions.cache import cache_dir
from tttr.kernels.mode import check_mode, kernel_mode
from tttr.recorders.probe import probe

# The imports inside functions below are lazy on purpose: each loads torch (~3 s), which a
# faithful replay (tokenizer only) never needs.

class Runtime:
    def __init__(self, model: str | os.PathLike | None = None, kernel_mode: str = "invariant"):
        from tttr.engine.inference.loader import resolve_model_path

        self.path = resolve_model_path(model)
        self.kernel_mode = check_mode(kernel_mode)
        self._lock = threading.Lock()
        self._model = None
        self._engine = None
        self._prefixes = None  # the PrefixCache the engine reuses prefixes from (reusing_prefixes)

    # -- cheap parts -------------------------------------------------------------------
    @cached_property
    def model_id(self) -> str:
        return model_id(self.path, self.path.stem)

    @cached_property
    def tokenizer(self):
        if self._model is not None:
            return self._model.tokenizer
        return _load_tokenizer(self.path, self.model_id)

    def fingerprint(self) -> dict:
        from tttr.engine.inference.fingerprint import fingerprint

        return {**fingerprint(), "model_path": str(self.path)}

    def sandbox_mechanisms(self, unsafe_no_sandbox: bool) -> dict:
        return {**probe().to_json(), "unsafe_no_sandbox": unsafe_no_sandbox}

    def check_sampling(self, temperature: float, top_p: float, top_k: int, seed: int | None) -> None:
        from tttr.engine.inference.sampler import SamplingParams

        SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed or 0)

    # -- the expensive part ------------------------------------------------------------
    @property
    def engine(self):
        with self._lock:
            if self._engine is None:
                from tttr.engine.inference.model import load_model
                from tttr.engine.inference.scheduler import Engine

                self._model = load_model(self.path)
                self._engine = Engine(self._model)
                self._engine.prefixes = self._prefixes
            return self._engine

    @contextlib.contextmanager
    def reusing_prefixes(self):
        """While inside, the engine starts each sequence under invariant kernels from the longest token
        prefix it has already computed (engine/inference/prefix_cache.py): an experiment's
        replays of one recording share long prefixes. Tokens and logits digests are the same
        as without; the kept keys and values are dropped on the way out. Inside an outer
        `reusing_prefixes` (a bisect's trials, each a replay), the outer cache is shared."""
        from tttr.engine.inference.prefix_cache import PrefixCache

        if self._prefixes is not None:
            yield self._prefixes
            return
        cache = PrefixCache()
        with self._lock:
            outer, self._prefixes = self._prefixes, cache
            if self._engine is not None:
                self._engine.prefixes = cache
        try:
            yield cache
        finally:
            with self._lock:
                self._prefixes = outer
                if self._engine is not None:
                    self._engine.prefixes = outer  # the kept keys and values go with the last reference

    def warm_up(self) -> None:
        """Load the weights now (benchmarks time runs, not the load)."""
        self.engine  # noqa: B018

    def generate_in(self, mode: str):
        mode = check_mode(mode)

        def generate(seq):
            engine = self.engine
            with kernel_mode(mode):
                future = engine.submit(seq)
            return future.result()

        generate.warm_up = self.warm_up  # the oracle loads the model outside a step's model time
        return generate

    @property
    def generate(self):
        return self.generate_in(self.kernel_mode)

    def sequence_factory(self, sampling):
        from tttr.engine.inference.sequence import Sequence

        stop_ids = tuple(self.tokenizer.stop_token_ids)

        def make(prompt_ids, seed, step, first_position, max_tokens, stops):
            return Sequence(prompt_ids, replace(sampling, seed=seed), max_tokens,
                            rng_step=step, first_position=first_position,
                            stop_token_ids=stop_ids, stop_strings=tuple(stops))

        return make

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()


def _load_tokenizer(path: Path, model_id: str):
    """The tokenizer alone, without reading the weights. Building it from GGUF metadata
    takes seconds (49k tokens and merges through gguf's reader), so the result is cached
    as a tokenizer.json keyed by the model's content hash."""
    if not path.is_file():
        from tttr.engine.inference.loader import load_checkpoint

        return load_checkpoint(path).tokenizer
    cache = cache_dir() / "tokenizers" / f"{model_id}.json"
    if cache.is_file():
        try:
            return _read_cached(cache)
        except Exception:  # noqa: BLE001 - a bad cache entry is rebuilt
            pass
    from tttr.engine.inference.gguf_file import open_reader
    from tttr.engine.inference.loader_gguf import _field

    reader = open_reader(path)  # a file that is not a GGUF model is refused in one line
    fields = {name: _field(f) for name, f in reader.fields.items() if name.startswith("tokenizer.")}
    tokenizer = Tokenizer.from_gguf_fields(fields)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        _write_cached(tokenizer, tmp)
        os.replace(tmp, cache)
    except OSError:
        pass
    return tokenizer


def _write_cached(tokenizer, path: Path) -> None:
    path.write_text(json.dumps({
        "backend": tokenizer._tk.to_str(), "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id, "add_bos": tokenizer.add_bos,
        "chat_template": tokenizer.chat_template, "vocab_size": tokenizer.vocab_size,
        "end_token_ids": list(tokenizer.end_token_ids),
    }))


def _read_cached(path: Path):
    data = json.loads(path.read_text())
    if "end_token_ids" not in data:  # written before the file's end-of-turn ids were kept: rebuilt
        raise ValueError(f"{path.name}: a tokenizer cache entry without end_token_ids")
    return Tokenizer(HFTokenizer.from_str(data.pop("backend")), **data)
