"""Every solved lesson runs top to bottom on this machine within the course's time budget (COURSE.md §8):
at most 60 s in all and 10 s per cell on the 2-core CI machine with no GPU, with no error and nothing on stderr."""

from __future__ import annotations

import time

import nbformat
import pytest
from nbclient import NotebookClient

from tests.nbgrader_tools import SOURCE_ROOT, build_source

LESSONS = sorted(path.name for path in SOURCE_ROOT.iterdir() if (path / f"{path.name}.py").is_file())
TOTAL_BUDGET_S = 60
CELL_BUDGET_S = 10


@pytest.mark.parametrize("lesson", LESSONS)
def test_solved_lesson_runs_within_budget(lesson, tmp_path):
    notebook_path = build_source(lesson, tmp_path)
    notebook = nbformat.read(notebook_path, as_version=4)
    client = NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(notebook_path.parent)}}
    )
    cell_times = {}
    started = time.perf_counter()
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            cell_started = time.perf_counter()
            client.execute_cell(cell, index)
            cell_times[index] = time.perf_counter() - cell_started
    total = time.perf_counter() - started

    problems = [
        f"cell {index}: {output.get('name', output.output_type)}: {output.get('text', output.get('evalue', ''))[:300]}"
        for index, cell in enumerate(notebook.cells)
        for output in cell.get("outputs", [])
        if output.output_type == "error" or output.get("name") == "stderr"
    ]
    assert not problems, "\n".join(problems)
    slowest = max(cell_times, key=cell_times.get)
    assert cell_times[slowest] <= CELL_BUDGET_S, f"cell {slowest} took {cell_times[slowest]:.1f} s"
    assert total <= TOTAL_BUDGET_S, f"{lesson} took {total:.1f} s"
