"""The ``memory_accuracy`` step: ``gpulab.memory`` for known allocations (a real GPU; virtual devices) and the
per-virtual-device peaks of a DataParallel step."""

from __future__ import annotations

import json
import time

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
    """NVML's used bytes on CUDA device ``index`` (matched by UUID), read directly, or None without NVML."""
    import torch

    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return None
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:  # noqa: BLE001
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _real_tracker_accuracy(ctx: StepContext, size: int) -> None:
    """The real-GPU tracker, ``torch.cuda.max_memory_allocated`` and NVML for one known allocation on cuda:0."""
    import torch
    from gpulab import memory, plots
    from gpulab.devices import Devices

    real = Devices([0], virtual=False, primary=torch.device("cuda", 0), reason="one real GPU (gpu check)")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(0)
    nvml_before = nvml_used(0)
    with memory.track(real, interval=0.01) as trace:
        time.sleep(0.05)
        trace.mark("allocate")
        block = torch.ones(size, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        time.sleep(0.1)
        nvml_during = nvml_used(0)
        trace.mark("free")
        del block
        torch.cuda.synchronize()
        time.sleep(0.05)
    tracker = trace.peaks()[0] - base
    torch_peak = torch.cuda.max_memory_allocated(0) - base
    series = trace.nvml_used[0]
    gpulab_nvml = (max(series) - series[0]) if series else None
    direct_nvml = nvml_during - nvml_before if nvml_during is not None and nvml_before is not None else None
    result = {
        "known_bytes": size,
        "tracker_peak_minus_base": tracker,
        "torch_max_memory_allocated_minus_base": torch_peak,
        "tracker_nvml_rise": gpulab_nvml,
        "direct_nvml_rise": direct_nvml,
        "samples": len(trace.times),
        "notice": trace.notice,
    }
    ctx.details["real_gpu"] = result
    print(json.dumps(result), flush=True)
    for what, value in (
        ("known allocation", size),
        ("gpulab.memory (real GPU) peak rise", tracker),
        ("torch.cuda.max_memory_allocated rise", torch_peak),
        ("NVML used rise seen by gpulab.memory", gpulab_nvml),
        ("NVML used rise read directly", direct_nvml),
    ):
        ctx.figure(f"memory accuracy: {what}", value / MIB if value is not None else None, "MiB")
    if tracker != torch_peak:
        ctx.fail(f"tracker peak rise {tracker} B != torch.cuda.max_memory_allocated rise {torch_peak} B")
    if abs(tracker - size) > 0.01 * size:
        ctx.fail(f"tracker saw {tracker} B for a {size} B allocation (more than 1 % off)")
    for label, rise in (("gpulab.memory's NVML series", gpulab_nvml), ("NVML read directly", direct_nvml)):
        if rise is None:
            ctx.warn(f"{label}: NVML unavailable ({trace.notice})")
        elif not (0.99 * size <= rise <= size + 128 * MIB):
            ctx.warn(f"{label} rose by {rise / MIB:.1f} MiB for a {size / MIB:.0f} MiB allocation")
    title = f"{size // MIB} MiB allocated and freed on cuda:0\n{ctx.hardware}"
    ctx.save_plot(plots.plot_trace(trace, display=False, title=title), "memory_trace_real_gpu.png")


def step_memory_accuracy(ctx: StepContext) -> None:
    """gpulab.memory for known allocations (real GPU and virtual devices) and a DataParallel step's peaks."""
    import gpulab
    import torch
    from bench_virtual_dp import cases
    from gpulab import memory, plots, virtual

    on_gpu = torch.cuda.is_available()
    if on_gpu:
        _real_tracker_accuracy(ctx, (64 if ctx.quick else 256) * MIB)
    else:
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
