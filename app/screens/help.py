"""The help screen: the layers' letters and colours, and every key of the screen below."""

from __future__ import annotations

from dataclasses import replace

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
    names = {"full_stop": ".", "comma": ",", "slash": "/", "question_mark": "?",
             "left_square_bracket": "[", "right_square_bracket": "]"}
    return "/".join(names.get(k.strip(), k.strip()) for k in key.split(","))


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "close")]

    def __init__(self, bindings: list[tuple[str, str]], title: str) -> None:
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
        width = max((len(k) for k, _ in self.bindings), default=0) + 2
        for key, description in self.bindings:
            text.append(f"  {key:<{width}}", style="bold")
            text.append(description + "\n")
        text.append("\nescape or ? closes this help", style="dim")
        return text

    def action_close(self) -> None:
        self.dismiss(None)
