"""The files screen: the sandbox's files after a step, each marked by how it differs from
another tree — the step before (from the timeline) or the same step of the other run (from
the compare screen) — and, for the file under the cursor, its text diff or its contents.

Trees and file texts come from `tttr.recorders.treestate`, read in workers (the store is
safe to share between threads), so a large tree or file never blocks a key. Everything
shown comes from the database: names and contents are made visible and shown as `Text`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from tttr.app.screens.footer import FittedFooter
from tttr.app.screens.help import label_back
from tttr.app.widgets.detail import DetailPane
from tttr.sessions.safe_text import short, visible

MARK = {"added": "+", "removed": "−", "changed": "~", None: " "}
MARK_STYLE = {"added": "green", "removed": "red", "changed": "yellow", None: ""}


@dataclass(frozen=True, slots=True)
class TreeRef:
    """A tree to show: run `run` after step `step` (its final tree if it ended before)."""

    run: int
    step: int


@dataclass(frozen=True, slots=True)
class Listed:
    """One line of the file list: a path of the shown tree (or one it lost) and its change."""

    path: str
    change: str | None  # added, removed, changed, or None when it is the same in both trees
    entry: object       # the shown tree's Entry (the other tree's for a removed path)
    file_change: object | None  # treestate.FileChange, when the path differs


class FilesLoaded(Message):
    def __init__(self, shown, base, listed: list[Listed] | None, error: str | None = None) -> None:
        super().__init__()
        self.shown, self.base, self.listed, self.error = shown, base, listed, error


class FileLoaded(Message):
    def __init__(self, path: str, body: Text) -> None:
        super().__init__()
        self.path, self.body = path, body


class BlameFound(Message):
    """Who last wrote a file (`engine.blame.Blame`), or why that cannot be told."""

    def __init__(self, blame, error: str | None = None) -> None:
        super().__init__()
        self.blame, self.error = blame, error


class FilesScreen(FittedFooter, Screen):
    CSS_PATH = "../styles/files.tcss"
    BINDINGS = [
        Binding("c", "toggle_contents", "diff / contents"),
        Binding("b", "blame", "the step that wrote it"),
        Binding("escape", "back", "back"),
    ]
    place = "files"

    def __init__(self, shown: TreeRef, base: TreeRef | None = None) -> None:
        super().__init__()
        self.shown_ref, self.base_ref = shown, base
        self.listed: list[Listed] = []
        self.contents = False  # show the file's contents rather than its diff
        self.trees = None      # (shown TreeAt, base TreeAt or None), once loaded

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="files-title")
        with Horizontal(id="files-body"):
            yield OptionList(id="files-list")
            yield DetailPane(id="files-detail")
        yield Static("", id="files-summary")
        yield Footer()

    def _title(self) -> Text:
        s, b = self.shown_ref, self.base_ref
        text = Text("files ", style="bold")
        if b is None:
            text.append(f"of run #{s.run} after {_step_name(s.step)}")
        elif b.run == s.run:
            text.append(f"of run #{s.run} after {_step_name(s.step)}, marked against {_step_name(b.step)}")
        elif b.step == s.step:
            text.append(f"after {_step_name(b.step)}: run #{b.run} ┃ run #{s.run}, marked from left to right")
        else:
            text.append(f"run #{b.run} after {_step_name(b.step)} ┃ run #{s.run} after {_step_name(s.step)}, "
                        "marked from left to right")
        return text

    def on_mount(self) -> None:
        label_back(self)
        self.query_one(OptionList).focus()
        self.run_worker(self._load, thread=True, exit_on_error=False, name="files")

    # -- loading ---------------------------------------------------------------------------
    def _load(self) -> None:
        from tttr.recorders.treestate import RunTrees, diff_trees

        store = self.app.store
        try:
            shown = RunTrees(store, self.shown_ref.run).at_or_final(self.shown_ref.step)
            base = None
            if self.base_ref is not None:
                base = RunTrees(store, self.base_ref.run).at_or_final(self.base_ref.step)
            listed = _listing(shown, base, diff_trees(base, shown) if base is not None else None)
        except Exception as exc:  # noqa: BLE001 - shown on screen
            text = str(exc) if getattr(exc, "exit_code", None) is not None else f"{type(exc).__name__}: {exc}"
            self.post_message(FilesLoaded(None, None, None, text))
            return
        self.post_message(FilesLoaded(shown, base, listed))

    def on_files_loaded(self, message: FilesLoaded) -> None:
        summary = self.query_one("#files-summary", Static)
        if message.listed is None:
            summary.update(Text(f"the files cannot be shown: {short(message.error, 300)}", style="red"))
            return
        self.trees = (message.shown, message.base)
        self.listed = message.listed
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_options([Option(_line(item), id=None) for item in self.listed])
        summary.update(self._summary(message.shown, message.base))
        if self.listed:
            first = next((i for i, item in enumerate(self.listed) if item.change), 0)
            options.highlighted = first
        else:
            self.query_one(DetailPane).show(Text(message.shown.note or "no files", style="dim"))

    def _summary(self, shown, base) -> Text:
        text = Text()
        for tree, side in ((base, "from"), (shown, "to" if base is not None else "tree")):
            if tree is None:
                continue
            text.append(f"{side} run #{tree.run} {_step_name(tree.step)}", style="bold")
            text.append(f" ({short(tree.site or 'no event', 24)}, tree {short(tree.digest or '?', 12)[:12]})  ",
                        style="dim")
            if tree.note:
                text.append(short(tree.note, 120) + "  ", style="yellow")
        counts = {c: sum(1 for x in self.listed if x.change == c) for c in ("added", "removed", "changed")}
        if base is not None and not (shown.note or base.note):
            if any(counts.values()):
                text.append(" · ".join(f"{n} {c}" for c, n in counts.items()), style="bold")
            else:
                text.append("no file differs", style="bold green")
        return text

    # -- the file under the cursor ---------------------------------------------------------
    def on_option_list_option_highlighted(self, message: OptionList.OptionHighlighted) -> None:
        self._show_file()

    def _show_file(self) -> None:
        index = self.query_one(OptionList).highlighted
        if index is None or not 0 <= index < len(self.listed):
            return
        item = self.listed[index]
        self.query_one(DetailPane).show(Text(f"{visible(item.path, newlines=False)}\nreading …", style="dim"))
        self.run_worker(partial(self._read, item, self.contents), thread=True, exclusive=True, group="file",
                        exit_on_error=False, name="file")

    def _read(self, item: Listed, contents: bool) -> None:
        from tttr.recorders.treestate import change_text, file_text, mode_text, text_diff

        store = self.app.store
        body = Text()
        body.append(visible(item.path, newlines=False), style="bold")
        entry = item.entry
        size = f"  {entry.size:,} bytes" if entry.kind == "f" and isinstance(entry.size, int) else ""
        body.append(f"  {mode_text(entry)}", style="dim")
        if item.file_change is not None:
            body.append(f"  {change_text(item.file_change)}", style=MARK_STYLE[item.change])
        if item.file_change is None or item.change == "changed":
            body.append(size, style="dim")
        body.append("\n\n")
        try:
            if item.file_change is not None and not contents:
                shown = text_diff(store, item.file_change)
                for line in (shown.text or "").splitlines():
                    style = ("green" if line.startswith("+") and not line.startswith("+++")
                             else "red" if line.startswith("-") and not line.startswith("---")
                             else "cyan" if line.startswith("@@") else "")
                    body.append(visible(line, newlines=False) + "\n", style=style)
            else:
                shown = file_text(store, entry)
                body.append(visible(shown.text or ""))
            if shown.note:
                body.append(f"\n{visible(shown.note, newlines=False)}", style="dim italic")
        except Exception as exc:  # noqa: BLE001 - said where the text would be
            body.append(f"cannot read it: {short(exc, 200)}", style="red")
        self.post_message(FileLoaded(item.path, body))

    def on_file_loaded(self, message: FileLoaded) -> None:
        index = self.query_one(OptionList).highlighted
        if index is not None and 0 <= index < len(self.listed) and self.listed[index].path == message.path:
            self.query_one(DetailPane).show(message.body)

    def action_toggle_contents(self) -> None:
        self.contents = not self.contents
        self._show_file()

    def action_blame(self) -> None:
        """`b`: the step and command that last wrote the file under the cursor (or removed
        it), read in a worker; then its timeline, at that step's command."""
        index = self.query_one(OptionList).highlighted
        if self.trees is None or index is None or not 0 <= index < len(self.listed):
            self.app.bell()
            return
        shown = self.trees[0]
        self.run_worker(partial(self._blame, shown.run, self.listed[index].path, shown.step), thread=True,
                        exclusive=True, group="blame", exit_on_error=False, name="blame")

    def _blame(self, run: int, path: str, step: int) -> None:
        from tttr.engine.blame import blame

        try:
            found = blame(self.app.store, run, path, step)
        except Exception as exc:  # noqa: BLE001 - said in a notification
            self.post_message(BlameFound(None, str(exc) if getattr(exc, "exit_code", None) is not None
                                         else f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(BlameFound(found))

    def on_blame_found(self, message: BlameFound) -> None:
        if message.blame is None:
            self.notify(f"cannot tell who wrote it: {short(message.error, 200)}", severity="warning", markup=False)
            return
        found = message.blame
        self.notify(visible(found.describe(), newlines=False), timeout=6, markup=False)
        self.app.show_event(found.run, found.seq, below=self)

    def action_back(self) -> None:
        self.app.pop_screen()

    @property
    def detail_text(self) -> str:
        return self.query_one(DetailPane).text


def _step_name(step: int) -> str:
    return "the setup" if step < 0 else f"step {step}"


def _listing(shown, base, diff) -> list[Listed]:
    """Every path of the shown tree and every path it lost, in path order, with its change."""
    changes = {c.path: c for c in diff.changes} if diff is not None else {}
    listed = [Listed(p, changes[p].change if p in changes else None, e, changes.get(p))
              for p, e in shown.files.items()]
    listed += [Listed(c.path, c.change, c.before, c) for c in changes.values() if c.change == "removed"]
    return sorted(listed, key=lambda item: item.path)


def _line(item: Listed) -> Text:
    text = Text(f"{MARK[item.change]} ", style=f"bold {MARK_STYLE[item.change]}")
    name = visible(item.path, newlines=False) + ("/" if getattr(item.entry, "kind", "") == "d" else "")
    text.append(name, style=MARK_STYLE[item.change] or None)
    return text
