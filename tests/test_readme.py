"""The docs are checked, so they cannot drift from the product (as sqlite-utils'
tests/test_docs.py does): every command line the README shows parses with the real `tttr`
parser, every command the parser has is named in the README and has help text, the sandbox's
mechanism names and hit-limit values docs/sandbox.md lists are the ones the code reports, and the
event kinds and fields docs/contracts.md lists are the ones the store checks and the engine
writes (the page's call shapes and records are checked by signature in tests/test_contracts.py).
No model is loaded."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from tttr.app.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONTRACTS = (ROOT / "docs" / "contracts.md").read_text()
SANDBOX = (ROOT / "docs" / "sandbox.md").read_text()


def _documented_commands() -> list[str]:
    lines = []
    for block in re.findall(r"```(?:bash|console|sh)?\n(.*?)```", README, re.S):
        for line in block.splitlines():
            line = line.strip().removeprefix("$ ").removeprefix("bash .ci/install && ")
            if line.startswith("tttr "):
                lines.append(re.split(r"\s+#\s", line)[0].strip())
    return lines


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_the_readme_shows_commands():
    assert len(_documented_commands()) >= 20


def test_the_readme_is_a_users_guide():
    lines = len(README.splitlines())
    assert lines <= 300, (f"README.md has {lines} lines: it is a user's guide (what it is, install, how to use it, "
                          "where to read more); move reference detail to docs/reference.md or the doc it belongs to")


@pytest.mark.parametrize("line", _documented_commands())
def test_every_documented_command_line_parses(line):
    build_parser().parse_args(shlex.split(line)[1:])  # argparse exits 2 on anything it does not know


def test_every_command_is_documented():
    missing = []
    for name, parser in _subcommands(build_parser()).items():
        inner = _subcommands(parser)
        names = [f"tttr {name} {sub}" for sub in inner] if inner else [f"tttr {name}"]
        missing += [n for n in names if n not in README]
    assert not missing, f"commands the README never names: {missing}"


def test_sandbox_mechanisms_and_limits_are_documented():
    from tttr.recorders.probe import SandboxSupport
    from tttr.recorders.sandbox import LIMITS_HIT

    every = SandboxSupport(bwrap="bwrap", namespaces=True, userns=True, faketime="f", shim="s",
                           pids_cgroup="p", nproc_rlimit=True, reason=None, host_uid=100000,
                           no_userns=True, seccomp="bpf")
    flat = " ".join(SANDBOX.split())
    for name in every.mechanisms():
        assert name in flat, f"mechanism {name!r} is not in docs/sandbox.md"
    for name in LIMITS_HIT:
        assert f"`{name}`" in SANDBOX, f"limit {name!r} is not in docs/sandbox.md"


def _all_commands() -> list[tuple[str, argparse.ArgumentParser, str | None]]:
    """(command line, its parser, the help its parent lists for it) for every command."""
    out = []

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    out.append((f"{prefix} {name}", sub, helps.get(name)))
                    walk(f"{prefix} {name}", sub)

    walk("tttr", build_parser())
    return out


def test_every_command_has_help_text():
    commands = _all_commands()
    assert len(commands) >= 20
    missing = [line for line, _, short in commands if not (short or "").strip()]
    assert not missing, f"commands without a one-line help in their parent's list: {missing}"
    for line, parser, short in commands:
        text = parser.format_help()
        assert text.startswith("usage: " + line), f"{line}: its usage line names it as {text.splitlines()[0]!r}"
        options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
        bare = [a.option_strings[0] for a in options if not (a.help or "").strip()]
        assert not bare, f"{line}: options without help text: {bare}"


def _documented_kinds() -> dict[str, tuple[str, set[str]]]:
    """kind -> (layer, fields) from the kinds table of docs/contracts.md."""
    kinds = {}
    for row in re.findall(r"^\| (\w+) \| `(\w+)` \| ([^|]*) \|", CONTRACTS, re.M):
        layer, kind, fields = row
        kinds[kind] = (layer, set(re.findall(r"`(\w+)`", fields)))
    return kinds


def test_documented_event_kinds_are_the_store_rules():
    from tttr.sessions.store import LAYERS
    from tttr.sessions.values import RULES

    documented = _documented_kinds()
    assert {"clock", "tool", "token", "logits", "prompt", "message", "action", "outcome"} <= set(documented)
    assert set(documented) == set(RULES), "docs/contracts.md's kinds table and sessions.values.RULES name other kinds"
    for kind, (layer, fields) in documented.items():
        assert layer in LAYERS, f"{kind}: {layer!r} is not a layer"
        assert fields == set(RULES[kind][0]), (
            f"{kind}: documented {sorted(fields)}, the store's rule checks {sorted(RULES[kind][0])}")
        assert set(RULES[kind][1]) <= fields


def test_documented_token_and_logits_fields_are_what_the_engine_writes():
    from tttr.engine.inference.sequence import TokenRecord
    from tttr.sessions.codec import LOGITS_KEYS, TOKEN_KEYS

    record = TokenRecord(position=0, token_id=1, forced=False, logprob=-0.5, topk=((1, -0.5),), digest="ab",
                         batch_rows=1, rows=(0,), row=0, kernel_mode="invariant", rng=(0, 0, 0), text="a",
                         logits=None)
    documented = _documented_kinds()
    assert set(record.token_value()) <= documented["token"][1]
    assert set(record.logits_value()) == documented["logits"][1]
    assert set(TOKEN_KEYS) <= documented["token"][1] and set(LOGITS_KEYS) == documented["logits"][1]


def _image_links() -> list[tuple[str, str]]:
    """(markdown file, image path) for every image the README and docs/*.md show."""
    links = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", doc.read_text()):
            if not re.match(r"[a-z]+://", target):
                links.append((str(doc.relative_to(ROOT)), target))
    return links


def test_every_image_the_docs_show_exists():
    links = _image_links()
    assert {t for d, t in links if d == "README.md"} >= {
        "assets/screenshots/runs.svg", "assets/screenshots/timeline.svg",
        "assets/screenshots/edit.svg", "assets/screenshots/compare.svg"}
    missing = [(doc, target) for doc, target in links
               if not ((ROOT / doc).parent / target.split("#")[0]).is_file()]
    assert not missing, f"images linked but not in the repository: {missing}"
