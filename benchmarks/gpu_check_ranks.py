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
