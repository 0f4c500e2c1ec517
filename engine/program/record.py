"""`tttr record -- PROGRAM ARG...`: a user's program recorded as one run.

An in-process `tttr serve` (the engine behind OpenAI's API, recording into the same
database) answers the program's model calls; the program runs in the trace layer's sandbox
(recorders/program.py: the host's Python read-only, the network reaching only the server's
Unix socket through a forwarder, the virtual clock and seeded randomness of --clock/--seed).

The run (task `program:NAME`, meta {"program", "clock", "timeout_s"} and the --check; no host path:
a replay takes the program from the start snapshot) holds, in order:
`setup:clock` (the virtual clock it starts at, as the built-in agent's runs have it) and
`setup:setup` (the clock, the start tree's snapshot, the command line), the model calls as the
server records them (steps 0..N-1, with whatever the program's SDK records among them), then at
the next step N `N:tool` (the program's command line,
stdout, stderr, exit code, the end tree's snapshot) and `N:outcome` (exit code, and with
--check the checker's verdict on the end tree). HTTP lives here (app/), the sandbox side in
recorders/program.py."""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime
from pathlib import Path

from tttr.engine.replay.events import stored_text
from tttr.engine.replay.result import ProgramResult
from tttr.engine.serve.requests import ROUTES
from tttr.recorders.logicalclock import ClockShare
from tttr.recorders.scratch import scratch_dir
from tttr.recorders.snapshot import overlay
from tttr.recorders.treeio import remove_tree
from tttr.recorders.treeown import hand_over
from tttr.recorders.program import (
    PORT, SOCKET_NAME, HostPython, api_dir, check_program, check_tree, endpoint_env, sandboxed_command,
)
from tttr.sessions.errors import TTTRError
from tttr.sessions.timings import seconds_ms
from tttr.sessions.vocabulary import SETUP_STEP, site

CHECK_TIMEOUT_S = 60.0
# How long the server keeps an idle connection: the SDK keeps one open for all of a program's
# posts (recorders/sdk.py), and a program may think or wait on the model for a while between two.
KEEP_ALIVE_S = 300
READY_TIMEOUT_S = 600.0


class ProgramRunError(TTTRError):
    pass


class Stopwatch:
    """Wall and CPU seconds summed over start/stop laps. CPU counts every thread of this
    process (the server, the engine, the recorder's writer) and the children it has waited
    for (the sandboxed program), so that on a busy machine it shows the work beside the wait."""

    def __init__(self):
        self.wall = self.cpu = 0.0
        self._at: tuple[float, float] | None = None

    @staticmethod
    def _cpu() -> float:
        import resource

        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime

    def start(self) -> None:
        self._at = (time.perf_counter(), self._cpu())

    def stop(self) -> None:
        wall, cpu = self._at
        self.wall += time.perf_counter() - wall
        self.cpu += self._cpu() - cpu




class RefusedCalls:
    """ASGI `app`, counting the model calls it answers with an error status: the server
    records only the calls it runs, and a program whose every call was refused (a parameter
    the server does not take) did not "make no model call"."""

    def __init__(self, app):
        self.app, self.count = app, 0

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") not in ROUTES.values():
            return await self.app(scope, receive, send)

        async def sending(message):
            if message.get("type") == "http.response.start" and message.get("status", 200) >= 400:
                self.count += 1
            await send(message)

        await self.app(scope, receive, sending)


def own_torch_threads() -> None:
    """Start torch's CPU thread pool from this thread, before a model loads in another one.
    A pool first started by a thread that then exits (a background loader) leaves every later
    generation several times slower: measured on 2 cores, a 12-token call took 7-25 s instead
    of 1-2 s. The caller's thread outlives the load, so the pool stays sound."""
    import torch

    torch.ones(512, 512) @ torch.ones(512, 512)


def running_clock(start: datetime):
    """SDK clock reads (`sdk.now()`): the virtual clock, running from `start` in whole
    seconds from now, as the sandbox's faketime clock runs from it in each process."""
    from tttr.engine.serve.sdk_events import ProgramClock

    return ProgramClock(start).begin()


class _Endpoint:
    """uvicorn serving the app in a thread: on a Unix socket (sandboxed), or on a free
    loopback port of the host (unsafe mode)."""

    def __init__(self, app, sock: str | None):
        import socket

        import uvicorn

        if sock is not None:
            config = uvicorn.Config(app, uds=sock, log_level="warning", lifespan="off",
                                    timeout_keep_alive=KEEP_ALIVE_S, log_config=None, ws="none")
            self.base = f"http://127.0.0.1:{PORT}"
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                    timeout_keep_alive=KEEP_ALIVE_S, log_config=None, ws="none")
            self.base = f"http://127.0.0.1:{port}"
        # log_config=None: no logging.config.dictConfig per endpoint (a bisect starts several at
        # once, and concurrent dictConfig calls raced: uvicorn's INFO lines reached stderr)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="tttr-record-serve", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise ProgramRunError("the model endpoint did not start; see the lines above")
            time.sleep(0.002)  # it starts in a few ms; a replay waits for it
        if sock is not None:
            os.chmod(sock, 0o666)  # the sandbox's unprivileged uid connects to it

    def begin_stop(self) -> None:
        """Ask the server to stop (it notices within its 0.1 s tick) without waiting: called
        when the program has ended, so that the end tree's snapshot and the check overlap it."""
        self.server.should_exit = True

    def stop(self) -> None:
        self.begin_stop()
        self.thread.join(timeout=10)


def record_program(db: str, argv: list[str], *, tree: str | None = None, clock: datetime, seed: int,
                   model: str | None = None, check: str | None = None, timeout_s: float = 600.0,
                   unsafe_no_sandbox: bool = False, progress=None, in_place: bool = False,
                   env: dict | None = None, meta: dict | None = None,
                   call_seeds: list[int] | None = None) -> ProgramResult:
    """Record `argv` run in the sandbox as one run of `db`. Everything a user can get wrong
    (the program, the tree, the model path, the sandbox) is refused before `db` is touched.
    The program runs in a copy of `tree` (the end tree is in the database), so recording twice
    starts from the same files; `in_place` runs it in `tree` itself. `call_seeds`: the seeds of
    the model calls that send none, in order (then drawn), as a recording's calls had them."""
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.engine.serve.service import Service
    from tttr.recorders.limits import Limits
    from tttr.recorders.sandbox import Executor

    say = progress or (lambda text: None)
    host = HostPython.current()
    own_tree = tree is None or not in_place
    if tree is not None and not Path(tree).is_dir():
        raise ProgramRunError(f"--tree {tree!r} is not a directory: create it or pass an existing one")
    tree_dir = scratch_dir("tttr-program-tree-") if own_tree else Path(tree).resolve()
    work = scratch_dir("tttr-program-")
    try:
        check_tree(Path(tree) if tree is not None else tree_dir)
        if tree is not None and own_tree:  # a copy: links copied as links, nothing followed
            overlay(tree, tree_dir)
        if check is not None and not check.strip():  # an empty shell line exits 0: every end tree would pass
            raise ProgramRunError("--check is empty: give a shell command that exits 0 when the end tree is right, "
                                  "e.g. --check 'grep -q picnic plan.txt'")
        program = check_program(argv, tree_dir, host)
        limits = Limits(timeout_s=timeout_s, tree_mb=1024)
        service = Service(model, kernel_mode="invariant", any_model=True)  # a wrong model path is refused here
        service.pinned_seeds = list(call_seeds or ())
        sock_dir = api_dir(work / "api", host)
        share = ClockShare(work / "clock")
        executor = Executor(tree_dir, seed=seed, unsafe_no_sandbox=unsafe_no_sandbox, limits=limits,
                            binds=(*host.binds(sock_dir), share.bind()), logical_clock=True)
        name = f"program:{Path(argv[0]).name}"
        recorder = CallRecorder(db, service, default_run=name)
        recorder.program_clock = share.event  # each model call records the clock the program read before it
        owner = tree_dir.stat()
        try:
            return _record(recorder, service, executor, host, program, argv, name, tree_dir, clock, seed, check,
                           sock_dir, say, timeout_s, share, env or {}, meta or {})  # a suite's (issue 30)
        finally:
            executor.close()
            share.close()
            if not own_tree and executor.sandboxed:  # the sandbox's uid owned it while the program ran
                hand_over(str(tree_dir), owner.st_uid, owner.st_gid)
    finally:
        remove_tree(work)
        if own_tree:
            remove_tree(tree_dir)


def _record(recorder, service, executor, host, program, argv, name, tree_dir, clock, seed, check, sock_dir,
            say, timeout_s, share, extra_env=None, extra_meta=None) -> ProgramResult:
    from tttr.engine.serve.modes import Live
    from tttr.engine.serve.sdk_events import ProgramClock
    from tttr.engine.serve.sdk_tree import SDKTree, program_file
    from tttr.engine.serve.server import create_app
    from tttr.recorders.clock import iso
    from tttr.recorders.shell import ShellState
    from tttr.recorders.snapshot import snapshot, tree_digest

    store = recorder.store
    sdk_clock = ProgramClock(clock)  # runs from the program's start
    app = create_app(Live(service), recorder, clock=sdk_clock,
                     tree=SDKTree(tree_dir, store, program=program_file(argv)))  # SDK tool events carry the tree's digests
    server = app.state.server
    endpoint = None
    run_id = None
    try:
        run_id = store.begin_run(
            task=name, model_id=service.model_id, kernel_mode=service.kernel_mode, seed=seed,
            meta={"source": "tttr record", "program": list(argv), "clock": iso(clock),
                  "sandboxed": executor.sandboxed, "timeout_s": timeout_s,  # a replay waits as long
                  **({"check": check} if check is not None else {}), **(extra_meta or {})},
        )
        recorder.adopt(name, run_id)
        watch = Stopwatch()  # the recording's own time, without the model's load (extra)
        watch.start()
        start, start_digest = snapshot(tree_dir, store), tree_digest(tree_dir)
        # As the built-in agent's: the clock the run starts at (a fork site), then the setup.
        store.append(run_id, site(SETUP_STEP, "clock"), {"t": iso(clock)})
        store.append(run_id, site(SETUP_STEP, "setup"),
                     {"task": name, "clock": iso(clock), "tree": start_digest, "snapshot": start,
                      "program": list(argv)})
        store.commit_step(run_id)
        watch.stop()  # before the model loads, whose CPU would count in the lap otherwise
        own_torch_threads()
        server.startup()  # loads the model in the background
        say("loading the model …")
        if not service.wait_ready(READY_TIMEOUT_S) or service.load_error:
            raise ProgramRunError(f"the model did not load: {service.load_error or 'timed out'}")
        sandboxed = executor.sandboxed
        refused = RefusedCalls(app)
        endpoint = _Endpoint(refused, str(sock_dir / SOCKET_NAME) if sandboxed else None)
        env = {**(host.env() if sandboxed else {"PATH": host.path, **share.env()}), **endpoint_env(endpoint.base, name),
               **(extra_env or {})}
        command = sandboxed_command(program, host) if sandboxed else program
        sdk_clock.begin()
        say(f"running {program} …")
        watch.start()
        recorder.start_clock(name)  # the first step's wait counts from the program's start
        res = executor.run(command, clock=clock, step=0, state=ShellState(exports=env))
        program_ended = time.perf_counter()
        endpoint.begin_stop()  # the program and what it started are gone: nothing asks any more
        recorder.flush()
        calls = len(store.events(run_id, kind="prompt"))
        last = store.steps(run_id)  # after the model calls and whatever else the program's SDK recorded
        end = snapshot(tree_dir, store)
        end_digest = tree_digest(tree_dir)
        stderr = res.stderr
        store.append(run_id, site(last, "tool"), {
            "cmd": program, "cwd": res.cwd, "exports": dict(env), "env": res.env,
            "stdout": stored_text(store, res.stdout), "stderr": stored_text(store, stderr),
            "exit_code": res.exit_code, "duration_ms": round(res.duration_ms, 3),
            "stdout_size": res.stdout_size, "stderr_size": res.stderr_size, "truncated": res.truncated,
            "limit_hit": res.limit_hit, "tree_before": start_digest, "tree_after": end_digest,
            "snapshot": end, "cwd_after": res.state_after.cwd, "exports_after": dict(res.state_after.exports),
            "program": list(argv),
        })
        watch.stop()
        outcome = {"exit_code": res.exit_code, "calls": calls, "tree": end_digest, "clock": iso(clock)}
        if res.limit_hit:
            outcome["reason"] = f"the program hit a limit: {res.limit_hit}"
        if refused.count:
            outcome["refused_calls"] = refused.count
        if check is not None:  # the verdict: the result's `passed`
            say(f"checking with {check} …")
            checker = executor.run(check, clock=clock, step=1)
            outcome |= {"passed": checker.exit_code == 0, "checker_exit": checker.exit_code,
                        "checker_output": (checker.stdout + checker.stderr)[-2000:]}
        store.append(run_id, site(last, "outcome"), outcome)
        store.finish_run(run_id, status="complete", outcome=outcome)
        last_ended = recorder.last_ended(name)
        if last_ended is not None:  # the last step: the program's own time after its last call or tool
            store.time_step(run_id, last, wait_ms=seconds_ms(program_ended - last_ended))
        run_id_done, run_id = run_id, None
        return ProgramResult(run_id_done, "complete", outcome, exit_code=res.exit_code, calls=calls, stdout=res.stdout,
                             stderr=stderr, limit_hit=res.limit_hit, refused=refused.count,
                             extra={"program_s": watch.wall, "program_cpu_s": watch.cpu})
    finally:
        if endpoint is not None:
            endpoint.stop()
        if run_id is not None:  # interrupted or failed: the recording says so
            try:
                store.finish_run(run_id, status="incomplete", outcome={"reason": "recording stopped early"})
            except Exception:  # noqa: BLE001 - the store is closed next either way
                pass
        server.shutdown()


