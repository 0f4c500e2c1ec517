"""`tttr bench replay`: replay fidelity per layer, and the speed of replay, fork and recording.

Fidelity. Record runs over the task suite (several seeds, temperature > 0), all at once so
they share the engine's batches. Then:
- faithful replay of each: identical actions, token ids and logits digests;
- each with the tensor layer freed, all at once again (so every position lands in a batch
  of another composition than when recorded): identical;
- each with the token layer freed (a fresh seed): the fraction of (recording, replay)
  pairs with the same sequence of actions — the agreement rate of the study behind TTTR.

Speed, side by side in one process with the model loaded once: recording a run, the same
run with recording switched off, a faithful replay of it, and a fork at its last step.
Recording's overhead is given by wall time and by CPU time (this process's threads and the
sandboxed commands it waited for), which a shared machine's other work moves less.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from tttr.engine.replay.diff import diff_runs
from tttr.engine.replay.runs import fork, record, replay
from tttr.engine.replay.runtime import Runtime
from tttr.recorders.tasks import list_tasks
from tttr.sessions.store import Store

TEMPERATURE = 0.7


def _parallel(fn: Callable, items: list) -> list:
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        return list(pool.map(fn, items))


def run_bench(runs: int = 10, db: str | None = None, model: str | None = None,
              unsafe_no_sandbox: bool = False, log: Callable | None = print) -> dict:
    say = log or (lambda *a, **k: None)
    load_before = os.getloadavg()[0]
    tmp = None
    if db is None:
        tmp = tempfile.mkdtemp(prefix="tttr-bench-")
        db = os.path.join(tmp, "bench.db")
    runtime = Runtime(model, kernel_mode="invariant")
    runtime.warm_up()
    tasks = [t.name for t in list_tasks()]
    plan = [(tasks[i % len(tasks)], 1000 + i) for i in range(runs)]

    def store() -> Store:
        return Store.open(db, create=True)

    store().close()  # create and migrate once, before the threads open it side by side

    def rec(item):
        task, seed = item
        s = store()
        try:
            return record(s, task, runtime=runtime, seed=seed, temperature=TEMPERATURE,
                          unsafe_no_sandbox=unsafe_no_sandbox)
        finally:
            s.close()

    say(f"recording {runs} runs over {len(set(t for t, _ in plan))} tasks (temperature {TEMPERATURE}) …")
    t0 = time.perf_counter()
    recorded = _parallel(rec, plan)
    say(f"  recorded in {time.perf_counter() - t0:.1f} s; passed {sum(bool(r.passed) for r in recorded)}/{runs}")

    def rep(free):
        def one(r):
            s = store()
            try:
                child = replay(s, r.run_id, free, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox)
                return child, diff_runs(s, r.run_id, child.run_id)
            finally:
                s.close()
        return one

    faithful = [rep(())(r) for r in recorded]
    faithful_identical = sum(d.identical for _, d in faithful) / runs
    say(f"faithful replay: {sum(d.identical for _, d in faithful)}/{runs} identical "
        f"(actions, token ids, logits digests); logits computed: {sum(c.logits_computed for c, _ in faithful)}, "
        f"commands run: {sum(c.commands_run for c, _ in faithful)}")

    tensor_free = _parallel(rep(("tensor",)), recorded)
    tensor_identical = sum(d.identical for _, d in tensor_free) / runs
    say(f"tensor layer freed (co-batched, invariant kernels): {sum(d.identical for _, d in tensor_free)}/{runs} identical")

    token_free = _parallel(rep(("token",)), recorded)
    agree = sum(c.actions == r.actions for r, (c, _) in zip(recorded, token_free)) / runs
    say(f"token layer freed (fresh seed): action agreement {agree:.0%} of {runs} pairs "
        f"(the study behind TTTR found ~39% across 17 models)")

    # Speed: one run of ≥ 5 steps if the recordings have one.
    target = max(recorded, key=lambda r: len(r.actions))
    task = plan[recorded.index(target)]
    n_steps = len(target.actions)
    say(f"speed on run {target.run_id} ({task[0]}, seed {task[1]}, {n_steps} steps) …")

    def timed(fn):
        t = time.perf_counter()
        out = fn()
        return time.perf_counter() - t, out

    def cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    s = store()
    try:
        on, off, on_cpu, off_cpu = [], [], [], []
        for _ in range(2):
            for write, walls, cpus in ((True, on, on_cpu), (False, off, off_cpu)):
                c = cpu()
                walls.append(timed(lambda: record(s, task[0], runtime=runtime, seed=task[1], temperature=TEMPERATURE,
                                                  unsafe_no_sandbox=unsafe_no_sandbox, write=write))[0])
                cpus.append(cpu() - c)
        t_record, t_off = min(on), min(off)
        t_replay = min(timed(lambda: replay(s, target.run_id, (), runtime=runtime,
                                            unsafe_no_sandbox=unsafe_no_sandbox))[0] for _ in range(3))
        last = n_steps - 1
        site, value = _late_token_fork(s, target.run_id, last)
        forks = []
        for _ in range(3):
            with _capturing_sequences(runtime) as made:
                t, forked = timed(lambda: fork(s, target.run_id, site, value, runtime=runtime,
                                               unsafe_no_sandbox=unsafe_no_sandbox))
            floor = None
            if made:  # the forked step's sequence again, alone: its prompt prefilled whole, its tokens
                make, args = made[0]
                generate = runtime.generate_in(s.run(target.run_id).kernel_mode)
                floor = timed(lambda: generate(make(*args)))[0]
            forks.append((t, forked, floor, args[0] if made else None))
        t_fork, forked, t_floor, fork_prompt = min(forks, key=lambda f: f[0])
    finally:
        s.close()
    result = {
        "runs": runs,
        "faithful_identical_fraction": faithful_identical,
        "tensor_free_identical_fraction": tensor_identical,
        "token_free_agreement": agree,
        "replay_speedup": t_record / t_replay,
        "fork_speedup": t_record / t_fork,
        "record_overhead": t_record / t_off - 1.0,
        "record_overhead_cpu": min(on_cpu) / min(off_cpu) - 1.0,  # the same by CPU seconds
        "record_s": t_record,
        "record_unrecorded_s": t_off,
        "replay_s": t_replay,
        "fork_s": t_fork,
        "fork_site": site,
        "speed_run_steps": n_steps,
        # what the fork computed: its live steps, the positions it generated, and the floor it
        # is held to, a prefill of the shared prefix and the forked step's tokens, timed alone
        "fork_live_steps": len(forked.actions) - last,
        "fork_logits_computed": forked.logits_computed,
        "fork_commands_run": forked.commands_run,
        "fork_prompt_tokens": len(fork_prompt) if fork_prompt is not None else None,
        "fork_floor_s": t_floor,
        "fork_over_floor": t_fork / t_floor if t_floor else None,
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before, after: a busy machine's figures differ
    }
    say(f"record {t_record:.2f} s | unrecorded {t_off:.2f} s | faithful replay {t_replay * 1000:.1f} ms | "
        f"fork at {site} {t_fork:.2f} s (best of 3)")
    if t_floor:
        say(f"fork: {result['fork_live_steps']} live step(s), {forked.logits_computed} positions generated, "
            f"{forked.commands_run} command(s) run; a prefill of its {result['fork_prompt_tokens']}-token prompt and "
            f"the step's tokens alone take {t_floor:.2f} s: the fork costs {result['fork_over_floor']:.2f}x that")
    say(f"replay speedup {result['replay_speedup']:.0f}x (target >= 50x); fork speedup "
        f"{result['fork_speedup']:.1f}x (target >= 3x, run of {n_steps} steps); "
        f"recording overhead {result['record_overhead']:+.1%} (target <= 5%; by CPU time "
        f"{result['record_overhead_cpu']:+.1%})")
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


@contextlib.contextmanager
def _capturing_sequences(runtime: Runtime):
    """While inside, the (factory, arguments) of every sequence the runtime's runs make, in order."""
    made: list = []
    real = runtime.sequence_factory

    def factory(sampling):
        make = real(sampling)

        def capture(*args):
            made.append((make, args))
            return make(*args)

        return capture

    runtime.sequence_factory = factory
    try:
        yield made
    finally:
        del runtime.sequence_factory


def _late_token_fork(store, run_id: int, step: int) -> tuple[str, str]:
    """A token mutation at the first token of the given step: its recorded runner-up."""
    lv = store.event_at(run_id, f"{step}:logits:0").value
    tv = store.event_at(run_id, f"{step}:token:0").value
    alt = next(i for i, _ in lv["topk"] if i != tv["id"])
    return f"{step}:token:0", str(alt)
