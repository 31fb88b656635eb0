"""The ``memory_overhead`` step: the tracker's cost at 20 samples/s (real-GPU sampler, virtual-device tracker)."""

from __future__ import annotations

import math
import time

from gpucheck.context import REAL_TRACKER_TARGET, StepContext
from gpucheck.timing import train_step


def step_memory_overhead(ctx: StepContext) -> None:
    """The tracker's cost at 20 samples/s: the real-GPU sampler (target <= 2 %) and the virtual-device tracker."""
    import bench_memory_overhead as overhead
    import gpulab
    import torch
    from gpulab.devices import Devices

    on_gpu = torch.cuda.is_available()
    rounds = ctx.settings.overhead_rounds
    ctx.details.update(interval_s=0.05, rounds=rounds, real_gpu=[], virtual=[])
    chosen = overhead.cases(ctx.quick, device="cuda:0" if on_gpu else "cpu")
    chosen = [chosen[0], chosen[-1]]  # the lessons' MLP and lesson 03's wide head
    if on_gpu:
        real = Devices([0], virtual=False, primary=torch.device("cuda", 0), reason="one real GPU (gpu check)")
        for case in chosen:
            model = case["model"]().to("cuda:0")
            inputs, targets = case["batch"]()
            step = train_step(model, inputs, targets)
            for _ in range(3):
                step()
            started = time.perf_counter()
            for _ in range(5):
                step()
            step_s = (time.perf_counter() - started) / 5
            # blocks of >= 0.5 s, i.e. ~10 samples at 20 samples/s, or the sampler would never wake in a block
            repeats = min(5000, max(case["repeats"], math.ceil(0.5 / max(step_s, 1e-6))))
            row = {"model": case["name"], "setup": "1 GPU, real tracker (torch.cuda + NVML sampler thread)"}
            row.update(overhead.measure(step, repeats, rounds, real, interval=0.05, empty_mode_too=False))
            ctx.details["real_gpu"].append(row)
            percent = (row["ratio"] - 1) * 100
            ctx.figure(f"tracker overhead, real GPU, 20 samples/s: {case['name']}", percent, "%", target="<= 2 %")
            print(f"real tracker, {case['name']}: {percent:+.2f} % ({row['repeats_each']} steps each)", flush=True)
            if row["ratio"] > 1 + REAL_TRACKER_TARGET:
                ctx.warn(f"real-GPU tracker overhead {percent:.1f} % > 2 % target for {case['name']}")
    else:
        ctx.missing(
            "memory tracker overhead on a real GPU at 20 samples/s (target <= 2 %)",
            "no CUDA GPU visible" + (" (--cpu)" if ctx.cpu else ""),
        )
    devices = gpulab.devices(2, quiet=True)
    virtual_cases = chosen[:1] if ctx.quick else chosen
    for case in virtual_cases:
        model = case["model"]().to(devices.primary)
        inputs, targets = case["batch"]()
        for setup, wrapped in (("1 device", model), ("DataParallel, 2 virtual devices", gpulab.DataParallel(model))):
            step = train_step(wrapped, inputs, targets)
            row = {"model": case["name"], "setup": f"{setup} on {devices.primary}, dispatch-level tracker"}
            # the wide head's step takes about a second on a CPU: 3 rounds of it are plenty there
            case_rounds = 3 if case is chosen[-1] and not on_gpu else rounds
            row.update(overhead.measure(step, case["repeats"], case_rounds, devices, interval=0.05))
            row["rounds"] = case_rounds
            ctx.details["virtual"].append(row)
            percent = (row["ratio"] - 1) * 100
            ctx.figure(f"tracker overhead, virtual devices on {devices.primary}: {case['name']}, {setup}", percent, "%")
            print(f"virtual tracker, {case['name']}, {setup}: {percent:+.1f} %", flush=True)
    entry = overhead.entry_cost(devices, times=3)
    ctx.details["virtual_track_entry_exit_s"] = entry
    ctx.figure(f"entering and leaving track() on virtual devices on {devices.primary}", entry * 1e3, "ms")
