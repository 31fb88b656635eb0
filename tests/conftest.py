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
    """Parametrize a lesson's grading tests (``tests/lesson_grading.py``) by its correct and wrong submissions."""
    cls = metafunc.cls
    if cls is None:
        return
    if "correct_case" in metafunc.fixturenames:
        metafunc.parametrize("correct_case", sorted(cls.CORRECT))
    if "wrong_case" in metafunc.fixturenames:
        metafunc.parametrize("wrong_case", sorted(cls.WRONG))


@pytest.fixture
def inbound(tmp_path):
    """An empty folder standing for a class exchange's ``inbound/`` (``tests/test_class_collect.py``,
    ``tests/test_class_attacks.py``)."""
    folder = tmp_path / "inbound"
    folder.mkdir()
    return folder
