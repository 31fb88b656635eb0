"""Traffic between devices: every copy a data-parallel step makes, with its stage, its link and its bytes.

Lesson 03 measures what DataParallel and DDP move, because bytes can be counted exactly on any machine while
step times on virtual devices cannot show scaling. ``record()`` collects, while it is open, every copy between
devices, as a ``Transfer(stage, source, destination, nbytes, seconds)``:

* ``"scatter"``: a chunk of the batch sent from the source device (or the host) to a replica's device;
* ``"broadcast"``: the parameters and buffers copied to every replica except replica 0 (which shares them);
* ``"gather"``: a replica's output sent to the output device;
* ``"grad_scatter"``: backward of the gather: each slice of the output's gradient sent back to its replica;
* ``"reduce"``: backward of the broadcast: each replica's parameter gradients sent to the source device and
  summed into the module's ``.grad``;
* ``"input_grad"``: backward of the scatter, only when the inputs require gradients;
* ``"all_reduce"``: DDP's all-reduce of one gradient bucket (``record_all_reduce``), by the rank that hands it in.

Where the copies are seen:

* **Virtual devices** (``gpulab.virtual``): each transfer function reports its own copies, so the record is
  exact bookkeeping of what the algorithm moves (the data never leaves the one physical device).
* **Real GPUs** (``torch.nn.DataParallel``): while recording, the autograd functions of
  ``torch.nn.parallel._functions`` that DataParallel uses (``Scatter``, ``ReduceAddCoalesced``, ``Gather``) and
  ``torch.nn.parallel.replicate._broadcast_coalesced_reshape`` (the broadcast of parameters and buffers, with or
  without autograd) are wrapped; each call's copies are counted from its inputs' and outputs' devices (a chunk or
  tensor already on its destination is not copied: ``torch.cuda.comm`` returns it as it is) and the call is
  timed with CUDA events on every GPU's current stream (its longest span), giving each stage's seconds and a
  measured bandwidth. This path has not been run on a GPU; ``tests/test_traffic.py`` checks that the private
  classes it wraps still exist and what it counts, with stand-ins for the CUDA copies.
* **DDP** (``record_all_reduce(ddp_model, trace)``): a communication hook notes each bucket DDP all-reduces, then
  runs PyTorch's default all-reduce hook. What the backend then sends over the wire is its algorithm's business:
  gloo's all-reduce of CPU tensors is a ring (lesson 03 explains it and counts its bytes).

The record is plain data on the trace (``transfers``, ``by_stage()``, ``by_link()``, ``to_dict()``), like
``gpulab.memory``'s, so tests and graders assert on numbers; ``gpulab.plots.plot_traffic`` draws it per link.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = [
    "DATA_PARALLEL_STAGES",
    "TrafficTrace",
    "Transfer",
    "note",
    "record",
    "data_parallel_step",
    "record_all_reduce",
    "recording",
]

# The stages of one DataParallel training step, in the order they happen.
DATA_PARALLEL_STAGES = ("scatter", "broadcast", "gather", "grad_scatter", "reduce")
HOST = "host"

_lock = threading.Lock()
_traces: list[TrafficTrace] = []
_stage_override = threading.local()


@dataclass(frozen=True)
class Transfer:
    """One copy between devices (lesson 03): ``source`` and ``destination`` are device indices or ``"host"``."""

    stage: str
    source: int | str
    destination: int | str
    nbytes: int


@dataclass(eq=False)
class TrafficTrace:
    """Every transfer seen while ``record()`` was open, and, on real GPUs, each stage's measured seconds."""

    transfers: list[Transfer] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def by_stage(self, device: int = 0) -> dict[str, int]:
        """Bytes that leave or enter ``device`` by stage; every DataParallel stage is present (0 if none)."""
        totals = dict.fromkeys(DATA_PARALLEL_STAGES, 0)
        for transfer in self.transfers:
            if device in (transfer.source, transfer.destination):
                totals[transfer.stage] = totals.get(transfer.stage, 0) + transfer.nbytes
        return totals

    def by_link(self) -> dict[int | str, int]:
        """Bytes through each device's link (sent plus received), device 0 first, then the others in order."""
        links: dict[int | str, int] = {}
        for transfer in self.transfers:
            for end in (transfer.source, transfer.destination):
                links[end] = links.get(end, 0) + transfer.nbytes
        return dict(sorted(links.items(), key=lambda item: (isinstance(item[0], str), str(item[0]).zfill(8))))

    def total(self, stage: str | None = None) -> int:
        """Bytes of every transfer (of one stage, when given)."""
        return sum(t.nbytes for t in self.transfers if stage is None or t.stage == stage)

    def bandwidth(self) -> dict[str, float]:
        """Measured bytes per second of each timed stage (real GPUs only; empty on virtual devices)."""
        return {
            stage: self.total(stage) / seconds
            for stage, seconds in self.stage_seconds.items()
            if seconds > 0 and self.total(stage)
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain values (lists and dicts), e.g. to return from a DDP rank."""
        return {"transfers": [asdict(t) for t in self.transfers], "stage_seconds": dict(self.stage_seconds)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrafficTrace:
        return cls([Transfer(**t) for t in data["transfers"]], dict(data.get("stage_seconds", {})))


def recording() -> bool:
    """Whether a ``record()`` block is open (the transfer functions skip their bookkeeping otherwise)."""
    return bool(_traces)


def note(stage: str, source: int | str, destination: int | str, nbytes: int) -> None:
    """Add one transfer to every open trace (called by ``gpulab.virtual`` and the GPU wrappers below).

    A stage forced by the current thread (the gradient of a gather is scattered by ``Scatter`` itself on GPUs)
    replaces ``stage``. Copies within one device are not traffic and are ignored.
    """
    if not _traces or source == destination or nbytes <= 0:
        return
    transfer = Transfer(getattr(_stage_override, "stage", None) or stage, source, destination, int(nbytes))
    with _lock:
        for trace in _traces:
            trace.transfers.append(transfer)


def nbytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor's elements."""
    return tensor.numel() * tensor.element_size()


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
            stack.enter_context(_wrapped_cuda_functions(trace))
        with _lock:
            _traces.append(trace)
        try:
            yield trace
        finally:
            with _lock:
                _traces.remove(trace)


def data_parallel_step(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Any, n_devices: int
) -> TrafficTrace:
    """The traffic of one DataParallel training step on ``n_devices`` (lesson 03's self-checks and tests).

    ``model``, ``inputs`` and ``targets`` go to device 0 (the batch "after ``x.cuda()``"); the step is
    ``loss_fn(DataParallel(model)(inputs), targets).backward()``, the loss computed on device 0. Uses
    ``gpulab.devices(n_devices, remember=False)`` for the step: the lesson's own choice of devices stays as it was.
    """
    from gpulab.data_parallel import DataParallel

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
        with _lock:
            trace.transfers.append(Transfer("all_reduce", me, "all", nbytes(buffer)))
        return default_hooks.allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(None, counting_hook)


# ------------------------------------------------------------------------------------------------ real GPUs
def _device_of(tensor: torch.Tensor) -> int | str:
    return tensor.get_device() if tensor.is_cuda else HOST


def count_scatter(source: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
    """A tensor split onto devices: chunks not already on their destination are copies."""
    origin = _device_of(source)
    for chunk in outputs:
        note("scatter", origin, _device_of(chunk), nbytes(chunk))


def count_broadcast(inputs: Sequence[torch.Tensor], targets: Sequence[int]) -> None:
    """Tensors copied to every target device except their own."""
    for tensor in inputs:
        for target in targets:
            note("broadcast", _device_of(tensor), target, nbytes(tensor))


def count_reduce(destination: int, grads: Sequence[torch.Tensor]) -> None:
    """Gradients from every device summed onto ``destination``: those on other devices are copied there."""
    for grad in grads:
        if grad is not None:
            note("reduce", _device_of(grad), destination, nbytes(grad))


def count_gather(target: int | str, inputs: Sequence[torch.Tensor]) -> None:
    """Outputs concatenated on ``target`` (-1 is the host, as in ``torch.nn.parallel.gather``)."""
    for tensor in inputs:
        note("gather", _device_of(tensor), HOST if target == -1 else target, nbytes(tensor))


@contextlib.contextmanager
def forcing_stage(stage: str) -> Iterator[None]:
    """Label every transfer of this thread in the block with ``stage``."""
    previous = getattr(_stage_override, "stage", None)
    _stage_override.stage = stage
    try:
        yield
    finally:
        _stage_override.stage = previous


class _StageTimer:
    """CUDA events around each call of a stage; ``finish()`` adds the elapsed seconds to the trace.

    A copy runs on the current stream of the device that sends or of the device that receives, so a pair of events
    is recorded on every GPU's current stream, and a call lasts as long as its longest span on any GPU (events of
    different GPUs cannot be compared with each other).
    """

    def __init__(self, trace: TrafficTrace):
        self.trace = trace
        self.pending: list[tuple[str, list[tuple[Any, Any]]]] = []

    @contextlib.contextmanager
    def timing(self, stage: str) -> Iterator[None]:
        pairs = []
        for index in range(torch.cuda.device_count()):
            with torch.cuda.device(index):
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                pairs.append((index, start))
        try:
            yield
        finally:
            spans = []
            for index, start in pairs:
                with torch.cuda.device(index):
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                spans.append((start, end))
            with _lock:
                self.pending.append((getattr(_stage_override, "stage", None) or stage, spans))

    def finish(self) -> None:
        for stage, spans in self.pending:
            seconds = 0.0
            for start, end in spans:
                end.synchronize()
                seconds = max(seconds, start.elapsed_time(end) / 1e3)
            self.trace.stage_seconds[stage] = self.trace.stage_seconds.get(stage, 0.0) + seconds
        self.pending.clear()


@contextlib.contextmanager
def _wrapped_cuda_functions(trace: TrafficTrace) -> Iterator[None]:
    """Wrap DataParallel's autograd functions (``torch.nn.parallel._functions``) and its broadcast for the block.

    The wrappers call the originals unchanged; they count copies from the devices of what goes in and comes out
    and time each call. ``Gather.backward`` scatters the output's gradient (stage ``grad_scatter``) and
    ``Scatter.backward`` gathers the inputs' gradient (``input_grad``): the stage is forced for their duration.
    """
    from torch.nn.parallel import _functions

    replicate_module = importlib.import_module("torch.nn.parallel.replicate")
    timer = _StageTimer(trace)
    broadcast_original = replicate_module._broadcast_coalesced_reshape
    originals = {
        (_functions.Scatter, "forward"): _functions.Scatter.forward,
        (_functions.Scatter, "backward"): _functions.Scatter.backward,
        (_functions.ReduceAddCoalesced, "forward"): _functions.ReduceAddCoalesced.forward,
        (_functions.Gather, "forward"): _functions.Gather.forward,
        (_functions.Gather, "backward"): _functions.Gather.backward,
    }

    def scatter_forward(ctx, target_gpus, chunk_sizes, dim, input):
        with timer.timing("scatter"):
            outputs = originals[(_functions.Scatter, "forward")](ctx, target_gpus, chunk_sizes, dim, input)
        count_scatter(input, outputs)
        return outputs

    def broadcast_coalesced_reshape(tensors, devices, detach=False):
        # replicate() broadcasts parameters and buffers through this one function, with or without autograd.
        if not tensors:
            return broadcast_original(tensors, devices, detach)
        with timer.timing("broadcast"):
            copies = broadcast_original(tensors, devices, detach)
        count_broadcast(list(tensors), [_index(device) for device in devices])
        return copies

    def reduce_forward(ctx, destination, num_inputs, *grads):
        with timer.timing("reduce"):
            outputs = originals[(_functions.ReduceAddCoalesced, "forward")](ctx, destination, num_inputs, *grads)
        count_reduce(destination, grads)
        return outputs

    def gather_forward(ctx, target_device, dim, *inputs):
        with timer.timing("gather"):
            output = originals[(_functions.Gather, "forward")](ctx, target_device, dim, *inputs)
        count_gather(output.get_device() if output.is_cuda else -1, inputs)
        return output

    def gather_backward(ctx, grad_output):
        with forcing_stage("grad_scatter"):
            return originals[(_functions.Gather, "backward")](ctx, grad_output)

    def scatter_backward(ctx, *grad_output):
        with forcing_stage("input_grad"):
            return originals[(_functions.Scatter, "backward")](ctx, *grad_output)

    replacements = {
        (_functions.Scatter, "forward"): scatter_forward,
        (_functions.Scatter, "backward"): scatter_backward,
        (_functions.ReduceAddCoalesced, "forward"): reduce_forward,
        (_functions.Gather, "forward"): gather_forward,
        (_functions.Gather, "backward"): gather_backward,
    }
    for (cls, name), function in replacements.items():
        setattr(cls, name, staticmethod(function))
    replicate_module._broadcast_coalesced_reshape = broadcast_coalesced_reshape
    try:
        yield
    finally:
        for (cls, name), function in originals.items():
            setattr(cls, name, staticmethod(function))
        replicate_module._broadcast_coalesced_reshape = broadcast_original
        timer.finish()


def _index(device: Any) -> int:
    return device.index if isinstance(device, torch.device) else int(device)
