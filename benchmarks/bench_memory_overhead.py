"""How much slower is a training step while ``gpulab.memory.track()`` watches it on virtual devices?

Lesson 03 runs its DataParallel steps inside the memory tracker; this measures the cost, on this machine, for
the lessons' own models: a training step (forward, loss, backward, SGD step) untracked and tracked, on one
device and with ``gpulab.DataParallel`` on two virtual devices. Untracked and tracked blocks alternate, and the
medians of all repeats are compared; the blocks are short and many, so that a noisy neighbour (a shared
machine) hurts every variant alike. A third variant runs the
step under a dispatch mode that does nothing: the floor that any dispatch-level tracker pays, which is PyTorch's
cost of calling Python for every operation. It also measures the one-off cost of entering and leaving a
``track()`` block (it scans existing tensors).

    .venv/bin/python benchmarks/bench_memory_overhead.py [output.json] [--quick] [--rounds N] [--threads N]

Writes JSON (default ``benchmarks/results/memory_overhead_cpu.json``) and prints a table. Every number in the
file is measured by this run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import gpulab
import torch
from gpulab import bench, memory, models, virtual
from gpulab.devices import Devices
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "memory_overhead_cpu.json"


def machine() -> dict:
    accelerator = (
        f"{torch.cuda.device_count()} CUDA GPU(s): {torch.cuda.get_device_name(0)}"
        if torch.cuda.is_available()
        else "CPU, no GPU"
    )
    return {
        "accelerator": accelerator,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def cases(quick: bool, device: torch.device | str = "cpu") -> list[dict]:
    """The lessons' models, as the lessons use them; ``batch()`` makes the data on ``device``."""
    wide_classes = 10_000 if quick else 50_000

    def batch(size: int, features: int, classes: int):
        return lambda: (torch.randn(size, features).to(device), torch.randint(0, classes, (size,)).to(device))

    return [
        {
            "name": "MLP 16-32-4, batch 64 (lessons 01, 02, 04)",
            "model": lambda: models.MLP(16, 32, 4),
            "batch": batch(64, 16, 4),
            "repeats": 10,
        },
        {
            "name": "MLP 256-512-10, batch 256 (a mid-sized classifier)",
            "model": lambda: models.MLP(256, 512, 10),
            "batch": batch(256, 256, 10),
            "repeats": 8,
        },
        {
            "name": f"WideHead 64-128-{wide_classes}, batch 512 (lesson 03)",
            "model": lambda: models.WideHead(64, 128, wide_classes),
            "batch": batch(512, 64, wide_classes),
            "repeats": 2,
        },
    ]


class EmptyMode(TorchDispatchMode):
    """A dispatch mode that does nothing: PyTorch's own cost of routing every operation through Python."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as the tracker does (see gpulab.memory._TrackerMode)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def empty_mode():
    """The empty mode in this thread and in every replica thread, like the tracker."""
    with EmptyMode():
        virtual.register_thread_hook(EmptyMode)
        try:
            yield
        finally:
            virtual.unregister_thread_hook(EmptyMode)


def timed_steps(step, repeats: int) -> tuple[list[float], list[float]]:
    """Wall-clock and process CPU seconds of each of ``repeats`` steps.

    CPU time (all threads of this process) is much less disturbed than wall time by other processes on a
    shared machine; both are reported.
    """
    wall, cpu = [], []
    for _ in range(repeats):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - wall_start)
        cpu.append(time.process_time() - cpu_start)
    return wall, cpu


def measure(
    step, repeats: int, rounds: int, devices: Devices, *, interval: float = 0.05, empty_mode_too: bool = True
) -> dict:
    """Alternate untracked, empty-mode and tracked blocks of ``repeats`` steps; medians over all rounds.

    ``interval`` is the tracker's sampling interval (0.05 s: 20 samples per second, ``track()``'s default).
    ``empty_mode_too=False`` leaves out the empty dispatch mode (its ``*_empty_dispatch_mode*`` keys are then
    ``None``): on real GPUs the tracker uses no dispatch mode, so that floor says nothing there. On real GPUs
    the tracker's cost is its sampler thread, which wakes every ``interval``: choose ``repeats`` so that a block
    lasts several intervals, or the thread never wakes inside it.
    """
    blocks = {
        "untracked": contextlib.nullcontext,
        "empty_mode": empty_mode,
        "tracked": lambda: memory.track(devices, interval=interval),
    }
    if not empty_mode_too:
        del blocks["empty_mode"]
    wall: dict[str, list[float]] = {name: [] for name in blocks}
    cpu: dict[str, list[float]] = {name: [] for name in blocks}
    for make in blocks.values():  # warm-up, every way
        with make():
            step()
    for _ in range(rounds):
        for name, make in blocks.items():
            with make():
                walls, cpus = timed_steps(step, repeats)
            wall[name] += walls
            cpu[name] += cpus
    median_wall = {name: statistics.median(values) for name, values in wall.items() if values}
    median_cpu = {name: statistics.median(values) for name, values in cpu.items() if values}
    empty_wall, empty_cpu = median_wall.get("empty_mode"), median_cpu.get("empty_mode")
    return {
        "untracked_median_s": median_wall["untracked"],
        "empty_dispatch_mode_median_s": empty_wall,
        "tracked_median_s": median_wall["tracked"],
        "ratio": median_wall["tracked"] / median_wall["untracked"],
        "ratio_empty_dispatch_mode": empty_wall / median_wall["untracked"] if empty_wall is not None else None,
        "untracked_cpu_median_s": median_cpu["untracked"],
        "empty_dispatch_mode_cpu_median_s": empty_cpu,
        "tracked_cpu_median_s": median_cpu["tracked"],
        "cpu_ratio": median_cpu["tracked"] / median_cpu["untracked"],
        "cpu_ratio_empty_dispatch_mode": empty_cpu / median_cpu["untracked"] if empty_cpu is not None else None,
        "repeats_each": len(wall["untracked"]),
        "interval_s": interval,
    }


def entry_cost(devices: Devices, times: int = 5) -> float:
    """Median seconds to enter and leave an empty ``track()`` block (the scan of existing tensors)."""
    costs = []
    for _ in range(times):
        started = time.perf_counter()
        with memory.track(devices):
            pass
        costs.append(time.perf_counter() - started)
    return statistics.median(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", nargs="?", default=str(DEFAULT_OUTPUT))
    parser.add_argument("--quick", action="store_true", help="smaller wide head and fewer rounds (smoke test)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    options = parser.parse_args()
    if options.threads is not None:
        torch.set_num_threads(options.threads)

    devices = gpulab.devices(2, quiet=True)
    if not devices.virtual or devices.primary.type != "cpu":
        # On GPUs the tracker only reads torch.cuda's counters from a thread: no per-operation cost to measure.
        sys.exit(f"this benchmark measures the dispatch-level tracker on CPU virtual devices; here: {devices!r}")
    described = machine()  # before the run: the load average at the start
    rounds = 3 if options.quick else options.rounds
    torch.manual_seed(0)
    results = []
    for case in cases(options.quick):
        model = case["model"]()
        inputs, targets = case["batch"]()
        loss_fn = nn.CrossEntropyLoss()
        for setup, wrapped in (("1 device", model), ("DataParallel, 2 virtual devices", gpulab.DataParallel(model))):
            step = bench.make_train_step(wrapped, loss_fn, inputs, targets, lr=0.01)
            row = {"model": case["name"], "setup": setup, "batch_size": len(inputs)}
            row.update(measure(step, case["repeats"], rounds, devices))
            results.append(row)
            print(
                f"{row['model']:<52} {setup:<32} wall: untracked {row['untracked_median_s'] * 1e3:8.2f} ms, "
                f"tracked {row['tracked_median_s'] * 1e3:8.2f} ms, ratio {row['ratio']:.2f} "
                f"(empty mode {row['ratio_empty_dispatch_mode']:.2f}) | CPU time ratio {row['cpu_ratio']:.2f} "
                f"(empty mode {row['cpu_ratio_empty_dispatch_mode']:.2f})",
                flush=True,
            )
    entry = entry_cost(devices)
    print(f"entering and leaving track() (scan of existing tensors): {entry * 1e3:.1f} ms")
    report = {
        "what": (
            "training step time on CPU, untracked vs inside gpulab.memory.track() (virtual devices) vs under an "
            "empty dispatch mode (the floor of any dispatch-level tracker); medians of wall-clock and of "
            "process CPU time per step"
        ),
        "machine": described,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "rounds": rounds,
        "results": results,
        "track_entry_exit_s": entry,
    }
    report["machine"]["load_average_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    output = Path(options.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
