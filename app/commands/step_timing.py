"""`tttr events DB RUN --timing`: each step's model, tool and wait time (ms), as the timing
view (`t` in the app) draws them, in a table or (--json) one JSON object. A run recorded
without per-step timings says so and gives each command's duration instead."""

from __future__ import annotations

import json
import sys

PARTS = ("model_ms", "tool_ms", "wait_ms")


def timing_json(run_id: int, timings) -> dict:
    from tttr.app.steps import timings_recorded
    from tttr.sessions.vocabulary import SETUP_STEP

    recorded = timings_recorded(timings)
    steps = [{"step": "setup" if t.step == SETUP_STEP else t.step, "tokens": t.tokens, "model_ms": t.model_ms,
              "tool_ms": t.tool_ms, "wait_ms": t.wait_ms, "command": t.command} for t in timings]
    totals = {part: round(sum(getattr(t, part) or 0 for t in timings), 3)
              if any(getattr(t, part) is not None for t in timings) else None for part in PARTS}
    return {"run": run_id, "recorded": recorded, "steps": steps, "totals": totals}


def print_timing(store, run_id: int, as_json: bool) -> int:
    from tttr.app.steps import TIMING_LACKS, step_timings

    answer = timing_json(run_id, step_timings(store, run_id))
    if as_json:
        print(json.dumps(answer, ensure_ascii=False))
        return 0
    from rich.text import Text

    from tttr.app.commands.store import _cell, _console, _fitted_table

    ms = lambda v: "—" if v is None else f"{v:,.1f}"  # noqa: E731 - a one-line local helper
    cells = [[str(s["step"]), str(s["tokens"]), ms(s["model_ms"]), ms(s["tool_ms"]), ms(s["wait_ms"]),
              _cell(s["command"])] for s in answer["steps"]]
    totals = answer["totals"]
    cells.append(["all", str(sum(s["tokens"] for s in answer["steps"])), ms(totals["model_ms"]),
                  ms(totals["tool_ms"]), ms(totals["wait_ms"]), ""])
    console = _console()
    heads = ["step", "tokens", "model ms", "tool ms", "wait ms", "command"]
    table = _fitted_table(console, Text(f"run {run_id}: timing of its steps"), heads, cells, squeeze=("command",),
                          right=heads[:5])
    for row in cells:
        table.add_row(*row)
    console.print(table)
    if not answer["recorded"]:
        print(TIMING_LACKS, file=sys.stdout)
    return 0
