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
    dev = resolve_device(device)
    model.to(dev)
    model.set_precision(DTYPES[dtype])
    fast_float32_matmul(dev)
    return model


def fast_float32_matmul(device: torch.device) -> None:
    """On CUDA, float32 matmuls and convolutions in TF32 (10-bit mantissa inputs, float32
    accumulation): several times the float32 throughput of an A100 / H100, and well within
    what RL on sampled images resolves. Chains, log-probs and losses stay float32 tensors.
    A process-wide switch of torch's; nothing changes on the CPU."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def peak_memory_line(device: torch.device) -> str:
    """'peak GPU memory: X GiB' on CUDA (since the last reset), '' elsewhere."""
    if device.type != "cuda":
        return ""
    return f"peak GPU memory: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
