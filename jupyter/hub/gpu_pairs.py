"""Which GPUs each learner's server sees: a pure function, tested with simulated GPU counts.

Learners are numbered in the order of the class list (a learner added later gets the next number, so nobody's GPUs
move). Learner ``i`` gets ``per_learner`` GPUs starting at ``i * per_learner``, wrapping round the box's GPUs, so
a class spreads over every GPU instead of piling onto GPUs 0 and 1. With fewer GPUs than ``per_learner`` a learner
gets them all (one GPU: that GPU; none: an empty ``CUDA_VISIBLE_DEVICES``, which hides every GPU, and gpulab runs
its virtual devices on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    """One device a learner can be given: a whole GPU (``name`` its index) or a MIG instance (``name`` its
    ``MIG-`` UUID, which ``CUDA_VISIBLE_DEVICES`` takes), on physical GPU ``gpu`` (its index)."""

    name: str
    gpu: int


def listed_devices(listing: str) -> list[Device]:
    """The devices in ``nvidia-smi -L``'s listing, in its order (the driver's: by PCI bus id, the order
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` gives CUDA): each GPU, or each MIG instance of a GPU in MIG mode instead of
    the GPU itself (a GPU in MIG mode runs CUDA only in its instances)."""
    devices: list[Device] = []
    gpu = -1
    for line in listing.splitlines():
        if line.startswith("GPU "):
            gpu += 1
            devices.append(Device(str(gpu), gpu))
        elif line.lstrip().startswith("MIG ") and "UUID: MIG-" in line and gpu >= 0:
            uuid = line.split("UUID: ", 1)[1].rstrip(")").strip()
            if devices and devices[-1] == Device(str(gpu), gpu):
                devices.pop()  # the GPU is in MIG mode: its instances stand for it
            devices.append(Device(uuid, gpu))
    return devices


def gpus_for(index: int, gpu_count: int, per_learner: int = 2) -> list[int]:
    """The GPUs (sorted indices) that learner number ``index`` sees on a box with ``gpu_count`` GPUs."""
    if index < 0 or gpu_count < 0 or per_learner < 0:
        raise ValueError(f"negative index, GPU count or GPUs per learner: {index}, {gpu_count}, {per_learner}")
    take = min(per_learner, gpu_count)
    return sorted({(index * per_learner + j) % gpu_count for j in range(take)})


def visible_devices(index: int, gpu_count: int, per_learner: int = 2) -> str:
    """``CUDA_VISIBLE_DEVICES`` for learner number ``index``: ``"2,3"``; ``""`` without GPUs."""
    return ",".join(str(gpu) for gpu in gpus_for(index, gpu_count, per_learner))


def plan(learners: list[str], gpu_count: int, per_learner: int = 2) -> dict[str, list[int]]:
    """Every learner's GPUs, by position in the class list."""
    return {name: gpus_for(i, gpu_count, per_learner) for i, name in enumerate(learners)}
