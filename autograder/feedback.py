"""Feedback without hidden tests: neither their source, nor their tracebacks, nor their printed output.

``ClearHiddenTests`` (nbgrader) removes the hidden regions from the source of test cells, but the cells' outputs
(IPython's traceback prints the failing line and its neighbours, a hidden test may print) still show them.
``RedactHiddenTests`` runs first and:

* replaces the outputs of every test cell that has a hidden region by one line saying what happened, from the
  grader's record (``metadata.autograder``, written by ``execute.GuardedExecute``): passed; failed in a visible
  assertion (with its message, which the learner can already read in the release); failed in a hidden test
  (no detail); void (tampering, with the reason); not run (and why);
* removes, from the outputs of *every* cell, any output that quotes a line of a hidden test (learner code could
  print ``In`` or other traces of the tests into its own cells);
* removes hidden-test regions from cells that are not test cells (a learner pasting a solved test cell, or the
  markers alone, would otherwise make ``ClearHiddenTests`` fail the whole feedback).

The course configuration (``autograder/nbgrader_config.py``) puts ``FEEDBACK_PREPROCESSORS`` in
``GenerateFeedback.preprocessors``, so ``nbgrader generate_feedback`` behaves the same as ``grade.py``.
"""

from __future__ import annotations

import html
import json

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbformat.v4 import new_output
from nbgrader import utils
from nbgrader.preprocessors import ClearHiddenTests, GetGrades, NbGraderPreprocessor

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


def _output_text(output) -> str:
    parts = [output.get("text", ""), output.get("evalue", ""), *output.get("traceback", [])]
    parts += [v if isinstance(v, str) else json.dumps(v) for v in output.get("data", {}).values()]
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


def summary(cell) -> str:
    """One line about a test cell, from the grader's record."""
    record = cell.metadata.get(METADATA_KEY, {})
    status = record.get("status")
    if status == "passed":
        return "✔ The tests in this cell passed."
    if status == "void":
        return f"✘ This test was void: {record.get('reason')}"
    if status in ("not run", "missing"):
        return f"✘ Not run: {record.get('reason')}"
    if record.get("where") == "visible":
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            return f"✘ A test failed: {errors[-1].get('ename')}: {errors[-1].get('evalue')}"
    if record.get("reason") and record.get("where") is None:
        return f"✘ A test failed: {record['reason']}"
    return "✘ A hidden test failed."


class RedactHiddenTests(NbGraderPreprocessor):
    """Summarise hidden-test cells' outputs and drop any output that quotes a hidden test (module docstring)."""

    def preprocess(self, nb, resources):
        secrets: set[str] = set()
        visible = []
        for cell in nb.cells:
            secrets |= secrets_of(hidden_regions(cell.source))
            visible.append(_without_hidden(cell.source))
        visible_text = "\n".join(visible)
        secrets = {s for s in secrets if s not in visible_text}  # what the release shows is no secret
        escaped = {html.escape(s) for s in secrets}
        for cell in nb.cells:
            if not utils.is_grade(cell) and (HIDDEN_BEGIN in cell.source or HIDDEN_END in cell.source):
                # a learner's cell with the markers (a pasted test, or a bid to break ClearHiddenTests)
                cell.source = _without_hidden(cell.source).replace(HIDDEN_END, "")
            if cell.cell_type != "code":
                continue
            if utils.is_grade(cell) and HIDDEN_BEGIN in cell.source:
                cell.outputs = [new_output("stream", name="stdout", text=summary(cell) + "\n")]
                continue
            kept = []
            for output in cell.get("outputs", []):
                text = _output_text(output)
                if any(s in text for s in secrets) or any(s in text for s in escaped):
                    kept.append(new_output("stream", name="stdout", text="[output removed: it quoted a hidden test]\n"))
                else:
                    kept.append(output)
            cell.outputs = kept
        return nb, resources


FEEDBACK_PREPROCESSORS = [GetGrades, RedactHiddenTests, ClearHiddenTests, CSSHTMLHeaderPreprocessor]
