"""Lesson 03: the lesson's DataParallel training, run under DDP and measured on every rank.

``gpulab.ddp.launch(ddp_imbalance.memory_and_traffic, 2, ...)`` runs ``memory_and_traffic`` in one new process per
rank. It lives in this file, not in the notebook, because each new process imports it by name; it runs unchanged
under ``torchrun`` too. A first launch costs seconds (torch is imported once for the ranks), so one launch does everything:

* ``all_reduce_traffic``: three DDP steps with every gradient bucket they all-reduce noted by ``gpulab.traffic``,
  step by step (the first step's single bucket, then the buckets DDP rebuilt), and, on real GPUs, the rank's step
  time;
* ``train_and_track``: the same model, optimizer and batch as the notebook's DataParallel run, each rank training
  on its own half of the batch, with this rank's memory recorded by ``gpulab.memory.track`` (within a capacity,
  when one is given).
"""

import gpulab
import torch
from gpulab.devices import Devices
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def this_rank():
    """``(device, devices to track)`` of this rank: its own GPU with NCCL, else one virtual device on the CPU."""
    device = gpulab.ddp.local_device()  # GPU LOCAL_RANK with NCCL (not the global rank)
    if device.type == "cuda":
        return device, [device.index]
    cpu = torch.device("cpu")
    return cpu, Devices([0], virtual=True, primary=cpu, reason="this rank's memory (one process, one device)")


def train_and_track(rank, world_size, batch, sizes, steps, seed=0, capacity=None):
    """Train ``gpulab.models.WideHead(**sizes)`` with Adam under DDP on this rank's shard of ``batch``.

    Everything the rank holds (model, DDP's buffers, optimizer state, its shard, activations) is made inside the
    tracked block, as on a GPU that starts empty. ``capacity``: what the rank's device may hold (e.g. ``"64 MiB"``);
    going past it raises ``torch.OutOfMemoryError``. Returns the trace as plain values (``Trace.to_dict``).
    """
    device, tracked = this_rank()
    inputs, labels = (tensor.chunk(world_size)[rank] for tensor in batch)
    with gpulab.memory.track(tracked, count_existing=False, capacity=capacity) as trace:
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


def all_reduce_traffic(rank, world_size, batch, sizes, steps=3):
    """``steps`` DDP steps of ``WideHead(**sizes)`` on this rank's shard, noting every bucket DDP all-reduces.

    DDP's first backward all-reduces every gradient in one bucket; before the next forward it rebuilds its buckets
    in the order the gradients arrived (lesson 03, "DDP's buckets, step by step"), so the steps are noted apart.
    Returns ``{"traffic": ..., "buckets_by_step": ..., "timing": ...}``: the last step's buckets as
    ``gpulab.traffic.TrafficTrace.to_dict()`` (what every later step all-reduces), each step's bucket bytes in
    the order DDP all-reduced them, and, on real GPUs (NCCL), this rank's step time (``gpulab.bench.time_ddp_step``)
    for the lesson's prediction; ``None`` on the CPU, where a step time says nothing about GPUs.
    """
    device, _ = this_rank()
    torch.manual_seed(0)
    ddp_model = DistributedDataParallel(
        gpulab.models.WideHead(**sizes).to(device), device_ids=[device] if device.type == "cuda" else None
    )
    trace = gpulab.traffic.TrafficTrace()
    gpulab.traffic.record_all_reduce(ddp_model, trace)
    x, y = (tensor.chunk(world_size)[rank].to(device) for tensor in batch)
    step = gpulab.bench.make_train_step(ddp_model, nn.functional.cross_entropy, x, y)
    buckets_by_step, last_step = [], gpulab.traffic.TrafficTrace()
    for _ in range(steps):
        noted = len(trace.transfers)
        step()
        last_step = gpulab.traffic.TrafficTrace(trace.transfers[noted:])
        buckets_by_step.append([transfer.nbytes for transfer in last_step.transfers])
    timing = None
    if device.type == "cuda":  # the timed steps add their buckets to `trace`, after the ones returned
        timing = gpulab.bench.time_ddp_step(step, len(x), warmup=1, repeats=5, label="DDP")
    return {"traffic": last_step.to_dict(), "buckets_by_step": buckets_by_step, "timing": timing}


def memory_and_traffic(rank, world_size, batch, sizes, steps, traffic_batch, capacity=None):
    """``all_reduce_traffic`` on ``traffic_batch``, then ``train_and_track`` on ``batch``, in one launch.

    The traffic step comes first: it also pays for DDP's one-time set-up (its first use imports more of PyTorch),
    which would otherwise show as a long flat stretch at the start of the memory trace. ``capacity``: passed to
    ``train_and_track``. One launch does both: starting ranks costs seconds.
    """
    traffic = all_reduce_traffic(rank, world_size, traffic_batch, sizes)
    trace = train_and_track(rank, world_size, batch, sizes, steps, capacity=capacity)
    return {"rank": rank, "trace": trace, **traffic}
