"""The ``ddp_launch`` step: ``gpulab.ddp.launch`` wall time with 2 ranks, call to results."""

from __future__ import annotations

from gpucheck.context import DDP_LAUNCH_TARGET_S, StepContext


def step_ddp_launch(ctx: StepContext) -> None:
    """gpulab.ddp.launch wall time with 2 ranks, call to results (bench_ddp_launch.time_launches)."""
    import statistics

    import bench_ddp_launch

    repeats = 2 if ctx.quick else 3
    durations, backend = bench_ddp_launch.time_launches(repeats=repeats, world_size=2)
    median = statistics.median(durations)
    ctx.details.update(world_size=2, backend=backend, durations_s=[round(d, 3) for d in durations], median_s=median)
    ctx.figure(f"gpulab.ddp.launch, 2 ranks ({backend}), call to results, median of {repeats}", median, "s")
    print(f"launch with 2 ranks ({backend}): {durations}", flush=True)
    if median > DDP_LAUNCH_TARGET_S:
        ctx.warn(f"DDP launch took {median:.2f} s (target <= {DDP_LAUNCH_TARGET_S:g} s)")
