"""Every solved lesson runs top to bottom on this machine within the course's time budget (COURSE.md §8):
at most 60 s in all and 10 s per cell on the 2-core CI machine with no GPU, with no error and nothing on stderr.

Every text of every figure gpulab draws lies inside its figure (``RECORD_FIGURE_OVERFLOWS``), and after Run All
every cell runs again without error, as a learner going back to a demo runs it: in the same kernel, in reverse
order, so that no cell may depend on a name, a file or a state that a later cell destroys (a name deleted or bound
to something else, a checkpoint broken on purpose, a folder made once, a graph freed by backward). Only a cell
tagged ``raises-exception`` may fail: the course planned it.

The Japanese edition speaks Japanese all the way: no output of a solved Japanese lesson holds an English sentence
(gpulab's: a trace's summary, a replica's shapes, the prediction's caveat, ...; the lesson's own prints; its
visible tests' messages), and no figure, gpulab's or the lesson's own, draws one (titles, stage and series labels).
What counts is defined in ``tests/english_text.py``: code, numbers, units, identifiers, PyTorch's names and a
listing of the lesson's own code are not sentences. (The blank Japanese release, unanswered and answered wrongly:
``tests/test_japanese_edition.py``.)

Every blank release (what a learner opens) runs to its last cell too, as JupyterLab's Run All does: only answer,
self-check and graded cells may fail, each tagged ``raises-exception`` so that execution goes on past it; no demo
depends on a learner's answer. Lessons in ``tests/learner_pass.py: NOT_YET_EDITED`` are expected to fail this.

Wall-clock budgets are at the mercy of whatever else the machine runs, so a lesson that misses its budget is run
once more and judged on its better run; an error or a line on stderr fails it at once.

The same run records every ``gpulab.DataParallel`` call the lesson makes (which devices it follows, and the
lesson's choice at that moment) and then checks, for machines with 2, 3, 4 and 8 GPUs simulated by
``gpulab.devices.choose``, which class each call would build there: the lesson's mode never changes behind the
learner's back (issue: lesson 01's 4-device demo used to turn the rest of the lesson virtual on 2-3 GPUs)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import time

import nbformat
import pytest
from gpulab.devices import choose
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.english_text import english_printed, english_sentences
from tests.learner_pass import LESSONS, cell_kind, lesson_params
from tests.nbgrader_tools import EDITIONS, RELEASE_ROOT, build_source

TOTAL_BUDGET_S = 60
CELL_BUDGET_S = 10
ATTEMPTS = 2
SIMULATED_GPU_COUNTS = (2, 3, 4, 8)

# Runs in the kernel before the lesson: wraps gpulab.DataParallel's constructor to record, for each call, how many
# devices it follows, whether it was handed a gpulab.devices(...) list, and the lesson's choice at that moment.
RECORD_DATA_PARALLEL = """
import gpulab.data_parallel as _record_dp
from gpulab.devices import Devices as _RecordDevices, current_devices as _record_current_devices
_recorded_dp_calls = []
_recorded_dp_new = _record_dp.DataParallel.__new__
def _recording_dp_new(cls, module=None, device_ids=None, output_device=None, dim=0):
    if module is not None:
        followed = _record_dp.followed_devices(device_ids)
        _recorded_dp_calls.append({
            "follows": len(followed),
            "given_devices": isinstance(device_ids, _RecordDevices),
            "lesson_choice": len(_record_current_devices()),
        })
    return _recorded_dp_new(cls, module, device_ids, output_device, dim)
_record_dp.DataParallel.__new__ = staticmethod(_recording_dp_new)
"""
# Runs in the kernel before the lesson too: after every figure is saved at its own size (gpulab's pictures and live
# plots, ``gpulab.plots.figure_png``; not IPython's inline pictures, which are cropped to what is drawn), records each
# text (titles, labels, ticks, legends, notes) that reaches outside the figure: a learner would see it cut off. Every
# text any figure draws (inline pictures too) is kept, for the Japanese edition's check (``english_problems``).
RECORD_FIGURE_OVERFLOWS = """
import matplotlib as _bounds_mpl
import matplotlib.figure as _bounds_figure
import matplotlib.text as _bounds_text
_recorded_overflows = []
_recorded_figure_texts = set()
_bounds_drawn = []
_bounds_text_draw = _bounds_text.Text.draw
def _bounds_recording_draw(self, renderer):
    _bounds_text_draw(self, renderer)
    if self.get_visible() and self.get_text().strip():  # drawn: ticks outside the view are never drawn
        _bounds_drawn.append((self, self.get_window_extent(renderer)))
        _recorded_figure_texts.add(self.get_text())  # every figure's, inline pictures' too
_bounds_text.Text.draw = _bounds_recording_draw
_bounds_savefig = _bounds_figure.Figure.savefig
def _bounds_checking_savefig(self, *args, **kwargs):
    _bounds_drawn.clear()
    saved = _bounds_savefig(self, *args, **kwargs)
    if kwargs.get("bbox_inches", _bounds_mpl.rcParams["savefig.bbox"]) != "tight":
        width, height = self.bbox.width, self.bbox.height
        title = next((t.get_text() for t in self.texts if t.get_text()), "") or next(
            (a.get_title() for a in self.axes if a.get_title()), "")
        for text, box in _bounds_drawn:
            outside = max(-box.x0, -box.y0, box.x1 - width, box.y1 - height)
            if outside > 1:
                _recorded_overflows.append(
                    {"text": text.get_text()[:80], "figure": title[:80], "outside_px": round(outside)}
                )
    _bounds_drawn.clear()
    return saved
_bounds_figure.Figure.savefig = _bounds_checking_savefig
"""
REPORT_DATA_PARALLEL = (
    "import json as _record_json; print(_record_json.dumps({'calls': _recorded_dp_calls, "
    "'overflows': _recorded_overflows, 'figure_texts': sorted(set(_recorded_figure_texts))}))"
)


def run_lesson(
    notebook_path, edition: str = "en", run_again: bool = False
) -> tuple[float, dict[int, float], list[str], list[dict]]:
    """Execute a notebook in its folder; return total seconds, seconds per code cell, problems found (errors,
    stderr, texts outside their figure: ``RECORD_FIGURE_OVERFLOWS``; in the Japanese edition, English:
    ``english_problems``; with ``run_again``, the cells that fail when run again after Run All:
    ``run_again_in_reverse``), and the ``gpulab.DataParallel`` calls it made (``RECORD_DATA_PARALLEL``)."""
    notebook = nbformat.read(notebook_path, as_version=4)
    lesson_cells = len(notebook.cells)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(RECORD_DATA_PARALLEL + RECORD_FIGURE_OVERFLOWS))
    notebook.cells.append(nbformat.v4.new_code_cell(REPORT_DATA_PARALLEL))
    client = NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(notebook_path.parent)}}
    )
    cell_times = {}
    started = time.perf_counter()
    with client.setup_kernel():
        client.execute_cell(notebook.cells[0], 0)
        for index, cell in enumerate(notebook.cells[1:-1], start=1):
            if cell.cell_type != "code":
                continue
            cell_started = time.perf_counter()
            client.execute_cell(cell, index)
            cell_times[index - 1] = time.perf_counter() - cell_started
        total = time.perf_counter() - started
        client.execute_cell(notebook.cells[-1], lesson_cells + 1)
        failed_again = run_again_in_reverse(client, range(1, lesson_cells + 1)) if run_again else []
    report = notebook.cells.pop()
    del notebook.cells[0]
    problems = [
        f"cell {index}: {output.get('name', output.output_type)}: {output.get('text', output.get('evalue', ''))[:300]}"
        for index, cell in enumerate(notebook.cells)
        for output in cell.get("outputs", [])
        if output.output_type == "error" or output.get("name") == "stderr"
    ]
    recorded = json.loads(
        "".join(output.get("text", "") for output in report.outputs if output.get("name") == "stdout")
    )
    problems += [f"a text outside its figure: {overflow}" for overflow in recorded["overflows"]]
    problems += failed_again
    if edition == "ja":
        problems += english_problems(notebook, notebook_path.parent, recorded["figure_texts"])
    return total, cell_times, problems, recorded["calls"]


def run_again_in_reverse(client: NotebookClient, indices: range) -> list[str]:
    """What a learner going back after Run All meets: run the code cells at ``indices`` of the client's notebook (a
    lesson's cells, already run in order) again in the same kernel, last first; return each failure as ``run again:
    cell N: ...`` (N counted from the lesson's first cell). A cell tagged ``raises-exception`` raises no
    ``CellExecutionError`` (its error was planned). Each cell runs as a copy, and the notebook keeps the cell Run All
    ran (nbclient puts the cell it runs in its notebook), so that the other checks read Run All's outputs."""
    cells, failed = client.nb.cells, []
    for index in reversed(indices):
        if cells[index].cell_type != "code":
            continue
        ran = cells[index]
        try:
            client.execute_cell(copy.deepcopy(ran), index)
        except CellExecutionError as error:
            said = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()[-1]  # without its colours
            failed.append(f"run again: cell {index - indices[0]}: {said[:300]}")
        finally:
            cells[index] = ran
    return failed


def english_problems(notebook, folder, figure_texts: list[str]) -> list[str]:
    """In an executed Japanese lesson: each English sentence its outputs show (``english_printed``: gpulab's, the
    lesson's own prints, PyTorch's quoted words and listings of its code aside), and each text drawn on a figure that
    holds an English sentence (``tests/english_text.py``)."""
    problems = [f"English shown: {found}" for found in english_printed(notebook.cells, folder)]
    problems += [f"a figure draws English: {text!r}" for text in figure_texts if english_sentences(text)]
    return problems


def classes_built(call: dict, gpu_count: int) -> str:
    """The class that call builds on a machine with ``gpu_count`` GPUs: what ``gpulab.devices`` chooses there."""
    chosen = choose(call["follows"], gpu_count, gpu_names=["simulated GPU"] * gpu_count)
    return "gpulab virtual DataParallel" if chosen.virtual else "torch.nn.DataParallel"


@pytest.mark.alone  # the course's time budget, by the clock
@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("lesson", LESSONS)
def test_solved_lesson_runs_within_budget_and_again_after_run_all(lesson, edition, tmp_path):
    """Run All within the budget, then, in the same kernel, every cell again in reverse order: what a learner
    going back to a demo does. No cell may depend on running once."""
    notebook_path = build_source(lesson, tmp_path, edition)
    misses = []
    for attempt in range(ATTEMPTS):
        total, cell_times, problems, calls = run_lesson(notebook_path, edition, run_again=attempt == 0)
        assert not problems, "\n".join(problems)
        check_data_parallel_modes(lesson, calls)
        slowest = max(cell_times, key=cell_times.get)
        if cell_times[slowest] <= CELL_BUDGET_S and total <= TOTAL_BUDGET_S:
            return
        misses.append(f"{total:.1f} s in all, cell {slowest} took {cell_times[slowest]:.1f} s")
    pytest.fail(f"{lesson} missed its budget in {ATTEMPTS} runs: " + "; ".join(misses))


def check_data_parallel_modes(lesson: str, calls: list[dict]) -> None:
    """Every call follows the lesson's choice (2 devices) or a demo's own ``gpulab.devices(n)`` list, the lesson's
    choice never changes, and on 2, 3, 4 and 8 simulated GPUs each call builds the class its devices imply."""
    assert calls, f"{lesson} made no gpulab.DataParallel call"
    lesson_devices = calls[0]["lesson_choice"]
    assert lesson_devices == 2
    for number, call in enumerate(calls):
        assert call["lesson_choice"] == lesson_devices, f"{lesson}: call {number}: the lesson's choice changed: {call}"
        if not call["given_devices"]:
            assert call["follows"] == lesson_devices, f"{lesson}: call {number} does not follow the lesson: {call}"
        for gpus in SIMULATED_GPU_COUNTS:
            expected = "torch.nn.DataParallel" if gpus >= call["follows"] else "gpulab virtual DataParallel"
            assert classes_built(call, gpus) == expected, f"{lesson}: call {number} on {gpus} GPUs"
    on_two_gpus = [classes_built(call, 2) for call in calls]
    demos = [call for call in calls if call["follows"] > 2]
    # On two GPUs everything but a demo that asks for more devices than exist is PyTorch's own class.
    assert on_two_gpus.count("torch.nn.DataParallel") == len(calls) - len(demos), on_two_gpus
    if lesson == "01_splitting":
        assert demos and all(call["follows"] == 4 for call in demos), "lesson 01's 4-device demo was not seen"


@pytest.mark.parametrize("lesson", lesson_params())
def test_blank_release_runs_to_the_end_and_only_exercise_cells_fail(lesson, tmp_path):
    shutil.copytree(RELEASE_ROOT / lesson, tmp_path / lesson)
    notebook_path = tmp_path / lesson / f"{lesson}.ipynb"
    notebook = nbformat.read(notebook_path, as_version=4)
    # allow_errors=False, as in JupyterLab: only a cell tagged raises-exception may fail without stopping the run
    client = NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(notebook_path.parent)}}
    )
    client.execute()
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells[-1].get("execution_count"), f"{lesson}: the last cell never ran"
    failed = [
        (index, cell)
        for index, cell in enumerate(notebook.cells)
        if any(output.output_type == "error" for output in cell.get("outputs", []))
    ]
    demos = [
        f"cell {index} ({cell_kind(cell)}): {next(o for o in cell.outputs if o.output_type == 'error').ename}"
        for index, cell in failed
        if cell_kind(cell) == "demo"
    ]
    assert not demos, f"{lesson}: cells that are not exercises failed in the blank release: {demos}"
    assert failed, f"{lesson}: nothing failed in the blank release: are the exercises really blank?"
