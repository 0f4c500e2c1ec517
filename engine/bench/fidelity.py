"""`tttr bench fidelity`: do faithful replays hold on a busy machine, and how noisy is the world?

Everything below runs while LOAD busy processes (one per core, started here, stopped at the
end) keep the machine's cores busy, as a shared CI box or a laptop building something is:

- `identical_fraction`: the three example programs (assets/examples/, on the `write-line`
  task, `tttr record -- PROGRAM`) and five built-in tasks (`tttr record --task`), each
  recorded once and replayed faithfully `replays` times; the fraction of replays that are
  identical to their recording (target 1.0).
- `world_reuse_fraction`: each built-in run is forked twice at `setup:clock` (+1 day): every
  command after the fork is one the recording never ran; of those commands, over both forks,
  the fraction answered from the database (`reused_from`: the first fork asked the same
  question in the same state) instead of run live.
- `same_state_disagreement`: every command the built-in recordings ran, run live again in
  its recorded state (its tree restored, the same clock, seed, working directory and
  exports); the fraction whose stdout, stderr or exit code differ from the recording. The
  rate at which a live re-run would have told a replay something else.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from tttr.engine.bench.agent import TASK as PROGRAM_TASK, _tree
from tttr.recorders.scratch import scratch_dir
from tttr.recorders.treeio import remove_tree

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("openai_agent.py", "langgraph_agent.py", "agents_sdk_agent.py")
TASKS = ("write-line", "make-dir", "copy-file", "rename-file", "count-lines")
SEED = 1
REPLAYS = 5
TARGET = 1.0


class Load:
    """`n` processes spinning on a core each, until `stop()` (or the context ends)."""

    def __init__(self, n: int):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
                      for _ in range(n)]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()

    def __enter__(self) -> "Load":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _programs(db: str, work: Path, examples, replays: int, model, unsafe: bool, say) -> list[bool]:
    from tttr.engine.program.record import record_program
    from tttr.engine.program.replay import replay_program
    from tttr.recorders.tasks import load_task

    clock = load_task(PROGRAM_TASK).clock
    identical = []
    for example in examples:
        say(f"recording {example} …")
        tree = _tree(work, Path(example).stem, ROOT / "assets" / "examples" / example)  # bench agent's tree
        rec = record_program(db, ["python3", example], tree=str(tree), clock=clock, seed=SEED,
                             model=model, check="sh check.sh", unsafe_no_sandbox=unsafe)
        for i in range(replays):
            res = replay_program(db, rec.run_id, unsafe_no_sandbox=unsafe, model=model)
            identical.append(res.identical)
            say(f"  replay {i + 1}/{replays} of {example}: {'identical' if res.identical else 'differs'}"
                + ("" if res.divergence is None else f" at {res.divergence.describe()}"))
    return identical


def _tasks(store, tasks, replays: int, runtime, unsafe: bool, say) -> tuple[list[bool], list[int], int, int]:
    """(identical per replay, the recorded runs, commands answered from the database, commands
    the forks needed that their source never ran)."""
    from tttr.engine.replay.runs import fork, record, replay

    identical, runs, reused, off_record = [], [], 0, 0
    for name in tasks:
        say(f"recording task {name} …")
        rec = record(store, name, runtime=runtime, seed=SEED, temperature=0.7, unsafe_no_sandbox=unsafe)
        runs.append(rec.run_id)
        for _ in range(replays):
            identical.append(bool(replay(store, rec.run_id, (), runtime=runtime, unsafe_no_sandbox=unsafe).identical))
        for _ in range(2):  # the second asks what the first asked, in the same states
            child = fork(store, rec.run_id, "setup:clock", "+1d", runtime=runtime, unsafe_no_sandbox=unsafe)
            for e in store.events(child.run_id, kind="tool"):
                if isinstance(e.value, dict) and e.value.get("off_record"):
                    off_record += 1
                    reused += "reused_from" in e.value
        say(f"  {name}: {sum(identical[-replays:])}/{replays} faithful replays identical")
    return identical, runs, reused, off_record


def _disagreement(store, runs: list[int], unsafe: bool) -> tuple[int, int]:
    """(commands whose live re-run in their recorded state answered otherwise, commands re-run)."""
    from tttr.engine.replay.events import read_text
    from tttr.recorders.limits import Limits
    from tttr.recorders.sandbox import Executor
    from tttr.recorders.shell import ShellState
    from tttr.recorders.snapshot import restore

    differ = total = 0
    for run_id in runs:
        run, events = store.load_run(run_id)
        clocks = {e.step: e.value.get("t") for e in events if e.kind == "clock"}
        for e in events:
            v = e.value
            if e.kind != "tool" or not isinstance(v, dict) or not v.get("tree_before") \
                    or not store.has_blob(v["tree_before"]) or not clocks.get(e.step):
                continue
            work = scratch_dir("tttr-bench-fidelity-")
            try:
                tree = restore(v["tree_before"], store, work / "tree")
                with Executor(tree, seed=run.seed or 0, unsafe_no_sandbox=unsafe, limits=Limits(timeout_s=30)) as ex:
                    res = ex.run(v["cmd"], clock=datetime.fromisoformat(clocks[e.step]), step=e.step,
                                 state=ShellState(v.get("cwd", "/work"), dict(v.get("exports") or {})))
            finally:
                remove_tree(work)
            total += 1
            differ += (res.stdout, res.stderr, res.exit_code) != (read_text(store, v.get("stdout")),
                                                                   read_text(store, v.get("stderr")), v.get("exit_code"))
    return differ, total


def run_bench(*, replays: int = REPLAYS, examples=EXAMPLES, tasks=TASKS, model: str | None = None,
              load: int | None = None, unsafe_no_sandbox: bool = False, progress=None) -> dict:
    """The figures of the module's text, as one JSON object."""
    from tttr.engine.replay.runtime import Runtime
    from tttr.sessions.store import Store

    say = progress or (lambda text: None)
    load = (os.cpu_count() or 2) if load is None else load
    work = scratch_dir("tttr-bench-fidelity-")
    db = str(work / "fidelity.db")
    t0 = time.perf_counter()
    try:
        with Load(load):
            program_identical = _programs(db, work, examples, replays, model, unsafe_no_sandbox, say)
            runtime = Runtime(model, kernel_mode="invariant")
            try:
                with Store.open(db, create=True) as store:
                    task_identical, runs, reused, off_record = _tasks(store, tasks, replays, runtime,
                                                                      unsafe_no_sandbox, say)
                    say("running each recorded command again in its recorded state …")
                    differ, rerun = _disagreement(store, runs, unsafe_no_sandbox)
            finally:
                runtime.close()
    finally:
        remove_tree(work)
    replayed = program_identical + task_identical
    return {
        "load_processes": load, "replays_each": replays, "examples": list(examples), "tasks": list(tasks),
        "identical_fraction": round(sum(replayed) / len(replayed), 4) if replayed else None,
        "program_identical": f"{sum(program_identical)}/{len(program_identical)}",
        "task_identical": f"{sum(task_identical)}/{len(task_identical)}",
        "world_reuse_fraction": round(reused / off_record, 4) if off_record else None,
        "off_record_commands": off_record,
        "same_state_disagreement": round(differ / rerun, 4) if rerun else None,
        "commands_rerun": rerun,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def format_report(r: dict) -> str:
    def frac(x) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    return "\n".join([
        f"fidelity under load ({r['load_processes']} busy processes; each recording replayed {r['replays_each']} times, "
        f"{r['seconds']:.0f} s)",
        f"identical_fraction {frac(r['identical_fraction'])} (target {TARGET:.1f}): programs {r['program_identical']}, "
        f"built-in tasks {r['task_identical']}",
        f"world_reuse_fraction {frac(r['world_reuse_fraction'])} of {r['off_record_commands']} commands forks needed "
        f"that their source never ran; same_state_disagreement {frac(r['same_state_disagreement'])} of "
        f"{r['commands_rerun']} recorded commands run again in their recorded state",
    ])
