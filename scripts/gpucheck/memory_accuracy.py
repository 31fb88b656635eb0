"""The ``memory_accuracy`` step: ``gpulab.memory`` for known allocations (a real GPU; virtual devices) and the
per-virtual-device peaks of a DataParallel step.

On a real GPU the tracker is compared with what survives the block (``real_tracker_accuracy``); without a GPU
the same comparison runs on simulated allocator statistics (``SimulatedGpu``), recorded as a simulation, never
as a figure."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from gpucheck.context import MIB, StepContext, short


def loss_in_forward(model, reduction_sum_loss):
    """A module whose forward returns its chunk's summed loss as a ``[1]`` tensor (lesson 03's fix): DataParallel
    then gathers one number per device instead of every output."""
    from torch import nn

    class _LossInForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, inputs, targets):
            return reduction_sum_loss(self.model(inputs), targets).reshape(1)

    return _LossInForward()


def imbalance(peaks: list[int]) -> float | None:
    others = peaks[1:]
    mean = sum(others) / len(others) if others else 0
    return peaks[0] / mean if mean else None


def dp_memory_traces(devices, case, steps: int = 2):
    """Traces of DataParallel training steps: outputs gathered on device 0, then the loss computed in forward."""
    import gpulab
    import torch
    from gpulab import memory
    from torch import nn

    inputs, labels = case.make_batch(devices.primary)
    torch.manual_seed(0)
    model = case.make_model().to(devices.primary)
    traces = {}
    gathered = gpulab.DataParallel(model)
    with memory.track(devices) as trace:
        for step in range(steps):
            trace.mark(f"step {step}")
            model.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(gathered(inputs), labels).backward()
    traces["outputs gathered on device 0"] = trace
    in_forward = gpulab.DataParallel(loss_in_forward(model, nn.CrossEntropyLoss(reduction="sum")))
    with memory.track(devices) as trace:
        for step in range(steps):
            trace.mark(f"step {step}")
            model.zero_grad(set_to_none=True)
            (in_forward(inputs, labels).sum() / len(inputs)).backward()
    traces["loss computed in forward"] = trace
    return traces


def nvml_used(index: int) -> int | None:
    """NVML's used bytes on CUDA device ``index`` (the GPU, or under MIG the instance: ``gpulab.nvml``), read
    directly, or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return None
    try:
        from gpulab import nvml

        return int(pynvml.nvmlDeviceGetMemoryInfo(nvml.handle(pynvml, index)).used)
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


class RealGpu:
    """cuda:0 as ``real_tracker_accuracy`` uses it: allocate and free a block, read the allocator and NVML."""

    simulated = False

    def allocate(self, size: int) -> Any:
        import torch

        block = torch.ones(size, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        return block

    def settle(self) -> None:
        import torch

        torch.cuda.synchronize()

    def nvml_used(self) -> int | None:
        return nvml_used(0)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        yield


class SimulatedGpu(RealGpu):
    """One simulated GPU for the CPU dry run: ``torch.cuda``'s allocator statistics (allocated bytes, and the peak
    since the last ``reset_peak_memory_stats``, as the caching allocator keeps them) replaced while ``installed``,
    so that ``real_tracker_accuracy`` and ``gpulab.memory``'s real-GPU path run unchanged. No NVML."""

    simulated = True

    def __init__(self) -> None:
        self.allocated = 0
        self.peak = 0

    def allocate(self, size: int) -> Any:
        self.allocated += size
        self.peak = max(self.peak, self.allocated)
        return _Freed(self, size)

    def settle(self) -> None:
        pass

    def nvml_used(self) -> int | None:
        return None

    def _reset(self, index: int = 0) -> None:
        self.peak = self.allocated

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        import torch

        replaced = {
            "device_count": lambda: 1,
            "synchronize": lambda device=None: None,
            "empty_cache": lambda: None,
            "memory_allocated": lambda device=None: self.allocated,
            "max_memory_allocated": lambda device=None: self.peak,
            "reset_peak_memory_stats": self._reset,
        }
        originals = {name: getattr(torch.cuda, name) for name in replaced}
        for name, function in replaced.items():
            setattr(torch.cuda, name, function)
        try:
            yield
        finally:
            for name, function in originals.items():
                setattr(torch.cuda, name, function)


class _Freed:
    """A simulated block: its bytes go back to the simulated allocator when it is collected (``del block``)."""

    def __init__(self, gpu: SimulatedGpu, size: int):
        self.gpu, self.size = gpu, size

    def __del__(self) -> None:
        self.gpu.allocated -= self.size


def real_tracker_accuracy(ctx: StepContext, size: int, gpu: RealGpu) -> dict[str, Any]:
    """The real-GPU tracker for one known allocation on cuda:0, against what survives the block.

    The tracker resets the allocator's peak statistics at every sample (so that a spike between two samples
    shows), so ``torch.cuda.max_memory_allocated`` read after the block has forgotten the allocation; it is
    recorded, never compared. The tracker's peak rise is compared with the known size, with
    ``torch.cuda.memory_allocated`` read while the block holds the allocation, and with the tracker's own highest
    sample; NVML's rise is reported next to them. On ``SimulatedGpu`` (the CPU dry run) the same comparisons run
    on simulated allocator statistics: the result is returned and its failures count, but no figure or plot is
    recorded (a simulation measures nothing).
    """
    import torch
    from gpulab import memory, plots
    from gpulab.devices import Devices

    real = Devices([0], virtual=False, primary=torch.device("cuda", 0), reason="one real GPU (gpu check)")
    with gpu.installed():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(0)
        nvml_before = gpu.nvml_used()
        with memory.track(real, interval=0.01) as trace:
            time.sleep(0.05)
            trace.mark("allocate")
            block = gpu.allocate(size)
            time.sleep(0.1)
            held = torch.cuda.memory_allocated(0) - base
            nvml_during = gpu.nvml_used()
            trace.mark("free")
            del block
            gpu.settle()
            time.sleep(0.05)
        after_block_max = torch.cuda.max_memory_allocated(0) - base
    tracker = trace.peaks()[0] - base
    highest = max(trace.highest[0], default=0) - base
    series = trace.nvml_used[0]
    gpulab_nvml = (max(series) - series[0]) if series else None
    direct_nvml = nvml_during - nvml_before if nvml_during is not None and nvml_before is not None else None
    result = {
        "simulated": gpu.simulated,
        "known_bytes": size,
        "tracker_peak_minus_base": tracker,
        "tracker_highest_sample_minus_base": highest,
        "torch_memory_allocated_while_held_minus_base": held,
        "torch_max_memory_allocated_after_block_minus_base": after_block_max,
        "tracker_nvml_rise": gpulab_nvml,
        "direct_nvml_rise": direct_nvml,
        "samples": len(trace.times),
        "notice": trace.notice,
    }
    print(json.dumps(result), flush=True)
    where = " (simulated allocator statistics)" if gpu.simulated else ""
    if abs(tracker - size) > 0.01 * size:
        ctx.fail(f"tracker saw {tracker} B for a {size} B allocation (more than 1 % off){where}")
    if tracker != held:
        ctx.fail(f"tracker peak rise {tracker} B != torch.cuda.memory_allocated rise while held {held} B{where}")
    if highest != tracker:
        ctx.fail(f"tracker's highest sample {highest} B != its peak {tracker} B{where}")
    if gpu.simulated:
        return result
    for what, value in (
        ("known allocation", size),
        ("gpulab.memory (real GPU) peak rise", tracker),
        ("torch.cuda.memory_allocated rise while held", held),
        ("NVML used rise seen by gpulab.memory", gpulab_nvml),
        ("NVML used rise read directly", direct_nvml),
    ):
        ctx.figure(f"memory accuracy: {what}", value / MIB if value is not None else None, "MiB")
    for label, rise in (("gpulab.memory's NVML series", gpulab_nvml), ("NVML read directly", direct_nvml)):
        if rise is None:
            ctx.warn(f"{label}: NVML unavailable ({trace.notice})")
        elif not (0.99 * size <= rise <= size + 128 * MIB):
            ctx.warn(f"{label} rose by {rise / MIB:.1f} MiB for a {size / MIB:.0f} MiB allocation")
    title = f"{size // MIB} MiB allocated and freed on cuda:0\n{ctx.hardware}"
    ctx.save_plot(plots.plot_trace(trace, display=False, title=title), "memory_trace_real_gpu.png")
    return result


def step_memory_accuracy(ctx: StepContext) -> None:
    """gpulab.memory for known allocations (real GPU and virtual devices) and a DataParallel step's peaks."""
    import gpulab
    import torch
    from bench_virtual_dp import cases
    from gpulab import memory, plots, virtual

    on_gpu = torch.cuda.is_available()
    size = (64 if ctx.quick else 256) * MIB
    if on_gpu:
        ctx.details["real_gpu"] = real_tracker_accuracy(ctx, size, RealGpu())
    else:
        # The comparison's code runs on simulated allocator statistics, so that it cannot rot between GPU runs.
        ctx.details["real_gpu_simulated"] = real_tracker_accuracy(ctx, size, SimulatedGpu())
        ctx.missing(
            [
                "gpulab.memory vs torch.cuda.max_memory_allocated for a known allocation",
                "gpulab.memory vs NVML used memory for a known allocation",
            ],
            "no CUDA GPU visible" + (" (--cpu)" if ctx.cpu else ""),
        )
    devices = gpulab.devices(2, quiet=True)
    size = 8 * MIB
    if on_gpu:
        torch.cuda.synchronize()
        cuda_base = torch.cuda.memory_allocated(0)
        torch.cuda.reset_peak_memory_stats(0)
    with memory.track(devices, count_existing=False) as trace:
        first = torch.ones(size, dtype=torch.uint8, device=devices.primary)
        with virtual.placing_on(1):
            second = first.clone()
        cuda_rise = torch.cuda.memory_allocated(0) - cuda_base if on_gpu else None
        del first, second
    peaks = trace.peaks()
    ctx.details["virtual_known_allocation"] = {
        "devices": devices.reason,
        "known_bytes_each": size,
        "peaks": peaks,
        "torch_cuda_allocated_rise": cuda_rise,
    }
    ctx.figure("memory accuracy: virtual devices, 8 MiB on each: device 0 peak", peaks[0] / MIB, "MiB")
    ctx.figure("memory accuracy: virtual devices, 8 MiB on each: device 1 peak", peaks[1] / MIB, "MiB")
    if peaks != [size, size]:
        ctx.fail(f"virtual tracker peaks {peaks} for {size} B made on each of devices 0 and 1")
    if on_gpu and cuda_rise != 2 * size:
        ctx.fail(f"torch.cuda.memory_allocated rose by {cuda_rise} B, the virtual tracker counted {2 * size} B")

    wide = [case for case in cases(ctx.quick) if case.model_name == "WideHead"][0]
    traces = dp_memory_traces(devices, wide)
    ctx.details["virtual_data_parallel"] = {"case": wide.name, "devices": devices.reason, "variants": {}}
    for label, trace in traces.items():
        peaks = trace.peaks()
        ratio = imbalance(peaks)
        ctx.details["virtual_data_parallel"]["variants"][label] = {"peaks": peaks, "imbalance": ratio}
        for device, peak in enumerate(peaks):
            ctx.figure(f"{wide.name}, virtual DataParallel, {label}: device {device} peak", peak / MIB, "MiB")
        ctx.figure(f"{wide.name}, virtual DataParallel, {label}: device 0 / others", ratio, "x")
        print(label, trace.summary(), sep="\n", flush=True)
    gathered = traces["outputs gathered on device 0"]
    where = f"DataParallel, 2 virtual devices on {devices.primary}"
    title = f"{short(wide.name)}: {where}\n{ctx.hardware}"
    ctx.save_plot(plots.plot_trace(gathered, display=False, title=title), "memory_trace_virtual.png")
    title = f"{short(wide.name)}\n{where}\n{ctx.hardware}"
    ctx.save_plot(plots.plot_peaks(traces, display=False, title=title), "memory_peaks_virtual.png")
    gathered_ratio = imbalance(gathered.peaks())
    in_forward_ratio = imbalance(traces["loss computed in forward"].peaks())
    if gathered_ratio is not None and in_forward_ratio is not None and not gathered_ratio > in_forward_ratio:
        ratios = f"{gathered_ratio:.2f} vs {in_forward_ratio:.2f}"
        ctx.warn(f"device 0's excess did not shrink with the loss in forward ({ratios})")
