"""Where and in what precision a model computes: params.yaml `runtime` applied to a model."""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    """runtime.device -> torch.device; `auto` is CUDA when PyTorch sees a GPU, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "runtime.device is 'cuda' but PyTorch sees no CUDA device (torch.cuda.is_available() is False): "
            "set runtime.device to auto or cpu, or install a CUDA build of PyTorch"
        )
    if name not in ("cpu", "cuda"):
        raise ValueError(f"runtime.device must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)


def place(model, device: str = "auto", dtype: str = "float32"):
    """Move `model` to the device and set the precision of its forward passes; returns it."""
    if dtype not in DTYPES:
        raise ValueError(f"runtime.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    model.to(resolve_device(device))
    model.set_precision(DTYPES[dtype])
    return model


def peak_memory_line(device: torch.device) -> str:
    """'peak GPU memory: X GiB' on CUDA (since the last reset), '' elsewhere."""
    if device.type != "cuda":
        return ""
    return f"peak GPU memory: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
