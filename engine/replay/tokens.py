"""The token side of a run: a step's message taken from the recording, or generated live
— with a forced prefix when a fork replaces one of its tokens — and the token and logits
values each position records."""

from __future__ import annotations

from typing import Callable

from tttr.engine.replay.events import EventLog
from tttr.engine.replay.mutation import Mutation
from tttr.sessions.vocabulary import site


class Tokens:
    def __init__(self, *, tokenizer, generate: Callable, make_sequence: Callable, seed: int, log: EventLog):
        self.tokenizer = tokenizer
        self._generate = generate  # generate(Sequence) -> list[TokenRecord]; loads the model on first use
        self._make_sequence = make_sequence  # (prompt_ids, seed, step, first_position, max_tokens, stops) -> Sequence
        self.seed = seed
        self._log = log
        self.logits_computed = 0

    def emit(self, step: int, pos: int, token: dict, logits: dict) -> None:
        self._log.emit(step, "token", site(step, "token", pos), token)
        self._log.emit(step, "logits", site(step, "logits", pos), logits)

    def replayed(self, step: int, tokens: list[dict], logits: list[dict]) -> list[int]:
        """The recorded positions as they are, recorded again; their token ids."""
        for pos, (tv, lv) in enumerate(zip(tokens, logits)):
            self.emit(step, pos, tv, lv)
        return [tv["id"] for tv in tokens]

    def forced(self, step: int, mutation: Mutation, tokens: list[dict], logits: list[dict]) -> list[int]:
        """A fork's prefix of the step: the recorded tokens before the mutated position,
        then the mutated token (with the recorded logits at its position); their ids."""
        p = mutation.site.pos
        self.replayed(step, tokens[:p], logits[:p])
        token_id = mutation.value
        self.emit(step, p, {
            "id": token_id, "text": self.tokenizer.decode([token_id]), "forced": True, "mutated": True,
            "logprob": _logprob_of(logits[p], token_id), "rng": [self.seed, step, p],
        }, logits[p])
        return [tv["id"] for tv in tokens[:p]] + [token_id]

    def generated(self, step: int, ids: list[int], forced: list[int], max_tokens: int,
                  stops: tuple[str, ...]) -> list:
        """Generate the rest of the step's message after `forced` live, recording each
        position; the engine's records (none when the forced prefix already ends it)."""
        prefix_text = self.tokenizer.decode(forced) if forced else ""
        budget = max_tokens - len(forced)
        stopped = any(s in prefix_text for s in stops) or (forced and forced[-1] in self._stop_ids())
        if budget <= 0 or stopped:
            return []
        records = self._generate(self._make_sequence(ids + forced, self.seed, step, len(forced), budget, stops))
        self.logits_computed += len(records)
        for r in records:
            self.emit(step, r.position, self.token_value(step, r), logits_value(r))
        return records

    def token_value(self, step: int, r) -> dict:
        return {"id": r.token_id, "text": self.tokenizer.decode([r.token_id]), "forced": bool(r.forced),
                "logprob": round(float(r.logprob), 6), "rng": [self.seed, step, r.position]}

    def _stop_ids(self) -> tuple[int, ...]:
        return tuple(self.tokenizer.stop_token_ids)  # the ids the engine stops a message on


def logits_value(r) -> dict:
    return {"digest": r.digest, "topk": [[int(i), round(float(lp), 6)] for i, lp in r.topk],
            "batch": [r.batch_rows, list(r.rows)], "mode": r.kernel_mode}


def _logprob_of(logits_value: dict, token_id: int) -> float | None:
    for i, lp in logits_value.get("topk", []):
        if i == token_id:
            return lp
    return None
