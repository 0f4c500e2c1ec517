"""The model behind the API: loads it, turns a checked request into a Sequence, and runs it
on the shared continuous-batching engine.

One `Service` holds one model and one `Engine` with a fixed kernel mode, so every request
shares forward passes with whatever else is running; under the `invariant` kernels a row's
arithmetic does not depend on its neighbours, so a seeded request gets the same tokens and
logprobs alone or under load. Each call's sampling draws come from (seed, step 0, position)
— never from a shared generator — so they do not depend on the order calls arrive in.

A call can be cancelled (a client that went away): `Engine.cancel` removes a sequence still
waiting for admission (it is never prefilled) and drops a running one before the next step;
its token callback also raises from then on, so no token reaches the client after it.

Under the `invariant` kernels the engine keeps the keys and values of finished calls in a
`PrefixCache` (engine/inference/prefix_cache.py, least recently used out first, at most
`TTTR_PREFIX_CACHE_MB` MiB, default 256; 0 turns it off): a chat turn whose prompt extends an
earlier call's prompt (the conversation so far) prefills only what is new. Its tokens and
logprobs (and logits digests) are those without the cache; only the `batch` a position
records changes. The `fast` kernels are not prefix-invariant, so they never reuse."""

from __future__ import annotations

import os
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from tttr.engine.errors import EngineError
from tttr.engine.inference.model_id import model_id as compute_model_id
from tttr.engine.serve.errors import APIError
from tttr.engine.serve.requests import SEED_LIMIT, CallRequest
from tttr.engine.serve.tools import call_format, supports_tools
from tttr.kernels.mode import check_mode, is_invariant

TOP_LOGPROBS = 20  # the engine keeps this many alternatives per position (OpenAI's maximum)
# A prompt of more than (context x the vocabulary's longest token, in UTF-8 bytes) x this is refused
# before it is tokenized, since it cannot fit: tokenizing megabytes takes seconds and holds
# gigabytes. The slack covers a tokenizer that shortens text first (NFC composes up to 3 jamo,
# 9 bytes, into one 3-byte syllable); a prompt below the bound is tokenized and counted exactly.
UNTOKENIZED_SLACK = 4
PREFIX_CACHE_ENV = "TTTR_PREFIX_CACHE_MB"
PREFIX_CACHE_MB = 256  # the default bound; at ~46 KB a position (the default model) ~5,700 positions


def prefix_cache_size(value: str | int | None = None) -> int:
    """The prefix cache's bound in MiB: `value`, else $TTTR_PREFIX_CACHE_MB, else the default
    (0: no reuse). EngineError (one line) for anything but a whole number >= 0."""
    source = "prefix_cache_mb"
    if value is None:
        value = os.environ.get(PREFIX_CACHE_ENV, "").strip() or PREFIX_CACHE_MB
        source = PREFIX_CACHE_ENV
    text = str(value).strip()
    if type(value) is bool or not text.isdigit():
        raise EngineError(f"{source} is {str(value)[:40]!r}: give the prefix cache's size in MiB, a whole "
                          f"number >= 0 (0 turns prefix reuse off; default {PREFIX_CACHE_MB})")
    return int(text)


class Cancelled(Exception):
    """Raised from a cancelled call's token callback: the engine then drops its sequence."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request made concrete: the prompt's token ids, the seed and the limits."""

    request: CallRequest
    prompt_ids: tuple[int, ...]
    seed: int
    seed_drawn: bool  # True: the request had none, the server drew it
    max_tokens: int
    tool_format: str | None  # None: tools are not parsed from this call's text
    tool_names: frozenset[str] = frozenset()


@dataclass(eq=False, slots=True)
class Call:
    """A running call: its sequence, the engine's future, and a way to stop it."""

    prepared: Prepared
    seq: object  # tttr.engine.inference.sequence.Sequence
    future: Future
    created: int
    started: float
    cancelled: threading.Event = field(default_factory=threading.Event)
    stop: Callable[[], object] | None = None  # the engine's cancel for this sequence

    def cancel(self) -> None:
        """Stop at the engine's next step (the sequence is dropped and its cache freed);
        a call still waiting for admission is removed at once."""
        self.cancelled.set()
        if self.stop is not None:
            self.stop()


class Service:
    def __init__(self, model: str | None = None, *, kernel_mode: str = "invariant",
                 prefix_cache_mb: int | None = None, any_model: bool = False):
        """`any_model`: the model answers requests whatever model name they give (a recorded
        program's own name, such as "gpt-4o-mini", stays in its requests as sent)."""
        from tttr.engine.inference.loader import resolve_model_path

        self.path = resolve_model_path(model)
        self.kernel_mode = check_mode(kernel_mode)
        # `fast` kernels are not prefix-invariant: a reused prefix would change the answers
        self.prefix_cache_mb = prefix_cache_size(prefix_cache_mb) if is_invariant(self.kernel_mode) else 0
        self.model_id = compute_model_id(self.path, self.path.stem)
        self.any_model = any_model
        self.created = int(time.time())
        self.model = None
        self.engine = None
        self.fingerprint: dict = {}
        self.max_token_bytes = 0  # the vocabulary's longest token in UTF-8 bytes, measured at load
        self.load_error: str | None = None
        self._ready = threading.Event()
        # Seeds for the calls that send none, in order, before any is drawn: a recording's call
        # seeds, given to a run whose token layer is pinned to it (a program suite's token-pinned).
        self.pinned_seeds: list[int] = []

    # -- loading -------------------------------------------------------------------------
    def load(self) -> None:
        """Load the weights and start the engine (seconds). Until it returns, `ready` is False."""
        try:
            from tttr.engine.inference.fingerprint import fingerprint
            from tttr.engine.inference.model import load_model
            from tttr.engine.inference.scheduler import Engine

            self.model = load_model(self.path)
            self.engine = Engine(self.model, kernel_mode=self.kernel_mode, topk=TOP_LOGPROBS)
            if self.prefix_cache_mb > 0:
                from tttr.engine.inference.prefix_cache import PrefixCache

                self.engine.prefixes = PrefixCache(max_bytes=self.prefix_cache_mb << 20)
            self.fingerprint = {**fingerprint(), "model_path": str(self.path)}
            tok = self.model.tokenizer
            self.max_token_bytes = max(len(tok.token_text(i).encode()) for i in range(tok.vocab_size))
            self._warm_up()
            self._ready.set()
        except Exception as exc:  # noqa: BLE001 - reported by /health and every request
            self.load_error = str(exc)
            raise

    def _warm_up(self) -> None:
        """One token through the engine, so the first request does not pay for first use
        (the compiled kernels are built or loaded then)."""
        from tttr.engine.inference.sequence import Sequence

        tok = self.model.tokenizer
        self.engine.generate([Sequence(tok.encode("Hello") or [0], max_tokens=1)])

    def prefix_stats(self) -> dict:
        """The prefix cache as /health shows it: its bound, what it holds, what it saved."""
        if not is_invariant(self.kernel_mode):
            return {"enabled": False, "why": "fast kernels"}
        if self.prefix_cache_mb == 0:
            return {"enabled": False, "why": f"{PREFIX_CACHE_ENV}=0"}
        cache = self.engine.prefixes if self.engine is not None else None
        if cache is None:  # the engine (and its cache) start when the model has loaded
            return {"enabled": True, "max_mb": self.prefix_cache_mb, "entries": 0, "mb": 0.0, "hits": 0,
                    "reused_tokens": 0}
        return {"enabled": True, "max_mb": self.prefix_cache_mb, "entries": len(cache),
                "mb": round(cache.bytes / (1 << 20), 1), "hits": cache.hits, "reused_tokens": cache.reused_tokens}

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def system_fingerprint(self) -> str:
        """The engine's identity in one string: model id, kernels revision, kernel mode."""
        return f"tttr:{self.model_id}:{self.fingerprint.get('kernels_revision', '?')}:{self.kernel_mode}"

    def names(self) -> set[str]:
        """The model names a request may use, in any case (the Agents SDK lowers its model
        name): the model id and the file's name with and without its suffix."""
        return {n.casefold() for n in (self.model_id, self.path.stem, self.path.name)}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    # -- requests ------------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if name is not None and not self.any_model and name.casefold() not in self.names():
            raise APIError(f"The model {name!r} does not exist: this server serves {self.model_id!r} "
                           "(GET /v1/models lists it); start `tttr serve --any-model` to answer any name with it",
                           status=404, param="model", code="model_not_found")

    def _not_ready(self) -> None:
        if self.load_error is not None:
            raise APIError(f"the model failed to load: {self.load_error}", status=503, code="model_load_failed")
        if not self.ready:
            raise APIError("the model is still loading; retry in a few seconds", status=503, code="model_loading")

    def prepare(self, req: CallRequest) -> Prepared:
        """Render and tokenize the prompt and check it fits; APIError if it cannot run."""
        self.check_model(req.model)
        self._not_ready()
        tok = self.tokenizer
        tool_format, names = None, frozenset()
        use_tools = bool(req.tools) and req.tool_choice != "none"
        if use_tools and not supports_tools(tok.chat_template):
            raise APIError(f"the model {self.model_id!r} does not support tools: its chat template has no "
                           "tool format; leave out tools (or send tool_choice=\"none\")", param="tools",
                           code="tools_not_supported")
        if req.endpoint == "chat":
            messages = [dict(m) for m in req.messages]
            extra = {}
            if use_tools:
                extra["tools"] = list(req.tools)
                tool_format = call_format(tok.chat_template)
                names = frozenset(t["function"]["name"] for t in req.tools)
            try:
                from tttr.engine.inference.chat_template import render_chat_template

                text = render_chat_template(tok.chat_template, messages, add_generation_prompt=True,
                                            bos_token=_piece(tok, tok.bos_token_id),
                                            eos_token=_piece(tok, tok.eos_token_id), **extra)
            except EngineError as exc:
                raise APIError(str(exc), param="messages") from None
            self._refuse_untokenized(text, "messages")
            ids = tok.encode(text)
        elif isinstance(req.prompt, tuple):
            vocab = tok.vocab_size
            bad = [t for t in req.prompt if not 0 <= t < vocab]
            if bad:
                raise APIError(f"prompt token id {bad[0]} is outside the vocabulary of {vocab} tokens", param="prompt")
            ids = list(req.prompt)
        else:
            self._refuse_untokenized(req.prompt, "prompt")
            ids = tok.encode(req.prompt)
        if not ids:
            raise APIError("the prompt is empty after tokenization", param="messages" if req.endpoint == "chat" else "prompt")
        context = self.model.config.context_length
        room = context - len(ids)
        if room < 1 or (req.max_tokens is not None and req.max_tokens > room):
            asked = req.max_tokens or 1
            raise APIError(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{len(ids) + asked} tokens ({len(ids)} in the prompt, {asked} in the completion). "
                "Shorten the prompt or lower max_tokens.",
                param="messages" if req.endpoint == "chat" else "prompt", code="context_length_exceeded")
        seed = req.seed if req.seed is not None else \
            (self.pinned_seeds.pop(0) if self.pinned_seeds else secrets.randbelow(SEED_LIMIT))
        return Prepared(req, tuple(ids), seed, req.seed is None, req.max_tokens or room, tool_format, names)

    def _refuse_untokenized(self, text: str, param: str) -> None:
        """A prompt far too long for the context is refused without tokenizing it."""
        context = self.model.config.context_length
        bound = context * self.max_token_bytes * UNTOKENIZED_SLACK
        size = len(text.encode()) if len(text) * 4 > bound else 0  # a character is at most 4 bytes
        if self.max_token_bytes and size > bound:
            raise APIError(f"This model's maximum context length is {context} tokens. However, the prompt is "
                           f"{size} bytes, far more than {context} tokens hold. Shorten the prompt.",
                           param=param, code="context_length_exceeded")

    def start(self, prepared: Prepared, on_token: Callable | None = None, *, forced: dict | None = None) -> Call:
        """Submit the call to the engine; `on_token(record)` runs on the engine's thread.
        `forced` ({position: token id}) takes those tokens instead of sampling them (a fork)."""
        from tttr.engine.inference.sampler import SamplingParams
        from tttr.engine.inference.sequence import Sequence

        self._not_ready()
        req = prepared.request
        sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=prepared.seed)
        cancelled = threading.Event()

        def callback(record) -> None:
            if cancelled.is_set():
                raise Cancelled("the client went away")
            if on_token is not None:
                on_token(record)

        seq = Sequence(list(prepared.prompt_ids), sampling, prepared.max_tokens, rng_step=0,
                       stop_token_ids=self.tokenizer.stop_token_ids, stop_strings=req.stop, on_token=callback,
                       forced=forced)
        future = self.engine.submit(seq)
        engine = self.engine
        return Call(prepared, seq, future, int(time.time()), time.perf_counter(), cancelled,
                    stop=lambda: engine.cancel(seq))


def _piece(tok, token_id: int | None) -> str:
    return tok.token_text(token_id) if token_id is not None else ""
