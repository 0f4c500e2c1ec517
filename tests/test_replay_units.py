"""Unit tests of the replay machinery's pure parts: policy, sites, step alignment."""

import pytest

from tttr.engine.replay.agent import AgentLimits, observation, parse_action
from tttr.engine.replay.diff import align, divergences
from tttr.engine.replay.policy import Policy, PolicyError
from tttr.sessions.vocabulary import Site, SiteError


def test_policy_parse_and_pins():
    assert Policy.parse("").faithful
    p = Policy.parse("tensor, trace")
    assert not p.pinned("tensor") and p.pinned("token") and not p.pinned("trace")
    assert Policy.record().free == {"tensor", "token", "trace"}
    with pytest.raises(PolicyError, match="'tokens'"):
        Policy.parse("tokens")
    for empty in (",", " ", " , "):  # a list gone wrong is refused, not taken for a faithful replay
        with pytest.raises(PolicyError, match="names no layer"):
            Policy.parse(empty)


@pytest.mark.parametrize("text,site", [
    ("3:clock", Site(3, "clock")), ("0:tool", Site(0, "tool")),
    ("2:token:17", Site(2, "token", 17)), ("setup:setup", Site(-1, "setup")),
])
def test_site_round_trip(text, site):
    assert Site.parse(text) == site
    assert str(site) == text


@pytest.mark.parametrize("bad", ["clock", "3:token", "3:clock:2", "x:tool", "3:banana", ""])
def test_bad_sites_are_refused(bad):
    with pytest.raises(SiteError):
        Site.parse(bad)


def test_align_equal_insert_delete():
    rows = align(["ls", "mkdir a", "done"], ["ls", "echo x", "mkdir a", "done"])
    assert [(r.a_step, r.b_step, r.same) for r in rows] == [
        (0, 0, True), (None, 1, False), (1, 2, True), (2, 3, True)]
    rows = align(["a", "b"], ["a", "c"])
    assert [(r.a_action, r.b_action, r.same) for r in rows] == [("a", "a", True), ("b", "c", False)]


class _E:
    def __init__(self, site, kind, value):
        self.site, self.kind, self.value = site, kind, value


def test_first_divergence_per_layer_in_site_order():
    a = [_E("0:token:0", "token", {"id": 1}), _E("0:token:1", "token", {"id": 2}),
         _E("1:token:0", "token", {"id": 5}), _E("0:clock", "clock", {"t": "x"})]
    b = [_E("0:token:0", "token", {"id": 1}), _E("0:token:1", "token", {"id": 3}),
         _E("1:token:0", "token", {"id": 6}), _E("0:clock", "clock", {"t": "x"})]
    d = divergences(a, b).first
    assert set(d) == {"token"}
    assert d["token"].site == "0:token:1" and (d["token"].a, d["token"].b) == (2, 3)


def test_a_site_only_one_run_has_reads_as_no_such_event_not_null():
    a = [_E("0:token:0", "token", {"id": 1}), _E("0:logits:0", "logits", {"digest": "7ef5"})]
    b = [_E("0:token:0", "token", {"id": 1})]  # b ended before it: no logits event there
    d = divergences(a, b).first["tensor"]
    assert d.absent == "b" and d.b is None and d.shown("b") == "(no such event)"
    assert d.describe() == "0:logits:0 (tensor layer): a '7ef5', b (no such event)"
    assert divergences(b, a).first["tensor"].absent == "a"
    assert divergences(a, [_E("0:token:0", "token", {"id": 1}), _E("0:logits:0", "logits", {"digest": "x"})]
                       ).first["tensor"].absent == ""


def test_diff_counts_every_differing_site_of_a_layer_beside_its_first():
    """The first divergence names one site; the count says how many more of its layer differ
    (a site only one run has counts too), so a token fork that changed 40 tokens says so."""
    a = [_E("setup:clock", "clock", {"t": "x"}), _E("0:token:0", "token", {"id": 1}), _E("0:token:1", "token", {"id": 2}),
         _E("1:token:0", "token", {"id": 5}), _E("0:clock", "clock", {"t": "y"}), _E("0:tool", "tool", {"stdout": "a"})]
    b = [_E("setup:clock", "clock", {"t": "x"}), _E("0:token:0", "token", {"id": 1}), _E("0:token:1", "token", {"id": 3}),
         _E("1:token:0", "token", {"id": 6}), _E("1:token:1", "token", {"id": 7}), _E("0:clock", "clock", {"t": "y"}),
         _E("0:tool", "tool", {"stdout": "a"})]
    found = divergences(a, b)
    assert found.first["token"].site == "0:token:1" and found.counts == {"token": 3} and set(found.first) == {"token"}
    assert divergences(a, a) == ({}, {})
    b[0] = _E("setup:clock", "clock", {"t": "z"})
    found = divergences(a, b)
    assert found.first["trace"].site == "setup:clock" and found.counts == {"token": 3, "trace": 1}


def test_parse_action():
    assert parse_action("```bash\nmkdir -p /work/x\n```").cmd == "mkdir -p /work/x"
    assert parse_action("```bash\ndone\n```").done
    assert parse_action("```bash\n\n```").done
    assert parse_action("```bash\nls\nwc -l f\n``` trailing").cmd == "ls\nwc -l f"


def test_observation_truncates():
    text = observation("x" * 1000, "", 0, limit=100)
    assert text.startswith("exit code 0\nstdout:\n" + "x" * 100)
    assert "900 more characters" in text


def test_agent_limits_validate():
    with pytest.raises(ValueError, match="max_steps"):
        AgentLimits(max_steps=0)


def test_align_pairs_a_gap_in_order():
    rows = align(["a", "b"], ["c", "d", "e", "f", "g", "h"])
    assert [(r.a_step, r.b_step) for r in rows] == [(0, 0), (1, 1), (None, 2), (None, 3), (None, 4), (None, 5)]
    assert not any(r.same for r in rows)


def test_a_recording_from_other_kernels_gets_a_note():
    from tttr.engine.inference.fingerprint import fingerprint
    from tttr.engine.replay.runs import kernels_note

    assert kernels_note(fingerprint()) is None  # this TTTR's own recordings compare bit for bit
    note = kernels_note({"attention_kernel": "compiled"})  # a session-2 fingerprint
    assert note.startswith("note:") and "earlier revision" in note and "blake2b-128" in note


def test_same_decisions_with_another_end_state_are_said_so(capsys):
    from types import SimpleNamespace

    from tttr.app.commands.agent import _print_result
    from tttr.engine.replay.result import RunResult, same_outcome
    from tttr.sessions.records import Outcome

    kept = Outcome.of({"passed": True, "tree": "aaaaaaaaaaaaaaaa", "clock": "2026-03-02T10:00:00"})
    deleted = Outcome.of({"passed": False, "tree": "bbbbbbbbbbbbbbbb", "clock": "2026-04-01T10:00:00"})
    assert same_outcome(kept, Outcome.of(dict(kept, clock="later"))) is True
    assert same_outcome(kept, deleted) is False and same_outcome(kept, Outcome.of(dict(kept, tree="c"))) is False
    assert same_outcome(None, kept) is None and same_outcome(kept, None) is None
    res = RunResult(5, "complete", deleted.to_json(), ["ls", "done"], identical=True, parent=1,
                    same_outcome=same_outcome(kept, deleted), extra={"recorded_outcome": kept.to_json()})
    assert isinstance(res.outcome, Outcome) and res.passed is False  # its fields given, an Outcome kept
    _print_result(SimpleNamespace(json=False), res, "forked")
    out = capsys.readouterr().out
    assert "decisions identical to the recording" in out
    assert "the same decisions led to a different end state: passed (tree aaaaaaaaaaaa) in the recording, " \
           "failed (tree bbbbbbbbbbbb) here" in out
    assert res.to_json()["same_outcome"] is False and res.to_json()["identical"] is True


def test_setup_sites_and_negative_shifts_parse_as_documented():
    """`--at -1:clock --set -1d` reads as values, not as options (argparse alone refuses both)."""
    from tttr.app.cli import _glue_dash_values, build_parser

    argv = ["fork", "1", "--at", "-1:clock", "--set", "-1d", "--db", "s.db"]
    args = build_parser().parse_args(_glue_dash_values(argv))
    assert (args.at, args.value, args.db) == ("-1:clock", "-1d", "s.db")
    assert _glue_dash_values(["sandbox", "exec", "--", "--at", "-x"]) == ["sandbox", "exec", "--", "--at", "-x"]
    assert _glue_dash_values(["fork", "--at", "--db"]) == ["fork", "--at", "--db"]


def test_an_sdk_tool_result_that_differs_is_a_trace_divergence():
    """SDK function calls record `result`/`error`, not stdout: a fork that changed one must
    still be named by diff at that site."""
    a = [_E("1:tool", "tool", {"function": "list_files", "args": [], "kwargs": {}, "result": ["README"]}),
         _E("2:tool", "tool", {"cmd": "cat x", "stdout": "same", "stderr": "", "exit_code": 0})]
    b = [_E("1:tool", "tool", {"function": "list_files", "args": [], "kwargs": {}, "result": ["README", "greeting.txt"]}),
         _E("2:tool", "tool", {"cmd": "cat x", "stdout": "other", "stderr": "", "exit_code": 0})]
    d = divergences(a, b).first
    assert d["trace"].site == "1:tool" and d["trace"].a == {"result": ["README"]}
    boom = [_E("1:tool", "tool", {"function": "f", "error": {"type": "ValueError", "message": "boom"}})]
    assert divergences(a[:1], boom).first["trace"].site == "1:tool"


def _program_run(store, decided: str, later: str, t: str = "2026-03-02T10:00:05") -> int:
    """A run in a recorded program's shape (engine/program/record.py): the setup, a model call, an
    @sdk.tool call, an sdk.now() read, a second call, the program's end."""
    run = store.begin_run(task="program:python3", meta={"source": "tttr record", "program": ["python3", "a.py"]})
    steps = [
        [("clock", "setup:clock", {"t": "2026-03-02T10:00:00"}),
         ("setup", "setup:setup", {"clock": "2026-03-02T10:00:00", "program": ["python3", "a.py"]})],
        [("prompt", "0:prompt", {"request": {"messages": [{"role": "user", "content": "go"}]}}),
         ("message", "0:message", {"text": "call decide"})],
        [("tool", "1:tool", {"function": "decide", "args": ["x"], "kwargs": {}, "result": decided})],
        [("clock", "2:clock", {"t": t, "source": "sdk"})],
        [("message", "3:message", {"text": later})],
        [("tool", "4:tool", {"program": ["python3", "a.py"], "cmd": "python3 a.py", "stdout": later, "exit_code": 0}),
         ("outcome", "4:outcome", {"exit_code": 0})],
    ]
    for k, events in enumerate(steps):
        for _kind, at, value in events:
            store.append(run, at, value)
        store.commit_step(run)
    store.finish_run(run, status="complete")
    return run


def test_diff_of_program_runs_aligns_every_step_and_names_a_tool_fork_at_its_site(tmp_path):
    """Two program runs: one row per step (call, SDK tool, clock read, end), the rows after
    a changed tool result pair up, the tool's row and its first divergence name both values;
    the compare screen shows the engine's rows."""
    from tttr.app.compare import build_comparison
    from tttr.engine.replay.diff import diff_runs
    from tttr.sessions.store import Store

    with Store.open(tmp_path / "s.db") as store:
        a = _program_run(store, "stop", "done")
        b = _program_run(store, "go on", "going on")
        same = _program_run(store, "stop", "done")
        later_clock = _program_run(store, "stop", "done", t="2026-03-02T11:00:00")
        d = diff_runs(store, a, b)
        assert [(r.a_step, r.b_step, r.same) for r in d.rows] == [
            (0, 0, True), (1, 1, False), (2, 2, True), (3, 3, False), (4, 4, False)]  # the end: same exit, other output
        assert d.rows[1].a_action == 'decide("x") → "stop"' and d.rows[1].b_action == 'decide("x") → "go on"'
        trace = d.first_divergence["trace"]
        assert trace.site == "1:tool" and (trace.a, trace.b) == ({"result": "stop"}, {"result": "go on"})
        assert diff_runs(store, a, same).identical
        assert d.rows[4].a_action == 'end: python3 a.py (exit 0) · stdout "done"' and '"going on"' in d.rows[4].b_action
        clock = diff_runs(store, a, later_clock)
        assert [r.same for r in clock.rows] == [True, True, False, True, True]
        assert clock.first_divergence["trace"].site == "2:clock"
        assert (clock.first_divergence["trace"].a, clock.first_divergence["trace"].b) == (
            "2026-03-02T10:00:05", "2026-03-02T11:00:00")
        compared = build_comparison(store, a, b)
        assert [r.same for r in compared.rows] == [True, True, False, True, False, False]  # the setup row first; the end: other output


def test_a_served_runs_calls_regenerate_under_its_own_local_kernel_mode():
    """Every local mode (kernels.mode.MODES, invariant-q8 included) is kept; an upstream's
    label is not a local mode, so its calls regenerate under `invariant`."""
    from types import SimpleNamespace

    from tttr.engine.replay.calls import local_kernel_mode
    from tttr.kernels.mode import MODES

    for mode in MODES:
        assert local_kernel_mode(SimpleNamespace(kernel_mode=mode)) == mode
    assert local_kernel_mode(SimpleNamespace(kernel_mode="upstream")) == "invariant"


def test_diff_of_an_agent_run_and_a_program_run_says_why_no_row_pairs(tmp_path, capsys):
    from tttr.app.cli import main
    from tttr.sessions.store import Store

    db = tmp_path / "s.db"
    with Store.open(db) as store:
        program = _program_run(store, "stop", "done")
        agent = store.begin_run(task="write-line", meta={})
        store.append(agent, "0:action", {"cmd": "ls"})
        store.commit_step(agent)
        store.finish_run(agent, status="complete")
    assert main(["diff", str(agent), str(program), "--db", str(db)]) == 0
    err = capsys.readouterr().err
    assert f"note: run {agent} is the built-in agent's run and run {program} a recorded program's run" in err, err
    assert main(["diff", str(program), str(program), "--db", str(db)]) == 0
    assert "note:" not in capsys.readouterr().err


def test_the_first_cause_is_the_earliest_divergence_in_consumption_order_not_the_first_layer():
    """A clock read changed at step 0 changes the logits and tokens of the next step: the clock
    is the first cause, named first, though the tensor layer comes first in the layers' order."""
    from tttr.engine.replay.diff import RunDiff

    a = [_E("0:clock", "clock", {"t": "09:00"}), _E("1:logits:0", "logits", {"digest": "aa"}),
         _E("1:token:0", "token", {"id": 1})]
    b = [_E("0:clock", "clock", {"t": "09:01"}), _E("1:logits:0", "logits", {"digest": "bb"}),
         _E("1:token:0", "token", {"id": 2})]
    first, counts = divergences(a, b)
    d = RunDiff(1, 2, [], first, counts)
    assert d.first_cause.site == "0:clock" and d.first_cause.layer == "trace"
    assert [x.layer for x in d.by_cause()] == ["trace", *[layer for layer in first if layer != "trace"]]
    assert d.to_json()["first_cause"]["site"] == "0:clock"
    assert RunDiff(1, 2).first_cause is None and RunDiff(1, 2).by_cause() == []


def test_the_first_differing_request_names_the_message_and_both_values():
    from tttr.engine.replay.diff import first_request_difference, prompt_change

    class P(_E):
        def __init__(self, step, request):
            super().__init__(f"{step}:prompt", "prompt", {"request": request})
            self.step = step

    said = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "it is 09:00"}],
            "max_tokens": 8}
    moved = {**said, "messages": [said["messages"][0], {"role": "user", "content": "it is 09:01"}]}
    assert first_request_difference(said, said) is None
    assert first_request_difference(said, {**said, "max_tokens": 9}) == ("parameter max_tokens", 8, 9)
    change = prompt_change([P(0, said), P(1, said)], [P(0, said), P(1, moved)])
    assert (change.step, change.what) == (1, "message 1")
    assert change.a["content"] == "it is 09:00" and change.b["content"] == "it is 09:01"
    assert prompt_change([P(0, said)], [P(0, said)]) is None
