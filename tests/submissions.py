"""Make learner submissions from a lesson's solved notebook: replace answer cells, strip metadata, etc.

Used by the lesson tests to build correct-but-different and wrong submissions without keeping whole notebooks
as fixtures: a submission is the reference notebook with some answer cells (found by nbgrader ``grade_id``)
rewritten.
"""

from __future__ import annotations

from pathlib import Path

import nbformat


def with_answers(notebook_path: str | Path, answers: dict[str, str], out_path: str | Path) -> Path:
    """Copy ``notebook_path`` to ``out_path`` with the answer cells named in ``answers`` replaced.

    ``answers`` maps a solution cell's nbgrader ``grade_id`` to the learner's code for that cell. Raises
    ``KeyError`` naming any grade id the notebook does not have, so a renamed cell cannot silently test nothing.
    """
    notebook = nbformat.read(notebook_path, as_version=4)
    remaining = dict(answers)
    for cell in notebook.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in remaining:
            cell.source = remaining.pop(grade_id)
            cell.outputs = [] if cell.cell_type == "code" else cell.get("outputs")
    if remaining:
        raise KeyError(f"no answer cells {sorted(remaining)} in {notebook_path}")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, out_path)
    return out_path
