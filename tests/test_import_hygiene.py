"""The domain never imports the UI: each domain package, imported in a fresh
interpreter (with every module inside it), must not load textual."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOMAIN = ("engine", "kernels", "recorders", "sessions")


def _modules(package: str) -> list[str]:
    names = [package]
    for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
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


def test_cli_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "app", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "bench" in out.stdout
