"""Shared pytest set-up: the repository root on sys.path (for `tests.*` helpers and DDP worker modules)."""

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# the course environment the class tests share, built once per session
from tests.class_environment import course_environment  # noqa: E402, F401


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
