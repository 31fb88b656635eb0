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

Which algorithm moved the broadcast and the reduce is on the trace too (``algorithms``): on real GPUs PyTorch hands
them to NCCL where ``torch.cuda.nccl.is_available`` says so, which passes them along a chain of devices; virtual
devices play PyTorch's copies by default, or NCCL's chain inside ``gpulab.virtual.playing("nccl")``
(``gpulab.transfers.ROUTES`` says how each algorithm routes each stage). ``counted_step`` counts a step under either
algorithm on any machine, on the meta device; ``stage_table`` sets them side by side, per stage, all links and
device 0's link, with the PyTorch lines each algorithm comes from.

The record is plain data on the trace (``transfers``, ``by_stage()``, ``by_link()``, ``to_dict()``), like
``gpulab.memory``'s, so tests and graders assert on numbers; ``gpulab.plots.plot_traffic`` draws it per link.
The modules stack without a circle: ``transfers`` (the record) <- ``virtual`` <- ``data_parallel`` <- this one.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from gpulab import cuda_traffic, virtual
from gpulab.data_parallel import DataParallel
from gpulab.messages import message
from gpulab.transfers import (
    ALGORITHMS,
    DATA_PARALLEL_STAGES,
    HOST,
    SOURCES,
    TrafficTrace,
    Transfer,
    add,
    collecting,
    nbytes,
    note,
    recording,
)

__all__ = [
    "ALGORITHMS",
    "DATA_PARALLEL_STAGES",
    "HOST",
    "TrafficTrace",
    "Transfer",
    "counted_step",
    "data_parallel_step",
    "nbytes",
    "note",
    "record",
    "record_all_reduce",
    "recording",
    "stage_table",
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


def counted_step(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Any, n_devices: int, algorithm: str
) -> TrafficTrace:
    """What each link carries in one DataParallel training step on ``n_devices`` devices, the broadcast and the reduce
    moved as ``algorithm`` moves them (``"copy"``: PyTorch without NCCL; ``"nccl"``: as on GPUs), lesson 03.

    Counted on any machine, the same way: gpulab's DataParallel runs on virtual devices backed by the meta device
    (shapes, no data, no arithmetic), on copies of ``model``, ``inputs`` and ``targets``, which are left as they
    are. A batch may be a view of any size (``inputs[:1].expand(4096, -1)``): nothing of it is allocated.
    """
    # The module, not gpulab.devices (the function of the same name that the package exports).
    devices_module = importlib.import_module("gpulab.devices")

    meta = torch.device("meta")
    chosen = devices_module.Devices(range(n_devices), virtual=True, primary=meta, reason="counting on the meta device")
    parallel = DataParallel(copy.deepcopy(model).to(meta), device_ids=chosen)
    with virtual.playing(algorithm), record() as trace:
        loss_fn(parallel(inputs.to(meta)), targets.to(meta)).backward()
    return trace


def stage_table(steps: Mapping[str, TrafficTrace], device: int = 0) -> str:
    """MiB per stage of one step under each algorithm: the bytes of all links together, then those of ``device``'s
    link; then, per algorithm, what it does and where PyTorch takes it (``gpulab.transfers.SOURCES``), in the
    lesson's language (lesson 03). ``steps``: ``{algorithm: trace}``, as ``counted_step`` gives them."""
    names = list(steps)
    shown = "".join(f'"{name}"'.rjust(9) for name in names)  # the algorithms as the exercise names them: values
    lines = [message("traffic.table_header", device=device), " " * 14 + shown + " |" + shown]
    for stage in DATA_PARALLEL_STAGES:
        totals = "".join(f"{steps[name].total(stage) / 2**20:9.2f}" for name in names)
        on_link = "".join(f"{steps[name].by_stage(device)[stage] / 2**20:9.2f}" for name in names)
        lines.append(f"{stage:<14}{totals} |{on_link}")
    lines += [f'"{name}": {message(f"traffic.algorithm_{name}")} ({SOURCES[name]})' for name in names]
    return "\n".join(lines)


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
