"""A grading draws some of its cases at random (``session.rng``, seeded from ``os.urandom`` for each grading), so a
learner's grade must not depend on the draw. Under many draws, through a ``LocalSession`` (no kernel), each lesson's
reference and correct answers earn every cell, and each wrong answer of ``tests/test_lesson_0N.py`` loses exactly
the cells its grading test says: no fewer, and no more (a draw that strays into another cell's concern would grade
one mistake twice).

How many draws: ``GPULAB_TEST_DRAWS`` (6 by default, what ``make test`` and CI run; ``make test-draws`` sweeps 16).
Each grading draws afresh, so the runs of a project together cover far more draws than one run."""

from __future__ import annotations

import importlib
import os

import pytest

from tests.local_checks import NAMESPACES, PATCH_THE_PROCESS, lost_cells

DRAWS = range(int(os.environ.get("GPULAB_TEST_DRAWS", "6")))


def graded_answers(lesson: str) -> list[tuple[str, dict[str, str], set[str]]]:
    """``(name, answers, cells it must lose)`` of the reference and of a lesson's grading tests' submissions."""
    graded = importlib.import_module(f"tests.test_lesson_{lesson[:2]}").TestGrading
    cases = [("reference", {}, set())]
    cases += [(name, answers, set()) for name, answers in graded.CORRECT.items()]
    cases += [(name, answers, lost) for name, (answers, lost) in graded.WRONG.items() if name not in PATCH_THE_PROCESS]
    return cases


@pytest.mark.parametrize("lesson", NAMESPACES)
def test_a_grade_does_not_depend_on_the_draw(lesson, tmp_path):
    cases = graded_answers(lesson)
    assert len(cases) > 3
    surprises = []
    for name, answers, lost in cases:
        for seed in DRAWS:
            workdir = tmp_path / f"{name}-{seed}"
            workdir.mkdir()
            got = lost_cells(lesson, NAMESPACES[lesson](answers), workdir, seed)
            if got != lost:
                surprises.append(f"{name}, draw {seed}: lost {sorted(got - lost)}, kept {sorted(lost - got)}")
    assert not surprises, "\n".join(surprises)
