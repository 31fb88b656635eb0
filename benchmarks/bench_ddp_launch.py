"""How long gpulab.ddp.launch takes from the call to the results, with 2 ranks (target: <= 5 s on 2 cores).

The ranks run ``gpulab.ddp.all_reduce_demo`` (one all-reduce), so the time is almost all start-up. The first
launch in a process starts multiprocessing's fork server, which imports torch once, and forks the ranks from it;
each later launch only forks new ranks from the same server and creates the process group. So the first launch
(what a learner's first DDP cell costs) is reported on its own, beside the median of the later ones.

    .venv/bin/python benchmarks/bench_ddp_launch.py [results.json]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from gpulab import ddp

WORLD_SIZE = 2
REPEATS = 4  # the first launch, then three more
TARGET_S = 5.0
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "ddp_launch_cpu.json"


def describe_machine() -> dict:
    gpu_count = torch.cuda.device_count()
    accelerator = f"{gpu_count} x {torch.cuda.get_device_name(0)}" if gpu_count else "CPU, no GPU"
    load_average = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "accelerator": accelerator,
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15_min": [round(load, 2) for load in load_average] if load_average else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def time_launches(repeats: int = REPEATS, world_size: int = WORLD_SIZE) -> tuple[list[float], str]:
    """Seconds of each of ``repeats`` launches of ``all_reduce_demo`` on ``world_size`` ranks, and the backend.

    Also used by ``scripts/gpu_check.py``. Raises ``RuntimeError`` if the all-reduce gives a wrong sum.
    """
    durations = []
    backend = ""
    for _ in range(repeats):
        started = time.perf_counter()
        results = ddp.launch(ddp.all_reduce_demo, world_size, output="none")
        durations.append(time.perf_counter() - started)
        expected_sum = world_size * (world_size + 1) / 2
        if [result["after"] for result in results] != [expected_sum] * world_size:
            raise RuntimeError(f"all_reduce_demo returned wrong sums: {results}")
        backend = results[0]["backend"]
    return durations, backend


def main(output_path: Path) -> dict:
    machine = describe_machine()  # before the launches: the load average they meet
    durations, backend = time_launches()
    median_s = statistics.median(durations[1:])
    report = {
        "benchmark": "gpulab.ddp.launch wall time, call to results",
        "function": "gpulab.ddp.all_reduce_demo",
        "world_size": WORLD_SIZE,
        "backend": backend,
        "repeats": REPEATS,
        "durations_s": [round(duration, 3) for duration in durations],
        "first_launch_s": round(durations[0], 3),
        "later_launches_median_s": round(median_s, 3),
        "target_s": TARGET_S,
        "within_target": max(durations[0], median_s) <= TARGET_S,
        "machine": machine,
    }
    output_path.parent.mkdir(parents=True, exist_ok=True)
    output_path.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    destination = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT
    measured = main(destination)
    print(
        f"launch with {WORLD_SIZE} ranks ({measured['backend']}): first {measured['first_launch_s']:.2f} s, "
        f"later median {measured['later_launches_median_s']:.2f} s {measured['durations_s']} on "
        f"{measured['machine']['accelerator']}, "
        f"{measured['machine']['cpu_count']} CPUs; written to {destination}"
    )
