"""`tttr bench app`: how fast the app opens a big run and answers a key press.

A database with one run of ~100k events is generated through the real store, in the
shape the agent loop writes (setup, then per step: prompt, token + logits per position,
message, action, clock, tool). The app is then driven by Textual's pilot in a headless
terminal: `open_s` is the time from starting the app on that run to its timeline being
painted (on its step tree, one row per step); `step_keypress_ms` the median CPU time of
the step tree's keys (expand and collapse a step of 485 events, move by row and by step,
every step at once and back); `keypress_ms` is the median time the app works on one key press, from the key
to the screen having handled and repainted it, over stepping keys of every kind (event,
step, layer, page, start, end, bookmark, the detail pane). It is the process's CPU time, because the pilot's wall
clock includes its own idle detection (sleeps of 20 ms until the process goes quiet);
that wall time, and the same for a key bound to nothing, are printed beside it.

A second run of the same size, which takes another command at step 2 (so that every
token differs and the alignment has a gap), is then compared with the first:
`compare_open_s` is the time from pushing the compare screen to its rows being painted
(the worker's whole scan of both runs), and `compare_keypress_ms` the median CPU time of
the compare's keys (rows, next/previous difference, each repainting the message pair).

The run's steps carry stored timings (`time_steps`: fixed figures), and `t` opens the timing
view on it: `timing_open_s` is the time from the key to its table painted (a worker reads the
run's rows once), `timing_keypress_ms` the median CPU time of its keys (page, end, home).

A third database holds 50,000 short runs (`generate_runs`: recorded runs, forks of recent
ones, replays, recorded programs, written through the store's recording API):
`runs_list_ms` is the time from starting the app on it to its runs list being painted
(the list reads a window of rows at a time, so it should not grow with the runs).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import statistics
import time
from datetime import datetime, timedelta
from pathlib import Path

TOKENS_PER_STEP = 240
KEYS = ("down", "down", "up", "right", "right", "left", "full_stop", "full_stop", "comma",
        "pagedown", "pagedown", "pageup", "end", "home", "l", "full_stop", "comma", "right",
        # bookmark, page away, jump back to it; into the detail pane, scroll it, back
        "m", "pagedown", "apostrophe", "tab", "pagedown", "tab")
WORDS = ("I", " will", " list", " the", " files", " and", " rotate", " logs", " older", " than",
         " seven", " days", ".", "\n", "```", "bash", " ls", " -la", " /var", "/log")
COMMANDS = ("ls -la /var/log", "find /var/log -name '*.log' -mtime +7", "gzip -k app.log",
            "date +%F", "cat /etc/hostname", "wc -l access.log", "mv app.log app.log.1")
OTHER_COMMANDS = COMMANDS[:2] + ("rm -rf /var/log/old",) + COMMANDS[3:]  # the compared run's
# The step tree (the timeline opens on it): expand a step of 485 events and collapse it, by
# row and by the step keys, and every step at once and back.
STEP_KEYS = ("space", "down", "down", "space", "right", "space", "pagedown", "left", "space", "z", "end", "z")
COMPARE_KEYS = ("down", "down", "up", "n", "n", "p", "pagedown", "pageup", "end", "home")
TIMING_KEYS = ("pagedown", "pageup", "end", "home")


def generate(path: Path, events: int = 100_000, *, seed: int = 0, tokens_per_step: int = TOKENS_PER_STEP,
             commands: tuple[str, ...] = COMMANDS) -> int:
    """Add to the database at `path` (made if missing) one complete run of about `events`
    events; returns its id. Deterministic for a given seed and commands."""
    from tttr.sessions.records import token_value
    from tttr.sessions.store import Store

    rng = random.Random(seed)
    per_step = 2 * tokens_per_step + 5
    steps = max(1, (events - 3) // per_step)
    clock = datetime(2026, 11, 29, 10, 0, 0)
    store = Store.open(path, create=True)
    try:
        run = store.begin_run(
            task="rotate-logs", model_id="synthetic-bench", kernel_mode="invariant",
            sampling={"temperature": 0.7, "top_p": 1.0, "top_k": 0}, seed=seed,
            fingerprint={"device": "cpu"}, meta={"clock": clock.isoformat(), "synthetic": True},
        )
        store.append(run, "setup:clock", {"t": clock.isoformat()})
        store.append(run, "setup:setup",
                     {"task": "rotate-logs", "clock": clock.isoformat(), "tree": _hex(rng, 64), "snapshot": None})
        store.commit_step(run)
        tree = _hex(rng, 64)
        for step in range(steps):
            store.append(run, f"{step}:prompt",
                         {"ids_digest": _hex(rng, 16), "n_tokens": 300 + step * 40})
            text = []
            for pos in range(tokens_per_step):
                tid = rng.randrange(49152)
                word = WORDS[rng.randrange(len(WORDS))]
                text.append(word)
                lp = -round(rng.random() * 2, 3)
                store.append(run, f"{step}:token:{pos}",
                             token_value(tid, word, False, lp, [seed, step, pos]))
                topk = [[tid, lp]] + [[rng.randrange(49152), lp - 0.5 * (k + 1)] for k in range(4)]
                store.append(run, f"{step}:logits:{pos}",
                             {"digest": _hex(rng, 16), "topk": topk, "batch": [4, [rng.randrange(4)]],
                              "mode": "invariant"})
            cmd = commands[step % len(commands)]
            store.append(run, f"{step}:message", {"text": "".join(text)})
            store.append(run, f"{step}:action", {"cmd": cmd})
            clock += timedelta(seconds=3)
            store.append(run, f"{step}:clock", {"t": clock.isoformat()})
            before, tree = tree, _hex(rng, 64) if step % 3 == 0 else tree
            out = "\n".join(f"-rw-r--r-- 1 agent agent {rng.randrange(99999):>5} app-{i}.log" for i in range(8))
            store.append(run, f"{step}:tool", {
                "cmd": cmd, "cwd": "/work", "env": {"HOME": "/work", "TZ": "UTC", "PATH": "/usr/bin:/bin"},
                "stdout": out, "stderr": "", "exit_code": 0, "duration_ms": rng.randrange(2, 40),
                "stdout_size": len(out), "stderr_size": 0, "truncated": False,
                "tree_before": before, "tree_after": tree, "snapshot": None,
            })
            store.commit_step(run)
        store.append(run, f"{steps - 1}:outcome",
                     {"passed": True, "checker_exit": 0, "checker_output": "ok"})
        store.commit_step(run)
        store.finish_run(run, "complete", {"passed": True, "checker_exit": 0, "checker_output": "ok"})
        return run
    finally:
        store.close()


def time_steps(path: Path, run_id: int) -> None:
    """Store a timing for each step of the run (fixed figures, as a recorder writes them)."""
    from tttr.sessions.store import Store

    with Store.open(path, create=False) as store:
        for step in range(store.steps(run_id)):
            store.time_step(run_id, step, model_ms=400.0 + step % 7 * 50, tool_ms=5.0 + step % 5, wait_ms=1.5)


def _hex(rng: random.Random, n: int) -> str:
    return hashlib.sha256(rng.randbytes(16)).hexdigest()[:n]


async def _press(pilot, key: str) -> tuple[float, float]:
    """(wall ms, CPU ms) from pressing `key` to the app having handled and painted it."""
    wall, cpu = time.perf_counter(), time.process_time()
    await pilot.press(key)
    await pilot.pause()
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


async def _drive(db: Path, run_id: int, size: tuple[int, int]) -> dict:
    from tttr.app.screens.timeline import TimelineScreen
    from tttr.app.tui import TTTRApp
    from tttr.app.widgets.timeline import Timeline
    from tttr.sessions.store import Store

    t0 = time.perf_counter()
    store = Store.open(db, create=False, readonly=True)
    app = TTTRApp(store, run_id=run_id, load_tokenizer=False)
    async with app.run_test(size=size) as pilot:
        while not isinstance(app.screen, TimelineScreen):
            await pilot.pause(0.005)
        await pilot.pause()
        open_s = time.perf_counter() - t0
        timeline = app.screen.query_one(Timeline)
        events, steps = timeline.view.count, len(timeline.rows.steps)
        steps_cpu = [c for _, c in [await _press(pilot, key) for key in STEP_KEYS]]
        await _press(pilot, "home")
        presses = [await _press(pilot, key) for key in KEYS]
        # A key bound to nothing: what the pilot's own idle detection costs per press.
        floor = [await _press(pilot, "f12") for _ in range(5)]
        t0 = time.perf_counter()
        await pilot.press("t")
        while getattr(app.screen, "timings", None) is None:
            await pilot.pause(0.005)
        await pilot.pause()
        timing_open_s = time.perf_counter() - t0
        timing_cpu = [c for _, c in [await _press(pilot, key) for key in TIMING_KEYS]]
        await _press(pilot, "escape")
    store.close()
    cpu = [c for _, c in presses]
    return {
        "events": events,
        "open_s": open_s,
        "keypress_ms": statistics.median(cpu),
        "keypress_max_ms": max(cpu),
        "keypress_wall_ms": statistics.median(w for w, _ in presses),
        "pilot_floor_wall_ms": statistics.median(w for w, _ in floor),
        "pilot_floor_cpu_ms": statistics.median(c for _, c in floor),
        "keys": len(presses),
        "steps": steps,
        "step_keypress_ms": statistics.median(steps_cpu),
        "step_keypress_max_ms": max(steps_cpu),
        "timing_open_s": timing_open_s,
        "timing_keypress_ms": statistics.median(timing_cpu),
    }


async def _drive_compare(db: Path, run_a: int, run_b: int, size: tuple[int, int]) -> dict:
    """From the runs list: push the compare of the two runs, wait for its rows, press its keys."""
    from tttr.app.screens.compare import CompareScreen
    from tttr.app.screens.runs import RunsScreen
    from tttr.app.tui import TTTRApp
    from tttr.sessions.store import Store

    store = Store.open(db, create=False, readonly=True)
    app = TTTRApp(store, load_tokenizer=False)
    async with app.run_test(size=size) as pilot:
        while not isinstance(app.screen, RunsScreen):
            await pilot.pause(0.005)
        await pilot.pause()
        t0, cpu0 = time.perf_counter(), time.process_time()
        screen = CompareScreen(run_a, run_b)
        app.push_screen(screen)
        while screen.comparison is None:
            await pilot.pause(0.005)
        await pilot.pause()
        figures = {
            "compare_open_s": time.perf_counter() - t0,
            "compare_open_cpu_s": time.process_time() - cpu0,  # the process's: the worker's included
            "compare_rows": len(screen.comparison.rows),
        }
        keys = [cpu for _, cpu in [await _press(pilot, key) for key in COMPARE_KEYS]]
    store.close()
    return figures | {"compare_keypress_ms": statistics.median(keys), "compare_keypress_max_ms": max(keys)}


def generate_runs(path: Path, runs: int = 50_000, *, seed: int = 0) -> None:
    """Add to the database at `path` (made if missing) `runs` short runs through the store's
    recording API, in the mix a long-used database holds: of every ten, six recorded runs
    (two steps of clock, action and tool), two forks of a recent run at its second step, a
    replay of the run before it, and a recorded program (`meta.program`, its command line)."""
    from tttr.sessions.store import Store

    rng = random.Random(seed)
    done: list[int] = []
    store = Store.open(path, create=True)
    try:
        for i in range(runs):
            common = {"task": "rotate-logs", "model_id": "synthetic-bench", "kernel_mode": "invariant", "seed": seed}
            steps = range(2)
            if done and i % 10 in (3, 7):
                parent = done[rng.randrange(max(0, len(done) - 200), len(done))]
                run = store.begin_run(**common, parent=parent, fork_seq=3,
                                      mutation={"site": "1:clock", "input": "+1d", "value": "2026-11-30T10:00:03"})
                steps = range(1, 2)
            elif done and i % 10 == 5:
                run = store.begin_run(**common, parent=done[-1], fork_seq=0, meta={"replay": {"free": ["tensor"]}})
            elif i % 10 == 9:
                run = store.begin_run(task="program:python3", meta={"program": ["python3", f"agent_{i % 7}.py"]})
            else:
                run = store.begin_run(**common)
            for step in steps:
                cmd = COMMANDS[rng.randrange(len(COMMANDS))]
                store.append(run, f"{step}:clock", {"t": f"2026-11-29T10:00:0{step}"})
                store.append(run, f"{step}:action", {"cmd": cmd})
                store.append(run, f"{step}:tool", {"cmd": cmd, "stdout": "ok\n", "exit_code": 0})
                store.commit_step(run)
            store.finish_run(run, "complete", {"passed": rng.random() < 0.7, "checker_exit": 0})
            done.append(run)
    finally:
        store.close()


async def _drive_runs_list(db: Path, size: tuple[int, int]) -> dict:
    """Start the app on `db` and wait for its runs list to be painted."""
    from tttr.app.screens.runs import RunsScreen
    from tttr.app.tui import TTTRApp
    from tttr.sessions.store import Store

    t0 = time.perf_counter()
    store = Store.open(db, create=False, readonly=True)
    app = TTTRApp(store, load_tokenizer=False)
    async with app.run_test(size=size) as pilot:
        while not (isinstance(app.screen, RunsScreen) and app.screen.query_one("#runs").row_count):
            await pilot.pause(0.005)
        await pilot.pause()
        painted = time.perf_counter() - t0
        listed = app.screen.query_one("#runs").row_count
    store.close()
    return {"runs_list_ms": painted * 1000, "runs_list_rows": listed}


def generate_writes(path: Path, writes: int = 1_000, files: int = 100) -> int:
    """A run of `writes` steps, each writing one file of `files` (its tree's manifest stored, as
    the trace recorder stores a snapshot), except `first.txt`, written at step 0 only: blaming
    it walks back through every later write. Returns the run's id."""
    from tttr.recorders.snapshot import Entry, manifest_bytes
    from tttr.sessions.store import Store

    store = Store.open(path, create=True)
    try:
        run = store.begin_run(task="write-line", model_id="synthetic-bench", kernel_mode="invariant", seed=0)
        tree = {"README": Entry("README", "f", 0o644, 0, 10, _hex(random.Random(0), 64))}

        def manifest() -> str:
            return store.put_blob(manifest_bytes([tree[p] for p in sorted(tree)]))

        start = manifest()
        store.append(run, "setup:setup", {"task": "write-line", "tree": start, "snapshot": start})
        store.commit_step(run)
        before = start
        for step in range(writes):
            name = "first.txt" if step == 0 else f"f{step % files}.txt"
            tree[name] = Entry(name, "f", 0o644, step * 1_000_000_000, 20 + step, hashlib.sha256(b"%d" % step).hexdigest())
            after = manifest()
            cmd = f"echo {step} > {name}"
            store.append(run, f"{step}:action", {"cmd": cmd})
            store.append(run, f"{step}:tool", {
                "cmd": cmd, "stdout": "", "stderr": "", "exit_code": 0, "duration_ms": 3,
                "tree_before": before, "tree_after": after, "snapshot": after})
            store.commit_step(run)
            before = after
        store.finish_run(run, "complete", {"passed": True, "checker_exit": 0})
        return run
    finally:
        store.close()


def measure_blame(path: Path, run_id: int, rounds: int = 3, last: str = "f99.txt") -> dict:
    """`tttr files --blame` as the command runs it (a fresh store and RunTrees each round):
    a file written at step 0 of a run of 1,000 writes, and one written at its last step."""
    from tttr.engine.blame import blame
    from tttr.sessions.store import Store

    def once(name: str) -> float:
        t = time.perf_counter()
        with Store.open(path, create=False, readonly=True) as store:
            found = blame(store, run_id, name)
        assert found.step >= 0
        return (time.perf_counter() - t) * 1000

    return {"blame_first_ms": statistics.median(once("first.txt") for _ in range(rounds)),
            "blame_last_ms": statistics.median(once(last) for _ in range(rounds))}


def measure(events: int = 100_000, db: Path | None = None, size: tuple[int, int] = (160, 48),
            compare: bool = True, runs: int = 50_000, blame: int = 1_000) -> dict:
    """The figures above; with `compare`, a second run is generated and compared too; with
    `runs`, a database of that many runs is generated and its runs list opened."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tttr-bench-app-") as tmp:
        path = Path(db) if db else Path(tmp) / "bench.db"
        t = time.perf_counter()
        run_id = generate(path, events)
        generate_s = time.perf_counter() - t
        time_steps(path, run_id)
        figures = asyncio.run(_drive(path, run_id, size))  # the timeline alone in its file, as before
        if compare:
            other = generate(path, events, seed=1, commands=OTHER_COMMANDS)
            figures |= asyncio.run(_drive_compare(path, run_id, other, size))
        if runs:
            many = Path(tmp) / "runs.db"
            t = time.perf_counter()
            generate_runs(many, runs)
            figures |= {"runs": runs, "runs_generate_s": time.perf_counter() - t}
            figures |= asyncio.run(_drive_runs_list(many, size))
        if blame:
            writes = Path(tmp) / "writes.db"
            figures |= {"blame_writes": blame} | measure_blame(writes, generate_writes(writes, blame),
                                                               last=f"f{(blame - 1) % 100}.txt")
    figures["generate_s"] = generate_s
    return figures


def format_lines(figures: dict) -> list[str]:
    """What `tttr bench app` prints of `measure`'s figures, one line each."""
    lines = [
        f"app on a generated run of {figures['events']} events (generated in {figures['generate_s']:.1f} s)",
        f"  open_s       {figures['open_s']:.3f}   (start → the step tree of its {figures['steps']} steps painted; "
        "target ≤ 1 s)",
        f"  step_keypress_ms  {figures['step_keypress_ms']:.1f}   (expand / collapse a step of "
        f"{figures['events'] // max(1, figures['steps'])} events, every step; max {figures['step_keypress_max_ms']:.1f}; "
        "target ≤ 50 ms)",
        f"  keypress_ms  {figures['keypress_ms']:.1f}   (app work per stepping key, median of {figures['keys']}; "
        f"max {figures['keypress_max_ms']:.1f}; target ≤ 50 ms)",
        f"  pilot wall per key {figures['keypress_wall_ms']:.1f} ms vs {figures['pilot_floor_wall_ms']:.1f} ms "
        f"for an unbound key (the pilot's idle detection; app work there {figures['pilot_floor_cpu_ms']:.1f} ms)",
    ]
    if "timing_open_s" in figures:
        lines.append(f"  timing_open_s  {figures['timing_open_s']:.3f}   (t → the timing view of its steps painted, "
                     f"read in a worker); its keys {figures['timing_keypress_ms']:.1f} ms (target ≤ 50 ms)")
    if "compare_open_s" in figures:
        lines.append(f"  compare_open_s       {figures['compare_open_s']:.3f}   (compare of two such runs, "
                     f"{figures['compare_rows']} rows, pushed → rows painted, in a worker with progress; "
                     f"CPU {figures['compare_open_cpu_s']:.3f} s)")
        lines.append(f"  compare_keypress_ms  {figures['compare_keypress_ms']:.1f}   (rows, n/p, page; "
                     f"max {figures['compare_keypress_max_ms']:.1f})")
    if "blame_first_ms" in figures:
        lines.append(f"  blame_ms  {figures['blame_first_ms']:.0f}   (tttr files --blame on a run of {figures['blame_writes']:,} "
                     f"file writes, the file written first; the last written: {figures['blame_last_ms']:.0f}; target ≤ 200 ms)")
    if "runs_list_ms" in figures:
        lines.append(f"  runs_list_ms  {figures['runs_list_ms']:.0f}   (start → runs list painted, {figures['runs']:,} runs "
                     f"generated in {figures['runs_generate_s']:.1f} s; {figures['runs_list_rows']} rows read so far)")
    return lines
