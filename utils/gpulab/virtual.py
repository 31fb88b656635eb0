"""Virtual devices: several logical GPUs backed by one physical device.

Used by every lesson whenever the machine has fewer than two CUDA GPUs (see ``gpulab.devices``). A virtual
device is only an index (0, 1, ...). Tensors "on" virtual device *k* really live on the backing device (the CPU
or ``cuda:0``); which virtual device a tensor belongs to is bookkeeping, done by ``gpulab.memory``'s
dispatch-level tracker when one is running. This module holds the small amount of shared state that makes that
bookkeeping possible, plus the differentiable transfers that the virtual ``DataParallel`` uses wherever the real
one would copy between GPUs:

* ``on_virtual_device(k)``: the virtual device of the *current thread*, like ``torch.cuda.device(k)``. Tensors
  made from nothing (``torch.zeros`` and friends) in this thread belong to device *k*.
* ``placing_on(k)``: everything created inside the block belongs to device *k*, whatever its inputs. Used only by
  the transfers below, exactly where a real GPU-to-GPU copy would happen.
* ``scatter``, ``gather``, ``broadcast``: autograd functions with the same semantics, aliasing and backward as
  ``torch.nn.parallel._functions.Scatter``/``Gather``/``Broadcast`` (chunk semantics, a view instead of a copy
  for the source device, gradients sent back to where the data came from and summed there).
* ``worker_context(k)``: what a replica's thread enters; it sets the thread's device and re-enters whatever
  per-thread hooks are registered (the memory tracker registers one so that it also sees the replicas' ops,
  because PyTorch's dispatch modes are per-thread).

Each transfer also reports its copies (stage, source, destination, bytes) to ``gpulab.transfers`` when a record is
open: that is lesson 03's exact count of what the algorithm moves. The broadcast and the reduce move their tensors
as the algorithm being played routes them (``gpulab.transfers.ROUTES``): PyTorch's plain copies by default, which
is what it does without NCCL; inside ``playing("nccl")``, NCCL's chain, as on GPUs: each replica's copy made from the
previous device's, each partial sum of the gradients passed on to the next device and summed there, device 0 last.

Every other operation's outputs belong to the virtual device of its inputs, as on real GPUs; the tracker applies
that rule.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager as ContextManager

import torch

from gpulab import transfers

_thread_state = threading.local()
_hooks_lock = threading.Lock()
_thread_hooks: list[Callable[[], ContextManager]] = []
_played = ["copy"]  # the algorithm the broadcast and the reduce are played with (process-wide: see ``playing``)


def played_algorithm() -> str:
    """The algorithm virtual devices move the broadcast and the reduce with now (``gpulab.transfers.ALGORITHMS``)."""
    return _played[-1]


@contextlib.contextmanager
def playing(algorithm: str) -> Iterator[None]:
    """Move the broadcast of every step started in the block, and the reduce of its gradients whenever backward
    runs, as ``algorithm`` does (``"copy"`` or ``"nccl"``, lesson 03). Process-wide: a step's replicas and its
    backward run in other threads."""
    if algorithm not in transfers.ALGORITHMS:
        raise ValueError(f"the algorithms are {', '.join(transfers.ALGORITHMS)}, not {algorithm!r}")
    with _hooks_lock:
        _played.append(algorithm)
    try:
        yield
    finally:
        with _hooks_lock:
            _played.pop()


def current_virtual_device() -> int:
    """The virtual device of the current thread (0 unless inside ``on_virtual_device``)."""
    device = getattr(_thread_state, "device", None)
    return 0 if device is None else device


def thread_virtual_device() -> int | None:
    """The virtual device the current thread runs as (a virtual replica's thread, inside ``on_virtual_device``),
    or ``None`` in a thread that is no virtual device's (the lesson's own thread, a real GPU replica's thread)."""
    return getattr(_thread_state, "device", None)


def forced_virtual_device() -> int | None:
    """The virtual device that ``placing_on`` forces for new tensors in this thread, or ``None``."""
    return getattr(_thread_state, "forced", None)


@contextlib.contextmanager
def on_virtual_device(index: int) -> Iterator[None]:
    """Make ``index`` the current thread's virtual device for the duration of the block."""
    previous = thread_virtual_device()
    _thread_state.device = index
    try:
        yield
    finally:
        _thread_state.device = previous


@contextlib.contextmanager
def placing_on(index: int) -> Iterator[None]:
    """Attribute every tensor created in the block to virtual device ``index`` (a device-to-device copy)."""
    previous = forced_virtual_device()
    _thread_state.forced = index
    try:
        yield
    finally:
        _thread_state.forced = previous


def register_thread_hook(hook: Callable[[], ContextManager]) -> None:
    """Register a factory of context managers entered by every replica thread (see ``worker_context``)."""
    with _hooks_lock:
        _thread_hooks.append(hook)


def unregister_thread_hook(hook: Callable[[], ContextManager]) -> None:
    """Remove a hook added by ``register_thread_hook``; unknown hooks are ignored."""
    with _hooks_lock:
        if hook in _thread_hooks:
            _thread_hooks.remove(hook)


@contextlib.contextmanager
def worker_context(index: int) -> Iterator[None]:
    """What a replica's thread runs inside: its virtual device plus every registered thread hook."""
    with _hooks_lock:
        hooks = list(_thread_hooks)
    with contextlib.ExitStack() as stack:
        stack.enter_context(on_virtual_device(index))
        for hook in hooks:
            stack.enter_context(hook())
        yield


def _copy_to(tensor: torch.Tensor, index: int) -> torch.Tensor:
    with placing_on(index):
        return tensor.clone()


class Scatter(torch.autograd.Function):
    """Split ``tensor`` with ``Tensor.chunk`` and send chunk *i* to ``devices[i]``.

    As in ``torch.cuda.comm.scatter``, a chunk that stays on the source device is a view, not a copy; fewer
    chunks than devices come back when the tensor is shorter than the device list. Backward gathers the
    chunks' gradients back onto the source device.
    """

    @staticmethod
    def forward(ctx, devices: Sequence[int], source: int, dim: int, backing: torch.device | None, tensor: torch.Tensor):
        ctx.source, ctx.dim, ctx.input_device, ctx.devices = source, dim, tensor.device, tuple(devices)
        moved = backing is not None and tensor.device != backing
        chunks = tensor.chunk(len(devices), dim)
        ctx.shapes = [chunk.shape for chunk in chunks]
        outputs = []
        for device, chunk in zip(devices, chunks, strict=False):
            if moved:
                # A batch from elsewhere (the CPU, for virtual devices on cuda:0): every chunk is a copy.
                with placing_on(device):
                    outputs.append(chunk.to(backing, copy=True))
                transfers.note("scatter", transfers.HOST, device, transfers.nbytes(chunk))
            else:
                outputs.append(chunk.view_as(chunk) if device == source else _copy_to(chunk, device))
                transfers.note("scatter", source, device, transfers.nbytes(chunk))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        pieces = [
            grad if grad is not None else torch.zeros(shape, dtype=_dtype_of(grads), device=_device_of(grads))
            for grad, shape in zip(grads, ctx.shapes, strict=True)
        ]
        for device, piece in zip(ctx.devices, pieces, strict=False):
            transfers.note("input_grad", device, ctx.source, transfers.nbytes(piece))
        with placing_on(ctx.source):
            return None, None, None, None, torch.cat(pieces, ctx.dim).to(ctx.input_device)


class Gather(torch.autograd.Function):
    """Concatenate the replicas' outputs on the ``target`` device along ``dim`` (``torch.cuda.comm.gather``).

    Zero-dimensional inputs are unsqueezed to vectors with PyTorch's own warning, as ``nn.DataParallel`` does
    when a replica returns a scalar loss. Backward sends each slice of the gradient back to the device its
    output came from.
    """

    @staticmethod
    def forward(ctx, target: int, dim: int, sources: Sequence[int], *outputs: torch.Tensor):
        ctx.sources, ctx.dim = tuple(sources), dim
        ctx.unsqueezed_scalar = all(output.dim() == 0 for output in outputs) and dim == 0
        if ctx.unsqueezed_scalar:
            # The same message and category as torch.nn.parallel._functions.Gather.
            warnings.warn(
                "Was asked to gather along dimension 0, but all "
                "input tensors were scalars; will instead unsqueeze "
                "and return a vector.",
                stacklevel=2,
            )
            outputs = tuple(output.view(1) for output in outputs)
        ctx.sizes = [output.size(dim) for output in outputs]
        ctx.target = target
        for source, output in zip(ctx.sources, outputs, strict=True):
            transfers.note("gather", source, target, transfers.nbytes(output))
        with placing_on(target):
            return torch.cat(outputs, dim)

    @staticmethod
    def backward(ctx, grad):
        slices = grad.split(ctx.sizes, ctx.dim)
        for piece, source in zip(slices, ctx.sources, strict=True):
            transfers.note("grad_scatter", ctx.target, source, transfers.nbytes(piece))
        copies = [_copy_to(piece, source) for piece, source in zip(slices, ctx.sources, strict=True)]
        if ctx.unsqueezed_scalar:
            copies = [copy[0] for copy in copies]
        return (None, None, None, *copies)


def _broadcast(tensors: Sequence[torch.Tensor], devices: Sequence[int], source: int, algorithm: str) -> dict:
    """``{device: copies of tensors}``: ``source`` gets the tensors themselves, every other device copies, each copy
    noted as ``algorithm`` routes the broadcast: from ``source`` (copies), or from the chain's previous device."""
    transfers.note_algorithm("broadcast", algorithm)
    chained = transfers.ROUTES[algorithm]["broadcast"] == transfers.CHAIN
    copies = {source: list(tensors)}
    order = transfers.chain_order(devices, source, "broadcast")
    for previous, device in zip(order, order[1:], strict=False):
        sender = previous if chained else source
        copies[device] = [_copy_to(tensor, device) for tensor in copies[sender]]
        for tensor in tensors:
            transfers.note("broadcast", sender, device, transfers.nbytes(tensor))
    return copies


class Broadcast(torch.autograd.Function):
    """Copy ``tensors`` to every device in ``devices`` (``torch.cuda.comm.broadcast_coalesced``).

    The source device receives the tensors themselves (aliases, no new memory), exactly like the real
    broadcast, which is why replica 0 shares the module's parameters and buffers. Backward sums the gradients
    of all copies onto the source device (``ReduceAddCoalesced``), moved as the algorithm played at forward.
    """

    @staticmethod
    def forward(ctx, devices: Sequence[int], source: int, *tensors: torch.Tensor):
        ctx.source, ctx.count, ctx.devices = source, len(tensors), tuple(devices)
        ctx.algorithm = played_algorithm()
        copies = _broadcast(tensors, devices, source, ctx.algorithm)
        outputs = []
        for device in devices:
            outputs += [copy.view_as(copy) if device == source else copy for copy in copies[device]]
        for index, needs_grad in enumerate(ctx.needs_input_grad[2:]):
            if not needs_grad:
                ctx.mark_non_differentiable(*outputs[index :: ctx.count])
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        transfers.note_algorithm("reduce", ctx.algorithm)
        if transfers.ROUTES[ctx.algorithm]["reduce"] == transfers.CHAIN:
            order = transfers.chain_order(ctx.devices, ctx.source, "reduce")
            position = {device: ctx.devices.index(device) for device in order}
            sums = [
                _chain_sum([(device, grads[position[device] * ctx.count + index]) for device in order], ctx.source)
                for index in range(ctx.count)
            ]
            return (None, None, *sums)
        # PyTorch's reduce without NCCL: every other device's gradient copied to the source and added there, in the
        # devices' order (torch/nn/parallel/comm.py: reduce_add).
        for position, grad in enumerate(grads):
            if grad is not None:
                transfers.note("reduce", ctx.devices[position // ctx.count], ctx.source, transfers.nbytes(grad))
        sums = []
        with placing_on(ctx.source):
            for index in range(ctx.count):
                parts = [grad for grad in grads[index :: ctx.count] if grad is not None]
                sums.append(_sum_in_order(parts))
        return (None, None, *sums)


def _chain_sum(parts: list[tuple[int, torch.Tensor | None]], source: int) -> torch.Tensor | None:
    """NCCL's Reduce along the chain ``parts`` (``(device, gradient)`` in the chain's order, ``source`` last): each
    device adds its gradient to the sum it received and sends the sum on; ``source`` keeps the total. A device
    without a gradient passes the sum on as it came."""
    total, holder = None, None
    for device, part in parts:
        if total is not None:
            transfers.note("reduce", holder, device, transfers.nbytes(total))
            total = _copy_to(total, device)
            if part is not None:
                total.add_(part)
        else:
            total = part
        holder = device if total is not None else None
    if total is None or not any(total is part for _, part in parts):
        return total
    with placing_on(source):
        return total.clone()  # the source's own gradient alone: a new tensor, as PyTorch's sum is


def broadcast_detached(tensors: Sequence[torch.Tensor], devices: Sequence[int], source: int):
    """Copies of ``tensors`` for each device, outside autograd (``replicate(..., detach=True)``)."""
    copies = _broadcast([tensor.detach() for tensor in tensors], devices, source, played_algorithm())
    return [list(tensors) if device == source else copies[device] for device in devices]


def _sum_in_order(parts: list[torch.Tensor]) -> torch.Tensor | None:
    if not parts:
        return None
    total = parts[0].clone()
    for part in parts[1:]:
        total.add_(part)
    return total


def _dtype_of(grads) -> torch.dtype:
    return next(grad.dtype for grad in grads if grad is not None)


def _device_of(grads) -> torch.device:
    return next(grad.device for grad in grads if grad is not None)
