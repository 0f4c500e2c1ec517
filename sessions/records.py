"""What the store hands out: a run's metadata, its outcome and one event (frozen values),
and the one constructor of a `token` event's value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# The outcome fields every kind of run reads the same way, with their type; a stored value of
# another type is a problem of the run (`Outcome.read`), never handed to a reader.
OUTCOME_FIELDS = {"passed": bool, "reason": str, "checker_exit": int, "checker_output": str}


@dataclass(frozen=True, slots=True, eq=False)
class Outcome(Mapping):
    """How a run ended, as its `outcome` column stores it: the checker's verdict (`passed`,
    `checker_exit`, `checker_output`) of an agent run or a program run with a check, why a
    run stopped early (`reason`), and each kind's own fields (a served call's
    `finish_reason`, a program's `exit_code` and `calls`, an imported trace's `spans`), read
    as stored with `outcome["exit_code"]` / `.get(...)`. `to_json()` is the stored object in
    its stored order, so what prints it (`tttr runs --json`, export) is unchanged. Equal to a
    dict of the same fields."""

    fields: Mapping[str, Any]  # every stored field, read-only, in stored order

    @classmethod
    def read(cls, column: Any) -> tuple[Outcome | None, list[str]]:
        """The outcome column's decoded JSON as an Outcome, and what is wrong with it: a value
        that is not an object reads as None, a field of OUTCOME_FIELDS of the wrong type is left
        out; each is named (a run's `problem`)."""
        if column is None:
            return None, []
        if type(column) is not dict:
            return None, [f"its outcome is {_json_type(column)}, not an object"]
        problems, fields = [], dict(column)
        for name, kind in OUTCOME_FIELDS.items():
            v = fields.get(name)
            if v is not None and type(v) is not kind:
                problems.append(f"its outcome field {name!r} is {_json_type(v)}, not {_json_type(kind())}")
                del fields[name]
        return cls(MappingProxyType(fields)), problems

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Outcome:
        """An outcome from fields a writer builds (`Store.finish_run` takes either)."""
        return fields if isinstance(fields, Outcome) else cls(MappingProxyType(dict(fields)))

    def to_json(self) -> dict:
        return dict(self.fields)

    @property
    def passed(self) -> bool | None:
        """The checker's verdict; None where no check ran (cancelled, a served call, a program without one)."""
        return self.fields.get("passed")

    @property
    def reason(self) -> str | None:
        """Why the run stopped before its end ("cancelled", "recording stopped early"), or None."""
        return self.fields.get("reason")

    @property
    def checker_exit(self) -> int | None:
        return self.fields.get("checker_exit")

    @property
    def checker_output(self) -> str | None:
        return self.fields.get("checker_output")

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def __iter__(self):
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __repr__(self) -> str:
        return f"Outcome({dict(self.fields)!r})"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "text", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


# What records each kind of run, as its meta's "source" says (a served call's source starts
# with its own); a run without one of these is the built-in agent's on a task.
RECORDED_BY = {"imported": "tttr import", "program": "tttr record", "calls": "tttr serve"}
RUN_KINDS = ("agent", "calls", "program", "imported")


@dataclass(frozen=True, slots=True)
class RunMeta:
    """What a run's metadata says it is: its kind (one of RUN_KINDS), named here once for
    every reader (`engine.kinds.kind_of`), and what recorded it (meta's "source", or None)."""

    kind: str
    source: str | None = None

    def __post_init__(self):
        if self.kind not in RUN_KINDS:
            raise ValueError(f"a run's kind is one of {', '.join(RUN_KINDS)}, not {self.kind!r}")

    @classmethod
    def of(cls, task: Any, meta: Any) -> RunMeta:
        """The kind of a run with this task and meta (either may be of any type: a database is
        untrusted). An imported trace, a program (`tttr record`, or a `program:` task), served
        calls (`tttr serve` direct or proxied, an `upstream`, or an `api:` task), else the agent."""
        meta = meta if type(meta) is dict else {}
        source = meta.get("source") if type(meta.get("source")) is str else None
        task = task if type(task) is str else ""
        if source == RECORDED_BY["imported"]:
            kind = "imported"
        elif source == RECORDED_BY["program"] or task.startswith("program:"):
            kind = "program"
        elif (source or "").startswith(RECORDED_BY["calls"]) or "upstream" in meta or task.startswith("api:"):
            kind = "calls"
        else:
            kind = "agent"
        return cls(kind, source)


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
    outcome: Outcome | None
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

    @property
    def run_meta(self) -> RunMeta:
        """The run's kind and what recorded it, from its task and meta."""
        return RunMeta.of(self.task, self.meta)

    def to_json(self) -> dict:
        """Every field by name, in order, as JSON types (the outcome as stored)."""
        out = {name: getattr(self, name) for name in self.__slots__}
        if self.outcome is not None:
            out["outcome"] = self.outcome.to_json()
        return out


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
