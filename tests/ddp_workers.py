"""Functions that tests/test_ddp.py runs on several ranks with gpulab.ddp.launch.

They live in their own importable module (not in the test file's functions or in __main__) for the same reason
a lesson writes its DDP step to a .py file: each rank is a fresh process that imports the function by name.
Running this module with torchrun exercises ``gpulab.ddp.run_under_torchrun``::

    torchrun --standalone --nproc-per-node=2 -m tests.ddp_workers
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from gpulab import ddp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 6
CLASSES = 3


def make_model(seed: int) -> nn.Module:
    """The same small classifier, with the same weights, wherever it is built with the same seed."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES))


def make_batch(seed: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(batch_size, FEATURES, generator=generator)
    targets = torch.randint(0, CLASSES, (batch_size,), generator=generator)
    return inputs, targets


def ddp_gradients(rank: int, world_size: int, batch_size: int, seed: int, device: str = "cpu") -> dict:
    """One DDP backward on this rank's equal shard of a fixed batch; returns the (all-reduced) gradients."""
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    print(f"hello from rank {rank} of {world_size}")
    model = make_model(seed).to(device)
    device_ids = None if device == "cpu" else [torch.device(device).index]
    wrapped = DistributedDataParallel(model, device_ids=device_ids)
    inputs, targets = make_batch(seed, batch_size)
    shard_inputs = inputs.chunk(world_size)[rank].to(device)
    shard_targets = targets.chunk(world_size)[rank].to(device)
    loss = nn.functional.cross_entropy(wrapped(shard_inputs), shard_targets)
    loss.backward()
    return {
        "rank": rank,
        "backend": dist.get_backend(),
        "threads": torch.get_num_threads(),
        "environment": {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")},
        "gradients": {name: parameter.grad.detach().cpu() for name, parameter in model.named_parameters()},
    }


def all_reduce_on_cuda(rank: int, world_size: int) -> list[float]:
    """All-reduce a CUDA tensor (gloo with ranks sharing one GPU, or NCCL with one GPU per rank)."""
    value = torch.full((2,), float(rank + 1), device=f"cuda:{torch.cuda.current_device()}")
    dist.all_reduce(value)
    return value.cpu().tolist()


def raise_on_rank(rank: int, world_size: int, failing_rank: int, others_sleep_s: float) -> int:
    if rank == failing_rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    time.sleep(others_sleep_s)  # the launcher must end these rather than wait for them
    return rank


def exit_on_rank(rank: int, world_size: int, failing_rank: int, exit_code: int, others_sleep_s: float) -> int:
    if rank == failing_rank:
        print(f"rank {rank} is about to call os._exit({exit_code})", file=sys.stderr, flush=True)
        os._exit(exit_code)
    time.sleep(others_sleep_s)
    return rank


def sleep_then_return(rank: int, world_size: int, seconds: float) -> int:
    time.sleep(seconds)
    return rank


def environment_and_folder(rank: int, world_size: int, name: str) -> tuple[str | None, str, int]:
    """What a rank sees of the notebook: an environment variable, the working folder, and its parent."""
    return os.environ.get(name), os.getcwd(), os.getppid()


def a_fork_server_process(rank: int, world_size: int) -> int:
    """Start a process with the fork server start method from a rank (a DataLoader's workers can), and its code."""
    import multiprocessing

    process = multiprocessing.get_context("forkserver").Process(target=sys.exit, args=(7,))
    process.start()
    process.join(60)
    return process.exitcode


def rank_and_world_size(rank: int, world_size: int) -> tuple[int, int]:
    dist.barrier()
    return rank, world_size


if __name__ == "__main__":
    result = ddp.run_under_torchrun(ddp.all_reduce_demo)
    print(f"torchrun result: {result}", flush=True)
