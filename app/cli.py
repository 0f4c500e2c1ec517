"""The `tttr` command.

Each area of the product owns one module in `app.commands` with a function
`register(sub, bench_sub)` that adds its subcommands (`app.commands.bench` adds every
`tttr bench NAME`) and sets `func=handler` on each parser. A handler takes the parsed
arguments and returns an exit code. Command modules import heavy domain code
(torch, the model) inside their handlers, so `tttr --help` stays fast.

Errors meant for the user derive from `tttr.sessions.errors.TTTRError` (each domain
package's error class does): they print as one line on stderr and exit with the
error's `exit_code` (2). Input argparse can check is checked at parsing (usage and
one error line, exit 2). Anything else is a bug and keeps its traceback.

A command module that fails to import fails `tttr` at start: a missing command is
a broken install, not something to hide.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tttr.app.commands import args as argtypes
from tttr.sessions.errors import TTTRError
from tttr.sessions.safe_text import visible

# The command modules and the top-level commands each adds; order here is the order in
# `tttr --help`. `tttr COMMAND ...` imports and registers only COMMAND's module (its --help,
# errors and defaults are the same: a module registers its commands whatever else is there);
# `tttr`, `tttr --help` and `tttr bench ...` register them all. tests/test_import_hygiene.py
# checks this table against what each module registers.
COMMANDS = {
    "store": ("info", "runs", "events", "prompt", "rename", "delete", "gc"),
    "files": ("files",),
    "generate": ("generate",),
    "sandbox": ("sandbox", "tasks", "task"),
    "agent": ("record", "replay", "fork", "diff"),
    "experiments": ("triage", "bisect"),
    "suite": ("suite", "stats"),
    "compare": ("compare", "merge"),
    "serve": ("serve",),
    "traces": ("export", "import"),
    "ui": ("open", "demo"),
    "bench": (),  # every `tttr bench NAME`
}
COMMAND_MODULES = tuple(COMMANDS)
OWNER = {command: module for module, commands in COMMANDS.items() for command in commands}

DESCRIPTION = """\
TTTR (Tensor-Token-Trace Replay) records every value an agent run could not have
predicted, at the tensor, token and trace layers; replays it to the same decisions;
frees one layer to find the culprit; and forks a run at one edited value."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; given a top-level `command`, only the parsers of the
    module that owns it (what `tttr COMMAND ...` parses with)."""
    parser = argparse.ArgumentParser(
        prog="tttr",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `tttr COMMAND --help` for the options of one command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench = sub.add_parser(
        "bench",
        help="measure speed and determinism; prints ratios measured side by side",
        description="Benchmarks. Each prints its figures; --json prints one JSON object.",
    )
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCH")
    bench.set_defaults(func=lambda args: _missing(bench))
    for name in (OWNER[command],) if command is not None else COMMAND_MODULES:
        importlib.import_module(f"tttr.app.commands.{name}").register(sub, bench_sub)
    return parser


def _missing(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


# Options whose value may begin with "-": clock shifts (`--set -1d`) and the setup step's sites
# in their old spelling (`--at -1:clock`; today's is `setup:clock`). argparse reads such a value
# as another option; `--at=-1:clock` always worked.
VALUE_MAY_START_WITH_DASH = ("--at", "--set")


def _glue_dash_values(argv: list[str]) -> list[str]:
    """`--set -1d` as `--set=-1d` and `--at -1:clock` as `--at=-1:clock`, so both parse."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            return out + argv[i:]
        if argv[i] in VALUE_MAY_START_WITH_DASH and i + 1 < len(argv) and argv[i + 1].startswith("-") \
                and argv[i + 1] not in ("-", "--") and not argv[i + 1].startswith("--"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    argv = _glue_dash_values(sys.argv[1:] if argv is None else list(argv))
    # the first word is the command: `tttr` takes no option before it
    parser = build_parser(argv[0]) if argv and argv[0] in OWNER else build_parser()
    args = parser.parse_args(argv)
    argtypes.resolve_database(parser, args)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("tttr: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except TTTRError as exc:
        # One line, and nothing from a database (quoted in the message) acts on the terminal.
        print(f"tttr: error: {visible(exc, newlines=False)}", file=sys.stderr)
        return int(exc.exit_code)


if __name__ == "__main__":
    sys.exit(main())
