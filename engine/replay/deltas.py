"""The differences between two recordings of the same task, as deltas: each value the runs
could not have predicted that differs between them where it is comparable, with its layer,
ready to apply to one run as a mutation (the other run's value at that site).

Comparable means the same decision point in the same situation:
- trace: a clock reading (every step both runs reach, and the setup's); a tool result where
  the request matches — the same command on the same tree with the same shell state and
  clock — so that a result that differs only because the world already differed is a
  consequence, not a delta.
- token: the run's seed; and per step whose context (prompt token ids) is the same in both,
  the first position whose token differs (after it the contexts differ).
- tensor: the kernel mode (a revision of the kernels is not a delta: such runs are refused).

Two runs of different tasks, models or kernels revisions are refused, as is a pair with no
delta: DeltaError, one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tttr.engine.replay.divergence import compared_value, token_label
from tttr.engine.replay.events import read_text
from tttr.engine.replay.mutation import Mutation
from tttr.engine.replay.mutations import MutationSet
from tttr.engine.replay.source import Source
from tttr.sessions.errors import TTTRError
from tttr.sessions.safe_text import brief
from tttr.sessions.vocabulary import RECORDED_LAYERS, Site, site, site_order

SEED = "seed"  # the sites of the run-level deltas (outside the step grammar: they sort last)
KERNELS = "kernels"
_REQUEST = ("cmd", "cwd", "exports", "tree_before")
_RESULT = ("tree_after", "snapshot", "cwd_after", "exports_after")  # carried with a tool delta's output


class DeltaError(TTTRError, ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Delta:
    """One differing value: at `site` of `layer`, `base` in the run it applies to, `value` in
    the other. `mutation` puts `value` in place (None for the run-level seed and kernels)."""

    site: str
    layer: str
    base: Any
    value: Any
    mutation: Mutation | None = None
    ids: tuple[Any, Any] | None = None  # a token delta's two token ids (`base` and `value` are their texts)

    def describe(self, width: int = 40) -> str:
        if self.ids is not None:  # a token reads as its text with its id beside it
            return f"{self.site} ({self.layer}): {token_label(self.base, self.ids[0], width)} → " \
                   f"{token_label(self.value, self.ids[1], width)}"
        return f"{self.site} ({self.layer}): {brief(self.base, width)} → {brief(self.value, width)}"

    def to_json(self) -> dict:
        return {"site": self.site, "layer": self.layer, "base": self.base, "value": self.value}


@dataclass(frozen=True, slots=True)
class Pair:
    """Two recordings of one task, loaded: the base (deltas apply to it) and the other."""

    base: Source
    other: Source

    @classmethod
    def load(cls, store, base: int, other: int) -> "Pair":
        pair = cls(Source(store, base), Source(store, other))
        pair.check()
        return pair

    def check(self) -> None:
        a, b = self.base.run, self.other.run
        if a.id == b.id:
            raise DeltaError(f"runs {a.id} and {b.id} are the same run: give two runs of one task")
        for run in (a, b):
            if run.status != "complete":
                raise DeltaError(f"run {run.id} is {run.status}: only complete runs can be compared this way")
            if type(run.task) is not str:
                raise DeltaError(f"run {run.id} names no task: it cannot be replayed")
        for what, get in (("tasks", lambda r: r.task), ("models", lambda r: r.model_id),
                          ("kernels revisions", lambda r: (r.fingerprint or {}).get("kernels_revision"))):
            if get(a) != get(b):
                raise DeltaError(f"runs {a.id} and {b.id} have different {what} ({get(a)} and {get(b)}): "
                                 "give two runs of the same task, model and kernels revision")


def counted(n: int) -> str:
    """`1 delta`, `2 deltas`: how the experiments' outputs and lineages count them."""
    return f"{n} delta" if n == 1 else f"{n} deltas"


def deltas(pair: Pair) -> list[Delta]:
    """Every delta of `pair.other` against `pair.base`, in site order (run-level last)."""
    base, other = pair.base, pair.other
    out: list[Delta] = []
    steps = sorted({e.step for e in base.events} & {e.step for e in other.events})
    for step in steps:
        out += _clock(base, other, step) + _tool(base, other, step) + _token(base, other, step)
    return with_run_level(out, base.run, other.run)


def with_run_level(found: list[Delta], base, other) -> list[Delta]:
    """A pair's step deltas `found` with its run-level ones (`base` and `other` are the runs:
    their seed, their kernel mode), in site order (run-level last). For any kind of run: the
    built-in agent's here, a recorded program's in engine/program/deltas.py."""
    out = list(found)
    if base.seed != other.seed:
        out.append(Delta(SEED, "token", base.seed, other.seed))
    if base.kernel_mode != other.kernel_mode:
        out.append(Delta(KERNELS, "tensor", base.kernel_mode, other.kernel_mode))
    return sorted(out, key=lambda d: site_order(d.site))


def nonempty(found: list[Delta], a: int, b: int, where: str) -> list[Delta]:
    """`found`, the deltas between runs `a` and `b`; DeltaError (one line) if there are none,
    naming `where` they were looked for."""
    if not found:
        raise DeltaError(f"runs {a} and {b} do not differ at any {where}: there is nothing to locate")
    return found


def differing(pair: Pair) -> list[Delta]:
    """`deltas(pair)`, refusing a pair with none."""
    return nonempty(deltas(pair), pair.base.run.id, pair.other.run.id,
                "clock, comparable tool result, token, seed or kernel mode")


def by_layer(found: list[Delta]) -> dict[str, list[Delta]]:
    return {layer: [d for d in found if d.layer == layer] for layer in RECORDED_LAYERS}


def mutation_set(found: list[Delta]) -> MutationSet:
    return MutationSet(tuple(d.mutation for d in found if d.mutation is not None))


def _clock(base: Source, other: Source, step: int) -> list[Delta]:
    at = site(step, "clock")
    a, b = base.value(at), other.value(at)
    if not (isinstance(a, dict) and isinstance(b, dict)) or a.get("t") == b.get("t"):
        return []
    t = datetime.fromisoformat(b["t"])
    return [Delta(at, "trace", a["t"], b["t"], Mutation(Site(step, "clock"), t, b["t"]))]


def _tool(base: Source, other: Source, step: int) -> list[Delta]:
    at = site(step, "tool")
    a, b = base.value(at), other.value(at)
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return []
    clock = site(step, "clock")
    if any(a.get(k) != b.get(k) for k in _REQUEST) or base.value(clock) != other.value(clock):
        return []  # another request: its result differs as a consequence
    if compared_value("tool", a) == compared_value("tool", b) and a.get("tree_after") == b.get("tree_after"):
        return []
    store = other.store
    value = {"cmd": b["cmd"], "tree_before": b.get("tree_before"),
             "stdout": read_text(store, b.get("stdout")), "stderr": read_text(store, b.get("stderr")),
             "exit_code": b.get("exit_code"), **{k: b[k] for k in _RESULT if k in b}}
    return [Delta(at, "trace", compared_value("tool", a), compared_value("tool", b),
                  Mutation(Site(step, "tool"), value, f"run {other.run.id}'s result"))]


def _token(base: Source, other: Source, step: int) -> list[Delta]:
    prompt = site(step, "prompt")
    a, b = base.value(prompt), other.value(prompt)
    if not (isinstance(a, dict) and isinstance(b, dict)) or a.get("ids_digest") != b.get("ids_digest"):
        return []
    ta, tb = base.tokens.get(step, []), other.tokens.get(step, [])
    for pos, (x, y) in enumerate(zip(ta, tb)):
        if x.get("id") != y.get("id"):
            at = site(step, "token", pos)
            return [Delta(at, "token", x.get("text", x.get("id")), y.get("text", y.get("id")),
                          Mutation(Site(step, "token", pos), y["id"], f"id:{y['id']}"), (x.get("id"), y.get("id")))]
    return []
