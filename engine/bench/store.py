"""`tttr bench store`: append rate, window read time, bytes per event on disk.

What is measured, honestly:
- A token event is the `token` value the engine records per generated position:
  {"id", "text", "forced", "logprob", "rng": [seed, step, pos]}, with token ids drawn
  log-uniformly over a 49,152-token vocabulary, texts of 1-8 characters (half with a
  leading space), 15% forced, float32 logprobs (they come out of float32 tensors), the rng
  of the position. Values are built before the clock starts; the timed part is
  `begin_run`, `append` + `commit_step` (50 events per step), `finish_run` and `close`
  (with its final WAL checkpoint). Wall-clock rate, and the rate per CPU-second of this
  process beside it, since on a shared machine the two differ.
- Bytes per token event: the file's size after close (WAL checkpointed) over the events
  in it, pages, steps table and schema included. The same values written as JSON text
  (forced by reordering their keys) are measured beside it.
- Window: a 1,000,000-event database of realistic steps (clock, prompt, 120 positions
  each with a `logits` and a `token` event, message, action, tool); the time to
  `Store.open` it and read the 200 events in the middle of the run, median of 7 fresh
  opens. The operating system's page cache is warm (the file was just written).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import statistics
import struct
import tempfile
import time
from pathlib import Path

from tttr.sessions.store import Store

VOCAB = 49_152
POSITIONS_PER_STEP = 120
TARGETS = {"append_events_per_s": 100_000, "window_read_ms": 20.0, "bytes_per_token_event": 120.0}
_F32 = struct.Struct("<f")


def _f32(x: float) -> float:
    return _F32.unpack(_F32.pack(x))[0]


class _Values:
    """Realistic event values, reproducible from a seed."""

    def __init__(self, seed: int = 0):
        self.rnd = random.Random(seed)
        letters = "etaoinshrdlucmfwypvbgkqjxz_-./=0123456789"
        self.texts = [
            (" " if self.rnd.random() < 0.5 else "") + "".join(self.rnd.choices(letters, k=self.rnd.randint(1, 7)))
            for _ in range(VOCAB)
        ]

    def token_id(self) -> int:
        return min(VOCAB - 1, int(math.exp(self.rnd.random() * math.log(VOCAB))) - 1)

    def token(self, seed: int, step: int, pos: int) -> dict:
        tid = self.token_id()
        forced = self.rnd.random() < 0.15
        return {"id": tid, "text": self.texts[tid], "forced": forced,
                "logprob": _f32(-self.rnd.expovariate(1.5)), "rng": [seed, step, pos]}

    def logits(self) -> dict:
        top = sorted((_f32(-self.rnd.expovariate(0.7)) for _ in range(5)), reverse=True)
        return {
            "digest": hashlib.sha256(self.rnd.randbytes(16)).hexdigest(),
            "topk": [[self.token_id(), lp] for lp in top],
            "batch": [self.rnd.randint(1, 16), [self.rnd.randint(0, 15)]],
            "mode": "invariant",
        }


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def bench_append(path: Path, events: int, per_step: int = 50, as_json: bool = False) -> tuple[float, float, float]:
    """(events appended per second, per CPU-second, bytes per event on disk) for `events` token events."""
    values = _Values(1)
    seed = 1234
    batch = []
    for i in range(events):
        step, pos = divmod(i, per_step)
        v = values.token(seed, step, pos)
        if as_json:
            v = {"rng": v.pop("rng"), **v}  # same content, other key order: stored as JSON text
        batch.append((step, f"{step}:token:{pos}", v))
    store = Store.open(path)
    t0, c0 = time.perf_counter(), time.process_time()
    run = store.begin_run(task="bench", model_id="bench", kernel_mode="invariant", seed=seed,
                          sampling={"temperature": 0.7, "top_p": 0.95})
    append, commit = store.append, store.commit_step
    last = 0
    for step, site, v in batch:
        if step != last:
            commit(run)
            last = step
        append(run, site, v)
    store.finish_run(run, "complete", {"passed": True})
    store.close()  # its final WAL checkpoint is part of the cost
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return events / wall, events / cpu, _size(path) / events


def build_window_db(path: Path, events: int) -> int:
    """Write a run of about `events` realistic events; returns its id."""
    values = _Values(2)
    seed = 99
    with Store.open(path) as store:
        run = store.begin_run(task="bench", model_id="bench", kernel_mode="invariant", seed=seed)
        step, written = 0, 0
        while written < events:
            a = store.append
            a(run, f"{step}:clock", {"t": f"2026-11-29T10:{step % 60:02d}:00"})
            a(run, f"{step}:prompt",
              {"ids_digest": hashlib.sha256(str(step).encode()).hexdigest(), "n_tokens": 300 + step, "text": "…"})
            for pos in range(POSITIONS_PER_STEP):
                a(run, f"{step}:logits:{pos}", values.logits())
                a(run, f"{step}:token:{pos}", values.token(seed, step, pos))
            a(run, f"{step}:message", {"text": "```bash\nls -la logs\n```"})
            a(run, f"{step}:action", {"cmd": "ls -la logs"})
            a(run, f"{step}:tool",
              {"cmd": "ls -la logs", "cwd": "/work", "env": {"HOME": "/root"}, "stdout": "a.log\nb.log\n",
               "stderr": "", "exit_code": 0, "duration_ms": 9, "stdout_size": 12, "stderr_size": 0,
               "truncated": False, "tree_before": "ab" * 32, "tree_after": "ab" * 32, "snapshot": None})
            store.commit_step(run)
            written += 2 * POSITIONS_PER_STEP + 5
            step += 1
        store.finish_run(run, "complete", {"passed": False})
    return run


def bench_window(path: Path, run: int, width: int = 200, trials: int = 7) -> float:
    """Median ms to open the database and read `width` events from the middle of `run`."""
    with Store.open(path, create=False) as store:
        middle = store.count_events(run) // 2
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        with Store.open(path, create=False) as store:
            window = store.events(run, middle, middle + width)
        times.append((time.perf_counter() - t0) * 1000)
        assert len(window) == width
    return statistics.median(times)


def run(events: int = 100_000, window_events: int = 1_000_000, workdir: Path | None = None) -> dict:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        rate, cpu_rate, size = bench_append(tmp / "append.db", events)
        _, _, json_size = bench_append(tmp / "json.db", events, as_json=True)
        big = tmp / "window.db"
        run_id = build_window_db(big, window_events)
        with Store.open(big, create=False) as store:
            n = store.count_events(run_id)
        window_ms = bench_window(big, run_id)
        mixed = _size(big) / n
    return {
        "append_events_per_s": round(rate),
        "append_events_per_cpu_s": round(cpu_rate),
        "window_read_ms": round(window_ms, 2),
        "bytes_per_token_event": round(size, 1),
        "json_bytes_per_token_event": round(json_size, 1),
        "window_db_events": n,
        "window_db_bytes_per_event": round(mixed, 1),
        "token_events": events,
        "events_per_step": 50,
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before, after: a busy machine's figures differ
    }


def lines(r: dict) -> list[str]:
    def verdict(key: str, higher_is_better: bool) -> str:
        ok = r[key] >= TARGETS[key] if higher_is_better else r[key] <= TARGETS[key]
        return "ok" if ok else "MISSED"

    return [
        f"append   {r['append_events_per_s']:>10,} events/s   {r['token_events']:,} token events, "
        f"{r['events_per_step']} per step (target >= 100,000: {verdict('append_events_per_s', True)}); "
        f"{r['append_events_per_cpu_s']:,} per CPU-second",
        f"window   {r['window_read_ms']:>10.2f} ms         open a {r['window_db_events']:,}-event database + read "
        f"200 events from its middle (target <= 20 ms: {verdict('window_read_ms', False)})",
        f"size     {r['bytes_per_token_event']:>10.1f} B/event    token events on disk (target <= 120: "
        f"{verdict('bytes_per_token_event', False)}); as JSON text {r['json_bytes_per_token_event']:.1f} B/event "
        f"({r['json_bytes_per_token_event'] / r['bytes_per_token_event']:.1f}x)",
        f"size     {r['window_db_bytes_per_event']:>10.1f} B/event    the {r['window_db_events']:,}-event database "
        "(token + logits per position, trace and agent events per step)",
        *([f"load average (1 min) before and after: {r['load_avg_1m'][0]:.2f}, {r['load_avg_1m'][1]:.2f} "
           "(on a busy machine read the per-CPU-second rate)"] if r.get("load_avg_1m") else []),
    ]
