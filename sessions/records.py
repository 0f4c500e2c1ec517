"""What the store hands out: a run, its metadata, its outcome and one event (frozen values),
and the one constructor of a `token` event's value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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


def _proxy(value: dict | None) -> Mapping[str, Any] | None:
    return None if value is None else MappingProxyType(value)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "text", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


# What records each kind of run, as its meta's "source" says (a served call's source starts
# with its own); a run without one of these is the built-in agent's on a task.
RECORDED_BY = {"imported": "tttr import", "program": "tttr record", "calls": "tttr serve"}
RUN_KINDS = ("agent", "calls", "program", "imported")
_EMPTY: Mapping[str, Any] = MappingProxyType({})

# The meta keys some reader reads by name, with the JSON type each must have: a stored value of
# another type is left out and named in the run's `problem` (`RunMeta.read`), never handed on.
# Every other key is kept as stored, for what copies or prints the whole (`RunMeta.to_json`).
META_FIELDS = {
    "source": str,  # what recorded it (RECORDED_BY)
    "clock": str,  # the virtual clock at the start, ISO (sessions.values checks it parses)
    "limits": dict,  # the agent's step and token limits, {name: count}
    "replay": dict,  # a replay of its parent: {"free": [layer, ...], ...}
    "suite": dict,  # a suite's run: SuiteTag
    "trace": dict,  # an imported run: the spans it kept, to be written back as read
    "missing": list,  # an imported run: what its trace lacked
    "check": str,  # a program's --check
    "program": list,  # a program's command line
    "timeout_s": float,  # a program's --timeout (an integer too)
    "served_by": dict,  # a served call: which server answered (a proxy's upstream)
    "task_env": dict,  # a program suite's task environment (TTTR_TASK_*)
    "merged_from": dict,  # a merged run: {"db", "run"} it was copied from
}


@dataclass(frozen=True, slots=True)
class SuiteTag:
    """A suite's run, as its meta's "suite" names it: the suite's `id`, the run's
    `condition` and `index`, its `anchor` (the free run a pinned condition replays), the
    suite's `settings` (its `label` among them) and, for a program suite, its `task` (the
    run's own task reads `program:NAME`) with `agent` "program". A field of another type
    reads as None ({} for settings); what it must hold is the suite readers' to check."""

    id: str | None = None
    condition: str | None = None
    index: int | None = None
    anchor: int | None = None
    task: str | None = None
    agent: str | None = None
    settings: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    @classmethod
    def read(cls, value: dict) -> SuiteTag:
        def typed(name, kind):
            v = value.get(name)
            return v if type(v) is kind else None

        settings = value.get("settings")
        return cls(typed("id", str), typed("condition", str), typed("index", int), typed("anchor", int),
                   typed("task", str), typed("agent", str),
                   MappingProxyType(settings) if type(settings) is dict else MappingProxyType({}))

    @property
    def label(self) -> str | None:
        """The suite's label (`tttr suite --label`), or None."""
        label = self.settings.get("label")
        return label if type(label) is str else None


@dataclass(frozen=True, slots=True, eq=False)
class RunMeta(Mapping):
    """A run's metadata (its `meta` column) as a type: its `kind` (one of RUN_KINDS), named here
    once for every reader (`engine.kinds.kind_of`), and a typed field for each key of
    META_FIELDS (None, or an empty value, where the run has none). Read at the store
    (`RunMeta.read`: a key of the wrong type never gets in); writers build dicts. `to_json()`
    is the stored object in its stored order, so what copies or prints it (a replay's child,
    `tttr runs --json`) is unchanged; a key nobody reads by name (a served call's "endpoint",
    a replay's "sandbox", ...) is read as stored. Equal to a dict of the same keys."""

    kind: str = "agent"
    stored: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)  # every stored key, read-only, in stored order

    def __post_init__(self):
        if self.kind not in RUN_KINDS:
            raise ValueError(f"a run's kind is one of {', '.join(RUN_KINDS)}, not {self.kind!r}")

    @classmethod
    def read(cls, task: Any, column: Any) -> tuple[RunMeta, list[str]]:
        """The meta column's decoded JSON (of a run with this task) as a RunMeta, and what is
        wrong with it: a value that is not an object reads as {}, a key of META_FIELDS whose
        value has another type is left out; each is named (a run's `problem`). Either argument
        may be of any type: a database is untrusted. The kind: an imported trace, a program
        (`tttr record`, or a `program:` task), served calls (`tttr serve` direct or proxied,
        an `upstream`, or an `api:` task), else the agent's."""
        if column is None:
            column = {}
        if type(column) is not dict:
            return cls.read(task, {})[0], [f"its meta is {_json_type(column)}, not an object"]
        problems, fields = [], dict(column)
        for name in [k for k in fields if k in META_FIELDS]:
            v, kind = fields[name], META_FIELDS[name]
            if v is None:
                continue
            ok = type(v) is kind or (kind is float and type(v) is int)
            if ok and name == "program":
                ok = all(type(a) is str for a in v)
            if not ok:
                what = "a list of text" if name == "program" and type(v) is list else _json_type(kind())
                problems.append(f"its meta field {name!r} is {_json_type(v)}, not {what}")
                del fields[name]
        source = fields.get("source") or ""
        task = task if type(task) is str else ""
        if source == RECORDED_BY["imported"]:
            kind = "imported"
        elif source == RECORDED_BY["program"] or task.startswith("program:"):
            kind = "program"
        elif source.startswith(RECORDED_BY["calls"]) or "upstream" in fields or task.startswith("api:"):
            kind = "calls"
        else:
            kind = "agent"
        return cls(kind, MappingProxyType(fields)), problems

    @classmethod
    def of(cls, task: Any, meta: Any) -> RunMeta:
        """The metadata of a run with this task and meta (a dict a writer builds, or a
        RunMeta), its fields of the wrong type left out as `read` leaves them."""
        if isinstance(meta, RunMeta):
            meta = meta.to_json()
        return cls.read(task, meta if type(meta) is dict else {})[0]

    # The fields, each of its type (`read` left out any other), None or empty where absent.
    @property
    def source(self) -> str | None:
        """What recorded it (RECORDED_BY's; a proxy's source starts with tttr serve's)."""
        return self.stored.get("source")

    @property
    def clock(self) -> str | None:
        """The virtual clock at the start, ISO."""
        return self.stored.get("clock")

    @property
    def limits(self) -> Mapping[str, int]:
        """The agent's limits, {name: count}."""
        return _proxy(self.stored.get("limits")) or _EMPTY

    @property
    def replay(self) -> Mapping[str, Any] | None:
        """A replay of its parent: {"free": [layer, ...], ...}."""
        return _proxy(self.stored.get("replay"))

    @property
    def suite(self) -> SuiteTag | None:
        value = self.stored.get("suite")
        return None if value is None else SuiteTag.read(value)

    @property
    def trace(self) -> Mapping[str, Any] | None:
        """An imported run's kept spans (what its readers check further)."""
        return _proxy(self.stored.get("trace"))

    @property
    def missing(self) -> tuple[str, ...]:
        """What an imported run's trace lacked: its text entries."""
        return tuple(m for m in self.stored.get("missing") or () if type(m) is str)

    @property
    def check(self) -> str | None:
        """A program's --check."""
        return self.stored.get("check")

    @property
    def program(self) -> tuple[str, ...] | None:
        """A program's command line."""
        value = self.stored.get("program")
        return None if value is None else tuple(value)

    @property
    def timeout_s(self) -> float | None:
        """A program's --timeout (its range is the reader's to check)."""
        value = self.stored.get("timeout_s")
        return None if value is None else float(value)

    @property
    def served_by(self) -> Mapping[str, Any] | None:
        return _proxy(self.stored.get("served_by"))

    @property
    def task_env(self) -> Mapping[str, Any] | None:
        return _proxy(self.stored.get("task_env"))

    @property
    def merged_from(self) -> Mapping[str, Any] | None:
        return _proxy(self.stored.get("merged_from"))

    def to_json(self) -> dict:
        return dict(self.stored)

    def __getitem__(self, key: str) -> Any:
        return self.stored[key]

    def __iter__(self):
        return iter(self.stored)

    def __len__(self) -> int:
        return len(self.stored)

    def __repr__(self) -> str:
        return f"RunMeta({self.kind!r}, {dict(self.stored)!r})"


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
    meta: RunMeta  # its kind and the fields readers read by name (`to_json()`: as stored)
    name: str | None = None  # a person's name for it (`Store.rename_run`), or None
    # What is wrong with the stored metadata ("its sampling is a list, not an object; ..."),
    # or None. The fields named hold safe stand-ins (None, {}), so the run can be listed;
    # replay, fork and diff refuse it with this line.
    problem: str | None = None

    def to_json(self) -> dict:
        """Every field by name, in order, as JSON types (the outcome as stored)."""
        out = {name: getattr(self, name) for name in self.__slots__}
        if self.outcome is not None:
            out["outcome"] = self.outcome.to_json()
        out["meta"] = self.meta.to_json()
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
