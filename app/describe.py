"""How recorded values read on screen: one-line summaries for the timeline, detail
renderables for the detail pane, and the labels of a run (lineage, outcome).

Rich only (no textual), so every function here can be tested by rendering to text.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pygments.lexers import BashLexer
from pygments.token import Token
from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.text import Text

from tttr.app.runview import LAYERS, LOADING, TOO_LARGE, RunView, is_blob, value_problem
from tttr.engine.replay.diff import token_label
from tttr.sessions.records import Outcome
from tttr.sessions.vocabulary import MUTABLE, SETUP, SETUP_STEP
from tttr.sessions.safe_text import short, visible  # noqa: F401 - short: the app calls it describe.short

THEME = "ansi_dark"  # the terminal's own palette, so light and dark terminals both read
_BASH = BashLexer()


SHOWN_CHARS = 16 * 1024  # of an output in the detail pane: laying out more costs every cursor move
SHOWN_LINES = 300


def safe(value: Any, style: str = "", *, one_line: bool = False) -> Text:
    """Recorded text as Rich Text: never parsed as markup, control characters visible."""
    return Text(visible("" if value is None else value, newlines=not one_line), style=style)


def clip(text: str, chars: int = SHOWN_CHARS, lines: int = SHOWN_LINES) -> str:
    """At most `chars` characters and `lines` lines of `text`, saying what was left out."""
    head = text[:chars]
    cut = head.split("\n", lines)
    if len(cut) > lines:
        head = "\n".join(cut[:lines])
    if len(head) < len(text):
        head += f"\n… {TOO_LARGE}: {len(text) - len(head)} more characters not shown"
    return head


def highlight_bash(code: str) -> Text:
    text = Syntax("", _BASH, theme=THEME, background_color="default").highlight(clip(visible(code[:SHOWN_CHARS * 4])))
    text.rstrip()
    return text


def highlight_console(cmd: str, output: str) -> Text:
    """A command and its output as a shell transcript: the command highlighted by
    pygments, the output in the transcript's output style. (The session lexer takes
    time quadratic in a line's length, and an output line can be any length.)"""
    theme = Syntax.get_theme(THEME)
    text = Text()
    text.append("$ ", style=theme.get_style_for_token(Token.Generic.Prompt))
    text.append_text(highlight_bash(clip(visible(cmd[:8192]), 4096, 20)))
    output = clip(visible(output[:SHOWN_CHARS * 4])).rstrip()
    if output:
        text.append("\n" + output, style=theme.get_style_for_token(Token.Generic.Output))
    return text


def layer_tag(layer: str) -> Text:
    letter, colour = LAYERS.get(layer, ("?", "white"))
    return Text(letter, style=f"bold {colour}")


def token_text(text: Any) -> str:
    """A token's text made visible: quotes, escapes for newlines, tabs and controls."""
    return visible(json.dumps(str(text)[:200], ensure_ascii=False), newlines=False)


def size_label(n: Any) -> str:
    if not isinstance(n, (int, float)) or isinstance(n, bool) or n < 0:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def rows_label(rows: Any) -> str:
    """A batch's row list, runs of consecutive rows written as ranges: 0–319, 4, 7–9."""
    if not isinstance(rows, list) or not all(isinstance(r, int) for r in rows):
        return short(rows, 40)
    parts, i = [], 0
    while i < len(rows):
        j = i
        while j + 1 < len(rows) and rows[j + 1] == rows[j] + 1:
            j += 1
        parts.append(str(rows[i]) if i == j else f"{rows[i]}–{rows[j]}")
        i = j + 1
        if len(parts) > 64:
            parts.append("…")
            break
    return ", ".join(parts)


def _field(value: Any, key: str, default: Any = None) -> Any:
    return value.get(key, default) if isinstance(value, dict) else default


def _text_field(value: Any, key: str) -> str:
    """A field as one line of text, a blob by its size (summaries never read blobs)."""
    field = _field(value, key)
    if is_blob(field):
        return f"‹blob {size_label(field.get('size'))}›"
    return "" if field is None else short(field, 200)


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def preview(value: Any, width: int = 2000, *, quote: bool = False) -> str:
    """A value of any shape as visible JSON text, at most `width` characters; a string as
    it is, or quoted as JSON with `quote`."""
    try:
        if isinstance(value, str) and not quote:
            text = value
        else:
            text = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = f"‹{type(value).__name__} too deeply nested to show›"
    if len(text) > width:
        text = text[:width] + f"… ({TOO_LARGE})"
    return visible(text)


def unreadable_label(problem: str) -> Text:
    return Text("✗ unreadable: " + visible(problem, newlines=False), style="bold red")


# -- one line per event ------------------------------------------------------------------
def summary(event) -> Text:
    """What an event says, in one line, without reading any blob. A value that is not the
    shape of its kind says it is unreadable, and why."""
    problem = value_problem(event)
    if problem is not None:
        return unreadable_label(short(problem, 200))
    try:
        return _summary(event)
    except Exception as exc:  # noqa: BLE001 - a shape the checks missed is still only a line
        return unreadable_label(f"{type(exc).__name__}: {short(exc, 100)}")


def _summary(event) -> Text:
    v, kind = event.value, event.kind
    if kind == "clock":
        line = safe(short(_field(v, "t", v), 60), style="yellow")
        if _field(v, "source") == "sdk":
            line.append("  sdk.now()", style="dim")
        return line
    if kind == "tool" and "function" in v:
        return sdk_call_line(v, 60)
    if kind == "setup" and isinstance(_field(v, "program"), list):
        return Text(f"{short(program_line(v), 50)} · clock {short(_field(v, 'clock'), 30)}", style="dim")
    if kind == "setup" and isinstance(v, dict) and "task" in v:  # an agent run's task set up
        return Text(f"task {short(_field(v, 'task'), 40)} · clock {short(_field(v, 'clock'), 30)} · "
                    f"start tree {short(_field(v, 'tree', '?'), 13)[:12]}", style="dim")
    if kind == "outcome" and isinstance(v, dict) and "passed" not in v:
        return program_outcome_line(v)
    if kind == "tool":
        line = highlight_bash("$ " + short(_text_field(v, "cmd"), 60))
        code = _field(v, "exit_code")
        line.append(f"  → exit {short(code, 12)}", style="green" if code == 0 else "bold red")
        line.append(f" · {short(_field(v, 'duration_ms', '?'), 12)} ms", style="dim")
        out = _text_field(v, "stdout")
        if out:
            line.append("  " + short(out, 40), style="dim")
        return line
    if kind == "token":
        line = Text(token_text(_field(v, "text", "")), style="bold")
        lp = _number(_field(v, "logprob"))
        if lp is not None:
            line.append(f"  lp {lp:.3f}", style="dim")
        if _field(v, "forced"):
            line.append("  forced", style="italic cyan")
        return line
    if kind == "logits":
        topk = _field(v, "topk") or []
        line = Text()
        if topk:
            first = topk[0]
            line.append(f"top #{first[0]} lp {float(first[1]):.3f}", style="magenta")
        batch = _field(v, "batch")
        if isinstance(batch, list) and len(batch) == 2:
            line.append(f" · batch {short(batch[0], 8)} rows [{rows_label(batch[1])}]", style="dim")
        line.append(f" · {short(_field(v, 'digest', ''), 11)[:10]}", style="dim")
        line.append(f" · {short(_field(v, 'mode', '?'), 12)}", style="dim")
        return line
    if kind == "prompt":
        return Text(f"{short(_field(v, 'n_tokens', '?'), 10)} tokens  ", style="dim") + Text(
            short(_text_field(v, "text") or last_message(_field(v, "request")), 60)
        )
    if kind == "message":
        return Text(short(_text_field(v, "text"), 80))
    if kind == "action":
        if _field(v, "done"):
            return Text("done", style="bold green")
        return highlight_bash("$ " + short(_text_field(v, "cmd"), 70))
    if kind == "outcome":
        line = checker_line(v)
        if isinstance(v, dict) and "exit_code" in v:  # a program recorded with --check: its exit code, and a replay's verdict
            line.append("  ")
            line.append_text(program_outcome_line(v))
        return line
    return Text(short(preview(v, 400), 80), style="dim")


def step_label(step: Any) -> str:
    """A step as sites write it: `setup` for the setup step, else its number."""
    return SETUP if step == SETUP_STEP else short(step, 12)


def step_line(events: list) -> Text:
    """A collapsed step in one line: what it did, from its `events` (no prompt, tokens or
    logits): the command and its exit code, the outcome, the clock; the tool result carries
    its command, so the action that named it is left out."""
    has_tool = any(e.kind == "tool" for e in events)
    order = {"tool": 0, "action": 0, "outcome": 1, "setup": 2, "clock": 3}
    line = Text()
    for event in sorted(events, key=lambda e: order.get(e.kind, 2)):
        if has_tool and event.kind in ("action", "message"):
            continue
        if line:
            line.append("  ")
        v = event.value
        if value_problem(event) is not None:
            line.append_text(summary(event))
        elif event.kind == "clock":
            line.append("⏱ " + short(_field(v, "t", "?"), 19).replace("T", " "), style="yellow")
        elif event.kind == "tool" and "function" not in v:
            line.append_text(highlight_bash("$ " + short(_text_field(v, "cmd"), 50)))
            code = _field(v, "exit_code")
            line.append(f" → exit {short(code, 12)}", style="green" if code == 0 else "bold red")
        else:
            line.append_text(summary(event))
    return line or Text("(no action recorded)", style="dim")


def token_with_id(text: Any, token_id: Any) -> str:
    """A token as a person reads it, its id beside it: `" goodbye" (93)`; the id alone when
    its text is not known."""
    if not isinstance(text, str):
        return short(token_id, 20)
    return token_label(text, token_id, 200)


def checker_line(v: Any) -> Text:
    passed = _field(v, "passed")
    return Text(f"{'passed' if passed else 'failed'} (checker exit {short(_field(v, 'checker_exit', '?'), 12)})",
                style="bold green" if passed else "bold red")


# -- the detail pane ------------------------------------------------------------------------
def _kv(rows: list[tuple[str, Any]]) -> Text:
    """Key/value lines with the keys in one column (plain Text: far cheaper than a
    rich Table, and the pane re-renders on every cursor move). Values that are not Text
    are recorded data: shown with controls visible, never as markup."""
    width = max((len(k) for k, _ in rows), default=0) + 2
    out = Text()
    for i, (key, val) in enumerate(rows):
        if i:
            out.append("\n")
        out.append(f"{key:<{width}}", style="bold")
        value = val if isinstance(val, Text) else safe(clip(preview(val, 4000), 4000, 40))
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
    text.append(f" {short(event.layer, 12)} · {short(event.kind, 20)}", style="bold")
    text.append(f"   site {short(event.site, 40)}   seq {event.seq}   step {step_label(event.step)}", style="dim")
    return text


def detail(view: RunView, event, token_texts=None, prompt=None) -> RenderableType:
    """Everything the pane shows about `event`. `token_texts(ids) -> {id: text}` names
    the top-k alternatives when a tokenizer is at hand. Blobs come from `view.text`
    (placeholders while a deferring view loads them). `prompt`, for a prompt event: the
    text rebuilt from the record (`engine.replay.prompts.Prompt`), or a line saying why
    it is not shown (yet)."""
    problem = value_problem(event)
    if problem is not None:
        return unreadable_detail(event, problem)
    try:
        if event.kind == "prompt":
            body = prompt_detail(event, prompt)
        else:
            body = _detail_body(view, event, token_texts)
    except Exception as exc:  # noqa: BLE001 - a shape the checks missed is shown as such
        return unreadable_detail(event, f"{type(exc).__name__}: {exc}")
    hint = Text()
    if is_program_end(event):
        hint = Text("the program's own output: fork at a model call's token, an SDK tool or a clock read",
                    style="italic dim")
    elif event.kind in MUTABLE:
        hint = Text("press e to edit this value and fork the run here", style="italic dim")
    elif event.kind == "setup" and isinstance(_field(event.value, "program"), list):
        hint = Text("press e to move the setup clock and fork: the whole program runs again at the new time",
                    style="italic dim")
    return Group(heading(event), Text(""), body, Text(""), hint)


def unreadable_detail(event, problem: str) -> RenderableType:
    parts: list[RenderableType] = [heading(event), Text(""), unreadable_label(problem)]
    if event.value is not None:
        parts += [Text(""), Text("the stored value:", style="dim"), safe(preview(event.value))]
    parts += [Text(""), Text("this value cannot be shown as its kind, nor edited", style="italic dim")]
    return Group(*parts)


def _detail_body(view: RunView, event, token_texts) -> RenderableType:
    kind = event.kind
    if kind in ("token", "logits"):
        return token_detail(view, event, token_texts)
    if kind == "tool" and "function" in event.value:
        return sdk_call_detail(event.value)
    if kind == "setup" and _setup_head(event.value) is not None:
        return _kv([_setup_head(event.value), ("clock", safe(_field(event.value, "clock"), "yellow")),
                    ("start tree", short(_field(event.value, "tree", "?"), 13)[:12])])
    if kind == "outcome" and "passed" not in event.value:
        return program_outcome_detail(event.value)
    if kind == "tool":
        return tool_detail(view, event)
    if kind == "clock":
        return clock_detail(view, event)
    if kind == "message":
        return message_detail(view, event.value)
    if kind == "action":
        cmd = _field(event.value, "cmd")
        return Text("done: the agent stopped", style="green") if cmd is None else highlight_bash(view.text(cmd))
    if kind == "outcome":
        output = view.text(_field(event.value, "checker_output")).rstrip("\n")
        verdict = Group(checker_line(event.value), safe(clip(output), style="dim"))
        if "exit_code" not in event.value:
            return verdict
        return Group(verdict, Text(""), program_outcome_detail(event.value))  # a program recorded with --check
    return safe(preview(event.value, SHOWN_CHARS))


def _setup_head(v: Any) -> tuple[str, Any] | None:
    """What a setup event set up, as the detail's first row: a recorded program's command
    line, or the built-in agent's task; None for a setup of neither shape."""
    if isinstance(_field(v, "program"), list):
        return ("program", program_line(v))
    if isinstance(v, dict) and "task" in v:
        return ("task", v["task"])
    return None


def message_detail(view: RunView, v: Any) -> RenderableType:
    """A message's text, then how the call ended when it was recorded (a served call's
    finish reason: `length` is an answer cut at max_tokens) and the tool calls it asked for."""
    parts: list[RenderableType] = [safe(clip(view.text(_field(v, "text"))))]
    rows: list[tuple[str, Any]] = []
    ended = _field(v, "finish_reason")
    if ended is not None:
        note = "  (cut at the call's max_tokens)" if ended == "length" else ""
        rows.append(("finish reason", Text(short(ended, 40) + note, style="yellow" if ended == "length" else "")))
    if _field(v, "tool_calls"):
        rows.append(("tool calls", preview(_field(v, "tool_calls"), 4000)))
    if rows:
        parts += [Text(""), _kv(rows)]
    return Group(*parts)


def prompt_detail(event, prompt) -> RenderableType:
    """A prompt's token count and digest, then the text the model read: verified (it
    encodes to the recorded ids), or rebuilt but not verified, with the reason. Without
    rebuilt text, what the event itself records: its text, or a served call's request."""
    v = event.value
    rows: list[tuple[str, Any]] = [("tokens", short(_field(v, "n_tokens", "?"), 12)),
                                   ("ids digest", short(_field(v, "ids_digest", "—"), 40))]
    rebuilt = prompt if prompt is not None and not isinstance(prompt, str) else None
    if rebuilt is None:
        note = Text(visible(prompt or "the prompt's text is not rebuilt", newlines=False), style="dim italic")
    elif rebuilt.verified:
        rows.append(("text", Text("✓ verified: it encodes to the recorded ids", style="green")))
    else:
        rows.append(("text", Text("✗ not verified: " + visible(rebuilt.note, newlines=False), style="bold yellow")))
    rows += call_rows(v)
    parts: list[RenderableType] = [_kv(rows)]
    if rebuilt is not None and rebuilt.text:
        return Group(*parts, Text(""), safe(clip(rebuilt.text)))
    if rebuilt is None:
        parts += [Text(""), note]
    for key in ("text", "request"):
        if _field(v, key) is not None:
            parts += [Text(""), Text(f"recorded {key}", style="bold"), safe(clip(preview(_field(v, key), SHOWN_CHARS)))]
    return Group(*parts)


def call_rows(v: Any) -> list[tuple[str, Any]]:
    """A served call's parameters as the program sent them (the model name it asked for,
    max_tokens, the sampling it ran with): what a rebuilt prompt's text does not show."""
    request, sampling = _field(v, "request"), _field(v, "sampling")
    rows: list[tuple[str, Any]] = []
    if _field(request, "model") is not None:
        rows.append(("model asked", short(_field(request, "model"), 80)))
    if _field(v, "max_tokens") is not None:
        rows.append(("max tokens", short(_field(v, "max_tokens"), 20)))
    if isinstance(sampling, dict) and sampling:
        rows.append(("sampling", short(" · ".join(f"{k} {short(x, 24)}" for k, x in sampling.items()), 200)))
    if _field(v, "stop"):
        rows.append(("stop", preview(_field(v, "stop"), 400, quote=True)))
    return rows


def _readable(event):
    """`event` if its value can be shown as its kind, else None."""
    return event if event is not None and value_problem(event) is None else None


def token_detail(view: RunView, event, token_texts=None) -> RenderableType:
    token = event if event.kind == "token" else _readable(view.token_for(event))
    logits = event if event.kind == "logits" else _readable(view.logits_for(event))
    rows: list[tuple[str, Any]] = []
    if token is not None:
        v = token.value
        lp = _number(_field(v, "logprob"))
        rows += [
            ("token", Text(token_text(_field(v, "text", "")), style="bold reverse")),
            ("id", _field(v, "id")),
            ("how", "forced (context identical to the recording)" if _field(v, "forced") else "sampled"),
            ("logprob", f"{lp:.4f}   p = {math.exp(min(lp, 0.0)):.4f}" if lp is not None else _field(v, "logprob")),
            ("rng", _field(v, "rng")),
        ]
    chosen = _field(token.value, "id") if token is not None else None
    parts: list[RenderableType] = [_kv(rows)]
    if logits is not None:
        v = logits.value
        batch = _field(v, "batch")
        if isinstance(batch, list) and len(batch) == 2:
            batch_text = f"{short(batch[0], 8)} rows in the pass; this sequence's rows {rows_label(batch[1])}"
        else:
            batch_text = short(batch, 60)
        parts += [
            Text(""),
            _kv([
                ("logits", safe(logits.site, style="magenta", one_line=True)),
                ("digest", short(_field(v, "digest"), 80)),
                ("batch", batch_text),
                ("kernels", short(_field(v, "mode"), 20)),
            ]),
            Text(""),
            topk_table(_field(v, "topk") or [], chosen, token_texts),
        ]
    else:
        parts.append(Text("no logits recorded for this position", style="dim"))
    return Group(*parts)


def _topk_entries(topk: Any, limit: int | None = None) -> list[tuple[int, Any, float]]:
    """(id, recorded text or None, logprob) of the well-formed top-k entries."""
    out = []
    for entry in topk if isinstance(topk, list) else []:
        well_formed = isinstance(entry, list) and len(entry) >= 2 and type(entry[0]) is int
        if not well_formed or _number(entry[1]) is None:
            continue
        out.append((entry[0], entry[2] if len(entry) > 2 else None, float(entry[1])))
        if limit is not None and len(out) >= limit:
            break
    return out


def alternatives(view: RunView, event, token_texts=None) -> list[tuple[int, str | None, float]]:
    """The recorded top-k at a token's position: (id, text or None, logprob)."""
    logits = event if event.kind == "logits" else _readable(view.logits_for(event))
    entries = _topk_entries(_field(logits.value, "topk") if logits is not None else None)
    if not entries:
        return []
    names = token_texts([tid for tid, _, _ in entries]) if token_texts else {}
    return [(tid, text if text is not None else names.get(tid), lp) for tid, text, lp in entries]


def topk_table(topk: list, chosen: int | None, token_texts=None) -> Text:
    entries = _topk_entries(topk, 5)
    names = token_texts([tid for tid, _, _ in entries]) if token_texts else {}
    out = Text("top-5 alternatives\n", style="italic")
    out.append(f"  {'id':>6}  {'text':<14} {'logprob':>8} {'p':>6}", style="dim")
    for tid, text, lp in entries:
        text = text if text is not None else names.get(tid)
        shown = token_text(text) if text is not None else "·"
        mark = "▶" if tid == chosen else " "
        out.append(f"\n{mark} {tid:>6}  {shown:<14} {lp:>8.3f} {math.exp(min(lp, 0.0)):>6.3f}",
                   style="bold cyan" if tid == chosen else "")
    return out


def tool_detail(view: RunView, event) -> RenderableType:
    v = event.value if isinstance(event.value, dict) else {}
    clock = _readable(view.at(f"{event.step}:clock"))
    code = v.get("exit_code")
    rows: list[tuple[str, Any]] = [] if is_program_end(event) else [
        ("clock", safe(short(_field(clock.value, "t"), 60) if clock else "not recorded", style="yellow")),
    ]
    if v.get("limit_hit"):
        rows.append(("stopped", Text(short(v["limit_hit"], 200), style="bold red")))
    rows += [
        ("cwd", short(view.text(v.get("cwd")) or "?", 200)),
        ("exit code", Text(short(code, 12), style="green" if code == 0 else "bold red")),
        ("duration", f"{short(v.get('duration_ms', '?'), 12)} ms"),
        ("output", f"stdout {size_label(_output_size(v, 'stdout'))}, stderr {size_label(_output_size(v, 'stderr'))}"
                   + ("  (truncated)" if v.get("truncated") else "")),
        ("files changed", files_label(view.files_changed(event))),
        ("tree", f"{short(v.get('tree_before', '?'), 13)[:12]} → {short(v.get('tree_after', '?'), 13)[:12]}"),
    ]
    parts: list[RenderableType] = [
        highlight_console(view.text(v.get("cmd")), view.text(v.get("stdout"))),
    ]
    stderr = view.text(v.get("stderr"))
    if stderr:
        parts.append(safe(clip(stderr.rstrip("\n")), style="red"))
    parts += [Text(""), _kv(rows)]
    env = v.get("env")
    if isinstance(env, dict) and env:
        keys = sorted(env, key=str)[:200]
        parts += [Text(""), Text("environment", style="bold"),
                  _kv([(short(k, 40), short(env[k], 400)) for k in keys])]
    return Group(*parts)


def _output_size(v: dict, stream: str) -> Any:
    """An output's size in bytes: as recorded, else (an `sdk.shell` call records none) of the
    text itself when it is stored inline."""
    size = v.get(f"{stream}_size")
    if size is None and isinstance(v.get(stream), str):
        size = len(v[stream].encode("utf-8", "surrogatepass"))
    return size


def files_label(changes) -> Text:
    if changes is LOADING:
        return Text("loading the snapshots …", style="dim italic")
    if changes is None:
        return Text("unknown (no snapshot recorded for this step)", style="dim")
    if not changes:
        return Text("none", style="dim")
    marks = {"added": ("+", "green"), "removed": ("-", "red"), "changed": ("~", "yellow")}
    text = Text()
    for i, change in enumerate(changes[:SHOWN_LINES]):
        mark, colour = marks.get(change.change, ("?", "white"))
        text.append(("\n" if i else "") + f"{mark} {visible(change.path, newlines=False)}", style=colour)
    if len(changes) > SHOWN_LINES:
        text.append(f"\n… {len(changes) - SHOWN_LINES} more", style="dim")
    return text


def clock_detail(view: RunView, event) -> RenderableType:
    rows: list[tuple[str, Any]] = [("clock", safe(short(_field(event.value, "t"), 60), style="bold yellow"))]
    before = _readable(view.at(f"{event.step - 1}:clock")) if event.step > 0 else None
    if before is not None:
        rows.append(("previous step", short(_field(before.value, "t"), 60)))
    tool = _readable(view.at(f"{event.step}:tool"))
    if tool is not None:
        rows.append(("read by", highlight_bash("$ " + short(view.text(_field(tool.value, "cmd")), 70))))
    return _kv(rows)


# -- a recorded program's own events (`tttr record -- PROGRAM`) --------------------------------
def is_program_end(event) -> bool:
    """The program's own end: its command line, output and exit code (not a fork site)."""
    return event.kind == "tool" and isinstance(event.value, dict) and isinstance(event.value.get("program"), list)


def program_line(value: dict) -> str:
    return " ".join(str(a) for a in value.get("program") or [])


def last_message(request: Any) -> str:
    """A served call's request as one line: its last message (`user: Say hi`), or its prompt."""
    messages = _field(request, "messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        content = messages[-1].get("content")
        text = content if isinstance(content, str) else preview(content, 200)
        return f"{short(messages[-1].get('role', '?'), 12)}: {short(text, 200)}"
    return short(_field(request, "prompt") or "", 200)


def sdk_call_line(v: dict, width: int = 60) -> Text:
    """An SDK tool call as the program made it: `decide("hi") → "stop"`, or what it raised."""
    args = [preview(a, 80, quote=True) for a in v.get("args") or []]
    kwargs = v.get("kwargs") if isinstance(v.get("kwargs"), dict) else {}
    args += [f"{short(k, 20)}={preview(a, 80, quote=True)}" for k, a in kwargs.items()]
    line = Text(short(v.get("function"), 40), style="bold cyan")
    line.append(short(f"({', '.join(args)})", width), style="cyan")
    error = v.get("error")
    if error is not None:
        line.append(f"  ✗ {short(_field(error, 'type', error), 40)}: {short(_field(error, 'message', ''), width)}",
                    style="bold red")
    elif "result" in v:
        line.append("  → ", style="dim")
        line.append(short(preview(v["result"], 400, quote=True), width), style="green")
    return line


def sdk_call_detail(v: dict) -> RenderableType:
    error = v.get("error")
    rows: list[tuple[str, Any]] = [
        ("function", Text(short(v.get("function"), 80), style="bold cyan")),
        ("args", preview(v.get("args"), 4000, quote=True)),
        ("kwargs", preview(v.get("kwargs"), 4000, quote=True)),
    ]
    if error is not None:
        rows.append(("raised", Text(f"{short(_field(error, 'type', '?'), 60)}: {short(_field(error, 'message', error), 400)}",
                                    style="bold red")))
    else:
        rows.append(("result", safe(clip(preview(v.get("result"), SHOWN_CHARS, quote=True)), style="green")))
    rows.append(("duration", f"{short(v.get('duration_ms', '?'), 12)} ms"))
    how = "an @sdk.tool function: its result (or exception) is what a replay gives the program without running it"
    return Group(sdk_call_line(v, 80), Text(""), _kv(rows), Text(""), Text(how, style="dim"))


def program_outcome_line(v: dict) -> Text:
    """A program run's outcome without a checker: its exit code and, for a replay or a
    fork, whether it matched the recording."""
    code = v.get("exit_code")
    text = Text(f"exit {short(code, 12)}", style="bold green" if code == 0 else "bold red")
    if "identical" in v:
        text.append("  identical to the recording" if v["identical"] else "  differs from the recording",
                    style="green" if v["identical"] else "yellow")
    divergence = v.get("divergence")
    if isinstance(divergence, dict):
        text.append(f" · diverged at {short(divergence.get('site'), 60)}", style="yellow")
    return text


def program_outcome_detail(v: dict) -> RenderableType:
    rows: list[tuple[str, Any]] = [("exit code", program_outcome_line(v))]
    for key, label in (("calls", "model calls"), ("logits_computed", "logits computed"), ("tools_run", "tools run"),
                       ("fork_site", "fork site"), ("calls_generated", "calls generated"), ("reason", "reason")):
        if key in v:
            rows.append((label, short(v[key], 200)))
    divergence = v.get("divergence")
    if isinstance(divergence, dict):
        rows += [("diverged at", short(divergence.get("site"), 200)),
                 ("recorded", preview(divergence.get("recorded"), 400)),
                 ("live", preview(divergence.get("live"), 400))]
    return _kv(rows)


# -- runs -------------------------------------------------------------------------------------
# A run's metadata comes from the database as it is: any field may hold any type.
def lineage(run, verdict: str | None = None) -> str:
    """Where a run comes from: `recorded`, `fork of #1 at 2:tool = exit=1`, `replay of #1
    (faithful): identical` or `replay of #1 (free tensor): diverged at 2:token:3`, with a
    replay's `verdict` when it is known (`runs_listing.replay_verdict`)."""
    parent = getattr(run, "parent", None)
    if parent is None:
        return "recorded"
    replay = run.meta.replay
    if replay is not None:
        free = replay.get("free")
        how = "free " + ", ".join(short(f, 20) for f in free) if isinstance(free, list) and free else "faithful"
        return f"replay of #{short(parent, 12)} ({short(how, 60)})" + (f": {short(verdict, 60)}" if verdict else "")
    site = getattr(run, "fork_site", None)
    mutation = getattr(run, "mutation", None)
    if site is None and isinstance(mutation, dict):
        site = mutation.get("site")
    where = short(site, 30) if site is not None else f"seq {short(getattr(run, 'fork_seq', '?'), 12)}"
    return f"fork of #{short(parent, 12)} at {where} = {mutation_label(mutation, 60)}"


def mutation_label(mutation: Any, width: int = 80) -> str:
    """A fork's new value as the user typed it, then what it became when that differs:
    `+30d → 2026-04-01T10:00:00` (a clock shift), `" rm" → 28120` (a token's id); a
    tool result reads as typed. One line, controls visible."""
    if not isinstance(mutation, dict):
        return short(preview(mutation, 200, quote=True), width)
    typed = mutation.get("input", mutation.get("text"))
    value = mutation.get("value")
    if not isinstance(typed, str):
        return short(preview(value, 200, quote=not isinstance(value, str)), width)
    if "deltas" in mutation:  # a triage or bisect replay: its input names the deltas (its value counts them)
        return short(typed, width)
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value) != typed.strip():
        return short(f"{typed} → {value}", width)
    return short(typed, width)


def outcome_line(outcome: Outcome | None) -> Text:
    """passed/failed and the first line of the checker's message; `—` when there is none."""
    if outcome is not None and "passed" not in outcome and "exit_code" in outcome:
        return program_outcome_line(outcome)  # a program recorded without --check
    if outcome is None or "passed" not in outcome:
        return Text("—" if not outcome else short(preview(outcome.to_json(), 200, quote=True), 40), style="dim")
    passed = outcome.passed
    text = Text("passed" if passed else "failed", style="bold green" if passed else "bold red")
    message = outcome.checker_output
    first = next((ln for ln in message.splitlines() if ln.strip()), "") if isinstance(message, str) else ""
    if first:
        text.append(": " + short(first.strip(), 60))
    return text


def outcome_label(run) -> Text:
    """pass or fail; for a run that never reached its checker, why, in words (`cancelled`,
    `stopped early`), not the stored JSON."""
    outcome = getattr(run, "outcome", None)
    if not outcome:
        stopped = getattr(run, "status", None) == "incomplete"
        return Text("stopped early", style="yellow") if stopped else Text("—", style="dim")
    passed = outcome.passed
    if passed is None:
        if outcome.reason:
            return Text(short(outcome.reason, 30), style="yellow")  # "cancelled", "recording stopped early"
        ended = outcome.get("finish_reason")
        if isinstance(ended, str) and ended:
            return Text(f"ended: {short(ended, 20)}")  # a served call: the model's finish reason
        if "exit_code" in outcome:  # a program recorded without --check
            code = outcome["exit_code"]
            return Text(f"exit {short(code, 8)}", style="green" if code == 0 else "bold red")
        return Text(short(preview(outcome.to_json(), 200, quote=True), 20))
    return Text("pass", style="bold green") if passed else Text("fail", style="bold red")


def status_label(run) -> Text:
    status = short(getattr(run, "status", "?"), 20)
    colour = {"complete": "green", "incomplete": "yellow", "failed": "red", "recording": "cyan"}.get(status, "white")
    return Text(status, style=colour)


def run_problem(run) -> Text | None:
    """Why the store cannot read the run's metadata, as a label; None when it can."""
    problem = getattr(run, "problem", None)
    return unreadable_label(short(problem, 200)) if problem else None


def task_label(run, runs: dict | None = None) -> str:
    """The run's task; for a recorded program (whose task reads `program:python3` whatever
    the program), its command line, from the run's record or, for a fork or replay that
    does not repeat it, its nearest ancestor's among `runs` ({id: run})."""
    seen: set = set()
    at = run
    while at is not None and at.id not in seen:
        seen.add(at.id)
        program = at.meta.program
        if program:
            return program_line({"program": program[:20]})
        parent = getattr(at, "parent", None)
        at = (runs or {}).get(parent) if isinstance(parent, int) else None
    return str(run.task)


def run_facts(run) -> str:
    """What the run ran: its task, model, kernels and seed, in one line (not markup)."""
    return (f"{short(run.task, 40)} · {short(run.model_id or '?', 32)} · {short(run.kernel_mode, 12)} · "
            f"seed {short(run.seed, 24)}")
