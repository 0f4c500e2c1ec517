"""A run's events, or a comparison of two runs, written as JSON Lines or Markdown.

Used by the app's export dialog and by `tttr events --format`, and usable from a script:

    with Store.open("session.db", readonly=True) as store:
        export_run(store, 3, "run-3.md")
        export_compare(diff_runs(store, 1, 3), "compare.jsonl")   # engine.replay.diff

Events are read by window (a run of 100k events never sits in memory at once). Values are
written as recorded: a large output stays a `{"$blob": ...}` reference. Text from the
database is untrusted: JSON escapes every control character a terminal would act on, and
Markdown shows them as visible escapes, never as markup.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import IO, Any, Iterable

from tttr.sessions.errors import TTTRError
from tttr.sessions.safe_text import short, visible

FORMATS = ("jsonl", "md")
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".md": "md", ".markdown": "md"}
CHUNK = 5000  # events per read
MD_VALUE = 160  # characters of a value in a Markdown table cell

# C1 controls and the bidi/format characters `visible` shows; JSON leaves them raw (only
# C0 must be escaped), so they are escaped here. Valid JSON either way.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff\u2028\u2029]")


class ExportError(TTTRError):
    """A path or format the export cannot write (one line, exit code 2)."""


def safe_json(value: object, **kwargs) -> str:
    """json.dumps whose output holds no control character a terminal would act on."""
    text = json.dumps(value, ensure_ascii=False, **kwargs)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def event_row(e) -> dict:
    """One event as a JSON object: run, seq, step, layer, kind, site, value, origin (and
    `problem` when its value cannot be read: the value is then null)."""
    row = {"run": e.run, "seq": e.seq, "step": e.step, "layer": e.layer, "kind": e.kind, "site": e.site,
           "value": e.value, "origin": e.origin}
    if e.problem:
        row["problem"] = e.problem
    return row


def format_for(path: str | Path, fmt: str | None = None) -> str:
    """The format to write `path` in: `fmt` if given, else the one its suffix names."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ExportError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")
        return fmt
    found = SUFFIXES.get(Path(path).suffix.lower())
    if found is None:
        raise ExportError(f"cannot tell the format of {visible(str(path), newlines=False)!r}: "
                          "name it .jsonl (JSON Lines) or .md (Markdown)")
    return found


def iter_events(store, run_id: int, start: int = 0, limit: int | None = None, *,
                layer: str | None = None, kind: str | None = None) -> Iterable:
    """A run's events from `start` in seq order, read `CHUNK` at a time."""
    left = limit
    while left is None or left > 0:
        chunk = CHUNK if left is None else min(CHUNK, left)
        window = store.events(run_id, start, None, layer=layer, kind=kind, limit=chunk)
        yield from window
        if len(window) < chunk:
            return
        start = window[-1].seq + 1
        left = None if left is None else left - len(window)


def _cell(value: Any, width: int = MD_VALUE) -> str:
    """A Markdown table cell: one line, controls visible, pipes escaped, cut to `width`."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return short(visible(text, newlines=False), width).replace("|", "\\|")


def _code(value: Any, width: int = MD_VALUE) -> str:
    """A Markdown table cell as inline code (a value with backticks gets a longer fence)."""
    text = _cell(value, width)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def write_events_jsonl(events: Iterable, out: IO[str]) -> int:
    n = 0
    for e in events:
        out.write(safe_json(event_row(e)) + "\n")
        n += 1
    return n


def write_events_md(run, events: Iterable, out: IO[str], *, title: str | None = None) -> int:
    """A heading with the run's metadata, then one table row per event."""
    out.write(f"# {_cell(title or f'run {run.id}', 200)}\n\n")
    for key in ("task", "model_id", "kernel_mode", "seed", "status", "parent", "fork_site", "outcome"):
        value = getattr(run, key, None)
        if key == "outcome" and value is not None:
            value = value.to_json()
        if value is not None:
            out.write(f"- **{key}**: {_cell(value, 300)}\n")
    out.write("\n| seq | step | layer | kind | site | value |\n|---:|---:|---|---|---|---|\n")
    n = 0
    for e in events:
        value = f"unreadable: {e.problem}" if e.problem else e.value
        if not e.problem and e.kind == "token" and isinstance(e.value, dict) and "text" in e.value:
            value = e.value["text"]
        out.write(f"| {e.seq} | {e.step} | {_cell(e.layer, 20)} | {_cell(e.kind, 20)} | {_cell(e.site, 40)} "
                  f"| {_code(value)} |\n")
        n += 1
    return n


def export_run(store, run_id: int, path: str | Path, fmt: str | None = None) -> int:
    """Write every event of run `run_id` to `path` (JSON Lines or Markdown, by `fmt` or
    the path's suffix); returns the number of events written."""
    fmt = format_for(path, fmt)
    run = store.run(run_id)  # an unknown run fails here, before the file is made
    with _writing(path) as out:
        events = iter_events(store, run_id)
        return write_events_jsonl(events, out) if fmt == "jsonl" else write_events_md(run, events, out)


def export_compare(diff, path: str | Path, fmt: str | None = None) -> int:
    """Write a comparison of two runs (`engine.replay.diff.diff_runs`'s result, or its
    `to_json()`) to `path`; returns the number of rows written. JSON Lines: a summary
    line (`run_a`, `run_b`, `identical`, `first_divergence`, and whatever else the diff
    reports), then one line per aligned step."""
    fmt = format_for(path, fmt)
    data = diff.to_json() if hasattr(diff, "to_json") else dict(diff)
    rows = data.pop("rows", [])
    with _writing(path) as out:
        if fmt == "jsonl":
            out.write(safe_json({"what": "comparison", **data}) + "\n")
            for row in rows:
                out.write(safe_json({"what": "row", **row}) + "\n")
            return len(rows)
        a, b = data.get("run_a"), data.get("run_b")
        out.write(f"# run {_cell(a, 20)} compared with run {_cell(b, 20)}\n\n")
        for key, value in data.items():
            if key not in ("run_a", "run_b", "first_divergence"):
                out.write(f"- **{_cell(key, 40)}**: {_cell(value, 300)}\n")
        divergences = data.get("first_divergence") or {}
        if divergences:
            out.write("\n## First divergence by layer\n\n| layer | site | values |\n|---|---|---|\n")
            for layer, d in divergences.items():
                rest = {k: v for k, v in d.items() if k not in ("site", "layer")} if isinstance(d, dict) else d
                site = d.get("site") if isinstance(d, dict) else ""
                out.write(f"| {_cell(layer, 20)} | {_cell(site, 40)} | {_code(rest)} |\n")
        out.write(f"\n## Steps\n\n| step {_cell(a, 20)} | action | step {_cell(b, 20)} | action | same |\n"
                  "|---:|---|---:|---|---|\n")
        for r in rows:
            out.write(f"| {_cell(r.get('a_step') if r.get('a_step') is not None else '', 10)} "
                      f"| {_cell(r.get('a_action') or '')} "
                      f"| {_cell(r.get('b_step') if r.get('b_step') is not None else '', 10)} "
                      f"| {_cell(r.get('b_action') or '')} | {'yes' if r.get('same') else '**no**'} |\n")
        return len(rows)


class _writing:
    """Open `path` for writing text; a failure leaves no half-written file behind."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __enter__(self) -> IO[str]:
        if self.path.is_dir():
            raise ExportError(f"{visible(str(self.path), newlines=False)} is a folder: give a file name")
        if not self.path.parent.is_dir():
            raise ExportError(f"no folder {visible(str(self.path.parent), newlines=False)} to write "
                              f"{visible(self.path.name, newlines=False)} in")
        self.tmp = self.path.with_name(f".{self.path.name}.part")
        try:
            self.out = open(self.tmp, "w", encoding="utf-8")
        except OSError as exc:
            raise ExportError(f"cannot write {visible(str(self.path), newlines=False)}: {exc.strerror}") from None
        return self.out

    def __exit__(self, kind, exc, tb) -> None:
        self.out.close()
        if kind is None:
            self.tmp.replace(self.path)
        else:
            self.tmp.unlink(missing_ok=True)
