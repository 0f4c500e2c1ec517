"""Untrusted text as it is shown: controls visible, one line, bounded."""

from tttr.sessions.safe_text import brief, visible


def test_visible_escapes_controls_and_keeps_lines():
    assert visible("a\x1b]0;pwned\x07b\nc\td\x9b\u202e") == "a\\x1b]0;pwned\\x07b\nc\td\\x9b\\u202e"
    assert visible("x\ny", newlines=False) == "x\\ny"


def test_brief_is_one_visible_line_of_at_most_width():
    assert brief("ls\x1b[2J") == "'ls\\x1b[2J'"
    shown = brief({"stdout": "\x1b]0;t\x07\u202e"})
    assert not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f or c == "\u202e" for c in shown), shown
    long = brief({"cmd": "x" * 500}, width=40)
    assert len(long) == 40 and long.endswith("…")
    assert "\n" not in brief("a\nb") and "\n" not in brief(["a\nb"])
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert len(brief(deep, width=30)) <= 30  # too deep to write as JSON: named, not a crash
