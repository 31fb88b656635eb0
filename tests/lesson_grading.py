"""The grading tests every lesson has, written once: a lesson's test module subclasses ``GradedLesson``.

* the reference solution (the source notebook) gets full marks;
* the blank release gets zero;
* correct answers written differently (``CORRECT``: name → {answer cell grade_id: code}) get full marks;
* each wrong submission (``WRONG``: name → ({grade_id: code}, {grade_ids it must lose})) loses exactly the
  points of the cells it gets wrong, and all of them;

the reference and the blank release in every edition of the lesson (English, and Japanese made with
``stand_in_catalogue``), each correct and wrong submission in one edition, the editions in turn; all graded on the
one nbgrader assignment with the same expectations.

``tests/conftest.py`` parametrizes ``edition``, and ``correct_case`` and ``wrong_case`` from the subclass's
dictionaries.
"""

from __future__ import annotations

import pytest

from tests.nbgrader_tools import autograde_notebook, build_release, build_source
from tests.submissions import with_answers


def lost_cells(scores: dict[str, tuple[float | None, float]]) -> set[str]:
    """The graded cells that did not get full marks."""
    return {grade_id for grade_id, (score, max_score) in scores.items() if score != max_score}


class GradedLesson:
    LESSON: str = ""
    MIN_GRADED_CELLS: int = 1
    CORRECT: dict[str, dict[str, str]] = {}
    WRONG: dict[str, tuple[dict[str, str], set[str]]] = {}

    @pytest.fixture(scope="class")
    @classmethod
    def edition(cls, request):
        """The edition graded (``tests/conftest.py`` parametrizes it)."""
        return request.param

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, tmp_path_factory, edition):
        return build_source(cls.LESSON, tmp_path_factory.mktemp(f"reference-{edition}"), edition)

    def _grade(self, reference, answers, tmp_path):
        submission = with_answers(reference, answers, tmp_path / f"{self.LESSON}.ipynb")
        return autograde_notebook(self.LESSON, submission)

    def test_reference_solution_gets_full_marks(self, reference):
        scores = autograde_notebook(self.LESSON, reference)
        assert len(scores) >= self.MIN_GRADED_CELLS and not lost_cells(scores), scores

    def test_blank_release_gets_zero(self, tmp_path, edition):
        scores = autograde_notebook(self.LESSON, build_release(self.LESSON, tmp_path, edition))
        assert all(score == 0 for score, _ in scores.values()), scores

    def test_correct_answers_written_differently_get_full_marks(self, reference, tmp_path, correct_case):
        scores = self._grade(reference, self.CORRECT[correct_case], tmp_path)
        assert not lost_cells(scores), scores

    def test_wrong_answers_lose_exactly_their_points(self, reference, tmp_path, wrong_case):
        answers, expected_lost = self.WRONG[wrong_case]
        scores = self._grade(reference, answers, tmp_path)
        assert lost_cells(scores) == expected_lost, scores
        assert all(score == 0 for grade_id, (score, _) in scores.items() if grade_id in expected_lost), scores
