"""`tttr bench suite`: a small suite in process and over Ray, side by side, and the merge.

- `runs_per_s` at 1 worker: today's in-process suite (`run_suite`, `--batch 2`: two runs in
  flight through one engine); at 2 Ray workers: the same suite (same tasks, runs and seed) as
  Ray tasks on a local instance of 2 CPUs (`run_suite_on_ray`), Ray's start-up timed apart
  (`ray_start_s`) and left out. `ray_over_local` = Ray's rate / the in-process rate, at the
  same parallelism (two runs at a time). Target >= 0.9.
- `pinned_identical`: every pinned run of the Ray suite has the same token, message and action
  events as the in-process suite's run in its slot (task, index); and each agrees with its
  anchor's actions. Clock and tool values carry the wall time of the free runs, so they are
  not compared.
- `merge_events_per_s`: `sessions.merge` of a database of `merge_events` realistic events
  (bench store's step shape, store.py) into a new file. Target >= 100,000.
The suite is the built-in agent's (the Ray path runs it; a program's suite runs in process).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

TASKS = ("write-line", "make-dir")
TARGETS = {"ray_over_local": 0.9, "merge_events_per_s": 100_000}


def _slots(db: str, kinds=("token", "message", "action")) -> dict:
    from tttr.sessions.store import Store

    out = {}
    with Store.open(db, readonly=True, create=False) as store:
        for r in store.runs():
            s = r.meta.suite
            if s is None or s.condition != "pinned":
                continue
            out[(r.task, s.index)] = [(e.kind, e.site, e.value) for e in store.events(r.id) if e.kind in kinds]
    return out


def bench_merge(events: int, workdir: Path) -> float:
    from tttr.engine.bench.store import build_window_db
    from tttr.sessions.merge import merge

    src = workdir / "merge-src.db"
    build_window_db(src, events)
    t0 = time.perf_counter()
    res = merge([src], workdir / "merge-out.db")
    return res.events / (time.perf_counter() - t0)


def run(runs: int = 2, max_steps: int = 1, merge_events: int = 200_000, workdir: Path | None = None) -> dict:
    import ray

    from tttr.engine.replay.ray_suite import run_suite_on_ray, start_ray
    from tttr.engine.replay.runtime import Runtime
    from tttr.engine.replay.suite import run_suite

    with tempfile.TemporaryDirectory(prefix="tttr-bench-suite-") as tmp:
        work = Path(workdir or tmp)
        total = len(TASKS) * runs * 4
        runtime = Runtime(None, kernel_mode="invariant")
        runtime.tokenizer  # noqa: B018 - loaded before the clock starts, as a worker's model is
        errors: list[str] = []
        t0 = time.perf_counter()
        _, local_runs = run_suite(str(work / "local.db"), list(TASKS), runs, runtime=runtime, temperature=0.7, max_steps=max_steps,
                  batch=2, suite_id="bench", seed=1)
        local_s = time.perf_counter() - t0
        runtime.close()
        t0 = time.perf_counter()
        start_ray(num_cpus=2, include_dashboard=False)
        start_s = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            _, ray_runs = run_suite_on_ray(str(work / "ray.db"), list(TASKS), runs, model=None, temperature=0.7,
                                           max_steps=max_steps, batch=1, suite_id="bench", seed=1,
                                           progress=lambda f: errors.append(f.error) if f.error else None)
            ray_s = time.perf_counter() - t0
        finally:
            ray.shutdown()
        local, on_ray = _slots(str(work / "local.db")), _slots(str(work / "ray.db"))
        identical = bool(local) and local == on_ray
        merge_rate = bench_merge(merge_events, work)
    return {
        "suite": {"agent": "built-in", "tasks": list(TASKS), "runs": runs, "conditions": 4, "total_runs": total,
                  "max_steps": max_steps},
        "runs_per_s": {"local_1_worker": total / local_s, "ray_2_workers": total / ray_s},
        "local_s": local_s, "ray_s": ray_s, "ray_start_s": start_s,
        "ray_over_local": local_s / ray_s,
        "merge_events_per_s": merge_rate, "merge_events": merge_events,
        "pinned_identical": identical, "targets": TARGETS,
        "complete_runs": {"local": sum(r.status == "complete" for r in local_runs),
                          "ray": sum(r.status == "complete" for r in ray_runs)},
        "errors": errors[:5],
    }


def format_lines(res: dict) -> list[str]:
    r = res["runs_per_s"]
    return [
        f"suite: {res['suite']['total_runs']} runs of the built-in agent ({', '.join(res['suite']['tasks'])}, "
        f"{res['suite']['runs']} runs x 4 conditions)",
        f"runs_per_s: {r['local_1_worker']:.3f} in process (2 in flight, one engine), {r['ray_2_workers']:.3f} on 2 "
        f"Ray workers (Ray's start {res['ray_start_s']:.1f} s apart)",
        f"ray_over_local: {res['ray_over_local']:.2f} (target >= {TARGETS['ray_over_local']})",
        f"merge_events_per_s: {res['merge_events_per_s']:,.0f} ({res['merge_events']:,} events; target >= 100,000)",
        f"pinned_identical: {str(res['pinned_identical']).lower()}",
        f"complete runs: {res['complete_runs']['local']} in process, {res['complete_runs']['ray']} on Ray"
        + (f"; errors: {'; '.join(res['errors'])}" if res["errors"] else ""),
    ]
