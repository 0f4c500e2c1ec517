"""What the store hands out: a run's metadata and one event (frozen values), and the one
constructor of a `token` event's value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Run:
    id: int
    task: str | None
    model_id: str | None
    kernel_mode: str | None
    sampling: dict
    seed: int | None
    fingerprint: dict
    status: str  # a run whose writer died reads as "incomplete"
    outcome: Any
    created: str
    finished: str | None
    parent: int | None
    fork_seq: int | None
    fork_site: str | None
    mutation: Any
    meta: dict
    name: str | None = None  # a person's name for it (`Store.rename_run`), or None
    # What is wrong with the stored metadata ("its sampling is a list, not an object; ..."),
    # or None. The fields named hold safe stand-ins (None, {}), so the run can be listed;
    # replay, fork and diff refuse it with this line.
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Event:
    run: int  # the run that was asked for
    seq: int
    step: int
    layer: str
    kind: str
    site: str
    value: Any
    origin: int | None = None  # the run that recorded it: `run`, or an ancestor for a fork's prefix
    # Why the stored value is unreadable (cannot be decoded, or has the wrong type/shape for
    # its kind), naming the problem; `value` is then None. Readers that show events mark it;
    # readers that need the value (replay, fork, diff) refuse the run with this line.
    problem: str | None = None


def token_value(token_id: int, text: str, forced: bool, logprob: float | None, rng, *, mutated: bool = False,
                **extra: Any) -> dict:
    """A `token` event's value (docs/contracts.md): `{"id", "text", "forced", "logprob", "rng"}`
    in that order, which `codec` stores as a fixed binary record; `mutated` (a fork's edited
    token) after `forced`, and `extra` fields (a proxied call's `upstream`, `id_source`, ...)
    after `rng`: such a value is stored as JSON text. `rng` is `[seed, step, pos]`; `logprob`
    None where it is not known (a retokenized upstream answer). The fields are stored as given
    (a caller rounds or converts them), so the stored bytes are the caller's choice."""
    value = {"id": token_id, "text": text, "forced": forced}
    if mutated:
        value["mutated"] = True
    value["logprob"] = logprob
    value["rng"] = list(rng)
    if extra:
        value.update(extra)
    return value
