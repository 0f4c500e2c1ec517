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
REPLAY_ONLY = ("tttr.app.program_replay", "tttr.app.server", "tttr.engine.serve.recorder",
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
