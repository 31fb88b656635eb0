"""The GPU check: one command that proves every GPU path of the course and records the numbers it quotes.

Usage::

    make gpu-bundle                                  # here, with internet: the wheels, into gpu-bundle/
    python3 scripts/gpu_check.py "$OUT/gpu-check" --bundle gpu-bundle     # there: the default profile, <= 480 s
    make gpu-check                                   # the same; OUT defaults to benchmarks/results/gpu-check-<date>
    python scripts/gpu_check.py OUT [--profile one-gpu|full|quick] [--quick] [--bundle DIR [--venv DIR]] [--cpu]
                                    [--deadline SECONDS] [--budget STEP=SECONDS] [--jobs N] [--only STEPS]
                                    [--skip STEPS]

``OUT`` is a folder; it receives ``report.json``, ``summary.txt``, the PNG plots, and ``logs/`` (each step's output,
the tests' JUnit XML); ``OUT.tar.gz`` next to it holds all of it, the one file to send back. All of them are
written again after every step, so a run stopped at any point (a step that hangs, the machine's time limit, a crash
of the check itself) leaves every result so far in the archive; ``report.json``'s ``complete`` says whether the run
ended. The summary is also printed at the end.

Profiles (``scripts/gpucheck/profiles.py``): which steps run, in which order, and how many seconds each may take.
The default, ``one-gpu``, is sized for one command on one GPU of a 16-core machine: its steps' budgets plus the
preparation's add up to its 480 s deadline, and they are ordered by what one GPU proves (the real-GPU memory
tracker, lesson 03's memory block within a capacity on the real GPU, virtual DataParallel and DDP on ``cuda:0``,
the lessons on ``cuda:0``, then the rest). ``full`` runs every step at full size (the gpu test modules whole, every
lesson graded; 25 minutes) for 2+ GPUs or a longer loan; ``quick`` (``--quick``) is CI's dry run. Each step runs in
its own process within its budget (and what is left before the deadline): one that fails, raises or runs past its
budget is recorded (a step stopped at its time keeps what it had measured) and the next step runs.

Where it runs: on a bare GPU server image (Python 3.12 and a CUDA torch, pytest, matplotlib, nvidia-ml-py, tqdm,
psutil, numpy; no Jupyter, no nbgrader, no internet), ``--bundle gpu-bundle`` makes a virtual environment
(``--venv``, default ``.build/gpu-check-venv``) that reuses the image's torch (``--system-site-packages``), installs
the bundle's wheels (``scripts/gpu_bundle.py``) offline into it, and runs the check again inside it;
``report.json``'s ``prepared`` says what was installed and which torch was used. The deadline counts the
preparation's seconds. Each part of that preparation is independent: a wheel that will not install is named in
``prepared["failures"]`` and the others are installed one by one; without an environment the check runs with the
Python that started it. Either way every step still runs and leaves its result in the archive. Without
``--bundle`` the check runs with the Python that started it, and the steps that need the notebook stack (lessons,
autograding) are recorded as not measured, naming what is missing.

* ``--cpu`` forces the CPU even where a GPU exists (``CUDA_VISIBLE_DEVICES=""`` for every step, every kernel and
  every rank): the dry run CI does (``tests/test_gpu_check.py``), so the script cannot rot between GPU runs. Its
  figures are labelled as CPU figures.
* ``--deadline`` (default: the profile's; 480 s for ``one-gpu``): counted from the command's start, preparation
  included; steps that would start after it are skipped, with the reason recorded.
* ``--budget STEP=SECONDS``: a step's own time limit instead of the profile's (repeatable, or comma-separated).
* ``--jobs`` autograding workers (processes); default: a quarter of the CPU cores, at most 4.
* ``--only`` / ``--skip``: comma-separated step names (the environment step always runs).
* SIGTERM (``timeout`` around the command) ends the running step with everything it started, records the steps
  not run, writes the report and the archive, and exits 1.

The steps (each runs in its own process, so that a crash, a hang or a poisoned CUDA context costs only that step;
each records its status, wall time, budget, details, figures and what it could not measure):

* ``environment``: GPUs, driver, torch, CUDA, cuDNN, NCCL, CPU count, package versions (``gpulab.environment()``).
* ``gpu_tests``: the ``gpu`` / ``gpu2``-marked tests of every test module holding them (found in the modules'
  text), with JUnit XML: passed / failed / skipped counts; the gpu tests skipped for want of GPUs, and modules that
  cannot be imported here, are listed as not measured with the reason (never an aborted run). The full profile runs
  those modules whole (their CPU parts too, with a GPU visible).
* ``step_times``: the lesson models (``benchmarks/bench_virtual_dp.cases``) on one device vs ``gpulab.DataParallel``
  on 2 virtual devices vs DDP with 2 ranks sharing the device (gloo): step time and samples/s (``gpulab.bench``).
  On a multi-GPU machine this step (and the next three) sees only the first GPU, so it measures the one-GPU case.
* ``memory_accuracy``: ``gpulab.memory`` against ``torch.cuda.max_memory_allocated`` and NVML for a known
  allocation; the virtual-device tracker for known allocations; per-virtual-device peaks of a DataParallel step
  (outputs gathered on device 0 vs the loss computed in forward).
* ``memory_capacity``: lesson 03's memory block within a capacity (``gpulab.memory.track(capacity=)``): on two
  virtual devices as the lesson runs it (device 0 runs out with the loss outside forward, both fit with it inside);
  on the real GPU, on top of 512 MiB the process holds, within the segments the block reserves and 2 MiB (must
  fit) and half its peak (must raise ``torch.OutOfMemoryError``), and the smallest capacity that fits. Not run on a
  GPU.
* ``memory_overhead``: the tracker's cost at 20 samples/s (``interval=0.05``): the real-GPU sampler (target <= 2 %)
  and the virtual-device tracker (``benchmarks/bench_memory_overhead.measure``).
* ``ddp_launch``: ``gpulab.ddp.launch`` wall time with 2 ranks, call to results (``benchmarks/bench_ddp_launch``).
* ``process_memory``: what a lesson-like CUDA process and each DDP rank hold in memory after real work on the GPU
  (resident and peak resident memory, the memory cgroup's count, NVML's per-process GPU memory), so that the
  grader's memory limit on GPU machines is set from a measurement; not measured without a GPU. Not run on a GPU.
* ``real_scaling`` (>= 2 GPUs): real ``nn.DataParallel`` vs DDP over NCCL on 1, 2 and N GPUs: step time, samples/s.
* ``memory_imbalance`` (>= 2 GPUs): per-GPU peak memory: DataParallel gathering on GPU 0, loss in forward, DDP.
* ``link_traffic``: lesson 03's bytes per link and stage of a DataParallel step (``gpulab.traffic``); on 2+ GPUs
  also each stage's time (CUDA events) and bandwidth, a plain GPU 0 -> k copy's bandwidth, and the predicted
  speed-up (``gpulab.scaling``, measured compute and copy bandwidth) next to the measured one. Not run on a GPU yet.
* ``lessons``: every solved lesson (source notebook) run top to bottom with nbclient on this machine (the default
  profile: up to four at once, given 4 cores each): total and slowest-cell time, errors, anything on stderr, the
  device mode the lesson announced.
* ``autograde``: per lesson (the default and quick profiles: lesson 01), the reference, the blank release and the
  first wrong submission of its test module (``WRONG``), autograded; the reference must get full marks, the blank
  zero, the wrong one lose exactly its cells. Not measured without bubblewrap (no sandbox, no grading).

With fewer than two GPUs the multi-GPU steps are recorded as ``not_measured`` ("only N GPU(s)") and the report's
``not_measured`` list names every figure that could not be measured and why.

Exit code: 0 when every step that ran succeeded (``ok`` or ``not_measured``); 1 when a step failed or timed out,
a part of the ``--bundle`` preparation failed, or the check was stopped; 2 when none failed but the deadline
skipped some.

DDP rank functions live in ``benchmarks/gpu_check_ranks.py`` (ranks import them by name; ``__main__`` cannot be).
This file is the command; its parts live in ``scripts/gpucheck/``, one module per step or concern (see there).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/: the gpucheck package, also when loaded by path

from gpucheck import processes, report, steps  # noqa: E402, F401 - the parts, under the command's name
from gpucheck.autograde import step_autograde  # noqa: E402, F401 - the parts, under the command's name
from gpucheck.context import DEFAULT_DEADLINE_S, DEFAULT_VENV, STATUSES, StepContext  # noqa: E402, F401
from gpucheck.prepare import prepare_environment, run_in_prepared_environment  # noqa: E402, F401
from gpucheck.processes import run_step_here, run_step_process  # noqa: E402, F401
from gpucheck.profiles import DEFAULT_PROFILE, PROFILES  # noqa: E402, F401
from gpucheck.report import _exit_code, run_all, summary  # noqa: E402, F401
from gpucheck.steps import STEP_NAMES, STEPS, Step  # noqa: E402, F401


def _budgets(parser: argparse.ArgumentParser, texts: list[str]) -> dict[str, float]:
    budgets = {}
    for text in (part for item in texts for part in item.split(",") if part.strip()):
        name, _, seconds = text.partition("=")
        name = name.strip()
        try:
            budgets[name] = float(seconds)
        except ValueError:
            parser.error(f"--budget: {text!r} is not STEP=SECONDS")
        if name not in STEP_NAMES:
            parser.error(f"--budget: unknown step {name!r}; steps: {', '.join(STEP_NAMES)}")
    return budgets


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Prove every GPU path of the course and record its numbers (see the module docstring).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out", help="folder for report.json, the plots and logs/ (OUT.tar.gz is written next to it)")
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        help=f"which steps, in which order, with how many seconds each (default {DEFAULT_PROFILE}; see profiles.py)",
    )
    parser.add_argument("--cpu", action="store_true", help="force the CPU even where a GPU exists (CI's dry run)")
    parser.add_argument("--quick", action="store_true", help="the quick profile: the smallest work of every step (CI)")
    parser.add_argument(
        "--deadline", type=float, help="seconds for the whole run, preparation included (default: the profile's)"
    )
    parser.add_argument(
        "--budget", action="append", default=[], metavar="STEP=SECONDS", help="a step's own time limit (repeatable)"
    )
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
    parser.add_argument("--spent", type=float, default=0.0, help=argparse.SUPPRESS)  # the preparation's seconds
    parser.add_argument("--run-step", choices=STEP_NAMES, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    for flag in ("only", "skip"):
        names = [name.strip() for name in getattr(options, flag).split(",") if name.strip()]
        unknown = sorted(set(names) - set(STEP_NAMES))
        if unknown:
            parser.error(f"--{flag}: unknown step(s) {unknown}; steps: {', '.join(STEP_NAMES)}")
        setattr(options, flag, names)
    if options.quick and options.profile not in (None, "quick"):
        parser.error(f"--quick is the quick profile; it cannot go with --profile {options.profile}")
    options.profile = "quick" if options.quick else (options.profile or DEFAULT_PROFILE)
    options.quick = PROFILES[options.profile].small
    if options.deadline is None:
        options.deadline = PROFILES[options.profile].deadline_s
    options.budget = _budgets(parser, options.budget)
    if options.jobs < 1:
        parser.error("--jobs must be at least 1")
    return options


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # the deadline counts the preparation too
    argv = list(sys.argv[1:] if argv is None else argv)
    options = _parse(argv)
    options.started = started
    if options.bundle and not options.run_step:
        return run_in_prepared_environment(options, argv)
    if options.run_step:
        if options.cpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported
        return run_step_here(options.run_step, options)
    return run_all(options)


if __name__ == "__main__":
    sys.exit(main())
