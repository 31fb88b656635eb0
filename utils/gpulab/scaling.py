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
  The host launches every operation (Python, PyTorch's dispatcher, the kernel launch: ``HostCosts``), so each of
  forward and backward takes at least its operations' launch time: a small model is *launch-bound*.
* **DataParallel**: the same compute, plus DataParallel's own host work (``replicate()``'s module copies and one
  thread per replica, measured on meta-backed virtual devices by ``measure_replication``), plus the replicas'
  forwards launched from one process: their Python takes turns under the GIL, so the forward's launch time is
  counted once per replica (backward runs in autograd's threads, one per device); plus every byte on device
  0's link (scatter, broadcast, gather, the output's gradient, the gradients' reduction) sent one after the
  other at the link's bandwidth: the stages run in sequence and all of them go through device 0. The bytes are
  counted as PyTorch moves them on GPUs: the broadcast and the reduce through NCCL, which crosses device 0's link
  once each whatever N (``gpulab.transfers.ROUTES``); the batch-sized stages once per other device.
* **DDP**: the same compute, plus DDP's own cost per gradient tensor (``HostCosts.ddp_per_gradient_s``: copied
  into its bucket and back, ``torch/csrc/distributed/c10d/reducer.cpp``), plus what is left uncovered of the ring
  all-reduce of each gradient bucket (``ddp_timeline``). Each rank sends ``2 (N - 1) / N`` of a bucket's bytes
  over its own link, all links at once; a bucket starts as soon as backward has made its last gradient (after the
  share of backward's FLOPs counted up to it; without a count, in proportion to the bytes made) and the link is
  free; only what is still on the link when backward ends adds to the step (with one bucket, made at the very
  end, all of it). The buckets are those DDP uses from its second step on (``ddp_buckets``, ``cost_on_meta``):
  its first backward all-reduces every gradient in one bucket.

The host costs are calibrated on PyTorch's own DDP benchmark (``DDP_BENCHMARK``), and ``PUBLISHED_SCALING`` sets
published multi-GPU measurements beside what this model predicts for the same model, batch and hardware
(``comparison_table``): the gap is part of the answer.

``speedup = N x one-device step time / step time``: throughput relative to one device.

Bandwidths are the theoretical peak of one direction of one GPU's link, from the sources written next to them.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpulab.messages import message, text

__all__ = [
    "DDP_BENCHMARK",
    "INTERCONNECTS",
    "PUBLISHED",
    "PUBLISHED_SCALING",
    "BucketTiming",
    "Compute",
    "Flops",
    "HostCosts",
    "Interconnect",
    "ModelCost",
    "Published",
    "PublishedScaling",
    "caveat",
    "comparison_table",
    "cost_on_meta",
    "count_flops",
    "ddp_buckets",
    "ddp_step_s",
    "ddp_timeline",
    "dp_step_s",
    "efficiencies",
    "efficiency_table",
    "host_costs",
    "measure_compute",
    "measure_on_gpus",
    "measure_replication",
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
    """One replica's compute for its per-device batch, in seconds: measured (``measure_compute``) or predicted
    (``Flops.on``). ``forward_host_s``: of the forward, the host's time launching its operations (0 when measured:
    the measured time holds it), which DataParallel pays once per replica in one process (``dp_step_s``)."""

    forward_s: float
    backward_s: float
    forward_host_s: float = 0.0

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclass(frozen=True)
class Flops:
    """The floating-point operations of one replica's forward and backward, counted by torch's FlopCounterMode,
    how many of each are convolutions' (``CONVOLUTIONS``), how many operations the host launches in each
    (``count_flops``: each launches about one kernel on a GPU), and the order backward made the gradients in
    (``gradient_order``: indices into the parameters that require one) with, for each, the share of backward's
    FLOPs done by then (``gradient_ready``)."""

    forward: int
    backward: int
    forward_convolution: int = 0
    backward_convolution: int = 0
    forward_operations: int = 0
    backward_operations: int = 0
    gradient_order: tuple[int, ...] = ()
    gradient_ready: tuple[float, ...] = ()

    def at(self, flops_per_s: float) -> Compute:
        """The compute time of all these FLOPs at one rate, ``flops_per_s``."""
        return Compute(self.forward / flops_per_s, self.backward / flops_per_s)

    def on(self, link: Interconnect, host: HostCosts | None = None) -> Compute:
        """The compute time of these FLOPs on the GPU ``link`` usually connects, each kind in the precision PyTorch
        uses by default (the convolutions at ``link.convolution_flops_per_s``, the rest at the FP32 peak). Peak
        rates: a lower bound on the time, optimistic. With ``host``, forward and backward each take at least their
        operations' launch time (``HostCosts.per_operation_s`` each): whichever is slower, the GPU or the host
        feeding it."""

        def seconds(total: int, convolution: int) -> float:
            return convolution / link.convolution_flops_per_s + (total - convolution) / link.gpu_flops_per_s

        forward = seconds(self.forward, self.forward_convolution)
        backward = seconds(self.backward, self.backward_convolution)
        if host is None:
            return Compute(forward, backward)
        forward_host = self.forward_operations * host.per_operation_s
        backward_host = self.backward_operations * host.per_operation_s
        return Compute(max(forward, forward_host), max(backward, backward_host), forward_host)


# Operations that launch no kernel on a GPU: they only allocate (every view, which shares its input's memory, is
# told apart by its schema: OpOverload.is_view).
ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


class _OperationCounter(TorchDispatchMode):
    """Counts the operations PyTorch dispatches below autograd (what a GPU would launch), views and allocations
    left out."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket.__name__ not in ALLOCATIONS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _dense(tensor: torch.Tensor) -> bool:
    return tensor.is_contiguous() or tensor.is_contiguous(memory_format=torch.channels_last)


def _float32_meta(*tensors: torch.Tensor | None) -> bool:
    return all(t is not None and t.is_meta and t.dtype == torch.float32 and _dense(t) for t in tensors)


class _ShapesOnly(TorchDispatchMode):
    """Answers, on the ``meta`` device, the few operations whose meta kernels PyTorch writes in Python (its
    decompositions, ``torch/_decomp/decompositions.py``: BatchNorm and ReLU, forward and backward) with empty
    tensors of the shapes, dtypes and strides those kernels give, for the case counting meets (float32, a dense
    layout, BatchNorm training with its affine weight); any other call goes to PyTorch's own kernel. A meta tensor
    holds no data, so nothing counted changes; ResNet-50's count in lesson 03 takes about a quarter of the time
    (each of its 53 BatchNorms otherwise runs a dozen Python-level operations forward and backward).
    ``tests/test_traffic.py`` checks every answer against PyTorch's kernels and the counts with and without."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as gpulab.memory's tracker: no torch._dynamo wrapper around every operation

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not kwargs:
            answer = self._shapes(func, args)
            if answer is not None:
                return answer
        return func(*args, **kwargs)

    @staticmethod
    def _shapes(func, args):
        aten = torch.ops.aten
        if func is aten.native_batch_norm.default and len(args) == 8:
            input, weight, bias, _, _, training = args[:6]
            several = input.dim() >= 2 and input.numel() > input.shape[1]  # one value a channel: PyTorch's raises
            if training and several and _float32_meta(input, weight, bias):
                statistics = input.new_empty((input.shape[1],))
                return torch.empty_like(input), statistics, torch.empty_like(statistics)
        elif func is aten.native_batch_norm_backward.default and len(args) == 10:
            grad_out, input, weight, _, _, save_mean, save_invstd, train, _, mask = args
            same = grad_out.shape == input.shape and grad_out.stride() == input.stride()
            if train and same and _float32_meta(grad_out, input, weight, save_mean, save_invstd):
                # PyTorch's kernel makes the input's gradient whatever the mask says
                return torch.empty_like(input), *(torch.empty_like(weight) if wanted else None for wanted in mask[1:])
        elif func in (aten.relu.default, aten.relu_.default) and len(args) == 1 and _float32_meta(args[0]):
            return args[0] if func is aten.relu_.default else torch.empty_like(args[0])
        elif func is aten.threshold_backward.default and len(args) == 3:
            grad, input = args[:2]
            same = grad.shape == input.shape and grad.stride() == input.stride()
            if same and _float32_meta(grad, input):
                return torch.empty_like(grad)
        return None


@contextlib.contextmanager
def _shapes_only() -> Iterator[None]:
    """``_ShapesOnly`` in this thread and in every replica thread of gpulab's DataParallel (lesson 03)."""
    from gpulab import virtual

    virtual.register_thread_hook(_ShapesOnly)
    try:
        with _ShapesOnly():
            yield
    finally:
        virtual.unregister_thread_hook(_ShapesOnly)


def count_flops(model: torch.nn.Module, loss_fn: Callable, inputs: torch.Tensor, targets: torch.Tensor) -> Flops:
    """Count the FLOPs of one forward (with the loss) and one backward of ``model`` on a batch, how many of them
    are convolutions', the operations the host launches in each, and the order backward makes the gradients in,
    each with the share of backward's FLOPs done when it is made (a hook after each gradient's accumulation)
    (lesson 03)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as forward, _OperationCounter() as forward_operations:
        loss = loss_fn(model(inputs), targets)
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    made: dict[int, float] = {}  # a parameter's index -> backward's FLOPs counted when its gradient was made

    def noting(index: int) -> Callable[[torch.Tensor], None]:
        def note(_: torch.Tensor) -> None:
            made.setdefault(index, backward.get_total_flops())

        return note

    with FlopCounterMode(display=False) as backward, _OperationCounter() as backward_operations:
        hooks = [parameter.register_post_accumulate_grad_hook(noting(i)) for i, parameter in enumerate(parameters)]
        try:
            loss.backward()
        finally:
            for hook in hooks:
                hook.remove()
    model.zero_grad(set_to_none=True)
    backward_total = backward.get_total_flops()

    def convolution(counter: FlopCounterMode) -> int:
        counts = counter.get_flop_counts().get("Global", {})
        return sum(flops for op, flops in counts.items() if str(op).split(".")[-1] in CONVOLUTIONS)

    return Flops(
        forward.get_total_flops(),
        backward.get_total_flops(),
        convolution(forward),
        convolution(backward),
        forward_operations.count,
        backward_operations.count,
        tuple(made),
        tuple(flops / backward_total if backward_total else 1.0 for flops in made.values()),
    )


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


# ----------------------------------------------------------------------------------------------------------------
# What a step costs the host: calibrated on PyTorch's own DDP benchmark.
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostCosts:
    """What the host (the CPU that launches a GPU's work) pays per step, and where the figures come from
    (lesson 03): ``per_operation_s`` to launch one operation (Python, PyTorch's dispatcher, the kernel launch), and
    ``ddp_per_gradient_s``, DDP's own cost per gradient tensor per step (``reducer.cpp`` copies each gradient into
    its bucket, ``mark_variable_ready_dense``, and back, ``copy_bucket_to_grad``: two operations)."""

    per_operation_s: float
    ddp_per_gradient_s: float
    source: str
    replication: bool = True  # DataParallel's replicate() and threads, measured per model (ModelCost.replication_s)

    @classmethod
    def none(cls) -> HostCosts:
        """No host costs at all: the model of FLOPs and bytes alone."""
        return cls(0.0, 0.0, "none", replication=False)


@functools.cache
def host_costs() -> HostCosts:
    """The host costs, calibrated on PyTorch's own DDP benchmark (``DDP_BENCHMARK``, lesson 03).

    There, one step of ResNet-50 (32 images) on one V100 took 0.097 s without DDP and 0.100 s with it: DDP's own
    cost, 3 ms, spread over ResNet-50's gradient tensors (161, counted here on ``gpulab.models.ResNet50``) is its
    cost per gradient; spread over the two operations ``reducer.cpp`` adds for each gradient, it is what one
    operation costs the host. The benchmark printed 3 decimals: the 3 ms is known to +-1 ms.
    """
    from gpulab.models import ResNet50

    with torch.device("meta"):
        gradients = sum(1 for parameter in ResNet50().parameters() if parameter.requires_grad)
    ddp_cost = DDP_BENCHMARK.seconds["DDP"][1] - DDP_BENCHMARK.one_device_s
    per_gradient = ddp_cost / gradients
    return HostCosts(per_gradient / 2, per_gradient, DDP_BENCHMARK.source)


def dp_step_s(
    compute: Compute, device0_bytes: int, link: Interconnect, devices: int = 1, replication_s: float = 0.0
) -> float:
    """Predicted DataParallel step on ``devices``: its own host work (``replication_s``: ``replicate()`` and the
    replica threads), the replicas' forward, whose launches take turns in one process (``devices`` times
    ``compute.forward_host_s``, unless the GPU takes longer), backward, then every byte on device 0's link, one
    stage after another."""
    forward = max(compute.forward_s, devices * compute.forward_host_s)
    return replication_s + forward + compute.backward_s + device0_bytes / link.bytes_per_s


@dataclass(frozen=True)
class BucketTiming:
    """One DDP bucket in a predicted step, seconds from the start of backward: when backward has produced its
    gradients (``ready_s``), and when its ring all-reduce starts and ends on the link."""

    nbytes: int
    ready_s: float
    start_s: float
    end_s: float


def ddp_timeline(
    compute: Compute,
    bucket_bytes: Sequence[int],
    world_size: int,
    link: Interconnect,
    bucket_ready: Sequence[float] = (),
) -> list[BucketTiming]:
    """When each bucket is ready and all-reduced during a predicted DDP step (lesson 03), the model ``ddp_step_s``
    uses.

    ``bucket_bytes`` are the buckets in the order DDP all-reduces them (as ``gpulab.traffic.record_all_reduce``
    measures them). Bucket *k* is ready when backward has done ``bucket_ready[k]`` of its work (its last gradient
    made: ``cost_on_meta`` counts it), or, without ``bucket_ready``, once backward has produced the bytes of
    buckets 0..k; the link carries one bucket at a time, each rank sending ``2 (N - 1) / N`` of its bytes.
    """
    total = sum(bucket_bytes)
    timings, ready_bytes, link_free = [], 0, 0.0
    for index, size in enumerate(bucket_bytes):
        ready_bytes += size
        share = bucket_ready[index] if bucket_ready else ready_bytes / total
        ready = compute.backward_s * share
        start = max(ready, link_free)
        link_free = start + 2 * (world_size - 1) / world_size * size / link.bytes_per_s
        timings.append(BucketTiming(size, ready, start, link_free))
    return timings


def ddp_step_s(
    compute: Compute,
    bucket_bytes: Sequence[int],
    world_size: int,
    link: Interconnect,
    overhead_s: float = 0.0,
    bucket_ready: Sequence[float] = (),
) -> float:
    """Predicted DDP step: compute, DDP's own cost (``overhead_s``: its gradients times
    ``HostCosts.ddp_per_gradient_s``), plus the part of the buckets' ring all-reduce that backward does not cover
    (``ddp_timeline``, with ``bucket_ready``). One device runs without DDP."""
    if world_size == 1:
        return compute.step_s
    link_free = ddp_timeline(compute, bucket_bytes, world_size, link, bucket_ready)[-1].end_s
    return compute.forward_s + max(compute.backward_s, link_free) + overhead_s


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
    link: Interconnect,
    compute: Compute,
    device0_bytes: Sequence[int],
    bucket_bytes: Sequence[int],
    replication_s: Sequence[float] = (),
    ddp_overhead_s: float = 0.0,
    max_devices: int | None = None,
    bucket_ready: Sequence[float] = (),
) -> dict[str, list[float]]:
    """Predicted speed-ups of DataParallel and DDP on 1, 2, ... devices (at most ``link.max_devices``) (lesson 03).

    ``device0_bytes[n - 1]``: the bytes on device 0's link in a DataParallel step on n devices; ``bucket_bytes``:
    the buckets DDP all-reduces in a step (after its first: ``ddp_buckets``); ``replication_s[n - 1]``:
    DataParallel's own host work on n devices (``measure_replication``; none when not given); ``ddp_overhead_s``:
    DDP's own cost per step; ``bucket_ready``: when each bucket is ready (``ddp_timeline``). DDP goes up to
    ``max_devices`` (default: as far as ``device0_bytes``), DataParallel as far as ``device0_bytes`` goes.
    """
    largest = min(max_devices or len(device0_bytes), link.max_devices)
    data_parallel = [
        dp_step_s(compute, device0_bytes[n - 1], link, n, replication_s[n - 1] if n <= len(replication_s) else 0.0)
        for n in range(1, min(len(device0_bytes), largest) + 1)
    ]
    ddp = [ddp_step_s(compute, bucket_bytes, n, link, ddp_overhead_s, bucket_ready) for n in range(1, largest + 1)]
    return {"DataParallel": speedups(data_parallel, compute.step_s), "DDP": speedups(ddp, compute.step_s)}


# ----------------------------------------------------------------------------------------------------------------
# When is DDP near-linear? Efficiency at 2, 4, 8 devices, for any model, counted on the meta device.
# ----------------------------------------------------------------------------------------------------------------

# DDP's buckets from its second step on. Its first backward all-reduces every gradient in one bucket: with
# find_unused_parameters=False, torch/nn/parallel/distributed.py: _BucketCapacityConfig.compute_bucket_size_limits
# gives the constructor one limit, sys.maxsize. Reducer::autograd_hook (torch/csrc/distributed/c10d/reducer.cpp)
# notes the order the gradients arrive in (push_rebuilt_params), and before the next forward
# DistributedDataParallel._pre_forward calls reducer._rebuild_buckets(): Reducer::rebuild_buckets regroups the
# gradients in that order with the limits {first_bucket_bytes_cap_, bucket_bytes_cap_} (torch.distributed's
# _DEFAULT_FIRST_BUCKET_BYTES, 1 MiB, so that the first all-reduce starts early; bucket_cap_mb=25), once for the
# whole training: compute_bucket_assignment_by_size closes a bucket as soon as its bytes reach its limit, then moves
# to the next limit (the last one repeats).
DDP_BUCKET_CAP_BYTES = 25 * 2**20
DDP_FIRST_BUCKET_BYTES = 2**20


def _bucketed(sizes: Sequence[int], ready: Sequence[float], cap: int, first: int) -> tuple[list[int], list[float]]:
    """Gradients' bytes in the order they become ready, grouped as Reducer::rebuild_buckets groups them: the
    buckets' bytes, and when each is ready (its last gradient's ``ready``)."""
    buckets, bucket_ready, current, limit = [], [], 0, first
    for size, when in zip(sizes, ready, strict=True):
        current += size
        if current >= limit:
            buckets.append(current)
            bucket_ready.append(when)
            current, limit = 0, cap
    if current:
        buckets.append(current)
        bucket_ready.append(ready[-1])
    return buckets, bucket_ready


def ddp_buckets(
    parameter_bytes: Sequence[int], cap: int = DDP_BUCKET_CAP_BYTES, first: int = DDP_FIRST_BUCKET_BYTES
) -> list[int]:
    """DDP's buckets from its second step on, modelled from the parameters' bytes in the order of registration
    (lesson 03): their gradients taken in reverse (backward makes the last layers' gradients first), a bucket
    closed once it reaches ``first`` bytes (the first) or ``cap`` (the others), as ``Reducer::rebuild_buckets``
    does. Returns the buckets' bytes in the order they are all-reduced. (``cost_on_meta`` groups the gradients in
    the order a counted backward made them.)"""
    sizes = list(reversed(list(parameter_bytes)))
    return _bucketed(sizes, [0.0] * len(sizes), cap, first)[0]


def efficiencies(speedups_by_method: dict[str, Sequence[float]], counts: Sequence[int]) -> dict[str, list[float]]:
    """Efficiency ``speed-up / N`` at each of ``counts`` from speed-ups on 1, 2, ... devices (1.0: linear)."""
    return {
        method: [values[n - 1] / n for n in counts if n <= len(values)] for method, values in speedups_by_method.items()
    }


@dataclass(frozen=True)
class ModelCost:
    """What one data-parallel step of a model costs, counted (lesson 03): one replica's FLOPs and operations for
    its per-device batch, the bytes on device 0's link in a DataParallel step on 1, 2, ... devices, DDP's buckets
    (after its first step) and gradient tensors, DataParallel's own host work on 1, 2, ... devices, measured
    (``measure_replication``; empty when not measured), and when each bucket is ready, as a share of backward
    (``bucket_ready``; empty: in proportion to the bytes made so far)."""

    name: str
    per_device: int
    flops: Flops
    device0_bytes: list[int]
    bucket_bytes: list[int]
    gradients: int = 0
    replication_s: list[float] = field(default_factory=list)
    bucket_ready: list[float] = field(default_factory=list)

    @property
    def parameter_bytes(self) -> int:
        return sum(self.bucket_bytes)

    def compute_on(self, link: Interconnect, host: HostCosts | None = None) -> Compute:
        """One replica's predicted compute on the GPU ``link`` usually connects (``Flops.on``), launch-bound where
        the host is slower (``host``, by default ``host_costs()``)."""
        return self.flops.on(link, host_costs() if host is None else host)

    def speedups(
        self,
        link: Interconnect,
        compute: Compute | None = None,
        host: HostCosts | None = None,
        max_devices: int | None = None,
    ) -> dict[str, list[float]]:
        """Predicted speed-ups of DataParallel and DDP on 1, 2, ... devices on ``link`` (``predicted_speedups``):
        the compute ``compute`` (measured on GPUs) or else these FLOPs at the peak rates of the GPU that such a
        link usually connects, in PyTorch's default precision for each (``compute_on``), with the host's costs
        (``host``, by default ``host_costs()``; ``HostCosts.none()``: FLOPs and bytes alone). DataParallel as far
        as the bytes were counted, DDP up to ``max_devices`` (default: as far)."""
        host = host_costs() if host is None else host
        return predicted_speedups(
            link,
            self.compute_on(link, host) if compute is None else compute,
            self.device0_bytes,
            self.bucket_bytes,
            self.replication_s if host.replication else (),
            self.gradients * host.ddp_per_gradient_s,
            max_devices=max_devices,
            bucket_ready=self.bucket_ready,
        )

    def predict(
        self, link: Interconnect, counts: Sequence[int] = (2, 4, 8), host: HostCosts | None = None
    ) -> dict[str, list[float]]:
        """Predicted efficiency of DataParallel and DDP at each of ``counts`` (at most ``link.max_devices``) on
        ``link`` (``speedups``; DDP up to the largest of ``counts``)."""
        return efficiencies(self.speedups(link, host=host, max_devices=max(counts)), counts)


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
    (``gpulab.traffic.counted_step``) by running gpulab's DataParallel algorithm itself on 1 to ``max_devices``
    virtual devices backed by the meta device, ``per_device`` samples each, the broadcast and the reduce moved as
    NCCL moves them on GPUs; DDP's buckets group the gradients as ``Reducer::rebuild_buckets`` does, in the order
    the counted backward made them, each with the share of backward done when it is ready (``count_flops``);
    DataParallel's own host work is measured on ``max_devices`` (``measure_replication``) and counted per replica.
    So a model far too big for this machine is counted in seconds; the operations whose meta kernels PyTorch runs
    in Python are answered from their shapes (``_ShapesOnly``), which counts the same.
    """
    from gpulab import traffic

    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    meta = torch.device("meta")
    with meta:
        model = make_model()
        inputs, targets = make_batch(per_device)
    with _shapes_only():
        flops = count_flops(model, loss_fn, inputs, targets)
        device0_bytes = [0]
        for count in range(2, max_devices + 1):
            with meta:
                inputs, targets = make_batch(per_device * count)
            moved = traffic.counted_step(model, inputs, targets, loss_fn, count, "nccl")
            device0_bytes.append(sum(moved.by_stage(0).values()))
    parameters = [p for p in model.parameters() if p.requires_grad]
    order = list(flops.gradient_order) + [i for i in reversed(range(len(parameters))) if i not in flops.gradient_order]
    ready = list(flops.gradient_ready) + [1.0] * (len(order) - len(flops.gradient_ready))
    sizes = [parameters[i].numel() * parameters[i].element_size() for i in order]
    buckets, bucket_ready = _bucketed(sizes, ready, DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES)
    per_replica = measure_replication(model, max_devices) / max_devices if max_devices > 1 else 0.0
    replication_s = [0.0] + [count * per_replica for count in range(2, max_devices + 1)]
    return ModelCost(name, per_device, flops, device0_bytes, buckets, len(parameters), replication_s, bucket_ready)


def measure_replication(model: torch.nn.Module, count: int, repeats: int = 3) -> float:
    """DataParallel's own host work in one step on ``count`` devices, measured on this machine's CPU (lesson 03):
    ``replicate()`` of ``model`` and one thread per replica started and joined (``parallel_apply`` of replicas
    that do nothing). On virtual devices backed by the ``meta`` device: the broadcasts move no data, the module
    copies are PyTorch's own (``Module._replicate_for_data_parallel``, as ``torch.nn.parallel.replicate`` makes
    them), the virtual broadcasts' bookkeeping runs in Python where PyTorch's broadcast runs in C++: an upper bound
    of the Python ``replicate()`` costs on a GPU machine with this CPU. The fastest of ``repeats`` runs, in seconds
    of this process's CPU time (``time.process_time``: the work, whatever other programs on the machine do)."""
    from gpulab.data_parallel import parallel_apply, replicate

    meta = torch.device("meta")
    device_ids = list(range(count))
    idle = [torch.nn.Identity() for _ in device_ids]
    inputs = [(torch.empty(0, device=meta),) for _ in device_ids]
    seconds = []
    for _ in range(repeats):
        started = time.process_time()
        replicate(model, device_ids, 0)
        parallel_apply(idle, inputs, None, device_ids, meta)
        seconds.append(time.process_time() - started)
    return min(seconds)


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


# The hardware of the published measurements below, each figure from its datasheet (not in INTERCONNECTS: the
# lesson's first prediction draws those).
DGX1_V100 = Interconnect(
    "NVLink 2 (DGX-1)",
    150e9,
    "NVIDIA V100 Tensor Core GPU datasheet (SXM2): NVLink 300 GB/s, both directions: 150 GB/s each way",
    "V100 SXM2",
    15.7e12,
    "NVIDIA V100 Tensor Core GPU datasheet: 15.7 TFLOPS single precision (SXM2)",
)
FOUR_T4 = Interconnect(
    "4x T4 (PCIe 3.0 x16)",
    15.75e9,
    "NVIDIA T4 datasheet: PCIe Gen3 x16 interface, no NVLink: the cards talk over PCIe 3.0 x16 at best",
    "T4",
    8.1e12,
    "NVIDIA T4 datasheet: 8.1 TFLOPS single precision (FP32)",
    max_devices=4,
)


@dataclass(frozen=True)
class PublishedScaling:
    """A published multi-GPU measurement of a model gpulab counts (``gpulab.models``), to set beside this module's
    prediction for the same model, batch per GPU and hardware (lesson 03, ``comparison_table``).

    ``seconds[way][devices]``: the measured time of the same work per GPU, ``per_device`` samples on each GPU;
    ``one_device_s``: a plain model on one GPU. ``per_step``: the times are one step's (efficiency
    ``one_device_s / seconds``), else one pass over a fixed data set (efficiency ``one_device_s / (N x seconds)``).
    ``includes``: what the measured times hold besides the training step this module predicts."""

    source: str
    hardware: str
    workload: str
    includes: str
    link: Interconnect
    per_device: int
    one_device_s: float
    seconds: dict[str, dict[int, float]]
    per_step: bool = True

    def efficiency(self, way: str) -> dict[int, float]:
        """The measured efficiency of ``way`` at each device count it was measured on, 2 and more."""
        return {
            devices: self.one_device_s / (seconds if self.per_step else devices * seconds)
            for devices, seconds in self.seconds[way].items()
            if devices > 1
        }


# PyTorch's DDP benchmark (benchmarks/distributed/ddp/benchmark.py), its README's example output: the p50 seconds
# per iteration of ResNet-50, "no ddp" on one GPU, then DDP on 1, 2, 4 and 8 GPUs of one machine (1M/nG).
DDP_BENCHMARK = PublishedScaling(
    source=(
        "PyTorch repository, benchmarks/distributed/ddp/README.md (the DDP benchmark's example output), "
        "p50 seconds per iteration"
    ),
    hardware="8x V100 (DGX-1: NVLink, 'nvidia-smi topo -m' as printed there); PyTorch 1.4.0a0, CUDA 10.0, NCCL",
    workload="ResNet-50 (torchvision), 32 images per GPU",
    includes="the synthetic batch's handling and the optimizer step of the benchmark's loop",
    link=DGX1_V100,
    per_device=32,
    one_device_s=0.097,
    seconds={"DDP": {1: 0.100, 2: 0.103, 4: 0.103, 8: 0.104}},
)

PUBLISHED_SCALING = [
    DDP_BENCHMARK,
    PublishedScaling(
        source=(
            "GoogleCloudPlatform/vertex-ai-samples, community-content/pytorch_efficient_training/README.md, "
            "'Benchmark', seconds per epoch with local data (resnet.py, resnet_dp.py, resnet_ddp.py)"
        ),
        hardware="4x NVIDIA T4",
        workload="ResNet-50 (torchvision), 32 images per GPU, ImageNet's validation images",
        includes=(
            "loading and decoding the JPEG images (2 loader processes per GPU); the DDP run also synchronises "
            "BatchNorm across GPUs (SyncBatchNorm)"
        ),
        link=FOUR_T4,
        per_device=32,
        one_device_s=489.0,
        seconds={"DataParallel": {4: 157.0}, "DDP": {4: 134.0}},
        per_step=False,
    ),
]


def comparison_table(cost: ModelCost, studies: Sequence[PublishedScaling] = PUBLISHED_SCALING) -> str:
    """Each published measurement of ``cost``'s model beside this module's prediction for it, in the lesson's
    language (lesson 03): what ran, on what, its source, what its times hold besides a training step, then for
    each way and device count the measured efficiency, the predicted one and the gap (measured minus predicted);
    for a per-step study, also one GPU's measured and predicted step."""
    lines = []
    for study in studies:
        lines += [text(study.workload), text(study.hardware), message("scaling.source", source=text(study.source))]
        lines.append(message("scaling.includes", what=text(study.includes)))
        compute = cost.compute_on(study.link)
        if study.per_step:
            lines.append(
                message(
                    "scaling.one_device",
                    measured=f"{study.one_device_s * 1e3:.0f}",
                    predicted=f"{compute.step_s * 1e3:.0f}",
                )
            )
        largest = max(devices for times in study.seconds.values() for devices in times)
        predicted = cost.predict(study.link, range(1, largest + 1))
        for way in study.seconds:
            for devices, measured in study.efficiency(way).items():
                expected = predicted[way][devices - 1]
                lines.append(
                    "  "
                    + message(
                        "scaling.compared",
                        way=way,
                        devices=devices,
                        measured=f"{measured:.2f}",
                        predicted=f"{expected:.2f}",
                        gap=f"{measured - expected:+.2f}",
                    )
                )
    return "\n".join(lines)


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
