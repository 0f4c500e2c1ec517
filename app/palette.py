"""The command palette (ctrl+p) lists TTTR's own commands for the screen it is opened
from: every key that screen binds (go to, bookmarks, edit & fork, compare, export, …),
read from the same BINDINGS as `?` so the two cannot disagree, plus what has no key
(export a comparison)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from textual.command import DiscoveryHit, Hit, Hits, Provider

from tttr.app.screens.help import screen_keys


@dataclass(frozen=True, slots=True)
class PaletteCommand:
    name: str
    help: str
    run: Callable[[], object]


def palette_commands(screen) -> list[PaletteCommand]:
    """What the palette offers on `screen`: its available keys, then keyless commands."""
    app = screen.app
    out: list[PaletteCommand] = []
    seen: set[str] = set()
    for key in screen_keys(screen):
        if not key.available or key.action in ("help", "command_palette") or key.description in seen:
            continue
        seen.add(key.description)
        run = _runner(app, key.node, key.action)
        out.append(PaletteCommand(key.description[:1].upper() + key.description[1:], f"key {key.key}", run))
    run_a, run_b = getattr(screen, "run_a", None), getattr(screen, "run_b", None)
    if isinstance(run_a, int) and isinstance(run_b, int):
        from tttr.app.exporting import ask_export

        out.append(PaletteCommand("Export this comparison", "as JSON Lines or Markdown",
                                  lambda: ask_export(app, run_a, run_b)))
    return out


def _runner(app, node, action: str) -> Callable[[], None]:
    return lambda: app.call_later(app.run_action, action, node)


class TTTRCommands(Provider):
    """TTTR's commands, for the screen the palette was opened from."""

    async def discover(self) -> Hits:
        for command in palette_commands(self.screen):
            yield DiscoveryHit(command.name, command.run, help=command.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for command in palette_commands(self.screen):
            score = matcher.match(command.name)
            if score > 0:
                yield Hit(score, matcher.highlight(command.name), command.run, help=command.help)
