"""``gpulab.DataParallel``: ``nn.DataParallel`` on real GPUs, the same algorithm on virtual devices.

Introduced in lesson 01 and used by every lesson after it. On a machine with enough CUDA GPUs (see
``gpulab.devices``) ``gpulab.DataParallel(...)`` *is* ``torch.nn.DataParallel(...)``. With fewer, PyTorch's own
class would silently just call the module (its ``device_ids`` becomes ``[]``), so the learner would see nothing
of what DataParallel does. There we return an instance of the subclass below, which keeps PyTorch's
``forward`` untouched (the same checks, the same order: scatter, replicate, parallel_apply, gather) and
replaces only the four stages that need CUDA by virtual-device versions with the same semantics:

* scatter: ``Tensor.chunk`` along ``dim``; tuples, lists, dicts and namedtuples split element-wise; any other
  object repeated for each chunk; kwargs too; fewer chunks than devices for tiny batches (idle devices).
* replicate: replica 0 shares the module's parameters and buffers; the others get copies whose gradients flow
  back and are *summed* into the module's parameters; BatchNorm's running statistics of replicas other than 0
  are therefore lost, exactly as on GPUs.
* parallel_apply: one thread per replica, grad mode and autocast carried into each thread, an exception in a
  replica re-raised naming the replica; a replica that computed with a tensor of another device (the module's
  own parameters, reached through a closure) fails with the device mismatch GPUs would raise.
* gather: concatenate on the output device, with PyTorch's warning when replicas return scalars.

The measure of faithfulness is PyTorch's own DataParallel test suite; ``tests/test_data_parallel.py`` holds the
parts of it that are not about CUDA itself.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gpulab import virtual
from gpulab.devices import Devices, bind_cuda_context, current_devices


class DataParallel(nn.DataParallel):
    """``nn.DataParallel`` when enough real GPUs exist, else the same algorithm on virtual devices.

    Lesson 01 wraps a model with it; lesson 02 trains with it; lesson 03 measures its memory; lesson 04 saves
    its ``state_dict``. ``device_ids`` and ``output_device`` accept ints or ``torch.device('cuda', i)``; on
    virtual devices the ids are those of ``gpulab.devices(n)`` (0 .. n-1). The mode follows ``device_ids`` when
    it is a ``gpulab.devices(...)`` result, else the lesson's choice (``followed_devices``).
    """

    def __new__(cls, module: nn.Module | None = None, device_ids=None, output_device=None, dim: int = 0):
        chosen = followed_devices(device_ids)
        if module is not None and not chosen.virtual:
            # The GPUs gpulab.devices(n) chose, not every visible GPU, unless the caller names others.
            ids = list(chosen) if device_ids is None else list(device_ids)
            return nn.DataParallel(module, device_ids=ids, output_device=output_device, dim=dim)
        return super().__new__(cls)

    def __init__(self, module: nn.Module, device_ids=None, output_device=None, dim: int = 0) -> None:
        # nn.DataParallel.__init__ would give up without CUDA (device_ids = []), so set up the same attributes
        # ourselves, with the same validation PyTorch applies on GPUs.
        nn.Module.__init__(self)
        torch._C._log_api_usage_once("gpulab.DataParallel")
        available: Devices = followed_devices(device_ids)
        if device_ids is None:
            device_ids = list(available)
        ids = [_virtual_index(device) for device in device_ids]
        for index in ids:
            if index not in available:
                # PyTorch's wording (torch.cuda.get_device_properties via _check_balance), plus the remedy.
                remedy = (
                    f"call gpulab.devices({index + 1}) for more"
                    if index >= len(available)
                    else f"device ids run from 0 to {len(available) - 1}"
                )
                raise AssertionError(
                    f"Invalid device id: {index} is not one of the {len(available)} virtual devices "
                    f"{list(available)}; {remedy}"
                )
        if len(set(ids)) != len(ids):
            raise ValueError(f"device_ids must not repeat a device, got {ids}")
        if not ids:
            raise RuntimeError("no available devices were found")
        if output_device is None:
            output_device = ids[0]
        self.dim = dim
        self.module = module
        self.device_ids = ids
        self.output_device = _virtual_index(output_device)
        if self.output_device not in available:
            raise AssertionError(f"Invalid device id: {self.output_device}")
        # Parameters of the wrapped module must live here, like cuda:{device_ids[0]} on real GPUs.
        self.src_device_obj = available.primary
        if len(self.device_ids) == 1:
            self.module.to(self.src_device_obj)

    # nn.DataParallel.forward is inherited unchanged; it calls the four stages below.

    def scatter(self, inputs, kwargs, device_ids):
        """Split inputs and kwargs across ``device_ids`` exactly like ``torch.nn.parallel.scatter_kwargs``."""
        source = self.device_ids[0]
        backing = self.src_device_obj
        scattered_inputs = scatter(inputs, device_ids, self.dim, source, backing) if inputs else []
        scattered_kwargs = scatter(kwargs, device_ids, self.dim, source, backing) if kwargs else []
        if len(scattered_inputs) < len(scattered_kwargs):
            scattered_inputs.extend(() for _ in range(len(scattered_kwargs) - len(scattered_inputs)))
        elif len(scattered_kwargs) < len(inputs):
            scattered_kwargs.extend({} for _ in range(len(scattered_inputs) - len(scattered_kwargs)))
        return tuple(scattered_inputs), tuple(scattered_kwargs)

    def replicate(self, module, device_ids):
        """One replica of ``module`` per device; replica 0 shares its parameters (``torch.nn.parallel.replicate``)."""
        return replicate(module, device_ids, self.device_ids[0], detach=not torch.is_grad_enabled())

    def parallel_apply(self, replicas, inputs, kwargs):
        """Run each replica on its chunk in its own thread (``torch.nn.parallel.parallel_apply``); a replica that
        computed with a tensor of another device fails as on GPUs (``refuse_tensors_of_other_devices``)."""
        device_ids = self.device_ids[: len(replicas)]
        outputs = parallel_apply(replicas, inputs, kwargs, device_ids, self.src_device_obj)
        refuse_tensors_of_other_devices(self.module, outputs, device_ids)
        return outputs

    def gather(self, outputs, output_device):
        """Concatenate the replicas' outputs on ``output_device`` (``torch.nn.parallel.gather``)."""
        sources = self.device_ids[: len(outputs)]
        return gather(outputs, output_device, sources, self.dim)

    def extra_repr(self) -> str:
        return f"virtual device_ids={self.device_ids}, on {self.src_device_obj}"


def followed_devices(device_ids) -> Devices:
    """The devices, and so the mode, a ``gpulab.DataParallel(module, device_ids)`` call follows.

    A ``Devices`` list (what ``gpulab.devices(n)`` returns) carries its own mode: real GPUs or virtual devices.
    Anything else (``None``, plain ids) follows the lesson's choice, ``current_devices()``. So a demo's
    ``gpulab.devices(4, remember=False)`` never turns the lesson's later ``DataParallel(..., device_ids=devices)``
    calls virtual (lesson 01).
    """
    return device_ids if isinstance(device_ids, Devices) else current_devices()


def _virtual_index(device: Any) -> int:
    if isinstance(device, torch.device):
        if device.index is None:
            raise ValueError(f"Expected a device with an index, got {device}")
        return device.index
    if isinstance(device, str):
        return _virtual_index(torch.device(device))
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    raise ValueError(f"Expected an int or torch.device as a device id, got {device!r}")


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def scatter(inputs: Any, device_ids: Sequence[int], dim: int, source: int, backing: torch.device | None = None):
    """``torch.nn.parallel.scatter`` on virtual devices: tensors chunked, containers split, others repeated.

    Tensors that are not on the ``backing`` device, when one is given (a CPU batch for virtual devices on
    ``cuda:0``), are copied there chunk by chunk, as PyTorch's scatter copies a CPU batch to the GPUs.
    """

    def scatter_map(obj):
        if isinstance(obj, torch.Tensor):
            return list(virtual.Scatter.apply(device_ids, source, dim, backing, obj))
        if _is_namedtuple(obj):
            return [type(obj)(*args) for args in zip(*map(scatter_map, obj), strict=False)]
        if isinstance(obj, tuple) and len(obj) > 0:
            return list(zip(*map(scatter_map, obj), strict=False))
        if isinstance(obj, list) and len(obj) > 0:
            return [list(i) for i in zip(*map(scatter_map, obj), strict=False)]
        if isinstance(obj, dict) and len(obj) > 0:
            return [type(obj)(i) for i in zip(*map(scatter_map, obj.items()), strict=False)]
        return [obj for _ in device_ids]

    try:
        return scatter_map(inputs)
    finally:
        # scatter_map refers to itself through its closure cell: break the cycle, as torch's scatter does.
        scatter_map = None  # noqa: F841


def gather(outputs: Sequence[Any], target: int, sources: Sequence[int], dim: int = 0):
    """``torch.nn.parallel.gather`` on virtual devices: tensors concatenated on ``target``, containers too."""

    def gather_map(items):
        first = items[0]
        if isinstance(first, torch.Tensor):
            return virtual.Gather.apply(target, dim, sources, *items)
        if first is None:
            return None
        if isinstance(first, dict):
            if not all(len(first) == len(d) for d in items):
                raise ValueError("All dicts must have the same number of keys")
            return type(first)((k, gather_map([d[k] for d in items])) for k in first)
        if _is_namedtuple(first):
            return type(first)._make(map(gather_map, zip(*items, strict=True)))
        return type(first)(map(gather_map, zip(*items, strict=True)))

    try:
        return gather_map(outputs)
    finally:
        gather_map = None  # noqa: F841 - break the closure's reference cycle, as torch's gather does


def replicate(network: nn.Module, device_ids: Sequence[int], source: int, detach: bool = False):
    """``torch.nn.parallel.replicate`` with virtual broadcasts: the same replicas, aliasing and gradients.

    Relies on ``nn.Module._replicate_for_data_parallel`` (private, the method PyTorch's replicate uses);
    ``tests/test_data_parallel.py::test_private_torch_api_still_there`` fails loudly if torch changes it.
    """
    if not device_ids:
        return []
    replica_count = len(device_ids)
    # The module copies first, then the broadcasts (PyTorch broadcasts first). A lazy module's
    # _replicate_for_data_parallel then raises PyTorch's own RuntimeError ("Modules with uninitialized parameters
    # can't be used with `DataParallel`", torch/nn/modules/lazy.py) before a virtual broadcast touches an
    # uninitialized parameter in Python, which raises a ValueError (PyTorch's broadcast runs in C++, where
    # UninitializedParameter.__torch_function__ is not consulted). Nothing else can tell the order apart.
    modules = list(network.modules())
    module_index = {module: i for i, module in enumerate(modules)}
    module_copies: list[list[nn.Module]] = [[] for _ in device_ids]
    for module in modules:
        for j in range(replica_count):
            replica = module._replicate_for_data_parallel()
            replica._former_parameters = {}
            module_copies[j].append(replica)

    params = list(network.parameters())
    param_index = {param: i for i, param in enumerate(params)}
    param_copies = _broadcast(params, device_ids, source, detach)

    buffers = list(network.buffers())
    buffers_rg = [buf for buf in buffers if buf.requires_grad and not detach]
    buffers_not_rg = [buf for buf in buffers if not (buf.requires_grad and not detach)]
    buffer_index_rg = {buf: i for i, buf in enumerate(buffers_rg)}
    buffer_index_not_rg = {buf: i for i, buf in enumerate(buffers_not_rg)}
    buffer_copies_rg = _broadcast(buffers_rg, device_ids, source, detach)
    buffer_copies_not_rg = _broadcast(buffers_not_rg, device_ids, source, True)

    for i, module in enumerate(modules):
        for key, child in module._modules.items():
            for j in range(replica_count):
                replica = module_copies[j][i]
                if child is None:
                    replica._modules[key] = None
                else:
                    setattr(replica, key, module_copies[j][module_index[child]])
        for key, param in module._parameters.items():
            for j in range(replica_count):
                replica = module_copies[j][i]
                if param is None:
                    replica._parameters[key] = None
                else:
                    param_copy = param_copies[j][param_index[param]]
                    setattr(replica, key, param_copy)
                    replica._former_parameters[key] = param_copy
        for key, buf in module._buffers.items():
            for j in range(replica_count):
                replica = module_copies[j][i]
                if buf is None:
                    replica._buffers[key] = None
                elif buf.requires_grad and not detach:
                    setattr(replica, key, buffer_copies_rg[j][buffer_index_rg[buf]])
                else:
                    setattr(replica, key, buffer_copies_not_rg[j][buffer_index_not_rg[buf]])
    return [module_copies[j][0] for j in range(replica_count)]


def _broadcast(tensors: list[torch.Tensor], device_ids: Sequence[int], source: int, detach: bool):
    if not tensors:
        return [[] for _ in device_ids]
    if detach:
        return virtual.broadcast_detached(tensors, device_ids, source)
    copies = virtual.Broadcast.apply(list(device_ids), source, *tensors)
    count = len(tensors)
    return [list(copies[i : i + count]) for i in range(0, len(copies), count)]


class ReplicaError(RuntimeError):
    """Raised when a replica failed and its exception type cannot be rebuilt with a message."""


def parallel_apply(modules, inputs, kwargs_tup, device_ids, backing: torch.device | str = "cpu"):
    """``torch.nn.parallel.parallel_apply`` on virtual devices: one thread per replica.

    Each thread enters ``virtual.worker_context(device)`` so that memory made there belongs to that virtual
    device, and inherits the caller's grad mode and autocast state. ``backing`` is the physical device; on CUDA
    each thread first makes its context current (``gpulab.devices.bind_cuda_context``). A replica's exception is
    re-raised in the caller with the replica and device named and the replica's traceback attached, in PyTorch's
    words (``torch/nn/parallel/parallel_apply.py``: ``"in replica {i} on device {device}"``, the device being the
    virtual device's index here).
    """
    if len(modules) != len(inputs):
        raise AssertionError(f"The number of modules {len(modules)} is not equal to the number of inputs {len(inputs)}")
    if kwargs_tup is None:
        kwargs_tup = ({},) * len(modules)
    backing = torch.device(backing)
    device_type = backing.type
    lock = threading.Lock()
    results: dict[int, Any] = {}
    grad_enabled = torch.is_grad_enabled()
    # A backing without autocast (the meta device, on which gpulab.scaling counts a big model's bytes) has none.
    has_autocast = torch.amp.is_autocast_available(device_type)
    autocast_enabled = has_autocast and torch.is_autocast_enabled(device_type)
    autocast_dtype = torch.get_autocast_dtype(device_type) if has_autocast else None
    # On a CPU the replicas share the cores: give each worker thread its share of the intra-op threads (a
    # per-thread setting). Without this every replica thread would start a full OpenMP team of its own, and the
    # oversubscribed teams spin against each other: a step becomes tens of times slower than on one device.
    threads_per_replica = max(1, torch.get_num_threads() // max(1, len(modules)))

    def worker(i, module, chunk, kwargs, device):
        torch.set_grad_enabled(grad_enabled)
        if device_type == "cpu" and len(modules) > 1:
            torch.set_num_threads(threads_per_replica)
        if device_type == "cuda":
            bind_cuda_context(backing)  # before the replica's first cuBLAS call (see gpulab.devices)
        try:
            autocast = (
                torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_enabled)
                if has_autocast
                else contextlib.nullcontext()
            )
            with virtual.worker_context(device), autocast:
                if not isinstance(chunk, (list, tuple)):
                    chunk = (chunk,)
                output = module(*chunk, **kwargs)
            with lock:
                results[i] = output
        except Exception as error:  # noqa: BLE001 - re-raised in the caller below
            with lock:
                results[i] = _ReplicaFailure(error, f"in replica {i} on device {device}")

    work = list(zip(modules, inputs, kwargs_tup, device_ids, strict=True))
    if len(work) > 1:
        threads = [threading.Thread(target=worker, args=(i, *item)) for i, item in enumerate(work)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        worker(0, *work[0])

    outputs = []
    for i in range(len(inputs)):
        output = results[i]
        if isinstance(output, _ReplicaFailure):
            output.reraise()
        outputs.append(output)
    return outputs


def refuse_tensors_of_other_devices(module: nn.Module, outputs: Sequence[Any], device_ids: Sequence[int]) -> None:
    """Raise, as GPUs would, when a replica computed with a tensor that is not on its device: the wrapped module's
    own parameters, another replica's copy or chunk, or one tensor several replicas share (lesson 03's
    ``LossInForward`` is graded through this).

    ``replicate`` copies only what ``module`` registers. A forward that reaches the caller's model another way (a
    closure over it, or a reference ``nn.Module`` does not register, such as a list), or keeps one replica's copy
    where the others find it (a dict all replicas share), computes with tensors that live on one GPU: on two GPUs a
    replica meets tensors of another device and PyTorch raises a device mismatch. Virtual devices share one backing
    device, so the same numbers would come out and the mistake would go unseen; the autograd graph tells it apart.

    From each replica's outputs the graph is followed back to the broadcasts that made the replicas' copies and the
    scatters that made their chunks, where the walk stops: replica *i* must arrive at the outputs made for its own
    device. A leaf reached on the way (an ``AccumulateGrad`` node's tensor) was used directly: a
    parameter of ``module`` must not be, by any replica but device 0's, and no leaf by two replicas, except a 0-dim
    one (a CUDA operation takes a CPU scalar). What leaves no trace in the graph is not seen: autograd off, tensors
    that need no gradient (a batch moved inside ``forward`` to one fixed device, ``.to(devices.primary)``: every
    virtual device is the one backing device), a result detached or computed under ``no_grad``. A tensor moved with
    ``.to(x.device)`` before use is a copy on GPUs but the tensor itself here: register it (``nn.Parameter``, a
    buffer) instead. The walk visits each node of a replica's graph once, after the replicas ran.
    """
    if len(outputs) < 2 or not torch.is_grad_enabled():
        return
    source = device_ids[0]
    own = {id(parameter) for parameter in module.parameters()}
    first_reached: dict[int, int] = {}  # id of a leaf -> the first replica that reached it
    for i, output in enumerate(outputs):
        pending = [(tensor.grad_fn, 0) for tensor in _tensors_in(output)]
        seen = set()
        while pending:
            node, index = pending.pop()
            made_for = _device_of_transfer(node, index)
            if made_for is not None:
                if made_for != device_ids[i]:
                    _mismatch(i, device_ids, f"a copy or a chunk sent to device {made_for}")
                continue
            if node is None or node in seen:
                continue
            seen.add(node)
            if isinstance(node, _ACCUMULATE_GRAD) and node.variable.dim() > 0:
                reached_by = first_reached.setdefault(id(node.variable), i)
                if reached_by != i:
                    _mismatch(i, device_ids, f"a tensor that replica {reached_by} used too")
                if id(node.variable) in own and device_ids[i] != source:
                    _mismatch(i, device_ids, f"the module's own parameters, on device {source}")
            pending.extend(node.next_functions)


_ACCUMULATE_GRAD = type(torch.ones(1, requires_grad=True).expand(1).grad_fn.next_functions[0][0])


def _device_of_transfer(node: Any, index: int) -> int | None:
    """For a virtual broadcast's or scatter's backward node reached through its output ``index``: the virtual
    device that output was made for; for any other node, None."""
    if isinstance(node, virtual.Broadcast._backward_cls):
        return node.devices[index // node.count]
    if isinstance(node, virtual.Scatter._backward_cls):
        return node.devices[index]
    return None


def _mismatch(i: int, device_ids: Sequence[int], what: str) -> None:
    """Raise replica ``i``'s device mismatch in PyTorch's words, saying what it computed with."""
    device, source = device_ids[i], device_ids[0]
    error = RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"virtual device {device} and virtual device {source}! Replica {i} computed with {what}, not its own "
        "copy: DataParallel copies only what the module registers (a model reached through a closure, a list or a "
        "shared dict is not copied)"
    )
    _ReplicaFailure(error, f"in replica {i} on device {device}").reraise()


def _tensors_in(output: Any) -> list[torch.Tensor]:
    """The tensors of a replica's output, through tuples, lists and dicts (what ``gather`` walks)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [tensor for item in output for tensor in _tensors_in(item)]
    return []


class _ReplicaFailure:
    """An exception caught in a replica's thread, with its traceback as text (like torch's ExceptionWrapper)."""

    def __init__(self, error: BaseException, where: str):
        self.error = error
        self.where = where
        self.text = "".join(traceback.format_exception(error))

    def reraise(self):
        message = f"Caught {type(self.error).__name__} {self.where}.\nOriginal {self.text}"
        if isinstance(self.error, KeyError):
            # KeyError's str() is the repr of its argument; keep the message readable (torch does the same).
            message = _KeyErrorMessage(message)
        try:
            rebuilt = type(self.error)(message)
        except Exception:  # noqa: BLE001 - exception types whose constructor takes other arguments
            raise ReplicaError(message) from self.error
        raise rebuilt from self.error


class _KeyErrorMessage(str):
    """A string whose repr is itself, so that ``str(KeyError(message))`` shows the message as written."""

    def __repr__(self) -> str:
        return self
