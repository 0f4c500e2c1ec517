"""The project's nouns, defined once: the layers, the kinds of event and the layer of each,
and the site grammar — how a site is written, parsed and ordered.

Every package imports these names instead of spelling them again (a second spelling is a
bug waiting for the two to disagree): the store, the oracle, the policy, diff, the command
line and the app. Nothing here imports more than the error base, so the command line can
use it without loading anything else.

A *site* names where a recorded value was consumed: `STEP:KIND`, or `STEP:KIND:POS` for the
kinds with a position (`2:clock`, `2:tool`, `2:token:5`, `2:logits:5`). The setup step
(step -1: the task's clock and starting tree, before the agent's first step) is written
`setup`: `setup:clock`, `setup:setup`. The same site names the same decision point in every
run of a task, so two runs are matched site by site, and `tttr fork --at SITE` takes this
syntax.

The store keeps a site as its step, kind and position, and writes the text with `site()`
when it reads, so databases recorded when the setup step was spelled `-1` (`-1:clock`) read
as `setup:clock` with no migration. That old spelling is still accepted wherever a site is
read (`site_parts`, `Site.parse`, `canonical_site`), and names the same site.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tttr.sessions.errors import TTTRError

# The layers, in the order they are shown: tensor (logits), token (sampling), trace (the
# world: clock, tools, files), agent (values derived from the others: prompt, message,
# parsed action, outcome; recorded for reading, never pinned or freed).
LAYERS = ("tensor", "token", "trace", "agent")

# The layers a replay policy pins or frees.
RECORDED_LAYERS = ("tensor", "token", "trace")

# Each kind of event the shell agent records, with its layer, in the order the agent loop
# consumes them within a step: the prompt, then per position a token and the logits behind
# it, the message, the parsed action, the step's clock and the tool call. Step -1 reads the
# clock and sets the task up; the outcome comes after the last step's tool call.
KIND_LAYER = {
    "prompt": "agent",
    "token": "token",
    "logits": "tensor",
    "message": "agent",
    "action": "agent",
    "clock": "trace",
    "setup": "trace",
    "tool": "trace",
    "outcome": "agent",
}
KINDS = tuple(KIND_LAYER)
POSITIONAL = ("token", "logits")  # kinds whose site carries a position
MUTABLE = ("clock", "tool", "token", "message")  # kinds whose value a fork may replace

# Values of the setup step that a fork may replace though no event of their own records
# them: a file of the start tree (`setup:file:PATH`), a variable of the environment the run
# starts with (`setup:env:NAME`). Their site carries the path or name; their layer:
SETUP_VALUES = {"file": "trace", "env": "trace"}

SETUP_STEP = -1  # the setup step: the task's clock and starting tree, before step 0
SETUP = "setup"  # how a site names the setup step: `setup:clock` (`-1:clock` reads the same)

_RANK = {kind: rank for rank, kind in enumerate(KINDS)} | {"logits": KINDS.index("token")}
_USER_SITE = re.compile(rf"^(-?\d+|{SETUP}):([a-z]+)(?::(\d+))?$")
_SETUP_VALUE_SITE = re.compile(rf"^({SETUP}|-1):({'|'.join(SETUP_VALUES)}):(.+)$", re.S)


class SiteError(TTTRError, ValueError):
    pass


def site(step: int, kind: str, pos: int | None = None) -> str:
    """The site of a value of `kind` consumed at `step` (and position `pos`)."""
    return _written(SETUP if step == SETUP_STEP else str(step), kind, pos)


def _written(step: str, kind: str, pos: int | None) -> str:
    return f"{step}:{kind}" if pos is None else f"{step}:{kind}:{pos}"


def site_parts(text: str) -> tuple[int, str, int | None] | None:
    """(step, kind, pos) when `text` is exactly what `site()` writes for them, or the setup
    step's old spelling of it (`-1:clock`) — any kind, so foreign events parse too — else
    None. No leading zeros, spaces or negative positions: this is the stored form, not a
    user's."""
    parts = text.split(":")
    n = len(parts)
    if (n != 2 and n != 3) or not parts[1]:
        return None
    head = parts[0]
    try:
        step = SETUP_STEP if head == SETUP else int(head)
        pos = int(parts[2]) if n == 3 else None
    except ValueError:
        return None
    # Each number exactly as str() writes it (no sign, zeros, spaces or other digits), so that
    # the text is what `site()` writes, or the setup step's old spelling of it.
    if (head != SETUP and str(step) != head) or (pos is not None and (pos < 0 or str(pos) != parts[2])):
        return None
    return step, parts[1], pos


def canonical_site(text: str) -> str:
    """`text` as `site()` writes it (`-1:clock` becomes `setup:clock`); any other text as it is."""
    parts = site_parts(text) if isinstance(text, str) else None
    return text if parts is None else site(*parts)


def site_order(text: str) -> tuple[int, int, int, str]:
    """Sort key: step, then the order the agent loop consumes kinds within a step, then
    position. A site outside the grammar sorts after every other (by its text)."""
    parts = site_parts(str(text))
    if parts is None:
        return (1 << 62, 0, 0, str(text))
    step, kind, pos = parts
    return (step, _RANK.get(kind, len(KINDS)), -1 if pos is None else pos, "")


@dataclass(frozen=True, slots=True)
class Site:
    """A site of the shell agent's grammar, as a user writes it (`tttr fork --at`)."""

    step: int
    name: str
    pos: int | None = None
    arg: str | None = None  # a setup value's path or name (`setup:file:notes/a.txt`)

    def __str__(self) -> str:
        if self.arg is not None:
            return f"{SETUP}:{self.name}:{self.arg}"
        return site(self.step, self.name, self.pos)

    @property
    def layer(self) -> str:
        return KIND_LAYER.get(self.name) or SETUP_VALUES[self.name]

    @classmethod
    def parse(cls, text: str) -> "Site":
        setup_value = _SETUP_VALUE_SITE.match(text.strip())
        if setup_value:
            arg = setup_value.group(3)
            if len(arg) > 4096 or "\0" in arg:
                raise SiteError(f"bad site {text[:60]!r}: its {setup_value.group(2)} is too long or holds a NUL byte")
            return cls(SETUP_STEP, setup_value.group(2), None, arg)
        m = _USER_SITE.match(text.strip())
        if not m or m.group(2) not in KIND_LAYER:
            raise SiteError(
                f"bad site {text!r}: use STEP:clock, STEP:tool, STEP:token:POS or STEP:message, or setup:clock, "
                "setup:file:PATH or setup:env:NAME for the setup step (`tttr events DB RUN` lists every site of a run)"
            )
        if len(m.group(1)) > 10 or (m.group(3) and len(m.group(3)) > 10):
            raise SiteError(f"bad site {text[:40]!r}: its step or position is far beyond any run's")
        step = SETUP_STEP if m.group(1) == SETUP else int(m.group(1))
        name, pos = m.group(2), m.group(3)
        if (name in POSITIONAL) != (pos is not None):
            raise SiteError(
                f"bad site {text!r}: {name} sites "
                + ("need a position, e.g. 2:token:5" if name in POSITIONAL else "take no position")
            )
        return cls(step, name, int(pos) if pos is not None else None)

    def at(self, kind: str, step: int) -> bool:
        """Whether this is the site of a `kind` value at `step` (any position)."""
        return self.name == kind and self.step == step
