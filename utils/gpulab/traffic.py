"""Traffic between devices: every copy a data-parallel step makes, with its stage, its link and its bytes.

Lesson 03 measures what DataParallel and DDP move, because bytes can be counted exactly on any machine while
step times on virtual devices cannot show scaling. ``record()`` collects, while it is open, every copy between
devices, as a ``Transfer(stage, source, destination, nbytes)`` (the stages are listed in ``gpulab.transfers``).

Where the copies are seen:

* **Virtual devices** (``gpulab.virtual``): each transfer function reports its own copies, so the record is
  exact bookkeeping of what the algorithm moves (the data never leaves the one physical device).
* **Real GPUs** (``torch.nn.DataParallel``): ``gpulab.cuda_traffic`` wraps PyTorch's own copy functions while
  the record is open, counts their copies and times them with CUDA events on the devices and streams that copy.
  Not run on a GPU.
* **DDP** (``record_all_reduce(ddp_model, trace)``): a communication hook notes each bucket DDP all-reduces, then
  runs PyTorch's default all-reduce hook. What the backend then sends over the wire is its algorithm's business:
  gloo's all-reduce of CPU tensors is a ring (lesson 03 explains it and counts its bytes).

The record is plain data on the trace (``transfers``, ``by_stage()``, ``by_link()``, ``to_dict()``), like
``gpulab.memory``'s, so tests and graders assert on numbers; ``gpulab.plots.plot_traffic`` draws it per link.
The modules stack without a circle: ``transfers`` (the record) <- ``virtual`` <- ``data_parallel`` <- this one.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch

from gpulab import cuda_traffic
from gpulab.data_parallel import DataParallel
from gpulab.transfers import (
    DATA_PARALLEL_STAGES,
    HOST,
    TrafficTrace,
    Transfer,
    add,
    collecting,
    nbytes,
    note,
    recording,
)

__all__ = [
    "DATA_PARALLEL_STAGES",
    "HOST",
    "TrafficTrace",
    "Transfer",
    "data_parallel_step",
    "nbytes",
    "note",
    "record",
    "record_all_reduce",
    "recording",
]


@contextlib.contextmanager
def record() -> Iterator[TrafficTrace]:
    """Record every transfer between devices in the block (lesson 03)::

    with gpulab.traffic.record() as traffic:
        loss = loss_fn(parallel(x), y)
        loss.backward()
    traffic.by_stage()   # {"scatter": ..., "broadcast": ..., "gather": ..., "grad_scatter": ..., "reduce": ...}
    """
    trace = TrafficTrace()
    with contextlib.ExitStack() as stack:
        if torch.cuda.device_count() >= 2:
            stack.enter_context(cuda_traffic.wrapped(trace))
        stack.enter_context(collecting(trace))
        yield trace


def data_parallel_step(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Any, n_devices: int
) -> TrafficTrace:
    """The traffic of one DataParallel training step on ``n_devices`` (lesson 03's self-checks and tests).

    ``model``, ``inputs`` and ``targets`` go to device 0 (the batch "after ``x.cuda()``"); the step is
    ``loss_fn(DataParallel(model)(inputs), targets).backward()``, the loss computed on device 0. Uses
    ``gpulab.devices(n_devices, remember=False)`` for the step: the lesson's own choice of devices stays as it was.
    """
    # The module, not gpulab.devices (the function of the same name that the package exports).
    devices_module = importlib.import_module("gpulab.devices")

    chosen = devices_module.devices(n_devices, quiet=True, remember=False)
    model = model.to(chosen.primary)
    parallel = DataParallel(model, device_ids=chosen)
    x, y = inputs.to(chosen.primary), targets.to(chosen.primary)
    with record() as trace:
        loss_fn(parallel(x), y).backward()
    return trace


# ------------------------------------------------------------------------------------------------ DDP's all-reduce
def record_all_reduce(ddp_model: Any, trace: TrafficTrace, rank: int | None = None) -> None:
    """Note every gradient bucket ``ddp_model`` all-reduces in ``trace``, then all-reduce it as DDP does.

    Registers a DDP communication hook (call it before the first backward) that adds
    ``Transfer("all_reduce", rank, "all", bucket bytes)`` and returns PyTorch's default ``allreduce_hook``.
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    me = dist.get_rank() if rank is None else rank

    def counting_hook(state, bucket):
        buffer = bucket.buffer()
        add(trace, Transfer("all_reduce", me, "all", nbytes(buffer)))
        return default_hooks.allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(None, counting_hook)


# ------------------------------------------------------------------------------------------------ a ring, played
def ring_bytes_sent(chunk_sizes: list[int], bytes_per_element: int = 4) -> int:
    """Bytes all ranks together send in a ring all-reduce of a tensor cut into ``chunk_sizes`` (one chunk per rank),
    counted by playing the ring (lesson 03, "bytes as the devices add up"): rank r starts by sending chunk r, and
    each step every rank passes on what it last received; ``len(chunk_sizes) - 1`` steps of reduce-scatter, then as
    many of all-gather."""
    n = len(chunk_sizes)
    sent = 0
    for _phase in range(2):  # reduce-scatter, then all-gather
        for step in range(n - 1):
            for rank in range(n):
                sent += chunk_sizes[(rank - step) % n]
    return sent * bytes_per_element
