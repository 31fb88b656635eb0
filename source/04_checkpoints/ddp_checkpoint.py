"""Lesson 04: DDP training that saves one checkpoint from rank 0 and loads it on every rank.

``gpulab.ddp.launch(train_and_checkpoint, 2, folder)`` runs it in one new process per rank. It lives in this file,
not in the notebook, because each new process imports it by name. The same function runs unchanged under
``torchrun`` (see the lesson).
"""

import os
from pathlib import Path

import gpulab
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def train_and_checkpoint(rank, world_size, folder, steps=4):
    device = gpulab.ddp.local_device()  # GPU LOCAL_RANK with NCCL (not `rank`: that counts every machine's ranks)
    torch.manual_seed(0)  # every rank starts from the same weights (DDP also broadcasts rank 0's)
    model = gpulab.models.MLP(in_features=4, hidden=16, classes=3).to(device)
    ddp_model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=0.05)

    inputs, labels = gpulab.data.classification(samples=64 * world_size, features=4, classes=3)
    my_inputs, my_labels = inputs[rank::world_size].to(device), labels[rank::world_size].to(device)
    for x, y in gpulab.data.batches(my_inputs, my_labels, batch_size=16)[:steps]:
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp_model(x), y).backward()  # DDP averages the gradients of all ranks
        optimizer.step()

    path = Path(folder) / "checkpoint.pt"
    if rank == 0:  # one writer
        checkpoint = {"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": steps}
        temporary = path.with_name(path.name + ".tmp")
        torch.save(checkpoint, temporary)
        os.replace(temporary, path)
        print(gpulab.text(f"saved {path.name} at step {steps}"))  # in the notebook's language
    dist.barrier()  # nobody reads the file before rank 0 has finished writing it

    checkpoint = torch.load(path, map_location=device, weights_only=True)  # onto this rank's own device
    fresh = gpulab.models.MLP(in_features=4, hidden=16, classes=3).to(device)
    fresh.load_state_dict(checkpoint["model"])
    same = all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    return {
        "rank": rank,
        "DDP keys": list(ddp_model.state_dict())[:2],
        "saved keys": list(checkpoint["model"])[:2],
        "loaded weights equal this rank's": same,
        "files": sorted(os.listdir(folder)),
    }
