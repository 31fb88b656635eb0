"""Virtual DataParallel step vs one-device step on this machine, for lesson-sized models and batches.

Writes a JSON report (default ``benchmarks/results/virtual_dp_cpu.json``) with the median step times, their
ratio (target: at most 2x) and a description of the machine. Every number is measured when it runs.

    .venv/bin/python benchmarks/bench_virtual_dp.py [OUT.json]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import gpulab
import torch
from torch import nn

CASES = [
    # (name, model factory, batch size, input features, classes)
    ("MLP 16-32-4, batch 64 (lessons 01, 02, 04)", lambda: gpulab.models.MLP(16, 32, 4), 64, 16, 4),
    ("MLP 256-1024-10, batch 256", lambda: gpulab.models.MLP(256, 1024, 10), 256, 256, 10),
    ("WideHead 64-128-50000, batch 512 (lesson 03)", lambda: gpulab.models.WideHead(64, 128, 50_000), 512, 64, 50_000),
]


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
    for name, factory, batch, features, classes in CASES:
        inputs = torch.randn(batch, features, device=devices.primary)
        labels = torch.randint(0, classes, (batch,), device=devices.primary)
        repeats = 30 if classes < 1000 else 7
        single = median_step_seconds(factory().to(devices.primary), inputs, labels, repeats)
        virtual = median_step_seconds(gpulab.DataParallel(factory().to(devices.primary)), inputs, labels, repeats)
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
