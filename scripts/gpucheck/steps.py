"""Every step the check knows, and what each cannot measure with too few GPUs; which of them a run takes, in
which order and with how many seconds each, is its profile's (``profiles.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpucheck.autograde import step_autograde
from gpucheck.context import StepContext
from gpucheck.ddp_launch import step_ddp_launch
from gpucheck.environment import step_environment
from gpucheck.gpu_tests import step_gpu_tests
from gpucheck.lessons import step_lessons
from gpucheck.link_traffic import step_link_traffic
from gpucheck.memory_accuracy import step_memory_accuracy
from gpucheck.memory_capacity import step_memory_capacity
from gpucheck.memory_imbalance import step_memory_imbalance
from gpucheck.memory_overhead import step_memory_overhead
from gpucheck.process_memory import FIGURES as PROCESS_MEMORY_FIGURES
from gpucheck.process_memory import step_process_memory
from gpucheck.timing import step_real_scaling, step_step_times


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
    Step("gpu_tests", "the gpu-marked tests (profile full: their modules run whole)", step_gpu_tests),
    Step("step_times", "1 device vs virtual DataParallel vs DDP (2 ranks, one device)", step_step_times, one_gpu=True),
    Step("memory_accuracy", "gpulab.memory vs torch.cuda and NVML; virtual peaks", step_memory_accuracy, one_gpu=True),
    Step(
        "memory_capacity",
        "lesson 03's memory block within a capacity: virtual devices and the real GPU",
        step_memory_capacity,
        one_gpu=True,
    ),
    Step("memory_overhead", "memory tracker overhead at 20 samples/s", step_memory_overhead, one_gpu=True),
    Step("ddp_launch", "gpulab.ddp.launch time, 2 ranks", step_ddp_launch),
    Step(
        "process_memory",
        "memory a lesson-like CUDA process and each DDP rank hold (RSS, cgroup, NVML)",
        step_process_memory,
        figures_without_gpus=PROCESS_MEMORY_FIGURES,
    ),
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


def by_name(name: str) -> Step:
    return next(step for step in STEPS if step.name == name)


MIN_GPUS = {step.name: step.min_gpus for step in STEPS}
