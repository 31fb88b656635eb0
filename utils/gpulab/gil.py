"""The GIL, measured: DataParallel's replica threads against DDP's processes on Python-bound work (lesson 03).

DataParallel runs its replicas in *threads* of one Python process (``parallel_apply``: one thread per replica).
Tensor kernels release Python's global interpreter lock (the GIL), so on GPUs the threads mostly wait for
kernels; but every line of Python in a replica's forward (hooks, loops over samples, small operations whose time
is Python's own) holds the GIL, and only one thread can run Python at a time. DDP runs one *process* per rank,
each with its own interpreter and its own GIL.

What is measured: *parallelism*, the CPU time the workers used, added up, divided by the wall time from the
first worker's start to the last one's end. It says how many cores' worth of work ran at once: two workers that
each have a core of their own give about 2, workers that take turns give at most 1. ``measure(devices)`` runs
the same Python-bound forward (``PythonBound``: a pure-Python loop per sample) on the same batch:

* **threads**: ``gpulab.DataParallel`` on ``devices`` (virtual devices use one thread per replica, as the real
  DataParallel does); each replica's thread notes its own CPU time (``time.thread_time``) around its forward;
* **processes**: ``gpulab.ddp.launch`` on as many ranks, each rank its share of the batch, after a barrier;
* **calibration**: in the same ranks, just before each of their forwards, a plain Python loop of the same
  number of steps, side by side: how much parallelism the machine gives two processes right now.

Why this holds on a machine that other programs use: CPU time counts what a worker got, not what it waited
for. Other programs lower the calibration and the processes alike (the processes are compared with the
calibration of the same repeat, taken a moment before), and the threads' parallelism cannot rise above 1
whatever else runs: a thread waiting for the GIL sleeps and uses no CPU. When the calibration stays below
``FREE_CORE``, the machine has no free second core at the moment, and then parallelism shows nothing about the
GIL: threads without a GIL could not have run at once either. ``GILRun.summary`` then says only that.

What holds at any load: *waits*. A worker gives up its core in two ways: the system takes it away (another
program's turn: an involuntary context switch) or the worker blocks, waiting for something (a voluntary one).
A pure-Python loop waits for nothing but a lock, and a replica thread that wants the GIL while another holds it
blocks on it (CPython's ``Python/ceval_gil.c``: ``take_gil`` waits on a condition variable, 5 ms at a time,
``sys.getswitchinterval``). So each worker counts its voluntary context switches during its loop
(``resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw``, Linux's count for the calling thread alone): threads
under the GIL wait, DDP's processes, each with its own GIL, do not, however busy the machine is (measured on 2
cores with 0, 6 and 12 busy Python loops beside: 17 to 129 waits per thread, 0 per process, in every run). Where
the system does not count them (not Linux), ``Span.waits`` is ``None`` and the summary says that nothing else can
show the GIL there.

The start and end of every worker are read from ``time.perf_counter``, which on Linux is the system's monotonic
clock, one clock for every process, so that the ranks' times compare.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import nn

from gpulab.messages import message

__all__ = [
    "FREE_CORE",
    "THREADS_LIMIT",
    "TRACKS",
    "WAITS",
    "GILRun",
    "PythonBound",
    "Span",
    "measure",
    "rank_spans",
]

# The judgement of a run (GILRun.problems), in units of parallelism:
THREADS_LIMIT = 1.15  # the threads never exceed this (1: one thread at a time; the rest, C work without the GIL)
FREE_CORE = 1.3  # a calibration this high or higher: a second core is free enough to show the processes' speed-up
TRACKS = 0.8  # the processes reach at least this share of the calibration of the same repeat
# and, at any load, in voluntary context switches per worker and repeat (the module's docstring):
WAITS = 1  # the threads waited at least this often on average, the processes less often


@dataclass
class Span:
    """One worker's run: ``worker`` (a process's id, or a thread's native id: the system does not give it to the
    next thread at once, as Python may give a finished thread's ``threading.get_ident``), ``cpu`` (seconds of CPU
    it used), ``start`` and ``end`` (``time.perf_counter``), ``waits`` (the times it gave up its core by itself,
    blocking: ``_waits``; ``None`` where the system does not count them)."""

    worker: int
    cpu: float
    start: float
    end: float
    waits: int | None = None


def parallelism(spans: list[Span]) -> float:
    """The workers' CPU time added up / the wall time from the first start to the last end."""
    wall = max(span.end for span in spans) - min(span.start for span in spans)
    return sum(span.cpu for span in spans) / wall


def _loop(value: float, steps: int) -> float:
    """The Python-level work of one sample: nothing but the interpreter, no kernel."""
    total = 0.0
    for step in range(steps):
        total += (value + step) % 7.0
    return total


def _waits() -> int | None:
    """The calling thread's voluntary context switches so far (``RUSAGE_THREAD``: Linux only); else ``None``."""
    try:
        import resource  # not on Windows
    except ImportError:
        return None
    if not hasattr(resource, "RUSAGE_THREAD"):
        return None
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw


def _timed(worker: int, fn) -> tuple[Any, Span]:
    waits, started, cpu = _waits(), time.perf_counter(), time.thread_time()
    result = fn()
    cpu, ended, waits_after = time.thread_time() - cpu, time.perf_counter(), _waits()
    waited = None if waits is None or waits_after is None else waits_after - waits
    return result, Span(worker=worker, cpu=cpu, start=started, end=ended, waits=waited)


class PythonBound(nn.Module):
    """A forward whose time is Python's, not a kernel's: ``work`` steps of a pure-Python loop per sample.

    Returns one number per sample (times a one-element parameter, so that DataParallel has something to
    broadcast), on the input's device. Each call notes its thread's ``Span`` in ``spans``, a list that
    DataParallel's replicas share with the module they copy.
    """

    def __init__(self, work: int = 20_000):
        super().__init__()
        self.work = work
        self.scale = nn.Parameter(torch.ones(1))
        self.spans: list[Span] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = x.flatten(1)[:, 0].tolist()
        results, span = _timed(threading.get_native_id(), lambda: [_loop(value, self.work) for value in values])
        self.spans.append(span)
        return torch.tensor(results, dtype=x.dtype, device=x.device) * self.scale


def rank_spans(rank: int, world_size: int, batch_size: int, work: int, repeats: int) -> dict[str, list[dict]]:
    """What each DDP rank of ``measure`` runs: per repeat, after a barrier, a plain Python loop of as many steps
    as its chunk of the batch (the calibration), then after another barrier the forward on its chunk. Returns
    ``{"calibration": [...], "processes": [...]}``, one ``Span`` (as a dict) per repeat."""
    import torch.distributed as dist

    module = PythonBound(work)
    batch = torch.arange(batch_size, dtype=torch.float32).view(batch_size, 1)
    chunk = batch.chunk(world_size)[rank]
    values = chunk.flatten().tolist()
    pid = os.getpid()
    calibration, processes = [], []
    with torch.no_grad():
        module(chunk[:1])  # warm-up
        for _ in range(repeats):
            dist.barrier()
            calibration.append(asdict(_timed(pid, lambda: [_loop(value, work) for value in values])[1]))
            dist.barrier()
            module.spans.clear()
            module(chunk)
            processes.append(asdict(replace(module.spans[-1], worker=pid)))
    return {"calibration": calibration, "processes": processes}


@dataclass
class GILRun:
    """One ``measure`` run (lesson 03): per repeat, every worker's ``Span``.

    * ``threads``: DataParallel's replica threads on the whole batch;
    * ``calibration``: the DDP ranks running a plain Python loop side by side;
    * ``processes``: the DDP ranks each running the forward on its chunk, a moment after the calibration.
    """

    devices: int
    batch_size: int
    work: int
    threads: list[list[Span]] = field(default_factory=list)
    calibration: list[list[Span]] = field(default_factory=list)
    processes: list[list[Span]] = field(default_factory=list)

    @property
    def threads_parallelism(self) -> list[float]:
        """Per repeat: at most about 1 (the GIL lets one thread run Python at a time)."""
        return [parallelism(spans) for spans in self.threads]

    @property
    def calibration_parallelism(self) -> list[float]:
        """Per repeat: what the machine gave two plain Python processes (about ``devices`` on free cores)."""
        return [parallelism(spans) for spans in self.calibration]

    @property
    def processes_parallelism(self) -> list[float]:
        """Per repeat: about the calibration of the same repeat (each process has its own GIL)."""
        return [parallelism(spans) for spans in self.processes]

    @property
    def free_core(self) -> bool:
        """Whether the calibration showed, in some repeat, a second core free enough to show a speed-up."""
        return max(self.calibration_parallelism) >= FREE_CORE

    def waits(self, name: str) -> int | None:
        """The ``"threads"``' or the ``"processes"``' waits (voluntary context switches in their loops), added up
        over every worker and repeat; ``None`` where the system does not count them."""
        spans = [span for repeat in getattr(self, name) for span in repeat]
        if not spans or any(span.waits is None for span in spans):
            return None
        return sum(span.waits for span in spans)

    @property
    def shown_by_waits(self) -> bool | None:
        """Whether the waits show the GIL, at any load: the threads waited at least ``WAITS`` times per worker and
        repeat on average, the processes less often; ``None`` where the system does not count waits."""
        threads, processes = self.waits("threads"), self.waits("processes")
        if threads is None or processes is None:
            return None
        spans = {name: sum(len(repeat) for repeat in getattr(self, name)) for name in ("threads", "processes")}
        return threads >= WAITS * spans["threads"] and processes < WAITS * spans["processes"]

    def problems(self) -> list[str]:
        """What contradicts the claim in this run (empty: it holds): a repeat in which the threads ran more than
        ``THREADS_LIMIT`` cores' worth at once; when ``free_core``, no repeat with a free core in which the
        processes reached ``TRACKS`` of that repeat's calibration (without one the processes' parallelism is not
        judged: ``summary`` says so); and, where the system counts them, waits that do not show the GIL
        (``shown_by_waits``)."""
        found = [
            f"repeat {index}: the threads' parallelism is {value:.2f} > {THREADS_LIMIT}"
            for index, value in enumerate(self.threads_parallelism)
            if value > THREADS_LIMIT
        ]
        if self.free_core:
            pairs = [
                (processes, calibration)
                for processes, calibration in zip(self.processes_parallelism, self.calibration_parallelism, strict=True)
                if calibration >= FREE_CORE
            ]
            if not any(processes >= TRACKS * calibration for processes, calibration in pairs):
                found.append(
                    "in no repeat with a free core did the processes reach "
                    f"{TRACKS} x the calibration: (processes, calibration) = "
                    + ", ".join(f"({p:.2f}, {c:.2f})" for p, c in pairs)
                )
        if self.shown_by_waits is False:
            found.append(
                f"the waits do not show the GIL: threads {self.waits('threads')}, processes {self.waits('processes')}"
            )
        return found

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            threads_parallelism=self.threads_parallelism,
            calibration_parallelism=self.calibration_parallelism,
            processes_parallelism=self.processes_parallelism,
            free_core=self.free_core,
            threads_waits=self.waits("threads"),
            processes_waits=self.waits("processes"),
            shown_by_waits=self.shown_by_waits,
        )
        return data

    def summary(self) -> str:
        """The highest parallelism of the repeats, each way; without a free core, only that these show nothing
        about the GIL now; then the waits (``shown_by_waits``) and whether they show it."""
        text = message(
            "gil.summary",
            devices=self.devices,
            repeats=len(self.threads),
            calibration=max(self.calibration_parallelism),
            threads=max(self.threads_parallelism),
            processes=max(self.processes_parallelism),
        )
        if not self.free_core:
            text += "\n" + message("gil.no_free_core", calibration=max(self.calibration_parallelism))
        shown = self.shown_by_waits
        if shown is None:
            return text + ("" if self.free_core else "\n" + message("gil.no_waits"))
        text += "\n" + message(
            "gil.waits", devices=self.devices, threads=self.waits("threads"), processes=self.waits("processes")
        )
        return text + "\n" + message("gil.waits_show" if shown else "gil.waits_do_not_show")

    def plot(self, display: bool = True, title: str | None = None):
        """Each way's highest parallelism as a bar, every repeat as a dot (``gpulab.plots.finish``)."""
        from gpulab import plots

        bars = {
            message("gil.calibration", devices=self.devices): self.calibration_parallelism,
            message("gil.threads", devices=self.devices): self.threads_parallelism,
            message("gil.processes", devices=self.devices): self.processes_parallelism,
        }
        figure = plots.new_figure(6.0, 3.4)
        axes = figure.subplots()
        for position, values in enumerate(bars.values()):
            axes.bar(position, max(values), color=plots._colour(position), alpha=0.8)
            axes.plot([position] * len(values), values, "k.", ms=4, alpha=0.6)
        axes.axhline(1, color="k", ls=":", alpha=0.6)
        axes.set_xticks(range(len(bars)), list(bars), fontsize=8)
        axes.set_ylabel(message("gil.parallelism"))
        axes.set_ylim(0, max(self.devices, *(max(values) for values in bars.values())) * 1.1)
        axes.set_title(title or message("gil.title", work=self.work, batch_size=self.batch_size), fontsize=10)
        return plots.finish(figure, display)


def measure(devices: Any = 2, batch_size: int = 16, work: int = 50_000, repeats: int = 3, ranks: Any = None) -> GILRun:
    """Run ``PythonBound(work)`` on ``batch_size`` samples under DataParallel's threads and in DDP's processes,
    with the processes' calibration, ``repeats`` times each (lesson 03). ``devices``: a ``gpulab.devices(...)``
    result or a count (virtual devices then). ``ranks``: what ``rank_spans(rank, len(devices), batch_size, work,
    repeats)`` returned on each rank of a launch already made; by default ``measure`` launches them."""
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
            module.spans.clear()
            parallel(batch)
            run.threads.append(list(module.spans))
    here = threading.get_native_id()
    for spans in run.threads:  # one span per replica, each from a thread of its own, none from this one
        workers = {span.worker for span in spans}
        if len(spans) != count or len(workers) != count or here in workers:
            raise RuntimeError(f"expected {count} replica threads, got spans from threads {sorted(workers)}")
    if ranks is None:
        ranks = ddp.launch(rank_spans, count, batch_size, work, repeats)
    if len(ranks) != count:
        raise ValueError(f"expected the spans of {count} ranks, got {len(ranks)}")
    for name in ("calibration", "processes"):
        per_repeat = zip(*(rank[name] for rank in ranks), strict=True)
        getattr(run, name).extend([Span(**span) for span in spans] for spans in per_repeat)
    return run
