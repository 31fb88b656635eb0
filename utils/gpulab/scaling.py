"""What the bytes cost: a small, transparent model of a data-parallel step's time on named interconnects.

Lesson 03 measures the traffic of DataParallel and DDP exactly (``gpulab.traffic``) and each replica's compute
time, then asks what those bytes would cost on real links. Every figure this module returns is a *prediction*,
and ``LEFT_OUT`` says what it leaves out.

The model, for N devices, each with the same per-device batch (adding devices to go faster):

* **One device**: ``forward + backward`` of one replica's batch, as measured.
* **DataParallel**: the same compute, plus every byte on device 0's link (scatter, broadcast, gather, the
  output's gradient, the gradients' reduction) sent one after the other at the link's bandwidth: the stages run
  in sequence and all of them go through device 0.
* **DDP**: the same compute, plus what is left uncovered of the ring all-reduce of each gradient bucket. Each
  rank sends ``2 (N - 1) / N`` of a bucket's bytes over its own link, all links at once; a bucket starts as soon
  as backward has produced its gradients (in proportion to its bytes) and the link is free, so all but the end of
  the communication hides behind backward.

``speedup = N x one-device step time / step time``: throughput relative to one device.

Bandwidths are the theoretical peak of one direction of one GPU's link, from the sources written next to them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["INTERCONNECTS", "LEFT_OUT", "Interconnect", "ddp_step_s", "dp_step_s", "measure_compute", "speedups"]


@dataclass(frozen=True)
class Interconnect:
    """A named link between GPUs: its peak bytes per second in one direction, and where that figure comes from."""

    name: str
    bytes_per_s: float
    source: str


INTERCONNECTS = {
    link.name: link
    for link in [
        Interconnect(
            "PCIe 3.0 x16",
            15.75e9,
            "PCI-SIG PCIe 3.0 base specification: 8 GT/s per lane, 128b/130b encoding, x16 = 15.75 GB/s per direction",
        ),
        Interconnect(
            "PCIe 4.0 x16",
            31.5e9,
            "PCI-SIG PCIe 4.0 base specification: 16 GT/s per lane, 128b/130b encoding, x16 = 31.5 GB/s per direction",
        ),
        Interconnect(
            "NVLink 3 (A100)",
            300e9,
            "NVIDIA A100 Tensor Core GPU datasheet: NVLink 600 GB/s per GPU, both directions: 300 GB/s each way",
        ),
        Interconnect(
            "NVLink 4 (H100)",
            450e9,
            "NVIDIA H100 Tensor Core GPU datasheet (SXM5): NVLink 900 GB/s per GPU, both directions: 450 GB/s each way",
        ),
        Interconnect(
            "Kaggle 2x T4 (PCIe 3.0 x16)",
            15.75e9,
            "NVIDIA T4 datasheet: PCIe Gen3 x16 interface, no NVLink: the two cards talk over PCIe 3.0 x16 at best",
        ),
    ]
}

LEFT_OUT = (
    "a prediction from peak link bandwidth: it leaves out latency, the efficiency real transfers reach (often "
    "70-90% of peak), the loss computed on device 0 over the whole batch, Python and thread overhead, the GIL, "
    "kernel-launch contention, and links shared through a PCIe switch or the CPU"
)


@dataclass(frozen=True)
class Compute:
    """One replica's measured compute for its per-device batch, in seconds."""

    forward_s: float
    backward_s: float

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s


def measure_compute(
    model: torch.nn.Module, loss_fn: Callable, inputs: torch.Tensor, targets: torch.Tensor, repeats: int = 5
) -> Compute:
    """Median forward and backward seconds of ``model`` on one device's batch (one warm-up step first)."""
    forwards, backwards = [], []
    for repeat in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        _synchronize(inputs)
        started = time.perf_counter()
        loss = loss_fn(model(inputs), targets)
        _synchronize(inputs)
        forwarded = time.perf_counter()
        loss.backward()
        _synchronize(inputs)
        if repeat:
            forwards.append(forwarded - started)
            backwards.append(time.perf_counter() - forwarded)
    model.zero_grad(set_to_none=True)
    return Compute(statistics.median(forwards), statistics.median(backwards))


def _synchronize(tensor: torch.Tensor) -> None:
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)


def dp_step_s(compute: Compute, device0_bytes: int, link: Interconnect) -> float:
    """Predicted DataParallel step: compute, then every byte on device 0's link, one stage after another."""
    return compute.step_s + device0_bytes / link.bytes_per_s


def ddp_step_s(compute: Compute, bucket_bytes: Sequence[int], world_size: int, link: Interconnect) -> float:
    """Predicted DDP step: compute plus the part of the buckets' ring all-reduce that backward does not cover.

    ``bucket_bytes`` are the buckets in the order DDP all-reduces them (as ``gpulab.traffic.record_all_reduce``
    measures them). Bucket *k* is ready once backward has produced the bytes of buckets 0..k; the link carries
    one bucket at a time, each rank sending ``2 (N - 1) / N`` of its bytes.
    """
    if world_size == 1:
        return compute.step_s
    total = sum(bucket_bytes)
    ready_bytes, link_free = 0, 0.0
    for size in bucket_bytes:
        ready_bytes += size
        ready = compute.backward_s * ready_bytes / total
        link_free = max(ready, link_free) + 2 * (world_size - 1) / world_size * size / link.bytes_per_s
    return compute.forward_s + max(compute.backward_s, link_free)


def speedups(step_s: Sequence[float], one_device_s: float) -> list[float]:
    """Throughput relative to one device, for steps on 1, 2, ... devices: ``N x one_device_s / step_s[N-1]``."""
    return [count * one_device_s / seconds for count, seconds in enumerate(step_s, start=1)]
