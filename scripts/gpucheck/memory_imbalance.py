"""The ``memory_imbalance`` step (2+ GPUs): per-GPU peak memory under DataParallel, the loss in forward, and DDP."""

from __future__ import annotations

from typing import Any

from gpucheck.context import MIB, StepContext, short
from gpucheck.memory_accuracy import dp_memory_traces, imbalance


def step_memory_imbalance(ctx: StepContext) -> None:
    """Per-GPU peak memory on real GPUs: DataParallel gathering on GPU 0, the loss in forward, and DDP."""
    import bench_virtual_dp
    import gpu_check_ranks
    import gpulab
    import torch
    from gpulab import ddp, plots

    count = min(torch.cuda.device_count(), 8)
    devices = gpulab.devices(count, quiet=True)
    all_cases = bench_virtual_dp.cases(ctx.quick)
    index, wide = next((i, c) for i, c in enumerate(all_cases) if c.model_name == "WideHead")
    traces: dict[str, Any] = dict(dp_memory_traces(devices, wide))
    ranks = ddp.launch(gpu_check_ranks.ddp_step_timing, count, index, ctx.quick, "cuda-own", 1, 2)
    traces["DDP, one process per GPU"] = [rank["peak_bytes"] for rank in ranks]
    ctx.details.update(case=wide.name, devices=devices.reason, variants={})
    for label, trace in traces.items():
        peaks = trace if isinstance(trace, list) else trace.peaks()
        ratio = imbalance(peaks)
        ctx.details["variants"][label] = {"peaks": peaks, "imbalance": ratio}
        for device, peak in enumerate(peaks):
            ctx.figure(f"{wide.name}, {count} GPUs, {label}: GPU {device} peak", peak / MIB, "MiB")
        ctx.figure(f"{wide.name}, {count} GPUs, {label}: GPU 0 / others", ratio, "x")
    title = f"{short(wide.name)} on {count} GPUs\n{ctx.hardware}"
    ctx.save_plot(plots.plot_peaks(traces, display=False, title=title), "memory_peaks_gpus.png")
    gathered = traces["outputs gathered on device 0"]
    title = f"{short(wide.name)}: nn.DataParallel on {count} GPUs\n{ctx.hardware}"
    ctx.save_plot(plots.plot_trace(gathered, display=False, title=title), "memory_trace_gpus.png")
