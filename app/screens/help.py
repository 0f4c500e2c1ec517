"""The help screen: the layers' letters and colours, and every key of the screen below."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tttr.app.runview import LAYER_ORDER, LAYERS

LAYER_HELP = {
    "tensor": "logits of a position: digest, top-k, batch composition, kernel mode",
    "token": "a generated token: id, text, logprob, sampled or forced, RNG",
    "trace": "the world: the virtual clock, a command's result, file snapshots",
    "agent": "derived values: prompt, message, parsed action, outcome",
}


def label_back(screen) -> None:
    """Name where `escape` (the screen's `back`) goes — the screen under it, by its
    `place` — in the footer and in help: `back to runs`, `back to run #3`, `back to compare`."""
    stack = screen.app.screen_stack
    below = stack[stack.index(screen) - 1] if screen in stack and stack.index(screen) > 0 else None
    place = getattr(below, "place", None)
    label = f"back to {place}" if place else "back"
    screen.back_label = label
    bindings = screen._bindings.key_to_bindings  # this screen's own copy: the class keeps its default
    bindings["escape"] = [replace(b, description=label) if b.action == "back" else b
                          for b in bindings.get("escape", [])]
    screen.refresh_bindings()


def key_label(key: str) -> str:
    names = {"full_stop": ".", "comma": ",", "slash": "/", "question_mark": "?", "colon": ":",
             "apostrophe": "'", "quotation_mark": '"', "left_square_bracket": "[", "right_square_bracket": "]"}
    return "/".join(names.get(k.strip(), k.strip()) for k in key.split(","))


@dataclass(frozen=True, slots=True)
class KeyHelp:
    """One key TTTR binds on a screen: what it does, and whether it does it now."""

    key: str  # as shown: `.`, `home/g`
    description: str
    node: Any  # the widget, screen or app the binding belongs to
    action: str  # the binding's action string, run on `node`
    available: bool  # False: the screen refuses it now (a diff with no parent, no fork to cancel)


def screen_keys(screen) -> list[KeyHelp]:
    """Every key TTTR defines for `screen`, read from the BINDINGS of its classes so the
    list cannot drift from what the keys do: the focused widget's first, then the other
    widgets of the screen, the screen's, the app's; Textual's own are left out. A key
    the screen refuses now is listed, marked unavailable."""
    app = screen.app
    nodes = []
    node = screen.focused
    while node is not None and node is not screen:
        nodes.append(node)
        node = node.parent
    nodes += [w for w in screen.query("*") if w not in nodes and _own(type(w))]
    nodes += [screen, app]
    out: list[KeyHelp] = []
    for node in nodes:
        for cls in reversed(type(node).__mro__):
            if not _own(cls):
                continue
            for binding in cls.__dict__["BINDINGS"]:
                action = binding.action.split("(")[0]
                description = binding.description or action
                if action == "back":  # says where it goes, which depends on the screen below
                    description = getattr(node, "back_label", description)
                available = node.check_action(action, ()) is not False
                out.append(KeyHelp(key_label(binding.key), description, node, binding.action, available))
    if app.ENABLE_COMMAND_PALETTE:  # Textual's key, but it lists TTTR's own commands (app/palette.py)
        out.append(KeyHelp("ctrl+p", "command palette: every command of this screen by name", app,
                           "command_palette", True))
    return out


def _own(cls) -> bool:
    return cls.__module__.startswith("tttr.app.") and "BINDINGS" in cls.__dict__


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "close")]

    def __init__(self, bindings: list[KeyHelp], title: str) -> None:
        super().__init__()
        self.bindings = bindings
        self.title_text = title

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-dialog"):
            yield Static(self.content)

    @property
    def content(self) -> Text:
        text = Text(f"TTTR · {self.title_text}\n", style="bold")
        text.append("\nLayers\n", style="bold underline")
        for layer in LAYER_ORDER:
            letter, colour = LAYERS[layer]
            text.append(f"  {letter} ", style=f"bold {colour}")
            text.append(f"{layer:<8}", style=colour)
            text.append(LAYER_HELP[layer] + "\n")
        text.append("\nKeys\n", style="bold underline")
        width = max((len(k.key) for k in self.bindings), default=0) + 2
        for key in self.bindings:
            text.append(f"  {key.key:<{width}}", style="bold" if key.available else "dim")
            text.append(key.description, style="" if key.available else "dim")
            text.append(" (not available here now)\n" if not key.available else "\n", style="dim")
        text.append("\nctrl+p opens the command palette: these commands by name", style="dim")
        text.append("\nescape or ? closes this help", style="dim")
        return text

    def action_close(self) -> None:
        self.dismiss(None)
