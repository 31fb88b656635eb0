"""The ``link_traffic`` step: lesson 03's bytes per link and stage; on 2+ GPUs stage times and bandwidth."""

from __future__ import annotations

from gpucheck.context import MIB, StepContext


def step_link_traffic(ctx: StepContext) -> None:
    """Lesson 03's bytes per link and stage of a DataParallel step (gpulab.traffic); on 2+ GPUs also each stage's
    time (CUDA events), the bandwidth of a plain GPU 0 -> k copy, and the predicted speed-up next to the measured."""
    import gpulab
    import torch
    from gpulab import models, plots, scaling, traffic
    from torch import nn

    gpus = 0 if ctx.cpu else torch.cuda.device_count()
    count, per_device = (min(gpus, 8) if gpus >= 2 else 2), 128
    sizes = (32, 64, 2_000 if ctx.quick else 20_000)
    devices = gpulab.devices(count, quiet=True)
    where = f"{count} {'virtual devices' if devices.virtual else 'GPUs'}"

    def make_model():
        torch.manual_seed(0)
        return models.WideHead(*sizes)

    inputs, labels = gpulab.data.classification(per_device * count, sizes[0], sizes[2], seed=1)
    moved = traffic.data_parallel_step(make_model(), inputs, labels, nn.functional.cross_entropy, count)
    ctx.details.update(model=f"WideHead{sizes}", per_device=per_device, devices=devices.reason, **moved.to_dict())
    for stage, nbytes in moved.by_stage(0).items():
        ctx.figure(f"DataParallel on {where}: {stage}, bytes to or from device 0", nbytes / MIB, "MiB")
    for stage, rate in moved.bandwidth().items():
        ctx.figure(f"DataParallel on {where}: {stage}, measured bandwidth", rate / 1e9, "GB/s")
    ctx.save_plot(plots.plot_traffic(moved, display=False, title=f"{where}\n{ctx.hardware}"), "link_traffic.png")
    if devices.virtual:
        ctx.missing(
            ["per-stage times and bandwidth (CUDA events)", "GPU-to-GPU copy bandwidth", "measured vs predicted"],
            f"only {gpus} GPU(s): a link between GPUs needs 2",
        )
        return
    copy_rates = []
    for target in range(1, count):
        source = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda:0")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        source.to(f"cuda:{target}")  # warm-up (peer access set-up)
        start.record()
        source.to(f"cuda:{target}")
        end.record()
        end.synchronize()
        copy_rates.append(source.numel() / (start.elapsed_time(end) / 1e3))
        ctx.figure(f"copy GPU 0 -> GPU {target}, 256 MiB", copy_rates[-1] / 1e9, "GB/s")
    measured, compute = scaling.measure_on_gpus(make_model, inputs, labels, per_device, list(devices))
    here = scaling.Interconnect("this machine", min(copy_rates), "measured copy", "this GPU", 1.0, "measured")
    predicted = scaling.dp_step_s(compute, sum(moved.by_stage(0).values()), here)
    ctx.figure(
        f"DataParallel on {where}: predicted speed-up (measured compute, copy bandwidth)",
        count * compute.step_s / predicted,
        "x",
    )
    for method, points in measured.items():
        for devices_used, speedup in points:
            ctx.figure(f"{method} on {devices_used} GPUs: measured speed-up", speedup, "x")
