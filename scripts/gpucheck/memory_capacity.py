"""The ``memory_capacity`` step: lesson 03's memory block within a capacity (``gpulab.memory.track(capacity=)``).

Lesson 03's block (``peaks_of``): a new ``WideHead`` of the lesson's sizes, Adam, two training steps on the
lesson's batch (256 samples, 20,000 classes), the batch made before the block (``count_existing=False``); the
loss in forward is exercise 3's module, answered (``memory_accuracy.loss_in_forward``).

* As the lesson runs it on one GPU or none: two virtual devices (on ``cuda:0``, or on the CPU), DataParallel,
  the lesson's 64 MiB. The lesson says: with the loss outside forward, device 0 runs out (PyTorch's
  ``torch.OutOfMemoryError``, device 1 still has room); with the loss in forward, both fit. Checked on either.
* On the real GPU ``cuda:0`` (the tracker's CUDA path: ``torch.cuda.set_per_process_memory_fraction``, set to
  what the process holds plus the capacity). The process first holds memory of its own (a 512 MiB tensor and
  cuBLAS's workspace from a first run of the block), so a capacity that fits proves it is room for the block on
  top of what the process holds. The block is run uncapped (its allocated peak P and the segments it reserves,
  R), then with a capacity of R + 2 MiB (must fit), of exactly R (a warning if it does not: the fraction is a
  float of the GPU's memory, which can cost a byte), of P / 2 (must raise ``torch.OutOfMemoryError``), and of
  P, 1.25 P, 1.5 P and 2 P (recorded: where the allocator's segment rounding needs more than the allocated
  peak). After the capped blocks the process's memory fraction is back as it was and an allocation larger than
  the capacity succeeds. Without a GPU this part is not measured.
"""

from __future__ import annotations

import json
from typing import Any

from gpucheck.context import MIB, StepContext
from gpucheck.memory_accuracy import loss_in_forward as in_forward  # lesson 03's exercise 3, answered

BATCH, FEATURES, HIDDEN, VOCABULARY = 256, 32, 64, 20_000  # lesson 03's
LESSON_CAPACITY = "64 MiB"
HELD_BY_THE_PROCESS = 512 * MIB
LADDER = (1.0, 1.25, 1.5, 2.0)  # capacities as multiples of the block's allocated peak, recorded
REAL_GPU_FIGURES = [
    "lesson 03's block on the real GPU: allocated peak and reserved segments",
    "lesson 03's block on the real GPU within a capacity of its reserved segments and 2 MiB (must fit)",
    "lesson 03's block on the real GPU within half its peak (must raise torch.OutOfMemoryError)",
    "the smallest capacity that fits, as a multiple of the allocated peak (segment rounding)",
]


def lesson_batch(device: Any) -> tuple[Any, Any]:
    import gpulab

    inputs, labels = gpulab.data.classification(BATCH, FEATURES, VOCABULARY, seed=1)
    return inputs.to(device), labels.to(device)


def lesson_block(device: Any, inputs: Any, labels: Any, wrap=None, loss_in_forward: bool = False, steps: int = 2):
    """Lesson 03's ``peaks_of`` body: a new model, Adam, ``steps`` training steps (``wrap``: DataParallel)."""
    import gpulab
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = gpulab.models.WideHead(FEATURES, HIDDEN, VOCABULARY).to(device)
    network = in_forward(model, nn.CrossEntropyLoss(reduction="sum")) if loss_in_forward else model
    parallel = wrap(network) if wrap else network
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        if loss_in_forward:
            loss = parallel(inputs, labels).sum() / len(inputs)
        else:
            loss = nn.functional.cross_entropy(parallel(inputs), labels)
        loss.backward()
        optimizer.step()


def virtual_capacity(ctx: StepContext) -> dict[str, Any]:
    """The lesson's two runs within 64 MiB on two virtual devices: the loss outside forward runs out on device 0,
    the loss in forward fits."""
    import gpulab
    import torch
    from gpulab import memory

    devices = gpulab.devices(2, quiet=True)
    inputs, labels = lesson_batch(devices.primary)
    results: dict[str, Any] = {"devices": devices.reason, "capacity": LESSON_CAPACITY, "runs": {}}
    for name, loss_in_forward in (("loss outside forward", False), ("loss in forward", True)):
        run: dict[str, Any] = {}
        try:
            with memory.track(devices, count_existing=False, capacity=LESSON_CAPACITY) as trace:
                lesson_block(devices.primary, inputs, labels, gpulab.DataParallel, loss_in_forward)
            run.update(fits=True, peaks_mib=[round(peak / MIB, 1) for peak in trace.peaks()])
        except torch.OutOfMemoryError as error:
            run.update(fits=False, error=str(error)[:300], refused=trace.out_of_memory)
        results["runs"][name] = run
        where = f"lesson 03's block, DataParallel on {devices.primary} (2 virtual devices), {LESSON_CAPACITY}"
        ctx.figure(f"{where}, {name}: fits", float(run["fits"]), "1 = fits, 0 = out of memory")
    outside, inside = results["runs"]["loss outside forward"], results["runs"]["loss in forward"]
    if outside["fits"] or (outside.get("refused") or {}).get("device") != 0:
        ctx.fail(f"the loss outside forward should run out of {LESSON_CAPACITY} on device 0: {outside}")
    if not inside["fits"]:
        ctx.fail(f"the loss in forward should fit in {LESSON_CAPACITY} on each device: {inside}")
    return results


def _capped(real: Any, capacity: int, inputs: Any, labels: Any) -> dict[str, Any]:
    """Lesson 03's block on cuda:0 within ``capacity`` bytes: whether it fits, its peak, and the allocator after."""
    import torch
    from gpulab import memory

    run: dict[str, Any] = {"capacity_mib": round(capacity / MIB, 2)}
    try:
        with memory.track(real, count_existing=False, capacity=capacity) as trace:
            lesson_block("cuda:0", inputs, labels)
            torch.cuda.synchronize()
            run["reserved_in_block_mib"] = round(torch.cuda.memory_reserved(0) / MIB, 1)
        run.update(fits=True, peak_mib=round(trace.peaks()[0] / MIB, 2))
    except torch.OutOfMemoryError as error:
        run.update(fits=False, error=str(error).splitlines()[0][:300])
    run["fraction_after"] = torch.cuda.get_per_process_memory_fraction(0)
    torch.cuda.empty_cache()
    return run


def real_capacity(ctx: StepContext) -> dict[str, Any]:
    """Lesson 03's block on the real GPU cuda:0 within capacities (see the module docstring)."""
    import torch
    from gpulab import memory
    from gpulab.devices import Devices

    real = Devices([0], virtual=False, primary=torch.device("cuda", 0), reason="one real GPU (gpu check)")
    fraction_before = torch.cuda.get_per_process_memory_fraction(0)
    held = torch.empty(HELD_BY_THE_PROCESS, dtype=torch.uint8, device="cuda:0")
    inputs, labels = lesson_batch("cuda:0")
    lesson_block("cuda:0", inputs, labels)  # the first run: cuBLAS's workspace and lazy set-ups, held from now on
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved_before, allocated_before = torch.cuda.memory_reserved(0), torch.cuda.memory_allocated(0)
    with memory.track(real, count_existing=False) as trace:
        lesson_block("cuda:0", inputs, labels)
        torch.cuda.synchronize()
    peak = trace.peaks()[0]
    reserved_rise = torch.cuda.memory_reserved(0) - reserved_before
    torch.cuda.empty_cache()
    result: dict[str, Any] = {
        "allocated_before_the_block_mib": round(allocated_before / MIB, 1),  # the held tensor, the batch, cuBLAS
        "reserved_before_the_block_mib": round(reserved_before / MIB, 1),
        "fraction_before": fraction_before,
        "allocated_peak_mib": round(peak / MIB, 2),
        "reserved_rise_mib": round(reserved_rise / MIB, 2),
    }
    ctx.figure("lesson 03's block on cuda:0: allocated peak (gpulab.memory, real GPU)", peak / MIB, "MiB")
    ctx.figure("lesson 03's block on cuda:0: segments reserved for it (uncapped)", reserved_rise / MIB, "MiB")
    result["within_reserved_and_2_mib"] = _capped(real, reserved_rise + 2 * MIB, inputs, labels)
    result["within_reserved"] = _capped(real, reserved_rise, inputs, labels)
    result["within_half_peak"] = _capped(real, peak // 2, inputs, labels)
    result["ladder"] = {
        f"{multiple:g} x peak": _capped(real, int(peak * multiple), inputs, labels) for multiple in LADDER
    }
    fitting = [multiple for multiple in LADDER if result["ladder"][f"{multiple:g} x peak"]["fits"]]
    result["smallest_fitting_multiple"] = min(fitting) if fitting else None
    ctx.figure(
        "lesson 03's block on cuda:0: smallest capacity that fits, of 1, 1.25, 1.5, 2 x its allocated peak",
        result["smallest_fitting_multiple"],
        "x peak",
    )
    if not result["within_reserved_and_2_mib"]["fits"]:
        ctx.fail(
            f"the block did not fit in a capacity of the {reserved_rise / MIB:.1f} MiB it reserves uncapped and 2 MiB, "
            f"on top of the {HELD_BY_THE_PROCESS // MIB} MiB the process holds: {result['within_reserved_and_2_mib']}"
        )
    elif not result["within_reserved"]["fits"]:
        ctx.warn(
            f"the block fits in its reserved segments and 2 MiB, not in exactly those: {result['within_reserved']}"
        )
    if result["within_half_peak"]["fits"]:
        ctx.fail(f"the block fitted in half its peak ({peak / 2 / MIB:.1f} MiB): the capacity was not enforced")
    runs = [result["within_reserved_and_2_mib"], result["within_reserved"], result["within_half_peak"]]
    runs += result["ladder"].values()
    if any(run["fraction_after"] != fraction_before for run in runs):
        ctx.fail(f"the memory fraction was not put back to {fraction_before}: {[r['fraction_after'] for r in runs]}")
    try:
        beyond = torch.empty(int(peak * 2) + HELD_BY_THE_PROCESS, dtype=torch.uint8, device="cuda:0")
        del beyond
        result["allocation_beyond_the_capacity_after"] = "succeeded"
    except torch.OutOfMemoryError as error:
        result["allocation_beyond_the_capacity_after"] = str(error)[:300]
        ctx.fail(f"after the capped blocks an allocation beyond the capacity was refused: {error}")
    del held
    return result


def step_memory_capacity(ctx: StepContext) -> None:
    """Lesson 03's memory block within a capacity: on virtual devices as the lesson runs, and on the real GPU."""
    import torch

    ctx.details["virtual"] = virtual_capacity(ctx)
    if torch.cuda.is_available():
        ctx.details["real_gpu"] = real_capacity(ctx)
    else:
        ctx.missing(REAL_GPU_FIGURES, "no CUDA GPU visible" + (" (--cpu)" if ctx.cpu else ""))
    print(json.dumps(ctx.details, default=str), flush=True)
