"""The ``environment`` step: GPUs, driver, torch, CUDA, cuDNN, NCCL, CPU count, package versions."""

from __future__ import annotations

import os
import platform
from typing import Any

from gpucheck.context import StepContext, optional


def _nccl_version(torch: Any) -> str | None:
    if not torch.cuda.is_available():
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def step_environment(ctx: StepContext) -> None:
    """The machine: GPUs, driver, torch, CUDA, cuDNN, NCCL, CPU, versions of the packages the check uses."""
    from importlib import metadata

    import gpulab
    import torch
    import torch.distributed as dist

    env = gpulab.environment()
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "memory_gib": round(props.total_memory / 1024**3, 1),
                "capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count,
            }
        )
    versions = {}
    for package in ("torch", "nbgrader", "nbclient", "ipykernel", "nvidia-ml-py", "matplotlib", "jupytext", "pytest"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    ctx.details.update(
        summary=str(env),
        hardware=ctx.hardware,
        forced_cpu=ctx.cpu,
        platform=env.platform,
        os=platform.platform(),
        python=env.python,
        torch=env.torch,
        cuda=env.cuda,
        cudnn=optional(lambda: torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None),
        nccl_available=optional(lambda: dist.is_available() and dist.is_nccl_available()),
        nccl=optional(lambda: _nccl_version(torch)),
        driver=env.driver,
        gpu_count=len(env.gpus),
        gpu_names=list(env.gpus),
        gpus=gpus,
        cpu_count=env.cpu_count,
        torch_threads=torch.get_num_threads(),
        load_average=[round(load, 2) for load in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        gpulab=gpulab.__version__,
        packages=versions,
    )
    print(env)
