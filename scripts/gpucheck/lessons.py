"""The ``lessons`` step: every solved lesson run top to bottom with nbclient, timed cell by cell."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from typing import Any

from gpucheck.context import CELL_BUDGET_S, LESSON_BUDGET_S, SOURCE_ROOT, StepContext


def lesson_names(every: bool) -> list[str]:
    """The lessons (their source folders' names), or only the first."""
    found = sorted(path.name for path in SOURCE_ROOT.iterdir() if (path / f"{path.name}.py").is_file())
    return found if every else found[:1]


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
                stderr.append({"cell": index, "text": output.get("text", "")[:20000]})
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


# Lines on stderr that come from the machine's image, not from the lesson, and what they are. The deprecated
# ``pynvml`` package (where an image has it next to nvidia-ml-py, which provides the same module) warns when
# imported, and ``import torch`` imports it (torch/cuda/__init__.py: ``import pynvml``), so the first cell that
# imports torch shows the warning and its source line.
KNOWN_STDERR = (
    (
        re.compile(r"FutureWarning: The pynvml package is deprecated\.[^\n]*\n(?:[ \t]+import pynvml[^\n]*\n?)?"),
        "the deprecated pynvml package is installed in this image: importing torch warns (torch/cuda/__init__.py "
        "imports pynvml); uninstall pynvml (nvidia-ml-py provides the module)",
    ),
)


def split_stderr(text: str) -> tuple[str, list[str]]:
    """``text`` without the known image warnings (each from the start of its line), and what was removed."""
    known = []
    for pattern, meaning in KNOWN_STDERR:
        found = list(pattern.finditer(text))
        if found:
            known.append(meaning)
            for match in reversed(found):
                start = text.rfind("\n", 0, match.start()) + 1  # the warning's line starts with its file:line
                text = text[:start] + text[match.end() :]
    return text, known


def judge(ctx: StepContext, lesson: str, result: dict[str, Any]) -> None:
    """Fail on a cell's error or on stderr the lesson wrote; known image warnings are recorded as warnings."""
    if result["error"]:
        ctx.fail(f"{lesson}: cell {result['error']['cell']} raised: {result['error']['error'][-300:]}")
    unexplained, explained = [], set()
    for output in result["stderr"]:
        rest, known = split_stderr(output["text"])
        explained.update(known)
        if rest.strip():
            unexplained.append({"cell": output["cell"], "text": rest[:1000]})
    result["stderr"], result["stderr_from_the_image"] = unexplained, sorted(explained)
    for meaning in sorted(explained):
        ctx.warn(f"{lesson}: stderr not counted as a failure: {meaning}")
    if unexplained:
        ctx.fail(f"{lesson}: {len(unexplained)} output(s) on stderr, first: {unexplained[0]['text'][:200]!r}")
    if not result["mode"]:
        ctx.warn(f"{lesson}: no 'Real GPUs' / 'Virtual devices' line found in its output")


# What running a lesson needs beyond the bare GPU image (the notebook stack, which ``--bundle`` installs).
LESSON_MODULES = ("nbformat", "nbclient", "ipykernel", "jupytext", "polib")


def _run_lesson_here(lesson: str, cell_timeout: int) -> dict[str, Any]:
    """``_run_lesson`` in a worker process of the step's pool (the repository's folders on its path)."""
    from gpucheck.context import setup_paths

    setup_paths()
    return _run_lesson(lesson, cell_timeout)


def step_lessons(ctx: StepContext) -> None:
    """Every solved lesson (the quick profile: the first) run top to bottom on this machine; the default profile
    runs up to four at once where there are 4 cores for each (their kernels are separate processes), one at a
    time otherwise."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    lessons = lesson_names(ctx.settings.all_lessons)
    if not ctx.requires(LESSON_MODULES, [f"lesson {lesson}: run top to bottom" for lesson in lessons]):
        return
    at_once = max(1, min(ctx.settings.lesson_jobs, len(lessons), (os.cpu_count() or 1) // 4))
    ctx.details.update(lessons=[], at_once=at_once)
    print(f"running {', '.join(lessons)}, {at_once} at a time ...", flush=True)
    with ProcessPoolExecutor(max_workers=at_once, mp_context=get_context("spawn")) as pool:
        futures = {lesson: pool.submit(_run_lesson_here, lesson, 180) for lesson in lessons}
        for lesson, future in futures.items():
            try:
                result = future.result()
            except Exception as error:  # noqa: BLE001
                print(f"{lesson}: {type(error).__name__}: {error}", flush=True)
                ctx.fail(f"{lesson}: {type(error).__name__}: {error}")
                continue
            judge(ctx, lesson, result)
            ctx.details["lessons"].append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "stderr"}), flush=True)
            ctx.figure(f"lesson {lesson}: run top to bottom ({at_once} at a time)", result["total_s"], "s")
            slowest = result["slowest_cell"]
            ctx.figure(f"lesson {lesson}: slowest cell ({slowest['index']})", slowest["seconds"], "s")
