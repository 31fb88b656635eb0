"""gpulab: the helper package of the multi-GPU training course.

Lessons import it in their set-up cell::

    import gpulab
    devices = gpulab.devices(2)   # real GPUs, or virtual devices, and why

One module per concept (COURSE.md §3): ``devices``, ``virtual``, ``data_parallel``, ``ddp``, ``memory``,
``plots``, ``diagrams``, ``bench``, ``traffic`` (with ``transfers``, the record, and ``cuda_traffic``, PyTorch's
copies counted on real GPUs), ``scaling``, ``gil``, ``nvml``, ``models``, ``data``, ``check`` (with
``exercises``), ``quiz`` (the lessons' quizzes), ``grading``, and ``messages`` (what gpulab says, in the lesson's
language: ``gpulab.language("ja")``; ``gpulab.text(english)``: a lesson's own label in that language).
Submodules load on first use so that the set-up cell stays fast.
"""

from __future__ import annotations

import importlib

from gpulab import messages
from gpulab.data_parallel import DataParallel
from gpulab.devices import current_devices, devices, environment
from gpulab.messages import language

__version__ = "0.1.0"

_SUBMODULES = {
    "virtual",
    "ddp",
    "memory",
    "plots",
    "bench",
    "models",
    "data",
    "check",
    "grading",
    "diagrams",
    "exercises",
    "traffic",
    "transfers",
    "cuda_traffic",
    "scaling",
    "nvml",
    "quiz",
    "gil",
}

__all__ = ["DataParallel", "current_devices", "devices", "environment", "language", "text", *sorted(_SUBMODULES)]


def text(english: str) -> str:
    """A label a lesson's cell draws itself (a matplotlib title, an axis label) in the lesson's language, with
    matplotlib set to a font that has its glyphs: ``axes.set_title(gpulab.text("A plain average"))`` (every lesson).
    Texts gpulab has no translation of come back as they are."""
    messages.use_font()
    return messages.text(english)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"gpulab.{name}")
    raise AttributeError(f"module 'gpulab' has no attribute {name!r}")
