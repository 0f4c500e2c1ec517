"""What the arithmetic ran on, recorded once per run: library versions, device, CPU model
and the instruction-set flags that pick kernels, thread count, dtype, TTTR's own kernels.

`fingerprint` is the engine's (torch); `fingerprint_without_torch` the torch-free generation
path's (engine/inference/lite.py): the same fields with the same values where the arithmetic
is the same, and None for torch's own (its version, triton, BLAS, oneDNN), which that path
never runs. Importing this module does not import torch."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import TYPE_CHECKING

from tttr.engine.inference.digest import LOGITS_DIGEST
from tttr.kernels import array_ops

if TYPE_CHECKING:
    import torch

TORCH_ONLY = ("torch", "triton", "blas", "mkldnn")  # None in the torch-free path's fingerprint

# CPU flags that change which kernels MKL/oneDNN pick (and so the rounding of reductions).
_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl",
          "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "neon", "asimd", "sve")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu() -> tuple[str, list[str]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, [f for f in _FLAGS if f in flags]


def fingerprint_without_torch(threads: int) -> dict:
    """The torch-free path's fingerprint (CPU, fp32; `threads`: the count its kernels get)."""
    cpu_model, flags = _cpu()
    return {
        "torch": None,
        "triton": None,
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "platform": f"{platform.system()} {platform.machine()}",
        "device": "cpu",
        "device_name": cpu_model,
        "cpu_model": cpu_model,
        "cpu_flags": flags,
        "threads": threads,
        "blas": None,
        "mkldnn": None,
        "dtype": "float32",
        **array_ops.describe(),  # attention_kernel, linear_kernel, row_kernels, q8_kernel, kernels_revision
        "logits_digest": LOGITS_DIGEST,
    }


def fingerprint(device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> dict:
    import torch

    device = torch.device(device)
    fp = fingerprint_without_torch(torch.get_num_threads())
    fp.update(torch=torch.__version__, triton=_version("triton"), device=device.type,
              blas="mkl" if torch.backends.mkl.is_available() else "other", mkldnn=torch.backends.mkldnn.is_available(),
              dtype=str(torch.float32 if dtype is None else dtype).replace("torch.", ""))
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        fp.update(device_name=props.name, sm_count=props.multi_processor_count,
                  capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda)
    return fp
