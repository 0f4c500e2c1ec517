"""`tttr bench agent`: recording, replaying and forking a user's agent program, side by side.

The program is example (1), assets/examples/openai_agent.py (the official `openai` client
and the SDK), solving the task suite's `write-line` task from a fresh tree each time. Each
round, in this process:

- `record`: `tttr record --check 'sh check.sh' -- python3 openai_agent.py`, end to end as a
  user runs it (the model loads, the program runs in the sandbox, the check runs);
- `unrecorded`: the same program in the same sandbox against `tttr serve`'s app without a
  database (its model loaded once, before the rounds, its prefix cache emptied before each
  run, as cold as the recording's new server; the program's SDK calls do their own work, as
  outside TTTR), timed from the program's start to its end; before the recording
  in even rounds, after it in odd ones;
- `faithful replay` of the first round's recording (`tttr replay RUN`);
- `fork` of it at its last model call (`tttr fork RUN --at STEP:token:0 --set` the recorded
  runner-up token): everything before is answered from the recording, that call is generated.

- `start`: the program's own start in the same sandbox, `python3 -c 'import openai_agent'`
  (the interpreter and the example's imports, `openai` among them; no model or tool calls).
- `sealed replay` of the first round's recording (`tttr replay RUN --sealed`): nothing live.

`sealed_replay_s` (best round) against `program_start_s` (the best `start`) and the recording's
SDK tool time (`recorded_tool_s`, the sum of its tool events' durations): a sealed replay should
cost little beyond starting the program, target `sealed_replay_s <= 1.15 x program_start_s +
recorded_tool_s` (`sealed_target_s`).

`replay_speedup` = record ÷ faithful replay and `fork_speedup` = record ÷ fork (the full re-run
a fork saves), best round of each side. A replay re-runs the program, so neither can exceed
record ÷ start (`speedup_ceiling`, printed beside them). `record_overhead` compares the program's run inside
`tttr record` (its start and end snapshots and its events included, the model's load not)
with the unrecorded run: best and median rounds of wall time, and the median of CPU time
(this process's threads and the program's), steadier than wall time on a shared machine. `sdk_import_ms` is
the time `from tttr.recorders import sdk` takes inside a fresh interpreter, the median of several.
"""

from __future__ import annotations

import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

from tttr.engine.program.record import ProgramRunError, Stopwatch, _Endpoint
from tttr.recorders.treeio import remove_tree

EXAMPLE = Path(__file__).resolve().parents[2] / "assets" / "examples" / "openai_agent.py"
TASK = "write-line"
ARGV = ["python3", EXAMPLE.name]
START_ARGV = ["python3", "-c", f"import {EXAMPLE.stem}"]  # its imports, not its main()
CHECK = "sh check.sh"
SEED = 1
TIMEOUT_S = 600.0
IMPORT_SAMPLES = 9
TARGETS = {"replay_speedup": 50.0, "fork_speedup": 3.0, "record_overhead": 0.05, "sealed_over_start": 1.15}


@dataclass(frozen=True, slots=True)
class Figures:
    """What one bench run measured: seconds per round, and the SDK's import time."""

    record_s: tuple[float, ...]  # `tttr record`, end to end
    recorded_program_s: tuple[float, ...]  # the program's run inside it, recording included, no model load
    unrecorded_program_s: tuple[float, ...]  # the same program against a server that does not record
    recorded_program_cpu_s: tuple[float, ...]  # CPU seconds of the two above: this process and the program
    unrecorded_program_cpu_s: tuple[float, ...]
    replay_s: tuple[float, ...]
    fork_s: tuple[float, ...]
    start_s: tuple[float, ...]  # the program's start alone: interpreter and imports, in the sandbox
    identical: tuple[bool, ...]  # each faithful replay: identical, 0 logits computed, 0 tools run
    sdk_import_ms: float
    fork_site: str
    sealed_replay_s: tuple[float, ...] = ()  # `tttr replay RUN --sealed` of the first recording
    recorded_tool_s: float = 0.0  # the first recording's SDK tool events, their durations summed

    def __post_init__(self):
        for name in ("record_s", "recorded_program_s", "unrecorded_program_s", "recorded_program_cpu_s",
                     "unrecorded_program_cpu_s", "replay_s", "fork_s", "start_s"):
            times = getattr(self, name)
            if not times or any(not t > 0 for t in times):
                raise ValueError(f"Figures.{name} needs one positive time per round, got {times!r}")
        if any(not t > 0 for t in self.sealed_replay_s) or not self.recorded_tool_s >= 0:
            raise ValueError(f"Figures.sealed_replay_s needs positive times, got {self.sealed_replay_s!r}")

    def to_json(self) -> dict:
        best = {name: min(getattr(self, name)) for name in
                ("record_s", "recorded_program_s", "unrecorded_program_s", "replay_s", "fork_s", "start_s")}
        median = statistics.median
        return {
            "example": f"assets/examples/{EXAMPLE.name}", "task": TASK, "rounds": len(self.record_s),
            "faithful_identical": all(self.identical),
            "replay_speedup": round(best["record_s"] / best["replay_s"], 2),
            "fork_speedup": round(best["record_s"] / best["fork_s"], 2),
            "speedup_ceiling": round(best["record_s"] / best["start_s"], 2),
            "record_overhead": round(best["recorded_program_s"] / best["unrecorded_program_s"] - 1, 4),
            "record_overhead_median": round(median(self.recorded_program_s) / median(self.unrecorded_program_s) - 1, 4),
            "record_overhead_cpu": round(median(self.recorded_program_cpu_s) / median(self.unrecorded_program_cpu_s) - 1,
                                         4),
            "sdk_import_ms": round(self.sdk_import_ms, 2),
            "fork_site": self.fork_site,
            **{name: round(t, 3) for name, t in best.items()},
            **{f"{name}_median": round(median(getattr(self, name)), 3)
               for name in ("recorded_program_cpu_s", "unrecorded_program_cpu_s")},
            **self._sealed(best["start_s"]),
        }

    def _sealed(self, start: float) -> dict:
        if not self.sealed_replay_s:
            return {}
        return {"sealed_replay_s": round(min(self.sealed_replay_s), 3), "program_start_s": round(start, 3),
                "recorded_tool_s": round(self.recorded_tool_s, 3),
                "sealed_target_s": round(TARGETS["sealed_over_start"] * start + self.recorded_tool_s, 3)}


def format_report(r: dict) -> str:
    """The bench's lines, each figure with its target."""
    return "\n".join([
        f"agent ({r['example']} on {r['task']}, best of {r['rounds']}): record {r['record_s']:.2f} s | "
        f"faithful replay {r['replay_s']:.2f} s | fork at {r['fork_site']} {r['fork_s']:.2f} s | program "
        f"{r['unrecorded_program_s']:.2f} s unrecorded, {r['recorded_program_s']:.2f} s recorded",
        f"faithful_identical {str(r['faithful_identical']).lower()} (target true); replay_speedup "
        f"{r['replay_speedup']:.1f}x (target >= {TARGETS['replay_speedup']:.0f}x); fork_speedup "
        f"{r['fork_speedup']:.1f}x (target >= {TARGETS['fork_speedup']:.0f}x, fork at the last model call)",
        f"ceiling: the program's own start in the sandbox (interpreter and imports, no calls) takes "
        f"{r['start_s']:.2f} s, and a replay or fork re-runs the program: neither can beat record ÷ start = "
        f"{r['speedup_ceiling']:.1f}x here",
        f"record_overhead {r['record_overhead'] * 100:+.1f}% best, {r['record_overhead_median'] * 100:+.1f}% median "
        f"(target <= {TARGETS['record_overhead'] * 100:.0f}%), {r['record_overhead_cpu'] * 100:+.1f}% in CPU time "
        f"(median); sdk_import_ms {r['sdk_import_ms']:.1f} ms",
    ] + ([
        f"sealed_replay_s {r['sealed_replay_s']:.2f} s (target <= {TARGETS['sealed_over_start']:g} x program_start_s "
        f"{r['program_start_s']:.2f} s + recorded_tool_s {r['recorded_tool_s']:.3f} s = {r['sealed_target_s']:.2f} s)",
    ] if "sealed_replay_s" in r else []))


# ---------------------------------------------------------------------------- the parts
def _tree(parent: Path, n: int | str, example: Path = EXAMPLE) -> Path:
    """A fresh `write-line` start tree with the example (`parent/tree-N`) and the task's checker in it."""
    from tttr.recorders.tasks import load_task

    task = load_task(TASK)
    tree = parent / f"tree-{n}"
    tree.mkdir()
    subprocess.run(["sh", str(task.path / "setup.sh")], cwd=tree, check=True, capture_output=True)
    shutil.copy(example, tree)
    shutil.copy(task.path / "check.sh", tree)
    return tree


class _Unrecorded:
    """The program in the sandbox against `tttr serve`'s app without a database (this process)."""

    def __init__(self, work: Path, model: str | None, unsafe_no_sandbox: bool):
        from tttr.engine.serve.modes import Live
        from tttr.engine.serve.server import create_app
        from tttr.engine.serve.service import Service
        from tttr.recorders.program import HostPython, api_dir

        self.host = HostPython.current()
        self.sock_dir = api_dir(work / "api-unrecorded", self.host)
        self.unsafe_no_sandbox = unsafe_no_sandbox
        service = Service(model, kernel_mode="invariant", any_model=True)  # as the recording's
        service.load()
        self.service = service
        self.app = create_app(Live(service), None)
        self.endpoint: _Endpoint | None = None

    def run(self, tree: Path, clock: datetime, argv: list[str] = ARGV) -> Stopwatch:
        from tttr.recorders.limits import Limits
        from tttr.recorders.program import SOCKET_NAME, check_program, endpoint_env, sandboxed_command
        from tttr.recorders.sandbox import Executor
        from tttr.recorders.shell import ShellState

        host = self.host
        if self.service.engine.prefixes is not None:  # as cold as each recording's new server: no earlier round's prompts
            self.service.engine.prefixes.clear()
        executor = Executor(tree, seed=SEED, unsafe_no_sandbox=self.unsafe_no_sandbox,
                            limits=Limits(timeout_s=TIMEOUT_S, tree_mb=1024), binds=host.binds(self.sock_dir))
        try:
            program = check_program(argv, tree, host)
            sandboxed = executor.sandboxed
            if self.endpoint is None:
                self.endpoint = _Endpoint(self.app, str(self.sock_dir / SOCKET_NAME) if sandboxed else None)
            model_only = {k: v for k, v in endpoint_env(self.endpoint.base, "").items() if k.startswith("OPENAI_")}
            env = {**(host.env() if sandboxed else {"PATH": host.path}), **model_only}
            command = sandboxed_command(program, host) if sandboxed else program
            watch = Stopwatch()
            watch.start()
            res = executor.run(command, clock=clock, step=0, state=ShellState(exports=env))
            watch.stop()
        finally:
            executor.close()
        if res.exit_code != 0:
            raise ProgramRunError(f"{shlex.join(argv)} exited {res.exit_code} without recording: "
                                  f"{res.stderr.strip()[-300:]}")
        return watch

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()
        self.app.state.server.shutdown()


def sdk_import_ms(samples: int = IMPORT_SAMPLES) -> float:
    """`from tttr.recorders import sdk` timed inside fresh interpreters (median), so that the
    interpreter's own start, which varies more than the import costs, is not part of it."""
    code = ("import time; began = time.perf_counter(); from tttr.recorders import sdk; "
            "print(time.perf_counter() - began)")
    times = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
             for _ in range(samples)]
    return statistics.median(times) * 1000


def _fork_site(db: str, run_id: int) -> tuple[str, str]:
    """The first token of the recording's last model call, and its recorded runner-up."""
    from tttr.engine.bench.replay import _late_token_fork
    from tttr.sessions.store import Store

    with Store.open(db, create=False, readonly=True) as reader:
        last = max(e.step for e in reader.events(run_id, kind="prompt"))
        return _late_token_fork(reader, run_id, last)


def _tool_seconds(db: str, run_id: int) -> float:
    """The recording's SDK tool events' durations, summed (s)."""
    from tttr.sessions.store import Store

    with Store.open(db, create=False, readonly=True) as reader:
        ms = [e.value.get("duration_ms") for e in reader.events(run_id, kind="tool") if isinstance(e.value, dict)
              and e.value.get("source") == "sdk"]
    return sum(m for m in ms if type(m) in (int, float) and m >= 0) / 1000


def _fork(db: str, run_id: int, site: str, value: str, model: str | None, unsafe_no_sandbox: bool):
    from tttr.engine.program.fork import check_program_fork
    from tttr.engine.program.replay import replay_program
    from tttr.sessions.store import Store

    with Store.open(db, create=False, readonly=True) as reader:
        plan = check_program_fork(reader, run_id, site, value, model=model)
    return replay_program(db, run_id, unsafe_no_sandbox=unsafe_no_sandbox, fork=plan)


# ---------------------------------------------------------------------------- the bench
def measure(*, rounds: int = 3, model: str | None = None, unsafe_no_sandbox: bool = False,
            progress: Callable[[str], None] = lambda text: None) -> Figures:
    from tttr.engine.program.record import record_program
    from tttr.engine.program.replay import replay_program
    from tttr.recorders.tasks import load_task

    clock = load_task(TASK).clock
    work = Path(tempfile.mkdtemp(prefix="tttr-bench-agent-"))
    db = str(work / "agent.db")
    times: dict[str, list] = {k: [] for k in ("record", "recorded", "unrecorded", "recorded_cpu", "unrecorded_cpu",
                                              "replay", "fork", "start", "identical", "sealed")}

    def unrecorded_run(n: int) -> None:
        watch = unrecorded.run(_tree(work, n), clock)
        times["unrecorded"].append(watch.wall)
        times["unrecorded_cpu"].append(watch.cpu)

    try:
        progress("loading the model for the unrecorded runs …")
        unrecorded = _Unrecorded(work, model, unsafe_no_sandbox)
        try:
            first = site = value = None
            for r in range(1, rounds + 1):
                if r % 2 == 0:  # the two sides take turns at going first, so that neither always follows the other
                    unrecorded_run(2 * r + 1)
                began = time.perf_counter()
                rec = record_program(db, ARGV, tree=str(_tree(work, 2 * r)), clock=clock, seed=SEED, model=model,
                                     check=CHECK, timeout_s=TIMEOUT_S, unsafe_no_sandbox=unsafe_no_sandbox)
                times["record"].append(time.perf_counter() - began)
                if rec.exit_code != 0 or not rec.passed:
                    raise ProgramRunError(f"the example did not solve {TASK} under tttr record (exit {rec.exit_code}, "
                                          f"check {rec.passed}): {rec.stderr.strip()[-300:]}")
                times["recorded"].append(rec.extra["program_s"])
                times["recorded_cpu"].append(rec.extra["program_cpu_s"])
                if r % 2 == 1:
                    unrecorded_run(2 * r + 1)
                times["start"].append(unrecorded.run(_tree(work, 100 + r), clock, START_ARGV).wall)
                if first is None:
                    first = rec.run_id
                    site, value = _fork_site(db, first)
                began = time.perf_counter()
                rep = replay_program(db, first, unsafe_no_sandbox=unsafe_no_sandbox)
                times["replay"].append(time.perf_counter() - began)
                times["identical"].append(rep.identical and rep.logits_computed == 0 and rep.tools_run == 0)
                # before the fork, whose model's threads may still spin a while after it
                began = time.perf_counter()
                sealed = replay_program(db, first, unsafe_no_sandbox=unsafe_no_sandbox, sealed=True)
                times["sealed"].append(time.perf_counter() - began)
                if not sealed.identical:
                    raise ProgramRunError(f"the sealed replay of run {first} diverged: {sealed.divergence.describe()}")
                began = time.perf_counter()
                forked = _fork(db, first, site, value, model, unsafe_no_sandbox)
                times["fork"].append(time.perf_counter() - began)
                if not forked.extra.get("forked"):
                    raise ProgramRunError(f"the fork of run {first} at {site} never reached its site")
                progress(f"round {r}/{rounds}: record {times['record'][-1]:.2f} s (program {times['recorded'][-1]:.2f} s; "
                         f"unrecorded {times['unrecorded'][-1]:.2f} s) | replay {times['replay'][-1]:.2f} s "
                         f"({'identical' if times['identical'][-1] else 'NOT identical'}) | fork at {site} "
                         f"{times['fork'][-1]:.2f} s | program start {times['start'][-1]:.2f} s | sealed replay "
                         f"{times['sealed'][-1]:.2f} s")
        finally:
            unrecorded.close()
        progress(f"timing the SDK's import in {IMPORT_SAMPLES} fresh interpreters …")
        return Figures(tuple(times["record"]), tuple(times["recorded"]), tuple(times["unrecorded"]),
                       tuple(times["recorded_cpu"]), tuple(times["unrecorded_cpu"]), tuple(times["replay"]),
                       tuple(times["fork"]), tuple(times["start"]), tuple(times["identical"]), sdk_import_ms(), site,
                       tuple(times["sealed"]), _tool_seconds(db, first))
    finally:
        remove_tree(work)


def run_bench(*, rounds: int = 3, model: str | None = None, unsafe_no_sandbox: bool = False,
              progress: Callable[[str], None] = lambda text: None) -> dict:
    return measure(rounds=rounds, model=model, unsafe_no_sandbox=unsafe_no_sandbox, progress=progress).to_json()
