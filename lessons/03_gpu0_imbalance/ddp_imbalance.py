"""Lesson 03: the lesson's DataParallel training, run under DDP and measured on every rank.

``gpulab.ddp.launch(ddp_imbalance.memory_and_timing, 2, ...)`` runs ``memory_and_timing`` in one new process per
rank. It lives in this file, not in the notebook, because each new process imports it by name; it runs unchanged
under ``torchrun`` too. Starting the ranks costs seconds (each imports torch), so one launch does everything:

* ``time_steps``: this rank's step time for the wide model and for ``many_small_layers``, measured with
  ``gpulab.bench.time_ddp_step`` (every rank on a batch as big as one device's share under DataParallel);
* ``train_and_track``: the same model, optimizer and batch as the notebook's DataParallel run, each rank training
  on its own half of the batch, with this rank's memory recorded by ``gpulab.memory.track``.
"""

import gpulab
import torch
from gpulab.devices import Devices
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def many_small_layers(depth=40, width=32, classes=4, seed=0):
    """A deep, narrow model: many tiny operations, so a step's time is mostly Python and launch overhead."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, classes))


def this_rank():
    """``(device, devices to track)`` of this rank: its own GPU with NCCL, else one virtual device on the CPU."""
    device = gpulab.ddp.local_device()  # GPU LOCAL_RANK with NCCL (not the global rank)
    if device.type == "cuda":
        return device, [device.index]
    cpu = torch.device("cpu")
    return cpu, Devices([0], virtual=True, primary=cpu, reason="this rank's memory (one process, one device)")


def train_and_track(rank, world_size, batch, sizes, steps, seed=0):
    """Train ``gpulab.models.WideHead(**sizes)`` with Adam under DDP on this rank's shard of ``batch``.

    Everything the rank holds (model, DDP's buffers, optimizer state, its shard, activations) is made inside the
    tracked block, as on a GPU that starts empty. Returns the trace as plain values (``Trace.to_dict``).
    """
    device, tracked = this_rank()
    inputs, labels = (tensor.chunk(world_size)[rank] for tensor in batch)
    with gpulab.memory.track(tracked, count_existing=False) as trace:
        torch.manual_seed(seed)  # the same weights on every rank (DDP also broadcasts rank 0's)
        model = gpulab.models.WideHead(**sizes).to(device)
        ddp_model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        optimizer = torch.optim.Adam(ddp_model.parameters(), lr=1e-3)
        x, y = inputs.to(device), labels.to(device)
        for step in range(steps):
            trace.mark(f"step {step}")
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(ddp_model(x), y)  # this rank's outputs stay on this rank
            loss.backward()  # DDP all-reduces (averages) the gradients here
            optimizer.step()
            del loss
    return trace.to_dict()


def time_steps(rank, world_size, wide_batch, sizes, small_batch):
    """This rank's DDP step times: the wide model, then ``many_small_layers``; each rank gets its shard."""
    device, _ = this_rank()
    device_ids = [device] if device.type == "cuda" else None
    timings = {}
    for name, model, (inputs, labels), repeats in [
        ("wide head", gpulab.models.WideHead(**sizes), wide_batch, 3),
        ("many small layers", many_small_layers(), small_batch, 8),
    ]:
        ddp_model = DistributedDataParallel(model.to(device), device_ids=device_ids)
        x, y = inputs.chunk(world_size)[rank].to(device), labels.chunk(world_size)[rank].to(device)
        step = gpulab.bench.make_train_step(ddp_model, nn.functional.cross_entropy, x, y)
        timings[name] = gpulab.bench.time_ddp_step(step, len(x), warmup=1, repeats=repeats, label="DDP")
    return timings


def memory_and_timing(rank, world_size, batch, sizes, steps, wide_batch, small_batch):
    """``time_steps`` on ``wide_batch`` and ``small_batch``, then ``train_and_track`` on ``batch``, in one launch.

    The timings come first: they also pay for DDP's one-time set-up (its first use imports more of PyTorch), which
    would otherwise show as a long flat stretch at the start of the memory trace.
    """
    timings = time_steps(rank, world_size, wide_batch, sizes, small_batch)
    return {"rank": rank, "trace": train_and_track(rank, world_size, batch, sizes, steps), "timings": timings}
