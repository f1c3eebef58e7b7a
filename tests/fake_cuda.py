"""A stand-in GPU for CPU-only machines: every tensor placed on it computes on the CPU with
real numbers, while PyTorch sees it on another device, so code that mixes devices fails
here as it would on CUDA.

PyTorch's FakeTensorMode can place tensors on a fake `cuda` device, but it holds no values
(`.item()`, `nonzero()` and any data-dependent branch raise) and, on a CPU-only build,
autograd aborts the process when it meets a CUDA tensor (no CUDA device guard). This
harness instead registers PyTorch's spare accelerator slot (PrivateUse1) under the name
`fakecuda`, with the Python device guard torch.utils.backend_registration provides, and
wraps real CPU tensors in `OnFakeCuda`: tensors whose `.device` is `fakecuda:0`.

`fake_cuda()` (a context manager) routes every op through `_run`, which
- runs the op on the wrapped CPU tensors and wraps the results again;
- raises `DeviceMixError` where CUDA would raise: a CPU tensor with at least one dimension
  meets a fake-CUDA one (0-dim CPU tensors are scalars and allowed, as on CUDA), or a
  factory call on the fake device draws from a CPU `torch.Generator`;
- lets through what CUDA allows across devices: copies (`.to`, `.cpu()`, `copy_`) and
  advanced indexing of a GPU tensor with CPU index tensors (a host-to-device copy on CUDA).
`MIXES` records every such indexing with the project line that did it, so a test can also
demand that none happen. Attention runs the kernel the CPU would pick (`_attention`), so a
step on the stand-in computes the CPU's numbers. Exercised in float32 only.
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils._python_dispatch import TorchDispatchMode

NAME = "fakecuda"
CPU = torch.device("cpu")
aten = torch.ops.aten
# Ops that CUDA runs with CPU and GPU tensors among their operands: copies, and indexing
# with CPU index tensors (copied to the device first).
CROSS_DEVICE_COPIES = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default,
                       aten._copy_from_and_resize.default}
CPU_INDEX_OK = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
MIXES: list[str] = []


class DeviceMixError(RuntimeError):
    """A CPU tensor met a (fake) CUDA tensor in an op CUDA would refuse."""


def register() -> None:
    """Register the `fakecuda` device once per process (PyTorch allows one such name)."""
    name = torch._C._get_privateuse1_backend_name()
    if name == NAME:
        return
    if name != "privateuseone":
        raise RuntimeError(f"the PrivateUse1 device is already registered as {name!r}; run this test alone")
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(NAME, backend_module=_Backend())


class _Backend:
    """`torch.fakecuda`: what autocast and torch.utils.checkpoint ask a device module for.
    The device draws from the CPU generator (factory calls run on the CPU), whose state
    checkpoint saves and restores itself, so the device's own RNG state is empty."""

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.bfloat16]

    def device(self, index):
        return contextlib.nullcontext()

    def get_rng_state(self, device=None) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8)

    def set_rng_state(self, state, device=None) -> None:
        pass


def _attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """scaled_dot_product_attention on the fake device with the kernel the CPU would pick
    (PyTorch falls back to its reference kernel on an unknown device, whose rounding
    differs), so the fake device computes exactly what the CPU computes."""
    inner = [t.inner if isinstance(t, OnFakeCuda) else t for t in (q, k, v, attn_mask)]
    choice = torch._fused_sdp_choice(*inner[:3], attn_mask=inner[3], dropout_p=dropout_p, is_causal=is_causal,
                                     scale=scale, enable_gqa=enable_gqa)
    if choice == int(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # as PyTorch converts it for this kernel
            attn_mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~attn_mask, -math.inf)
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, attn_mask=attn_mask,
                                                                scale=scale)[0]
    return aten._scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                                                   enable_gqa=enable_gqa)[0]


# The device exists once registered: importing this module registers it.
register()
DEVICE = torch.device(NAME, 0)
_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("scaled_dot_product_attention", _attention, "AutogradPrivateUse1")


class OnFakeCuda(torch.Tensor):
    """A CPU tensor (`inner`) that PyTorch sees on `fakecuda:0`."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                device=DEVICE, requires_grad=inner.requires_grad)
        r.inner = inner
        return r

    def __repr__(self) -> str:
        return f"OnFakeCuda({self.inner!r})"

    def tolist(self):
        return self.inner.tolist()  # CUDA tensors allow it too (a copy to the host)

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return OnFakeCuda(inner_tensors["inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _is_fake_device(d) -> bool:
    return isinstance(d, (torch.device, str)) and torch.device(d).type == NAME


def _run(func, args, kwargs):
    seen: set[str] = set()

    def unwrap(x):
        if isinstance(x, OnFakeCuda):
            seen.add(NAME)
            return x.inner
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            seen.add(x.device.type)
        return x

    a, k = tree_map(unwrap, (args, kwargs))
    wrap = NAME in seen
    target = k.get("device")
    if target is not None and _is_fake_device(target):
        k["device"], wrap = CPU, True
        gen = k.get("generator")
        if gen is not None:
            raise DeviceMixError(f"{func}: draws on the fake CUDA device from a CPU torch.Generator "
                                 "(CUDA refuses a generator of another device)")
    elif target is not None and torch.device(target).type == "cpu":
        wrap = False
    if NAME in seen and "cpu" in seen and func not in CROSS_DEVICE_COPIES:
        if func in CPU_INDEX_OK:
            MIXES.append(f"{func} at {_caller()}")
        else:
            shapes = [(tuple(x.shape), x.device.type) for x in tree_leaves((args, kwargs))
                      if isinstance(x, torch.Tensor)]
            raise DeviceMixError(f"{func} at {_caller()}: a CPU tensor meets a CUDA tensor; operands {shapes}")
    out = func(*a, **k)
    mutated = _mutated_argument(func, args, kwargs)
    if mutated is not None:
        return mutated
    if not wrap:
        return out
    return tree_map(lambda x: OnFakeCuda(x) if isinstance(x, torch.Tensor) and not isinstance(x, OnFakeCuda) else x, out)


def _caller() -> str:
    """file:line of the innermost project frame (src/margrpo or pipeline) that led here."""
    import traceback

    frames = [f for f in traceback.extract_stack() if "/margrpo/" in f.filename or "/pipeline/" in f.filename]
    return f"{frames[-1].filename.rsplit('/src/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"


def _mutated_argument(func, args, kwargs):
    """The argument an in-place / out= op returns (its result must be that very object)."""
    schema = func._schema
    if len(schema.returns) != 1 or schema.returns[0].alias_info is None or not schema.returns[0].alias_info.is_write:
        return None
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            return args[i] if i < len(args) else kwargs.get(arg.name)
    return None


class _Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


@contextlib.contextmanager
def fake_cuda():
    """Inside: factory calls on `DEVICE` and `.to(DEVICE)` give OnFakeCuda tensors, and
    every op checks its operands' devices (the module docstring)."""
    MIXES.clear()
    # torch.tensor(data, device=...) builds on the CPU, then moves the tensor under the mode
    # (as FakeTensorMode does); without this it would allocate on the fake backend directly.
    lift = torch._C._only_lift_cpu_tensors()
    torch._C._set_only_lift_cpu_tensors(True)
    try:
        with _Mode():
            yield DEVICE
    finally:
        torch._C._set_only_lift_cpu_tensors(lift)
