"""The GIL, measured: DataParallel's replica threads against DDP's processes on Python-bound work (lesson 03).

DataParallel runs its replicas in *threads* of one Python process (``parallel_apply``: one thread per replica).
Tensor kernels release Python's global interpreter lock (the GIL), so on GPUs the threads mostly wait for
kernels; but every line of Python in a replica's forward (hooks, loops over samples, small operations whose time
is Python's own) holds the GIL, and only one thread can run Python at a time. DDP runs one *process* per rank,
each with its own interpreter and its own GIL.

``measure(devices)`` times the same Python-bound forward (``PythonBound``: a pure-Python loop per sample) three
ways, on the same batch:

* **serial**: the whole batch in this thread;
* **threads**: ``gpulab.DataParallel`` on ``devices`` (virtual devices use one thread per replica, as the real
  DataParallel does);
* **processes**: ``gpulab.ddp.launch`` on as many ranks, each rank its share of the batch, all starting together
  after a barrier; rank 0 also times the whole batch alone, so that the processes' ratio compares two times
  taken in the same processes at the same moment.

The result keeps every time as data (``GILRun``); its ratios are what a test holds: threads take about the
serial time (the GIL lets one thread run Python at a time), processes about serial / N on N free cores. Judge
by the ratios, never by the seconds. Each ratio compares the fastest repeats: other work on the machine only
ever adds time to a repeat. (With other work running, the processes' ratio rises towards 1 as they lose cores,
but a fair scheduler still gives N runnable processes more of the machine than one thread.)
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from gpulab.messages import message

__all__ = ["GILRun", "PythonBound", "measure", "rank_times"]


class PythonBound(nn.Module):
    """A forward whose time is Python's, not a kernel's: ``work`` iterations of a pure-Python loop per sample.

    Returns one number per sample (times a one-element parameter, so that DataParallel has something to
    broadcast), on the input's device.
    """

    def __init__(self, work: int = 20_000):
        super().__init__()
        self.work = work
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        results = []
        for value in x.flatten(1)[:, 0].tolist():
            total = 0.0
            for step in range(self.work):
                total += (value + step) % 7.0
            results.append(total)
        return torch.tensor(results, dtype=x.dtype, device=x.device) * self.scale


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def rank_times(rank: int, world_size: int, batch_size: int, work: int, repeats: int) -> dict[str, list[float]]:
    """What each DDP rank of ``measure`` runs: per repeat, rank 0 alone on the whole batch, then every rank on its
    own chunk at the same time (a barrier before each). Returns ``{"serial": [...], "parallel": [...]}`` in
    seconds (``serial`` is empty on the other ranks)."""
    import torch.distributed as dist

    module = PythonBound(work)
    batch = torch.arange(batch_size, dtype=torch.float32).view(batch_size, 1)
    chunk = batch.chunk(world_size)[rank]
    serial, parallel = [], []
    with torch.no_grad():
        module(chunk[:1])  # warm-up
        for _ in range(repeats):
            dist.barrier()
            if rank == 0:
                serial.append(_timed(lambda: module(batch)))
            dist.barrier()
            parallel.append(_timed(lambda: module(chunk)))
    return {"serial": serial, "parallel": parallel}


@dataclass
class GILRun:
    """The times of one ``measure`` run, in seconds, one per repeat (lesson 03).

    * ``serial``, ``threads``: the whole batch in this thread, and under DataParallel's threads, alternately;
    * ``processes_serial``: rank 0 alone on the whole batch; ``processes``: the ranks at once, the slowest rank
      of each repeat (the step ends when the last rank ends).
    """

    devices: int
    batch_size: int
    work: int
    serial: list[float] = field(default_factory=list)
    threads: list[float] = field(default_factory=list)
    processes_serial: list[float] = field(default_factory=list)
    processes: list[float] = field(default_factory=list)

    @property
    def threads_ratio(self) -> float:
        """Fastest time under DataParallel's threads / fastest serial time: about 1 (the GIL serialises them)."""
        return min(self.threads) / min(self.serial)

    @property
    def processes_ratio(self) -> float:
        """Fastest time of the DDP ranks at once / fastest time of one rank alone on the whole batch: about
        1 / devices on as many free cores."""
        return min(self.processes) / min(self.processes_serial)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(threads_ratio=self.threads_ratio, processes_ratio=self.processes_ratio)
        return data

    def summary(self) -> str:
        return message(
            "gil.summary",
            devices=self.devices,
            threads=self.threads_ratio,
            processes=self.processes_ratio,
            ideal=1 / self.devices,
        )

    def plot(self, display: bool = True, title: str | None = None):
        """Each way's fastest time relative to serial, every repeat as a dot (``gpulab.plots.finish``)."""
        from gpulab import plots

        serial, alone = min(self.serial), min(self.processes_serial)
        bars = {
            message("gil.serial"): [t / serial for t in self.serial],
            message("gil.threads", devices=self.devices): [t / serial for t in self.threads],
            message("gil.processes", devices=self.devices): [t / alone for t in self.processes],
        }
        figure = plots.new_figure(6.0, 3.2)
        axes = figure.subplots()
        for position, (label, values) in enumerate(bars.items()):
            axes.bar(position, min(values), color=plots._colour(position), alpha=0.8, label=label)
            axes.plot([position] * len(values), values, "k.", ms=3, alpha=0.6)
        axes.axhline(1 / self.devices, color="k", ls=":", alpha=0.6)
        axes.set_xticks(range(len(bars)), list(bars), fontsize=8)
        axes.set_ylabel(message("gil.relative_time"))
        axes.set_ylim(bottom=0)
        axes.set_title(title or message("gil.title", work=self.work, batch_size=self.batch_size))
        return plots.finish(figure, display)


def measure(devices: Any = 2, batch_size: int = 16, work: int = 20_000, repeats: int = 3, ranks: Any = None) -> GILRun:
    """Time ``PythonBound(work)`` on ``batch_size`` samples serially, under DataParallel's threads and in DDP's
    processes (lesson 03). ``devices``: a ``gpulab.devices(...)`` result or a count (virtual devices then).
    ``ranks``: what ``rank_times(rank, len(devices), batch_size, work, repeats)`` returned on each rank of a
    launch already made (lesson 03 folds it into its one DDP launch); by default ``measure`` launches them."""
    from gpulab import ddp
    from gpulab.data_parallel import DataParallel
    from gpulab.devices import devices as choose_devices

    if isinstance(devices, int):
        devices = choose_devices(devices, quiet=True, remember=False)
    count = len(devices)
    module = PythonBound(work).to(devices.primary)
    parallel = DataParallel(module, device_ids=devices)
    batch = torch.arange(batch_size, dtype=torch.float32).view(batch_size, 1).to(devices.primary)
    run = GILRun(devices=count, batch_size=batch_size, work=work)
    with torch.no_grad():
        parallel(batch[:count])  # warm-up: the threads and replicas once
        for _ in range(repeats):
            run.serial.append(_timed(lambda: module(batch)))
            run.threads.append(_timed(lambda: parallel(batch)))
    if ranks is None:
        ranks = ddp.launch(rank_times, count, batch_size, work, repeats)
    if len(ranks) != count:
        raise ValueError(f"expected the times of {count} ranks, got {len(ranks)}")
    run.processes_serial = list(ranks[0]["serial"])
    run.processes = [max(times) for times in zip(*(rank["parallel"] for rank in ranks), strict=True)]
    return run
