"""What every step shares: the repository's paths, the statuses, the limits, and ``StepContext``, which collects
what a step reports in its own process (details, figures, what it could not measure, failures, warnings, plots)."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
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


def setup_paths() -> None:
    """The repository (``tests.*``), ``benchmarks/`` (bench modules, rank functions) and, when gpulab is not
    installed, ``utils/`` on ``sys.path``; spawned DDP ranks and autograding workers inherit it."""
    for path in (BENCHMARKS, REPO):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    if importlib.util.find_spec("gpulab") is None and str(UTILS) not in sys.path:
        sys.path.insert(0, str(UTILS))


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

    def requires(self, modules: tuple[str, ...], figures: list[str]) -> bool:
        """Whether ``modules`` can be imported here; if not, the step is recorded as not measured, naming them."""
        absent = [module for module in modules if importlib.util.find_spec(module) is None]
        if not absent:
            return True
        self.status = NOT_MEASURED
        self.reason = (
            f"not measured: {', '.join(absent)} not installed here (a bare GPU image has no notebook stack; "
            "`make gpu-check` installs it from the bundle: --bundle, scripts/gpu_bundle.py)"
        )
        self.missing(figures, self.reason)
        return False

    def save_plot(self, figure: Any, file_name: str) -> None:
        path = self.out / file_name
        figure.savefig(path, dpi=100)
        self.plots.append(file_name)


def short(case_name: str) -> str:
    """``"WideHead 64-128-50000, batch 512 (lesson 03)"`` -> ``"WideHead 64-128-50000, batch 512"``."""
    return case_name.split(" (")[0]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower().split(",")[0]).strip("_")[:40]


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def optional(read: Callable[[], Any]) -> Any:
    """A detail of the machine, or None when it cannot be read (the step must not fail for a detail)."""
    try:
        return read()
    except Exception:  # noqa: BLE001
        return None


def jsonable(value: Any) -> Any:
    """Plain JSON: non-finite floats become None, sets sorted lists, tuples lists, other objects their str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, set):
        return sorted(jsonable(item) for item in value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict())
    return str(value)
