"""Functions that ``scripts/gpu_check.py`` runs on DDP ranks with ``gpulab.ddp.launch``.

They live in this importable module, not in the script: each rank is a fresh Python process (spawn) that imports
the function by name, and a function of the script being run lives in ``__main__``, which a rank cannot import
(the same reason a lesson writes its DDP step to a ``.py`` file). ``scripts/gpu_check.py`` puts ``benchmarks/`` on
``sys.path``; spawned ranks inherit it, so ``gpu_check_ranks`` and ``bench_virtual_dp`` import there too.

Where a rank's model and data live (``placement``):

* ``"cpu"``: the CPU (gloo), for ``gpu_check.py --cpu`` and machines without a GPU.
* ``"cuda-shared"``: every rank on ``cuda:0`` (gloo, which runs collectives on CUDA tensors too). ``ddp.launch``
  pins ranks to GPUs only for NCCL, so each rank calls ``torch.cuda.set_device(0)`` itself: the one-GPU case.
* ``"cuda-own"``: rank ``r`` on ``cuda:r`` (NCCL, which ``ddp.launch`` pins the same way): real multi-GPU DDP.
"""

from __future__ import annotations

import os
from typing import Any

import bench_virtual_dp
import torch
import torch.distributed as dist
from gpulab import bench
from torch import nn
from torch.nn.parallel import DistributedDataParallel

PLACEMENTS = ("cpu", "cuda-shared", "cuda-own")


def rank_device(rank: int, placement: str) -> torch.device:
    """The device this rank computes on, made current for CUDA (see the module docstring)."""
    if placement == "cpu":
        return torch.device("cpu")
    if placement == "cuda-shared":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    if placement == "cuda-own":
        index = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")


def ddp_step_timing(
    rank: int, world_size: int, case_index: int, quick: bool, placement: str, warmup: int, repeats: int
) -> dict[str, Any]:
    """Time DDP training steps of ``bench_virtual_dp.cases(quick)[case_index]`` on this rank.

    The case's batch is the *global* batch: each rank trains on its equal share (``batch // world_size``
    samples), so the result compares with one device and DataParallel on the same batch. Returns this rank's
    ``gpulab.bench.StepTiming`` (combine the ranks with ``bench.merge_ranks``), its device, the process group's
    backend and, on CUDA, this process's peak allocated bytes on its device (per-GPU memory under DDP).
    """
    case = bench_virtual_dp.cases(quick)[case_index]
    device = rank_device(rank, placement)
    torch.manual_seed(0)
    model = case.make_model().to(device)
    wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    inputs, labels = case.make_batch(device)
    share = case.batch // world_size
    rank_inputs = inputs[rank * share : (rank + 1) * share]
    rank_labels = labels[rank * share : (rank + 1) * share]
    del inputs, labels
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    step = bench.make_train_step(wrapped, nn.functional.cross_entropy, rank_inputs, rank_labels)
    timing = bench.time_ddp_step(step, share, warmup, repeats, label=f"DDP, {world_size} ranks", method="DDP")
    return {
        "rank": rank,
        "device": str(device),
        "backend": dist.get_backend(),
        "threads": torch.get_num_threads(),
        "timing": timing,
        "peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    }


def process_footprint(device: torch.device | None = None) -> dict[str, Any]:
    """What this process holds in memory, as the grader's memory watchdog and the driver see it.

    * ``rss_bytes`` / ``peak_rss_bytes``: resident and peak resident memory (``/proc/self/status``, VmRSS and VmHWM):
      with CUDA, the driver's and the CUDA libraries' pages count here.
    * ``cgroup``: the memory cgroup's own count (v2 ``memory.current`` and ``memory.peak``, v1
      ``memory.usage_in_bytes``) and its path; it counts every process of the group, not this one alone.
    * ``nvml_process_used_bytes``: the GPU memory NVML says this process uses on ``device``
      (``nvmlDeviceGetComputeRunningProcesses``, matched by PID; ``None`` with the reason when it cannot be read,
      e.g. in a PID namespace, where NVML reports the host's PIDs).
    """
    found: dict[str, Any] = {"pid": os.getpid()}
    try:
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
        found["rss_bytes"] = int(status["VmRSS"].split()[0]) * 1024
        found["peak_rss_bytes"] = int(status["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError) as error:
        found["rss_bytes"] = found["peak_rss_bytes"] = None
        found["rss_unreadable"] = f"{type(error).__name__}: {error}"
    found["cgroup"] = _cgroup_memory()
    found["nvml_process_used_bytes"], found["nvml_reason"] = _nvml_process_used(device)
    return found


def _cgroup_memory() -> dict[str, Any]:
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError as error:
        return {"reason": f"no /proc/self/cgroup ({error})"}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            folder = f"/sys/fs/cgroup{path}"
            files = {"current_bytes": "memory.current", "peak_bytes": "memory.peak", "max": "memory.max"}
        elif "memory" in controllers.split(","):  # cgroup v1
            folder = f"/sys/fs/cgroup/memory{path}"
            files = {"current_bytes": "memory.usage_in_bytes", "peak_bytes": "memory.max_usage_in_bytes"}
        else:
            continue
        values: dict[str, Any] = {"path": path, "version": 2 if controllers == "" else 1}
        for key, name in files.items():
            try:
                text = open(os.path.join(folder, name)).read().strip()
                values[key] = int(text) if text.isdigit() else text
            except OSError:
                values[key] = None
        return values
    return {"reason": "no memory cgroup found in /proc/self/cgroup"}


def _nvml_process_used(device: torch.device | None) -> tuple[int | None, str | None]:
    if device is None or device.type != "cuda":
        return None, "not a CUDA process"
    try:
        import pynvml
        from gpulab import nvml

        pynvml.nvmlInit()
    except Exception as error:  # noqa: BLE001
        return None, f"NVML unavailable ({type(error).__name__}: {error})"
    try:
        handle = nvml.handle(pynvml, device.index or 0)
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid():
                if process.usedGpuMemory is None:
                    return None, "NVML lists this process without its used memory"
                return int(process.usedGpuMemory), None
        return None, "this PID is not among NVML's compute processes (a PID namespace: NVML reports host PIDs)"
    except Exception as error:  # noqa: BLE001
        return None, f"{type(error).__name__}: {error}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def process_memory_rank(rank: int, world_size: int, placement: str) -> dict[str, Any]:
    """One DDP training step of the lessons' MLP on this rank's device, then what the rank holds in memory."""
    from gpulab import models

    device = rank_device(rank, placement)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        models.MLP().to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    loss = model(torch.randn(64, 16, device=device)).sum()
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"rank": rank, "device": str(device), "backend": dist.get_backend(), **process_footprint(device)}
