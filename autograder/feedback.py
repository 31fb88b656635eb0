"""Feedback without hidden tests: neither their source, nor their tracebacks, nor anything learner code printed.

``ClearHiddenTests`` (nbgrader) removes the hidden regions from the source of test cells, but the cells' outputs
(IPython's traceback prints the failing line and its neighbours, a hidden test may print) still show them, and
learner code can print or raise whatever it can reach, encoded so that no filter recognises it. So feedback
carries no output the kernel produced. ``RedactHiddenTests`` runs first and:

* replaces the outputs of every test cell by one line saying what happened, from the grader's record
  (``metadata.autograder``, written by ``execute.SandboxedExecute``): passed; failed (with the rule or case that
  failed, a text of a fixed catalogue, never a check's message, which names its hidden inputs; or the time or
  kernel limit); not run (and why). No exception text is shown. A quiz cell's line says what the learner answered,
  whether it is right, and why (``autograder.quizzes.feedback_line``, from the verdict the check kept in
  ``feedback.quiz``; the explanation comes from the grader's answer key);
* removes the outputs of every other code cell (the learner has them in their own notebook);
* removes hidden-test regions from cells that are not test cells (a learner pasting a solved test cell, or the
  markers alone, would otherwise make ``ClearHiddenTests`` fail the whole feedback).

The summary lines, the grader's reasons in them and the page's fixed headings ("Student's answer", "Score", ...)
are in the edition the student worked in (``SUMMARIES``, ``autograder/reasons.py`` and ``HEADINGS``;
``metadata.gpulab.edition`` of the graded notebook, which ``grade.py`` writes).

Markdown is the learner's too: the page is nbgrader's feedback template with every markdown cell's rendered HTML
passed through nbconvert's sanitizer (``SanitizeHTML``, bleach) by ``sanitize_markup`` (the course's template
``autograder/templates/course_feedback``). Scripts, event handlers, frames, forms, styles and ``javascript:`` or
``data:`` links are escaped or dropped, and so is every image source (no request leaves the page); headings,
paragraphs, lists, tables and code stay. Raw cells are not rendered at all.

The course configuration (``autograder/nbgrader_config.py``) puts ``FEEDBACK_PREPROCESSORS`` in
``GenerateFeedback.preprocessors``, so ``nbgrader generate_feedback`` behaves the same as ``grade.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbconvert.preprocessors.sanitize import SanitizeHTML
from nbformat.v4 import new_output
from nbgrader import utils
from nbgrader.preprocessors import ClearHiddenTests, GetGrades, NbGraderPreprocessor

from autograder.reasons import text_of

METADATA_KEY = "autograder"
HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
MIN_SECRET_LENGTH = 12  # shorter lines (``else:``, ``pass``) are too common to be a trace of a hidden test


def _split_hidden(source: str) -> tuple[list[str], list[str]]:
    """A cell's lines outside and inside its hidden-test regions (the marker lines themselves in neither)."""
    outside, inside, hidden = [], [], False
    for line in source.splitlines():
        if HIDDEN_BEGIN in line:
            hidden = True
        elif HIDDEN_END in line:
            hidden = False
        else:
            (inside if hidden else outside).append(line)
    return outside, inside


def hidden_regions(source: str) -> list[str]:
    """The lines of a cell's hidden-test regions, in order."""
    return _split_hidden(source)[1]


def _without_hidden(source: str) -> str:
    return "\n".join(_split_hidden(source)[0])


def secrets_of(lines: list[str]) -> set[str]:
    """Lines of hidden tests that must not appear anywhere in feedback (long enough not to be common code)."""
    return {line.strip() for line in lines if len(line.strip()) >= MIN_SECRET_LENGTH}


# The summary lines, in each edition of the lessons (the submission's ``metadata.gpulab.edition``, set by grade.py).
SUMMARIES = {
    "en": {
        "passed": "✔ The tests in this cell passed.",
        "not run": "✘ Not run: {reason}",
        "reason": "✘ A test failed: {reason}",
        "failed": "✘ The grader's tests of this cell failed (run the cell in your notebook to read the visible tests).",
        "rule": "✘ The grader's tests of this cell failed on: {rule}.",
    },
    "ja": {
        "passed": "✔ このセルのテストはすべて通りました。",
        "not run": "✘ 実行されませんでした：{reason}",
        "reason": "✘ テストが失敗しました：{reason}",
        "failed": (
            "✘ このセルの採点テストが失敗しました（ノートブックでセルを実行すると、表示されているテストの結果を"
            "確認できます）。"
        ),
        "rule": "✘ このセルの採点テストが、次の点で失敗しました：{rule}。",
    },
}


# The page's fixed words (nbgrader's headings, the table of contents, the score), in each edition: the course's
# template writes ``{{ "score" | heading(nb) }}`` where nbgrader's page has "Score".
HEADINGS = {
    "en": {
        "score": "Score",
        "top": "(Top)",
        "answer": "Student's answer",
        "task": "Student's task",
        "grade_cell": "Grade cell",
        "task_cell": "Task",
        "comments": "Comments:",
        "test_cell": "Test cell",
        "coding": "Coding free-response",
        "written": "Written response",
        "comment": "Comment",
        "late": "Late submission penalty",
    },
    "ja": {
        "score": "得点",
        "top": "（先頭へ）",
        "answer": "あなたの解答",
        "task": "あなたの課題",
        "grade_cell": "採点セル",
        "task_cell": "課題",
        "comments": "コメント：",
        "test_cell": "テストセル",
        "coding": "コードの自由記述",
        "written": "記述式の解答",
        "comment": "コメント",
        "late": "提出遅れの減点",
    },
}


def heading(key: str, nb) -> str:
    """One of the feedback page's fixed words in the edition of ``nb`` (the ``heading`` filter of the course's
    template)."""
    return HEADINGS.get(edition(nb), HEADINGS["en"])[key]


def edition(nb) -> str:
    """The edition of the lessons a graded notebook comes from (``"en"`` unless its metadata says another)."""
    declared = nb.get("metadata", {}).get("gpulab")
    chosen = declared.get("edition") if isinstance(declared, dict) else None
    return chosen if chosen in SUMMARIES else "en"


def summary(cell, language: str = "en") -> str:
    """One line about a test cell, from the grader's record (never the text of an exception), in ``language``
    (an edition of the lessons), with the grader's reason in that language too; plain text, so a rule's code
    marks (`ValueError`) are dropped rather than shown as backticks."""
    return re.sub(r"`([^`\n]+)`", r"\1", _summary(cell, language))


def _summary(cell, language: str) -> str:
    lines = SUMMARIES.get(language, SUMMARIES["en"])
    record = cell.metadata.get(METADATA_KEY, {})
    status = record.get("status")
    quiz = _quiz_line(record, language) if status in ("passed", "failed") else None
    if quiz is not None:
        return quiz
    if status == "passed":
        return lines["passed"]
    why = text_of(record, language)
    if status in ("not run", "missing"):
        return lines["not run"].format(reason=why)
    if why and record.get("where") is None:
        return lines["reason"].format(reason=why)
    rule = _rule_text(record.get("rule"), language)
    if rule:
        return lines["rule"].format(rule=rule.rstrip(".。"))
    return lines["failed"]  # no more: a check's message names the inputs it drew (hidden ones too)


def _rule_text(rule, language: str) -> str | None:
    """The failed rule of a grader's record in ``language`` (English when it has no translation)."""
    if not isinstance(rule, dict):
        return None
    text = rule.get(language) or rule.get("en")
    return text if isinstance(text, str) and text else None


def _quiz_line(record: dict, language: str) -> str | None:
    """A graded quiz cell's line: the learner's answer, right or wrong, and the explanation (the grader's key,
    ``autograder/quizzes.py``), from the verdict the grader kept (``feedback.quiz``); ``None`` for other cells."""
    from autograder.quizzes import feedback_line

    shown = record.get("feedback")
    return feedback_line(shown.get("quiz"), language) if isinstance(shown, dict) else None


class RedactHiddenTests(NbGraderPreprocessor):
    """Test cells' outputs become one summary line; other cells' outputs are removed (module docstring)."""

    def preprocess(self, nb, resources):
        language = edition(nb)
        for cell in nb.cells:
            if not utils.is_grade(cell) and (HIDDEN_BEGIN in cell.source or HIDDEN_END in cell.source):
                # a learner's cell with the markers (a pasted test, or a bid to break ClearHiddenTests)
                cell.source = _without_hidden(cell.source).replace(HIDDEN_END, "")
            if cell.cell_type != "code":
                continue
            if utils.is_grade(cell) and not utils.is_solution(cell):
                cell.outputs = [new_output("stream", name="stdout", text=summary(cell, language) + "\n")]
            else:
                cell.outputs = []
        return nb, resources


# --------------------------------------------------------------------------------------------- markup
TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "course_feedback"  # nbgrader's feedback page with sanitised markdown (module docstring)
MARKUP_TAGS = [
    *("a", "abbr", "b", "blockquote", "br", "code", "del", "div", "em", "hr", "i", "img", "kbd", "li", "ol", "p"),
    *("pre", "s", "span", "strong", "sub", "sup", "ul", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6"),
    *("table", "thead", "tbody", "tr", "th", "td", "caption"),
]


def _allowed_attribute(tag: str, name: str, value: str) -> bool:
    """Which attributes of the learner's markup stay (bleach then still checks the protocols of links)."""
    if name in ("title", "alt") or (name == "id" and tag in ("h1", "h2", "h3", "h4", "h5", "h6")):
        return True
    if tag == "a" and name == "href":
        return value.startswith("#") or value.lower().startswith(("http://", "https://", "mailto:"))
    if tag == "a" and name == "class":
        return value == "anchor-link"  # the heading's own link that markdown2html adds
    if tag in ("th", "td") and name == "align":
        return value in ("left", "center", "right")
    return False


_SANITIZER = SanitizeHTML(
    tags=MARKUP_TAGS,
    attributes=_allowed_attribute,
    strip=False,  # escaped, not dropped: the page shows what the learner wrote, as text
    strip_comments=True,
)


def sanitize_markup(html: str) -> str:
    """``html`` (a rendered markdown cell) through nbconvert's sanitizer with the tags and attributes above: the
    ``sanitize_markup`` filter of the course's feedback template."""
    return _SANITIZER.sanitize_html_tags(str(html))


# The filters the course's template uses (nbgrader_config.py hands them to nbconvert's HTMLExporter).
TEMPLATE_FILTERS = {"sanitize_markup": sanitize_markup, "heading": heading}

FEEDBACK_PREPROCESSORS = [GetGrades, RedactHiddenTests, ClearHiddenTests, CSSHTMLHeaderPreprocessor]
