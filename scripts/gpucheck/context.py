"""What every step shares: the repository's paths, the statuses, the limits, and ``StepContext``, which collects
what a step reports in its own process (details, figures, what it could not measure, failures, warnings, plots)."""

from __future__ import annotations

import importlib.util
import json
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

DEFAULT_DEADLINE_S = 480.0  # the default profile's (profiles.py): 8 minutes from the start, preparation included
DEFAULT_VENV = REPO / ".build" / "gpu-check-venv"
MIN_START_S = 10.0  # a step is not started with less than this left before the deadline
KILL_GRACE_S = 5.0
LEFTOVER_GRACE_S = 3.0  # for a step's helpers that end with their parent, before they are ended
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
    profile: str = ""  # a name in profiles.PROFILES; empty: "quick" when quick, else "full"
    details: dict[str, Any] = field(default_factory=dict)
    figures: list[dict[str, Any]] = field(default_factory=list)
    not_measured: list[dict[str, Any]] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    status: str | None = None  # a step may declare itself not_measured
    reason: str | None = None
    result_path: Path | None = None  # where the step's process writes its result, also as it goes
    _hardware: str | None = None

    def result(self, error: str | None = None, status: str | None = None) -> dict[str, Any]:
        """What the step reports: its status, details, figures, what it could not measure, plots."""
        return {
            "status": status or ("failed" if error or self.failures else (self.status or "ok")),
            "reason": self.reason,
            "error": error or ("; ".join(self.failures) if self.failures else None),
            "failures": self.failures,
            "warnings": self.warnings,
            "details": self.details,
            "figures": self.figures,
            "not_measured": self.not_measured,
            "plots": self.plots,
        }

    def write_result(self, error: str | None = None, status: str | None = None) -> None:
        """Write the result to ``result_path`` whole or not at all (a step stopped at its time keeps what it wrote
        last). Called after every figure, failure, warning, missing figure and plot, and at the end."""
        if self.result_path is None:
            return
        partial = self.result_path.with_name(self.result_path.name + ".partial")
        partial.write_text(json.dumps(jsonable(self.result(error, status)), indent=1))
        os.replace(partial, self.result_path)

    def _so_far(self) -> None:
        self.write_result(status="partial")

    @property
    def settings(self) -> Any:
        """The run's ``profiles.Profile``: how much work each step does."""
        from gpucheck.profiles import PROFILES

        return PROFILES[self.profile or ("quick" if self.quick else "full")]

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
        self._so_far()

    def missing(self, figures: list[str] | str, reason: str) -> None:
        """Record figures this step could not measure here, and why."""
        figures = [figures] if isinstance(figures, str) else list(figures)
        self.not_measured.append({"step": self.name, "figures": figures, "reason": reason})
        self._so_far()

    def fail(self, message: str) -> None:
        """Record a failed check; the step goes on, and ends as failed."""
        print(f"FAILED: {message}", flush=True)
        self.failures.append(message)
        self._so_far()

    def warn(self, message: str) -> None:
        """Record a missed target or a doubt; does not fail the step."""
        print(f"warning: {message}", flush=True)
        self.warnings.append(message)
        self._so_far()

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
        self._so_far()


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
