"""Shared pytest set-up: the repository root on sys.path (for `tests.*` helpers and DDP worker modules), and how
the test files share the machine's cores.

``make test`` runs the tests in two steps (``scripts/run_tests.py``): every test not marked ``alone`` on all cores
(pytest-xdist: a test file's tests stay on one worker, so that its module and class fixtures are built once;
``pytest_xdist_make_scheduler``), then the ``alone`` ones one at a time on the quiet machine (the class on one box
and on Slurm, and the tests that judge a claim by the clock). Each worker has a temporary folder of its own
(``TMPDIR``), so a test that checks what it left there sees no neighbour's files."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# the course environment the class tests share, built once per session
from tests.class_environment import course_environment  # noqa: E402, F401

# files whose tests share a fixture that lives in another test file: they run on the same worker
SHARED_WITH = {"test_redteam.py": "test_autograder.py"}  # the main grading run (test_autograder.main_run)
# the groups that take longest, longest first (seconds measured on the 2-core CI machine): a worker takes the next
# group when it is done with one, so the long ones start first and the short ones fill in at the end
LONGEST_FIRST = (
    "test_autograder.py",  # the main grading run (284 s), the red-team runs (203 s, 95 s)
    "test_lesson_03.py",  # 18 whole-lesson gradings of about 26 s
    "test_checks_draws.py",  # 135 s, 115 s, 55 s
    "test_lesson_02.py",
    "test_lesson_04.py",
    "test_gpu_check.py",  # the GPU check's dry run (123 s)
    "test_lessons_execute.py",
    "test_solution_attacks.py",
    "test_redteam_round3.py",
    "test_browser.py",
)
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
WORKERS_TMP = "GPULAB_TEST_WORKERS_TMP"  # the folder that holds each worker's temporary folder, made by the controller
if WORKER and WORKERS_TMP in os.environ:  # this worker's, open to all as /tmp is (the sandboxed kernels' uids)
    os.environ["TMPDIR"] = str(Path(os.environ[WORKERS_TMP]) / WORKER)
    Path(os.environ["TMPDIR"]).mkdir(mode=0o1777, exist_ok=True)  # a pytest a test starts inherits the variables
    os.chmod(os.environ["TMPDIR"], 0o1777)
    tempfile.tempdir = None


def pytest_configure(config):
    if not WORKER and getattr(config.option, "numprocesses", None):  # the workers, started later, inherit it
        os.environ[WORKERS_TMP] = tempfile.mkdtemp(prefix="pytest-workers-", dir="/tmp")
        os.chmod(os.environ[WORKERS_TMP], 0o755)


def pytest_unconfigure(config):
    if not WORKER and WORKERS_TMP in os.environ:  # after the workers have ended
        shutil.rmtree(os.environ.pop(WORKERS_TMP), ignore_errors=True)


def _group(file_name: str) -> str:
    return SHARED_WITH.get(file_name, file_name)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without it (a bare GPU image), no such hook
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduling by file, with the files of ``SHARED_WITH`` on one worker."""
    from xdist.scheduler import LoadFileScheduling

    class ByFileGroup(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid.split("::", 1)[0].rsplit("/", 1)[-1])

    return ByFileGroup(config, log)


def pytest_collection_modifyitems(config, items):
    """Put the longest groups first (``LONGEST_FIRST``), each file's tests in their order."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_group(item.path.name), len(rank)))


def pytest_generate_tests(metafunc):
    """Parametrize a lesson's grading tests (``tests/lesson_grading.py``) by edition, and by its correct and wrong
    submissions."""
    cls = metafunc.cls
    if cls is None:
        return
    from tests.lesson_grading import GradedLesson
    from tests.nbgrader_tools import EDITIONS

    if not issubclass(cls, GradedLesson) or "edition" not in metafunc.fixturenames:
        return
    for argument, cases in (("correct_case", cls.CORRECT), ("wrong_case", cls.WRONG)):
        if argument in metafunc.fixturenames:
            pairs = _editions_in_turn(cases, EDITIONS)
            ids = [f"{edition}-{case}" for edition, case in pairs]
            metafunc.parametrize(("edition", argument), pairs, indirect=["edition"], ids=ids, scope="class")
            return
    metafunc.parametrize("edition", EDITIONS, indirect=True, scope="class")


def _editions_in_turn(cases, editions: tuple[str, ...]) -> list[tuple[str, str]]:
    """Each submission of a lesson's grading tests with one edition, the editions in turn: a grading takes a whole
    lesson's run (up to half a minute for lesson 03), and which edition a notebook is in changes how it is matched
    and repaired, not how its answers are checked (the same checks; ``tests/test_checks_draws.py`` checks every
    submission's verdicts under many draws without a kernel). The reference and the blank release are graded in
    every edition."""
    return [(editions[index % len(editions)], case) for index, case in enumerate(sorted(cases))]


@pytest.fixture
def inbound(tmp_path):
    """An empty folder standing for a class exchange's ``inbound/`` (``tests/test_class_collect.py``,
    ``tests/test_class_attacks.py``)."""
    folder = tmp_path / "inbound"
    folder.mkdir()
    return folder
