"""Virtual DataParallel step vs one-device step on this machine, for lesson-sized models and batches.

Writes a JSON report (default ``benchmarks/results/virtual_dp_cpu.json``) with the median step times, their
ratio (target: at most 2x) and a description of the machine. Every number is measured when it runs.

    .venv/bin/python benchmarks/bench_virtual_dp.py [OUT.json]

``cases()`` (the lessons' models and batches) is shared with ``scripts/gpu_check.py``, which times the same
cases with ``gpulab.bench`` on one device, on virtual DataParallel and on DDP ranks.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gpulab
import torch
from torch import nn


@dataclass(frozen=True)
class Case:
    """A lesson model and the batch it trains on: ``model_name(*sizes)`` on ``batch`` samples."""

    name: str
    model_name: str  # a class of gpulab.models: "MLP" or "WideHead"
    sizes: tuple[int, int, int]  # (in_features, hidden, classes)
    batch: int

    @property
    def features(self) -> int:
        return self.sizes[0]

    @property
    def classes(self) -> int:
        return self.sizes[2]

    def make_model(self) -> nn.Module:
        return getattr(gpulab.models, self.model_name)(*self.sizes)

    def make_batch(self, device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Seeded random inputs and class labels, made on the CPU (the same on every machine) and moved."""
        generator = torch.Generator().manual_seed(seed)
        inputs = torch.randn(self.batch, self.features, generator=generator)
        labels = torch.randint(0, self.classes, (self.batch,), generator=generator)
        return inputs.to(device), labels.to(device)


def cases(quick: bool = False) -> list[Case]:
    """The benchmarked cases; ``quick`` keeps the two lesson models and shrinks lesson 03's wide head."""
    wide_classes = 10_000 if quick else 50_000
    chosen = [
        Case("MLP 16-32-4, batch 64 (lessons 01, 02, 04)", "MLP", (16, 32, 4), 64),
        Case("MLP 256-1024-10, batch 256", "MLP", (256, 1024, 10), 256),
        Case(f"WideHead 64-128-{wide_classes}, batch 512 (lesson 03)", "WideHead", (64, 128, wide_classes), 512),
    ]
    return [chosen[0], chosen[2]] if quick else chosen


def median_step_seconds(model: nn.Module, inputs, labels, repeats: int, warmup: int = 3) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    for step in range(warmup + repeats):
        started = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(out_path: str = "benchmarks/results/virtual_dp_cpu.json") -> dict:
    devices = gpulab.devices(2, quiet=True)
    torch.manual_seed(0)
    results = []
    for case in cases():
        name = case.name
        inputs, labels = case.make_batch(devices.primary)
        repeats = 30 if case.classes < 1000 else 7
        single = median_step_seconds(case.make_model().to(devices.primary), inputs, labels, repeats)
        wrapped = gpulab.DataParallel(case.make_model().to(devices.primary))
        virtual = median_step_seconds(wrapped, inputs, labels, repeats)
        results.append(
            {
                "case": name,
                "one_device_step_s": round(single, 6),
                "data_parallel_step_s": round(virtual, 6),
                "ratio": round(virtual / single, 2),
                "within_target_2x": virtual / single <= 2.0,
            }
        )
        print(f"{name}: one device {single * 1e3:.2f} ms, DataParallel {virtual * 1e3:.2f} ms, x{virtual / single:.2f}")
    report = {
        "benchmark": "virtual DataParallel step vs one-device step (forward, backward, SGD step), median",
        "devices": devices.reason,
        "results": results,
        "machine": {
            "accelerator": "CPU, no GPU" if not torch.cuda.is_available() else torch.cuda.get_device_name(0),
            "cpu_count": os.cpu_count(),
            "load_average_1_5_15_min": [round(x, 2) for x in os.getloadavg()],
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main(*sys.argv[1:])
