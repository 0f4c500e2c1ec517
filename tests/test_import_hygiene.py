"""The domain never imports the UI: each domain package, imported in a fresh
interpreter (with every module inside it), must not load textual."""

import pkgutil
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sandbox_helpers import needs_sandbox

ROOT = Path(__file__).resolve().parent.parent
DOMAIN = ("engine", "kernels", "recorders", "sessions")


def _modules(package: str) -> list[str]:
    names = [f"tttr.{package}"]
    for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"tttr.{package}."):
        names.append(info.name)
    return names


@pytest.mark.parametrize("package", DOMAIN)
def test_domain_never_loads_textual(package):
    modules = _modules(package)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    if name.endswith('__main__') or name.endswith('gpu_check'):\n"
        "        continue\n"
        "    importlib.import_module(name)\n"
        "print('textual' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", f"{package} loaded textual"


# What replaying a recorded program needs: reading the recording, the sandbox, the server
# that answers from it. None of it may load torch (seconds of every `tttr replay`).
REPLAY_ONLY = ("tttr.engine.program.replay", "tttr.engine.serve.server", "tttr.engine.serve.recorder",
               "tttr.recorders.sandbox", "tttr.recorders.snapshot", "tttr.recorders.sdk")


def test_replaying_a_program_does_not_load_torch():
    code = f"import importlib, sys\nfor name in {REPLAY_ONLY!r}: importlib.import_module(name)\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "a module a program replay needs loaded torch"


def test_cli_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "tttr.app", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "bench" in out.stdout


PACKAGES = ("app", "engine", "kernels", "recorders", "sessions", "assets")
BARE_IMPORT = re.compile(rf"^\s*(from|import)\s+({'|'.join(PACKAGES)})(\.|\s|$)", re.M)


def test_no_module_imports_a_package_by_its_bare_name():
    """Installed, the folders are `tttr.app`, `tttr.engine`, …: a bare `import engine` would
    only work from a checkout, and would collide with a user's own `engine` package."""
    offenders = []
    for folder in (*PACKAGES, "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            offenders += [f"{path.relative_to(ROOT)}: {m.group(0).strip()}" for m in BARE_IMPORT.finditer(text)]
            offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}"
                          for m in re.finditer(rf"[\"']-m[\"'],\s*[\"']({'|'.join(PACKAGES)})\b", text)]
    assert not offenders, "bare imports:\n" + "\n".join(offenders)


def test_the_wheel_installs_one_top_level_name(tmp_path):
    """A wheel built from the checkout holds `tttr/…` and its metadata, nothing else at the top."""
    # built from a copy: setuptools builds in the source tree, and a stale build/ there would
    # put modules long deleted into the wheel
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                               "tests", "docs", ".hypothesis", ".pytest_cache"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("tttr-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"tttr"}, top
    for package in PACKAGES:
        assert f"tttr/{package}/__init__.py" in names
    assert "tttr/app/styles/app.tcss" in names and any(n.startswith("tttr/assets/tasks/") for n in names)
    assert "tttr/assets/examples/openai_agent.py" in names and "tttr/assets/examples/README.md" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    with zipfile.ZipFile(wheel) as zf:
        assert "tttr = tttr.app.cli:main" in zf.read(entry).decode()


def test_the_layers_are_spelled_once():
    """The layer names are the project's nouns: `tttr.sessions.vocabulary` defines them and
    everything else imports them, so that no two lists can disagree."""
    from tttr.sessions.vocabulary import LAYERS, RECORDED_LAYERS

    assert LAYERS == ("tensor", "token", "trace", "agent") and RECORDED_LAYERS == LAYERS[:3]
    spelled = re.compile(r"""\(\s*["']tensor["']\s*,\s*["']token["']\s*,\s*["']trace["']""")
    offenders = [str(path.relative_to(ROOT)) for folder in PACKAGES for path in (ROOT / folder).rglob("*.py")
                 if spelled.search(path.read_text()) and path != ROOT / "sessions" / "vocabulary.py"]
    assert not offenders, f"the layers spelled again in {offenders}"


# ------------------------------------------------------------------ what `tttr` pays before it works
def _registered(module: str) -> tuple[list[str], list[str]]:
    """The top-level commands and `tttr bench` entries `tttr.app.commands.MODULE` adds."""
    import argparse
    import importlib

    sub = argparse.ArgumentParser().add_subparsers()
    bench_sub = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(f"tttr.app.commands.{module}").register(sub, bench_sub)
    return list(sub.choices), list(bench_sub.choices)


def test_the_command_table_names_what_each_module_registers():
    """`tttr COMMAND` builds only the parsers of the module cli.COMMANDS says owns COMMAND."""
    from tttr.app.cli import COMMANDS

    for module, commands in COMMANDS.items():
        assert tuple(_registered(module)[0]) == commands, f"cli.COMMANDS[{module!r}] is not what it registers"


def _parsers(parser, path=()):
    """Every parser under `parser`, by its command path."""
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def _shown(defaults: dict) -> dict:
    """Defaults comparable across two builds: a handler by its name (a lambda is made anew by each)."""
    return {k: f"{v.__module__}.{v.__qualname__}" if callable(v) else v for k, v in defaults.items()}


def test_a_command_parses_alone_as_among_all():
    """The parser `tttr COMMAND ...` uses (its module's alone) has the same help, usage and
    defaults as that command's parser among all of them."""
    from tttr.app.cli import OWNER, build_parser

    full = dict(_parsers(build_parser()))
    for command in OWNER:
        alone = {path: p for path, p in _parsers(build_parser(command)) if path[:1] == (command,)}
        assert alone, command
        for path, parser in alone.items():
            assert parser.format_help() == full[path].format_help(), " ".join(path)
            assert _shown(parser._defaults) == _shown(full[path]._defaults), " ".join(path)


# Parsing is the standard library and the command modules: nothing of the domain, no
# third-party package. These are what cost start-up most (each measured at 0.05-0.3 s).
HEAVY = ("torch", "numpy", "textual", "rich", "starlette", "sse_starlette", "uvicorn", "httpx", "httpx2", "openai",
         "tokenizers", "rapidfuzz", "tttr.engine.serve.server", "tttr.engine.replay.runs", "tttr.sessions.store",
         "tttr.recorders.treestate")


def test_parsing_any_command_loads_only_the_standard_library_and_the_commands():
    code = (
        "import contextlib, io, sys\n"
        "start = set(sys.modules)\n"
        "from tttr.app import cli\n"
        "def run(argv):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            cli.main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "run(['--help'])\n"
        "for command in cli.OWNER:\n"
        "    run([command, '--help'])\n"
        "    run([command, '--no-such-option'])\n"  # a usage error, found by parsing: nothing runs
        "bench = dict(cli.build_parser()._subparsers._group_actions[0].choices)['bench']\n"
        "for name in bench._subparsers._group_actions[0].choices:\n"
        "    run(['bench', name, '--help'])\n"
        "new = set(sys.modules) - start\n"
        "third = sorted({m.split('.')[0] for m in new} - set(sys.stdlib_module_names) - {'tttr'})\n"
        "light = ('tttr.app', 'tttr.app.cli', 'tttr.kernels', 'tttr.kernels.mode', 'tttr.sessions')\n"
        "domain = sorted(m for m in new if m.startswith('tttr.') and m not in light\n"
        "                and not m.startswith(('tttr.app.commands', 'tttr.sessions.')) or m == 'tttr.sessions.store')\n"
        f"print(third, domain, sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] [] []", f"parsing loaded (third-party, tttr, heavy): {out.stdout}"


def test_a_program_replay_needs_neither_the_agent_replay_nor_the_event_stream():
    """What `tttr replay` of a program imports (its command module, the server that answers
    from the recording) leaves out the agent's replay and sse-starlette (a stream's, loaded
    by the first streamed answer)."""
    modules = (*REPLAY_ONLY, "tttr.app.commands.agent", "tttr.app.commands.experiments")
    code = (f"import importlib, sys\nfor name in {modules!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in ('tttr.engine.replay.runs', 'sse_starlette', 'httpx2', 'httpx') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.slow
@needs_sandbox
def test_replaying_a_recorded_program_loads_neither(tmp_path, capsys):
    """`tttr replay RUN` of a program that never streams, end to end: the agent's replay and
    sse-starlette stay unloaded (and torch: no call is generated)."""
    from tests.program_helpers import program_tree, record_one_call

    program = ("from openai import OpenAI\n"
               "client = OpenAI()\n"
               "r = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=2, seed=1,\n"
               "                                   messages=[{'role': 'user', 'content': 'Hi'}])\n"
               "print(r.choices[0].message.content)\n")
    db = tmp_path / "s.db"
    rec = record_one_call(capsys, db, program_tree(tmp_path, "tree", program))
    code = ("import sys\nfrom tttr.app.cli import main\n"
            f"code = main(['replay', '{rec['run_id']}', '--db', {str(db)!r}, '--json'])\n"
            "print(code, sorted(m for m in ('tttr.engine.replay.runs', 'sse_starlette', 'torch') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert '"identical": true' in lines[-2], lines[-2]
    assert lines[-1] == "0 []", lines[-1]
