"""Which process this is in a ``torchrun`` job, and the few collectives capstack uses.

capstack never schedules processes itself: ``torchrun`` (or ``srun`` running
``torchrun``) starts them and sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``;
:func:`join` reads them and joins the process group (NCCL on GPUs, gloo on the
CPU). Everything else receives the resulting :class:`Ranks` as an argument, so
no loop reads global state; a plain ``python``/``capstack`` process is rank 0
of a world of 1, for which every collective here is the identity.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from pipeline.core.errors import CapstackError

if TYPE_CHECKING:
    import torch

# Ranks wait for each other at the end of a sharded extraction and at every validation:
# longer than torch's default (10 to 30 min) so a slow shard is not taken for a dead rank.
WAIT = timedelta(hours=2)


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes checkpoints, logs, pictures and merged stores."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def share(self, n: int) -> slice:
        """This rank's contiguous part of ``n`` items (sizes differ by at most one, rank order)."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (self.rank < extra))

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist
            dist.barrier()

    def sum(self, values):
        """Element-wise sum over ranks of a tensor (returned, the input left alone); on the
        GPU when the ranks talk over NCCL."""
        if not self.distributed:
            return values
        import torch.distributed as dist
        total = values.clone()
        dist.all_reduce(total)
        return total

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (picklable objects)."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def device(self, requested: str | None) -> "torch.device":
        """The torch device of this rank: ``cuda`` means ``cuda:LOCAL_RANK`` under torchrun."""
        import torch

        name = requested or "auto"
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            device = torch.device(name)
        except (RuntimeError, ValueError, TypeError):
            raise CapstackError(f"device: unknown device {requested!r} (auto, cpu, cuda, "
                                f"cuda:N, mps)") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise CapstackError(f"device {requested!r} asked for, but no CUDA device is "
                                    f"available")
            if device.index is None:
                device = torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return device


def environment_ranks(env: Mapping[str, str] | None = None) -> Ranks:
    """Rank, world size and local rank as torchrun sets them (rank 0 of 1 otherwise)."""
    env = os.environ if env is None else env
    try:
        return Ranks(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)),
                     int(env.get("LOCAL_RANK", 0)))
    except ValueError:
        raise CapstackError(f"RANK/WORLD_SIZE/LOCAL_RANK: not integers ({env.get('RANK')!r}, "
                            f"{env.get('WORLD_SIZE')!r}, {env.get('LOCAL_RANK')!r})") from None


@contextmanager
def join(device_type: str = "cpu") -> Iterator[Ranks]:
    """Join torchrun's process group for the ``with`` block (nothing to join in a world of 1).

    NCCL when the ranks compute on GPUs, gloo on the CPU. Each rank also turns on Python's
    fault handler: a rank that aborts in C++ (gloo, NCCL) prints where its Python was, not
    just torchrun's "exitcode -6".
    """
    ranks = environment_ranks()
    if not ranks.distributed:
        yield ranks
        return
    import faulthandler

    import torch
    import torch.distributed as dist

    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)

    if dist.is_initialized():  # an enclosing block joined already
        yield ranks
        return
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(ranks.local_rank % torch.cuda.device_count())
    dist.init_process_group(backend, timeout=WAIT)
    try:
        yield ranks
        # every rank done with its collectives before any takes the group down: a rank whose
        # peer (rank 0 holds the store) went first could abort at exit in gloo's threads
        dist.barrier()
    finally:
        dist.destroy_process_group()


def pick_device(name: str | None = None) -> "torch.device":
    """``name`` (``auto``/None: cuda when available); under torchrun ``cuda`` is this rank's GPU.
    Refused when CUDA is asked for and absent."""
    return environment_ranks().device(name)
