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
runs again inside it; ``report.json``'s ``prepared`` says what was installed and which torch was used. Each part
of that preparation is independent: a wheel that will not install is named in ``prepared["failures"]`` and the
others are installed one by one; without an environment the check runs with the Python that started it. Either way
every step still runs and leaves its result in the archive. Without ``--bundle`` the check runs with the Python
that started it.

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
* ``process_memory``: what a lesson-like CUDA process and each DDP rank hold in memory after real work on the GPU
  (resident and peak resident memory, the memory cgroup's count, NVML's per-process GPU memory), so that the
  grader's memory limit on GPU machines is set from a measurement; not measured without a GPU. Not run on a GPU.
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

Exit code: 0 when every step that ran succeeded (``ok`` or ``not_measured``); 1 when a step failed or timed out,
or a part of the ``--bundle`` preparation failed; 2 when none failed but the deadline skipped some.

DDP rank functions live in ``benchmarks/gpu_check_ranks.py`` (ranks import them by name; ``__main__`` cannot be).
This file is the command; its parts live in ``scripts/gpucheck/``, one module per step or concern (see there).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/: the gpucheck package, also when loaded by path

from gpucheck import processes, report, steps  # noqa: E402, F401 - the parts, under the command's name
from gpucheck.autograde import step_autograde  # noqa: E402, F401 - the parts, under the command's name
from gpucheck.context import DEFAULT_DEADLINE_S, DEFAULT_VENV, STATUSES, StepContext  # noqa: E402, F401
from gpucheck.prepare import prepare_environment, run_in_prepared_environment  # noqa: E402, F401
from gpucheck.processes import run_step_here, run_step_process  # noqa: E402, F401
from gpucheck.report import _exit_code, run_all, summary  # noqa: E402, F401
from gpucheck.steps import STEP_NAMES, STEPS, Step  # noqa: E402, F401


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
