"""`tttr bench engine`'s report: the bests against the targets, and each round's ratio so a
reader sees how much the machine moved during the run."""

from tttr.engine.inference.bench import format_report


def _result(**kw):
    r = {"model": "m", "kernel_mode": "fast", "tokens": 100, "rounds": 3, "threads": 2,
         "single_stream_tok_s": 30.0, "batch8_tok_s": 126.0, "batch8_vs_single": 4.2,
         "reference": "measured", "reference_tok_s": 22.0, "ratio_vs_reference": 1.36,
         "rounds_single_tok_s": [30.0, 27.5, 24.0], "rounds_batch8_tok_s": [126.0, 120.0, 100.0],
         "rounds_reference_tok_s": [22.0, 20.0, 24.0], "cold_start_s": 2.46, "peak_rss_mib": 391}
    r.update(kw)
    return r


def test_report_prints_bests_targets_and_each_rounds_ratio():
    lines = format_report(_result()).splitlines()
    assert "30.00 tok/s" in lines[1]
    assert "(4.20x single-stream; target >= 4x)" in lines[2]
    assert "(single-stream is 1.36x; target >= 1.3x)" in lines[3]
    assert lines[4].startswith("single / reference by round: 1.36x 1.38x 1.00x")
    assert lines[5] == "8-way / single by round: 4.20x 4.36x 4.17x"
    assert lines[6].startswith("cold start") and "2.46 s" in lines[6] and "peak RSS 391 MiB" in lines[6]
    assert "target <= 0.81 s, <= 406 MiB" in lines[6]


def test_report_without_the_cold_start_leaves_its_line_out():
    lines = format_report(_result(cold_start_s=None, peak_rss_mib=None)).splitlines()
    assert len(lines) == 6 and not any(line.startswith("cold start") for line in lines)


def test_cold_start_runs_generate_on_the_bench_model():
    import sys

    from tttr.engine.inference.bench import generate_command

    assert generate_command("/m.gguf") == [sys.executable, "-m", "tttr.app", "generate", "Hello", "--max-tokens", "1",
                                           "--model", "/m.gguf"]
    assert generate_command(None)[-1] == "1"


def test_a_process_peak_is_its_own_not_the_benchs():
    """A child's peak RSS counts the memory it touched, not the bench process it started from
    (which holds torch and the tests' models: hundreds of MiB), whatever its size."""
    import sys

    import torch

    from tttr.engine.inference.bench import measure_process

    ballast = torch.ones(64 << 20)  # this process: 256 MiB more than it had
    for mib in (32, 160):
        seconds, peak = measure_process([sys.executable, "-c",
                                         f"x = bytearray({mib} << 20)\nx[::4096] = b'1' * len(x[::4096])"])
        assert seconds > 0 and mib <= peak < mib + 64, (mib, peak)
    assert ballast.sum() == 64 << 20


def test_cold_start_names_a_failing_command():
    import sys

    import pytest

    from tttr.engine.inference.bench import measure_process

    with pytest.raises(RuntimeError, match="exited 3: no model here"):
        measure_process([sys.executable, "-c", "import sys; print('no model here', file=sys.stderr); sys.exit(3)"])
