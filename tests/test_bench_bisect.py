"""`tttr bench bisect`: the report's arithmetic from given figures, and one end-to-end run of the
smallest configuration (the clock plant) on the default model, the real sandbox and a real
session database, whose figures must be those of the stored triage and bisect replays."""

from __future__ import annotations

import json

import pytest

from tttr.app.cli import main
from tttr.engine.bench.bisect import Figures, Outcome, Plant, format_report, measure, replay_bound


def _outcome(kind="clock", site="2:clock", *, deltas=3, culprits=("trace",), found=("2:clock",), replays=3,
             one=3, batched_s=1.0, one_s=2.0) -> Outcome:
    return Outcome(Plant(kind, "today-report", 1, 2, site, "+1d"), deltas, culprits, found, replays, one,
                   batched_s, one_s, (5, 6))


def test_the_fractions_count_exactly_the_planted_layer_and_site():
    right = _outcome()
    two_layers = _outcome(culprits=("token", "trace"))  # triage named more than the planted layer
    wider = _outcome("token", "0:token:4", culprits=("token",), found=("0:clock", "0:token:4"))  # a set, not the site
    r = Figures((right, two_layers, wider), tried=5, discarded=2).to_json()
    assert [x["triage_correct"] for x in r["outcomes"]] == [True, False, True]
    assert [x["bisect_found"] for x in r["outcomes"]] == [True, True, False]
    assert r["triage_layer_correct_fraction"] == pytest.approx(2 / 3)
    assert r["bisect_found_fraction"] == pytest.approx(2 / 3)
    assert (r["plants"], r["tried"], r["discarded"]) == (3, 5, 2) and r["kinds"] == ["clock", "token"]
    assert r["outcomes"][2]["layer"] == "token" and r["outcomes"][0]["layer"] == "trace"


def test_replays_stand_beside_the_single_cause_bound_and_the_speedup_sums_both_sides():
    assert replay_bound(1) == 2 and replay_bound(4) == 6 and replay_bound(16) == 10
    a = _outcome(deltas=4, replays=5, one=4, batched_s=1.0, one_s=3.0)  # bound 6
    b = _outcome(deltas=1, replays=3, one=1, batched_s=3.0, one_s=1.0)  # bound 2: above it
    r = Figures((a, b), tried=2, discarded=0).to_json()
    assert r["mean_replays"] == 4 and r["mean_replays_one_at_a_time"] == 2.5
    assert r["mean_replay_bound"] == 4 and r["mean_deltas"] == 2.5 and r["within_bound_fraction"] == 0.5
    # the speedup counts only plants with 2+ deltas (b, with one, has no round to batch)
    assert r["speedup_plants"] == 1 and r["batched_speedup"] == 3.0 and (r["batched_s"], r["one_at_a_time_s"]) == (1, 3)
    assert r["per_replay_speedup"] == 3.75  # 3 s / 4 replays one at a time, 1 s / 5 replays batched
    text = format_report(r)
    lines = text.splitlines()
    assert len(lines) == 4 and "2 planted causes kept of 2 forks tried (0 discarded" in lines[0]
    assert "triage_layer_correct_fraction 1.00 (target 1.0); bisect_found_fraction 1.00 (target 1.0)" == lines[1]
    assert lines[2].startswith("mean_replays 4.00 batched, 2.50 one at a time, beside 2*log2(n)+2 = 4.00 on "
                               "average for n = 4, 1 deltas")
    assert "50% of plants are" in lines[2]
    assert lines[3].startswith("batched_speedup 3.00x (target >= 2x) over the 1 plant(s)") and "per replay 3.75x" in lines[3]
    single = Figures((b,), tried=1, discarded=0).to_json()
    assert single["batched_speedup"] is None and single["per_replay_speedup"] is None
    assert format_report(single).splitlines()[3].startswith("batched_speedup n/a (target >= 2x): no plant has 2")


@pytest.mark.parametrize("bad", [dict(deltas=0), dict(replays=0), dict(one=0), dict(batched_s=0.0), dict(one_s=-1.0)])
def test_impossible_figures_are_refused(bad):
    with pytest.raises(ValueError, match="Outcome needs"):
        _outcome(**bad)


def test_no_kept_plant_or_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="at least one kept plant"):
        Figures((), tried=3, discarded=3)
    with pytest.raises(ValueError, match="unknown plant kinds"):
        measure(kinds=("clock", "tensor"))


@pytest.mark.slow  # records and forks real runs of the default model
def test_the_clock_plant_end_to_end_reports_what_triage_and_bisect_found(tmp_path, capsys):
    from tttr.sessions.store import Store

    db = tmp_path / "bench.db"
    code = main(["bench", "bisect", "--kinds", "clock", "--db", str(db), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    r = json.loads(out)
    assert {"triage_layer_correct_fraction", "bisect_found_fraction", "mean_replays", "mean_replay_bound",
            "batched_speedup", "plants", "tried", "discarded", "outcomes"} <= set(r)
    assert "bench bisect: triage and bisect of the clock plant" in err
    (o,) = r["outcomes"]
    assert o["kind"] == "clock" and o["layer"] == "trace" and r["plants"] == 1
    with Store.open(db, create=False, readonly=True) as store:
        good, bad = store.run(o["good"]), store.run(o["bad"])
        assert good.outcome["passed"] is True and bad.outcome["passed"] is False
        assert bad.fork_site == o["site"]
        stored = [store.run(rid) for rid in o["runs"]]
        assert all(run.parent in (o["good"], o["bad"]) and run.status == "complete" for run in stored)
    # The same pair through the commands themselves: the bench reports what they say.
    assert main(["triage", str(o["good"]), str(o["bad"]), "--db", str(db), "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert t["culprits"] == o["culprits"]
    replayed = sum(layer["replay"] is not None for layer in t["layers"])
    assert len(o["runs"]) == replayed + 2 * (o["replays"] + o["replays_one_at_a_time"])  # each bisect ran twice
    assert r["triage_layer_correct_fraction"] == float(t["culprits"] == ["trace"])
    assert main(["bisect", str(o["good"]), str(o["bad"]), "--db", str(db), "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert [d["site"] for d in b["minimal"]] == o["found"] and len(b["deltas"]) == o["deltas"]
    assert b["replays"] == o["replays"] and b["batched"] is True
    assert r["bisect_found_fraction"] == float(o["found"] == [o["site"]])
    assert r["mean_replays"] == o["replays"] and r["mean_replay_bound"] == replay_bound(o["deltas"])
    if o["deltas"] >= 2:  # the two innocent shifts kept: a round to batch
        assert r["batched_speedup"] == pytest.approx(o["one_at_a_time_s"] / o["batched_s"], rel=1e-2)
    else:
        assert r["batched_speedup"] is None


def test_a_bench_that_cannot_measure_says_why_in_one_line(monkeypatch, capsys):
    from tttr.engine.bench import bisect as bench_bisect

    def nothing_passes(**kw):  # a fake of the measuring: what a model that solves nothing meets
        raise bench_bisect.BenchError("no recording of write-line with seeds (2,) passed: nothing to plant a cause in")

    monkeypatch.setattr(bench_bisect, "measure", nothing_passes)
    assert main(["bench", "bisect", "--kinds", "token"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        "tttr: error: no recording of write-line with seeds (2,) passed: nothing to plant a cause in"]
