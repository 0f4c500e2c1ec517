"""Edit-and-fork of a recorded program (`tttr record -- PROGRAM`) from the app.

The timeline's edit dialog comes here for a program run: what the dialog offers at an event
(an SDK function's result as JSON; at the setup event, as for the agent, a file of the start
tree, a variable or the start clock; the rest as for the agent). The check of a typed value and
the fork itself are the run's kind's (engine/kinds.py: edit_offer, check_value, check_fork, fork), asked
by the app as `tttr fork` asks them. No textual here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EditOffer:
    """What the edit dialog shows: the site forked at, the kind of value (its help line)
    and the recorded value as text the fork takes."""

    site: str
    kind: str  # "clock", "function" (an @sdk.tool's result) or the agent's kinds
    current: str


def offer(event) -> EditOffer | str | None:
    """For an event of a program run (the program kind's `edit_offer`): what the dialog offers
    there, or why nothing can be edited there (a line); None where the built-in agent's dialog
    applies as it is."""
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


__all__ = ["EditOffer", "offer"]
