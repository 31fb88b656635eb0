"""The ``ddp_launch`` step: ``gpulab.ddp.launch`` wall time with 2 ranks, call to results."""

from __future__ import annotations

from gpucheck.context import DDP_LAUNCH_TARGET_S, StepContext


def step_ddp_launch(ctx: StepContext) -> None:
    """gpulab.ddp.launch wall time with 2 ranks, call to results (bench_ddp_launch.time_launches)."""
    import statistics

    import bench_ddp_launch

    repeats = ctx.settings.launch_repeats
    durations, backend = bench_ddp_launch.time_launches(repeats=repeats, world_size=2)
    # the first launch of a process starts the fork server (torch imported once); the later ones fork from it
    first, median = durations[0], statistics.median(durations[1:])
    ctx.details.update(
        world_size=2,
        backend=backend,
        durations_s=[round(d, 3) for d in durations],
        first_s=first,
        later_median_s=median,
    )
    ctx.figure(f"gpulab.ddp.launch, 2 ranks ({backend}), call to results, first launch of this step", first, "s")
    ctx.figure(
        f"gpulab.ddp.launch, 2 ranks ({backend}), call to results, median of the later {repeats - 1}", median, "s"
    )
    print(f"launch with 2 ranks ({backend}): {durations}", flush=True)
    slowest = max(first, median)
    if slowest > DDP_LAUNCH_TARGET_S:
        ctx.warn(f"DDP launch took {slowest:.2f} s (target <= {DDP_LAUNCH_TARGET_S:g} s)")
