"""TTTR's pytest plugin (entry point `pytest11`, installed with the package): a recorded program
replayed sealed against today's code as a test, the way Temporal's replay tests run a saved
history against new workflow code.

    pytest --tttr-db runs.db                       # replay the runs the marked tests name
    pytest --tttr-db runs.db --tttr-record         # record them anew first (needs the model)

A test marked `@pytest.mark.tttr(run=7, code=DIR, program=[...])` replays run 7 of the database
with the files of DIR laid over its recorded start tree (`tttr replay 7 --sealed --code DIR
[-- PROGRAM]`): nothing runs live, and when today's code asks for something the recording
cannot answer the test fails with the divergence report. `code` defaults to the test file's
folder, `program` to the recorded command line. The `tttr_replay` fixture gives the test the
replay (`.result`: engine/program/replay.py's ReplayResult) and `.replay(code=..., program=...)`
for more (it fails the test the same way). A marked test that does not ask for the fixture gets
its replay before its body runs.

What cannot be replayed at all (no --tttr-db, a run the database lacks or that is no recorded
program, a --code folder that is missing or holds the program under another name, a sealed
replay of a run recorded without the SDK) is the test's error, not its failure: it is found
while the test is set up.

With --tttr-record a marked test records its program anew (the recorded start tree with DIR
laid over it, the recorded run's clock, seed, timeout and --check) and replays against that
recording; the new run's id is in the
test's report (`tttr: run 7 re-recorded as run N`): put it in the marker to keep it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

MARK = "tttr"


class TTTRReplayError(Exception):
    """A replay that cannot be made (bad input): raised while the test is set up, its error."""


def pytest_addoption(parser) -> None:
    group = parser.getgroup("tttr", "TTTR: replay recorded agent programs against today's code")
    group.addoption("--tttr-db", metavar="DB", default=None,
                    help="session database whose runs the tests marked @pytest.mark.tttr(run=N) replay")
    group.addoption("--tttr-record", action="store_true", default=False,
                    help="record the marked tests' programs anew (needs the model), then replay against that")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "tttr(run, code=None, program=None): replay recorded program run RUN of "
                                       "--tttr-db sealed against the files of CODE (default: the test's folder)")


def pytest_collection_modifyitems(items) -> None:
    for item in items:  # a marked test gets its replay whether or not it asks for the fixture
        if item.get_closest_marker(MARK) is not None and "tttr_replay" not in item.fixturenames:
            item.fixturenames.append("tttr_replay")


class TTTRReplay:
    """A marked test's replay: checked while the test is set up, run when it is called."""

    def __init__(self, db: str, run: int, code: Path, program: list[str] | None, record: bool, node):
        self.db, self.run, self.code, self.program, self.record, self.node = db, run, code, program, record, node
        self.result = None  # the last replay's ReplayResult
        self.recorded: int | None = None  # with --tttr-record: the new recording's run id

    def check(self, code: Path | None = None, program: list[str] | None = None) -> None:
        """What makes a replay impossible, read-only: TTTRError with one line."""
        from tttr.engine.program.replay import _load, check_code, check_sealable
        from tttr.sessions.errors import StoreError
        from tttr.sessions.store import Store

        if not Path(self.db).is_file():
            raise StoreError(f"--tttr-db {self.db}: no such database; record the runs first "
                             "(tttr record --db DB -- PROGRAM)")
        with Store.open(self.db, create=False, readonly=True) as reader:
            if self.run not in {r.id for r in reader.runs()}:
                raise StoreError(f"run {self.run} is not in {self.db}: `tttr runs {self.db}` lists its runs")
            rec = _load(reader, self.run)
            check_sealable(rec)
            recorded = [str(a) for a in rec.setup["program"]]
            check_code(str(code or self.code), list(program or self.program or recorded), recorded)

    def replay(self, code: Path | str | None = None, program: list[str] | None = None):
        """Replay the run sealed against `code` (default: the marker's); fail the test with
        the divergence report when the program asks for something the recording lacks."""
        from tttr.engine.program.replay import replay_program

        code, program = Path(code or self.code), list(program or self.program or []) or None
        self.check(code, program)  # a replay asked for in the body: its bad input too is the test's error
        run = self._recorded_anew(code, program) if self.record else self.run
        self.result = replay_program(self.db, run, code=str(code), argv=program, sealed=True)
        if self.result.divergence is not None:
            pytest.fail(report(self.result, run, code), pytrace=False)
        return self.result

    def _recorded_anew(self, code: Path, program: list[str] | None) -> int:
        from tttr.engine.program.record import record_program
        from tttr.engine.program.replay import _load, recorded_clock, recorded_timeout
        from tttr.engine.program.fork import recorded_check
        from tttr.engine.program.replay import lay_code
        from tttr.recorders.scratch import scratch_dir
        from tttr.recorders.snapshot import restore
        from tttr.recorders.treeio import remove_tree
        from tttr.sessions.store import Store

        if self.recorded is None:
            work = scratch_dir("tttr-pytest-record-")
            try:
                with Store.open(self.db, create=False, readonly=True) as reader:
                    rec = _load(reader, self.run)
                    argv = program or [str(a) for a in rec.setup["program"]]
                    check = recorded_check(reader, rec.run)
                    clock, timeout = recorded_clock(rec), recorded_timeout(rec.run)
                    restore(rec.setup["snapshot"], reader, work / "tree")  # the recorded start, today's code on it
                lay_code(str(code), work / "tree")
                res = record_program(self.db, argv, tree=str(work / "tree"), clock=clock, seed=rec.run.seed or 0,
                                     check=check, timeout_s=timeout)  # the default model (or TTTR_MODEL)
            finally:
                remove_tree(work)
            self.recorded = res.run_id
            self.node.user_properties.append(("tttr_recorded", res.run_id))
            self.node.add_report_section("call", "tttr", f"tttr: run {self.run} re-recorded as run {res.run_id}")
        return self.recorded


def report(result, run: int, code: Path) -> str:
    """The failure's text: which run, where the program now asks otherwise, both values."""
    d = result.divergence
    lines = [f"tttr: today's code in {code} does not replay run {run}: {d.describe()}"]
    at = result.detail or {}
    if at.get("field") and at.get("field") != "step":
        lines.append(f"  at {at.get('at') or 'step ' + str(at.get('step'))}, {at['field']}:")
        lines.append(f"    recorded:  {_shown(at.get('recorded'))}")
        lines.append(f"    requested: {_shown(at.get('requested'))}")
    lines.append(f"  (replay run {result.run_id}; `tttr diff {run} {result.run_id}` compares them)")
    return "\n".join(lines)


def _shown(value) -> str:
    from tttr.sessions.safe_text import brief

    return brief(value, 200)


@pytest.fixture
def tttr_replay(request):
    """The marked test's replay (see the module's text); its bad input is the test's error."""
    from tttr.sessions.errors import TTTRError

    marker = request.node.get_closest_marker(MARK)
    db = request.config.getoption("--tttr-db")
    if marker is None:
        raise TTTRReplayError("the tttr_replay fixture needs @pytest.mark.tttr(run=N) on the test")
    if db is None:
        raise TTTRReplayError(f"{request.node.nodeid} replays a recorded run: give the database with --tttr-db DB")
    kwargs = dict(marker.kwargs)
    run = kwargs.pop("run", marker.args[0] if marker.args else None)
    if type(run) is not int:
        raise TTTRReplayError(f"@pytest.mark.tttr needs run=N (a run id), not {run!r}")
    code = Path(kwargs.pop("code", None) or Path(str(request.node.fspath)).parent)
    program = kwargs.pop("program", None)
    if kwargs:
        raise TTTRReplayError(f"@pytest.mark.tttr takes run, code and program, not {', '.join(kwargs)}")
    replay = TTTRReplay(db, run, code, [str(a) for a in program] if program else None,
                        request.config.getoption("--tttr-record"), request.node)
    try:
        replay.check()
    except TTTRError as exc:
        raise TTTRReplayError(f"tttr: {exc}") from None
    return replay


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A marked test whose body does not replay gets its replay first (a failure, not an error)."""
    replay = getattr(item, "funcargs", {}).get("tttr_replay")
    if isinstance(replay, TTTRReplay) and replay.result is None and not _body_replays(item):
        replay.replay()
    yield


def _body_replays(item) -> bool:
    """Whether the test's own code calls `tttr_replay.replay(...)` (then the body chooses the code)."""
    import inspect

    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError, AttributeError):
        return False
    return "tttr_replay.replay(" in source
