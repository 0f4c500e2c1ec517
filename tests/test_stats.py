"""Variance decomposition (issue 17): the Wilson interval, state-modifying actions, action
agreement and the decomposition on hand-built inputs; `tttr stats` on a real SQLite store
holding hand-built suite runs (table, JSON, PNG, terminal plot, refusals)."""

from __future__ import annotations

import hashlib
import json

import pytest

from tttr.app.cli import main
from tttr.engine.replay.suite import SuiteError, SuiteRun, stats_of, suite_stats
from tttr.engine.replay.variance import (Agreement, Outcomes, agreement, decompose, outcomes, state_actions,
                                         wilson)
from tttr.sessions.store import Store

T0, T1, T2 = ("0" * 64, "1" * 64, "2" * 64)


# ---------------------------------------------------------------------------- pure pieces

def test_wilson_matches_the_textbook_values():
    iv = wilson(5, 10)
    assert iv.low == pytest.approx(0.2366, abs=1e-4) and iv.high == pytest.approx(0.7634, abs=1e-4)
    none = wilson(0, 10)
    assert none.low == 0.0 and none.high == pytest.approx(0.2775, abs=1e-4)
    every = wilson(10, 10)
    assert every.high == 1.0 and every.low == pytest.approx(0.7225, abs=1e-4)
    assert wilson(0, 0) is None
    with pytest.raises(ValueError):
        wilson(3, 2)


def test_only_commands_that_changed_the_tree_are_state_modifying():
    tools = [
        {"cmd": "ls", "tree_before": T0, "tree_after": T0},
        {"cmd": " mkdir backups ", "tree_before": T0, "tree_after": T1},
        {"cmd": "cd backups", "tree_before": T1, "tree_after": T1},
        {"cmd": "rm -f x", "tree_before": T1, "tree_after": T2},
        {"cmd": "odd", "tree_before": T1},  # no tree after: not counted
        "not a dict",
    ]
    assert state_actions(tools) == ("mkdir backups", "rm -f x")


def test_agreement_counts_equal_pairs():
    a, b = ("mkdir x",), ("mkdir y",)
    assert agreement([a, a, b]) == Agreement(3, 1)
    assert agreement([a, a, a]).fraction == 1.0
    assert agreement([a]).fraction is None  # no pair
    assert agreement([(), ()]).fraction == 1.0  # two runs that changed nothing agree


def test_decomposition_says_what_each_pinned_layer_removes():
    x, y = ("a",), ("b",)
    by = {
        "free": outcomes([(True, x), (False, y), (True, x), (False, y)]),  # 2 of 6 pairs agree
        "token-pinned": outcomes([(True, x)] * 4),  # all agree
        "trace-pinned": outcomes([(True, x), (True, x), (True, x), (False, y)]),  # 3 of 6
        "pinned": outcomes([(True, x)] * 4),
    }
    d = decompose(by)
    assert d.disagreement["free"] == pytest.approx(4 / 6)
    assert d.removed_by("token") == pytest.approx(4 / 6)
    assert d.removed_by("trace") == pytest.approx(4 / 6 - 3 / 6)
    assert d.share_removed_by("token") == pytest.approx(1.0)
    assert d.residual == 0.0 and d.residual_ok
    bad = decompose({**by, "pinned": outcomes([(True, x), (True, y)])})
    assert bad.residual == 1.0 and not bad.residual_ok
    assert decompose({"free": by["free"]}).removed_by("token") is None


def test_outcomes_pool_by_adding():
    a = Outcomes(3, 1, Agreement(3, 1))
    b = Outcomes(2, 2, Agreement(1, 1))
    s = a + b
    assert (s.runs, s.passed, s.agreement) == (5, 3, Agreement(4, 2))
    assert s.interval == wilson(3, 5)


def _run(rid, task, cond, passed, actions, status="complete"):
    return SuiteRun(rid, task, cond, rid, status, passed, actions)


def test_stats_of_leaves_out_incomplete_runs_and_pools_tasks():
    runs = [
        _run(1, "a", "free", True, ("x",)), _run(2, "a", "free", False, ("y",)),
        _run(3, "a", "free", None, (), status="incomplete"),
        _run(4, "b", "free", True, ("x",)), _run(5, "b", "free", True, ("x",)),
        _run(6, "a", "pinned", True, ("x",)), _run(7, "a", "pinned", True, ("x",)),
    ]
    st = stats_of("s1", runs)
    assert st.left_out == 1
    assert [t.task for t in st.tasks] == ["a", "b"]
    a = st.tasks[0].by_condition["free"]
    assert (a.runs, a.passed, a.agreement) == (2, 1, Agreement(1, 0))
    overall = st.overall.by_condition["free"]
    assert (overall.runs, overall.passed, overall.agreement) == (4, 3, Agreement(2, 1))  # pairs within a task only
    assert "pinned" not in st.tasks[1].by_condition
    assert st.to_json()["residual_ok"] is True


# ---------------------------------------------------------------------------- a real store, the command

def _store_run(store, task, cond, index, passed, cmds_changing, cmds_reading=(), suite="s1"):
    rid = store.begin_run(task=task, model_id="m", kernel_mode="invariant", seed=index,
                          meta={"suite": {"id": suite, "condition": cond, "index": index, "anchor": None}})
    tree = T0
    step = 0
    for cmd in cmds_reading:
        store.append(rid, f"{step}:tool",
                     {"cmd": cmd, "stdout": "", "exit_code": 0, "tree_before": tree, "tree_after": tree})
        store.commit_step(rid)
        step += 1
    for cmd in cmds_changing:
        after = hashlib.sha256((tree + cmd).encode()).hexdigest()
        store.append(rid, f"{step}:tool",
                     {"cmd": cmd, "stdout": "", "exit_code": 0, "tree_before": tree, "tree_after": after})
        store.commit_step(rid)
        tree, step = after, step + 1
    store.finish_run(rid, "complete", {"passed": passed})
    return rid


@pytest.fixture
def suite_db(tmp_path):
    path = tmp_path / "suite.db"
    with Store.open(path) as store:
        _store_run(store, "old", "free", 0, True, ["echo"], suite="s0")  # an older suite: not read by default
        for i, (p, cmds) in enumerate([(True, ["mkdir b"]), (False, ["mkdir c"]), (True, ["mkdir b"])]):
            _store_run(store, "make-dir", "free", i, p, cmds, cmds_reading=["ls"] * i)
        for cond in ("token-pinned", "pinned"):
            for i in range(3):
                _store_run(store, "make-dir", cond, i, True, ["mkdir b"])
        for i, cmds in enumerate([["mkdir b"], ["mkdir c"], ["mkdir d"]]):
            _store_run(store, "make-dir", "trace-pinned", i, i == 0, cmds)
        store.begin_run(task="make-dir", model_id="m", meta={})  # not a suite run, left recording
    return path


def test_suite_stats_reads_the_latest_suite_from_a_store(suite_db):
    with Store.open(suite_db, readonly=True, create=False) as store:
        st = suite_stats(store)
        assert st.suite_id == "s1"
        t = st.tasks[0]
        assert t.task == "make-dir"
        # Reads (`ls`) do not count: runs 0 and 2 agree although run 2 listed twice first.
        assert t.by_condition["free"].agreement == Agreement(3, 1)
        assert t.by_condition["token-pinned"].agreement.fraction == 1.0
        assert t.by_condition["trace-pinned"].agreement.fraction == 0.0
        assert t.decomposition.removed_by("token") == pytest.approx(2 / 3)
        assert t.decomposition.removed_by("trace") == pytest.approx(-1 / 3)
        assert suite_stats(store, "s0").tasks[0].task == "old"
        with pytest.raises(SuiteError, match="no suite 'nope'"):
            suite_stats(store, "nope")


def test_stats_command_prints_table_json_and_plots(suite_db, tmp_path, capsys):
    png = tmp_path / "stats.png"
    assert main(["stats", "--db", str(suite_db), "--plot", str(png), "--plot-terminal"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("task"))
    assert "pass free [95% CI]" in header and "residual" in header
    row = next(line for line in out.splitlines() if line.startswith("make-dir"))
    assert "0.67 [0.21,0.94]" in row and "+0.67" in row and "-0.33" in row
    assert "action agreement per condition" in out and "trace-pinned" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    assert main(["stats", "--db", str(suite_db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    free = data["overall"]["conditions"]["free"]
    assert (free["runs"], free["passed"], free["pairs"], free["agreeing_pairs"]) == (3, 2, 3, 1)
    assert data["residual_ok"] is True


def test_a_residual_under_full_pinning_is_said_loudly(tmp_path, capsys):
    path = tmp_path / "bad.db"
    with Store.open(path) as store:
        for i, cmds in enumerate([["mkdir b"], ["mkdir c"]]):
            _store_run(store, "make-dir", "pinned", i, True, cmds)
    assert main(["stats", "--db", str(path)]) == 0
    captured = capsys.readouterr()
    assert "RESIDUAL NOT ZERO" in captured.err
    assert "1.00 !" in captured.out


def test_stats_on_a_database_without_suite_runs_is_one_line_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "plain.db"
    with Store.open(path) as store:
        rid = store.begin_run(task="make-dir", model_id="m", meta={})
        store.finish_run(rid, "complete", {"passed": True})
    before = path.read_bytes()
    png = tmp_path / "never.png"
    assert main(["stats", "--db", str(path), "--plot", str(png)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tttr: error: the database holds no suite runs") and err.count("\n") == 1
    assert path.read_bytes() == before and not png.exists()


def test_stats_shows_hostile_names_from_the_file_inert(tmp_path, capsys):
    path = tmp_path / "hostile.db"
    with Store.open(path) as store:
        for i in range(2):
            rid = store.begin_run(task="\x1b[31m[/]red", model_id="m",
                                  meta={"suite": {"id": "s\x1b]0;x\x07", "condition": "free", "index": "x"}})
            store.append(rid, "0:tool", {"cmd": ["not", "text"], "tree_before": 1, "tree_after": 2})
            store.commit_step(rid)
            store.finish_run(rid, "complete", ["not", "an", "outcome"])
        store.begin_run(task="t", model_id="m", meta={"suite": {"id": 7, "condition": "free"}})  # not a suite id
    assert main(["stats", "--db", str(path), "--plot-terminal"]) == 0
    captured = capsys.readouterr()
    assert "\x1b[31m[/]red" not in captured.out and "\x1b]0;" not in captured.out  # the file's escapes, inert
    assert "\x07" not in captured.out and "[/]red" in captured.out
    row = next(line for line in captured.out.splitlines() if "red" in line and "2/0/0/0" in line)
    assert "0.00 [0.00,0.66]" in row  # no verdict counts as not passed


def test_the_terminal_plot_of_a_suite_without_free_runs_draws_what_it_has(tmp_path, capsys):
    path = tmp_path / "pinned-only.db"
    with Store.open(path) as store:
        for i in range(2):
            _store_run(store, "make-dir", "pinned", i, True, ["mkdir b"])
    assert main(["stats", "--db", str(path), "--plot-terminal"]) == 0
    out = capsys.readouterr().out
    assert "action agreement per condition" in out
    assert "pass rate, free condition" not in out


def test_a_label_names_one_suite_a_re_run_of_another_setting_is_refused(tmp_path, capsys):
    """Issue 30: `tttr suite --label L` again with the same settings resumes L's suite; with other
    settings, or when L's suite is complete, it is refused in one line with nothing written."""
    path = tmp_path / "s.db"
    settings = {"tasks": ["make-dir"], "runs": 2, "temperature": 0.7, "max_steps": 6, "label": "v1", "seed": None,
                "clock": None, "task_dirs": []}
    with Store.open(path) as store:
        for i in range(2):
            rid = store.begin_run(task="make-dir", model_id="m", seed=i,
                                  meta={"suite": {"id": "s1", "condition": "free", "index": i, "anchor": None,
                                                  "settings": settings}})
            store.finish_run(rid, "complete", {"passed": True})
    before = path.read_bytes()
    for extra, says in ((["--runs", "3"], "other settings (runs)"), (["--runs", "2", "--temperature", "0.5"],
                                                                      "other settings (temperature)")):
        assert main(["suite", "--tasks", "make-dir", "--label", "v1", "--db", str(path), *extra]) == 2
        err = capsys.readouterr().err
        assert says in err and "--resume s1" in err and err.count("\n") == 1, err
    assert path.read_bytes() == before
