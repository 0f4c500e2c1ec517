"""`python -m kernels.gpu_check` runs without a GPU (Triton interpreter, tiny shapes) and
prints the same report; here the Triton kernels come out invariant and stock does not."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the GPU check under the Triton interpreter

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_runs_on_cpu_with_the_interpreter():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "tttr.kernels.gpu_check", "--cpu", "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["tiny"] is True
    res = report["dtypes"]["float32"]
    for shape, entry in res["linear"].items():
        assert entry["triton_bad_batches"] == [], shape
        assert entry["max_abs_err_vs_stock"] < 1e-4
    assert all(e["triton_bad_batches"] == [] for e in res["rows"].values())
    assert res["attention"]["prefill_vs_chunked_identical"]
    assert res["attention"]["prefill_vs_decode_identical"]
    from tttr.kernels.gpu_check import lines

    text = "\n".join(lines(report))
    assert "[float32] invariance over batch sizes" in text and "attention" in text
