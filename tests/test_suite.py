"""`tttr suite` end to end (issue 17): the default model, the real sandbox, a real SQLite file.
Two runs per condition of one short task with a one-step limit; the runs are stored with
their suite and condition, the pinned conditions replay the task's first free run, and
`tttr stats` reads them with no residual under full pinning."""

from __future__ import annotations

import json

import pytest

from tttr.app.cli import main
from tttr.engine.replay.variance import CONDITIONS
from tttr.sessions.store import Store

pytestmark = pytest.mark.slow  # records and replays real runs of the default model


def test_suite_records_four_conditions_and_stats_reads_them(tmp_path, capsys):
    db = tmp_path / "suite.db"
    assert main(["suite", "--runs", "2", "--tasks", "write-line", "--max-steps", "1", "--db", str(db)]) == 0
    captured = capsys.readouterr()
    assert "[8/8]" in captured.err and "through one engine" in captured.err  # progress per run, batched

    with Store.open(db, readonly=True, create=False) as store:
        runs = [r for r in store.runs() if "suite" in r.meta]
        assert len(runs) == 8 and all(r.status == "complete" for r in runs)
        assert len({r.meta["suite"]["id"] for r in runs}) == 1
        by = {c: [r for r in runs if r.meta["suite"]["condition"] == c] for c in CONDITIONS}
        assert all(len(rs) == 2 for rs in by.values())
        anchor = min(by["free"], key=lambda r: (r.meta["suite"]["index"], r.id))
        replayed = [r for c in ("token-pinned", "trace-pinned", "pinned") for r in by[c]]
        assert all(r.parent == anchor.id and r.meta["suite"]["anchor"] == anchor.id for r in replayed)
        assert all(r.seed == anchor.seed for r in by["token-pinned"] + by["pinned"])
        assert all(r.meta["clock"] == anchor.meta["clock"] for r in by["trace-pinned"] + by["pinned"])
        assert sorted(by["pinned"][0].meta["replay"]["free"]) == ["tensor"]  # the arithmetic recomputed live

    assert main(["stats", "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    pinned = data["tasks"][0]["conditions"]["pinned"]
    assert data["tasks"][0]["task"] == "write-line" and pinned["pairs"] == 1
    assert pinned["agreement"] == 1.0 and data["residual_ok"] is True
