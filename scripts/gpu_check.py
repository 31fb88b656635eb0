"""The GPU check: one command that proves every GPU path of the course and records the numbers it quotes.

Usage::

    make gpu-bundle                                  # here, with internet: the wheels, into gpu-bundle/
    make gpu-check                                   # there: OUT defaults to benchmarks/results/gpu-check-<date>
    make gpu-check OUT=benchmarks/results/gpu-check-h200
    python scripts/gpu_check.py OUT [--bundle DIR [--venv DIR]] [--cpu] [--quick] [--deadline SECONDS] [--jobs N]
                                    [--only STEPS] [--skip STEPS]

``OUT`` is a folder; it receives ``report.json``, ``summary.txt``, the PNG plots, and ``logs/`` (each step's output,
the tests' JUnit XML); ``OUT.tar.gz`` next to it holds all of it, the one file to send back. The summary is also
printed at the end.

Where it runs: on a bare GPU server image (Python 3.12 and a CUDA torch, pytest, matplotlib, nvidia-ml-py, tqdm,
psutil, numpy; no Jupyter, no nbgrader, no internet), ``make gpu-check`` runs ``--bundle gpu-bundle``: a virtual
environment (``--venv``, default ``.build/gpu-check-venv``) that reuses the image's torch
(``--system-site-packages``) gets the bundle's wheels (``scripts/gpu_bundle.py``) installed offline, and the check
runs again inside it; ``report.json``'s ``prepared`` says what was installed and which torch was used. Without
``--bundle`` the check runs with the Python that started it.

* ``--cpu`` forces the CPU even where a GPU exists (``CUDA_VISIBLE_DEVICES=""`` for every step, every kernel and
  every rank): the dry run CI does (``tests/test_gpu_check.py``), so the script cannot rot between GPU runs. Its
  figures are labelled as CPU figures.
* ``--quick`` limits the work (CI): lesson 01 only for execution and autograding, two benchmark cases with a
  smaller wide head, fewer repeats.
* ``--deadline`` (default 480 s): steps that would start after it are skipped, with the reason recorded; a step
  still running at the deadline is stopped (with everything it started) and recorded as timed out.
* ``--jobs`` autograding workers (processes); default: a quarter of the CPU cores, at most 4.
* ``--only`` / ``--skip``: comma-separated step names (the environment step always runs).

The steps, in order (each runs in its own process, so that a crash, a hang or a poisoned CUDA context costs only
that step; each records its status, wall time, details, figures and what it could not measure):

* ``environment``: GPUs, driver, torch, CUDA, cuDNN, NCCL, CPU count, package versions (``gpulab.environment()``).
* ``gpu_tests``: every test module that holds ``gpu`` / ``gpu2``-marked tests, run whole in a subprocess (its CPU
  parts too), with JUnit XML: passed / failed / skipped counts; the gpu tests skipped for want of GPUs, and modules
  that cannot be imported here, are listed as not measured with the reason (never an aborted run).
* ``step_times``: the lesson models (``benchmarks/bench_virtual_dp.cases``) on one device vs ``gpulab.DataParallel``
  on 2 virtual devices vs DDP with 2 ranks sharing the device (gloo): step time and samples/s (``gpulab.bench``).
  On a multi-GPU machine this step (and the next two) sees only the first GPU, so it measures the one-GPU case.
* ``memory_accuracy``: ``gpulab.memory`` against ``torch.cuda.max_memory_allocated`` and NVML for a known
  allocation; the virtual-device tracker for known allocations; per-virtual-device peaks of a DataParallel step
  (outputs gathered on device 0 vs the loss computed in forward).
* ``memory_overhead``: the tracker's cost at 20 samples/s (``interval=0.05``): the real-GPU sampler (target <= 2 %)
  and the virtual-device tracker (``benchmarks/bench_memory_overhead.measure``).
* ``ddp_launch``: ``gpulab.ddp.launch`` wall time with 2 ranks, call to results (``benchmarks/bench_ddp_launch``).
* ``real_scaling`` (>= 2 GPUs): real ``nn.DataParallel`` vs DDP over NCCL on 1, 2 and N GPUs: step time, samples/s.
* ``memory_imbalance`` (>= 2 GPUs): per-GPU peak memory: DataParallel gathering on GPU 0, loss in forward, DDP.
* ``link_traffic``: lesson 03's bytes per link and stage of a DataParallel step (``gpulab.traffic``); on 2+ GPUs
  also each stage's time (CUDA events) and bandwidth, a plain GPU 0 -> k copy's bandwidth, and the predicted
  speed-up (``gpulab.scaling``, measured compute and copy bandwidth) next to the measured one. Not run on a GPU yet.
* ``lessons``: every solved lesson (source notebook) run top to bottom with nbclient on this machine: total and
  slowest-cell time, errors, anything on stderr, the device mode the lesson announced.
* ``autograde``: per lesson, the reference, the blank release and the first wrong submission of its test module
  (``WRONG``), autograded; the reference must get full marks, the blank zero, the wrong one lose exactly its cells.

With fewer than two GPUs the multi-GPU steps are recorded as ``not_measured`` ("only N GPU(s)") and the report's
``not_measured`` list names every figure that could not be measured and why.

Exit code: 0 when every step that ran succeeded (``ok`` or ``not_measured``); 1 when a step failed or timed out;
2 when none failed but the deadline skipped some.

DDP rank functions live in ``benchmarks/gpu_check_ranks.py`` (ranks import them by name; ``__main__`` cannot be).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import importlib
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
UTILS = REPO / "utils"
SOURCE_ROOT = REPO / "source"

DEFAULT_DEADLINE_S = 480.0
DEFAULT_VENV = REPO / ".build" / "gpu-check-venv"
MIN_START_S = 10.0  # a step is not started with less than this left before the deadline
KILL_GRACE_S = 5.0
PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>
LOG_TAIL_LINES = 40
MIB = 1024 * 1024

OK, FAILED, TIMED_OUT, SKIPPED, NOT_MEASURED = "ok", "failed", "timed_out", "skipped", "not_measured"
STATUSES = (OK, FAILED, TIMED_OUT, SKIPPED, NOT_MEASURED)

# Lessons' time budget on the 2-core CI machine without GPU (COURSE.md §8); recorded, not enforced, here.
LESSON_BUDGET_S, CELL_BUDGET_S = 60.0, 10.0
REAL_TRACKER_TARGET = 0.02  # the real-GPU sampler may slow a step by at most 2 %
DDP_LAUNCH_TARGET_S = 5.0


def _setup_paths() -> None:
    """The repository (``tests.*``), ``benchmarks/`` (bench modules, rank functions) and, when gpulab is not
    installed, ``utils/`` on ``sys.path``; spawned DDP ranks and autograding workers inherit it."""
    for path in (BENCHMARKS, REPO):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    if importlib.util.find_spec("gpulab") is None and str(UTILS) not in sys.path:
        sys.path.insert(0, str(UTILS))


# ======================================================================================================================
# What a step does inside its process
# ======================================================================================================================


@dataclass
class StepContext:
    """Handed to every step function (in the step's own process); collects what the step reports."""

    name: str
    out: Path
    quick: bool
    cpu: bool
    jobs: int
    details: dict[str, Any] = field(default_factory=dict)
    figures: list[dict[str, Any]] = field(default_factory=list)
    not_measured: list[dict[str, Any]] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    status: str | None = None  # a step may declare itself not_measured
    reason: str | None = None
    _hardware: str | None = None

    @property
    def logs(self) -> Path:
        return self.out / "logs"

    @property
    def hardware(self) -> str:
        """What the figures were measured on, in words (e.g. ``NVIDIA H200 (cuda:0)`` or ``CPU, 2 cores``)."""
        if self._hardware is None:
            import torch

            cores = os.cpu_count() or 1
            if torch.cuda.is_available():
                self._hardware = f"{torch.cuda.get_device_name(0)} (cuda:0), {cores} CPU cores"
            else:
                forced = " (--cpu)" if self.cpu else ""
                self._hardware = f"CPU only{forced}, {cores} cores"
        return self._hardware

    def figure(self, what: str, value: float | None, unit: str, **extra: Any) -> None:
        """Record one measured number, labelled with the hardware it was measured on."""
        self.figures.append(
            {"step": self.name, "what": what, "value": value, "unit": unit, "on": self.hardware, **extra}
        )

    def missing(self, figures: list[str] | str, reason: str) -> None:
        """Record figures this step could not measure here, and why."""
        figures = [figures] if isinstance(figures, str) else list(figures)
        self.not_measured.append({"step": self.name, "figures": figures, "reason": reason})

    def fail(self, message: str) -> None:
        """Record a failed check; the step goes on, and ends as failed."""
        print(f"FAILED: {message}", flush=True)
        self.failures.append(message)

    def warn(self, message: str) -> None:
        """Record a missed target or a doubt; does not fail the step."""
        print(f"warning: {message}", flush=True)
        self.warnings.append(message)

    def save_plot(self, figure: Any, file_name: str) -> None:
        path = self.out / file_name
        figure.savefig(path, dpi=100)
        self.plots.append(file_name)


def _short(case_name: str) -> str:
    """``"WideHead 64-128-50000, batch 512 (lesson 03)"`` -> ``"WideHead 64-128-50000, batch 512"``."""
    return case_name.split(" (")[0]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower().split(",")[0]).strip("_")[:40]


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


# ----------------------------------------------------------------------------------------------------------- steps


def _optional(read: Callable[[], Any]) -> Any:
    """A detail of the machine, or None when it cannot be read (the step must not fail for a detail)."""
    try:
        return read()
    except Exception:  # noqa: BLE001
        return None


def _nccl_version(torch: Any) -> str | None:
    if not torch.cuda.is_available():
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def step_environment(ctx: StepContext) -> None:
    """The machine: GPUs, driver, torch, CUDA, cuDNN, NCCL, CPU, versions of the packages the check uses."""
    from importlib import metadata

    import gpulab
    import torch
    import torch.distributed as dist

    env = gpulab.environment()
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "memory_gib": round(props.total_memory / 1024**3, 1),
                "capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count,
            }
        )
    versions = {}
    for package in ("torch", "nbgrader", "nbclient", "ipykernel", "nvidia-ml-py", "matplotlib", "jupytext", "pytest"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    ctx.details.update(
        summary=str(env),
        hardware=ctx.hardware,
        forced_cpu=ctx.cpu,
        platform=env.platform,
        os=platform.platform(),
        python=env.python,
        torch=env.torch,
        cuda=env.cuda,
        cudnn=_optional(lambda: torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None),
        nccl_available=_optional(lambda: dist.is_available() and dist.is_nccl_available()),
        nccl=_optional(lambda: _nccl_version(torch)),
        driver=env.driver,
        gpu_count=len(env.gpus),
        gpu_names=list(env.gpus),
        gpus=gpus,
        cpu_count=env.cpu_count,
        torch_threads=torch.get_num_threads(),
        load_average=[round(load, 2) for load in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        gpulab=gpulab.__version__,
        packages=versions,
    )
    print(env)


GPU_MARKERS = "gpu or gpu2"


def _pytest(ctx: StepContext, name: str, *arguments: str) -> tuple[subprocess.CompletedProcess, list[dict[str, Any]]]:
    """Run pytest with JUnit XML in ``logs/<name>.xml``; the process and each test case's outcome."""
    import xml.etree.ElementTree as ElementTree

    junit = ctx.logs / f"{name}.xml"
    command = [
        sys.executable, "-m", "pytest", *arguments, "-q", "-rfEs", "-p", "no:cacheprovider",
        "--continue-on-collection-errors", f"--junitxml={junit}", "-o", "junit_family=xunit2",
    ]  # fmt: skip
    print("+", " ".join(command), flush=True)
    # A private temporary folder: tests that check they leave nothing in it must not see other processes' files.
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{name}-") as private:
        environment = dict(os.environ, TMPDIR=private)
        completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environment)
    print(completed.stdout[-20000:], completed.stderr[-5000:], sep="\n", flush=True)
    cases = []
    if junit.is_file():
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for kind in ("failure", "error", "skipped"):
                found = case.find(kind)
                if found is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                    message = (found.get("message") or found.text or "")[:500]
                    if kind == "error" and not case.get("classname") and "collection" in message:
                        outcome, message = "not_importable", (found.text or message)[-500:]
                    break
            name_ = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append({"test": name_, "outcome": outcome, "seconds": float(case.get("time", 0)), "message": message})
    return completed, cases


def gpu_test_modules(ctx: StepContext) -> tuple[list[str], set[str], list[dict[str, Any]]]:
    """The test modules that hold gpu-marked tests, those tests' names, and the modules that cannot even be
    imported here (so cannot be searched): collected with ``--continue-on-collection-errors``, never aborted."""
    completed, _ = _pytest(ctx, "gpu_tests_collect", "--collect-only", "-m", GPU_MARKERS)
    ids = [line.strip() for line in completed.stdout.splitlines() if "::" in line and not line.startswith("ERROR")]
    modules = sorted({node.split("::")[0] for node in ids})
    broken = []
    for match in re.finditer(r"^_+ ERROR collecting (\S+) _+\n(.*?)(?=^_{5,}|^=+ )", completed.stdout, re.M | re.S):
        errors = [line[1:].strip() for line in match.group(2).splitlines() if line.startswith("E ")]
        broken.append({"module": match.group(1), "reason": errors[-1] if errors else "import failed"})
    return modules, {node.split("::")[-1] for node in ids}, broken


def step_gpu_tests(ctx: StepContext) -> None:
    """Every test module holding gpu-marked tests, run whole (its CPU parts too); modules that cannot be imported
    here and gpu tests skipped for want of GPUs are recorded as not measured, with the reason."""
    modules, gpu_tests, broken = gpu_test_modules(ctx)
    for entry in broken:
        ctx.missing(f"tests in {entry['module']}", f"the module cannot be imported here: {entry['reason']}")
    ctx.details.update(modules=modules, not_importable=broken)
    if not modules:
        ctx.fail("no gpu-marked test was collected")
        return
    # --quick (CI) leaves out the modules' slow CPU tests; the gpu tests always run.
    selection = ["-m", f"{GPU_MARKERS} or not slow"] if ctx.quick else []
    completed, tests = _pytest(ctx, "gpu_tests", *selection, *modules)
    counts = {
        outcome: sum(t["outcome"] == outcome for t in tests) for outcome in ("passed", "failed", "error", "skipped")
    }
    on_gpus = [t for t in tests if t["test"].split("::")[-1] in gpu_tests]
    counts["gpu_passed"] = sum(t["outcome"] == "passed" for t in on_gpus)
    ctx.details.update(
        command=f"pytest {' '.join(modules)}", exit_code=completed.returncode, counts=counts, tests=tests
    )
    print(f"tests: {counts}", flush=True)
    if completed.returncode not in (0, 5) or counts["failed"] or counts["error"]:
        ctx.fail(f"pytest exit code {completed.returncode}: {counts['failed']} failed, {counts['error']} errors")
    gpus = _gpu_count()
    skipped = [t for t in on_gpus if t["outcome"] == "skipped"]
    if skipped:
        reason = f"not measured: only {gpus} GPU(s)" + (" (--cpu)" if ctx.cpu else "")
        ctx.missing([f"gpu test {t['test']} ({t['message']})" for t in skipped], reason)
    if gpus and not counts["gpu_passed"]:
        ctx.fail(f"{gpus} GPU(s) visible but no gpu-marked test ran (all {len(on_gpus)} skipped)")


def _train_step(model, inputs, labels):
    from gpulab import bench
    from torch import nn

    return bench.make_train_step(model, nn.functional.cross_entropy, inputs, labels)


def _counts(ctx: StepContext, case: Any, on_gpu: bool) -> tuple[int, int]:
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
        warmup, repeats = _counts(ctx, case, on_gpu)
        record: dict[str, Any] = {"case": case.name, "batch": case.batch, "warmup": warmup, "repeats": repeats}
        ctx.details["cases"].append(record)
        try:
            inputs, labels = case.make_batch(primary)
            torch.manual_seed(0)
            single = case.make_model().to(primary)
            wrapped = gpulab.DataParallel(copy.deepcopy(single))
            timings = bench.compare(
                {one: _train_step(single, inputs, labels), dp: _train_step(wrapped, inputs, labels)},
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
        title = f"{_short(case.name)} on {primary}\n{ctx.hardware}"
        ctx.save_plot(plots.plot_step_times(timings, display=False, title=title), f"step_times_{_slug(case.name)}.png")
    if ctx.cpu or not on_gpu:
        ctx.missing(
            "step times on a GPU (one device, virtual DataParallel and DDP on cuda:0)",
            "no CUDA GPU visible" + (" (--cpu)" if ctx.cpu else "") + ": measured on the CPU instead",
        )


def _loss_in_forward(model, reduction_sum_loss):
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


def _imbalance(peaks: list[int]) -> float | None:
    others = peaks[1:]
    mean = sum(others) / len(others) if others else 0
    return peaks[0] / mean if mean else None


def _dp_memory_traces(devices, case, steps: int = 2):
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
    in_forward = gpulab.DataParallel(_loss_in_forward(model, nn.CrossEntropyLoss(reduction="sum")))
    with memory.track(devices) as trace:
        for step in range(steps):
            trace.mark(f"step {step}")
            model.zero_grad(set_to_none=True)
            (in_forward(inputs, labels).sum() / len(inputs)).backward()
    traces["loss computed in forward"] = trace
    return traces


def _nvml_used(index: int) -> int | None:
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
    nvml_before = _nvml_used(0)
    with memory.track(real, interval=0.01) as trace:
        time.sleep(0.05)
        trace.mark("allocate")
        block = torch.ones(size, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        time.sleep(0.1)
        nvml_during = _nvml_used(0)
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
    traces = _dp_memory_traces(devices, wide)
    ctx.details["virtual_data_parallel"] = {"case": wide.name, "devices": devices.reason, "variants": {}}
    for label, trace in traces.items():
        peaks = trace.peaks()
        ratio = _imbalance(peaks)
        ctx.details["virtual_data_parallel"]["variants"][label] = {"peaks": peaks, "imbalance": ratio}
        for device, peak in enumerate(peaks):
            ctx.figure(f"{wide.name}, virtual DataParallel, {label}: device {device} peak", peak / MIB, "MiB")
        ctx.figure(f"{wide.name}, virtual DataParallel, {label}: device 0 / others", ratio, "x")
        print(label, trace.summary(), sep="\n", flush=True)
    gathered = traces["outputs gathered on device 0"]
    where = f"DataParallel, 2 virtual devices on {devices.primary}"
    title = f"{_short(wide.name)}: {where}\n{ctx.hardware}"
    ctx.save_plot(plots.plot_trace(gathered, display=False, title=title), "memory_trace_virtual.png")
    title = f"{_short(wide.name)}\n{where}\n{ctx.hardware}"
    ctx.save_plot(plots.plot_peaks(traces, display=False, title=title), "memory_peaks_virtual.png")
    gathered_ratio = _imbalance(gathered.peaks())
    in_forward_ratio = _imbalance(traces["loss computed in forward"].peaks())
    if gathered_ratio is not None and in_forward_ratio is not None and not gathered_ratio > in_forward_ratio:
        ratios = f"{gathered_ratio:.2f} vs {in_forward_ratio:.2f}"
        ctx.warn(f"device 0's excess did not shrink with the loss in forward ({ratios})")


def step_memory_overhead(ctx: StepContext) -> None:
    """The tracker's cost at 20 samples/s: the real-GPU sampler (target <= 2 %) and the virtual-device tracker."""
    import bench_memory_overhead as overhead
    import gpulab
    import torch
    from gpulab.devices import Devices

    on_gpu = torch.cuda.is_available()
    rounds = 3 if ctx.quick else 8
    ctx.details.update(interval_s=0.05, rounds=rounds, real_gpu=[], virtual=[])
    chosen = overhead.cases(ctx.quick, device="cuda:0" if on_gpu else "cpu")
    chosen = [chosen[0], chosen[-1]]  # the lessons' MLP and lesson 03's wide head
    if on_gpu:
        real = Devices([0], virtual=False, primary=torch.device("cuda", 0), reason="one real GPU (gpu check)")
        for case in chosen:
            model = case["model"]().to("cuda:0")
            inputs, targets = case["batch"]()
            step = _train_step(model, inputs, targets)
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
            step = _train_step(wrapped, inputs, targets)
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
        warmup, repeats = _counts(ctx, case, on_gpu=True)
        record: dict[str, Any] = {"case": case.name, "batch": case.batch, "timings": []}
        ctx.details["cases"].append(record)
        try:
            inputs, labels = case.make_batch("cuda:0")
            torch.manual_seed(0)
            model = case.make_model().to("cuda:0")
            one = bench.time_step(_train_step(model, inputs, labels), case.batch, warmup, repeats, label="1 GPU")
            timings = [replace(one, method="DataParallel"), replace(one, method="DDP")]
            for count in counts[1:]:
                wrapped = nn.DataParallel(copy.deepcopy(model), device_ids=list(range(count)))
                step = _train_step(wrapped, inputs, labels)
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
        title = f"{_short(case.name)}\n{ctx.hardware}"
        ctx.save_plot(plots.plot_scaling(timings, display=False, title=title), f"scaling_{_slug(case.name)}.png")
        shown = [timings[0], *timings[2:]]
        ctx.save_plot(
            plots.plot_step_times(shown, display=False, title=title), f"step_times_real_{_slug(case.name)}.png"
        )


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
    traces: dict[str, Any] = dict(_dp_memory_traces(devices, wide))
    ranks = ddp.launch(gpu_check_ranks.ddp_step_timing, count, index, ctx.quick, "cuda-own", 1, 2)
    traces["DDP, one process per GPU"] = [rank["peak_bytes"] for rank in ranks]
    ctx.details.update(case=wide.name, devices=devices.reason, variants={})
    for label, trace in traces.items():
        peaks = trace if isinstance(trace, list) else trace.peaks()
        ratio = _imbalance(peaks)
        ctx.details["variants"][label] = {"peaks": peaks, "imbalance": ratio}
        for device, peak in enumerate(peaks):
            ctx.figure(f"{wide.name}, {count} GPUs, {label}: GPU {device} peak", peak / MIB, "MiB")
        ctx.figure(f"{wide.name}, {count} GPUs, {label}: GPU 0 / others", ratio, "x")
    title = f"{_short(wide.name)} on {count} GPUs\n{ctx.hardware}"
    ctx.save_plot(plots.plot_peaks(traces, display=False, title=title), "memory_peaks_gpus.png")
    gathered = traces["outputs gathered on device 0"]
    title = f"{_short(wide.name)}: nn.DataParallel on {count} GPUs\n{ctx.hardware}"
    ctx.save_plot(plots.plot_trace(gathered, display=False, title=title), "memory_trace_gpus.png")


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


def _lessons(quick: bool) -> list[str]:
    found = sorted(path.name for path in SOURCE_ROOT.iterdir() if (path / f"{path.name}.py").is_file())
    return found[:1] if quick else found


def _run_lesson(lesson: str, cell_timeout: int) -> dict[str, Any]:
    """Execute one solved lesson with nbclient, cell by cell, timing each (as tests/test_lessons_execute.py)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    from tests.nbgrader_tools import build_source

    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{lesson}-") as tmp:
        notebook_path = build_source(lesson, tmp)
        notebook = nbformat.read(notebook_path, as_version=4)
        client = NotebookClient(
            notebook,
            timeout=cell_timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(notebook_path.parent)}},
        )
        cell_times: dict[int, float] = {}
        error = None
        started = time.perf_counter()
        with client.setup_kernel():
            kernel_ready = time.perf_counter() - started
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                cell_started = time.perf_counter()
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError as failure:
                    error = {"cell": index, "error": str(failure)[-3000:]}
                    break
                finally:
                    cell_times[index] = time.perf_counter() - cell_started
        total = time.perf_counter() - started
    stderr, mode = [], None
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.get("name") == "stderr":
                stderr.append({"cell": index, "text": output.get("text", "")[:1000]})
            if output.get("name") == "stdout" and mode is None:
                for line in output.get("text", "").splitlines():
                    if line.startswith(("Real GPUs", "Virtual devices")):
                        mode = line
                        break
    slowest = max(cell_times, key=cell_times.get) if cell_times else None
    first_line = notebook.cells[slowest].source.strip().splitlines()[0][:100] if slowest is not None else ""
    return {
        "lesson": lesson,
        "total_s": round(total, 2),
        "kernel_start_s": round(kernel_ready, 2),
        "code_cells": len(cell_times),
        "slowest_cell": {"index": slowest, "seconds": round(cell_times.get(slowest, 0.0), 2), "source": first_line},
        "cells_over_10_s": [index for index, seconds in cell_times.items() if seconds > CELL_BUDGET_S],
        "within_cpu_ci_budget": total <= LESSON_BUDGET_S and max(cell_times.values(), default=0) <= CELL_BUDGET_S,
        "mode": mode,
        "error": error,
        "stderr": stderr,
    }


def step_lessons(ctx: StepContext) -> None:
    """Every solved lesson (quick: the first) run top to bottom on this machine."""
    ctx.details["lessons"] = []
    for lesson in _lessons(ctx.quick):
        print(f"running {lesson} ...", flush=True)
        try:
            result = _run_lesson(lesson, cell_timeout=180)
        except Exception as error:  # noqa: BLE001
            traceback.print_exc()
            ctx.fail(f"{lesson}: {type(error).__name__}: {error}")
            continue
        ctx.details["lessons"].append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "stderr"}), flush=True)
        ctx.figure(f"lesson {lesson}: run top to bottom", result["total_s"], "s")
        ctx.figure(
            f"lesson {lesson}: slowest cell ({result['slowest_cell']['index']})", result["slowest_cell"]["seconds"], "s"
        )
        if result["error"]:
            ctx.fail(f"{lesson}: cell {result['error']['cell']} raised: {result['error']['error'][-300:]}")
        if result["stderr"]:
            ctx.fail(
                f"{lesson}: {len(result['stderr'])} output(s) on stderr, first: {result['stderr'][0]['text'][:200]!r}"
            )
        if not result["mode"]:
            ctx.warn(f"{lesson}: no 'Real GPUs' / 'Virtual devices' line found in its output")


def _wrong_submissions(lesson: str) -> dict[str, tuple[dict[str, str], set[str]]]:
    """The ``WRONG`` submissions of a lesson's test module (module level, or on its GradedLesson subclass)."""
    module_name = f"tests.test_lesson_{lesson.split('_')[0]}"
    if importlib.util.find_spec(module_name) is None:
        return {}
    module = importlib.import_module(module_name)
    wrong = getattr(module, "WRONG", None)
    if isinstance(wrong, dict) and wrong:
        return wrong
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "LESSON", None) == lesson and getattr(value, "WRONG", None):
            return value.WRONG
    return {}


def _grade_submission(lesson: str, kind: str, answers: dict[str, str] | None) -> dict[str, Any]:
    """Build one submission (reference, blank release, or the reference with ``answers``) and autograde it."""
    _setup_paths()
    from tests.nbgrader_tools import autograde_notebook, build_release, build_source
    from tests.submissions import with_answers

    with tempfile.TemporaryDirectory(prefix=f"gpu-check-grade-{lesson}-") as tmp:
        started = time.perf_counter()
        if kind == "blank":
            notebook = build_release(lesson, Path(tmp) / "release")
        else:
            notebook = build_source(lesson, Path(tmp) / "reference")
            if answers:
                notebook = with_answers(notebook, answers, Path(tmp) / "submission" / f"{lesson}.ipynb")
        built = time.perf_counter()
        scores = autograde_notebook(lesson, notebook)
        graded = time.perf_counter()
    return {
        "scores": {grade_id: list(pair) for grade_id, pair in scores.items()},
        "build_s": round(built - started, 2),
        "grade_s": round(graded - built, 2),
    }


def step_autograde(ctx: StepContext) -> None:
    """Per lesson: reference, blank release and the first WRONG submission, autograded; expected scores checked.

    Grading kernels run only in a sandbox (``autograder/sandbox.py``); an image without bubblewrap (a bare GPU
    server) records the grading as not measured, with the reason, instead of grading unsandboxed.
    """
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    _setup_paths()
    from autograder import sandbox

    reason = sandbox.unavailable_reason()
    if reason:
        ctx.missing("autograding in the grading sandbox", f"no sandbox here: {reason}")
        return
    tasks = []
    for lesson in _lessons(ctx.quick):
        tasks.append((lesson, "reference", None, None, None))
        tasks.append((lesson, "blank", None, None, None))
        wrong = _wrong_submissions(lesson)
        if wrong:
            name, (answers, expected_lost) = next(iter(wrong.items()))
            tasks.append((lesson, "wrong", name, answers, set(expected_lost)))
        else:
            ctx.warn(f"{lesson}: no WRONG submissions found in tests/test_lesson_{lesson.split('_')[0]}.py")
    ctx.details.update(jobs=ctx.jobs, submissions=[])
    if ctx.jobs > 1:
        pool = ProcessPoolExecutor(max_workers=ctx.jobs, mp_context=get_context("spawn"))
        futures = [pool.submit(_grade_submission, lesson, kind, answers) for lesson, kind, _, answers, _ in tasks]
        outcomes = []
        for future in futures:
            try:
                outcomes.append(future.result())
            except Exception as error:  # noqa: BLE001
                outcomes.append(error)
        pool.shutdown()
    else:
        outcomes = []
        for lesson, kind, _, answers, _ in tasks:
            print(f"autograding {lesson}: {kind} ...", flush=True)
            try:
                outcomes.append(_grade_submission(lesson, kind, answers))
            except Exception as error:  # noqa: BLE001
                traceback.print_exc()
                outcomes.append(error)
    for (lesson, kind, name, _, expected_lost), outcome in zip(tasks, outcomes, strict=True):
        label = f"{lesson} {kind}" + (f" ({name})" if name else "")
        if isinstance(outcome, Exception):
            ctx.fail(f"{label}: autograding raised {type(outcome).__name__}: {str(outcome)[-500:]}")
            ctx.details["submissions"].append(
                {"lesson": lesson, "submission": kind, "name": name, "error": str(outcome)}
            )
            continue
        scores = outcome["scores"]
        lost = {grade_id for grade_id, (score, maximum) in scores.items() if score != maximum}
        total = sum(score or 0 for score, _ in scores.values())
        maximum = sum(points for _, points in scores.values())
        record = {"lesson": lesson, "submission": kind, "name": name, "score": total, "max_score": maximum}
        record.update(lost=sorted(lost), **outcome)
        if kind == "reference" and lost:
            ctx.fail(f"{label}: the reference lost {sorted(lost)}")
        if kind == "blank" and any(score != 0 for score, _ in scores.values()):
            ctx.fail(f"{label}: the blank release scored {total}")
        if kind == "wrong":
            record["expected_lost"] = sorted(expected_lost)
            zeroed = all(scores[grade_id][0] == 0 for grade_id in lost if grade_id in scores)
            record["as_expected"] = lost == expected_lost and zeroed
            if not record["as_expected"]:
                ctx.fail(f"{label}: lost {sorted(lost)}, expected {sorted(expected_lost)} (all at 0: {zeroed})")
        if not scores:
            ctx.fail(f"{label}: no graded cell was scored")
        ctx.details["submissions"].append(record)
        ctx.figure(f"autograde {label}: score", total, f"of {maximum:g} points", grade_s=outcome["grade_s"])
        print(f"{label}: {total:g}/{maximum:g} in {outcome['grade_s']} s, lost {sorted(lost)}", flush=True)


# ======================================================================================================================
# The steps, and what each cannot measure with too few GPUs
# ======================================================================================================================


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    run: Callable[[StepContext], None]
    min_gpus: int = 0
    one_gpu: bool = False  # show the step only the first GPU (virtual devices on cuda:0 even on multi-GPU boxes)
    figures_without_gpus: tuple[str, ...] = ()  # what it measures, for the not_measured list


STEPS = [
    Step("environment", "machine: GPUs, driver, torch, CUDA", step_environment),
    Step("gpu_tests", "the test modules holding gpu-marked tests, run whole", step_gpu_tests),
    Step("step_times", "1 device vs virtual DataParallel vs DDP (2 ranks, one device)", step_step_times, one_gpu=True),
    Step("memory_accuracy", "gpulab.memory vs torch.cuda and NVML; virtual peaks", step_memory_accuracy, one_gpu=True),
    Step("memory_overhead", "memory tracker overhead at 20 samples/s", step_memory_overhead, one_gpu=True),
    Step("ddp_launch", "gpulab.ddp.launch time, 2 ranks", step_ddp_launch),
    Step(
        "real_scaling",
        "real nn.DataParallel vs DDP (NCCL) on 1..N GPUs",
        step_real_scaling,
        min_gpus=2,
        figures_without_gpus=(
            "real nn.DataParallel step time and samples/s on 2+ GPUs",
            "DDP over NCCL (one process per GPU) step time and samples/s on 2+ GPUs",
            "scaling of DataParallel vs DDP from 1 to N GPUs (speed-up over 1 GPU)",
        ),
    ),
    Step(
        "memory_imbalance",
        "per-GPU peak memory: DataParallel vs loss in forward vs DDP",
        step_memory_imbalance,
        min_gpus=2,
        figures_without_gpus=(
            "per-GPU peak memory under real nn.DataParallel (outputs gathered on GPU 0) and GPU 0 / others ratio",
            "per-GPU peak memory with the loss computed in forward on real GPUs",
            "per-GPU peak memory under DDP (one process per GPU)",
        ),
    ),
    Step(
        "link_traffic", "DataParallel bytes per link and stage; on GPUs, stage times and bandwidth", step_link_traffic
    ),
    Step("lessons", "every solved lesson, top to bottom", step_lessons),
    Step("autograde", "reference, blank and a wrong submission per lesson", step_autograde),
]
STEP_NAMES = [step.name for step in STEPS]


def _jsonable(value: Any) -> Any:
    """Plain JSON: non-finite floats become None, sets sorted lists, tuples lists, other objects their str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, set):
        return sorted(_jsonable(item) for item in value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "to_dict"):
        return _jsonable(value.to_dict())
    return str(value)


def run_step_here(name: str, options: argparse.Namespace) -> int:
    """The step's own process: run it, write its result to ``options.result``; always exit 0 (the parent reads it)."""
    _setup_paths()
    step = STEPS[STEP_NAMES.index(name)]
    out = Path(options.out).resolve()
    ctx = StepContext(name=name, out=out, quick=options.quick, cpu=options.cpu, jobs=options.jobs)
    error = None
    try:
        step.run(ctx)
    except BaseException as failure:  # noqa: BLE001 - recorded, never lost
        traceback.print_exc()
        error = f"{type(failure).__name__}: {failure}\n{traceback.format_exc()[-4000:]}"
    status = FAILED if error or ctx.failures else (ctx.status or OK)
    result = {
        "status": status,
        "reason": ctx.reason,
        "error": error or ("; ".join(ctx.failures) if ctx.failures else None),
        "failures": ctx.failures,
        "warnings": ctx.warnings,
        "details": ctx.details,
        "figures": ctx.figures,
        "not_measured": ctx.not_measured,
        "plots": ctx.plots,
    }
    Path(options.result).write_text(json.dumps(_jsonable(result), indent=1))
    return 0


# ======================================================================================================================
# The parent: runs each step in its own process, under the deadline, and writes the report
# ======================================================================================================================


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first seen via /proc), including those in other sessions."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _stop(process: subprocess.Popen) -> None:
    """End a step process and everything it started (kernels and ranks run in sessions of their own)."""
    pids = [process.pid, *_descendants(process.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            process.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        pids = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        if not pids:
            break
    if process.poll() is None:
        process.wait()


_subreaper = False


def _become_subreaper() -> bool:
    """Make this process the child subreaper of everything it starts (Linux).

    A step's kernels and ranks run in sessions of their own; if the step's process dies, they are re-parented to
    this process instead of init, so ``_end_leftovers`` can find and end them after the step.
    """
    global _subreaper
    if sys.platform.startswith("linux"):
        try:
            _subreaper = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            _subreaper = False
    return _subreaper


def _end_leftovers() -> list[str]:
    """End processes a finished step left running, and reap the exited ones re-parented to us (as subreaper)."""
    if not _subreaper:
        return []
    running = []
    for pid in _descendants(os.getpid()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat[stat.rindex(")") + 2] == "Z":  # exited, only waiting to be reaped
                continue
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue
        running.append(f"{pid}: {command.strip()[:200]}")
    waited_until = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < waited_until:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # nothing left to reap
        if pid == 0:
            if not running:
                break
            time.sleep(0.05)
    return running


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _step_environment(options: argparse.Namespace, step: Step, gpu_count: int) -> dict[str, str]:
    environment = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    if importlib.util.find_spec("gpulab") is None:  # kernels and pytest need gpulab too
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(UTILS), environment.get("PYTHONPATH")]))
    if options.cpu:
        environment["CUDA_VISIBLE_DEVICES"] = ""
    elif step.one_gpu and gpu_count > 1:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        environment["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0] if visible else "0"
    return environment


def run_step_process(options: argparse.Namespace, step: Step, gpu_count: int, timeout: float) -> dict[str, Any]:
    """Run one step in a fresh process with ``timeout`` seconds; its result, or a failure saying what happened."""
    out = Path(options.out)
    log = out / "logs" / f"{step.name}.log"
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        result_path = Path(tmp) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), str(out), "--run-step", step.name]
        command += ["--result", str(result_path), "--jobs", str(options.jobs)]
        command += ["--cpu"] * options.cpu + ["--quick"] * options.quick
        started = time.perf_counter()
        with open(log, "w") as log_file:
            process = subprocess.Popen(
                command,
                cwd=REPO,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=_step_environment(options, step, gpu_count),
                start_new_session=True,
            )
            timed_out = False
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BaseException:  # Ctrl-C: end the step and what it started, then stop
                _stop(process)
                raise
            finally:
                if timed_out or process.poll() is None:
                    _stop(process)
                leftovers = _end_leftovers()
        wall = time.perf_counter() - started
        if timed_out:
            result = {
                "status": TIMED_OUT,
                "error": f"stopped at the deadline after {wall:.0f} s (it and everything it started were ended)",
            }
        elif result_path.is_file():
            result = json.loads(result_path.read_text())
        else:
            result = {"status": FAILED, "error": f"the step's process exited with code {process.returncode}"}
    result["wall_s"] = round(wall, 2)
    result["log"] = str(log.relative_to(out))
    if leftovers:
        result.setdefault("warnings", []).append(
            f"{len(leftovers)} process(es) the step left running were ended: " + "; ".join(leftovers)[:1000]
        )
    if result["status"] in (FAILED, TIMED_OUT):
        result["log_tail"] = _log_tail(log)
    return result


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Prove every GPU path of the course and record its numbers (see the module docstring).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out", help="folder for report.json, the plots and logs/")
    parser.add_argument("--cpu", action="store_true", help="force the CPU even where a GPU exists (CI's dry run)")
    parser.add_argument("--quick", action="store_true", help="lesson 01 only, fewer cases and repeats (CI)")
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds for all steps (480)")
    parser.add_argument("--jobs", type=int, default=max(1, min(4, (os.cpu_count() or 1) // 4)), help="grading workers")
    parser.add_argument("--only", default="", help=f"comma-separated steps to run, of: {', '.join(STEP_NAMES)}")
    parser.add_argument("--skip", default="", help="comma-separated steps not to run")
    parser.add_argument(
        "--bundle",
        help="a folder of wheels (make gpu-bundle): run in a virtual environment that reuses this Python's torch "
        "and gets the rest from these wheels, offline (downloaded first when the folder does not exist)",
    )
    parser.add_argument("--venv", default=str(DEFAULT_VENV), help=f"that environment (default {DEFAULT_VENV})")
    parser.add_argument("--prepared", help=argparse.SUPPRESS)
    parser.add_argument("--run-step", choices=STEP_NAMES, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    for flag in ("only", "skip"):
        names = [name.strip() for name in getattr(options, flag).split(",") if name.strip()]
        unknown = sorted(set(names) - set(STEP_NAMES))
        if unknown:
            parser.error(f"--{flag}: unknown step(s) {unknown}; steps: {', '.join(STEP_NAMES)}")
        setattr(options, flag, names)
    if options.jobs < 1:
        parser.error("--jobs must be at least 1")
    return options


def _exit_code(steps: list[dict[str, Any]]) -> int:
    statuses = {step["status"] for step in steps}
    if statuses & {FAILED, TIMED_OUT}:
        return 1
    if SKIPPED in statuses:
        return 2
    return 0


def _format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def summary(report: dict[str, Any]) -> str:
    """The printed summary: machine, one line per step, the figures, what was not measured, plots, exit code."""
    machine = report["machine"]
    kind = "CPU dry run (--cpu)" if report["cpu"] else (f"{machine.get('gpu_count', 0)} GPU(s)")
    lines = [
        f"GPU check ({kind}{', quick' if report['quick'] else ''}) on {machine.get('hardware', '?')}",
        f"  {machine.get('summary', '')}",
        "",
        f"  {'step':<17} {'status':<13} {'wall':>8}  note",
    ]
    for step in report["steps"]:
        note = step.get("reason") or step.get("error") or ""
        if not note and step.get("warnings"):
            note = "warning: " + step["warnings"][0]
        note = note.strip().splitlines()[0][:110] if note.strip() else ""
        wall = f"{step['wall_s']:.1f} s" if step.get("wall_s") is not None else "-"
        lines.append(f"  {step['name']:<17} {step['status']:<13} {wall:>8}  {note}")
    prepared = report.get("prepared")
    if prepared:
        lines += [
            "",
            f"Environment: {prepared['wheels']} wheels ({prepared['bundle_mib']} MiB) from {prepared['bundle']}, "
            f"installed offline in {prepared['seconds']} s; torch {prepared['torch']}",
        ]
    if report["figures"]:
        lines += ["", "Figures:"]
        for record in report["figures"]:
            lines.append(f"  [{record['step']}] {record['what']}: {_format_value(record['value'])} {record['unit']}")
    if report["not_measured"]:
        lines += ["", "Not measured:"]
        for entry in report["not_measured"]:
            lines.append(f"  [{entry['step']}] {entry['reason']}:")
            lines += [f"      - {figure}" for figure in entry["figures"]]
    if report["plots"]:
        lines += ["", "Plots: " + ", ".join(report["plots"])]
    lines += [
        "",
        f"Report: {report['folder']}/report.json ({report['duration_s']:.0f} s, exit code {report['exit_code']})",
    ]
    return "\n".join(lines)


def run_all(options: argparse.Namespace) -> int:
    out = Path(options.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    options.out = str(out)
    _become_subreaper()
    started_at = dt.datetime.now(dt.UTC)
    started = time.monotonic()
    deadline = started + options.deadline
    selected = [name for name in STEP_NAMES if (not options.only or name in options.only) and name not in options.skip]
    selected = ["environment", *[name for name in selected if name != "environment"]]
    machine: dict[str, Any] = {"cpu_count": os.cpu_count(), "python": platform.python_version()}
    gpu_count: int | None = None  # known once the environment step has run
    records: list[dict[str, Any]] = []
    for name in selected:
        step = STEPS[STEP_NAMES.index(name)]
        left = deadline - time.monotonic()
        record: dict[str, Any] = {"name": name, "title": step.title}
        if step.min_gpus > (gpu_count or 0):
            if gpu_count is None:
                reason = "not measured: the number of GPUs is unknown (the environment step did not succeed)"
            else:
                reason = f"not measured: only {gpu_count} GPU(s)" + (" (--cpu)" if options.cpu else "")
            record.update(status=NOT_MEASURED, reason=reason, wall_s=None)
            record["not_measured"] = [{"step": name, "figures": list(step.figures_without_gpus), "reason": reason}]
        elif left < MIN_START_S:
            record.update(
                status=SKIPPED,
                wall_s=None,
                reason=f"deadline: {max(left, 0):.0f} s of the {options.deadline:.0f} s left when it was due",
            )
        else:
            print(f"[{time.monotonic() - started:6.1f} s] {name}: {step.title} ...", flush=True)
            record.update(run_step_process(options, step, gpu_count or 0, timeout=left))
        records.append(record)
        print(f"[{time.monotonic() - started:6.1f} s] {name}: {record['status']}", flush=True)
        if name == "environment" and record["status"] == OK:
            machine = record["details"]
            gpu_count = int(machine.get("gpu_count", 0))
    figures = [figure for record in records for figure in record.get("figures", [])]
    not_measured = [entry for record in records for entry in record.get("not_measured", [])]
    plots = [plot for record in records for plot in record.get("plots", [])]
    exit_code = _exit_code(records)
    if hasattr(os, "getloadavg"):
        machine["load_average_at_end"] = [round(load, 2) for load in os.getloadavg()]
    report = {
        "what": "gpu check: GPU tests, lessons, autograding and benchmarks of the course on this machine",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "cpu": options.cpu,
        "quick": options.quick,
        "deadline_s": options.deadline,
        "selected_steps": selected,
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - started, 1),
        "machine": machine,
        "measured_on": machine.get("hardware"),
        "steps": records,
        "figures": figures,
        "not_measured": not_measured,
        "plots": plots,
        "exit_code": exit_code,
    }
    if options.prepared:
        report["prepared"] = json.loads(Path(options.prepared).read_text())
    (out / "report.json").write_text(json.dumps(_jsonable(report), indent=1) + "\n")
    text = summary({**report, "folder": str(out)})
    (out / "summary.txt").write_text(text + "\n")
    archive = shutil.make_archive(str(out), "gztar", root_dir=out.parent, base_dir=out.name)
    print("\n" + text + f"\nArchive: {archive} (everything above, to send back)", flush=True)
    return exit_code


def prepare_environment(bundle: Path, venv: Path) -> dict[str, Any]:
    """A virtual environment that reuses this Python's packages (torch above all) and holds exactly the bundle's
    wheels, installed offline; returns what was done. The bundle is downloaded first if it does not exist.

    ``--system-site-packages`` shares the *base* interpreter's packages; when this Python is itself a virtual
    environment (CI's stand-in for the image), a ``.pth`` file adds its site folders too. pip runs from this
    Python (``pip --python``, pip 22.3 or later), so the environment needs no pip of its own (no ``ensurepip``).
    """
    import site

    started = time.perf_counter()
    downloaded = False
    if not any(bundle.glob("*.whl")):
        sys.path.insert(0, str(REPO / "scripts"))
        import gpu_bundle

        gpu_bundle.download(bundle, f"{sys.version_info.major}.{sys.version_info.minor}")
        downloaded = True
    wheels = sorted(bundle.glob("*.whl"))
    subprocess.run(
        [sys.executable, "-m", "venv", "--clear", "--without-pip", "--system-site-packages", str(venv)], check=True
    )
    python = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        found = subprocess.run(
            [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True
        )
        target = Path(found.stdout.decode().strip())
        # addsitedir, not a plain path: the .pth files of those folders must be processed too.
        lines = [f"import site; site.addsitedir({folder!r})" for folder in site.getsitepackages()]
        (target / "gpu_check_base.pth").write_text("\n".join(lines) + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-deps"]
    install += ["--quiet", "--no-compile", "--disable-pip-version-check", *map(str, wheels)]
    subprocess.run(install, check=True)
    torch = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__, torch.__file__)"], capture_output=True, text=True
    )
    return {
        "bundle": str(bundle),
        "downloaded": downloaded,
        "wheels": len(wheels),
        "bundle_mib": round(sum(wheel.stat().st_size for wheel in wheels) / MIB, 1),
        "venv": str(venv),
        "torch": torch.stdout.strip() or torch.stderr.strip()[-300:],
        "seconds": round(time.perf_counter() - started, 1),
    }


def run_in_prepared_environment(options: argparse.Namespace, argv: list[str]) -> int:
    """Prepare the environment from the bundle, then run this check again with its Python."""
    prepared = prepare_environment(Path(options.bundle).resolve(), Path(options.venv).resolve())
    print(
        f"environment: {prepared['wheels']} wheels ({prepared['bundle_mib']} MiB) installed offline into "
        f"{prepared['venv']} in {prepared['seconds']} s; torch {prepared['torch']}",
        flush=True,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as record:
        json.dump(prepared, record)
    rest = [argument for argument in argv if not argument.startswith(("--bundle", "--venv"))]
    for flag in ("--bundle", "--venv"):  # their values, when given as a separate argument
        if flag in argv:
            rest.remove(argv[argv.index(flag) + 1])
    command = [str(Path(options.venv).resolve() / "bin" / "python"), str(Path(__file__).resolve()), *rest]
    try:
        return subprocess.run([*command, "--prepared", record.name]).returncode
    finally:
        os.unlink(record.name)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    options = _parse(argv)
    if options.bundle and not options.run_step:
        return run_in_prepared_environment(options, argv)
    if options.run_step:
        if options.cpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported
        return run_step_here(options.run_step, options)
    return run_all(options)


if __name__ == "__main__":
    sys.exit(main())
