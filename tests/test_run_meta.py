"""A run's metadata is a type (issue 28): `Run.meta` is a frozen `RunMeta` read at the store,
with a typed field for every key a reader reads by name (its kind included) and the stored
object kept whole for what copies or prints it (`to_json()`, in its stored order). A key of
the wrong type in an untrusted database reads as absent and is the run's `problem`: listed,
never a crash, in `tttr runs`, `tttr info`, `tttr events` and the app's runs list. No module
of the product reads a run's meta by key any more (checked over the source below)."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sqlite3
from pathlib import Path
from types import MappingProxyType

import pytest
from tttr.app.cli import main
from tttr.sessions.records import META_FIELDS, RunMeta, SuiteTag
from tttr.sessions.store import Store

ROOT = Path(__file__).resolve().parent.parent
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

# One of each key readers read by name, plus keys nobody does, in an order that is not sorted.
STORED = {
    "source": "tttr record", "program": ["python3", "agent.py"], "clock": "2026-03-02T10:00:00",
    "timeout_s": 2, "check": "test -f out.txt", "endpoint": "sdk",
    "suite": {"id": "s1", "condition": "pinned", "index": 1, "anchor": 4, "task": "say-a-word",
              "agent": "program", "settings": {"label": "mine", "runs": 2}},
    "replay": {"free": ["tensor"]}, "limits": {"max_steps": 6}, "task_env": {"TTTR_TASK_X": "1"},
    "served_by": {"upstream": "http://h"}, "merged_from": {"db": "a.db", "run": 3},
    "trace": {"root": "ab", "others": []}, "missing": ["input messages", 7], "sandbox": ["bwrap"],
}


def _stored_meta(path, rid) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT meta FROM runs WHERE id = ?", (rid,)).fetchone()[0]


def test_a_runs_meta_is_typed_and_keeps_the_stored_object(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        rid = store.begin_run(task="program:python3", meta=STORED)
        store.finish_run(rid)
        run = store.run(rid)
    meta = run.meta
    assert isinstance(meta, RunMeta) and run.problem is None
    assert (meta.kind, meta.source, meta.clock, meta.check) == (
        "program", "tttr record", "2026-03-02T10:00:00", "test -f out.txt")
    assert meta.program == ("python3", "agent.py") and meta.timeout_s == 2.0 and type(meta.timeout_s) is float
    assert meta.suite == SuiteTag("s1", "pinned", 1, 4, "say-a-word", "program",
                                  MappingProxyType({"label": "mine", "runs": 2}))
    assert meta.suite.label == "mine"
    assert dict(meta.limits) == {"max_steps": 6} and meta.replay == {"free": ["tensor"]}
    assert meta.task_env == {"TTTR_TASK_X": "1"} and meta.served_by == {"upstream": "http://h"}
    assert meta.merged_from == {"db": "a.db", "run": 3} and meta.trace == {"root": "ab", "others": []}
    assert meta.missing == ("input messages",)  # its text entries
    # The whole, as stored: every key (the unnamed ones too), in the stored order.
    assert meta == STORED and list(meta.to_json()) == list(STORED) and type(meta.to_json()) is dict
    assert run.to_json()["meta"] == STORED and type(run.to_json()["meta"]) is dict
    assert json.dumps(run.to_json()["meta"], separators=(",", ":"), ensure_ascii=False) == _stored_meta(
        tmp_path / "s.db", rid)
    with pytest.raises((AttributeError, TypeError)):
        meta.clock = "x"
    with pytest.raises(TypeError):
        meta.stored["clock"] = "x"


def test_a_writer_may_hand_the_store_a_dict_or_a_runmeta_and_the_same_bytes_are_stored(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        a = store.begin_run(task="t", meta=STORED)
        b = store.begin_run(task="t", meta=store.run(a).meta)
        c = store.begin_run(task="t", meta={**store.run(a).meta.to_json(), "replay": {"free": []}})
        empty = store.begin_run(task="t")
        for rid in (a, b, c, empty):
            store.finish_run(rid)
        assert store.run(empty).meta == {} and store.run(empty).meta.kind == "agent"
        assert store.run(empty).meta.limits == {} and store.run(empty).meta.suite is None
    assert _stored_meta(tmp_path / "s.db", a) == _stored_meta(tmp_path / "s.db", b)
    assert json.loads(_stored_meta(tmp_path / "s.db", c)) == {**STORED, "replay": {"free": []}}
    assert _stored_meta(tmp_path / "s.db", empty) == "{}"


HOSTILE = {
    "source": ["tttr serve"], "clock": 5, "limits": [6], "replay": True,
    "suite": "s\x1b[31m", "trace": [1], "missing": "abc", "check": {"$blob": 1},
    "program": [1, "\x1b]0;pwned\x07"], "timeout_s": "3", "served_by": 5, "task_env": [],
    "merged_from": "x", "\x1b[2Jkey": "\x1b[31mvalue", "upstream": None,
}


def test_every_named_key_of_the_wrong_type_reads_as_absent_and_is_named_in_the_problem():
    assert set(HOSTILE) >= set(META_FIELDS)
    meta, problems = RunMeta.read("write-line", HOSTILE)
    for name in META_FIELDS:
        assert any(f"its meta field {name!r} is " in p for p in problems), name
        assert name not in meta
    assert (meta.source, meta.clock, meta.replay, meta.suite, meta.trace, meta.check, meta.program, meta.timeout_s,
            meta.served_by, meta.task_env, meta.merged_from) == (None,) * 11
    assert meta.limits == {} and meta.missing == ()
    assert meta.kind == "calls"  # an `upstream` key, whatever its value, as before
    assert meta["\x1b[2Jkey"] == "\x1b[31mvalue"  # what nobody reads by name is kept as stored
    assert "its meta field 'program' is a list, not a list of text" in problems
    assert all(not RAW_CONTROL.search(p) for p in problems)
    assert RunMeta.read(None, [1, 2]) == (RunMeta(), ["its meta is a list, not an object"])
    assert RunMeta.read(None, None) == (RunMeta(), [])
    assert RunMeta.of("x", {"suite": {"id": 5, "index": "1", "settings": []}}).suite == SuiteTag()
    with pytest.raises(ValueError, match="a run's kind is one of"):
        RunMeta("shell")


@pytest.fixture
def hostile_db(tmp_path):
    from tttr.app.bench import generate

    path = tmp_path / "h.db"
    generate(path, 20, seed=1, tokens_per_step=2)
    generate(path, 20, seed=2, tokens_per_step=2)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE runs SET meta = ? WHERE id = 1", (json.dumps(HOSTILE),))
        conn.execute("UPDATE runs SET meta = ? WHERE id = 2", (json.dumps(
            {"program": ["python3", "\x1b]0;pwned\x07a.py", "[bold]x[/]"], "replay": {"free": ["\x1b[31m", 5]}}),))
        conn.execute("UPDATE runs SET parent = 1, fork_seq = 0 WHERE id = 2")
    conn.close()  # the last connection: its log is checkpointed into the file
    return path


def _digest(path) -> tuple[str, str]:
    """The file's bytes and its write-ahead log's (absent or empty: the same)."""
    wal = Path(f"{path}-wal")
    return (hashlib.sha256(Path(path).read_bytes()).hexdigest(),
            hashlib.sha256(wal.read_bytes() if wal.exists() else b"").hexdigest())


@pytest.mark.parametrize("argv", [["runs", "{db}"], ["runs", "{db}", "--json"], ["info", "{db}"],
                                  ["info", "{db}", "--json"], ["events", "{db}", "1"], ["events", "{db}", "2", "--json"],
                                  ["diff", "1", "2", "--db", "{db}"]])
def test_a_hostile_meta_is_listed_with_its_problem_never_a_crash(hostile_db, capsys, argv):
    before = _digest(hostile_db)
    try:
        code = main([a.format(db=hostile_db) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and not RAW_CONTROL.search(out) and not RAW_CONTROL.search(err)
    if argv[0] == "diff":  # a reader of values refuses the run in one line that says why
        assert code == 2 and "its meta field" in err and err.count("\n") == 1
    else:
        assert code == 0, err
    if argv[:1] == ["runs"] and "--json" in argv:
        first = json.loads(out.splitlines()[0])
        assert "its meta field 'suite' is text, not an object" in first["problem"]
        assert first["meta"] == {"\x1b[2Jkey": "\x1b[31mvalue", "upstream": None}
    assert _digest(hostile_db) == before


def test_the_apps_runs_list_shows_a_hostile_meta_safely(hostile_db):
    from tttr.app.screens.runs import RunsScreen

    from tests.app_helpers import run_app

    before = _digest(hostile_db)

    async def flow(app, pilot):
        assert isinstance(app.screen, RunsScreen)
        text = "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())
        assert app._exception is None and not RAW_CONTROL.search(text)
        assert app.screen.query_one("#runs").row_count == 2
        return text

    text = run_app(hostile_db, flow, load_tokenizer=False)
    assert "unreadable: its meta field" in text  # run 1 is marked with its problem
    assert "a.py" in text and "replay of #1" in text  # run 2's command line (escapes shown as text), its lineage
    assert _digest(hostile_db) == before


# ---------------------------------------------------------------------------- no reads by key
PACKAGES = ("engine", "app", "sessions", "recorders")


def _by_key_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a run's meta (`X.meta`, `getattr(X, "meta")`, or a name bound to one) is read by
    key: `.get(...)`, `[...]`, `in`, or tested with isinstance."""
    found = []

    def is_meta(node, names) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "meta":
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "meta":
            return True
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, ast.BoolOp):
            return any(is_meta(v, names) for v in node.values)
        if isinstance(node, ast.IfExp):
            return is_meta(node.body, names) or is_meta(node.orelse, names)
        return False

    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        names: set[str] = set()
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and is_meta(node.value, set()):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(scope):
            if isinstance(node, ast.Subscript) and is_meta(node.value, names):
                found.append((node.lineno, "meta[...]"))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and is_meta(node.func.value, names):
                found.append((node.lineno, "meta.get(...)"))
            elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) \
                    and any(is_meta(c, names) for c in node.comparators):
                found.append((node.lineno, "... in meta"))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                    and node.args and is_meta(node.args[0], names):
                found.append((node.lineno, "isinstance(meta, ...)"))
    return sorted(set(found))


def test_the_check_sees_each_way_of_reading_meta_by_key():
    code = '''
def f(run, at):
    a = run.meta.get("suite")
    b = run.meta["clock"]
    meta = run.meta if isinstance(run.meta, dict) else {}
    c = meta.get("trace")
    d = (run.meta or {}).get("check")
    e = "upstream" in run.meta
    g = getattr(at, "meta", None).get("program")
    ok = run.meta.suite, run.meta.to_json(), {**run.meta.to_json(), "replay": {}}
'''
    assert [what for _, what in _by_key_reads(ast.parse(code))] == [
        "meta.get(...)", "meta[...]", "isinstance(meta, ...)", "meta.get(...)", "meta.get(...)", "... in meta",
        "meta.get(...)"]


def test_no_module_reads_a_runs_meta_by_key():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, what in _by_key_reads(ast.parse(path.read_text(), str(path))):
                found.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert found == [], "read the typed field of Run.meta (sessions/records.RunMeta) instead:\n" + "\n".join(found)
