"""Site names: where a recorded value was consumed.

`<step>:clock`, `<step>:tool`, `<step>:token:<pos>`, `<step>:logits:<pos>`,
`<step>:prompt`, `<step>:message`, `<step>:action`, `-1:setup`, `<step>:outcome`.
The same site names the same decision point in every run of a task, so two runs are
matched site by site, and `tttr fork --at SITE` takes this syntax.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tttr.sessions.errors import TTTRError

_SITE = re.compile(r"^(-?\d+):([a-z]+)(?::(\d+))?$")
POSITIONAL = ("token", "logits")
NAMES = ("clock", "tool", "token", "logits", "prompt", "message", "action", "setup", "outcome")
MUTABLE = ("clock", "tool", "token")


class SiteError(TTTRError, ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Site:
    step: int
    name: str
    pos: int | None = None

    def __str__(self) -> str:
        return f"{self.step}:{self.name}" + (f":{self.pos}" if self.pos is not None else "")

    @classmethod
    def parse(cls, text: str) -> "Site":
        m = _SITE.match(text.strip())
        if not m or m.group(2) not in NAMES:
            raise SiteError(
                f"bad site {text!r}: use STEP:clock, STEP:tool or STEP:token:POS "
                "(`tttr events DB RUN --json` lists every site of a run)"
            )
        if len(m.group(1)) > 10 or (m.group(3) and len(m.group(3)) > 10):
            raise SiteError(f"bad site {text[:40]!r}: its step or position is far beyond any run's")
        step, name, pos = int(m.group(1)), m.group(2), m.group(3)
        if (name in POSITIONAL) != (pos is not None):
            raise SiteError(
                f"bad site {text!r}: {name} sites "
                + ("need a position, e.g. 2:token:5" if name in POSITIONAL else "take no position")
            )
        return cls(step, name, int(pos) if pos is not None else None)


def clock(step: int) -> str:
    return f"{step}:clock"


def tool(step: int) -> str:
    return f"{step}:tool"


def token(step: int, pos: int) -> str:
    return f"{step}:token:{pos}"


def logits(step: int, pos: int) -> str:
    return f"{step}:logits:{pos}"
