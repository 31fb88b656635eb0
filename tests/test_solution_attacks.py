"""Answers made of what gpulab still holds: no line of a solution written, points earned all the same.

A learner's kernel imports gpulab (a class's environment, the grading sandbox); ``gpulab_solutions`` is out of its
reach. gpulab still keeps what its exercises' hints and references are built from, and composed, those pieces are
the computation an exercise asks for, for any input the grader draws:

* ``data_parallel_grads``: ``gpulab.exercises.gradient_averaging._chunk_mean_gradients`` (each chunk's gradients on
  a replica, a hint's mistake model) weighted by ``_weighted`` with the chunks' shares of the batch;
* ``average_gradients``: ``_weighted`` with those shares;
* ``dp_traffic_bytes``: ``gpulab.traffic.data_parallel_step`` measuring a step of
  ``gpulab.exercises.gpu0_imbalance.traffic_model`` on virtual devices (``gpulab.virtual.playing`` the algorithm
  asked for), or ``gpulab.traffic.counted_step`` counting it on the meta device (no memory, no arithmetic): what
  the grader's second computation of its small hidden inputs is;
* ``ring_all_reduce_bytes``: ``gpulab.traffic.ring_bytes_sent``, the ring player the grader computes the expected
  values of its small rings with, on one chunk of all the elements.

The instruments are the lesson's and stay in gpulab; what they cannot do is finish on the inputs the grader also
draws, far too large to run or play within a check's time (a model of a trillion parameters, 10,000 to 50,000
devices, rings of 100,000 ranks and more), whose expected values the grader counts from the sizes: each of these
answers loses its cells there, while a closed-form answer passes them in milliseconds.

``tests/test_solution_boundary.py``'s probe calls each gpulab callable as a whole exercise's answer; an answer that
adapts a signature, or earns some of an exercise's graded cells, passes it by. Here the lessons' releases (their
import cell and nbgrader cells), with only these answers written, are graded by ``autograder/grade.py`` in its
sandbox (one run, both lessons), and each graded cell these answers earn is a cell earned without solving. (The
argument checks a contract asks for, one line each, are written by hand: they compute nothing.)
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import nbformat
import pytest

from autograder import sandbox
from tests.nbgrader_tools import RELEASE_ROOT, REPO
from tests.submissions import with_answers

GRADE = REPO / "autograder" / "grade.py"
STUDENT = "composer"

AVERAGE_GRADIENTS = """
from gpulab.exercises.gradient_averaging import _weighted


def average_gradients(grads_per_device, chunk_sizes):
    return _weighted(grads_per_device, [size / sum(chunk_sizes) for size in chunk_sizes])
"""

DATA_PARALLEL_GRADS = """
from gpulab.exercises.gradient_averaging import _chunk_mean_gradients, _weighted


def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    per_device, sizes = _chunk_mean_gradients(model, inputs, targets, loss_fn, n_devices)
    names = [name for name, _ in model.named_parameters()]
    return dict(zip(names, _weighted(per_device, [size / sum(sizes) for size in sizes])))
"""

DP_TRAFFIC_BYTES = """
import torch
from gpulab.exercises.gpu0_imbalance import traffic_model
from gpulab.traffic import data_parallel_step
from gpulab.virtual import playing


def dp_traffic_bytes(batch_size, n_devices, n_params, in_features, out_features, bytes_per_element=4, algorithm="copy"):
    if min(batch_size, n_devices, n_params, in_features, out_features, bytes_per_element) < 1:
        raise ValueError("counts must be positive")
    hidden = (n_params - out_features) // (in_features + out_features + 1)
    model = traffic_model(in_features, hidden, out_features)
    inputs, targets = torch.zeros(batch_size, in_features), torch.zeros(batch_size, out_features)
    with playing(algorithm):
        stages = data_parallel_step(model, inputs, targets, torch.nn.functional.mse_loss, n_devices).by_stage(0)
    keys = ("scatter", "broadcast", "gather", "grad_scatter", "reduce")
    return {key: int(stages.get(key, 0)) // 4 * bytes_per_element for key in keys}
"""

DP_TRAFFIC_BYTES_ON_META = """
import torch
from gpulab.exercises.gpu0_imbalance import traffic_model
from gpulab.traffic import counted_step


def dp_traffic_bytes(batch_size, n_devices, n_params, in_features, out_features, bytes_per_element=4, algorithm="copy"):
    if min(batch_size, n_devices, n_params, in_features, out_features, bytes_per_element) < 1:
        raise ValueError("counts must be positive")
    hidden = (n_params - out_features) // (in_features + out_features + 1)
    with torch.device("meta"):
        model = traffic_model(in_features, hidden, out_features)
        inputs, targets = torch.empty(batch_size, in_features), torch.empty(batch_size, out_features)
    counted = counted_step(model, inputs, targets, torch.nn.functional.mse_loss, n_devices, algorithm)
    stages = counted.by_stage(0)
    keys = ("scatter", "broadcast", "gather", "grad_scatter", "reduce")
    return {key: int(stages.get(key, 0)) // 4 * bytes_per_element for key in keys}
"""

RING_ALL_REDUCE_BYTES = """
from gpulab.traffic import ring_bytes_sent


def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    if world_size < 1 or n_elements < 0:
        raise ValueError("world_size >= 1 and n_elements >= 0")
    return ring_bytes_sent([n_elements] + [0] * (world_size - 1), bytes_per_element)
"""

ANSWERS = {
    "02_gradient_averaging": {
        "average_gradients_answer": AVERAGE_GRADIENTS,
        "data_parallel_grads_answer": DATA_PARALLEL_GRADS,
    },
    "03_gpu0_imbalance": {
        "dp_traffic_bytes_answer": DP_TRAFFIC_BYTES,
        "ring_all_reduce_bytes_answer": RING_ALL_REDUCE_BYTES,
    },
}
# A second student of the same class: lesson 03's traffic counted on the meta device instead.
ON_META = {"03_gpu0_imbalance": {"dp_traffic_bytes_answer": DP_TRAFFIC_BYTES_ON_META}}
META_STUDENT = "counter"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this machine"),
]


def _graded_cells_only(notebook):
    """The notebook's first import cell and its nbgrader cells: the demos in between cost time and earn nothing."""
    first = next(c for c in notebook.cells if c.cell_type == "code" and c.source.startswith("import gpulab"))
    notebook.cells = [c for c in notebook.cells if c is first or "nbgrader" in c.get("metadata", {})]
    return notebook


def _folder(submissions, student: str, lesson: str):
    folder = submissions / student / lesson
    folder.mkdir(parents=True)
    return folder / f"{lesson}.ipynb"


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[tuple[str, str], dict[str, float]]:
    """``{(student, lesson): {grade_id: score}}``: each lesson's release with only the composed answers written, one
    student per set of answers, graded by grade.py in one run."""
    root = tmp_path_factory.mktemp("composed")
    submissions, out = root / "submissions", root / "out"
    for student, answer_sets in ((STUDENT, ANSWERS), (META_STUDENT, ON_META)):
        for lesson, answers in answer_sets.items():
            path = with_answers(RELEASE_ROOT / lesson / f"{lesson}.ipynb", answers, root / f"{student}-{lesson}.ipynb")
            notebook = _graded_cells_only(nbformat.read(path, as_version=4))
            nbformat.write(notebook, _folder(submissions, student, lesson))
    command = [sys.executable, str(GRADE), str(submissions), "--out", str(out), "--no-progress", "--workers", "2"]
    process = subprocess.run(command, capture_output=True, text=True, timeout=840, cwd=REPO)
    assert process.returncode == 0, process.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    scores = {}
    for result in report["results"]:
        assert result.get("error") is None, result
        (notebook,) = result["notebooks"].values()
        task = result["task"]
        scores[task["student"], task["assignment"]] = {g: score for g, (score, _, _) in notebook["cells"].items()}
    expected = {(STUDENT, lesson) for lesson in ANSWERS} | {(META_STUDENT, lesson) for lesson in ON_META}
    assert set(scores) == expected, scores
    return scores


def _earned(graded: dict, lesson: str, cells: tuple[str, ...], student: str = STUDENT) -> dict[str, float]:
    """The points ``cells`` of ``lesson`` earned by ``student`` (each must still be graded)."""
    scores = graded[student, lesson]
    assert set(cells) <= set(scores), scores
    return {grade_id: scores[grade_id] for grade_id in cells if scores[grade_id]}


def test_data_parallel_grads_from_the_hints_chunk_gradients(graded):
    """Attack: data_parallel_grads composed of gpulab's hint mistake-models (``_chunk_mean_gradients`` weighted by
    ``_weighted`` with the chunks' shares): every graded cell of the exercise, no line of its computation written."""
    cells = ("data_parallel_grads_full_batch", "data_parallel_grads_splits_like_scatter")
    cells += ("data_parallel_grads_model_unchanged",)
    assert _earned(graded, "02_gradient_averaging", cells) == {}


def test_average_gradients_from_the_hints_weighting(graded):
    """Attack: average_gradients as gpulab's hint helper ``_weighted`` with the chunks' shares (its ``zip(...,
    strict=True)`` also raises the ValueError the contract asks for)."""
    cells = ("average_gradients_weights", "average_gradients_checks")
    assert _earned(graded, "02_gradient_averaging", cells) == {}


TRAFFIC_CELLS = ("dp_traffic_bytes_forward", "dp_traffic_bytes_backward", "dp_traffic_bytes_idle_devices")


def test_dp_traffic_bytes_measured_with_gpulab_traffic(graded):
    """Attack: dp_traffic_bytes measured by ``gpulab.traffic.data_parallel_step`` on
    ``gpulab.exercises.gpu0_imbalance.traffic_model`` (virtual devices playing the algorithm asked for) instead of
    counted: right on every small input, it cannot make a model of a trillion parameters nor replicate one to
    100,000 devices in a check's time, so it loses every cell those inputs are drawn in (with the contract's one-line
    argument check the idle-devices cell's errors would pass, its drawn sizes do not)."""
    assert _earned(graded, "03_gpu0_imbalance", TRAFFIC_CELLS) == {}


def test_dp_traffic_bytes_counted_on_the_meta_device_by_gpulab_traffic(graded):
    """Attack: dp_traffic_bytes counted by ``gpulab.traffic.counted_step`` on the meta device, where a trillion
    parameters cost nothing: 100,000 devices and more still take a replica and a thread each, past the check's
    time and the kernel's task limit."""
    assert _earned(graded, "03_gpu0_imbalance", TRAFFIC_CELLS, student=META_STUDENT) == {}


def test_ring_all_reduce_bytes_played_by_gpulab_traffic(graded):
    """Attack: ring_all_reduce_bytes as ``gpulab.traffic.ring_bytes_sent`` (the ring player the grader's expected
    values of small rings come from) on one chunk holding every element: rings of 100,000 ranks and more take it
    ``2 N^2`` steps, past the check's time (the errors cell, earned by the hand-written argument check, is not
    counted here)."""
    assert _earned(graded, "03_gpu0_imbalance", ("ring_all_reduce_bytes_total",)) == {}


def test_the_attacks_are_answers_of_gpulab_alone():
    """The composed answers import only gpulab and torch: what a class's environment, without gpulab_solutions,
    runs as well."""
    for answers in [*ANSWERS.values(), *ON_META.values()]:
        for code in answers.values():
            imported = {
                (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]
                for node in ast.walk(ast.parse(code))
                if isinstance(node, (ast.Import, ast.ImportFrom))
            }
            assert imported <= {"gpulab", "torch"}, imported
