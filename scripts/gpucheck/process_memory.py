"""The ``process_memory`` step: what a CUDA process of the course holds in memory, measured, so that the grader's
memory limit for GPU machines can be set from a measurement (the limit counts resident memory, and a CUDA
process carries the driver's and the CUDA libraries' pages there).

Two processes are measured after real work on the GPU: one that does what a lesson's kernel does (import gpulab,
``gpulab.devices(2)``, a DataParallel training step) and each rank of a 2-rank DDP run (a DDP step on its GPU;
NCCL with one GPU per rank on 2+ GPUs, else gloo with both ranks on ``cuda:0``). For each: resident and peak
resident memory, the memory cgroup's count (the whole group's), and the GPU memory NVML attributes to the
process (``benchmarks/gpu_check_ranks.process_footprint``). Without a GPU nothing is measured: a CPU process
holds none of those pages, so its numbers would say nothing about the limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from gpucheck.context import BENCHMARKS, MIB, REPO, UTILS, StepContext, gpu_count

FIGURES = (
    "resident memory (RSS, peak RSS) of a lesson-like CUDA process after a DataParallel step",
    "resident memory (RSS, peak RSS) of each DDP rank after a DDP step on its GPU",
    "the memory cgroup's count (memory.current / memory.peak) next to them",
    "GPU memory NVML attributes to each of those processes",
)

KERNEL_LIKE = """
import json, torch, gpulab, gpu_check_ranks
devices = gpulab.devices(2, quiet=True)
model = gpulab.models.MLP().to(devices.primary)
gpulab.DataParallel(model, device_ids=devices)(torch.randn(64, 16, device=devices.primary)).sum().backward()
torch.cuda.synchronize()
print("FOOTPRINT " + json.dumps(gpu_check_ranks.process_footprint(devices.primary)))
"""


def _kernel_like() -> dict[str, Any]:
    path = os.pathsep.join([str(BENCHMARKS), str(UTILS), str(REPO), os.environ.get("PYTHONPATH", "")])
    completed = subprocess.run(
        [sys.executable, "-c", KERNEL_LIKE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=path),
    )
    for line in completed.stdout.splitlines():
        if line.startswith("FOOTPRINT "):
            return json.loads(line.removeprefix("FOOTPRINT "))
    raise RuntimeError(f"the lesson-like process exited with {completed.returncode}: {completed.stderr[-2000:]}")


def _record(ctx: StepContext, who: str, footprint: dict[str, Any]) -> None:
    cgroup = footprint.get("cgroup", {})
    for what, value in (
        ("RSS", footprint.get("rss_bytes")),
        ("peak RSS", footprint.get("peak_rss_bytes")),
        ("memory cgroup current (whole group)", cgroup.get("current_bytes")),
        ("NVML used by the process on its GPU", footprint.get("nvml_process_used_bytes")),
    ):
        ctx.figure(f"{who}: {what}", value / MIB if isinstance(value, int) else None, "MiB")
    if footprint.get("nvml_reason"):
        ctx.warn(f"{who}: NVML per-process memory not read: {footprint['nvml_reason']}")


def step_process_memory(ctx: StepContext) -> None:
    """What a lesson-like CUDA process and each DDP rank hold in memory (see the module docstring)."""
    gpus = gpu_count()
    if not gpus:
        ctx.status = "not_measured"
        ctx.reason = (
            "not measured: no CUDA GPU visible" + (" (--cpu)" if ctx.cpu else "") + ": a CUDA process's driver and "
            "library pages exist only on a GPU; a CPU process's numbers would not inform the GPU memory limit"
        )
        ctx.missing(list(FIGURES), ctx.reason)
        return
    import gpu_check_ranks
    from gpulab import ddp

    kernel = _kernel_like()
    ctx.details["lesson_like_process"] = kernel
    _record(ctx, "lesson-like CUDA process (gpulab.devices(2), a DataParallel step)", kernel)
    placement, backend = ("cuda-own", "nccl") if gpus >= 2 else ("cuda-shared", "gloo")
    ranks = ddp.launch(gpu_check_ranks.process_memory_rank, 2, placement, backend=backend, output="all")
    ctx.details["ddp_ranks"] = ranks
    for rank in ranks:
        _record(ctx, f"DDP rank {rank['rank']} on {rank['device']} ({rank['backend']})", rank)
    print(json.dumps(ctx.details), flush=True)
