"""The runs list by window (`Store.run_links`, `run_rows`, `run_pages`): the rows a list
shows, read a window of ids at a time, are the runs `Store.run` reads with the steps and
events `Store.steps` and `Store.count_events` count, for forks, forks of forks, replays,
recorded programs and hand-edited files alike; the windows together are every run once."""

from __future__ import annotations

import sqlite3

import pytest

from tttr.sessions.store import RunLink, Store, StoreError

from test_store import SEED, _fork_tree, record, record_step


def mixed(store: Store) -> dict[str, int]:
    """A fork tree (parent, fork, its fork, other), a replay of the parent, a recorded
    program and a fork of it that does not repeat its command line, one run being recorded."""
    parent, fork, grandchild, other = _fork_tree(store)
    replay = store.begin_run(task="t", parent=parent, fork_seq=0, meta={"replay": {"free": ["tensor"]}}, seed=SEED)
    record_step(store, replay, 0, positions=1)
    store.finish_run(replay, "complete", {"passed": True})
    program = store.begin_run(task="program:python3", meta={"program": ["python3", "agent.py", "--fast"]})
    record_step(store, program, 0, positions=1)
    record_step(store, program, 1, positions=1)
    store.finish_run(program, "complete", {"exit_code": 0})
    program_fork = store.begin_run(task="program:python3", parent=program, fork_seq=3, meta={"check": "sh c.sh"})
    record_step(store, program_fork, 1, positions=2)
    store.finish_run(program_fork, "failed", {"exit_code": 1})
    live = store.begin_run(task="live", seed=SEED)
    record_step(store, live, 0, positions=1)
    return {"parent": parent, "fork": fork, "grandchild": grandchild, "other": other, "replay": replay,
            "program": program, "program_fork": program_fork, "live": live}


@pytest.fixture
def db(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        yield store, mixed(store)


def test_a_window_of_rows_is_what_the_run_by_run_reads_give_in_the_order_asked(db):
    store, ids = db
    asked = [ids["grandchild"], ids["other"], ids["parent"], ids["program_fork"], ids["live"], ids["fork"]]
    rows = store.run_rows(asked)
    assert [row.run.id for row in rows] == asked
    for row in rows:
        rid = row.run.id
        assert row.run == store.run(rid)
        assert (row.steps, row.events) == (store.steps(rid), store.count_events(rid)), rid
    by_id = {row.run.id: row for row in rows}
    # A fork's counts take in its parent's prefix; its ancestors are listed nearest first.
    assert [a.id for a in by_id[ids["grandchild"]].ancestors] == [ids["fork"], ids["parent"]]
    assert by_id[ids["parent"]].ancestors == () and by_id[ids["fork"]].steps == 4
    # A program's fork that stores no command line finds its program's among its ancestors.
    assert by_id[ids["program_fork"]].ancestors[0].meta["program"] == ["python3", "agent.py", "--fast"]
    assert by_id[ids["live"]].run.status == "recording"


def test_ids_not_in_the_file_are_left_out_and_repeats_read_once(db):
    store, ids = db
    rows = store.run_rows([ids["other"], 999, ids["other"], ids["replay"], "x", -1])
    assert [row.run.id for row in rows] == [ids["other"], ids["replay"]]
    assert store.run_rows([]) == []


def test_links_name_every_run_its_parent_and_whether_it_is_being_recorded(db):
    store, ids = db
    links = store.run_links()
    assert [link.id for link in links] == sorted(ids.values())
    by_id = {link.id: link for link in links}
    assert by_id[ids["grandchild"]] == RunLink(ids["grandchild"], ids["fork"], False)
    assert by_id[ids["replay"]].parent == ids["parent"] and by_id[ids["parent"]].parent is None
    assert [link.id for link in links if link.recording] == [ids["live"]]
    assert store.count_runs() == len(ids)
    assert store.model_ids() == ["m"]


def test_pages_are_every_run_once_in_id_order_whatever_the_window(db):
    store, ids = db
    everything = sorted(ids.values())
    for window in (1, 2, 3, 8, 500):
        pages = list(store.run_pages(window=window))
        assert all(1 <= len(page) <= window for page in pages)
        assert [row.run.id for page in pages for row in page] == everything
    shown = [row.run.id for page in store.run_pages(offset=2, limit=3, window=2) for row in page]
    assert shown == everything[2:5]
    assert [row.run.id for page in store.run_pages(offset=6, window=4) for row in page] == everything[6:]
    assert list(store.run_pages(offset=len(everything))) == [] and list(store.run_pages(limit=0)) == []
    with pytest.raises(StoreError, match="offset and limit are >= 0"):
        list(store.run_pages(offset=-1))


def test_a_reader_on_another_connection_sees_the_writer_recording(tmp_path):
    path = tmp_path / "s.db"
    writer = Store.open(path)
    try:
        done = record(writer, steps=1)
        live = writer.begin_run(task="live", seed=SEED)
        record_step(writer, live, 0, positions=1)
        with Store.open(path, readonly=True) as reader:
            assert [(link.id, link.recording) for link in reader.run_links()] == [(done, False), (live, True)]
            assert [row.run.status for row in reader.run_rows([live, done])] == ["recording", "complete"]
    finally:
        writer.close()
    with Store.open(path, readonly=True) as reader:  # its writer closed it: incomplete
        assert [link.recording for link in reader.run_links()] == [False, False]
        assert reader.run_rows([live])[0].run.status == "incomplete"


def test_hand_edited_parents_a_cycle_a_missing_run_text_are_rows_with_their_problem(tmp_path):
    path = tmp_path / "s.db"
    with Store.open(path) as store:
        a, b, c, d = (record(store, steps=1) for _ in range(4))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE runs SET parent = ?, fork_seq = 2 WHERE id = ?", (b, a))  # a <-> b: a cycle
    conn.execute("UPDATE runs SET parent = ?, fork_seq = 2 WHERE id = ?", (a, b))
    conn.execute("UPDATE runs SET parent = 77, fork_seq = 2 WHERE id = ?", (c,))  # not in the file
    conn.execute("UPDATE runs SET parent = 'one' WHERE id = ?", (d,))  # not an integer
    conn.commit()
    conn.close()
    with Store.open(path, readonly=True) as store:
        rows = store.run_rows([a, b, c, d])
        for row in rows:
            assert row.run == store.run(row.run.id)
            assert (row.steps, row.events) == (store.steps(row.run.id), store.count_events(row.run.id))
        assert [a_.id for a_ in rows[0].ancestors] == [b]  # the cycle ends where it began
        assert "its parent run 77 is not in the file" in rows[2].run.problem
        assert "parent" in rows[3].run.problem
        assert [link.parent for link in store.run_links()] == [b, a, 77, None]


# --------------------------------------------------------------------------- `tttr runs`
def test_tttr_runs_prints_every_run_of_a_big_database_window_by_window(tmp_path, capsys):
    """1,234 runs span three of the store's windows: the table lists each run once, by id,
    with its counts (a fork's prefix included); --json gives one object per run; --offset
    and --limit page the list."""
    import json

    from tttr.app.bench import generate_runs
    from tttr.app.cli import main
    from tttr.sessions.run_list import WINDOW

    path = tmp_path / "many.db"
    generate_runs(path, 2 * WINDOW + 234)
    with Store.open(path, readonly=True) as store:
        counts = {r.id: (store.steps(r.id), store.count_events(r.id)) for r in store.runs()}
    assert len(counts) == 2 * WINDOW + 234 and any(steps == 2 and r % 10 == 4 for r, (steps, _) in counts.items())

    assert main(["runs", "--db", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: {len(counts)} run(s)")
    rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in out.splitlines() if line.startswith("│")]
    assert [int(row[0]) for row in rows] == sorted(counts)
    assert {int(row[0]): (int(row[7]), int(row[8])) for row in rows} == counts
    forks = {int(row[0]): row[6] for row in rows if row[6]}
    assert forks and all(parent.startswith(("fork of #", "replay of #")) for parent in forks.values())

    assert main(["runs", str(path), "--json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["id"]: (r["steps"], r["events"]) for r in shown} == counts and len(shown) == len(counts)

    assert main(["runs", str(path), "--offset", str(WINDOW - 2), "--limit", "5", "--json"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == sorted(counts)[WINDOW - 2:WINDOW + 3]
    assert main(["runs", str(path), "--offset", "1230", "--limit", "10"]) == 0
    out = capsys.readouterr().out
    assert f"runs 1,231–1,234 of {len(counts):,}" in out and sum(line.startswith("│") for line in out.splitlines()) == 4
