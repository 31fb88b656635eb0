"""The record of copies between devices: ``Transfer``, ``TrafficTrace`` and the one function that adds to it.

The lowest layer of lesson 03's traffic count. ``gpulab.virtual``'s transfer functions and the real-GPU wrappers
(``gpulab.cuda_traffic``) call ``note()`` for every copy they make; ``gpulab.traffic.record()`` opens a trace that
collects them. This module imports nothing of gpulab, so every other module can report to it without an import
circle (``gpulab.data_parallel`` -> ``gpulab.virtual`` -> here; ``gpulab.traffic`` -> ``gpulab.data_parallel``).

Stages (``Transfer.stage``):

* ``"scatter"``: a chunk of the batch sent from the source device (or the host) to a replica's device;
* ``"broadcast"``: the parameters and buffers copied to every replica except replica 0 (which shares them);
* ``"gather"``: a replica's output sent to the output device;
* ``"grad_scatter"``: backward of the gather: each slice of the output's gradient sent back to its replica;
* ``"reduce"``: backward of the broadcast: each replica's parameter gradients sent to the source device and
  summed into the module's ``.grad``;
* ``"input_grad"``: backward of the scatter, only when the inputs require gradients;
* ``"all_reduce"``: DDP's all-reduce of one gradient bucket (``gpulab.traffic.record_all_reduce``).

How each stage travels, per algorithm (``ROUTES``, the one declaration that lesson 03's table, its exercise
``dp_traffic_bytes``, the grader's references and ``gpulab.scaling``'s predictions follow): ``"copy"`` is what
PyTorch does without NCCL, a copy between device 0 and each device taking part (a *star*: device 0's link carries
one copy per other device); ``"nccl"`` is what it does on GPUs where NCCL is available: the broadcast and the
reduce become NCCL's pipelined ring (a *chain*: the tensor passes from device to device, so each link carries it
once in and once out, device 0's link once), the batch-sized stages stay copies. Either way the links together
carry ``(k - 1) x size`` for ``k`` devices taking part. The PyTorch lines behind it are in ``SOURCES``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "ALGORITHMS",
    "CHAIN",
    "DATA_PARALLEL_STAGES",
    "HOST",
    "ROUTES",
    "SOURCES",
    "STAR",
    "TrafficTrace",
    "Transfer",
    "add",
    "collecting",
    "forcing_stage",
    "chain_order",
    "nbytes",
    "note",
    "note_algorithm",
    "recording",
]

# The stages of one DataParallel training step, in the order they happen.
DATA_PARALLEL_STAGES = ("scatter", "broadcast", "gather", "grad_scatter", "reduce")
HOST = "host"

# How a stage's tensors travel between device 0 and the other devices taking part (module docstring).
STAR = "star"  # one copy between device 0 and each other device
CHAIN = "chain"  # NCCL's ring, pipelined: device to device, device 0 at one end

# The algorithms PyTorch's DataParallel moves its tensors with, and how each one routes each stage.
ALGORITHMS = ("copy", "nccl")
ROUTES: dict[str, dict[str, str]] = {
    "copy": dict.fromkeys(DATA_PARALLEL_STAGES, STAR),
    "nccl": {"scatter": STAR, "broadcast": CHAIN, "gather": STAR, "grad_scatter": STAR, "reduce": CHAIN},
}

# Where PyTorch takes each way, read in its source (torch 2.13; comm.cpp is not installed: pytorch/pytorch):
# * the broadcast of parameters and buffers: replicate.py's _broadcast_coalesced_reshape -> comm.py's
#   broadcast_coalesced -> torch._C._broadcast_coalesced -> torch/csrc/cuda/comm.cpp: broadcast_coalesced ->
#   broadcast -> _broadcast_out_impl, which calls nccl::broadcast(nccl_list) when nccl::is_available(nccl_list)
#   (all CUDA, dense, contiguous, one tensor per device) and out_tensor.copy_(tensor) for each device otherwise;
# * the reduction of their gradients: _functions.py's Broadcast.backward -> ReduceAddCoalesced -> comm.py's
#   reduce_add_coalesced -> reduce_add, which calls nccl.reduce(inputs, output=result, root=root_index) when
#   nccl.is_available(inputs) and adds each other device's .to(destination) copy otherwise;
# * scatter, gather and the output's gradient (Gather.backward -> Scatter) are copies either way
#   (comm.cpp: scatter's chunks[chunk].to(device), gather's copy_ into the result).
# NCCL runs Broadcast and Reduce as a ring, pipelined in slices (nccl src/device/broadcast.h and reduce.h:
# runRing): the root sends, each next rank receives and passes on, the last only receives; for Reduce the rank
# after the root starts and the root only receives. The ring's order is NCCL's choice from the topology; device 0's
# link carries the tensor once in any order. Here the chain runs in the devices' order (chain_order).
SOURCES = {
    "copy": "torch/csrc/cuda/comm.cpp: _broadcast_out_impl -> copy_; torch/nn/parallel/comm.py: reduce_add -> .to",
    "nccl": (
        "torch/csrc/cuda/comm.cpp: _broadcast_out_impl -> nccl::broadcast; "
        "torch/nn/parallel/comm.py: reduce_add -> nccl.reduce"
    ),
}


def chain_order(devices: Sequence[int | str], source: int | str, stage: str) -> list[int | str]:
    """The devices in the order a ``CHAIN`` passes the tensor: from ``source`` on for a broadcast, ending at
    ``source`` (the root, which receives the sum) for a reduce; each device once (lesson 03)."""
    others = [device for device in dict.fromkeys(devices) if device != source]
    return [source, *others] if stage == "broadcast" else [*others, source]


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
    # The algorithm each of the broadcast and the reduce was moved with (``ALGORITHMS``): what virtual devices played,
    # or, on real GPUs, what PyTorch took; "copy, nccl" where calls of one stage took both.
    algorithms: dict[str, str] = field(default_factory=dict)

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
        return {
            "transfers": [asdict(t) for t in self.transfers],
            "stage_seconds": dict(self.stage_seconds),
            "algorithms": dict(self.algorithms),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrafficTrace:
        transfers = [Transfer(**t) for t in data["transfers"]]
        return cls(transfers, dict(data.get("stage_seconds", {})), dict(data.get("algorithms", {})))


def recording() -> bool:
    """Whether a trace is open (the transfer functions skip their bookkeeping otherwise)."""
    return bool(_traces)


def note(stage: str, source: int | str, destination: int | str, nbytes: int) -> None:
    """Add one transfer to every open trace (called by ``gpulab.virtual`` and ``gpulab.cuda_traffic``).

    A stage forced by the current thread (the gradient of a gather is scattered by ``Scatter`` itself on GPUs)
    replaces ``stage``. Copies within one device are not traffic and are ignored.
    """
    if not _traces or source == destination or nbytes <= 0:
        return
    transfer = Transfer(current_stage(stage), source, destination, int(nbytes))
    with _lock:
        for trace in _traces:
            trace.transfers.append(transfer)


def note_algorithm(stage: str, algorithm: str) -> None:
    """Say, in every open trace, which of ``ALGORITHMS`` moved a call of ``stage`` (the broadcast or the reduce)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"the algorithms are {', '.join(ALGORITHMS)}, not {algorithm!r}")
    with _lock:
        for trace in _traces:
            taken = {*trace.algorithms.get(stage, algorithm).split(", "), algorithm}
            trace.algorithms[stage] = ", ".join(name for name in ALGORITHMS if name in taken)


def add(trace: TrafficTrace, transfer: Transfer) -> None:
    """Append ``transfer`` to one trace (DDP's all-reduce hook, which may run in another thread)."""
    with _lock:
        trace.transfers.append(transfer)


def nbytes(tensor: Any) -> int:
    """Bytes of a tensor's elements."""
    return tensor.numel() * tensor.element_size()


@contextlib.contextmanager
def collecting(trace: TrafficTrace) -> Iterator[TrafficTrace]:
    """Let ``trace`` receive every ``note()`` made while the block runs."""
    with _lock:
        _traces.append(trace)
    try:
        yield trace
    finally:
        with _lock:
            _traces.remove(trace)


def current_stage(stage: str) -> str:
    """``stage``, or the stage this thread forces (``forcing_stage``)."""
    return getattr(_stage_override, "stage", None) or stage


@contextlib.contextmanager
def forcing_stage(stage: str) -> Iterator[None]:
    """Label every transfer of this thread in the block with ``stage``."""
    previous = getattr(_stage_override, "stage", None)
    _stage_override.stage = stage
    try:
        yield
    finally:
        _stage_override.stage = previous
