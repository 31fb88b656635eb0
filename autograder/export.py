"""``grades.csv``: nbgrader's CSV export, written so that no student id or name can shift a column or run as a
spreadsheet formula.

nbgrader 0.9's ``CsvExportPlugin`` joins the fields with commas, unquoted: an id holding a comma or a newline
shifts the columns (a CSV reader then reads another student's points), and an id starting with ``=``, ``+``,
``-`` or ``@`` is a formula to a spreadsheet. ``SafeCsvExportPlugin`` writes the same columns and values with
Python's ``csv`` module (fields quoted where they hold a separator, quote or line break) and prefixes a text field
that would start a formula with ``'`` (OWASP's advice for CSV injection). For the ids ``grade.py`` accepts
(``SAFE_ID``) neither ever applies: the file is byte for byte what ``nbgrader export`` writes, and read back it
equals the gradebook (``tests/test_export.py``). The course's ``nbgrader_config.py`` makes it ``nbgrader export``'s
plugin too.
"""

from __future__ import annotations

import csv
import re

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins.export import CsvExportPlugin

COLUMNS = [
    "assignment",
    "duedate",
    "timestamp",
    "student_id",
    "last_name",
    "first_name",
    "email",
    "raw_score",
    "late_submission_penalty",
    "score",
    "max_score",
]
TEXT_COLUMNS = {"assignment", "student_id", "last_name", "first_name", "email"}
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")

SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
"""Student ids the grader accepts (the folder names under the submissions folder): ASCII letters, digits and
``._@+-``, starting with a letter or a digit (so never a formula, a hidden folder or ``..``), at most 128
characters. A login name or an e-mail address fits."""


def unsafe_id_reason(student: str) -> str | None:
    """Why ``student`` is refused as a student id (``None`` when it is accepted)."""
    if SAFE_ID.fullmatch(student):
        return None
    return (
        f"student id {student!r} refused: ids are ASCII letters, digits and . _ @ + -, starting with a letter or "
        "a digit, at most 128 characters (rename the folder)"
    )


def neutralised(value: str) -> str:
    """A text field that a spreadsheet would read as a formula, made plain text (a leading ``'``)."""
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def rows(gradebook: Gradebook, students=(), assignments=()) -> list[dict[str, str]]:
    """The rows of nbgrader's CSV export (every student for every assignment; 0 without a submission)."""
    found = []
    for assignment in gradebook.assignments:
        if assignments and assignment.name not in assignments:
            continue
        for student in gradebook.students:
            if students and student.id not in students:
                continue
            row = {
                "assignment": assignment.name,
                "duedate": assignment.duedate,
                "student_id": student.id,
                "last_name": student.last_name,
                "first_name": student.first_name,
                "email": student.email,
                "max_score": assignment.max_score,
            }
            try:
                submission = gradebook.find_submission(assignment.name, student.id)
            except MissingEntry:
                row.update(timestamp="", raw_score=0.0, late_submission_penalty=0.0, score=0.0)
            else:
                penalty = submission.late_submission_penalty
                row.update(
                    timestamp=submission.timestamp,
                    raw_score=submission.score,
                    late_submission_penalty=penalty,
                    score=max(0.0, submission.score - penalty),
                )
            found.append({key: "" if row[key] is None else str(row[key]) for key in COLUMNS})
    return found


class SafeCsvExportPlugin(CsvExportPlugin):
    """nbgrader's CSV export (same columns, values and default file name), quoted and formula-safe."""

    def export(self, gradebook: Gradebook) -> None:
        destination = self.to or "grades.csv"
        students = [str(s) for s in self.student]
        assignments = [str(a) for a in self.assignment]
        with open(destination, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(COLUMNS)
            for row in rows(gradebook, students, assignments):
                writer.writerow(neutralised(row[k]) if k in TEXT_COLUMNS else row[k] for k in COLUMNS)
