"""`tttr bench sandbox`: per-command sandbox overhead against plain `bash -c`, snapshot of
a 1,000-file tree with 10 files changed, and restore of that tree. Medians of repeated
measurements taken side by side in one run (the machine is shared and noisy)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

TARGETS = {"overhead_ms": 20.0, "snapshot_ms": 50.0, "restore_ms": 100.0}
CLOCK = datetime(2026, 3, 2, 10, 0, 0)


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def make_tree(root: Path, files: int = 1000, per_dir: int = 50) -> list[Path]:
    paths = []
    for i in range(files):
        d = root / f"dir{i // per_dir:02d}"
        d.mkdir(exist_ok=True)
        p = d / f"file{i:04d}.txt"
        p.write_text(f"line {i}\n" * (1 + i % 40))
        paths.append(p)
    return paths


def _store(tmp: Path):
    try:
        from tttr.sessions.store import Store
    except ImportError:  # the store is optional for this measurement
        from tttr.recorders.memstore import MemoryStore

        return MemoryStore(), "memory"
    return Store.open(tmp / "bench.db", create=True), "sqlite"


def _memory_dir() -> Path | None:
    """A fresh directory on /dev/shm, a memory file system, where there is one. Restoring there
    beside the disk separates TTTR's own work from the file system's: on this development
    machine's ext4 (no journal) creating a file scans the inode bitmap past every inode freed
    in the last seconds, so a restore right after other deletions costs ~10-50x more."""
    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK)):
        return None
    return Path(tempfile.mkdtemp(prefix="tttr-bench-restore-", dir="/dev/shm"))


def run_bench(repeats: int = 15, unsafe_no_sandbox: bool = False) -> dict:
    from tttr.engine.bench.sandbox_shares import overhead_shares
    from tttr.recorders.sandbox import Executor
    from tttr.recorders.snapshot import restore, snapshot

    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="tttr-bench-sandbox-"))
    shm = None
    try:
        small = tmp / "small"
        small.mkdir()
        make_tree(small, files=10, per_dir=10)
        ex = Executor(small, seed=1, unsafe_no_sandbox=unsafe_no_sandbox)
        ex.run("true", CLOCK)  # warm: shim build, runtime dir, cgroup
        sand, bash = [], []
        for _ in range(repeats):  # interleaved, so drift hits both alike
            bash.append(_ms(lambda: subprocess.run(["bash", "-c", "true"], check=True)))
            sand.append(_ms(lambda: ex.run("true", CLOCK)))
        shares = overhead_shares(ex, CLOCK, repeats) if ex.sandboxed else {}
        ex.close()

        big = tmp / "big"
        big.mkdir()
        paths = make_tree(big)
        store, kind = _store(tmp)
        snapshot(big, store)
        time.sleep(0.1)  # past the stat cache's racy window, as between two agent steps
        snapshot(big, store)
        snaps, manifests = [], []
        for r in range(min(repeats, 8)):
            for p in paths[r * 10:(r + 1) * 10]:
                p.write_text(p.read_text() + f"changed {r}\n")
            snaps.append(_ms(lambda: manifests.append(snapshot(big, store))))
        restores, in_memory = [], []
        shm = _memory_dir()
        for r in range(min(repeats, 8)):  # interleaved: the disk and a memory file system alike
            dest = tmp / f"restore{r}"
            restores.append(_ms(lambda: restore(manifests[-1], store, dest)))
            shutil.rmtree(dest)
            if shm is not None:
                dest = shm / f"restore{r}"
                in_memory.append(_ms(lambda: restore(manifests[-1], store, dest)))
                shutil.rmtree(dest)
        if hasattr(store, "close"):
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
    sandbox_ms = statistics.median(sand)
    bash_ms = statistics.median(bash)
    return {
        "overhead_ms": round(sandbox_ms - bash_ms, 2),
        "sandbox_ms": round(sandbox_ms, 2),
        "overhead_best_ms": round(min(sand) - min(bash), 2),
        "bash_ms": round(bash_ms, 2),
        "snapshot_ms": round(statistics.median(snaps), 2),
        "restore_ms": round(statistics.median(restores), 2),
        "restore_memory_ms": round(statistics.median(in_memory), 2) if in_memory else None,
        "overhead_shares_ms": shares,
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before, after: a busy machine's figures differ
        "tree_files": 1000,
        "changed_files": 10,
        "store": kind,
        "repeats": repeats,
        "mechanisms": list(ex.mechanisms),
        "targets": TARGETS,
    }


def format_lines(res: dict) -> list[str]:
    def mark(key: str) -> str:
        return "ok" if res[key] <= TARGETS[key] else "OVER TARGET"

    return [
        f"sandbox overhead   {res['overhead_ms']:7.2f} ms per command  (sandboxed {res['sandbox_ms']:.2f} ms vs "
        f"bash -c {res['bash_ms']:.2f} ms, medians; best {res['overhead_best_ms']:.2f} ms; "
        f"target <= {TARGETS['overhead_ms']:g})  {mark('overhead_ms')}",
        f"snapshot           {res['snapshot_ms']:7.2f} ms  (1,000 files, 10 changed, {res['store']} store; "
        f"target <= {TARGETS['snapshot_ms']:g})  {mark('snapshot_ms')}",
        f"restore            {res['restore_ms']:7.2f} ms  (1,000 files into a fresh directory; "
        f"target <= {TARGETS['restore_ms']:g})  {mark('restore_ms')}",
        *([f"restore in memory  {res['restore_memory_ms']:7.2f} ms  (the same into /dev/shm, side by side: "
           "TTTR's share; the rest is the disk's file system)"] if res.get("restore_memory_ms") is not None else []),
        *([f"per-command shares (ms a mechanism adds, medians of the same `true` with it and without it, "
           f"whole {res['overhead_shares_ms']['full']:.2f} ms): "
           + ", ".join(f"{k} {v:+.2f}" if v is not None else f"{k} (refused here)"
                       for k, v in res["overhead_shares_ms"].items() if k != "full")]
          if res.get("overhead_shares_ms") else []),
        *([f"load average (1 min) before and after: {res['load_avg_1m'][0]:.2f}, {res['load_avg_1m'][1]:.2f}"]
          if res.get("load_avg_1m") else []),
        "mechanisms: " + ", ".join(res["mechanisms"]),
    ]
