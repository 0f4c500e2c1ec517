"""`tttr compare` on real SQLite stores holding hand-built suite runs (issue 30): two suite
databases, two labels in one database, run pairing by seed and start tree, JSON, plots, and
the refusals (one line, exit 2, nothing written)."""

from __future__ import annotations

import json

import pytest

from tttr.app.cli import main
from tttr.sessions.store import Store


def _suite_run(store, suite, label, task, index, passed, seed, tree="T" * 64, cond="free"):
    rid = store.begin_run(task=task, model_id="m", kernel_mode="invariant", seed=seed,
                          meta={"suite": {"id": suite, "condition": cond, "index": index, "anchor": None,
                                          "settings": {"label": label, "runs": 2, "tasks": [task]}}})
    store.append(rid, "setup:setup", {"task": task, "tree": tree, "snapshot": None})
    store.commit_step(rid)
    store.finish_run(rid, "complete", {"passed": passed})
    return rid


def _fill(store, suite, label, verdicts, seed0=100):
    """verdicts: {task: [passed per run index]}; run i of task t gets seed seed0 + i."""
    for task, vs in verdicts.items():
        for i, p in enumerate(vs):
            _suite_run(store, suite, label, task, i, p, seed0 + i)


HOT = {"x": [True, True, True, False], "y": [False, True, False, False]}
COLD = {"x": [True, False, False, False], "y": [False, False, False, False]}


@pytest.fixture
def two_dbs(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    with Store.open(a) as s:
        _fill(s, "sa", "hot", HOT)
    with Store.open(b) as s:
        _fill(s, "sb", "cold", COLD)
    return a, b


def test_compare_two_databases_pairs_by_run(two_dbs, capsys):
    a, b = two_dbs
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("x "))
    assert "3/4" in row and "1/4" in row and "+0.50" in row and row.rstrip().endswith("4")
    assert "paired by run, n=8" in out and "clustered" in out and "naive" in out
    assert "pass@k  A/B: k=1 0.50/0.12" in out and "k=4" in out
    assert main(["compare", str(a), str(b), "--json", "--delta", "0.3"]) == 0
    data = json.loads(capsys.readouterr().out)
    d = data["difference"]
    assert d["best"] == "paired by run" and d["mean"] == pytest.approx(3 / 8)
    assert d["paired_by_run"]["n"] == 8 and d["paired_by_task"]["n"] == 2
    # per-run differences: x (0,1,1,0), y (0,1,0,0); mean 3/8; the paper's eq. 4 spelled out:
    diffs = {"x": [0, 1, 1, 0], "y": [0, 1, 0, 0]}
    m = 3 / 8
    naive2 = sum((v - m) ** 2 for vs in diffs.values() for v in vs) / 7 / 8
    cross = sum(sum(v - m for v in vs) ** 2 - sum((v - m) ** 2 for v in vs) for vs in diffs.values())
    assert d["paired_by_run"]["se"] == pytest.approx((naive2 + cross / 64) ** 0.5)
    assert [p["delta"] for p in data["power"]] == [0.3]
    assert data["pass_hat_k"][0] == {"k": 1, "a": 0.5, "b": 0.125}  # pass^1 = the pass rate


def test_compare_two_labels_in_one_database_with_plots(tmp_path, capsys):
    db = tmp_path / "both.db"
    with Store.open(db) as s:
        _fill(s, "s1", "hot", HOT)
        _fill(s, "s2", "cold", COLD, seed0=500)  # other seeds: no run pairs
    png = tmp_path / "c.png"
    assert main(["compare", "hot", "cold", "--db", str(db), "--plot", str(png), "--plot-terminal"]) == 0
    out = capsys.readouterr().out
    assert "label hot" in out and "label cold" in out and "paired by task, n=2" in out
    assert "pass rate per task" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", "s1", "s2", "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["difference"]["paired_by_run"] is None


def test_compare_refusals_are_one_line_and_write_nothing(two_dbs, tmp_path, capsys):
    a, b = two_dbs
    before = a.read_bytes()
    png = tmp_path / "never.png"
    for argv, says in (
        (["compare", str(a), "nope", "--db", str(tmp_path / "missing.db")], "neither a suite database"),
        (["compare", str(a), "nope", "--db", str(b)], "no suite or label 'nope'"),
        (["compare", str(a), str(b), "--plot", str(tmp_path / "c.jpg")], "ending in .png"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    with pytest.raises(SystemExit) as info:  # argparse's refusal of a value: its usage, then the line
        main(["compare", str(a), str(b), "--delta", "2"])
    assert info.value.code == 2 and "2 is not a difference in pass rate" in capsys.readouterr().err
    other = tmp_path / "other.db"
    with Store.open(other) as s:
        _fill(s, "so", "z", {"w": [True, False]})
        _fill(s, "so2", "z", {"w": [True, False]})
    assert main(["compare", str(a), str(other), "--plot", str(png)]) == 2
    assert "share no task" in capsys.readouterr().err
    assert main(["compare", "z", str(a), "--db", str(other)]) == 2
    assert "label 'z' names 2 suites" in capsys.readouterr().err
    assert a.read_bytes() == before and not png.exists()


def test_compare_shows_hostile_names_from_the_files_inert(tmp_path, capsys):
    """Task names, labels and suite ids come from the database: escapes and markup stay inert."""
    bad = "\x1b[31m[/]red\x07"
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    for path, suite, verdicts in ((a, "s\x1b]0;x\x07", [True, False]), (b, "t", [False, False])):
        with Store.open(path) as s:
            for i, p in enumerate(verdicts):
                _suite_run(s, suite, bad, bad, i, p, 100 + i)
            rid = s.begin_run(task="x", model_id="m", meta={"suite": {"id": suite, "condition": "free", "index": [],
                                                                      "settings": {"label": 7}}})
            s.finish_run(rid, "complete", ["not", "an", "outcome"])
    assert main(["compare", str(a), str(b), "--plot-terminal"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[31m" not in out and "\x1b]0;" not in out and "\x07" not in out
    assert "[/]red" in out and "1/2" in out
