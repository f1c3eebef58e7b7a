"""Host reads of device values: `read_all` reads many scalars in one sync, and
`HostSyncCounter` counts the reads a block of code makes (the benchmark's host syncs).

A read of a tensor's value by Python (item, tolist, bool / float / int / index, nonzero,
boolean-mask indexing, torch.equal, a copy to the CPU) waits, on an accelerator, until the
device has computed that value: the host stalls and the device then idles until the host
queues more work. `HostSyncCounter` counts such reads made by the project's own code while it
is active, on any device, the CPU included, so that a change in their number shows without a
GPU:

- it is a TorchFunctionMode, so it sees every torch call and tensor method of the block;
- a read counts when the tensor would live on the accelerator in a GPU run. Tensors the
  code makes on the CPU by design (a factory call without a `device`, such as the trainer's
  generator draws `torch.randperm(n, generator=g)`; a `.cpu()` copy) and what is computed
  from them alone are host tensors, whose reads cost nothing; every other tensor (a factory
  call given a device, a `.to(device)`, anything computed from a parameter or a device
  tensor) counts. The project writes its copies to the host as `.cpu()`: a `.to(device)`
  is taken for a move to the run's device, whatever that is in this run;
- tensors made before the block count as device tensors, except those passed as
  `host_tensors` (the samplers' noise tables, CPU tensors in every run);
- a read counts where the project's code makes it (its caller, past torch's dispatch
  wrappers, is in margrpo); reads inside torch's own code (the optimizer's CPU step
  counters) are torch's.

Not counted: synchronisations inside an op (an argument check on device values);
torch.cuda.set_sync_debug_mode reports those on a GPU (benchmarks/step_time.py uses it
there as well).
"""
from __future__ import annotations

import collections
import sys
import weakref
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

_READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "nonzero", "argwhere", "equal",
          "cpu", "numpy", "masked_select", "unique"}
_FACTORIES = {"arange", "empty", "full", "ones", "rand", "randint", "randn", "randperm", "tensor", "zeros",
              "as_tensor", "linspace"}
# torch's files that only route a call to __torch_function__ (a read seen there was made by their caller)
_DISPATCH = {str(Path(torch.__file__).resolve().parent / f)
             for f in ("overrides.py", "_tensor.py", "functional.py", "_jit_internal.py")}
_PROJECT_DIR = str(Path(__file__).resolve().parent)


class HostSyncCounter(TorchFunctionMode):
    """`with HostSyncCounter() as c: ...`; then c.total and c.sites ("file:line read" -> count)."""

    def __init__(self, host_tensors=(), code_dir: str | Path = _PROJECT_DIR) -> None:
        """host_tensors: tensors made before the block that live on the CPU in every run;
        code_dir: the reads of code under this folder count (default: the margrpo package)."""
        super().__init__()
        self._code_dir = str(Path(code_dir).resolve())
        self._host: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        for t in host_tensors:
            self._host[id(t)] = t
        self.sites: collections.Counter[str] = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    def _is_host(self, t: torch.Tensor) -> bool:
        return self._host.get(id(t)) is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if self._is_read(name, args, kwargs, tensors):
            site = _code_site(self._code_dir)
            if site is not None:
                self.sites[f"{site} {name}"] += 1
        out = func(*args, **kwargs)
        host = self._makes_host(name, kwargs, tensors, args)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                if host:
                    self._host[id(t)] = t
                else:  # `.to(device)` of a tensor already there returns the tensor itself
                    self._host.pop(id(t), None)
        return out

    def _is_read(self, name: str, args, kwargs, tensors: list[torch.Tensor]) -> bool:
        if not tensors:
            return False
        if name in _READS:
            return not self._is_host(tensors[0])
        if name in ("__getitem__", "__setitem__", "index_put_", "index_put"):
            # boolean-mask indexing sizes its result from the mask's values
            return any(t.dtype == torch.bool and not self._is_host(t) for t in tensors[1:])
        return False

    def _makes_host(self, name: str, kwargs, tensors: list[torch.Tensor], args) -> bool:
        if name == "cpu":
            return True
        if name in _FACTORIES:
            return kwargs.get("device") is None and all(self._is_host(t) for t in tensors)
        if name in ("to", "cuda", "new_tensor", "new_zeros", "new_ones", "new_full", "new_empty"):
            moved = name == "cuda" or kwargs.get("device") is not None or any(
                isinstance(a, (torch.device, str, torch.Tensor)) for a in args[1:])
            return not moved and bool(tensors) and self._is_host(tensors[0])
        return bool(tensors) and all(self._is_host(t) for t in tensors)


def _code_site(code_dir: str) -> str | None:
    """'file:line' of the code that made the read when it lies under code_dir, else None."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename in _DISPATCH or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(code_dir + "/"):
        return None
    return f"{Path(frame.f_code.co_filename).relative_to(code_dir).as_posix()}:{frame.f_lineno}"


def read_all(groups: dict[str, list[torch.Tensor]]) -> dict[str, list]:
    """The values of tensors, grouped by name, read from the device in one host sync: per
    group, one Python float per 0-dim tensor and one list of floats per other tensor
    (float64 on the way, which holds float32 and integer counts exactly)."""
    tensors = [v for vals in groups.values() for v in vals]
    flat = torch.cat([v.reshape(-1).double() for v in tensors]).tolist() if tensors else []
    out, at = {}, 0
    for k, vals in groups.items():
        out[k] = []
        for v in vals:
            n = v.numel()
            out[k].append(flat[at] if v.dim() == 0 else flat[at:at + n])
            at += n
    return out
