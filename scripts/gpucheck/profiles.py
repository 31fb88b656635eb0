"""The profiles: which steps a run takes, in which order, how many seconds each may take (its own timeout), and
how much work each step does.

* ``one-gpu`` (the default, ``make gpu-check``): one command on one GPU of a 16-core machine, within 8 minutes
  from the start, preparation included (``DEADLINE_S``). Its steps are ordered by what one GPU proves that no CPU
  run can: the real-GPU memory tracker, the capacity of lesson 03's memory block on the real GPU, virtual
  DataParallel and DDP on ``cuda:0``, the lessons on ``cuda:0``; then the gpu-marked tests, what a CUDA process
  holds, the tracker's cost, the DDP launch, the traffic count and grading. Each step has a budget: it is stopped
  when its budget is spent and recorded as timed out, and the next step runs. The budgets of the steps that run
  on one GPU, plus ``PREPARATION_BUDGET_S`` for ``--bundle``'s environment, add up to at most the deadline
  (``tests/test_gpu_check.py`` checks it). The steps that need 2+ GPUs are recorded as not measured on one GPU;
  on a machine with more, their budgets do not fit the deadline: run ``--profile full`` there.
* ``full``: every step at its full size, the test modules holding gpu tests run whole (their CPU parts too, with a
  GPU visible), lessons one after the other (their times undisturbed), every lesson graded; deadline 25 minutes.
  For 2+ GPUs or a longer loan.
* ``quick``: the smallest work of every step (lesson 01 only, two benchmark cases, fewer repeats): CI's dry run
  (``--quick`` is its short name).

``ESTIMATES`` gives, per step of the default profile, the wall time measured in its CPU dry run and the time
estimated for the GPU machine, with the basis of each estimate. The GPU figures are estimates: none was measured
on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PROFILE = "one-gpu"
PREPARATION_BUDGET_S = 60.0  # --bundle: a virtual environment and ~40 MiB of wheels installed offline


@dataclass(frozen=True)
class Profile:
    name: str
    about: str
    deadline_s: float
    steps: tuple[tuple[str, float], ...]  # (step name, budget in seconds), in the order they run
    small: bool = False  # the steps' smallest work (CI's --quick): lesson 01 only, two cases, fewer repeats
    gpu_tests_whole: bool = False  # run the modules holding gpu tests whole, not only their gpu-marked tests
    all_lessons: bool = True  # run (and grade) every lesson, not only the first
    lesson_jobs: int = 1  # lessons run at once (their kernels are separate processes)
    grade_all: bool = True  # autograde every lesson, not only the first
    overhead_rounds: int = 8
    launch_repeats: int = 4

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.steps]

    def budget(self, name: str) -> float:
        return dict(self.steps)[name]


ONE_GPU = Profile(
    "one-gpu",
    "one GPU, 16 CPU cores, 8 minutes with the preparation (the default)",
    deadline_s=480.0,
    steps=(
        ("environment", 15.0),
        ("memory_accuracy", 30.0),
        ("memory_capacity", 25.0),
        ("step_times", 60.0),
        ("lessons", 85.0),
        ("gpu_tests", 40.0),
        ("process_memory", 40.0),
        ("memory_overhead", 40.0),
        ("ddp_launch", 35.0),
        ("link_traffic", 20.0),
        ("autograde", 30.0),
        ("real_scaling", 90.0),  # needs 2+ GPUs: not measured on one, in no time
        ("memory_imbalance", 60.0),  # needs 2+ GPUs
    ),
    all_lessons=True,
    lesson_jobs=4,
    grade_all=False,
    overhead_rounds=5,
    launch_repeats=3,
)

FULL = Profile(
    "full",
    "every step at full size, the gpu test modules whole; for 2+ GPUs or a longer loan",
    deadline_s=1500.0,
    steps=(
        ("environment", 60.0),
        ("gpu_tests", 300.0),
        ("step_times", 180.0),
        ("memory_accuracy", 60.0),
        ("memory_capacity", 60.0),
        ("memory_overhead", 120.0),
        ("ddp_launch", 60.0),
        ("process_memory", 90.0),
        ("real_scaling", 240.0),
        ("memory_imbalance", 120.0),
        ("link_traffic", 60.0),
        ("lessons", 300.0),
        ("autograde", 400.0),
    ),
    gpu_tests_whole=True,
)

QUICK = Profile(
    "quick",
    "the smallest work of every step: CI's dry run",
    deadline_s=480.0,
    steps=(
        ("environment", 60.0),
        ("gpu_tests", 90.0),
        ("step_times", 90.0),
        ("memory_accuracy", 60.0),
        ("memory_capacity", 60.0),
        ("memory_overhead", 90.0),
        ("ddp_launch", 60.0),
        ("process_memory", 60.0),
        ("real_scaling", 60.0),
        ("memory_imbalance", 60.0),
        ("link_traffic", 60.0),
        ("lessons", 120.0),
        ("autograde", 240.0),
    ),
    small=True,
    all_lessons=False,
    grade_all=False,
    overhead_rounds=3,
    launch_repeats=2,
)

PROFILES = {profile.name: profile for profile in (ONE_GPU, FULL, QUICK)}


def one_gpu_budget_s(profile: Profile, min_gpus: dict[str, int]) -> float:
    """The seconds a profile's steps may take on one GPU (the steps needing more are recorded in no time), plus
    the preparation's: what must fit the deadline."""
    return PREPARATION_BUDGET_S + sum(budget for name, budget in profile.steps if min_gpus.get(name, 0) <= 1)


# The default profile's steps on one GPU: (seconds its CPU dry run took here, seconds estimated on the GPU
# machine, the basis of the estimate). The CPU dry run: ``--cpu``, the default profile's sizes, budgets lifted,
# started by an image-like Python with ``--bundle`` (so with the preparation and the notebook stack), on the 2-core
# CI machine while other work ran (load average 7.3 at the start, 8.4 at the end): 556 s in all. The GPU figures
# are estimates, not run on a GPU: the CPU time of what does not move to the GPU (process starts, imports, DDP
# launches, Python-bound steps; an upper bound, measured on 2 loaded cores), plus CUDA_START_S for each process
# that starts CUDA (processes started together counted once), plus the GPU-only work the step's code does; the
# compute of the models, which moves to the GPU, is left out where the step's report measured it.
CUDA_START_S = 5.0  # an allowance for a process's CUDA start (context, cuBLAS): not measured, no GPU here
PREPARATION_ESTIMATE = (23.6, 25.0, "the same pip install of ~40 MiB of wheels, on one core of the GPU machine")
ESTIMATES = {
    "environment": (5.0, 10.0, "CPU run (import torch, gpulab.environment) + 1 CUDA start"),
    "memory_accuracy": (17.1, 22.0, "CPU run (the wide head's traces, an upper bound) + 1 CUDA start"),
    "memory_capacity": (11.0, 17.0, "CPU run + 1 CUDA start + eight 2-step runs of the block on the GPU (~1 s)"),
    "step_times": (
        64.5,
        47.0,
        "CPU run less its measured compute (39.9 s) + CUDA starts: the step and 3 launches' ranks + ~2 s of steps",
    ),
    "lessons": (144.0, 65.0, "4 at once: the slowest lesson here (03, 59.6 s) + 1 CUDA start in its kernel"),
    "gpu_tests": (
        10.1,
        32.0,
        "CPU run (9 skipped) + 1 CUDA start + a DDP test: a first launch (12 s here) + its ranks'",
    ),
    "process_memory": (
        3.4,
        31.0,
        "CPU run (measures nothing) + a lesson-like process (5 s imports + CUDA) + a first DDP launch (12 s here) "
        "+ its ranks' CUDA start",
    ),
    "memory_overhead": (
        108.8,
        27.0,
        "from the code: 2 x 5 x 2 real-GPU blocks of 0.5 s + virtual blocks of the MLP (Python-bound: ~5 s at the "
        "CPU run's medians) + imports and 1 CUDA start; the CPU run's 109 s are the wide head's compute",
    ),
    "ddp_launch": (24.1, 29.0, "CPU run (3 launches; 8 s at load 4.5, 24 s at load 8) + its ranks' CUDA start"),
    "link_traffic": (7.8, 13.0, "CPU run + 1 CUDA start"),
    "autograde": (
        136.3,
        5.0,
        "the image as described lists no bubblewrap: not measured, in the step's start; where it has one, ~70 s "
        "(the reference's build and grading here, 67 s): past the budget, the grades done are kept",
    ),
}
