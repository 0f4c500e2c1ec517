"""The token side of a run: a step's message taken from the recording, or generated live
— with a forced prefix when a fork replaces one of its tokens — and the token and logits
values each position records.

A message's draws are at RNG coordinates (seed, rng_step, position). The shell agent's
messages use the run's seed and their own step (`Draws` left out); a recorded API call
carries its own seed and sampling and draws at (seed, 0, position) whatever its step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tttr.engine.replay.events import EventLog
from tttr.engine.replay.mutation import Mutation
from tttr.sessions.records import token_value
from tttr.sessions.vocabulary import site


@dataclass(frozen=True, slots=True)
class Draws:
    """Where one message's draws come from: coordinates (seed, rng_step, position), and
    the sequence factory that carries its sampling parameters."""

    seed: int
    rng_step: int
    make_sequence: Callable  # (prompt_ids, seed, rng_step, first_position, max_tokens, stops) -> Sequence


class Tokens:
    def __init__(self, *, tokenizer, generate: Callable, make_sequence: Callable, seed: int, log: EventLog):
        self.tokenizer = tokenizer
        self._generate = generate  # generate(Sequence) -> list[TokenRecord]; loads the model on first use
        self._make_sequence = make_sequence  # (prompt_ids, seed, step, first_position, max_tokens, stops) -> Sequence
        self.seed = seed
        self._log = log
        self.logits_computed = 0

    def draws(self, step: int, draws: Draws | None) -> Draws:
        """The message's draws: as given, or the run's seed at the message's own step."""
        return draws if draws is not None else Draws(self.seed, step, self._make_sequence)

    def emit(self, step: int, pos: int, token: dict, logits: dict | None) -> None:
        self._log.emit(site(step, "token", pos), token)
        if logits is not None:  # a call recorded through a proxy has tokens but no logits
            self._log.emit(site(step, "logits", pos), logits)

    def replayed(self, step: int, tokens: list[dict], logits: list[dict]) -> list[int]:
        """The recorded positions as they are, recorded again; their token ids."""
        for pos, tv in enumerate(tokens):
            self.emit(step, pos, tv, logits[pos] if pos < len(logits) else None)
        return [tv["id"] for tv in tokens]

    def forced(self, step: int, mutation: Mutation, tokens: list[dict], logits: list[dict],
               draws: Draws | None = None) -> list[int]:
        """A fork's prefix of the step: the recorded tokens before the mutated position,
        then the mutated token (with the recorded logits at its position, if any); their ids."""
        d = self.draws(step, draws)
        p = mutation.site.pos
        self.replayed(step, tokens[:p], logits[:p])
        token_id = mutation.value
        self._emit_mutated(step, d, p, token_id, logits[p] if p < len(logits) else None)
        return [tv["id"] for tv in tokens[:p]] + [token_id]

    def whole(self, step: int, text: str, stops: tuple[str, ...], logits: list[dict],
              draws: Draws | None = None) -> list[int]:
        """A fork's whole answer for the step (a `STEP:message` mutation's text): its tokens,
        each recorded as forced, ended by the step's first stop string (or the model's stop
        token) unless the text already ends it; their ids. Only the first position has the
        recording's logits beside it (its context is the recording's; the later ones' is not)."""
        d = self.draws(step, draws)
        if stops and not any(s in text for s in stops):
            text = text.rstrip("\n") + "\n" + stops[0]
        ids = list(self.tokenizer.encode(text))
        if not stops and self._stop_ids() and (not ids or ids[-1] not in self._stop_ids()):
            ids.append(self._stop_ids()[0])
        for pos, token_id in enumerate(ids):
            self._emit_mutated(step, d, pos, token_id, logits[0] if pos == 0 and logits else None)
        return ids

    def _emit_mutated(self, step: int, d: Draws, pos: int, token_id: int, logits: dict | None) -> None:
        """A token a fork put at `pos` (forced, mutated), its logprob read from the recorded
        logits there when the context is the recording's."""
        self.emit(step, pos, token_value(token_id, self.tokenizer.decode([token_id]), True,
                                         _logprob_of(logits or {}, token_id), [d.seed, d.rng_step, pos], mutated=True),
                  logits)

    def generated(self, step: int, ids: list[int], forced: list[int], max_tokens: int,
                  stops: tuple[str, ...], draws: Draws | None = None) -> list:
        """Generate the rest of the step's message after `forced` live, recording each
        position; the engine's records (none when the forced prefix already ends it)."""
        d = self.draws(step, draws)
        prefix_text = self.tokenizer.decode(forced) if forced else ""
        budget = max_tokens - len(forced)
        stopped = any(s in prefix_text for s in stops) or (forced and forced[-1] in self._stop_ids())
        if budget <= 0 or stopped:
            return []
        records = self._generate(d.make_sequence(ids + forced, d.seed, d.rng_step, len(forced), budget, stops))
        self.logits_computed += len(records)
        for r in records:
            self.emit(step, r.position, self.token_value(d, r), logits_value(r))
        return records

    def token_value(self, draws: Draws, r) -> dict:
        return token_value(r.token_id, self.tokenizer.decode([r.token_id]), bool(r.forced), round(float(r.logprob), 6),
                           [draws.seed, draws.rng_step, r.position])

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
