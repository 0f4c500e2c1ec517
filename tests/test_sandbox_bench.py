"""`tttr bench sandbox`: its figures are measured (not asserted fast: speed is never a test), the
per-mechanism shares each leave one mechanism out, and a restore in memory is reported beside
the disk's."""

from tttr.engine.bench.sandbox import CLOCK, format_lines, make_tree, run_bench
from tttr.engine.bench.sandbox_shares import VARIANTS, variant_argv
from tttr.recorders.sandbox import Executor


def test_each_share_leaves_one_mechanism_out(tmp_path):
    make_tree(tmp_path, files=3, per_dir=3)
    ex = Executor(tmp_path, seed=1)
    try:
        full = variant_argv(ex, "full", CLOCK, "/step", 5)
        assert "--seccomp" in full and "LD_PRELOAD" in full
        for name in VARIANTS[1:]:
            argv = variant_argv(ex, name, CLOCK, "/step", 5)
            assert argv != full, name
            assert argv[-1] == "true"
        assert "--seccomp" not in variant_argv(ex, "seccomp", CLOCK, "/step", 5)
        assert "LD_PRELOAD" not in variant_argv(ex, "preload", CLOCK, "/step", 5)
        assert not any(a.startswith("/run/tttr-step") for a in variant_argv(ex, "step files", CLOCK, "/step", 5))
    finally:
        ex.close()


def test_bench_reports_every_figure():
    res = run_bench(repeats=2)
    for key in ("overhead_ms", "sandbox_ms", "bash_ms", "snapshot_ms", "restore_ms", "restore_memory_ms"):
        assert res[key] is None or res[key] > 0 or key == "overhead_ms", key
    assert res["restore_memory_ms"] is not None  # /dev/shm exists on every machine the tests run on
    if "seccomp" in res["mechanisms"]:
        assert set(res["overhead_shares_ms"]) == set(VARIANTS)
        assert res["overhead_shares_ms"]["full"] > 0
    assert len(res["load_avg_1m"]) == 2
    text = "\n".join(format_lines(res))
    assert "restore in memory" in text and "load average" in text
