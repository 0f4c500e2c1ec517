"""Every `tttr` command refuses invalid input with one line and exit code 2, never a
traceback, and before any model load or slow work; every command module registers (an
import error fails `tttr` at start); every command has help text.

The cases are keyed by command path and the parser is walked, so a new subcommand
without a case here fails `test_every_command_has_invalid_cases`."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from tttr.app import cli
from tttr.app.cli import COMMAND_MODULES, build_parser, main
from tttr.sessions.errors import TTTRError
from tttr.sessions.store import Store
from test_program_triage import program_run
from test_store import record

# {db}: a database with run 1 (3 steps); {missing}: a path that does not exist;
# {new}: a fresh path (asserted still missing afterwards); {text}: a file that is not a database;
# {empty}: an empty file; {truncated}: a GGUF header and nothing else;
# {programs}: recorded programs (tests/test_program_triage.py): 1 passes, 2 is another program, 3 is
# 1 again, 4 differs and has no --check, 5 is the shell agent's, 6 differs and passed.
INVALID: dict[tuple[str, ...], list[list[str]]] = {
    (): [["--bogus"], ["nosuch"]],
    ("info",): [["info", "{missing}"], ["info", "{text}"], ["info"]],
    ("runs",): [["runs", "{missing}"], ["runs", "{text}"]],
    ("events",): [
        ["events", "{db}", "-1"], ["events", "{db}", "x"], ["events", "{db}", "999"],
        ["events", "{db}", "1", "--limit", "-1"], ["events", "{db}", "1", "--from", "x"],
        ["events", "{db}", "1", "--layer", "nosuch"], ["events", "{missing}", "1"],
        ["events", "{db}", "1", "--layer", "agent", "--kind", "token"],  # no event is both: the filter shows none
    ],
    ("prompt",): [
        ["prompt", "{db}", "999"], ["prompt", "{db}", "x"], ["prompt", "{missing}", "1"], ["prompt", "1"],
        ["prompt", "{db}", "1", "--step", "-1"], ["prompt", "{db}", "1", "--model", "{missing}"],
        # a file that is not a GGUF model: the tokenizer's reader refuses it in one line (was a traceback)
        ["prompt", "{programs}", "1", "--model", "{text}"], ["prompt", "{programs}", "1", "--model", "{empty}"],
    ],
    ("generate",): [
        ["generate", "hi", "--max-tokens", "0"], ["generate", "hi", "--top-k", "-1"],
        ["generate", "hi", "--seed", "-1"], ["generate", "hi", "--temperature", "-1"],
        ["generate", "hi", "--temperature", "nan"], ["generate", "hi", "--top-p", "0"],
        ["generate", "hi", "--kernels", "slow"], ["generate", "hi", "--model", "{missing}"], ["generate"],
    ],
    ("serve",): [
        ["serve", "--port", "abc"], ["serve", "--port", "70000"], ["serve", "--kernels", "slow"],
        ["serve", "--model", "{missing}"], ["serve", "--db", "{text}"], ["serve", "--host", "no.such.host.invalid"],
        ["serve", "--upstream", "ftp://x"], ["serve", "--upstream-key-env", "TTTR_NO_SUCH_KEY_VAR"],
        ["serve", "--upstream", "http://127.0.0.1:9/v1", "--upstream-key-env", "TTTR_NO_SUCH_KEY_VAR"],
        # an empty URL is not "no upstream"; the proxy has no kernels to pick
        ["serve", "--upstream", ""], ["serve", "--upstream", "http://127.0.0.1:9/v1", "--kernels", "fast"],
    ],
    ("sandbox",): [["sandbox", "nosuch"]],
    ("sandbox", "exec"): [
        ["sandbox", "exec", "--seed", "-1", "--", "true"], ["sandbox", "exec", "--step", "-2", "--", "true"],
        ["sandbox", "exec", "--timeout", "0", "--", "true"], ["sandbox", "exec", "--timeout", "x", "--", "true"],
        ["sandbox", "exec", "--tree-mb", "0", "--", "true"], ["sandbox", "exec", "--tmp-mb", "-1", "--", "true"],
        ["sandbox", "exec", "--tree", "{missing}", "--", "true"],
        ["sandbox", "exec", "--clock", "yesterday", "--", "true"], ["sandbox", "exec", "--clock", "", "--", "true"],
        ["sandbox", "exec", "--"], ["sandbox", "exec", "--", " "],
    ],
    ("sandbox", "probe"): [["sandbox", "probe", "--bogus"]],
    ("tasks",): [["tasks", "--bogus"], ["tasks", "extra"]],
    ("task",): [["task", "nosuch"]],
    ("task", "check"): [
        ["task", "check", "nosuch"], ["task", "check"], ["task", "check", "--all", "write-line"],
        ["task", "check", "--all", "--seed", "-1"], ["task", "check", "--all", "--clock", "yesterday"],
        ["task", "check", "--all", "--clock", ""],  # an empty clock is refused, not taken for "no clock"
    ],
    ("record",): [
        ["record", "--task", "write-line", "--max-steps", "0", "--db", "{new}"],
        ["record", "--task", "nosuch", "--db", "{new}"],
        ["record", "--task", "write-line", "--temperature", "-1", "--db", "{new}"],
        ["record", "--task", "write-line", "--top-p", "2", "--db", "{new}"],
        ["record", "--task", "write-line", "--top-k", "-1", "--db", "{new}"],
        ["record", "--task", "write-line", "--seed", "-1", "--db", "{new}"],
        ["record", "--task", "write-line", "--clock", "yesterday", "--db", "{new}"],
        ["record", "--task", "write-line", "--clock", "", "--db", "{new}"], ["record", "--db", "{new}", "--clock", "", "--", "true"],
        ["record", "--task", "write-line", "--kernels", "slow", "--db", "{new}"],
        ["record", "--task", "write-line", "--model", "{missing}", "--db", "{new}"],
        ["record", "--db", "{new}"],
        ["record", "--task", "write-line", "--db", "{new}", "--", "true"],
        ["record", "--task", "write-line", "--check", "true", "--db", "{new}"],
        ["record", "--task", "write-line", "--timeout", "5", "--db", "{new}"],
        ["record", "--task", "write-line", "--tree", "{missing}", "--db", "{new}"],
        ["record", "--db", "{new}", "--", "no-such-program-tttr"],
        ["record", "--db", "{new}", "--tree", "{missing}", "--", "true"],
        ["record", "--db", "{new}", "--timeout", "0", "--", "true"],
        ["record", "--db", "{new}", "--timeout", "x", "--", "true"],
        ["record", "--db", "{new}", "--clock", "yesterday", "--", "true"],
        ["record", "--db", "{new}", "--seed", "-1", "--", "true"],
        ["record", "--db", "{new}", "--model", "{missing}", "--", "true"],
        # the agent's options mean nothing to a program (were ignored); an empty check passes any tree
        ["record", "--db", "{new}", "--kernels", "fast", "--", "true"],
        ["record", "--db", "{new}", "--temperature", "0", "--max-steps", "2", "--", "true"],
        ["record", "--db", "{new}", "--check", " ", "--", "true"],
    ],
    ("replay",): [
        ["replay", "-1"], ["replay", "1", "--db", "{missing}"], ["replay", "999", "--db", "{db}"],
        ["replay", "1", "--free", "nosuch", "--db", "{db}"], ["replay", "1", "--free", ",", "--db", "{db}"], ["replay", "1", "--seed", "-1", "--db", "{db}"],
        ["replay", "1", "--model", "{missing}", "--db", "{db}"],
        ["replay", "1", "--seed", "4", "--db", "{db}"], ["replay", "1", "--seed", "4", "--free", "trace", "--db", "{db}"],  # seeds nothing
    ],
    ("fork",): [
        ["fork", "1", "--db", "{missing}", "--at", "0:clock", "--set", "+1h"],
        ["fork", "x", "--db", "{db}", "--at", "0:clock", "--set", "+1h"],
        ["fork", "1", "--db", "{db}", "--at", "nosite", "--set", "1"],
        ["fork", "1", "--db", "{db}", "--at", "0:clock", "--set", "not a time"],
        ["fork", "999", "--db", "{db}", "--at", "0:clock", "--set", "+1h"],
        ["fork", "1", "--db", "{db}", "--set", "1"],
    ],
    ("diff",): [
        ["diff", "1", "2", "--db", "{missing}"], ["diff", "1", "999", "--db", "{db}"], ["diff", "-1", "1"],
    ],
    ("triage",): [
        ["triage", "1", "2", "--db", "{missing}"], ["triage", "1", "999", "--db", "{db}"], ["triage", "-1", "1"],
        ["triage", "1", "1", "--db", "{db}"], ["triage", "1", "2", "--judge", "vibes", "--db", "{db}"],
        # recorded programs: the same run, another program, no difference, no --check, a mixed pair
        ["triage", "1", "1", "--db", "{programs}"], ["triage", "1", "2", "--db", "{programs}"],
        ["triage", "1", "3", "--db", "{programs}"], ["triage", "1", "4", "--db", "{programs}"],
        ["triage", "1", "5", "--db", "{programs}"],
    ],
    ("bisect",): [
        ["bisect", "1", "2", "--db", "{missing}"], ["bisect", "999", "1", "--db", "{db}"],
        ["bisect", "1", "1", "--db", "{db}"], ["bisect", "1", "2", "--max-replays", "0", "--db", "{db}"],
        ["bisect", "1", "2", "--db", "{programs}"], ["bisect", "1", "3", "--db", "{programs}"],
        ["bisect", "5", "1", "--db", "{programs}"], ["bisect", "1", "6", "--db", "{programs}"],  # 6: BAD passed
    ],
    ("rename",): [
        ["rename", "1", "x", "--db", "{missing}"], ["rename", "999", "x", "--db", "{db}"],
        ["rename", "1", "", "--db", "{db}"], ["rename", "1", "a\nb", "--db", "{db}"], ["rename", "1", "x"],
        ["rename", "x", "y", "--db", "{db}"],
    ],
    ("delete",): [
        ["delete", "1", "--db", "{missing}", "--yes"], ["delete", "999", "--db", "{db}", "--yes"],
        ["delete", "-1", "--db", "{db}"], ["delete", "1"], ["delete", "1", "--db", "{db}"],
    ],
    ("gc",): [["gc", "--db", "{missing}"], ["gc", "--db", "{text}"], ["gc"], ["gc", "--db", "{db}", "--dry-run", "--vacuum"]],
    ("open",): [["open", "{missing}"], ["open", "{text}"], ["open", "{db}", "--run", "999"], ["open", "{db}", "--run", "-1"],
                ["open", "{db}", "--model", "{missing}"], ["open", "{db}", "--model", "{text}"]],  # before the app
    ("demo",): [
        ["demo", "--task", "nosuch", "--db", "{new}"], ["demo", "--db", "{db}"],
        ["demo", "--seed", "-1", "--db", "{new}"], ["demo", "--model", "{missing}", "--db", "{new}"],
        ["demo", "--db", "{missing}"],  # its folder does not exist: one line, no progress lines before it
    ],
    ("suite",): [
        ["suite", "--runs", "1", "--db", "{new}"], ["suite", "--runs", "x", "--db", "{new}"], ["suite", "--db", "{new}"],
        ["suite", "--runs", "2", "--tasks", "nosuch", "--db", "{new}"], ["suite", "--runs", "2", "--tasks", ",", "--db", "{new}"],
        ["suite", "--runs", "2", "--temperature", "0", "--db", "{new}"],
        ["suite", "--runs", "2", "--temperature", "nan", "--db", "{new}"],
        ["suite", "--runs", "2", "--batch", "0", "--db", "{new}"],
        ["suite", "--runs", "2", "--model", "{missing}", "--db", "{new}"],
        ["suite", "--runs", "2", "--tasks-dir", "{missing}", "--db", "{new}"],
        ["suite", "--runs", "2", "--tasks-dir", "{text}", "--db", "{new}"],
        ["suite", "--resume", "nosuch", "--db", "{new}"], ["suite", "--resume", "nosuch", "--db", "{db}"],
        ["suite", "--runs", "2", "--clock", "yesterday", "--db", "{new}"],
        ["suite", "--runs", "2", "--ray", "127.0.0.1:9", "--db", "{new}"],
        ["suite", "--runs", "2", "--db", "{new}", "--", "no-such-agent-program"],
    ],
    ("compare",): [
        ["compare", "{db}", "{db}"], ["compare", "{missing}", "x", "--db", "{missing}"], ["compare", "{text}", "{db}"],
        ["compare", "{db}", "{db}", "--delta", "0"], ["compare", "{db}", "{db}", "--plot", "{new}"],
    ],
    ("merge",): [
        ["merge", "{db}"], ["merge", "{db}", "--into", "{db}", "--append"], ["merge", "{missing}", "--into", "{new}"],
        ["merge", "{text}", "--into", "{new}"], ["merge", "{db}", "--into", "{text}"],
    ],
    ("export",): [
        ["export", "1", "--db", "{db}"], ["export", "999", "--db", "{db}", "--otlp", "{new}"],
        ["export", "1", "--db", "{missing}", "--otlp", "{new}"], ["export", "1", "--db", "{text}", "--otlp", "{new}"],
    ],
    ("import",): [
        ["import", "{missing}", "--db", "{new}"], ["import", "{text}", "--db", "{new}"],
        ["import", "{empty}", "--db", "{new}"], ["import", "{db}", "--db", "{new}", "--format", "nosuch"],
    ],
    ("stats",): [
        ["stats", "--db", "{db}"], ["stats", "--db", "{missing}"], ["stats", "--db", "{text}"],
        ["stats", "--db", "{db}", "--suite", "nosuch"], ["stats", "--db", "{db}", "--plot", "{new}"],
        ["stats", "--db", "{db}", "--plot", "{missing}.png"],
    ],
    ("bench",): [["bench", "nosuch"]],
    ("bench", "store"): [["bench", "store", "--events", "0"], ["bench", "store", "--window-events", "x"]],
    ("bench", "engine"): [
        ["bench", "engine", "--tokens", "0"], ["bench", "engine", "--threads", "0"],
        ["bench", "engine", "--rounds", "-1"], ["bench", "engine", "--kernels", "slow"],
        ["bench", "engine", "--model", "{missing}"], ["bench", "engine", "--model", "{text}"],  # before its cold start
        ["bench", "engine", "--model", "{truncated}", "--no-reference"],  # GGUF's magic, then nothing: its cold start says so
    ],
    ("bench", "serve"): [
        ["bench", "serve", "--tokens", "0"], ["bench", "serve", "--rounds", "-1"],
        ["bench", "serve", "--model", "{missing}"],
    ],
    ("bench", "determinism"): [
        ["bench", "determinism", "--runs", "0"], ["bench", "determinism", "--tokens", "x"],
        ["bench", "determinism", "--seed", "-1"], ["bench", "determinism", "--threads", "0"],
        ["bench", "determinism", "--kernels", "fast"],
    ],
    ("bench", "kernels"): [
        ["bench", "kernels", "--rounds", "0"], ["bench", "kernels", "--tokens", "-3"],
        ["bench", "kernels", "--threads", "x"],
    ],
    ("bench", "sandbox"): [["bench", "sandbox", "--repeats", "0"], ["bench", "sandbox", "--repeats", "x"]],
    ("bench", "replay"): [["bench", "replay", "--runs", "0"], ["bench", "replay", "--model", "{missing}"]],
    ("bench", "bisect"): [
        ["bench", "bisect", "--kinds", "nosuch"], ["bench", "bisect", "--kinds", "clock,clock"],
        ["bench", "bisect", "--model", "{missing}"],
    ],
    ("bench", "app"): [["bench", "app", "--events", "10"], ["bench", "app", "--events", "x"]],
    ("bench", "agent"): [["bench", "agent", "--rounds", "0"], ["bench", "agent", "--rounds", "x"],
                         ["bench", "agent", "--model", "{missing}"]],
    ("bench", "suite"): [["bench", "suite", "--runs", "1"], ["bench", "suite", "--merge-events", "x"]],
    ("bench", "export"): [["bench", "export", "--spans", "0"], ["bench", "export", "--spans", "x"]],
    ("bench", "gpu"): [["bench", "gpu", "--runs", "0"], ["bench", "gpu", "--tokens", "x"]],
    ("bench", "fidelity"): [["bench", "fidelity", "--replays", "0"], ["bench", "fidelity", "--load", "x"],
                            ["bench", "fidelity", "--model", "{missing}"], ["bench", "fidelity", "--tasks", "nosuch"]],
    ("files",): [
        ["files", "{missing}", "1"], ["files", "{text}", "1"], ["files", "{db}", "999"],
        ["files", "{db}", "1", "--step", "99"], ["files", "{db}", "1", "--diff", "1", "--against", "1"],
    ],
}

# What `tttr --help` and `tttr bench --help` list (README's and docs' commands).
COMMANDS = {"info", "runs", "events", "prompt", "generate", "serve", "sandbox", "tasks", "task", "record", "replay", "fork",
            "diff", "triage", "bisect", "open", "demo", "bench", "rename", "delete", "gc", "suite", "stats", "files",
            "compare", "merge", "export", "import"}
BENCHES = {"store", "engine", "determinism", "kernels", "sandbox", "replay", "app", "serve", "bisect", "agent", "fidelity", "suite",
           "export", "gpu"}


def command_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = (), help_text: str | None = None):
    """(path, parser, help in its parent's list) for every parser in the tree; the root is ()."""
    yield path, parser, help_text
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield from command_parsers(sub, (*path, name), helps.get(name))


PATHS = [path for path, _, _ in command_parsers(build_parser())]


@pytest.fixture
def files(tmp_path):
    db = tmp_path / "runs.db"
    with Store.open(db) as store:
        record(store, steps=3)
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 20)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + bytes(60))
    programs = tmp_path / "programs.db"
    with Store.open(programs) as store:
        program_run(store)
        program_run(store, argv=["python3", "other.py"])
        program_run(store)
        program_run(store, result="rain", check=None, passed=None)
        record(store, steps=2)
        program_run(store, result="rain")
    return {"db": str(db), "missing": str(tmp_path / "missing" / "x.db"), "new": str(tmp_path / "new.db"),
            "text": str(text), "programs": str(programs), "empty": str(empty),
            "truncated": str(truncated)}


@pytest.fixture
def nothing_slow(monkeypatch):
    """Invalid input is refused before a model loads or a sandboxed command runs."""

    def refuse(*args, **kwargs):
        raise AssertionError("invalid input reached a model load or a sandboxed command")

    monkeypatch.setattr("tttr.engine.inference.model.load_model", refuse)
    monkeypatch.setattr("tttr.recorders.sandbox.Executor.run", refuse)


def run_cli(argv: list[str]) -> tuple[int, bool]:
    """(exit code, whether argparse refused the line)."""
    try:
        return main(argv), False
    except SystemExit as exc:  # argparse's usage errors
        return exc.code, True


def test_every_command_has_invalid_cases():
    assert set(PATHS) == set(INVALID), (
        f"commands without a case: {sorted(set(PATHS) - set(INVALID))}; "
        f"cases for no command: {sorted(set(INVALID) - set(PATHS))}"
    )


@pytest.mark.parametrize("path", sorted(INVALID), ids=lambda p: " ".join(p) or "tttr")
def test_invalid_input_is_one_line_and_exit_2(path, files, nothing_slow, capsys):
    for case in INVALID[path]:
        argv = [part.format(**files) for part in case]
        code, by_argparse = run_cli(argv)
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert code == 2, (argv, code, captured.err)
        assert "Traceback" not in captured.err, (argv, captured.err)
        assert captured.out == "", (argv, captured.out)  # a refused command prints no result
        errors = [line for line in lines if ": error: " in line]
        assert len(errors) == 1 and lines[-1] == errors[0], (argv, captured.err)
        if by_argparse:  # usage, then `tttr CMD: error: ...`
            assert lines[0].startswith("usage: tttr") and errors[0].startswith("tttr"), (argv, captured.err)
        else:  # ours: exactly one line
            assert len(lines) == 1 and lines[0].startswith("tttr: error: "), (argv, captured.err)
        assert not Path(files["new"]).exists(), (argv, "a refused command wrote a file")


def test_user_errors_share_one_base_with_exit_code_2():
    from tttr.engine.errors import EngineError
    from tttr.engine.replay.mutation import MutationError
    from tttr.engine.replay.source import OracleError
    from tttr.engine.replay.policy import PolicyError
    from tttr.engine.replay.runs import ReplayError
    from tttr.sessions.vocabulary import SiteError
    from tttr.kernels.mode import KernelModeError
    from tttr.recorders.errors import RecorderError, SandboxError, SnapshotError, TaskError
    from tttr.sessions.errors import StoreError

    classes = (StoreError, RecorderError, SandboxError, SnapshotError, TaskError, EngineError, ReplayError,
               SiteError, OracleError, PolicyError, MutationError, KernelModeError)
    for cls in classes:
        assert issubclass(cls, TTTRError) and cls.exit_code == 2, cls
    for cls in (EngineError, ReplayError, SiteError, PolicyError, MutationError, KernelModeError):
        assert issubclass(cls, ValueError), cls  # callers catch them as ValueError


def test_cli_prints_any_tttr_error_with_its_exit_code(monkeypatch, capsys):
    class Refused(TTTRError):
        exit_code = 3

    def handler(args):
        raise Refused("no\nway \x1b[31m")

    parser = build_parser()
    parser.set_defaults(func=handler)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert main([]) == 3
    err = capsys.readouterr().err
    assert err.startswith("tttr: error: no") and err.count("\n") == 1 and "\x1b" not in err


def test_every_command_module_registers():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    bench_sub = argparse.ArgumentParser().add_subparsers()
    for name in COMMAND_MODULES:
        before = len(sub.choices) + len(bench_sub.choices)
        importlib.import_module(f"tttr.app.commands.{name}").register(sub, bench_sub)
        assert len(sub.choices) + len(bench_sub.choices) > before, f"tttr.app.commands.{name} registers nothing"
    top = {path[0] for path in PATHS if len(path) == 1}
    assert top == COMMANDS
    assert {path[1] for path in PATHS if len(path) == 2 and path[0] == "bench"} == BENCHES


def test_a_command_module_that_fails_to_import_fails_tttr(monkeypatch):
    monkeypatch.setattr(cli, "COMMAND_MODULES", (*COMMAND_MODULES, "nosuch"))
    with pytest.raises(ModuleNotFoundError):
        build_parser()
    with pytest.raises(ModuleNotFoundError):
        main(["--help"])


@pytest.mark.parametrize("path", [p for p in PATHS if p], ids=" ".join)
def test_every_command_has_help_and_description(path):
    found = {p: (parser, help_text) for p, parser, help_text in command_parsers(build_parser())}
    parser, help_text = found[path]
    assert help_text and help_text.strip(), f"`tttr {' '.join(path)}` has no help in its parent's list"
    assert parser.description and parser.description.strip(), f"`tttr {' '.join(path)}` has no description"
