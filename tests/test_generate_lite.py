"""The torch-free generation path (engine/inference/lite.py): the torch path's bits (tokens,
logprobs, top-k, logits digests: every field `tttr generate --json` prints) without loading
torch, on the default model, greedy and sampled, at 1 and 2 threads, under `invariant` and
`invariant-q8`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tttr.engine.inference import lite
from tttr.engine.inference.block_cache import BlockCache
from tttr.engine.inference.gguf_file import read_gguf
from tttr.engine.inference.loader import default_model_path
from tttr.engine.inference.model import load_model
from tttr.engine.inference.sampling import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence
from tttr.kernels import array_ops, ops
from tttr.kernels.mode import Q8, kernel_mode

pytestmark = pytest.mark.slow  # the default model

ROOT = Path(__file__).resolve().parents[1]
SAMPLINGS = (SamplingParams(), SamplingParams(temperature=0.8, seed=7), SamplingParams(temperature=1.3, seed=3))


@pytest.fixture(scope="module")
def models():
    """(the torch model, the torch-free one): loading the first leaves the rotary tables the
    second reads."""
    model = load_model(default_model_path())
    small = lite.load(default_model_path())
    assert small is not None, "the torch-free path does not apply to the default model"
    return model, small


@pytest.fixture(scope="module")
def q8_small(models):
    small = lite.load(default_model_path(), Q8)
    assert small is not None and small.mode == Q8, "the torch-free path does not run the default model under q8"
    return small


def _engine(model, ids, sampling, n, mode="invariant"):
    with kernel_mode(mode):
        with Engine(model) as engine:
            return [r.to_json() for r in engine.generate([Sequence(ids, sampling, n)])[0]]


@pytest.mark.parametrize("mode", ["invariant", Q8])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_same_records_as_the_engine(models, threads, mode, monkeypatch, request):
    model, small = models
    if mode == Q8:
        small = request.getfixturevalue("q8_small")
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    torch.set_num_threads(threads)
    tok = small.tokenizer
    prompts = [tok.encode("The capital of France is"), tok.encode("Hello"),
               tok.encode(tok.apply_chat_template([{"role": "user", "content": "List three colours."}]))]
    lengths = []
    for ids in prompts:
        for sampling in SAMPLINGS:
            ours = [r.to_json() for r in lite.generate(small, ids, sampling, 8)]
            assert ours == _engine(model, ids, sampling, 8, mode), (ids, sampling)
            assert {r["mode"] for r in ours} == {mode}
            lengths.append(len(ours))
    assert max(lengths) == 8 and min(lengths) >= 1  # prefills of 1 to ~30 rows, then decode steps


@pytest.mark.parametrize("mode", ["invariant", Q8])
def test_the_command_prints_the_engines_records_without_loading_torch(models, mode):
    model, small = models
    code = ("import sys\nfrom tttr.app.cli import main\n"
            "rc = main(['generate', 'List three colours.', '--chat', '--json', '--temperature', '0.8', '--seed', '5',"
            f" '--max-tokens', '6', '--kernels', '{mode}'])\n"
            "sys.stdout.flush()\nprint('torch loaded:', 'torch' in sys.modules, file=sys.stderr)\nsys.exit(rc)\n")
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "torch loaded: False" in out.stderr
    printed = [json.loads(line) for line in out.stdout.splitlines()]
    tok = small.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "List three colours."}]))
    assert printed == _engine(model, ids, SamplingParams(temperature=0.8, seed=5), 6, mode)
    assert printed and all(r["mode"] == mode for r in printed)


def test_q8_differs_from_invariant_where_its_products_round_the_activations(models, q8_small):
    _, small = models
    ids = small.tokenizer.encode("The capital of France is")
    fp32, q8 = (lite.generate(m, ids, SamplingParams(), 8) for m in (small, q8_small))
    assert [r.digest for r in fp32] != [r.digest for r in q8]


def test_the_fingerprint_is_the_engines_but_torchs_own_fields(models, q8_small, monkeypatch):
    """The torch-free path names the kernels it runs (q8's included) as the engine's run
    fingerprint does, with the same values; torch's own fields are None, and computing it
    loads no torch."""
    from tttr.engine.inference.fingerprint import TORCH_ONLY

    model, _ = models
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine_fp, lite_fp = model.fingerprint(), q8_small.fingerprint()
    finally:
        torch.set_num_threads(before)
    assert list(lite_fp) == list(engine_fp)
    assert {k: v for k, v in lite_fp.items() if k not in TORCH_ONLY} == \
           {k: v for k, v in engine_fp.items() if k not in TORCH_ONLY}
    assert all(lite_fp[k] is None for k in TORCH_ONLY) and engine_fp["torch"] == torch.__version__
    assert lite_fp["q8_kernel"].startswith("q8:") and lite_fp["threads"] == 2
    code = ("import sys\nfrom tttr.engine.inference import lite\nfrom pathlib import Path\n"
            f"m = lite.load(Path({str(default_model_path())!r}), 'invariant-q8')\n"
            "fp = m.fingerprint()\nprint(fp['q8_kernel'], 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [lite_fp["q8_kernel"], "False"]


def test_what_needs_torch_is_left_to_it(models):
    _, small = models
    assert lite.load(default_model_path(), "fast") is None
    ids = small.tokenizer.encode("Hello")
    assert lite.generate(small, ids, SamplingParams(temperature=0.8, top_k=5), 4) is None
    assert lite.generate(small, ids, SamplingParams(temperature=0.8, top_p=0.9), 4) is None
    assert lite.generate(small, [], SamplingParams(), 4) is None
    assert lite.generate(small, ids, SamplingParams(), small.config.context_length) is None  # past the context


def test_mapped_blocks_are_the_packed_blocks(models):
    """A second load maps the blocks the first packed: the same bytes in the same parts."""
    g = read_gguf(default_model_path())
    names = ["model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight",
             "model.layers.3.self_attn.v_proj.weight"]
    mapped = BlockCache(default_model_path(), g.quantized).weight(names)
    packed = array_ops.block_weights([g.quantized[n] for n in names])
    assert mapped.shape == packed.shape
    assert [(f, d.tobytes()) for f, d in array_ops.weight_parts(mapped)] == \
           [(f, d.tobytes()) for f, d in array_ops.weight_parts(packed)]
    assert not array_ops.weight_parts(mapped)[0][1].flags.writeable  # a mapping, not a copy


def test_the_torch_model_maps_the_kept_blocks_and_computes_what_packed_ones_do(models, monkeypatch):
    """load_model takes the default model's blocks from the cache the torch-free path keeps;
    its logits are those of a model that packed them itself."""
    mapped = models[0]
    assert mapped.block_weights == 121
    assert not array_ops.weight_parts(mapped.layers[5].gate_up)[0][1].flags.writeable  # a mapping
    monkeypatch.setattr(BlockCache, "for_file", classmethod(lambda cls, path, quantized: None))
    packed = load_model(default_model_path())
    assert packed.block_weights == 121 and array_ops.weight_parts(packed.layers[5].gate_up)[0][1].flags.writeable
    ids = packed.tokenizer.encode("The capital of France is")
    with kernel_mode("invariant"):
        a = _engine(mapped, ids, SAMPLINGS[1], 6)
        b = _engine(packed, ids, SAMPLINGS[1], 6)
    assert a == b and len(a) == 6  # tokens, logprobs, top-k and logits digests


def test_compiled_softmaxes_are_row_invariant_and_close_to_torch():
    x = torch.randn(5, 49152, generator=torch.Generator().manual_seed(1)) * 6
    with kernel_mode("invariant"):
        full_log, full = ops.log_softmax(x), ops.softmax(x)
        for i in range(5):
            assert torch.equal(ops.log_softmax(x[i:i + 1].contiguous()), full_log[i:i + 1])
            assert torch.equal(ops.softmax(x[i:i + 1].contiguous()), full[i:i + 1])
    assert torch.allclose(full_log, torch.log_softmax(x, -1), atol=1e-4, rtol=1e-5)
    assert torch.allclose(full, torch.softmax(x, -1), atol=1e-7, rtol=1e-4)
    assert np.array_equal(array_ops.log_softmax(x.numpy(), 2), full_log.numpy())  # the torch-free call: same bits
