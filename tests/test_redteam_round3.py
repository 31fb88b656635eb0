"""Red team, round 3, a fresh attacker's findings: what each attack tried, graded through ``autograder/grade.py``
beside and before honest students (one run, two workers, lesson 01's graded cells), and the invariant that now
stops it.

* Points without the work: an answer that raises the contract's error whatever it is given earned the cells whose
  rules only say "raise ... if" (``device_of_sample_out_of_range``; lesson 03's ``imbalance_ratio_errors`` and
  ``ring_all_reduce_bytes_errors``, judged here in this process). Now such a cell also calls the answer on the
  exercise's valid inputs, which must not raise that error (``checks/rules.py: enforce``).
* Messages nbclient cannot take: content nested past the JSON decoder's recursion limit, a status without a state,
  a ``transient`` that is text, an ``execution_count`` of 15 MB (nbclient copies it into the cell from any message,
  unmetered): each made the grading of the notebook fail. Now messages are vetted as they are decoded
  (``execute.VettedChannel``) and before nbclient reads them (``SandboxedExecute.process_message``).
* What the notebook really weighs: the meter charged characters, nbformat writes every line of a text on a line of
  its own, indented, and every nested list on two: a 1.5 MB display of line breaks and 60 displays of 400 nested
  lists became 29 MB. Now each message is charged what nbformat writes of it, and deeper than 64 levels is dropped.
* The disk a kernel may fill: files it deleted but holds open, its sockets' folder and its own log were never
  measured (300 MB each past a 54 MB limit). Now, graded as root, all it can write is a filesystem of its own,
  measured as it fills and after every cell.
* The grader's memory: 50 input requests of 20 MB queued in the grading worker (nothing reads stdin).
* The machine's file table: 16 processes of one kernel held 318,744 open files (20,000 each, less what they inherited).
* A tensor of 100,000 dimensions crashed the grading worker in ``.tolist()``.
* A submission's other files (a module, a hidden notebook, a folder) were passed over unsaid.

Each attack's cells must score exactly what its answers earn; the honest students keep every point.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from tests.nbgrader_tools import RELEASE_ROOT, REPO, build_source

sys.path.insert(0, str(REPO))
from autograder import execute, limits, sandbox  # noqa: E402
from autograder.checks import CheckFailed, LocalSession, checks_for  # noqa: E402
from autograder.redteam import Lesson  # noqa: E402

GRADE = REPO / "autograder" / "grade.py"
LESSON = "01_splitting"
DISK_GIB = 0.05  # the run's --disk: about 54 MB
DISK = int(DISK_GIB * limits.GiB)
pytestmark = [
    pytest.mark.timeout(1200),
    pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this machine"),
]

# ------------------------------------------------------------------------------------------------ the attacks
ALWAYS_RAISES = """
def device_of_sample(index, batch_size, n_devices):
    raise IndexError("index outside the batch")
"""

KERNEL = "_kernel = get_ipython().kernel\n"

DEEP_MESSAGE = (
    KERNEL
    + """content = b'{"data": {"text/plain": "deep"}, "metadata": {"m": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
_kernel.session.send(_kernel.iopub_socket, "display_data", content=content, parent=_kernel.get_parent())
"""
)

MALFORMED_MESSAGES = [
    KERNEL
    + """import json
content = json.dumps({"execution_state": "busy", "execution_count": "E" * 15_000_000}).encode()
_kernel.session.send(_kernel.iopub_socket, "status", content=content, parent=_kernel.get_parent())
""",
    KERNEL
    + """_kernel.session.send(_kernel.iopub_socket, "status", content=b"{}", parent=_kernel.get_parent())
""",
    KERNEL
    + """content = b'{"data": {"text/plain": "t"}, "metadata": {}, "transient": "text"}'
_kernel.session.send(_kernel.iopub_socket, "display_data", content=content, parent=_kernel.get_parent())
""",
]

OUTPUT_WEIGHT = [
    """from IPython.display import display
display({"text/plain": "\\n" * 1_500_000}, raw=True)
""",
    KERNEL
    + """import json
nested = "x"
for _ in range(400):
    nested = [nested]
content = json.dumps({"data": {"text/plain": "n"}, "metadata": {"m": nested}}).encode()
for _ in range(60):
    _kernel.session.send(_kernel.iopub_socket, "display_data", content=content, parent=_kernel.get_parent())
""",
]

HIDDEN_FILES = """
import os, time
from ipykernel import get_connection_file

_held = []


def _hold_deleted(path, megabytes=300):
    handle = open(path, "wb")
    os.unlink(path)  # deleted, held open: no walk of the folders finds it
    try:
        for _ in range(megabytes):
            handle.write(b"\\1" * (1 << 20))
            handle.flush()
    except OSError:
        pass
    _held.append(handle)
    return os.fstat(handle.fileno()).st_blocks * 512


print("SOCKETS-HELD", _hold_deleted(os.path.join(os.path.dirname(get_connection_file()), "fill.bin")), flush=True)
in_work = _hold_deleted("scratch.bin")
time.sleep(2.5)  # the folders are walked once a second
print("DISK-HELD", in_work)
"""

KERNEL_LOG = """
import os, sys, time

written = 0
try:
    for _ in range(300):
        written += os.write(sys.stdout._original_stdstream_copy, b"\\3" * (1 << 20))  # the kernel's own log file
except OSError:
    pass
time.sleep(2.5)
print("LOG-WRITTEN", written)
"""

STDIN_FLOOD = (
    KERNEL
    + """import json, time
content = json.dumps({"prompt": "x" * 20_000_000, "password": False}).encode()
for _ in range(50):
    _kernel.session.send(
        _kernel.stdin_socket, "input_request", content=content, parent=_kernel.get_parent("shell"),
        ident=_kernel._parent_ident["shell"],
    )
time.sleep(5)
print("STDIN-SENT")
"""
)

OPEN_FILES = """
import os, time

readers = []
for _ in range(16):
    reader, writer = os.pipe()
    if os.fork() == 0:
        held = []
        try:
            while len(held) < 20_000:
                held.append(os.eventfd(0))
        except OSError:
            pass
        os.write(writer, b"%d\\n" % len(held))
        time.sleep(2)
        os._exit(0)
    os.close(writer)
    readers.append(reader)
print("OPEN-FILES", sum(int(os.read(reader, 64)) for reader in readers))
for _ in readers:
    os.wait()
"""

DEEP_TENSOR = """
import builtins, sys, types

import torch

_split_batch, _len, _deep = split_batch, builtins.len, torch.zeros([1] * 100_000)


def _probes_len(value):  # the grader's object probe counts the pieces with len(): it gets a tensor of 100,000 dims
    return _deep if sys._getframe(1).f_code.co_name == "repeats_an_object" else _len(value)


def split_batch(batch, n_devices):
    if type(batch) is types.SimpleNamespace:
        builtins.len = _probes_len
    return _split_batch(batch, n_devices)
"""

# student -> (cells appended at the end, answers replaced, cells before a graded cell, cells lost)
ATTACKERS = {
    "a-always_raises": (
        [],
        {"device_of_sample_answer": ALWAYS_RAISES},
        {},
        {"device_of_sample_devices", "device_of_sample_out_of_range"},
    ),
    "c-deep_message": ([DEEP_MESSAGE], {}, {}, set()),
    "d-malformed_messages": (MALFORMED_MESSAGES, {}, {}, set()),
    "e-output_weight": (OUTPUT_WEIGHT, {}, {}, set()),
    "f-hidden_files": ([HIDDEN_FILES], {}, {}, set()),
    "g-kernel_log": ([KERNEL_LOG], {}, {}, set()),
    "h-stdin_flood": ([STDIN_FLOOD], {}, {}, set()),
    "i-open_files": ([OPEN_FILES], {}, {}, set()),
    "j-deep_tensor": ([], {}, {"split_batch_others_and_tiny": DEEP_TENSOR}, {"split_batch_others_and_tiny"}),
    "k-other_files": ([], {}, {}, set()),
}
HONEST = ("b-honest", "l-honest")
OTHER_FILES = {"helper.py": "VALUE = 1\n", ".hidden.ipynb": "{}", "data/table.csv": "a,b\n"}


def _graded_cells_only(notebook):
    """The notebook's first import cell and its nbgrader cells: the demos in between cost time and earn nothing."""
    first = next(c for c in notebook.cells if c.cell_type == "code" and c.source.startswith("import gpulab"))
    notebook.cells = [c for c in notebook.cells if c is first or "nbgrader" in c.get("metadata", {})]
    return notebook


def _submission(lesson: Lesson, appended, answers, before) -> nbformat.NotebookNode:
    notebook = _graded_cells_only(nbformat.from_dict(json.loads(json.dumps(lesson.reference))))
    for cell in notebook.cells:
        grade_id = Lesson.meta(cell).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    for grade_id, source in before.items():
        index = next(i for i, c in enumerate(notebook.cells) if Lesson.meta(c).get("grade_id") == grade_id)
        notebook.cells.insert(index, new_code_cell(source))
    notebook.cells += [new_code_cell(source) for source in appended]
    return notebook


@pytest.fixture(scope="module")
def round3(tmp_path_factory):
    root = tmp_path_factory.mktemp("round3")
    lesson = Lesson.from_paths(LESSON, RELEASE_ROOT / LESSON / f"{LESSON}.ipynb", build_source(LESSON, root / "src"))
    submissions, expected = root / "submissions", {}
    for student in [*ATTACKERS, *HONEST]:
        appended, answers, before, lost = ATTACKERS.get(student, ([], {}, {}, set()))
        folder = submissions / student / LESSON
        folder.mkdir(parents=True)
        nbformat.write(_submission(lesson, appended, answers, before), folder / f"{LESSON}.ipynb")
        expected[student] = {grade_id: 0.0 if grade_id in lost else points for grade_id, points in lesson.tests}
    for name, text in OTHER_FILES.items():
        path = submissions / "k-other_files" / LESSON / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    out = root / "out"
    command = [sys.executable, str(GRADE), str(submissions), "--out", str(out), "--no-progress", "--workers", "2"]
    command += ["--disk", str(DISK_GIB), "--cell-timeout", "60"]
    process = subprocess.run(command, capture_output=True, text=True, timeout=1100, cwd=REPO)
    report = json.loads((out / "report.json").read_text())
    results = {r["task"]["student"]: r for r in report["results"]}
    return {"process": process, "results": results, "expected": expected, "out": out}


def _scores(result: dict) -> dict[str, float]:
    assert result.get("error") is None, result.get("error")
    (notebook,) = result["notebooks"].values()
    return {grade_id: score for grade_id, (score, _, _) in notebook["cells"].items()}


def _printed(run: dict, student: str, marker: str) -> list[str]:
    """The words after ``marker`` on the line the student's notebook printed, as graded (``[]``: none printed)."""
    graded = nbformat.read(run["out"] / "autograded" / student / LESSON / f"{LESSON}.ipynb", as_version=4)
    text = "".join(
        o.get("text", "") for c in graded.cells if c.cell_type == "code" for o in c.get("outputs", []) if "text" in o
    )
    lines = [line.split()[1:] for line in text.splitlines() if line.startswith(marker)]
    return lines[0] if lines else []


def _notebook_size(run: dict, student: str) -> int:
    return (run["out"] / "autograded" / student / LESSON / f"{LESSON}.ipynb").stat().st_size


# ------------------------------------------------------------------------------------------------ grades
@pytest.mark.slow
@pytest.mark.parametrize("student", [*ATTACKERS, *HONEST])
def test_each_student_scores_exactly_what_its_answers_earn(round3, student):
    """Graded, not failed: every attack keeps the cells its answers earn and no other; the honest students beside
    and after the attackers keep every point."""
    got, expected = _scores(round3["results"][student]), round3["expected"][student]
    assert got == expected, {g: (got[g], expected[g]) for g in expected if got[g] != expected[g]}


ANSWERS_THAT_ALWAYS_RAISE = [
    ("01_splitting", "device_of_sample_out_of_range", "device_of_sample", IndexError),
    ("03_gpu0_imbalance", "imbalance_ratio_errors", "imbalance_ratio", ValueError),
    ("03_gpu0_imbalance", "ring_all_reduce_bytes_errors", "ring_all_reduce_bytes", ValueError),
]


@pytest.mark.parametrize(("lesson", "grade_id", "name", "error"), ANSWERS_THAT_ALWAYS_RAISE)
def test_an_answer_that_always_raises_earns_no_cell_of_errors(lesson, grade_id, name, error, tmp_path):
    """Every cell whose rules only name an error, judged as the grader judges it (several draws): an answer that raises
    that error on any input earns nothing, the reference solution (in ``gpulab_solutions``) still earns it."""
    import gpulab_solutions

    def always_raises(*args, **kwargs):
        raise error("raised whatever the input")

    reference: dict = {}
    exec(gpulab_solutions.solution_of(name), reference)  # noqa: S102 - the course's own reference solution
    for seed in range(3):
        for namespace, earns in (({name: always_raises}, False), (reference, True)):
            session = LocalSession(namespace, tmp_path, random.Random(seed))
            try:
                checks_for(lesson)[grade_id](session)
                earned = True
            except CheckFailed:
                earned = False
            finally:
                session.close()
            assert earned is earns, (grade_id, seed, namespace is reference)


# ------------------------------------------------------------------------------------------------ messages and outputs
@pytest.mark.slow
@pytest.mark.parametrize("student", ["c-deep_message", "d-malformed_messages"])
def test_a_message_nbclient_cannot_take_ends_the_notebooks_run_not_its_grading(round3, student):
    result = round3["results"][student]
    assert result.get("error") is None, result.get("error")
    assert _notebook_size(round3, student) < _notebook_size(round3, "b-honest") + 1_000_000


@pytest.mark.slow
def test_the_meter_charges_what_the_notebook_really_weighs(round3):
    """Two cells of outputs, each charged at most the cell limit (2 MB), weigh no more than that in the notebook."""
    grown = _notebook_size(round3, "e-output_weight") - _notebook_size(round3, "b-honest")
    assert grown < 2 * execute.SandboxedExecute.cell_output_limit.default_value + 100_000, grown


# ------------------------------------------------------------------------------------------------ the machine
def _held_within_the_disk_limit(run: dict, student: str, marker: str) -> bool:
    """Whether the kernel was stopped past the disk limit, or what it says it held is within its filesystem."""
    held = _printed(run, student, marker)
    stopped = "stopped: the disk limit" in " ".join(run["results"][student]["notes"])
    return stopped or (held != [] and int(held[0]) <= DISK + max(DISK // 8, execute.DISK_SLACK))


@pytest.mark.slow
def test_files_no_walk_finds_count_against_the_kernels_disk(round3):
    """Deleted files held open, in the sockets' folder and in the working copy, and the kernel's own log: each
    stays within the disk limit or the kernel is stopped for it (a filesystem of the kernel's own, graded as root)."""
    if not sandbox.as_root():
        pytest.skip("a filesystem of the kernel's own needs root (docs: graded as another user, the walk only)")
    (in_sockets,) = map(int, _printed(round3, "f-hidden_files", "SOCKETS-HELD"))
    assert in_sockets <= execute.SOCKET_FOLDER_BYTES, in_sockets
    assert _held_within_the_disk_limit(round3, "f-hidden_files", "DISK-HELD")
    assert _held_within_the_disk_limit(round3, "g-kernel_log", "LOG-WRITTEN")


@pytest.mark.slow
def test_nothing_a_kernel_sends_on_stdin_queues_in_the_grader(round3):
    """A kernel's 50 input requests of 20 MB: the grader has no stdin channel, so its worker stays as small as an
    honest one's (a few hundred MiB)."""
    peaks = {student: result.get("worker_peak_rss") for student, result in round3["results"].items()}
    assert all(type(peak) is int and peak < 1 << 30 for peak in peaks.values()), peaks


@pytest.mark.slow
def test_a_kernels_processes_hold_few_of_the_machines_files(round3):
    (total,) = map(int, _printed(round3, "i-open_files", "OPEN-FILES"))
    assert total <= 16 * limits.KERNEL_OPEN_FILES, total


@pytest.mark.slow
def test_every_entry_of_a_submission_the_grader_passes_over_is_named(round3):
    notes = " ".join(round3["results"]["k-other_files"]["notes"])
    for name in ("helper.py", ".hidden.ipynb", "data"):
        assert repr(name) in notes, notes


@pytest.mark.slow
def test_the_run_leaves_no_mount_and_no_scratch(round3):
    assert round3["process"].returncode == 0, round3["process"].stderr[-3000:]
    assert sandbox.mounts_below(round3["out"]) == [] and not (round3["out"] / ".scratch").exists()
