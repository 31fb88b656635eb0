"""The DDP steps lesson 02 runs with ``gpulab.ddp.launch``: one process per rank, each importing this file.

``launch`` starts fresh Python processes that import these functions by name, so they live in a ``.py`` file
next to the notebook rather than in a notebook cell. Every rank receives the whole batch and keeps its own
shard, the part a ``DistributedSampler`` would have given it. Starting the ranks costs seconds (each imports
torch), so the lesson launches ``both_demos`` once and gets both demos' results back.
"""

import gpulab
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def ddp_gradients(rank, world_size, batches, seed):
    """One DDP backward per batch on this rank's shard; returns the first layer's gradient after the all-reduce."""
    device = gpulab.ddp.local_device()  # GPU LOCAL_RANK with NCCL (not `rank`: that counts every machine's ranks)
    torch.manual_seed(seed)  # the notebook builds the same model to compute the full-batch gradient
    model = gpulab.models.MLP(in_features=4, hidden=8, classes=3).to(device)
    ddp_model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    results = []
    for inputs, labels in batches:
        shard_inputs = inputs.chunk(world_size)[rank].to(device)
        shard_labels = labels.chunk(world_size)[rank].to(device)
        ddp_model.zero_grad()
        loss = nn.functional.cross_entropy(ddp_model(shard_inputs), shard_labels)  # mean over this shard only
        loss.backward()  # DDP all-reduces (averages) the gradients across ranks during this call
        results.append({"rank": rank, "samples": len(shard_inputs), "gradient": model.layers[0].weight.grad.cpu()})
    return results


def batchnorm_means(rank, world_size, inputs):
    """The mean this rank's BatchNorm normalises with, and the all-reduced mean SyncBatchNorm would use."""
    device = gpulab.ddp.local_device()
    shard = inputs.chunk(world_size)[rank]
    local = nn.BatchNorm1d(inputs.shape[1], momentum=1.0)  # momentum 1: running_mean := the mean it just used
    local(shard)
    # SyncBatchNorm's idea, by hand: add up every rank's sums and counts, so every rank gets the global mean.
    totals = torch.cat([shard.sum(dim=0), torch.tensor([float(len(shard))])]).to(device)  # NCCL: GPU tensors only
    dist.all_reduce(totals)
    totals = totals.cpu()
    result = {"rank": rank, "local": local.running_mean.tolist(), "all_reduced": (totals[:-1] / totals[-1]).tolist()}
    if device.type == "cuda":  # SyncBatchNorm itself does not run on the CPU (torch/nn/modules/batchnorm.py)
        synced = nn.SyncBatchNorm(inputs.shape[1], momentum=1.0).to(device)
        synced(shard.to(device))
        result["sync_batchnorm"] = synced.running_mean.cpu().tolist()
    return result


def both_demos(rank, world_size, batches, seed):
    """``ddp_gradients`` on ``batches``, then ``batchnorm_means`` on the first batch's inputs, in one launch."""
    return {
        "gradients": ddp_gradients(rank, world_size, batches, seed),
        "batchnorm": batchnorm_means(rank, world_size, batches[0][0]),
    }
