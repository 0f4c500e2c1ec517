"""`tttr bench agent`: the report's ratios from given times (unit), and one real run of the
bench with one round (slow): the openai example recorded, run unrecorded, replayed and forked."""

from __future__ import annotations

import json

import pytest

from tttr.engine.bench.agent import Figures, format_report
from tttr.app.cli import main
from sandbox_helpers import needs_sandbox


def _figures(**changes) -> Figures:
    given = dict(record_s=(20.0, 16.0, 18.0), recorded_program_s=(4.2, 4.4, 5.0),
                 unrecorded_program_s=(4.0, 4.3, 4.0), recorded_program_cpu_s=(3.0, 3.3, 3.1),
                 unrecorded_program_cpu_s=(3.0, 3.0, 3.0), replay_s=(4.0, 3.2, 3.6), fork_s=(8.0, 9.0, 10.0),
                 start_s=(2.5, 2.0, 2.2), identical=(True, True, True), sdk_import_ms=12.5, fork_site="3:token:0")
    return Figures(**{**given, **changes})


def test_ratios_take_the_best_round_of_each_side_and_the_overhead_also_the_median():
    r = _figures().to_json()
    assert r["rounds"] == 3 and r["faithful_identical"] is True
    assert r["replay_speedup"] == 5.0  # 16 / 3.2
    assert r["fork_speedup"] == 2.0  # 16 / 8
    assert r["speedup_ceiling"] == 8.0 and r["start_s"] == 2.0  # 16 / 2: the program's start bounds both
    assert r["record_overhead"] == 0.05  # 4.2 / 4.0 - 1
    assert r["record_overhead_median"] == round(4.4 / 4.0 - 1, 4)
    assert r["record_overhead_cpu"] == round(3.1 / 3.0 - 1, 4)
    assert r["record_s"] == 16.0 and r["replay_s"] == 3.2 and r["fork_site"] == "3:token:0"
    assert r["example"] == "assets/examples/openai_agent.py" and r["task"] == "write-line"
    assert _figures(identical=(True, False, True)).to_json()["faithful_identical"] is False


def test_report_prints_each_figure_with_its_target():
    text = format_report(_figures().to_json())
    lines = text.splitlines()
    assert len(lines) == 4
    assert "record 16.00 s" in lines[0] and "fork at 3:token:0 8.00 s" in lines[0]
    assert "faithful_identical true (target true)" in lines[1]
    assert "replay_speedup 5.0x (target >= 50x)" in lines[1] and "fork_speedup 2.0x (target >= 3x" in lines[1]
    assert "takes 2.00 s" in lines[2] and "record ÷ start = 8.0x here" in lines[2]
    assert "record_overhead +5.0% best, +10.0% median (target <= 5%), +3.3% in CPU time (median)" in lines[3]
    assert "sdk_import_ms 12.5 ms" in lines[3]
    r = _figures(sealed_replay_s=(2.6, 2.4, 2.5), recorded_tool_s=0.05).to_json()
    assert (r["sealed_replay_s"], r["program_start_s"], r["sealed_target_s"]) == (2.4, 2.0, 2.35)  # 1.15 x 2 + 0.05
    assert format_report(r).splitlines()[4] == ("sealed_replay_s 2.40 s (target <= 1.15 x program_start_s 2.00 s "
                                                "+ recorded_tool_s 0.050 s = 2.35 s)")


@pytest.mark.parametrize("field", ["record_s", "replay_s", "fork_s", "unrecorded_program_s",
                                   "recorded_program_cpu_s", "start_s"])
def test_a_missing_or_non_positive_time_is_refused_naming_the_field(field):
    with pytest.raises(ValueError, match=f"Figures.{field}"):
        _figures(**{field: (1.0, 0.0)})
    with pytest.raises(ValueError, match=f"Figures.{field}"):
        _figures(**{field: ()})


@pytest.mark.slow
@needs_sandbox
def test_bench_agent_one_round_replays_identically_and_reports_every_figure(capsys):
    assert main(["bench", "agent", "--rounds", "1", "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out.strip().splitlines()[-1])
    assert r["faithful_identical"] is True and r["rounds"] == 1
    for key in ("replay_speedup", "fork_speedup", "record_s", "replay_s", "fork_s", "recorded_program_s",
                "unrecorded_program_s", "sdk_import_ms", "start_s", "speedup_ceiling", "sealed_replay_s",
                "program_start_s", "sealed_target_s"):
        assert isinstance(r[key], float) and r[key] > 0, (key, r[key])
    for key in ("record_overhead", "record_overhead_median", "record_overhead_cpu"):
        assert isinstance(r[key], float) and r[key] > -1, (key, r[key])
    assert r["fork_site"].endswith(":token:0")
    assert "bench agent: round 1/1:" in captured.err and "(identical)" in captured.err
    assert r["start_s"] < r["record_s"] and r["speedup_ceiling"] >= r["replay_speedup"] * 0.5
