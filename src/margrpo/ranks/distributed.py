"""Data-parallel training and evaluation over torch.distributed ranks (torchrun, one node or
several; margrpo/ranks/launch.py starts them).

Every rank runs the same program from the same shared generators, so every rank draws the
same global prompt list, image seeds and loss plan; `World.shard` then gives each rank a
contiguous block of WHOLE groups (train.prompts_per_step % nproc == 0), so rewards and
group advantages are exact. The per-image draws (rollout noise, multi-trajectory chains)
are keyed by the image seeds (models/noise.py), so an image draws the same numbers on any
rank. Gradients are summed over ranks (`all_reduce_grads`): the loss normaliser is global,
so the sum is the gradient of the global batch. Rank 0 alone logs and writes files.

With one process (`World()`, no process group) every method is a no-op: the numbers of a
single-process run are bitwise those of the code without this module.

Evaluation (`map_batches`): fixed batches of the flat image list are dealt round-robin to
the ranks; a batch holds the same images as in a single-process run, so batched matmuls
round alike and every per-image score is exactly the single-process one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

import torch
import torch.distributed as dist

from margrpo.models.device import resolve_device
# torch-free, so that a stage's launching process imports no torch (launch.py)
from margrpo.ranks.launch import check_shardable, under_torchrun

__all__ = ["World", "check_launch", "check_shardable", "current", "init", "map_batches", "my_batches", "shutdown"]

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the ranks; the default is a single process."""

    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where collectives run

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> slice:
        """This rank's contiguous block of n items (n % size == 0)."""
        if n % self.size:
            raise ValueError(f"{n} items do not split evenly over {self.size} ranks")
        k = n // self.size
        return slice(self.rank * k, (self.rank + 1) * k)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums of floats over ranks (float64; one collective)."""
        if self.size == 1:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's `obj` (picklable), in rank order."""
        if self.size == 1:
            return [obj]
        out: list = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def cat(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's tensor (the same shape on each), concatenated in rank order along dim 0."""
        if self.size == 1:
            return t
        parts = [torch.empty_like(t, device=self.device) for _ in range(self.size)]
        dist.all_gather(parts, t.to(self.device))
        return torch.cat(parts).to(t.device)

    def all_reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum .grad over ranks, in one flat buffer. A parameter with a gradient on any rank
        gets one on every rank (zeros where it had none), so that all ranks step alike; one
        with none anywhere keeps None, as in a single process (AdamW skips it)."""
        if self.size == 1:
            return
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=self.device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        used = [p for p, h in zip(params, has.tolist()) if h]
        if not used:
            return
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in used])
        flat = flat.to(self.device)
        dist.all_reduce(flat)
        offset = 0
        for p in used:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.device)
            offset += n

    def broadcast_params(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Rank 0's values into every rank's parameters (all ranks start alike)."""
        if self.size == 1:
            return
        with torch.no_grad():
            for p in params:
                buf = p.detach().to(self.device)
                dist.broadcast(buf, src=0)
                p.copy_(buf)


def current() -> World:
    """The World of this process: the torch.distributed group when one is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    return World(dist.get_rank(), dist.get_world_size(), device)


def init(device: str) -> World:
    """Join torchrun's process group (NCCL on CUDA, gloo on the CPU), one GPU per local rank;
    a plain process stays a single-process World."""
    if not under_torchrun() or dist.is_initialized():
        return current()
    dev = resolve_device(device)
    if dev.type == "cuda":
        # the launching process did not look (it imports no torch): each rank checks
        check_launch(device, int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])))
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return current()


def check_launch(device: str, nproc: int) -> None:
    """One GPU per rank of this node on CUDA, checked in each rank (`init`) by PyTorch's count
    (pipeline/validate.py has checked the driver's count before any stage started)."""
    dev = resolve_device(device)
    if dev.type == "cuda" and torch.cuda.device_count() < nproc:
        raise ValueError(f"runtime.nproc={nproc} needs one GPU per process but PyTorch sees "
                         f"{torch.cuda.device_count()}; lower runtime.nproc or set CUDA_VISIBLE_DEVICES")


def shutdown() -> None:
    """Leave the process group (at the end of a rank's work)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def my_batches(n: int, batch_size: int, world: World) -> list[slice]:
    """This rank's batches of n items: batch j, [j * batch_size, (j + 1) * batch_size), goes
    to rank j % size."""
    return [slice(s, min(s + batch_size, n)) for s in range(world.rank * batch_size, n, world.size * batch_size)]


def map_batches(fn: Callable[[slice], T], n: int, batch_size: int, world: World | None = None) -> list[T]:
    """fn(slice) of every batch of n items (`my_batches` on each rank); returns all
    batches' results in batch order, on every rank."""
    world = world or current()
    mine = [fn(s) for s in my_batches(n, batch_size, world)]
    if world.size == 1:
        return mine
    per_rank = world.all_gather(mine)
    return [per_rank[j % world.size][j // world.size] for j in range(-(-n // batch_size))]
