"""The C that TTTR compiles on first use lives in `.c` files (and the `.h` pieces they include)
beside the modules that build them, ships in the wheel as package data, and nowhere else: no
Python module holds C in a string."""

from __future__ import annotations

import fnmatch
import importlib
import re
from pathlib import Path

import pytest

from tttr.sessions.cache import c_source

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine", "kernels", "recorders", "sessions")
C_FILES = sorted(p for folder in PACKAGES for p in (ROOT / folder).rglob("*.[ch]"))
LOCAL_INCLUDE = re.compile(r'^#include "([^"]+)"', re.MULTILINE)


def _module(path: Path) -> str:
    return "tttr." + ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_the_c_sources_are_there():
    names = {str(p.relative_to(ROOT)) for p in C_FILES}
    assert {"kernels/cquant.c", "kernels/cq8.c", "kernels/cdecode.c", "kernels/crow.c", "kernels/cattention.c",
            "recorders/launcher.c", "recorders/seedrandom.c"} <= names, names


def test_each_c_file_is_what_its_module_compiles():
    """X.c is built by module X, from exactly that file with its includes spliced in."""
    for path in (p for p in C_FILES if p.suffix == ".c"):
        module = importlib.import_module(_module(path))
        assert module.SOURCE == c_source(path), f"{_module(path)}.SOURCE is not {path.relative_to(ROOT)}"
        assert not LOCAL_INCLUDE.search(module.SOURCE), f"{path.name}: an include left unresolved"


def test_each_header_is_included_by_a_c_file():
    included = {(p.parent, name) for p in C_FILES for name in LOCAL_INCLUDE.findall(p.read_text())}
    orphans = [str(h.relative_to(ROOT)) for h in C_FILES if h.suffix == ".h" and (h.parent, h.name) not in included]
    assert not orphans, f"headers no .c file includes: {orphans}"


def test_no_python_module_holds_c():
    offenders = [str(p.relative_to(ROOT)) for folder in PACKAGES for p in (ROOT / folder).rglob("*.py")
                 if re.search(r"^\s*#include [<\"]", p.read_text(), re.MULTILINE)]
    assert not offenders, f"C source inside Python (move it into a .c file beside the module): {offenders}"


def test_the_wheel_ships_every_c_file():
    """pyproject.toml's package-data names each .c and .h file for the package it lies in (a
    wheel, not only the editable install, must carry them: they are compiled where it is installed)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folder_of = {folder: package for package, folder in setuptools["package-dir"].items()}
    data = setuptools["package-data"]
    missing = []
    for path in C_FILES:
        rel = path.relative_to(ROOT)
        package = folder_of[rel.parts[0]] + "".join("." + part for part in rel.parts[1:-1])
        globs = [*data.get("*", []), *data.get(package, [])]
        if not any(fnmatch.fnmatch(rel.name, g) for g in globs):
            missing.append(str(rel))
    assert not missing, f"not package data in pyproject.toml: {missing}"


def test_c_source_splices_local_includes_in_place(tmp_path):
    """What the compiler is handed (and build_shared's key covers) includes each header's text, so
    a change to a header rebuilds the library; system includes are left to the compiler."""
    (tmp_path / "inner.h").write_text("static int inner(void) { return 1; }\n")
    (tmp_path / "outer.h").write_text('#include "inner.h"\nstatic int outer(void) { return inner(); }\n')
    (tmp_path / "main.c").write_text('#include <stdint.h>\n#include "outer.h"\nint f(void) { return outer(); }\n')
    assert c_source(tmp_path / "main.c") == ("#include <stdint.h>\nstatic int inner(void) { return 1; }\n"
                                            "static int outer(void) { return inner(); }\nint f(void) { return outer(); }\n")
