"""Traffic of ``torch.nn.DataParallel`` on real GPUs: PyTorch's own copy functions, wrapped, counted and timed.

While ``gpulab.traffic.record()`` is open on a machine with two or more GPUs, the autograd functions of
``torch.nn.parallel._functions`` that DataParallel uses (``Scatter``, ``ReduceAddCoalesced``, ``Gather``) and
``torch.nn.parallel.replicate._broadcast_coalesced_reshape`` (the broadcast of parameters and buffers, with or
without autograd) are wrapped. The wrappers call the originals unchanged; each call's copies are counted from its
inputs' and outputs' devices (a chunk or tensor already on its destination is not copied: ``torch.cuda.comm``
returns it as it is) and reported to ``gpulab.transfers``.

The broadcast and the reduce are counted as the algorithm PyTorch takes for them (``gpulab.transfers.ROUTES``), and
the trace says which (``TrafficTrace.algorithms``): PyTorch hands them to NCCL when ``torch.cuda.nccl.is_available``
holds for its buffers, one per device (``torch/csrc/cuda/comm.cpp: _broadcast_out_impl``,
``torch/nn/parallel/comm.py: reduce_add``), and NCCL passes them along a chain of the devices; otherwise each other
device's copy crosses device 0's link (``nccl_takes``). The chain is counted in the devices' order: NCCL picks its
ring's order from the topology, which changes the other devices' links, never device 0's.

Each call is also timed with CUDA events, on the devices it involves and no other (the source and destinations of
its copies: events on a GPU the step does not use would create a CUDA context there), and on the streams that
copy: ``torch.nn.parallel._functions.Scatter.forward`` copies a CPU batch on a background stream per target GPU
(``_functions._get_stream``), every other stage copies on the current streams of its devices
(``torch/csrc/cuda/comm.cpp``). A call lasts as long as its longest span on any of its devices (events of
different GPUs cannot be compared with each other).

Not run on a GPU; ``tests/test_traffic.py`` checks that the private functions it wraps still exist, what it
counts, and on which devices and streams it records events, with stand-ins for CUDA tensors, streams and events.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from gpulab.transfers import (
    CHAIN,
    HOST,
    ROUTES,
    TrafficTrace,
    chain_order,
    current_stage,
    forcing_stage,
    nbytes,
    note,
    note_algorithm,
)

__all__ = [
    "count_broadcast",
    "count_gather",
    "count_reduce",
    "count_scatter",
    "forcing_stage",
    "nccl_takes",
    "wrapped",
]

_lock = threading.Lock()


def _device_of(tensor: Any) -> int | str:
    return tensor.get_device() if tensor.is_cuda else HOST


def count_scatter(source: Any, outputs: Sequence[Any]) -> None:
    """A tensor split onto devices: chunks not already on their destination are copies."""
    origin = _device_of(source)
    for chunk in outputs:
        note("scatter", origin, _device_of(chunk), nbytes(chunk))


def nccl_takes(tensors: Sequence[Any]) -> bool:
    """Whether PyTorch moves a broadcast or a reduction among ``tensors`` (one per device taking part) with NCCL:
    ``torch.cuda.nccl.is_available`` of the buffers it flattens them into, which are contiguous (``comm.cpp:
    broadcast_coalesced`` and ``comm.py: reduce_add_coalesced`` flatten each device's tensors before the call):
    a torch built with NCCL, every tensor dense and on CUDA, each on a device of its own."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torch without NCCL says so on every call (it then copies)
        return bool(torch.cuda.nccl.is_available([tensor.new_empty(0) for tensor in tensors]))


def count_broadcast(inputs: Sequence[Any], targets: Sequence[int], algorithm: str = "copy") -> None:
    """Tensors sent from their device to every target device: each target's copy from the source (``"copy"``), or
    along the chain of the targets (``"nccl"``)."""
    note_algorithm("broadcast", algorithm)
    for tensor in inputs:
        order = chain_order(targets, _device_of(tensor), "broadcast")
        for previous, target in zip(order, order[1:], strict=False):
            sender = previous if ROUTES[algorithm]["broadcast"] == CHAIN else order[0]
            note("broadcast", sender, target, nbytes(tensor))


def count_reduce(destination: int, grads: Sequence[Any], algorithm: str = "copy", num_inputs: int = 1) -> None:
    """Gradients from every device summed onto ``destination`` (``num_inputs`` per device, device after device, as
    ``ReduceAddCoalesced`` gets them): each other device's copied there (``"copy"``), or, tensor by tensor, the sum
    passed along the chain of the devices, ``destination`` last (``"nccl"``)."""
    note_algorithm("reduce", algorithm)
    if ROUTES[algorithm]["reduce"] != CHAIN:
        for grad in grads:
            if grad is not None:
                note("reduce", _device_of(grad), destination, nbytes(grad))
        return
    # Autograd hands ReduceAddCoalesced every gradient (zeros for an unused one): each device's first is a tensor.
    order = chain_order([_device_of(grads[start]) for start in range(0, len(grads), num_inputs)], destination, "reduce")
    for grad in grads[:num_inputs]:
        for sender, receiver in zip(order, order[1:], strict=False):
            note("reduce", sender, receiver, nbytes(grad))


def count_gather(target: int | str, inputs: Sequence[Any]) -> None:
    """Outputs concatenated on ``target`` (-1 is the host, as in ``torch.nn.parallel.gather``)."""
    for tensor in inputs:
        note("gather", _device_of(tensor), HOST if target == -1 else target, nbytes(tensor))


def _gpus(*groups: Iterable[Any]) -> list[int]:
    """The GPU indices among ``groups`` (ints, ``torch.device``s or ``"host"``), each once, in order."""
    found: list[int] = []
    for group in groups:
        for device in group:
            if device is None or device == HOST or device == -1:
                continue
            index = _index(device)
            if index >= 0 and index not in found:
                found.append(index)
    return found


class _StageTimer:
    """CUDA events around each call of a stage, on its own devices' copying streams; ``finish()`` adds the
    elapsed seconds to the trace."""

    def __init__(self, trace: TrafficTrace):
        self.trace = trace
        self.pending: list[tuple[str, list[tuple[Any, Any]]]] = []

    @contextlib.contextmanager
    def timing(self, stage: str, devices: Sequence[int], streams: dict[int, Any] | None = None) -> Iterator[None]:
        """Time the block on ``devices``: on ``streams[index]`` where given, else that device's current stream."""
        chosen = [(streams or {}).get(index) or torch.cuda.current_stream(index) for index in devices]
        starts = []
        for stream in chosen:
            start = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            starts.append(start)
        try:
            yield
        finally:
            spans = []
            for stream, start in zip(chosen, starts, strict=True):
                end = torch.cuda.Event(enable_timing=True)
                end.record(stream)
                spans.append((start, end))
            with _lock:
                self.pending.append((current_stage(stage), spans))

    def finish(self) -> None:
        for stage, spans in self.pending:
            seconds = 0.0
            for start, end in spans:
                end.synchronize()
                seconds = max(seconds, start.elapsed_time(end) / 1e3)
            self.trace.stage_seconds[stage] = self.trace.stage_seconds.get(stage, 0.0) + seconds
        self.pending.clear()


@contextlib.contextmanager
def wrapped(trace: TrafficTrace) -> Iterator[None]:
    """Wrap DataParallel's autograd functions (``torch.nn.parallel._functions``) and its broadcast for the block.

    ``Gather.backward`` scatters the output's gradient (stage ``grad_scatter``) and ``Scatter.backward`` gathers
    the inputs' gradient (``input_grad``): the stage is forced for their duration.
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
        targets = _gpus(target_gpus)
        streams = None
        if not input.is_cuda:
            # Scatter.forward copies a CPU batch on a background stream per target GPU (_functions._get_stream).
            streams = {index: _functions._get_stream(torch.device("cuda", index)) for index in targets}
        with timer.timing("scatter", _gpus([_device_of(input)], targets), streams):
            outputs = originals[(_functions.Scatter, "forward")](ctx, target_gpus, chunk_sizes, dim, input)
        count_scatter(input, outputs)
        return outputs

    def broadcast_coalesced_reshape(tensors, devices, detach=False):
        # replicate() broadcasts parameters and buffers through this one function, with or without autograd.
        if not tensors:
            return broadcast_original(tensors, devices, detach)
        targets = [_index(device) for device in devices]
        with timer.timing("broadcast", _gpus([_device_of(tensors[0])], targets)):
            copies = broadcast_original(tensors, devices, detach)
        took = "nccl" if len(copies) > 1 and nccl_takes([device_copies[0] for device_copies in copies]) else "copy"
        count_broadcast(list(tensors), targets, took)
        return copies

    def reduce_forward(ctx, destination, num_inputs, *grads):
        sources = [_device_of(grad) for grad in grads if grad is not None]
        with timer.timing("reduce", _gpus(sources, [destination])):
            outputs = originals[(_functions.ReduceAddCoalesced, "forward")](ctx, destination, num_inputs, *grads)
        firsts = [grads[start] for start in range(0, len(grads), num_inputs) if grads[start] is not None]
        took = "nccl" if len(firsts) > 1 and nccl_takes(firsts) else "copy"
        count_reduce(destination, grads, took, num_inputs)
        return outputs

    def gather_forward(ctx, target_device, dim, *inputs):
        target = [] if target_device in ("cpu", -1) else [target_device]
        with timer.timing("gather", _gpus([_device_of(tensor) for tensor in inputs], target)):
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
    if isinstance(device, torch.device):
        return device.index if device.index is not None else 0
    if isinstance(device, str):
        return _index(torch.device(device))
    return int(device)
