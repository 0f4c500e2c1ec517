"""The README is checked, so it cannot drift from the product: every command line it shows
parses with the real `tttr` parser, every command the parser has is named in it, and the
sandbox's mechanism names and hit-limit values it lists are the ones the code reports."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from tttr.app.cli import build_parser

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


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
    flat = " ".join(README.split())
    for name in every.mechanisms():
        assert name in flat, f"mechanism {name!r} is not in the README"
    for name in LIMITS_HIT:
        assert f"`{name}`" in README, f"limit {name!r} is not in the README"
