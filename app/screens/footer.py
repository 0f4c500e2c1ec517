"""Every screen's footer on a narrow terminal (80 columns): compact, without the palette's
key (ctrl+p still opens it, and help says so), and leading with the app's own keys, help
and quit, so that the keys that explain the others are the last to be cut, not the first
(the footer lists the focused widget's keys, then the screen's, then the app's)."""

from __future__ import annotations

from textual.widgets import Footer

NARROW = 120  # columns under which the footer is compact and leads with help and quit
PALETTE_KEY = 100  # columns from which the footer shows ctrl+p


class FittedFooter:
    """A screen mixin (put it before Screen in the bases)."""

    @property
    def active_bindings(self):
        found = super().active_bindings
        if self.app.size.width >= NARROW:
            return found
        first = {key: active for key, active in found.items() if active.node is self.app}
        return {**first, **{key: active for key, active in found.items() if key not in first}}

    def on_resize(self, event) -> None:
        for footer in self.query(Footer):
            footer.compact = event.size.width < NARROW
            footer.show_command_palette = event.size.width >= PALETTE_KEY
        self.refresh_bindings()  # the footer lists its keys again, in the order for this width
