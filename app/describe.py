"""How recorded values read on screen: one-line summaries for the timeline, detail
renderables for the detail pane, and the labels of a run (lineage, outcome).

Rich only (no textual), so every function here can be tested by rendering to text.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pygments.lexers import BashLexer, BashSessionLexer
from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.text import Text

from app.runview import LAYERS, RunView, is_blob

THEME = "ansi_dark"  # the terminal's own palette, so light and dark terminals both read
_BASH = BashLexer()
_CONSOLE = BashSessionLexer()


def highlight_bash(code: str) -> Text:
    text = Syntax("", _BASH, theme=THEME, background_color="default").highlight(code)
    text.rstrip()
    return text


def highlight_console(cmd: str, output: str) -> Text:
    """A command and its output as a shell transcript, highlighted by pygments."""
    transcript = f"$ {cmd}\n{output}" if output else f"$ {cmd}"
    text = Syntax("", _CONSOLE, theme=THEME, background_color="default").highlight(transcript)
    text.rstrip()
    return text


def layer_tag(layer: str) -> Text:
    letter, colour = LAYERS.get(layer, ("?", "white"))
    return Text(letter, style=f"bold {colour}")


def token_text(text: str) -> str:
    """A token's text made visible: quotes, escapes for newlines and tabs."""
    return json.dumps(text, ensure_ascii=False)


def short(text: str, width: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def size_label(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def rows_label(rows: Any) -> str:
    """A batch's row list, runs of consecutive rows written as ranges: 0–319, 4, 7–9."""
    if not isinstance(rows, list) or not all(isinstance(r, int) for r in rows):
        return str(rows)
    parts, i = [], 0
    while i < len(rows):
        j = i
        while j + 1 < len(rows) and rows[j + 1] == rows[j] + 1:
            j += 1
        parts.append(str(rows[i]) if i == j else f"{rows[i]}–{rows[j]}")
        i = j + 1
    return ", ".join(parts)


def _field(value: Any, key: str, default: Any = None) -> Any:
    return value.get(key, default) if isinstance(value, dict) else default


def _text_field(value: Any, key: str) -> str:
    field = _field(value, key)
    if is_blob(field):
        return f"‹blob {size_label(field.get('size'))}›"
    return "" if field is None else str(field)


# -- one line per event ------------------------------------------------------------------
def summary(event) -> Text:
    """What an event says, in one line, without reading any blob."""
    v, kind = event.value, event.kind
    if kind == "clock":
        return Text(str(_field(v, "t", v)), style="yellow")
    if kind == "tool":
        line = highlight_bash("$ " + short(_text_field(v, "cmd"), 60))
        code = _field(v, "exit_code")
        line.append(f"  → exit {code}", style="green" if code == 0 else "bold red")
        line.append(f" · {_field(v, 'duration_ms', '?')} ms", style="dim")
        out = _text_field(v, "stdout")
        if out:
            line.append("  " + short(out, 40), style="dim")
        return line
    if kind == "token":
        line = Text(token_text(str(_field(v, "text", ""))), style="bold")
        lp = _field(v, "logprob")
        if isinstance(lp, (int, float)):
            line.append(f"  lp {lp:.3f}", style="dim")
        if _field(v, "forced"):
            line.append("  forced", style="italic cyan")
        return line
    if kind == "logits":
        topk = _field(v, "topk") or []
        line = Text()
        if topk:
            first = topk[0]
            line.append(f"top #{first[0]} lp {first[1]:.3f}", style="magenta")
        batch = _field(v, "batch")
        if isinstance(batch, list) and len(batch) == 2:
            line.append(f" · batch {batch[0]} rows [{rows_label(batch[1])}]", style="dim")
        line.append(f" · {str(_field(v, 'digest', ''))[:10]}", style="dim")
        line.append(f" · {_field(v, 'mode', '?')}", style="dim")
        return line
    if kind == "prompt":
        return Text(f"{_field(v, 'n_tokens', '?')} tokens  ", style="dim") + Text(
            short(_text_field(v, "text"), 60)
        )
    if kind == "message":
        return Text(short(_text_field(v, "text"), 80))
    if kind == "action":
        if _field(v, "done"):
            return Text("done", style="bold green")
        return highlight_bash("$ " + short(_text_field(v, "cmd"), 70))
    if kind == "outcome":
        passed = _field(v, "passed")
        return Text(
            f"{'passed' if passed else 'failed'} (checker exit {_field(v, 'checker_exit', '?')})",
            style="bold green" if passed else "bold red",
        )
    return Text(short(json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v, 80), style="dim")


# -- the detail pane ------------------------------------------------------------------------
def _kv(rows: list[tuple[str, Any]]) -> Text:
    """Key/value lines with the keys in one column (plain Text: far cheaper than a
    rich Table, and the pane re-renders on every cursor move)."""
    width = max((len(k) for k, _ in rows), default=0) + 2
    out = Text()
    for i, (key, val) in enumerate(rows):
        if i:
            out.append("\n")
        out.append(f"{key:<{width}}", style="bold")
        value = val if isinstance(val, Text) else Text(str(val))
        out.append_text(_indent(value, width))
    return out


def _indent(text: Text, width: int) -> Text:
    """Continuation lines of a value start under the value, not under the key."""
    if "\n" not in text.plain:
        return text
    lines = text.split("\n", allow_blank=True)
    out = Text()
    for i, line in enumerate(lines):
        if i:
            out.append("\n" + " " * width)
        out.append_text(line)
    return out


def heading(event) -> Text:
    text = layer_tag(event.layer)
    text.append(f" {event.layer} · {event.kind}", style="bold")
    text.append(f"   site {event.site}   seq {event.seq}   step {event.step}", style="dim")
    return text


def detail(view: RunView, event, token_texts=None) -> RenderableType:
    """Everything the pane shows about `event`. `token_texts(ids) -> {id: text}` names
    the top-k alternatives when a tokenizer is at hand."""
    kind = event.kind
    if kind in ("token", "logits"):
        body = token_detail(view, event, token_texts)
    elif kind == "tool":
        body = tool_detail(view, event)
    elif kind == "clock":
        body = clock_detail(view, event)
    elif kind in ("message", "prompt"):
        body = Text(view.text(_field(event.value, "text")))
    elif kind == "action":
        cmd = _field(event.value, "cmd")
        body = Text("done: the agent stopped", style="green") if cmd is None else highlight_bash(str(cmd))
    elif kind == "outcome":
        v = event.value
        body = Group(
            summary(event),
            Text(view.text(_field(v, "checker_output")), style="dim"),
        )
    else:
        body = Text(json.dumps(event.value, indent=2, ensure_ascii=False))
    hint = Text()
    if kind in ("clock", "tool", "token"):
        hint = Text("press e to edit this value and fork the run here", style="italic dim")
    return Group(heading(event), Text(""), body, Text(""), hint)


def token_detail(view: RunView, event, token_texts=None) -> RenderableType:
    token = event if event.kind == "token" else view.token_for(event)
    logits = event if event.kind == "logits" else view.logits_for(event)
    rows: list[tuple[str, Any]] = []
    if token is not None:
        v = token.value
        lp = _field(v, "logprob")
        rows += [
            ("token", Text(token_text(str(_field(v, "text", ""))), style="bold reverse")),
            ("id", _field(v, "id")),
            ("how", "forced (context identical to the recording)" if _field(v, "forced") else "sampled"),
            ("logprob", f"{lp:.4f}   p = {math.exp(lp):.4f}" if isinstance(lp, (int, float)) else lp),
            ("rng", _field(v, "rng")),
        ]
    chosen = _field(token.value, "id") if token is not None else None
    parts: list[RenderableType] = [_kv(rows)]
    if logits is not None:
        v = logits.value
        batch = _field(v, "batch")
        if isinstance(batch, list) and len(batch) == 2:
            batch_text = f"{batch[0]} rows in the pass; this sequence's rows {rows_label(batch[1])}"
        else:
            batch_text = str(batch)
        parts += [
            Text(""),
            _kv([
                ("logits", Text(logits.site, style="magenta")),
                ("digest", str(_field(v, "digest"))),
                ("batch", batch_text),
                ("kernels", str(_field(v, "mode"))),
            ]),
            Text(""),
            topk_table(_field(v, "topk") or [], chosen, token_texts),
        ]
    else:
        parts.append(Text("no logits recorded for this position", style="dim"))
    return Group(*parts)


def alternatives(view: RunView, event, token_texts=None) -> list[tuple[int, str | None, float]]:
    """The recorded top-k at a token's position: (id, text or None, logprob)."""
    logits = event if event.kind == "logits" else view.logits_for(event)
    topk = _field(logits.value, "topk") if logits is not None else None
    if not topk:
        return []
    names = token_texts([int(e[0]) for e in topk]) if token_texts else {}
    out = []
    for entry in topk:
        text = entry[2] if len(entry) > 2 else names.get(int(entry[0]))
        out.append((int(entry[0]), text, float(entry[1])))
    return out


def topk_table(topk: list, chosen: int | None, token_texts=None) -> Text:
    names = token_texts([int(e[0]) for e in topk[:5]]) if token_texts else {}
    out = Text("top-5 alternatives\n", style="italic")
    out.append(f"  {'id':>6}  {'text':<14} {'logprob':>8} {'p':>6}", style="dim")
    for entry in topk[:5]:
        tid, lp = int(entry[0]), float(entry[1])
        text = entry[2] if len(entry) > 2 else names.get(tid)
        shown = token_text(text) if text is not None else "·"
        mark = "▶" if tid == chosen else " "
        out.append(f"\n{mark} {tid:>6}  {shown:<14} {lp:>8.3f} {math.exp(lp):>6.3f}",
                   style="bold cyan" if tid == chosen else "")
    return out


def tool_detail(view: RunView, event) -> RenderableType:
    v = event.value if isinstance(event.value, dict) else {}
    clock = view.at(f"{event.step}:clock")
    code = v.get("exit_code")
    rows: list[tuple[str, Any]] = [
        ("clock", Text(str(_field(clock.value, "t")) if clock else "not recorded", style="yellow")),
        ("cwd", str(v.get("cwd", "?"))),
        ("exit code", Text(str(code), style="green" if code == 0 else "bold red")),
        ("duration", f"{v.get('duration_ms', '?')} ms"),
        ("output", f"stdout {size_label(v.get('stdout_size'))}, stderr {size_label(v.get('stderr_size'))}"
                   + ("  (truncated)" if v.get("truncated") else "")),
        ("files changed", files_label(view.files_changed(event))),
        ("tree", f"{str(v.get('tree_before', '?'))[:12]} → {str(v.get('tree_after', '?'))[:12]}"),
    ]
    parts: list[RenderableType] = [
        highlight_console(view.text(v.get("cmd")), view.text(v.get("stdout"))),
    ]
    stderr = view.text(v.get("stderr"))
    if stderr:
        parts.append(Text(stderr.rstrip("\n"), style="red"))
    parts += [Text(""), _kv(rows)]
    env = v.get("env")
    if isinstance(env, dict) and env:
        parts += [Text(""), Text("environment", style="bold"),
                  _kv([(k, str(env[k])) for k in sorted(env)])]
    return Group(*parts)


def files_label(changes) -> Text:
    if changes is None:
        return Text("unknown (no snapshot recorded for this step)", style="dim")
    if not changes:
        return Text("none", style="dim")
    marks = {"added": ("+", "green"), "removed": ("-", "red"), "modified": ("~", "yellow")}
    text = Text()
    for i, change in enumerate(changes):
        mark, colour = marks.get(change.change, ("?", "white"))
        text.append(("\n" if i else "") + f"{mark} {change.path}", style=colour)
    return text


def clock_detail(view: RunView, event) -> RenderableType:
    rows: list[tuple[str, Any]] = [("clock", Text(str(_field(event.value, "t")), style="bold yellow"))]
    before = view.at(f"{event.step - 1}:clock") if event.step > 0 else None
    if before is not None:
        rows.append(("previous step", str(_field(before.value, "t"))))
    tool = view.at(f"{event.step}:tool")
    if tool is not None:
        rows.append(("read by", highlight_bash("$ " + short(view.text(_field(tool.value, "cmd")), 70))))
    return _kv(rows)


# -- runs -------------------------------------------------------------------------------------
def lineage(run) -> str:
    parent = getattr(run, "parent", None)
    if parent is None:
        return "recorded"
    meta = getattr(run, "meta", None) or {}
    replay = meta.get("replay") if isinstance(meta, dict) else None
    if replay is not None:
        free = replay.get("free") if isinstance(replay, dict) else None
        return f"replay of #{parent}, free: {', '.join(free) if free else 'none'}"
    mutation = getattr(run, "mutation", None)
    site = getattr(run, "fork_site", None)
    shown = mutation
    if isinstance(mutation, dict):
        shown = mutation.get("text", mutation.get("value", mutation))
    return f"fork of #{parent} at {site} = {short(json.dumps(shown, ensure_ascii=False), 30)}"


def outcome_label(run) -> Text:
    outcome = getattr(run, "outcome", None)
    if not outcome:
        return Text("—", style="dim")
    passed = outcome.get("passed") if isinstance(outcome, dict) else None
    if passed is None:
        return Text(short(json.dumps(outcome), 20))
    return Text("pass", style="bold green") if passed else Text("fail", style="bold red")


def status_label(run) -> Text:
    status = str(getattr(run, "status", "?"))
    colour = {"complete": "green", "incomplete": "yellow", "failed": "red", "recording": "cyan"}.get(status, "white")
    return Text(status, style=colour)


def run_title(run) -> str:
    return (
        f"run #{run.id} · {run.task} · {short(run.model_id or '?', 32)} · "
        f"{run.kernel_mode} · seed {run.seed}"
    )
