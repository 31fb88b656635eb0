"""Timing training steps properly: warm-up, synchronised clocks, the median of repeats, samples per second.

Lesson 03 (GPU-0 imbalance and the bandwidth bottleneck) times DDP's step on real GPUs, to set measured compute
next to its byte-based prediction (``gpulab.scaling``); on virtual devices a step time says nothing about GPUs, so
the lesson counts bytes instead. The GPU check (``scripts/gpu_check.py``) times one device, ``DataParallel`` and
DDP on the same model and batch. The helpers are generic: any zero-argument callable that runs one step can be
timed.

* ``time_step(step_fn, batch_size)`` times a step in this process.
* ``compare({"1 device": step_a, "DataParallel": step_b}, batch_size)`` times several and returns a list that
  ``gpulab.plots.plot_step_times`` draws.
* ``time_ddp_step(step_fn, batch_size)`` is what a DDP rank calls (inside a function given to
  ``gpulab.ddp.launch``) to time its own steps; ``merge_ranks`` turns the ranks' results into one.

On GPUs every measurement is bracketed by ``torch.cuda.synchronize()``: CUDA kernels run asynchronously, so
without it a clock measures only how fast Python queues work.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from gpulab.messages import message

__all__ = [
    "PROGRESS_AFTER_S",
    "StepTiming",
    "compare",
    "devices_in_use",
    "make_train_step",
    "merge_ranks",
    "synchronize",
    "time_ddp_step",
    "time_step",
]

# Show a progress bar (with progress=None) when the timed repeats are expected to take longer than this.
PROGRESS_AFTER_S = 3.0


@dataclass
class StepTiming:
    """The timing of one kind of step (lesson 03).

    * ``median_s``: median seconds per step over the repeats (robust to a stray slow step).
    * ``samples_per_s``: ``batch_size / median_s``.
    * ``times``: every repeat's seconds, in order (warm-up steps excluded).
    * ``batch_size``: samples per step, over all devices (for DDP: every rank's batch together).
    * ``devices``: how many devices the step used; ``method``: e.g. ``"1 device"``, ``"DataParallel"``,
      ``"DDP"`` (``plots.plot_scaling`` draws one line per method); ``rank``: the DDP rank that measured it.
    """

    label: str
    median_s: float
    samples_per_s: float
    times: list[float] = field(default_factory=list)
    batch_size: int = 0
    devices: int = 1
    method: str | None = None
    warmup: int = 0
    rank: int | None = None
    world_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain values, ready for JSON (lesson 03 keeps its timings this way)."""
        return asdict(self)

    def __str__(self) -> str:
        return message(
            "bench.timing",
            label=self.label,
            ms=f"{self.median_s * 1e3:.2f}",
            repeats=len(self.times),
            samples_per_s=f"{self.samples_per_s:,.0f}",
        )


def synchronize(devices: Sequence[int] | None = None) -> None:
    """Wait for every queued CUDA kernel on the GPUs this process uses (nothing to do without CUDA) (lesson 03).

    ``devices``: the GPU indices to wait for; by default ``devices_in_use()``. Never every visible GPU:
    ``torch.cuda.synchronize(i)`` creates a CUDA context on GPU ``i`` (hundreds of MiB) when it has none, and on
    an exclusive-process box a GPU another process holds refuses a second context (the call fails).
    """
    for index in devices_in_use() if devices is None else devices:
        torch.cuda.synchronize(index)


def devices_in_use() -> list[int]:
    """The GPUs this process has used: a DDP rank's own GPU, else each GPU whose caching allocator holds memory.

    Reading the allocator's statistics (``torch.cuda.memory_reserved``, host-side counters in
    ``torch/cuda/memory.py``) creates no CUDA context, unlike ``torch.cuda.synchronize(i)``. Every kernel the
    lessons time works on tensors from the caching allocator (cuBLAS's workspace comes from it too), so a GPU
    with nothing reserved has nothing queued that the timing is waiting for.
    """
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return [torch.cuda.current_device()]
    return [index for index in range(torch.cuda.device_count()) if torch.cuda.memory_reserved(index) > 0]


def _check_counts(batch_size: int, warmup: int, repeats: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")


def _progress_bar(total: int, label: str, initial: int = 0):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=label, unit="step", leave=False)


def _timed_repeats(
    step_fn: Callable[[], Any],
    warmup: int,
    repeats: int,
    label: str,
    progress: bool | None,
    before_each: Callable[[], None] | None,
    sync: bool,
) -> list[float]:
    """Run ``warmup`` untimed steps, then ``repeats`` timed ones; returns each timed step's seconds.

    One progress bar covers all the steps: from the start with ``progress=True``; with ``progress=None`` it
    appears as soon as the steps left, at the pace of the last one, would take more than ``PROGRESS_AFTER_S``.
    """
    total = warmup + repeats
    bar = _progress_bar(total, label) if progress else None
    times: list[float] = []
    try:
        for done in range(1, total + 1):
            timed = done > warmup
            if timed and before_each is not None:
                before_each()
            if timed and sync:
                synchronize()
            started = time.perf_counter()
            step_fn()
            if sync:
                synchronize()
            duration = time.perf_counter() - started
            if timed:
                times.append(duration)
            if bar is not None:
                bar.update(1)
            elif progress is None and duration * (total - done) > PROGRESS_AFTER_S:
                bar = _progress_bar(total, label, initial=done)
    finally:
        if bar is not None:
            bar.close()
    return times


def time_step(
    step_fn: Callable[[], Any],
    batch_size: int,
    warmup: int = 2,
    repeats: int = 10,
    *,
    label: str = "step",
    devices: int = 1,
    method: str | None = None,
    progress: bool | None = None,
    sync: bool | None = None,
) -> StepTiming:
    """Time ``step_fn()`` (one training step on ``batch_size`` samples) in this process (lesson 03).

    ``warmup`` untimed steps first (allocator, caches, lazy initialisation), then ``repeats`` timed ones, each
    between ``torch.cuda.synchronize()`` calls when CUDA is in use (``sync=None`` decides; ``True``/``False``
    force it). Returns their median and the throughput. ``progress=None`` shows a ``tqdm.auto`` bar only when
    the steps should take more than a few seconds (``PROGRESS_AFTER_S``); ``True``/``False`` force it.
    """
    _check_counts(batch_size, warmup, repeats)
    if sync is None:
        sync = torch.cuda.is_available()
    times = _timed_repeats(step_fn, warmup, repeats, label, progress, None, sync)
    median = statistics.median(times)
    return StepTiming(
        label=label,
        median_s=median,
        samples_per_s=batch_size / median if median > 0 else float("inf"),
        times=times,
        batch_size=batch_size,
        devices=devices,
        method=method,
        warmup=warmup,
    )


def compare(
    steps: Mapping[str, Callable[[], Any]],
    batch_size: int,
    warmup: int = 2,
    repeats: int = 10,
    *,
    devices: Mapping[str, int] | None = None,
    methods: Mapping[str, str] | None = None,
    progress: bool | None = None,
) -> list[StepTiming]:
    """Time several kinds of step on the same batch, e.g. one device vs DataParallel (lesson 03).

    ``steps`` maps a label to a zero-argument step function; ``devices`` and ``methods`` optionally map the
    same labels to the number of devices used and a method name (for ``plots.plot_scaling``). The setups run
    one after the other, in order; the result is a list of ``StepTiming`` for ``plots.plot_step_times``.
    """
    devices = devices or {}
    methods = methods or {}
    return [
        time_step(
            step_fn,
            batch_size,
            warmup,
            repeats,
            label=label,
            devices=devices.get(label, 1),
            method=methods.get(label),
            progress=progress,
        )
        for label, step_fn in steps.items()
    ]


def make_train_step(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    inputs: Any,
    targets: torch.Tensor,
    optimizer: torch.optim.Optimizer | None = None,
    lr: float = 0.01,
) -> Callable[[], float]:
    """A zero-argument function running one full training step of ``model`` on ``(inputs, targets)`` (lesson 03).

    Forward, ``loss_fn(model(inputs), targets)``, backward, optimizer step (SGD with ``lr`` unless
    ``optimizer`` is given); returns the loss as a float. ``model`` may be bare, ``DataParallel`` or DDP.
    """
    if optimizer is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


def time_ddp_step(
    step_fn: Callable[[], Any],
    batch_size: int,
    warmup: int = 2,
    repeats: int = 10,
    *,
    label: str = "DDP",
    method: str = "DDP",
    progress: bool = False,
    sync: bool | None = None,
) -> StepTiming:
    """Time this DDP rank's steps; call it inside the rank function given to ``gpulab.ddp.launch`` (lesson 03).

    ``batch_size`` is this rank's batch. All ranks must call it with the same counts: before each timed step
    the ranks meet at a barrier so that they start together, and the step itself (forward, backward with its
    all-reduce, optimizer step) is timed as in ``time_step``. The result's ``batch_size`` and ``samples_per_s``
    count every rank's samples (``batch_size * world_size``), its ``rank`` says who measured it; return it
    from the rank function and combine the ranks with ``merge_ranks``. The function must live in an importable
    module (a ``.py`` file), like every function DDP runs in its processes.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "time_ddp_step runs inside a DDP rank: call it from the function given to gpulab.ddp.launch "
            "(or under torchrun after init_process_group)"
        )
    _check_counts(batch_size, warmup, repeats)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if sync is None:
        sync = torch.cuda.is_available()
    show = bool(progress) and rank == 0
    times = _timed_repeats(step_fn, warmup, repeats, label, show, dist.barrier, sync)
    median = statistics.median(times)
    total = batch_size * world_size
    return StepTiming(
        label=label,
        median_s=median,
        samples_per_s=total / median if median > 0 else float("inf"),
        times=times,
        batch_size=total,
        devices=world_size,
        method=method,
        warmup=warmup,
        rank=rank,
        world_size=world_size,
    )


def merge_ranks(results: Sequence[StepTiming], label: str | None = None) -> StepTiming:
    """One ``StepTiming`` from every rank's ``time_ddp_step`` result (lesson 03).

    A DDP step is finished when its slowest rank is, so repeat *k* takes the longest of the ranks' *k*-th
    times; the median and the throughput follow from those.
    """
    results = [result for result in results if result is not None]
    if not results:
        raise ValueError("merge_ranks needs at least one rank's StepTiming")
    counts = {len(result.times) for result in results}
    if len(counts) != 1:
        raise ValueError(f"the ranks timed different numbers of steps: {sorted(counts)}")
    times = [max(values) for values in zip(*(result.times for result in results), strict=True)]
    median = statistics.median(times)
    first = results[0]
    return StepTiming(
        label=label or first.label,
        median_s=median,
        samples_per_s=first.batch_size / median if median > 0 else float("inf"),
        times=times,
        batch_size=first.batch_size,
        devices=first.devices,
        method=first.method,
        warmup=first.warmup,
        rank=None,
        world_size=first.world_size,
    )
