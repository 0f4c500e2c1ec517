"""What the imported kind's verbs do (engine/kinds.py's `ImportedTrace` calls these): a trace
read from an OpenTelemetry export (`tttr import`), with message fidelity and nothing below it.

It holds the model calls' messages and the tools' arguments and results, but no program, no
clock reads, no randomness, no file trees and no token ids or logits (`LACKS`). So `tttr diff`,
`events`, `runs` and the app show it like any run; `tttr replay` and `fork` run a user's program
against it (`-- PROGRAM`: engine/traces/against.py); triage and bisect refuse it in one line:
they have no layer values to pin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tttr.engine.traces.errors import TraceError
from tttr.engine.traces.imported import LACKS, is_imported_run

if TYPE_CHECKING:
    from tttr.engine.replay.result import ReplayResult

__all__ = ["is_imported_run", "lacks_line", "check_replay", "check_fork", "check_experiment", "act"]


def lacks_line(run) -> str:
    """What an imported run lacks, in one line (`tttr info`, the refusals)."""
    missing = run.meta.missing
    more = f"; its trace also lacks {', '.join(missing)}" if missing else ""
    return f"no {', '.join(LACKS[:-1])} or {LACKS[-1]}{more}"


def check_replay(reader, run, request):
    """`tttr replay IMPORTED [--code DIR] [--sealed] -- PROGRAM`, checked read-only."""
    from tttr.engine.traces.against import check_against

    if not request.policy.faithful or request.seed is not None:
        raise TraceError(f"run {run.id} is an imported trace: it has no layer values to free (drop --free and "
                         "--seed); its program's replay answers from the trace while the requests match")
    return check_against(reader, run, argv=request.argv, code=request.code, sealed=request.sealed,
                         model=request.model, unsafe_no_sandbox=request.unsafe_no_sandbox,
                         upstream=getattr(request, "upstream", None),
                         upstream_key_env=getattr(request, "upstream_key_env", None))


def check_fork(reader, run, request):
    """`tttr fork IMPORTED --at SITE --set VALUE [--code DIR] -- PROGRAM`, checked read-only."""
    from tttr.engine.traces.against import check_against

    return check_against(reader, run, argv=getattr(request, "argv", ()), code=getattr(request, "code", None),
                         model=request.model, unsafe_no_sandbox=request.unsafe_no_sandbox,
                         site=request.site, value=request.value, upstream=getattr(request, "upstream", None),
                         upstream_key_env=getattr(request, "upstream_key_env", None))


def act(db: str, plan, progress=None) -> ReplayResult:
    """A checked replay or fork against a trace, run: the program's new run, a program's
    ReplayResult (a RunResult, as every kind's verbs return: engine/replay/result.py)."""
    from tttr.engine.traces.against import run_against

    return run_against(db, plan.checked, progress)


def check_experiment(run, verb: str):
    raise TraceError(f"run {run.id} is an imported trace: {verb} needs each layer's values ({lacks_line(run)}); "
                     "it works on the shell agent's runs (tttr record --task) and recorded programs")


def imported_note(runs) -> str | None:
    """`tttr info`'s line on the imported runs among `runs`: how many, and what they lack."""
    ids = [r.id for r in runs if is_imported_run(r)]
    if not ids:
        return None
    shown = ", ".join(map(str, ids[:8])) + (" …" if len(ids) > 8 else "")
    return (f"{len(ids)} run(s) imported from traces ({shown}): messages and tool results only; "
            f"no {', '.join(LACKS[:-1])} or {LACKS[-1]}; a program replays and forks against one "
            f"(tttr replay RUN --code DIR -- PROGRAM), triage and bisect refuse them")
