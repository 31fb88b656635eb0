"""The timing steps: ``step_times`` (one device vs virtual DataParallel vs DDP with 2 ranks on one device) and
``real_scaling`` (real ``nn.DataParallel`` vs DDP over NCCL on 1, 2 and N GPUs)."""

from __future__ import annotations

import time
import traceback
from typing import Any

from gpucheck.context import StepContext, short, slug


def train_step(model, inputs, labels):
    from gpulab import bench
    from torch import nn

    return bench.make_train_step(model, nn.functional.cross_entropy, inputs, labels)


def repeat_counts(ctx: StepContext, case: Any, on_gpu: bool) -> tuple[int, int]:
    """(warm-up, repeats) for a benchmark case: many on a GPU (steps take milliseconds), few on a CPU."""
    if on_gpu:
        return (3, 10) if ctx.quick else (5, 30)
    heavy = case.classes >= 1000
    if ctx.quick:
        return (1, 3) if heavy else (2, 10)
    return (2, 7) if heavy else (3, 30)


def step_step_times(ctx: StepContext) -> None:
    """One device vs virtual DataParallel (2 virtual devices) vs DDP (2 ranks sharing the device), per case."""
    import copy

    import bench_virtual_dp
    import gpu_check_ranks
    import gpulab
    import torch
    from gpulab import bench, ddp, plots

    devices = gpulab.devices(2, quiet=True)
    if not devices.virtual:  # the parent shows this step one GPU only; keep the promise if it did not
        raise RuntimeError(f"expected virtual devices for this step, got: {devices.reason}")
    primary = devices.primary
    on_gpu = primary.type == "cuda"
    placement = "cuda-shared" if on_gpu else "cpu"
    one, dp, two_ranks = "1 device", "DataParallel, 2 virtual", "DDP, 2 ranks"  # short: they label plot bars
    described = {
        one: f"1 device ({primary})",
        dp: f"gpulab.DataParallel, 2 virtual devices on {primary}",
        two_ranks: f"DDP, 2 ranks sharing {primary} (gloo)",
    }
    ctx.details.update(
        devices=devices.reason,
        setups=described,
        torch_threads=torch.get_num_threads(),
        ddp_placement=placement,
        ddp_backend="gloo",
        ddp_threads_per_rank=1,
        cases=[],
    )
    for index, case in enumerate(bench_virtual_dp.cases(ctx.quick)):
        warmup, repeats = repeat_counts(ctx, case, on_gpu)
        record: dict[str, Any] = {"case": case.name, "batch": case.batch, "warmup": warmup, "repeats": repeats}
        ctx.details["cases"].append(record)
        try:
            inputs, labels = case.make_batch(primary)
            torch.manual_seed(0)
            single = case.make_model().to(primary)
            wrapped = gpulab.DataParallel(copy.deepcopy(single))
            timings = bench.compare(
                {one: train_step(single, inputs, labels), dp: train_step(wrapped, inputs, labels)},
                case.batch,
                warmup,
                repeats,
                devices={one: 1, dp: 2},
                methods={one: "1 device", dp: "DataParallel"},
                progress=False,
            )
            del single, wrapped, inputs, labels
            started = time.perf_counter()
            ranks = ddp.launch(
                gpu_check_ranks.ddp_step_timing,
                2,
                index,
                ctx.quick,
                placement,
                warmup,
                repeats,
                backend="gloo",
                output="all",
            )
            record["ddp_launch_and_run_s"] = round(time.perf_counter() - started, 3)
            record["ddp_ranks"] = [{k: v for k, v in rank.items() if k != "timing"} for rank in ranks]
            timings.append(bench.merge_ranks([rank["timing"] for rank in ranks], label=two_ranks))
        except Exception as error:  # noqa: BLE001 - one case failing must not hide the others
            traceback.print_exc()
            ctx.fail(f"{case.name}: {type(error).__name__}: {error}")
            continue
        record["timings"] = [timing.to_dict() for timing in timings]
        base = timings[0].median_s
        for timing in timings:
            print(f"{case.name}: {described[timing.label]}: {timing}", flush=True)
            what = f"{case.name}: {described[timing.label]}"
            ctx.figure(f"{what}: step time", timing.median_s * 1e3, "ms")
            ctx.figure(f"{what}: throughput", timing.samples_per_s, "samples/s")
            if timing is not timings[0]:
                record[f"ratio_{timing.method}_to_1_device"] = round(timing.median_s / base, 3)
        title = f"{short(case.name)} on {primary}\n{ctx.hardware}"
        ctx.save_plot(plots.plot_step_times(timings, display=False, title=title), f"step_times_{slug(case.name)}.png")
    if ctx.cpu or not on_gpu:
        ctx.missing(
            "step times on a GPU (one device, virtual DataParallel and DDP on cuda:0)",
            "no CUDA GPU visible" + (" (--cpu)" if ctx.cpu else "") + ": measured on the CPU instead",
        )


def _gpu_counts(available: int) -> list[int]:
    return sorted({1, 2, min(available, 8)})


def step_real_scaling(ctx: StepContext) -> None:
    """Real nn.DataParallel vs DDP over NCCL on 1, 2 and N GPUs (same global batch): step time and samples/s."""
    import copy
    from dataclasses import replace

    import bench_virtual_dp
    import gpu_check_ranks
    import torch
    from gpulab import bench, ddp, plots
    from torch import nn

    counts = _gpu_counts(torch.cuda.device_count())
    ctx.details.update(gpu_counts=counts, cases=[])
    for index, case in enumerate(bench_virtual_dp.cases(ctx.quick)):
        warmup, repeats = repeat_counts(ctx, case, on_gpu=True)
        record: dict[str, Any] = {"case": case.name, "batch": case.batch, "timings": []}
        ctx.details["cases"].append(record)
        try:
            inputs, labels = case.make_batch("cuda:0")
            torch.manual_seed(0)
            model = case.make_model().to("cuda:0")
            one = bench.time_step(train_step(model, inputs, labels), case.batch, warmup, repeats, label="1 GPU")
            timings = [replace(one, method="DataParallel"), replace(one, method="DDP")]
            for count in counts[1:]:
                wrapped = nn.DataParallel(copy.deepcopy(model), device_ids=list(range(count)))
                step = train_step(wrapped, inputs, labels)
                label = f"nn.DataParallel, {count} GPUs"
                timings.append(
                    bench.time_step(
                        step, case.batch, warmup, repeats, label=label, devices=count, method="DataParallel"
                    )
                )
                del wrapped
                ranks = ddp.launch(
                    gpu_check_ranks.ddp_step_timing, count, index, ctx.quick, "cuda-own", warmup, repeats
                )
                timings.append(bench.merge_ranks([r["timing"] for r in ranks], label=f"DDP (NCCL), {count} GPUs"))
        except Exception as error:  # noqa: BLE001
            traceback.print_exc()
            ctx.fail(f"{case.name}: {type(error).__name__}: {error}")
            continue
        record["timings"] = [timing.to_dict() for timing in timings]
        for timing in timings[2:]:  # the first two are the 1-GPU baseline, once per method
            speedup = one.median_s / timing.median_s
            ctx.figure(f"{case.name}: {timing.label}: step time", timing.median_s * 1e3, "ms")
            ctx.figure(f"{case.name}: {timing.label}: throughput", timing.samples_per_s, "samples/s")
            ctx.figure(f"{case.name}: {timing.label}: speed-up over 1 GPU", speedup, "x")
        ctx.figure(f"{case.name}: 1 GPU: step time", one.median_s * 1e3, "ms")
        title = f"{short(case.name)}\n{ctx.hardware}"
        ctx.save_plot(plots.plot_scaling(timings, display=False, title=title), f"scaling_{slug(case.name)}.png")
        shown = [timings[0], *timings[2:]]
        ctx.save_plot(
            plots.plot_step_times(shown, display=False, title=title), f"step_times_real_{slug(case.name)}.png"
        )
