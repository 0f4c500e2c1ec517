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

An agent *function* called in the test's body (no program, no sandbox: it runs in this
process) replays a run of model calls instead: `@pytest.mark.tttr(name="greeting")` (the newest
complete run of that name; or `run=N` naming a run `tttr serve` recorded) starts an in-process
server on a loopback port answering that run's calls sealed (engine/program/in_process.py), and
sets OPENAI_BASE_URL, ANTHROPIC_BASE_URL, their keys and the SDK's variables for the test's
body (`tttr_replay.base_url`, `.url`, `.api_key` give them too). The first request that no
recorded call answers fails the test with the divergence report, whatever the body made of the
error its client got; a test that asks fewer calls than were recorded fails too. With
--tttr-record the body runs against the model here (or --tttr-upstream URL) and its calls are
recorded as a run of that name, which the next replay finds.
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
                    help="record the marked tests' programs anew (needs the model), then replay against that; "
                         "an agent function's calls are recorded as the run the marker names")
    group.addoption("--tttr-upstream", metavar="URL", default=None,
                    help="with --tttr-record: an agent function's calls go to this server (OpenAI's or Anthropic's "
                         "API), recorded at the token layer, instead of the model here")
    group.addoption("--tttr-upstream-key-env", metavar="NAME", default=None,
                    help="the environment variable holding --tttr-upstream's API key")


def pytest_configure(config) -> None:
    import os

    if config.getoption("--tttr-db", None):  # a test that changes directory still finds it
        config.option.tttr_db = os.path.abspath(config.option.tttr_db)
    config.addinivalue_line("markers", "tttr(run=None, name=None, code=None, program=None): replay recorded program "
                                       "run RUN of --tttr-db sealed against the files of CODE (default: the test's "
                                       "folder), or answer the test body's model calls from run RUN (or the run NAME)")


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
        from tttr.engine.program.replay import check_code, check_sealable, load_recording
        from tttr.sessions.errors import StoreError
        from tttr.sessions.store import Store

        if not Path(self.db).is_file():
            raise StoreError(f"--tttr-db {self.db}: no such database; record the runs first "
                             "(tttr record --db DB -- PROGRAM)")
        with Store.open(self.db, create=False, readonly=True) as reader:
            if self.run not in {r.id for r in reader.runs()}:
                raise StoreError(f"run {self.run} is not in {self.db}: `tttr runs {self.db}` lists its runs")
            rec = load_recording(reader, self.run)
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
        from tttr.engine.program.replay import load_recording, recorded_clock, recorded_timeout
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
                    rec = load_recording(reader, self.run)
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
    lines = divergence_lines(f"today's code in {code} does not replay run {run}", result.divergence, result.detail)
    lines.append(f"  (replay run {result.run_id}; `tttr diff {run} {result.run_id}` compares them)")
    return "\n".join(lines)


def divergence_lines(what: str, divergence, detail: dict | None) -> list[str]:
    """`tttr: WHAT: the divergence`, then where (site and field path) with both values."""
    lines = [f"tttr: {what}: {divergence.describe()}"]
    at = detail or {}
    if at.get("field") and at.get("field") != "step":
        lines.append(f"  at {at.get('at') or 'step ' + str(at.get('step'))}, {at['field']}:")
        lines.append(f"    recorded:  {_shown(at.get('recorded'))}")
        lines.append(f"    requested: {_shown(at.get('requested'))}")
    return lines


def _shown(value) -> str:
    from tttr.sessions.safe_text import brief

    return brief(value, 200)


class TTTRCalls:
    """A marked test whose body calls an agent function in this process: the in-process server
    its client talks to (`base_url` for OpenAI's clients, `url` for Anthropic's, `api_key`,
    `env`: what is set for the body), answering run `run` sealed (`cassette`), or recording
    the run named `name` (`recorded`: its id once the body has run)."""

    api_key = "tttr"

    def __init__(self, served, *, run=None, cassette=None, name: str | None = None, recording=None):
        self.served, self.run, self.cassette, self.name, self._recording = served, run, cassette, name, recording
        self.recorded: int | None = None
        self._sealed = None  # the SealedCalls to close

    @property
    def base_url(self) -> str:
        return self.served.base_url

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def env(self) -> dict[str, str]:
        return self.served.env()

    def divergence_report(self) -> str | None:
        """The failure's text when the body asked otherwise than the run recorded (or asked less)."""
        c = self.cassette
        if c is None or c.divergence is None:
            return None
        from tttr.sessions.safe_text import visible

        named = f" ({visible(self.run.task[:80], newlines=False)})" if isinstance(self.run.task, str) else ""  # the database's
        lines = divergence_lines(f"the test's calls do not replay run {self.run.id}{named}", c.divergence, c.detail)
        lines.append(f"  (sealed: {c.answered} of the run's {len(c.steps)} steps answered from it, nothing ran "
                     "live; `pytest --tttr-record` records the run anew)")
        return "\n".join(lines)

    def finish_recording(self, node) -> None:
        if self._recording is None:
            return
        recording, self._recording = self._recording, None
        self.recorded = recording.close()
        said = (f"tttr: the test's calls recorded as run {self.recorded} (name {self.name!r})"
                if self.recorded is not None else "tttr: the test made no model call: nothing was recorded")
        node.user_properties.append(("tttr_recorded", self.recorded))
        node.add_report_section("call", "tttr", said)

    def close(self) -> None:
        if self._recording is not None:
            self._recording.close()
            self._recording = None
        if self._sealed is not None:
            self._sealed.close()
            self._sealed = None


def _marker_args(request, marker) -> dict:
    kwargs = dict(marker.kwargs)
    run = kwargs.pop("run", marker.args[0] if marker.args else None)
    name = kwargs.pop("name", None)
    code, program = kwargs.pop("code", None), kwargs.pop("program", None)
    if kwargs:
        raise TTTRReplayError(f"@pytest.mark.tttr takes run, name, code and program, not {', '.join(kwargs)}")
    if run is None and name is None:
        raise TTTRReplayError("@pytest.mark.tttr needs run=N (a run id) or name=NAME (a recorded run's name)")
    if run is not None and type(run) is not int:
        raise TTTRReplayError(f"@pytest.mark.tttr needs run=N (a run id), not {run!r}")
    if name is not None and (not isinstance(name, str) or not name.strip() or not name.isprintable()):
        raise TTTRReplayError(f"@pytest.mark.tttr's name is a run's name (printable text), not {name!r}")
    if name is not None and (code is not None or program is not None):
        raise TTTRReplayError("@pytest.mark.tttr(name=...) replays an agent function's model calls; code and "
                              "program are for a recorded program's run=N")
    return {"run": run, "name": name, "code": code, "program": program}


def _is_program(db: str, run: int) -> bool:
    """Whether run `run` of `db` is a recorded program (else a run of model calls, or not there)."""
    from tttr.engine.program.replay import is_program_run
    from tttr.sessions.store import Store

    if not Path(db).is_file():
        return True  # the program path says the database is missing
    with Store.open(db, create=False, readonly=True) as reader:
        found = next((r for r in reader.runs() if r.id == run), None)
    return found is None or is_program_run(found)


@pytest.fixture(scope="session")
def _tttr_engine():
    """The model a session's --tttr-record loads once for every agent function it records."""
    held: dict = {}
    yield held
    if "service" in held:
        held["service"].close()


def _upstream(config):
    import os

    from tttr.engine.serve.errors import APIError
    from tttr.engine.serve.proxy import Upstream
    from tttr.engine.serve.proxy_anthropic import AnthropicUpstream, upstream_format

    url, key_env = config.getoption("--tttr-upstream"), config.getoption("--tttr-upstream-key-env")
    key = None
    if key_env:
        key = os.environ.get(key_env)
        if not key:
            raise TTTRReplayError(f"--tttr-upstream-key-env {key_env}: that environment variable is not set (or empty)")
    kind = AnthropicUpstream if upstream_format(url, None) == "anthropic" else Upstream
    try:
        return kind(url, key=key)
    except APIError as exc:
        raise TTTRReplayError(f"--tttr-upstream: {exc}") from None


def _calls(request, db: str, args: dict) -> TTTRCalls:
    """The in-process server of a marked test whose body calls an agent function."""
    from tttr.engine.program import in_process

    config = request.config
    if config.getoption("--tttr-record"):
        name = args["name"]
        if name is None:  # re-recording run=N: under its own name where it has one
            from tttr.sessions.store import Store

            with Store.open(db, create=False, readonly=True) as reader:
                task = in_process.find_run(reader, run=args["run"]).task
            name = task if task and not task.startswith("api:") else f"pytest:{request.node.name}"
        upstream = _upstream(config) if config.getoption("--tttr-upstream") else None
        service = None
        if upstream is None:
            held = request.getfixturevalue("_tttr_engine")
            if "service" not in held:
                held["service"] = in_process.load_model()
            service = held["service"]
        recording = in_process.record_calls(db, name, service=service, upstream=upstream)
        return TTTRCalls(recording.served, name=name, recording=recording)
    sealed = in_process.seal_calls(db, args["run"], args["name"])
    calls = TTTRCalls(sealed.served, run=sealed.run, cassette=sealed.cassette, name=args["name"])
    calls._sealed = sealed
    return calls


@pytest.fixture
def tttr_replay(request):
    """The marked test's replay (see the module's text); its bad input is the test's error."""
    import os

    from tttr.sessions.errors import TTTRError

    marker = request.node.get_closest_marker(MARK)
    db = request.config.getoption("--tttr-db")
    if marker is None:
        raise TTTRReplayError("the tttr_replay fixture needs @pytest.mark.tttr(run=N) or (name=NAME) on the test")
    if db is None:
        raise TTTRReplayError(f"{request.node.nodeid} replays a recorded run: give the database with --tttr-db DB")
    args = _marker_args(request, marker)
    if args["name"] is None and _is_program(db, args["run"]):
        code = Path(args["code"] or Path(str(request.node.fspath)).parent)
        program = args["program"]
        replay = TTTRReplay(db, args["run"], code, [str(a) for a in program] if program else None,
                            request.config.getoption("--tttr-record"), request.node)
        try:
            replay.check()
        except TTTRError as exc:
            raise TTTRReplayError(f"tttr: {exc}") from None
        yield replay
        return
    try:
        calls = _calls(request, db, args)
    except TTTRError as exc:
        raise TTTRReplayError(f"tttr: {exc}") from None
    saved = {k: os.environ.get(k) for k in calls.env}
    os.environ.update(calls.env)  # the body's clients (OpenAI(), Anthropic()) and the SDK find the server
    try:
        yield calls
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        calls.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A marked test whose body does not replay gets its replay first (a failure, not an error);
    an agent function's test fails with the divergence when its calls asked otherwise."""
    replay = getattr(item, "funcargs", {}).get("tttr_replay")
    if isinstance(replay, TTTRReplay) and replay.result is None and not _body_replays(item):
        replay.replay()
    if not isinstance(replay, TTTRCalls):
        return (yield)
    raised = None
    try:
        result = yield
    except BaseException as exc:
        replay.finish_recording(item)
        if replay.divergence_report() is None or isinstance(exc, KeyboardInterrupt):
            raise
        raised = exc  # the divergence's consequence (its client got a sealed_replay_miss): the cause is reported
    if raised is not None:
        pytest.fail(f"{replay.divergence_report()}\n  (the test then raised {type(raised).__name__}: "
                    f"{_shown(str(raised))})", pytrace=False)
    replay.finish_recording(item)
    if replay.cassette is not None:
        replay.cassette.finish()
    failure = replay.divergence_report()
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    return result


def _body_replays(item) -> bool:
    """Whether the test's own code calls `tttr_replay.replay(...)` (then the body chooses the code)."""
    import inspect

    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError, AttributeError):
        return False
    return "tttr_replay.replay(" in source
