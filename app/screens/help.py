"""The help screen: the layers' letters and colours, and every key of the screen below."""

from __future__ import annotations

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
