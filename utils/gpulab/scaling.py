"""What the bytes cost: a small, transparent model of a data-parallel step's time on named interconnects.

Lesson 03 measures the traffic of DataParallel and DDP exactly (``gpulab.traffic``) and takes each replica's
compute, then asks what those bytes would cost on real links. Every figure this module returns is a *prediction*,
and ``caveat()`` says so, and what it leaves out, in the lesson's language.

The model, for N devices, each with the same per-device batch (adding devices to go faster):

* **One device**: ``forward + backward`` of one replica's batch: measured on real GPUs (``measure_compute``);
  on virtual devices, where the CPU's time says nothing about a GPU's, the step's FLOPs counted by PyTorch
  (``count_flops``) at the peak rate of the GPU that such a link usually connects, in the precision PyTorch uses
  there by default for each kind of operation (``Flops.on``): float32 convolutions in TF32 where the GPU has TF32
  (Ampere and later), everything else in FP32. A peak rate makes the compute time a lower bound: optimistic.
* **DataParallel**: the same compute, plus every byte on device 0's link (scatter, broadcast, gather, the
  output's gradient, the gradients' reduction) sent one after the other at the link's bandwidth: the stages run
  in sequence and all of them go through device 0.
* **DDP**: the same compute, plus what is left uncovered of the ring all-reduce of each gradient bucket. Each
  rank sends ``2 (N - 1) / N`` of a bucket's bytes over its own link, all links at once; a bucket starts as soon
  as backward has produced its gradients (in proportion to its bytes) and the link is free; only what is still
  on the link when backward ends adds to the step (with one bucket, made at the very end, all of it).

``speedup = N x one-device step time / step time``: throughput relative to one device.

Bandwidths are the theoretical peak of one direction of one GPU's link, from the sources written next to them.
"""

from __future__ import annotations

import statistics
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gpulab.messages import message, text

__all__ = [
    "INTERCONNECTS",
    "PUBLISHED",
    "Compute",
    "Flops",
    "Interconnect",
    "ModelCost",
    "Published",
    "caveat",
    "cost_on_meta",
    "count_flops",
    "ddp_buckets",
    "efficiencies",
    "ddp_step_s",
    "dp_step_s",
    "efficiency_table",
    "measure_compute",
    "measure_on_gpus",
    "predicted_speedups",
    "published_table",
    "speedups",
]


# The precision PyTorch runs float32 operations in on a CUDA GPU, by default, per kind of operation:
# * convolutions (cuDNN): TF32 on GPUs that have it. torch.backends.cudnn.allow_tf32 is True by default
#   (torch/backends/cudnn/__init__.py: allow_tf32 = ContextProp(torch._C._get_cudnn_allow_tf32, ...); PyTorch's
#   notes/cuda.rst, "TensorFloat-32 (TF32) on Ampere (and later) devices": "This flag defaults to True").
# * matrix products (cuBLAS: Linear, matmul): FP32. torch.backends.cuda.matmul.allow_tf32 is False by default
#   (torch/backends/cuda/__init__.py: cuBLASModule.__getattr__("allow_tf32") -> torch._C._get_cublas_allow_tf32();
#   notes/cuda.rst: "This flag defaults to False in PyTorch 1.12 and later"; torch.get_float32_matmul_precision()
#   is "highest").
# Read from the installed torch 2.13: cudnn.allow_tf32 True, cuda.matmul.allow_tf32 False, "highest".
# The FLOPs of torch.utils.flop_counter's operations by these names run as convolutions; every other counted one
# (mm, addmm, bmm, baddbmm, attention) as a matrix product.
CONVOLUTIONS = frozenset({"convolution", "_convolution", "convolution_backward", "cudnn_convolution"})


@dataclass(frozen=True)
class Interconnect:
    """A named link between GPUs: its peak bytes per second in one direction, and where that figure comes from;
    with the GPU such a link usually connects, that GPU's peak FP32 rate (and its source), its peak TF32 Tensor
    Core rate without sparsity where it has TF32 (and its source: ``None`` for a GPU without), and how many GPUs
    such a machine has at most."""

    name: str
    bytes_per_s: float
    source: str
    gpu: str
    gpu_flops_per_s: float
    gpu_source: str
    max_devices: int = 8
    gpu_tf32_flops_per_s: float | None = None
    gpu_tf32_source: str | None = None

    @property
    def convolution_flops_per_s(self) -> float:
        """The GPU's peak rate for float32 convolutions as PyTorch runs them by default: TF32 where it has it."""
        return self.gpu_tf32_flops_per_s or self.gpu_flops_per_s

    @property
    def gpu_sources(self) -> list[str]:
        """Where the GPU's peak rates come from: FP32, then TF32 where the GPU has it."""
        return [self.gpu_source, *([self.gpu_tf32_source] if self.gpu_tf32_source else [])]


# V100 (Volta) and T4 (Turing) have no TF32: their float32 convolutions run in FP32.
A100_TF32 = "NVIDIA A100 Tensor Core GPU datasheet: Tensor Float 32 (TF32) 156 TFLOPS (312 TFLOPS with sparsity)"

INTERCONNECTS = {
    link.name: link
    for link in [
        Interconnect(
            "PCIe 3.0 x16",
            15.75e9,
            "PCI-SIG PCIe 3.0 base specification: 8 GT/s per lane, 128b/130b encoding, x16 = 15.75 GB/s per direction",
            "V100 PCIe",
            14e12,
            "NVIDIA V100 Tensor Core GPU datasheet: 14 TFLOPS single precision (PCIe)",
        ),
        Interconnect(
            "PCIe 4.0 x16",
            31.5e9,
            "PCI-SIG PCIe 4.0 base specification: 16 GT/s per lane, 128b/130b encoding, x16 = 31.5 GB/s per direction",
            "A100 PCIe",
            19.5e12,
            "NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS",
            gpu_tf32_flops_per_s=156e12,
            gpu_tf32_source=A100_TF32,
        ),
        Interconnect(
            "NVLink 3 (A100)",
            300e9,
            "NVIDIA A100 Tensor Core GPU datasheet: NVLink 600 GB/s per GPU, both directions: 300 GB/s each way",
            "A100 SXM",
            19.5e12,
            "NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS",
            gpu_tf32_flops_per_s=156e12,
            gpu_tf32_source=A100_TF32,
        ),
        Interconnect(
            "NVLink 4 (H100)",
            450e9,
            "NVIDIA H100 Tensor Core GPU datasheet (SXM5): NVLink 900 GB/s per GPU, both directions: 450 GB/s each way",
            "H100 SXM",
            67e12,
            "NVIDIA H100 Tensor Core GPU datasheet: FP32 67 TFLOPS (SXM5)",
            gpu_tf32_flops_per_s=989e12 / 2,
            gpu_tf32_source=(
                "NVIDIA H100 Tensor Core GPU datasheet: TF32 Tensor Core 989 TFLOPS (SXM5) with sparsity; "
                "without sparsity half of it, 494.5 TFLOPS"
            ),
        ),
        Interconnect(
            "Kaggle 2x T4 (PCIe 3.0 x16)",
            15.75e9,
            "NVIDIA T4 datasheet: PCIe Gen3 x16 interface, no NVLink: the two cards talk over PCIe 3.0 x16 at best",
            "T4",
            8.1e12,
            "NVIDIA T4 datasheet: 8.1 TFLOPS single precision (FP32)",
            max_devices=2,
        ),
    ]
}


def caveat() -> str:
    """What every prediction here is, and what it leaves out, in the lesson's language (lesson 03)."""
    return message("scaling.caveat")


@dataclass(frozen=True)
class Compute:
    """One replica's measured compute for its per-device batch, in seconds."""

    forward_s: float
    backward_s: float

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclass(frozen=True)
class Flops:
    """The floating-point operations of one replica's forward and backward, counted by torch's FlopCounterMode,
    and how many of each are convolutions' (``CONVOLUTIONS``)."""

    forward: int
    backward: int
    forward_convolution: int = 0
    backward_convolution: int = 0

    def at(self, flops_per_s: float) -> Compute:
        """The compute time of all these FLOPs at one rate, ``flops_per_s``."""
        return Compute(self.forward / flops_per_s, self.backward / flops_per_s)

    def on(self, link: Interconnect) -> Compute:
        """The compute time of these FLOPs on the GPU ``link`` usually connects, each kind in the precision PyTorch
        uses by default (the convolutions at ``link.convolution_flops_per_s``, the rest at the FP32 peak). Peak
        rates: a lower bound on the time, optimistic."""

        def seconds(total: int, convolution: int) -> float:
            return convolution / link.convolution_flops_per_s + (total - convolution) / link.gpu_flops_per_s

        return Compute(
            seconds(self.forward, self.forward_convolution), seconds(self.backward, self.backward_convolution)
        )


def count_flops(model: torch.nn.Module, loss_fn: Callable, inputs: torch.Tensor, targets: torch.Tensor) -> Flops:
    """Count the FLOPs of one forward (with the loss) and one backward of ``model`` on a batch, and how many of
    them are convolutions' (lesson 03)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as forward:
        loss = loss_fn(model(inputs), targets)
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    model.zero_grad(set_to_none=True)

    def convolution(counter: FlopCounterMode) -> int:
        counts = counter.get_flop_counts().get("Global", {})
        return sum(flops for op, flops in counts.items() if str(op).split(".")[-1] in CONVOLUTIONS)

    return Flops(forward.get_total_flops(), backward.get_total_flops(), convolution(forward), convolution(backward))


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


def measure_on_gpus(
    make_model: Callable[[], torch.nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    per_device: int,
    device_ids: Sequence[int],
    per_rank: Sequence[dict] = (),
    loss_fn: Callable | None = None,
) -> tuple[dict[str, list[tuple[int, float]]], Compute]:
    """On real GPUs: the measured speed-ups to put next to the predictions, and one replica's measured compute.

    * one device: ``make_model()`` trained on ``per_device`` samples (``gpulab.bench.time_step``);
    * DataParallel: ``torch.nn.DataParallel`` on ``device_ids`` with ``per_device`` samples each, its traffic
      recorded by ``gpulab.traffic`` and each stage's measured bandwidth printed;
    * DDP: the step times the ranks measured (``per_rank[i]["timing"]``), when they ran on GPUs.

    Returns ``({"DataParallel": [(N, speed-up)], "DDP": [...]}, Compute)``. Not run on a GPU so far.
    """
    from gpulab import bench, traffic
    from gpulab.data_parallel import DataParallel

    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    count = len(device_ids)
    primary = torch.device("cuda", device_ids[0])
    x, y = inputs[: per_device * count].to(primary), targets[: per_device * count].to(primary)
    one = bench.time_step(
        bench.make_train_step(make_model().to(primary), loss_fn, x[:per_device], y[:per_device]), per_device
    )
    parallel = DataParallel(make_model().to(primary), device_ids=list(device_ids))
    many = bench.time_step(bench.make_train_step(parallel, loss_fn, x, y), len(x), devices=count)
    measured = {"DataParallel": [(count, many.samples_per_s / one.samples_per_s)]}
    timings = [rank["timing"] for rank in per_rank if rank.get("timing") is not None]
    if timings:
        merged = bench.merge_ranks(timings)
        measured["DDP"] = [(len(timings), merged.samples_per_s / one.samples_per_s)]
    with traffic.record() as moved:
        loss_fn(parallel(x), y).backward()
    for stage, rate in moved.bandwidth().items():
        print(
            message("scaling.measured", stage=stage, mib=f"{moved.total(stage) / 2**20:.1f}", rate=f"{rate / 1e9:.1f}")
        )
    compute = measure_compute(make_model().to(primary), loss_fn, x[:per_device], y[:per_device])
    return measured, compute


def predicted_speedups(
    link: Interconnect, compute: Compute, device0_bytes: Sequence[int], bucket_bytes: Sequence[int]
) -> dict[str, list[float]]:
    """Predicted speed-ups of DataParallel and DDP on 1, 2, ... devices (at most ``link.max_devices``) (lesson 03).

    ``device0_bytes[n - 1]``: the bytes on device 0's link in a DataParallel step on n devices; ``bucket_bytes``:
    the buckets DDP all-reduces in a step.
    """
    counts = range(1, min(len(device0_bytes), link.max_devices) + 1)
    data_parallel = [dp_step_s(compute, device0_bytes[n - 1], link) for n in counts]
    ddp = [ddp_step_s(compute, bucket_bytes, n, link) for n in counts]
    return {"DataParallel": speedups(data_parallel, compute.step_s), "DDP": speedups(ddp, compute.step_s)}


# ----------------------------------------------------------------------------------------------------------------
# When is DDP near-linear? Efficiency at 2, 4, 8 devices, for any model, counted on the meta device.
# ----------------------------------------------------------------------------------------------------------------

# DDP's default buckets (torch.nn.parallel.DistributedDataParallel: bucket_cap_mb=25; its first bucket is capped at
# torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES, 1 MiB, so that the first all-reduce starts early).
DDP_BUCKET_CAP_BYTES = 25 * 2**20
DDP_FIRST_BUCKET_BYTES = 2**20


def ddp_buckets(
    parameter_bytes: Sequence[int], cap: int = DDP_BUCKET_CAP_BYTES, first: int = DDP_FIRST_BUCKET_BYTES
) -> list[int]:
    """DDP's default bucketing, modelled: the parameters' bytes in reverse order of registration (backward makes
    the last layers' gradients first), a bucket closed once it reaches ``first`` bytes (the first) or ``cap``.
    Returns the buckets' bytes in the order they are all-reduced (lesson 03)."""
    buckets, current, limit = [], 0, first
    for size in reversed(list(parameter_bytes)):
        current += size
        if current >= limit:
            buckets.append(current)
            current, limit = 0, cap
    if current:
        buckets.append(current)
    return buckets


def efficiencies(speedups_by_method: dict[str, Sequence[float]], counts: Sequence[int]) -> dict[str, list[float]]:
    """Efficiency ``speed-up / N`` at each of ``counts`` from speed-ups on 1, 2, ... devices (1.0: linear)."""
    return {
        method: [values[n - 1] / n for n in counts if n <= len(values)] for method, values in speedups_by_method.items()
    }


@dataclass(frozen=True)
class ModelCost:
    """What one data-parallel step of a model costs, counted (lesson 03): one replica's FLOPs for its per-device
    batch, the bytes on device 0's link in a DataParallel step on 1, 2, ... devices, and DDP's buckets."""

    name: str
    per_device: int
    flops: Flops
    device0_bytes: list[int]
    bucket_bytes: list[int]

    @property
    def parameter_bytes(self) -> int:
        return sum(self.bucket_bytes)

    def predict(self, link: Interconnect, counts: Sequence[int] = (2, 4, 8)) -> dict[str, list[float]]:
        """Predicted efficiency of DataParallel and DDP at each of ``counts`` (at most ``link.max_devices``) on
        ``link``, the compute being these FLOPs at the peak rates of the GPU that such a link usually connects, in
        PyTorch's default precision for each (``Flops.on``)."""
        compute = self.flops.on(link)
        speedups_by_method = predicted_speedups(link, compute, self.device0_bytes, self.bucket_bytes)
        return efficiencies(speedups_by_method, counts)


def cost_on_meta(
    name: str,
    make_model: Callable[[], torch.nn.Module],
    make_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    per_device: int,
    max_devices: int = 8,
    loss_fn: Callable | None = None,
) -> ModelCost:
    """Count a model's step on the ``meta`` device: shapes only, no memory and no arithmetic (lesson 03).

    ``make_model()`` and ``make_batch(batch_size)`` are called under ``torch.device("meta")``. The FLOPs are
    ``count_flops`` on one replica's ``per_device`` samples; DataParallel's bytes are recorded
    (``gpulab.traffic``) by running gpulab's DataParallel algorithm itself on 1 to ``max_devices`` virtual
    devices backed by the meta device, ``per_device`` samples each; DDP's buckets are ``ddp_buckets`` of the
    parameters. So a model far too big for this machine is counted in a second.
    """
    from gpulab import traffic
    from gpulab.data_parallel import DataParallel
    from gpulab.devices import Devices

    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    meta = torch.device("meta")
    with meta:
        model = make_model()
        inputs, targets = make_batch(per_device)
    flops = count_flops(model, loss_fn, inputs, targets)
    device0_bytes = [0]
    for count in range(2, max_devices + 1):
        chosen = Devices(list(range(count)), virtual=True, primary=meta, reason="counting bytes on the meta device")
        with meta:
            inputs, targets = make_batch(per_device * count)
        parallel = DataParallel(model, device_ids=chosen)
        with traffic.record() as moved:
            loss_fn(parallel(inputs), targets).backward()
        model.zero_grad(set_to_none=True)
        device0_bytes.append(sum(moved.by_stage(0).values()))
    buckets = ddp_buckets([p.numel() * p.element_size() for p in model.parameters()])
    return ModelCost(name, per_device, flops, device0_bytes, buckets)


@dataclass(frozen=True)
class Published:
    """A measurement someone published, quoted with its source, to set beside the predictions (lesson 03)."""

    source: str
    hardware: str
    workload: str
    seconds: dict[str, float]


PUBLISHED = [
    Published(
        source=(
            "Hugging Face Transformers documentation, 'Efficient Training on Multiple GPUs' "
            "(docs/source/en/perf_train_gpu_many.md), DataParallel vs DistributedDataParallel"
        ),
        hardware="2x TITAN RTX 24GB with NVLink (NV2); 'without NVLink': NCCL_P2P_DISABLE=1",
        workload="GPT-2 (openai-community/gpt2) fine-tuned on wikitext-2, 4 samples per GPU, 200 steps",
        seconds={"DataParallel": 110.5948, "DDP": 101.9003, "DDP without NVLink": 131.4367},
    ),
]


def _columns(words: str) -> int:
    """The columns a text takes in a notebook's monospaced output: an East Asian wide character takes two."""
    return sum(2 if unicodedata.east_asian_width(character) in "WF" else 1 for character in words)


def _left(words: str, width: int) -> str:
    return words + " " * max(0, width - _columns(words))


def _right(words: str, width: int) -> str:
    return " " * max(0, width - _columns(words)) + words


def efficiency_table(
    costs: Sequence[ModelCost], links: Sequence[Interconnect], counts: Sequence[int] = (2, 4, 8)
) -> str:
    """A table, in the lesson's language, of each model's counted step (``cost_on_meta``) and its predicted
    efficiency for DataParallel and DDP at each of ``counts`` devices (at most ``link.max_devices``) on each of
    ``links`` (lesson 03). A model's name comes through ``gpulab.text``."""
    methods = ("DataParallel", "DDP")
    header = message("scaling.efficiency_header", counts=", ".join(str(count) for count in counts))
    width = max(_columns(header), *(_columns(f"  {link.name}, {link.gpu}") for link in links)) + 2
    lines = [_left(header, width) + "".join(_right(method, 18) for method in methods)]
    for cost in costs:
        flops = cost.flops.forward + cost.flops.backward
        lines.append(
            message(
                "scaling.model_cost",
                name=text(cost.name),
                gflop=f"{flops / 1e9:,.0f}",
                mib=f"{cost.parameter_bytes / 2**20:.0f}",
            )
        )
        for link in links:
            efficiency = cost.predict(link, counts)
            row = "".join(_right(" ".join(f"{value:.2f}" for value in efficiency[method]), 18) for method in methods)
            lines.append(_left(f"  {link.name}, {link.gpu}", width) + row)
    return "\n".join(lines)


def published_table(studies: Sequence[Published] = PUBLISHED) -> str:
    """Each published measurement, in the lesson's language: what ran, on what, its source, and each way's
    seconds with its speed relative to DataParallel's (lesson 03)."""
    lines = []
    for study in studies:
        lines += [text(study.workload), text(study.hardware), message("scaling.source", source=text(study.source))]
        for method, seconds in study.seconds.items():
            ratio = f"{study.seconds['DataParallel'] / seconds:.2f}"
            lines.append(
                f"  {_left(text(method), 20)}{seconds:>7.1f} s   " + message("scaling.relative_speed", ratio=ratio)
            )
    return "\n".join(lines)
