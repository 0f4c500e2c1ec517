"""Edit-and-fork of a recorded program (`tttr record -- PROGRAM`) from the app.

The timeline's edit dialog and fork worker come here for a program run, and to the
built-in agent's fork (app/forking.py) for any other: what the dialog offers at an event
(an SDK function's result as JSON; at the setup event, as for the agent, a file of the start
tree, a variable or the start clock; the rest as for the agent), the check of a typed value (engine/program/fork.py's, the command line's), and the fork
itself, re-running the program in the worker with progress and cancel. No textual here.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tttr.sessions.vocabulary import Site


@dataclass(frozen=True, slots=True)
class EditOffer:
    """What the edit dialog shows: the site forked at, the kind of value (its help line)
    and the recorded value as text the fork takes."""

    site: str
    kind: str  # "clock", "function" (an @sdk.tool's result) or the agent's kinds
    current: str


@dataclass(frozen=True, slots=True)
class ProgramFork:
    """A program fork made from the app, as the timeline reports a fork: run id and status."""

    run_id: int
    status: str
    result: object  # engine/program/replay.py's ReplayResult


def is_program(run) -> bool:
    from tttr.engine.kinds import PROGRAM, kind_of

    return kind_of(run) is PROGRAM


def offer(run, event) -> EditOffer | str | None:
    """For an event of a program run: what the dialog offers there, or why nothing can be
    edited there (a line); None where the built-in agent's dialog applies as it is."""
    if not is_program(run):
        return None
    value = event.value if isinstance(event.value, dict) else {}
    if event.kind == "setup":  # which setup value (setup:file, setup:env, setup:clock): the agent's question
        return None
    if event.kind == "tool" and isinstance(value.get("program"), list):
        return ("this is the program's own output, not a value it was given: fork at a model call's token (K), "
                "an SDK tool's result or a clock read (R)")
    if event.kind == "tool" and "function" in value:
        shown = {"error": value["error"]} if value.get("error") is not None else value.get("result")
        return EditOffer(event.site, "function", json.dumps(shown, ensure_ascii=False))
    return None


def check(store, run, site_text: str, value: str, model) -> str | None:
    """None when `value` is a valid new value at `site_text` of program run `run`, else why not."""
    from tttr.engine.program.record import ProgramRunError
    from tttr.engine.program.fork import check_program_fork

    try:
        runtime = _runtime(model) if Site.parse(site_text).name in ("token", "message") else None
        check_program_fork(store, run.id, site_text, value, model=model, runtime=runtime)
    except ProgramRunError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - no model here: said in the dialog
        if getattr(exc, "exit_code", None) is None and not isinstance(exc, ValueError):
            raise
        return str(exc)
    return None


@lru_cache(maxsize=4)
def _runtime(model):
    """The model's identity and tokenizer (no weights), made once per model: the dialog
    checks a token's value on every confirm."""
    from tttr.engine.replay.runtime import Runtime

    return Runtime(model)


def run_fork(db_path: Path, run_id: int, site_text: str, value: str, *, runtime, unsafe_no_sandbox: bool,
             progress, cancel: threading.Event) -> ProgramFork:
    """Fork program run `run_id` at `site_text` with `value`, as `tttr fork` does, reporting
    `progress(done, total, text)`; once `cancel` is set the program's next model call is
    refused, and the run is stored incomplete."""
    from tttr.engine.program.fork import check_program_fork
    from tttr.engine.program.replay import replay_program
    from tttr.sessions.store import Store

    model = str(runtime.path) if runtime is not None else None
    with Store.open(db_path, create=False, readonly=True) as reader:
        plan = check_program_fork(reader, run_id, site_text, value, model=model)
    plan.progress, plan.cancel = progress, cancel
    progress(0, None, f"forking the program at {site_text} …")
    result = replay_program(str(db_path), run_id, unsafe_no_sandbox=unsafe_no_sandbox, fork=plan,
                            progress=lambda text: progress(0, None, text))
    status = "complete"
    if cancel.is_set():
        status = "incomplete"
        with Store.open(db_path, create=False) as store:
            outcome = store.run(result.run_id).outcome
            store.finish_run(result.run_id, status=status,
                             outcome={**(outcome or {}), "reason": "cancelled"})
    return ProgramFork(result.run_id, status, result)


__all__ = ["EditOffer", "ProgramFork", "check", "is_program", "offer", "run_fork"]
