"""A suite's runs as they are stored: which runs belong to which suite (`meta.suite`: id,
condition, index, anchor, settings), each read as a `SuiteRun`, the suites and labels a store
holds, and what a re-run of an interrupted suite finds already there. Recording is `suite.py`'s,
the statistics `suite_stats.py`'s."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tttr.engine.replay.variance import CONDITIONS, state_actions
from tttr.sessions.errors import TTTRError
from tttr.sessions.vocabulary import SETUP_STEP, site


class SuiteError(TTTRError, ValueError):
    pass


@dataclass(frozen=True, slots=True)
class SuiteRun:
    """One stored run of a suite, as the statistics read it."""

    run_id: int
    task: str
    condition: str
    index: int
    status: str
    passed: bool | None
    actions: tuple[str, ...]  # its state-modifying actions
    seed: int | None = None
    start_tree: str | None = None  # the digest of its tree after the task's setup
    label: str | None = None  # the suite's label
    calls: tuple[str, ...] | None = None  # a program's model calls: their answers, in order


@dataclass(frozen=True, slots=True)
class Resumed:
    """What a suite already holds, read before a re-run: its settings, the (task, condition,
    index) slots that have a complete run, and each task's anchor."""

    settings: dict
    done: frozenset
    anchors: dict
    runs: list


def read_suite(store, suite_id: str) -> Resumed:
    """The suite `suite_id` of a store as a re-run resumes it; SuiteError if it is not there."""
    ids = suite_ids(store)
    if suite_id not in ids:
        held = ", ".join(ids) if ids else "none"
        raise SuiteError(f"no suite {suite_id!r} in the database to resume (it holds: {held})")
    settings: dict = {}
    runs = []
    for run in store.runs():
        info = run.meta.suite
        if info is None or info.id != suite_id:
            continue
        if not settings:
            settings = dict(info.settings)
        r = read_run(store, run)
        if r is not None:
            runs.append(r)
    complete = [r for r in runs if r.status == "complete"]
    anchors: dict = {}
    for r in sorted(complete, key=lambda r: (r.index, r.run_id)):
        if r.condition == "free":
            anchors.setdefault(r.task, r.run_id)
    return Resumed(settings, frozenset((r.task, r.condition, r.index) for r in complete), anchors, complete)


def read_run(store, run) -> SuiteRun | None:
    """A stored run as a suite run, or None if it belongs to no suite."""
    info = run.meta.suite
    if info is None or info.condition not in CONDITIONS or not isinstance(run.task, str):
        return None
    program = info.agent == "program" and info.task is not None
    task = info.task if program else run.task  # a program's run is `program:NAME`; its suite task is here
    tools = [e.value for e in store.events(run.id, kind="tool")]
    passed = run.outcome.passed if run.outcome is not None else None
    index = info.index if info.index is not None else 0
    setup = store.event_at(run.id, site(SETUP_STEP, "setup"))
    tree = setup.value.get("tree") if setup is not None and isinstance(setup.value, dict) else None
    calls = tuple(json.dumps(e.value, sort_keys=True, default=str) for e in store.events(run.id, kind="message")) \
        if program else None
    actions = state_actions(tools)
    if program:  # the program's own command is the same text every run: its end tree tells them apart
        actions = state_actions([{**v, "cmd": f"{v.get('cmd')} -> {str(v.get('tree_after'))[:16]}"}
                                 if isinstance(v, dict) and "program" in v else v for v in tools])
    return SuiteRun(run.id, task, info.condition, index, run.status, passed, actions,
                    run.seed if isinstance(run.seed, int) else None, tree if isinstance(tree, str) else None, info.label,
                    calls)


def suite_ids(store) -> list[str]:
    """The suites recorded in a store, oldest first."""
    seen: dict[str, int] = {}
    for run in store.runs():
        info = run.meta.suite
        if info is not None and info.id is not None and info.condition in CONDITIONS:
            seen.setdefault(info.id, run.id)
    return sorted(seen, key=seen.get)


def suite_runs(store, suite_id: str) -> list[SuiteRun]:
    """Every run of one suite (complete or not), in the store's order."""
    runs = []
    for run in store.runs():
        info = run.meta.suite
        if info is not None and info.id == suite_id:
            r = read_run(store, run)
            if r is not None:
                runs.append(r)
    return runs


def suite_labels(store) -> dict[str, str | None]:
    """Each suite of a store (oldest first) and its label (None where it has none)."""
    labels: dict[str, str | None] = {i: None for i in suite_ids(store)}
    for run in store.runs():
        info = run.meta.suite
        if info is not None and info.label is not None and info.id in labels:
            labels[info.id] = labels[info.id] or info.label
    return labels


def find_suite(store, key: str | None, where: str) -> str:
    """The suite `key` names in a store: a suite id or a label (None: the store's only suite,
    else its latest). SuiteError in one line if it names none, or a label names several."""
    labels = suite_labels(store)
    if not labels:
        raise SuiteError(f"{where} holds no suite runs: record some with `tttr suite --runs N --db FILE`")
    if key is None:
        return list(labels)[-1]
    if key in labels:
        return key
    named = [i for i, lab in labels.items() if lab == key]
    if len(named) > 1:
        raise SuiteError(f"label {key!r} names {len(named)} suites in {where} ({', '.join(named)}): give a suite id")
    if not named:
        known = ", ".join(f"{i} ({lab})" if lab else i for i, lab in labels.items())
        raise SuiteError(f"no suite or label {key!r} in {where}: it holds {known}")
    return named[0]
