"""A sequence to generate, and the record of each position it produced.

Positions count tokens of the step's message: position p is the p-th token after the
message's start. `prompt_ids` ends with the message's first `first_position` tokens (when
resuming), so generation produces positions first_position, first_position + 1, ...:
at most `max_tokens` of them (max_tokens counts what this call produces)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from tttr.engine.errors import EngineError
from tttr.engine.inference.sampling import SamplingParams
from tttr.sessions.records import token_value

if TYPE_CHECKING:
    import torch

TOPK = 5  # alternatives a record keeps (TokenRecord.topk)


@dataclass(frozen=True, slots=True)
class TokenRecord:
    position: int  # position in the step's message
    token_id: int
    forced: bool  # True: taken from `forced`, not sampled
    logprob: float  # of token_id under the model's distribution (log_softmax of the raw logits)
    topk: tuple[tuple[int, float], ...]  # k best (id, logprob), best first
    digest: str  # blake2b-128 hex of the fp32 logits bytes of this position
    batch_rows: int  # rows in the forward pass that produced these logits
    rows: tuple[int, ...]  # this sequence's rows in that pass
    row: int  # the row whose logits produced this position
    kernel_mode: str  # "fast" | "invariant" | "invariant-q8" (kernels.mode.MODES)
    rng: tuple[int, int, int]  # (seed, rng_step, position): the coordinates of the draw
    text: str = ""  # the token's text
    logits: torch.Tensor | None = field(default=None, repr=False, compare=False)  # when keep_logits

    def token_value(self) -> dict:
        """The `token` event value of docs/contracts.md."""
        return token_value(self.token_id, self.text, self.forced, self.logprob, self.rng)

    def logits_value(self) -> dict:
        """The `logits` event value of docs/contracts.md."""
        return {"digest": self.digest, "topk": [list(t) for t in self.topk],
                "batch": [self.batch_rows, list(self.rows)], "mode": self.kernel_mode}

    def to_json(self) -> dict:
        return {"position": self.position, **self.token_value(), **self.logits_value(), "row": self.row}


class Sequence:
    """One generation request. The scheduler fills `records`, `finish_reason` and calls
    `on_token(record)` (from the engine's thread) as each position is produced."""

    def __init__(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams | None = None,
        max_tokens: int = 256,
        *,
        rng_step: int = 0,
        first_position: int = 0,
        forced: dict[int, int] | None = None,
        stop_token_ids: tuple[int, ...] | list[int] | None = None,
        stop_strings: tuple[str, ...] | list[str] = (),
        keep_logits: bool = False,
        on_token: Callable[[TokenRecord], None] | None = None,
    ):
        self.prompt_ids = [int(t) for t in prompt_ids]
        if not self.prompt_ids:
            raise EngineError("empty prompt: a sequence needs at least one prompt token")
        self.sampling = sampling if sampling is not None else SamplingParams()
        if not isinstance(self.sampling, SamplingParams):
            raise EngineError(f"sampling={self.sampling!r} is not a SamplingParams")
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise EngineError(f"max_tokens={max_tokens!r} is out of range: use an integer >= 0")
        if not isinstance(first_position, int) or not (0 <= first_position <= len(self.prompt_ids)):
            raise EngineError(
                f"first_position={first_position!r} is out of range: use 0..{len(self.prompt_ids)} "
                "(the resumed message prefix is the tail of the prompt)"
            )
        if not isinstance(rng_step, int):
            raise EngineError(f"rng_step={rng_step!r} must be an integer")
        self.max_tokens = max_tokens
        self.rng_step = rng_step
        self.first_position = first_position
        self.forced = {int(p): int(t) for p, t in (forced or {}).items()}
        early = [p for p in self.forced if p < first_position]
        if early:
            raise EngineError(f"forced positions {sorted(early)} are before first_position={first_position}")
        self.stop_token_ids = None if stop_token_ids is None else tuple(int(t) for t in stop_token_ids)
        self.stop_strings = tuple(stop_strings)
        self.keep_logits = keep_logits
        self.on_token = on_token
        # filled by the scheduler
        self.records: list[TokenRecord] = []
        self.finish_reason: str | None = None  # "stop" | "stop_string" | "length" | "context" | "error"
        self.kernel_mode: str | None = None
        self.ids: list[int] = list(self.prompt_ids)  # prompt + produced tokens
        self.cache = None
        self.done = threading.Event()

    @property
    def next_position(self) -> int:
        return self.first_position + len(self.records)

    @property
    def output_ids(self) -> list[int]:
        return [r.token_id for r in self.records]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (f"Sequence(prompt={len(self.prompt_ids)} tokens, produced={len(self.records)}, "
                f"step={self.rng_step}, first_position={self.first_position}, finish={self.finish_reason})")
