"""What a lesson edited for the learner looks like (issue "the lessons, edited for the learner"), as data the
tests read: the lessons not yet edited, the core path's limits, and how a lesson's cells are told apart.

``NOT_YET_EDITED`` names the lessons that have not had their learner pass. Their tests are marked
``xfail(strict=True)``: they are expected to fail, and the day such a lesson passes, the strict mark fails the
run, so the exemption is removed as soon as it is no longer needed; removing it early fails the run too.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import jupytext
import pytest

from tests.nbgrader_tools import SOURCE_ROOT

LESSONS = sorted(path.name for path in SOURCE_ROOT.iterdir() if (path / f"{path.name}.py").is_file())
NOT_YET_EDITED: dict[str, str] = {}  # lesson name -> why it has not had its learner pass yet
CORE_PROSE_WORDS = 1500  # at most, per lesson: the markdown of everything but the "Going further" sections
MARKDOWN_CELL_WORDS = 150  # at most, per markdown cell of the core path
GOING_FURTHER = "Going further"
AFTER_THE_QUIZ = ("What you learned", GOING_FURTHER)  # the only sections after the quiz
TIME_AT_THE_TOP = re.compile(r"about (\d+) minutes")
TIME_AT_THE_TOP_JA = re.compile(r"約(\d+)分")  # the Japanese edition's "about N minutes"
# How long a lesson's core path takes, by one rule (docs/architecture.md, "How long a lesson takes"): its prose read at
# READING_WORDS_PER_MINUTE, each demo cell (read, run, look at what it shows) at DEMO_CELL_MINUTES, each exercise (the
# quiz counted as one) at EXERCISE_MINUTES, rounded to the nearest 5 minutes. An estimate by rule: no learner was timed.
READING_WORDS_PER_MINUTE = 150
DEMO_CELL_MINUTES = 0.5
EXERCISE_MINUTES = 5
RED_CELL = re.compile(r"\bred\b", re.IGNORECASE)
QUIZ_ANSWERS = "quiz_answers"


def lesson_params(lessons=LESSONS):
    """``lessons`` as pytest parameters, the ones in ``NOT_YET_EDITED`` marked ``xfail(strict=True)``."""
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=NOT_YET_EDITED[name]))
        if name in NOT_YET_EDITED
        else name
        for name in lessons
    ]


def source_cells(lesson: str) -> list:
    """The cells of a lesson's jupytext source, in order."""
    return jupytext.read(SOURCE_ROOT / lesson / f"{lesson}.py", fmt="py:percent").cells


def prose_words(markdown: str) -> int:
    """Words a learner reads in a markdown cell: fenced code blocks and display maths left out."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.DOTALL)
    return len(re.findall(r"[^\s#*>|-]\S*", text))


def sections(cells) -> list[tuple[str, list]]:
    """The notebook cut at its level-2 headings (``## ...``): ``(heading, cells)`` pairs, the first one's heading
    "" (the title and introduction)."""
    found: list[tuple[str, list]] = [("", [])]
    for cell in cells:
        if cell.cell_type == "markdown":
            heading = re.search(r"^## (.+)$", cell.source, re.MULTILINE)
            if heading:
                before = cell.source[: heading.start()]
                if before.strip():
                    found[-1][1].append(type(cell)(cell, source=before))
                found.append((heading.group(1).strip(), [type(cell)(cell, source=cell.source[heading.start() :])]))
                continue
        found[-1][1].append(cell)
    return found


def core_path(cells) -> list:
    """The cells outside the "Going further" sections."""
    return [cell for heading, part in sections(cells) if not heading.startswith(GOING_FURTHER) for cell in part]


def core_path_minutes(cells) -> int:
    """The time a lesson states at its top, computed from its notebook's core path by the rule above."""
    core = core_path(cells)
    words = sum(prose_words(cell.source) for cell in core if cell.cell_type == "markdown")
    kinds = [cell_kind(cell) for cell in core if cell.cell_type == "code" and not _hidden(cell)]
    minutes = (
        words / READING_WORDS_PER_MINUTE
        + DEMO_CELL_MINUTES * kinds.count("demo")
        + EXERCISE_MINUTES * kinds.count("answer")
    )
    return 5 * math.floor(minutes / 5 + 0.5)


def _hidden(cell) -> bool:
    """The collapsed install cell: it does nothing where gpulab is installed, and a learner never reads it."""
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def is_self_check(cell) -> bool:
    """A code cell that only calls ``gpulab.check.<exercise>(...)``: instant feedback, never graded."""
    if cell.cell_type != "code":
        return False
    try:
        statements = ast.parse(cell.source).body
    except SyntaxError:
        return False
    return bool(statements) and all(
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Call)
        and ast.unparse(statement.value.func).startswith("gpulab.check.")
        for statement in statements
    )


def cell_kind(cell) -> str:
    """``"answer"``, ``"graded"``, ``"self-check"`` or ``"demo"`` (any other code cell)."""
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    if nbgrader.get("solution"):
        return "answer"
    if nbgrader.get("grade"):
        return "graded"
    return "self-check" if is_self_check(cell) else "demo"


def release_notebook(lesson: str, release_root: Path) -> Path:
    return release_root / lesson / f"{lesson}.ipynb"
