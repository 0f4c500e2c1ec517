"""What the imported kind's verbs do (engine/kinds.py's `ImportedTrace` calls these): a trace
read from an OpenTelemetry export (`tttr import`), with message fidelity and nothing below it.

It holds the model calls' messages and the tools' arguments and results, but no program, no
clock reads, no randomness, no file trees and no token ids or logits (`LACKS`). So `tttr diff`,
`events`, `runs` and the app show it like any run, and the verbs that re-execute a run refuse
it in one line: there is nothing to run again, and triage and bisect have no layer values.
"""

from __future__ import annotations

from tttr.engine.traces.errors import TraceError
from tttr.engine.traces.imported import LACKS, is_imported_run

__all__ = ["is_imported_run", "lacks_line", "check_replay", "check_fork", "check_experiment"]


def lacks_line(run) -> str:
    """What an imported run lacks, in one line (`tttr info`, the refusals)."""
    meta = run.meta if isinstance(run.meta, dict) else {}
    missing = meta.get("missing") if isinstance(meta.get("missing"), list) else []
    missing = [m for m in missing if isinstance(m, str)]
    more = f"; its trace also lacks {', '.join(missing)}" if missing else ""
    return f"no {', '.join(LACKS[:-1])} or {LACKS[-1]}{more}"


def _refuse(run, verb: str) -> TraceError:
    return TraceError(f"run {run.id} is an imported trace (tttr import): it holds no program to {verb} "
                      f"({lacks_line(run)}); compare it with `tttr diff`, or export it with "
                      f"`tttr export {run.id} --otlp FILE.json`")


def check_replay(reader, run, request):
    raise _refuse(run, "replay")


def check_fork(reader, run, request):
    raise _refuse(run, "fork")


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
            f"no {', '.join(LACKS[:-1])} or {LACKS[-1]}, so replay, fork and triage refuse them")
