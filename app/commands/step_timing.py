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
    from rich.console import Console
    from rich.text import Text

    from tttr.app.commands.streamed_table import StreamedTable
    from tttr.sessions.safe_text import visible

    ms = lambda v: "—" if v is None else f"{v:,.1f}"  # noqa: E731 - a one-line local helper
    cells = [[str(s["step"]), str(s["tokens"]), ms(s["model_ms"]), ms(s["tool_ms"]), ms(s["wait_ms"]),
              visible(s["command"], newlines=False)] for s in answer["steps"]]
    totals = answer["totals"]
    cells.append(["all", str(sum(s["tokens"] for s in answer["steps"])), ms(totals["model_ms"]),
                  ms(totals["tool_ms"]), ms(totals["wait_ms"]), ""])
    console = Console(highlight=False, soft_wrap=False)
    console.print(Text(f"run {run_id}: timing of its steps", style="bold"))
    heads = ("step", "tokens", "model ms", "tool ms", "wait ms", "command")
    table = StreamedTable(console, heads, squeeze=("command",), right=heads[:5])
    table.add(cells)
    table.close()
    if not answer["recorded"]:
        print(TIMING_LACKS, file=sys.stdout)
    return 0
