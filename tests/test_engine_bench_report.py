"""`tttr bench engine`'s report: the bests against the targets, and each round's ratio so a
reader sees how much the machine moved during the run."""

from tttr.engine.bench.engine import format_report


def _result(**kw):
    r = {"model": "m", "kernel_mode": "fast", "tokens": 100, "rounds": 3, "threads": 2,
         "single_stream_tok_s": 30.0, "batch8_tok_s": 126.0, "batch8_vs_single": 4.2,
         "reference": "measured", "reference_tok_s": 22.0, "ratio_vs_reference": 1.36,
         "rounds_single_tok_s": [30.0, 27.5, 24.0], "rounds_batch8_tok_s": [126.0, 120.0, 100.0],
         "rounds_reference_tok_s": [22.0, 20.0, 24.0], "cold_start_s": 2.46, "peak_rss_mib": 391,
         "llama_cpp": "not installed", "llama_cpp_tok_s": None, "greedy_agreement": None,
         "llama_cpp_cold_start_s": None}
    r.update(kw)
    return r


def _with_llama_cpp(**kw):
    agree = [{"prompt": "a", "identical": True, "first_difference": None},
             {"prompt": "b", "identical": False, "first_difference": 17},
             {"prompt": "c", "identical": True, "first_difference": None}]
    return _result(llama_cpp="measured", llama_cpp_tok_s=60.0, ratio_vs_llama_cpp=0.5, batch8_vs_llama_cpp=2.1,
                   rounds_llama_cpp_tok_s=[60.0, 55.0, 48.0], llama_cpp_cold_start_s=0.5,
                   llama_cpp_cold_peak_rss_mib=200,
                   greedy_agreement={"bench_prompt": {"identical": False, "first_difference": 42}, "prompts": agree},
                   **kw)


def test_report_prints_bests_targets_and_each_rounds_ratio():
    lines = format_report(_result()).splitlines()
    assert "30.00 tok/s" in lines[1]
    assert "(4.20x single-stream; target >= 4x)" in lines[2]
    assert "(single-stream is 1.36x; target >= 1.3x)" in lines[3]
    assert lines[4].startswith("single / reference by round: 1.36x 1.38x 1.00x")
    assert lines[6] == "8-way / single by round: 4.20x 4.36x 4.17x"
    assert lines[7].startswith("cold start") and "2.46 s" in lines[7] and "peak RSS 391 MiB" in lines[7]
    assert "target <= 0.81 s, <= 406 MiB" in lines[7]


def test_without_llama_cpp_one_line_says_it_was_not_measured_and_how_to_install_it():
    lines = format_report(_result()).splitlines()
    assert lines[5].startswith("llama.cpp reference      (not measured: llama-cpp-python is not installed; ")
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF' in lines[5] and "pip install llama-cpp-python" in lines[5]
    assert len(lines) == 8 and not any("greedy" in line or "llama.cpp cold" in line for line in lines)
    folder = format_report(_result(llama_cpp="skipped (llama.cpp loads GGUF files only)")).splitlines()
    assert folder[5] == "llama.cpp reference      (skipped (llama.cpp loads GGUF files only))"
    died = format_report(_result(llama_cpp="failed: llama.cpp reference exited -4: ")).splitlines()
    assert died[5] == "llama.cpp reference      (failed: llama.cpp reference exited -4: )"


def test_llama_cpp_is_a_second_reference_with_its_ratios_agreement_and_cold_start():
    lines = format_report(_with_llama_cpp()).splitlines()
    assert lines[3].startswith("transformers reference    22.00 tok/s")
    assert lines[5] == ("llama.cpp reference       60.00 tok/s   (single-stream is 0.50x, target >= 0.8x; "
                        "8-way aggregate is 2.10x, target >= 2x)")
    assert lines[6] == "single / llama.cpp by round: 0.50x 0.50x 0.50x"
    assert lines[7] == "8-way / single by round: 4.20x 4.36x 4.17x"
    assert lines[8] == ("greedy ids vs llama.cpp: 2/3 prompts identical over 30 tokens (first difference at: -, 17, -); "
                        "bench prompt over 100: first difference at token 42")
    assert lines[9].startswith("cold start")
    assert lines[10].startswith("llama.cpp cold start       0.50 s      peak RSS 200 MiB")
    assert "TTTR takes 4.92x its time, 1.96x its memory; target <= 1.5x, 2x" in lines[10]


def test_report_without_the_cold_start_leaves_its_line_out():
    lines = format_report(_result(cold_start_s=None, peak_rss_mib=None)).splitlines()
    assert len(lines) == 7 and not any(line.startswith("cold start") for line in lines)


def test_first_difference_of_two_id_lists():
    from tttr.engine.inference.llama_cpp_reference import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], []) is None


def test_cold_start_runs_generate_on_the_bench_model():
    import sys

    from tttr.engine.bench.engine import generate_command

    assert generate_command("/m.gguf") == [sys.executable, "-m", "tttr.app", "generate", "Hello", "--max-tokens", "1",
                                           "--kernels", "invariant", "--model", "/m.gguf"]
    assert generate_command(None, "invariant-q8")[-2:] == ["--kernels", "invariant-q8"]


def test_cold_start_processes_get_the_benchs_threads_and_kernels(monkeypatch):
    """`tttr bench engine --threads N` sets torch's count; the cold-start processes (ours and
    llama.cpp's) run with that many too, ours under the bench's kernel mode."""
    import torch

    from tttr.engine.bench import engine as bench

    seen = []
    monkeypatch.setattr(bench, "measure_process", lambda cmd, env=None: seen.append((cmd, env)) or (1.0, 100.0))
    monkeypatch.setattr(bench.lcpp, "cold_command", lambda path, threads: ["llama", str(threads)])
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        bench.cold_start("/m.gguf", runs=1, llama_cpp_path="/m.gguf", kernels="invariant-q8")
    finally:
        torch.set_num_threads(before)
    ours = [(cmd, env) for cmd, env in seen if cmd[0] != "llama"]
    assert len(ours) == bench.WARM_RUNS + 1 and ["llama", "3"] in [cmd for cmd, _ in seen]
    assert all(env["OMP_NUM_THREADS"] == "3" and cmd[cmd.index("--kernels") + 1] == "invariant-q8" for cmd, env in ours)


def test_a_process_peak_is_its_own_not_the_benchs():
    """A child's peak RSS counts the memory it touched, not the bench process it started from
    (which holds torch and the tests' models: hundreds of MiB), whatever its size."""
    import sys

    import torch

    from tttr.engine.bench.engine import measure_process

    ballast = torch.ones(64 << 20)  # this process: 256 MiB more than it had
    for mib in (32, 160):
        seconds, peak = measure_process([sys.executable, "-c",
                                         f"x = bytearray({mib} << 20)\nx[::4096] = b'1' * len(x[::4096])"])
        assert seconds > 0 and mib <= peak < mib + 64, (mib, peak)
    assert ballast.sum() == 64 << 20


def test_cold_start_names_a_failing_command():
    import sys

    import pytest

    from tttr.engine.bench.engine import measure_process

    with pytest.raises(RuntimeError, match="exited 3: no model here"):
        measure_process([sys.executable, "-c", "import sys; print('no model here', file=sys.stderr); sys.exit(3)"])
