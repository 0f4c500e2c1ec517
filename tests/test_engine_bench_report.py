"""`tttr bench engine`'s report: the bests against the targets, and each round's ratio so a
reader sees how much the machine moved during the run."""

from tttr.engine.inference.bench import format_report


def _result(**kw):
    r = {"model": "m", "kernel_mode": "fast", "tokens": 100, "rounds": 3, "threads": 2,
         "single_stream_tok_s": 30.0, "batch8_tok_s": 126.0, "batch8_vs_single": 4.2,
         "reference": "measured", "reference_tok_s": 22.0, "ratio_vs_reference": 1.36,
         "rounds_single_tok_s": [30.0, 27.5, 24.0], "rounds_batch8_tok_s": [126.0, 120.0, 100.0],
         "rounds_reference_tok_s": [22.0, 20.0, 24.0]}
    r.update(kw)
    return r


def test_report_prints_bests_targets_and_each_rounds_ratio():
    lines = format_report(_result()).splitlines()
    assert "30.00 tok/s" in lines[1]
    assert "(4.20x single-stream; target >= 4x)" in lines[2]
    assert "(single-stream is 1.36x; target >= 1.3x)" in lines[3]
    assert lines[4].startswith("single / reference by round: 1.36x 1.38x 1.00x")
    assert lines[5] == "8-way / single by round: 4.20x 4.36x 4.17x"


def test_report_without_the_reference_says_how_to_get_it():
    text = format_report(_result(reference="not installed", reference_tok_s=None, ratio_vs_reference=None,
                                 rounds_reference_tok_s=None))
    assert "not installed: pip install transformers" in text
    assert "single / reference by round" not in text and "8-way / single by round: 4.20x" in text
