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
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "DATA_PARALLEL_STAGES",
    "HOST",
    "TrafficTrace",
    "Transfer",
    "add",
    "collecting",
    "forcing_stage",
    "nbytes",
    "note",
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
