"""docs/contracts.md is checked against the code by signature, not by words.

Every `from tttr... import X` line of its Python blocks imports, and every call shape the
blocks show for the public API (`X(...)` of an imported name, `Store.open(...)`,
`ops.linear(...)`, a method of an instance the page names such as `store.append(...)`, a
dotted `tttr.a.b.C(...)`, a result class as `RunDiff(run_a, ...)`) is bound to the real
`inspect.signature`: the arguments it shows must bind, a bare argument must carry its
parameter's name, and a shape that starts its line (the signature, not a use of it) must name
every parameter, put a `*` before the keyword-only ones and give literal defaults equal to the
code's. `NAME = literal` lines for imported constants are compared by value."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = (ROOT / "docs" / "contracts.md").read_text()

# The instances the page calls methods on, by the name it gives them.
RECEIVERS = {
    "store": "tttr.sessions.store:Store",
    "eng": "tttr.engine.inference.scheduler:Engine",
    "ex": "tttr.recorders.sandbox:Executor",
    "task": "tttr.recorders.tasks:Task",
    "model": "tttr.engine.inference.model:Model",
    "model.tokenizer": "tttr.engine.inference.tokenizer:Tokenizer",
}

# The records whose every field the page must show as one complete shape (the store's rows, the
# sandbox's and the engine's results, the configuration objects).
RECORDS = [
    "tttr.sessions.records:Run", "tttr.sessions.records:Event", "tttr.recorders.sandbox:Limits",
    "tttr.recorders.sandbox:CommandResult", "tttr.engine.inference.sequence:TokenRecord",
    "tttr.engine.inference.sampler:SamplingParams", "tttr.engine.replay.runs:RunResult",
    "tttr.engine.replay.diff:RunDiff", "tttr.engine.replay.diff:DiffRow", "tttr.engine.replay.agent:AgentLimits",
    "tttr.engine.replay.result:CallsResult", "tttr.engine.replay.result:ProgramResult",
    "tttr.engine.replay.result:ReplayResult",
]

NAME = r"[A-Za-z_]\w*"
CALL = re.compile(rf"(?<![\w.\])])({NAME}(?:\.{NAME})*)\(")


@dataclasses.dataclass(frozen=True)
class Arg:
    text: str
    name: str | None = None      # the leading identifier; None for an expression such as `[params, ...]`
    keyword: bool = False        # written `name=value`
    default: str | None = None   # the text after `=`
    marker: str = ""             # "*" (keyword-only from here), "..." (and more), "." (a property: `.ok`),
                                 # "*a" / "**" (`*coords[i]`, `**extra`: any number)


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    args: tuple[Arg, ...]
    whole: bool                  # starts its line: the whole signature, not a use
    line: int

    def __str__(self) -> str:
        return f"docs/contracts.md:{self.line}: {self.name}({', '.join(a.text for a in self.args)})"


def _blocks() -> list[tuple[int, list[str]]]:
    """(line number of the block's first line, its lines with a leading `#` taken off)."""
    out = []
    for m in re.finditer(r"```python\n(.*?)```", CONTRACTS, re.S):
        first = CONTRACTS.count("\n", 0, m.start(1)) + 1
        out.append((first, [re.sub(r"^\s*#", "", line) for line in m.group(1).splitlines()]))
    return out


def _split(text: str) -> list[str]:
    """Top-level pieces of an argument list, at commas and semicolons."""
    parts, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch in ",;" and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return [p.strip() for p in [*parts, cur] if p.strip()]


def _close(text: str, start: int) -> int:
    depth, quote = 0, ""
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i
    raise AssertionError(f"unbalanced parenthesis in docs/contracts.md: {text[start:start + 80]!r}")


def _arg(text: str) -> Arg:
    if text in ("*", "..."):
        return Arg(text, marker=text)
    if text.startswith("."):
        return Arg(text, name=re.match(rf"\.({NAME})", text).group(1), marker=".")
    if text.startswith("*"):
        star = "**" if text.startswith("**") else "*a"
        return Arg(text, name=text.lstrip("*") if re.fullmatch(NAME, text.lstrip("*")) else None, marker=star)
    m = re.match(rf"({NAME})\s*", text)
    if not m:
        return Arg(text)
    rest = text[m.end():]
    if rest.startswith("."):
        return Arg(text)  # `model.device`: an expression, not a parameter's name
    if rest.startswith("=") and not rest.startswith("=="):
        return Arg(text, m.group(1), keyword=True, default=rest[1:].strip())
    if rest.startswith(":"):
        annotated = re.search(r"(?<![=!<>])=(?!=)", rest)
        if annotated:
            return Arg(text, m.group(1), keyword=True, default=rest[annotated.end():].strip())
    return Arg(text, m.group(1))


def _shapes() -> list[Shape]:
    shapes = []
    for first, lines in _blocks():
        text = "\n".join(lines)
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line) + 1)
        for m in CALL.finditer(text):
            row = max(i for i, s in enumerate(starts) if s <= m.start())
            before = text[starts[row]:m.start()]
            whole = re.fullmatch(r"(\s*(\w+(, \w+)* = )?|.*\s;\s+)", before) is not None
            end = _close(text, m.end() - 1)
            args = tuple(_arg(a) for a in _split(text[m.end():end]))
            shapes.append(Shape(m.group(1), args, whole, first + row))
    return shapes


def _imports(upto: int | None = None) -> dict[str, object]:
    """Name -> object for every `from tttr... import` line; with `upto`, as the page reads at that
    line (the latest import of a name above it wins: two modules may export one name)."""
    names, later = {}, {}
    for first, lines in _blocks():
        for i, line in enumerate(lines):
            m = re.match(r"\s*from (tttr[\w.]*) import ([^#]+)", line)
            if m:
                module = importlib.import_module(m.group(1))
                for name in (n.strip() for n in m.group(2).split(",")):
                    assert hasattr(module, name), f"docs/contracts.md imports {name} from {m.group(1)}, which has none"
                    if upto is None or first + i <= upto:
                        names[name] = getattr(module, name)
                    else:
                        later.setdefault(name, getattr(module, name))
    return {**later, **names}


def _object(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _resolve(name: str, imports: dict[str, object]):
    """(the callable the shape names, whether its first parameter is `self`), or None when it is
    no name of TTTR's the page brings in (`torch.topk`, `fut.result`)."""
    parts = name.split(".")
    if parts[0] == "tttr":
        for i in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                obj = getattr(obj, attr)
            return obj, False
        raise AssertionError(f"{name}: no such module")
    for n in range(len(parts) - 1, 0, -1):
        receiver = ".".join(parts[:n])
        if receiver in RECEIVERS:
            owner = _object(RECEIVERS[receiver])
            obj = owner
            for attr in parts[n:]:
                owner, obj = obj, getattr(obj, attr)
            return obj, inspect.isfunction(inspect.getattr_static(owner, parts[-1]))
    if parts[0] in imports:
        obj = imports[parts[0]]
        for attr in parts[1:]:
            obj = getattr(obj, attr)
        return obj, False
    if len(parts) == 1 and parts[0][0].isupper():
        found = {id(getattr(m, name)): getattr(m, name) for m in _modules(imports) if hasattr(m, name)}
        assert len(found) == 1, f"{name}: {len(found)} of the modules docs/contracts.md names define it"
        return next(iter(found.values())), False
    return None


def _modules(imports: dict[str, object]) -> list:
    """The modules the page imports from or names in backticks, where a result class it shows
    without importing it (`Mutation`, `BlobPart`) is looked up."""
    named = set(re.findall(r"\b(tttr(?:\.\w+)+)", CONTRACTS))
    named |= {getattr(o, "__module__", "") for o in imports.values()}
    modules = []
    for path in sorted(named):
        while path.count("."):
            try:
                modules.append(importlib.import_module(path))
                break
            except ImportError:
                path = path.rsplit(".", 1)[0]
    return modules


def _problems(shape: Shape) -> list[str]:
    resolved = _resolve(shape.name, _imports(shape.line))
    if resolved is None:
        return []
    obj, method = resolved
    sig = inspect.signature(obj)
    params = list(sig.parameters.values())
    if method:
        params = params[1:]
        sig = sig.replace(parameters=params)
    problems = []
    shown = [a for a in shape.args if not a.marker]
    partial = any(a.marker in ("...", "*a", "**") for a in shape.args)
    for prop in (a.name for a in shape.args if a.marker == "."):
        if not hasattr(obj, prop):
            problems.append(f"{prop} is no attribute of {shape.name}")
    star_at = next((i for i, a in enumerate(shape.args) if a.marker == "*"), len(shape.args))
    after_star = {id(a) for a in shape.args[star_at:]}  # a bare name after `*` is a keyword-only parameter
    positional = [a for a in shown if not a.keyword and id(a) not in after_star]
    keywords = {a.name: a for a in shown if a.keyword or id(a) in after_star}
    try:
        bind = sig.bind_partial if partial else sig.bind
        bind(*[object() for _ in positional], **{k: object() for k in keywords})
    except TypeError as e:
        return [f"does not bind to {shape.name}{sig}: {e}"]
    by_position = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for arg, param in zip(positional, by_position):
        if arg.name is not None and arg.name != param.name:
            problems.append(f"argument {arg.name!r} is the parameter {param.name!r}")
    if not shape.whole:
        return problems
    names = {a.name for a in shape.args if a.name}
    missing = [p.name for p in params if p.name not in names and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing and not any(a.marker == "..." for a in shape.args):
        problems.append(f"never names the parameters {missing} of {shape.name}{sig}")
    star = next((i for i, a in enumerate(shape.args) if a.marker == "*"), None)
    for i, arg in enumerate(shape.args):
        param = sig.parameters.get(arg.name or "")
        if param is None or arg.marker:
            continue
        after_star = star is not None and i > star
        if after_star != (param.kind == param.KEYWORD_ONLY):
            problems.append(f"{arg.name!r} is {'not ' if after_star else ''}keyword-only in the code "
                            f"(the page puts it {'after' if after_star else 'before'} `*`)")
        if arg.default is not None and "..." not in arg.default:  # `task=...`: any value
            try:
                value = ast.literal_eval(arg.default)
            except (ValueError, SyntaxError):
                continue
            default = _default(obj, param)
            if default is param.empty:
                problems.append(f"{arg.name}={arg.default} has no default in the code")
            elif default != value:
                problems.append(f"{arg.name}={arg.default}, the code's default is {default!r}")
    return problems


def _default(obj, param: inspect.Parameter):
    """The parameter's default; a dataclass field's factory called (`exports={}`)."""
    if dataclasses.is_dataclass(obj) and isinstance(obj, type):
        field = {f.name: f for f in dataclasses.fields(obj)}.get(param.name)
        if field is not None and field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
    return param.default


def test_the_page_imports_what_it_says():
    assert len(_imports()) >= 40


def test_the_page_shows_call_shapes():
    shapes = _shapes()
    assert len(shapes) >= 80 and sum(s.whole for s in shapes) >= 60, "the parser no longer finds the page's shapes"


@pytest.mark.parametrize("shape", _shapes(), ids=lambda s: f"{s.line}:{s.name}")
def test_every_call_shape_matches_the_code(shape):
    problems = _problems(shape)
    assert not problems, f"{shape}\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", RECORDS)
def test_every_record_is_shown_whole(path):
    cls = _object(path)
    whole = [s for s in _shapes() if s.whole and (_resolve(s.name, _imports(s.line)) or (None,))[0] is cls]
    assert whole, f"docs/contracts.md shows no `{cls.__name__}(...)` line with all its fields"


def test_documented_constants_are_the_code_values():
    imports = _imports()
    checked = 0
    for first, lines in _blocks():
        for i, line in enumerate(lines):
            m = re.match(rf"\s*({NAME}(?:\.{NAME})*) = (\(.*?\)|\d+)\s*(?:[;#]|$)", line)
            if not m or m.group(1).split(".")[0] not in imports:
                continue
            obj = imports[m.group(1).split(".")[0]]
            for attr in m.group(1).split(".")[1:]:
                obj = getattr(obj, attr)
            assert obj == ast.literal_eval(m.group(2)), f"docs/contracts.md:{first + i}: {m.group(1)} is {obj!r}"
            checked += 1
    assert checked >= 2
