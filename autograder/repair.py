"""Re-attach lost nbgrader metadata to a submission by aligning its cells with the release.

nbgrader grades a cell only through its metadata (``metadata.nbgrader.grade_id``). A notebook saved by Colab, an
editor or a tool that drops unknown metadata loses it, and nbgrader then scores it 0 without a word. Learners
can also edit the metadata (turn a test into a solution cell, rename a grade id, duplicate a cell).

``repair(submission, release)`` leaves an intact notebook alone and otherwise rebuilds the metadata from the
release:

1. align the submission's cells with the release's by content: the best monotone alignment (dynamic
   programming) where an identical cell scores highest, a fixed cell (markdown, code, tests) may match an edited
   copy whose lines are at least ``FUZZY`` similar, and an answer cell matches the learner's cell in its place
   (more so when it still defines the function the stub defines);
2. copy the release's nbgrader metadata onto each matched cell and remove it from every other cell (so stray,
   duplicated or forged metadata counts for nothing);
3. re-insert every autograded test cell the submission lost (nbgrader then restores hidden tests in it);
4. refuse (``RepairError``, with the reason) when fewer than ``MIN_FIXED_MATCHED`` of the release's fixed cells
   can be found: the notebook is then not this lesson, and saying so beats a silent zero.

The submission itself is never modified: the result is a new notebook.

A lesson has editions (English, and its translations under ``lessons/ja/``) with the same code cells, graded cells
and nbgrader metadata but other markdown. ``edition_of(submission, releases)`` tells which one a submission was
made from: the edition its metadata declares (``metadata.gpulab.edition``, written by the build), else, for a
notebook whose metadata was lost (Colab), the edition whose markdown cells it shares most. ``repair`` then aligns
it with that edition's release.
"""

from __future__ import annotations

import copy
import difflib
import re
from dataclasses import dataclass, field

import nbformat

FUZZY = 0.6
MIN_FIXED_MATCHED = 0.5
NBGRADER_FLAGS = ("grade", "solution", "locked", "points", "grade_id")


class RepairError(Exception):
    """The submission cannot be matched to the release; the message says why."""


@dataclass
class RepairResult:
    notebook: nbformat.NotebookNode
    notes: list[str] = field(default_factory=list)

    @property
    def repaired(self) -> bool:
        return bool(self.notes)


def _meta(cell) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def _lines(source: str) -> list[str]:
    lines = [line.rstrip() for line in source.replace("\r\n", "\n").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _is_answer(cell) -> bool:
    return bool(_meta(cell).get("solution"))


def _is_test(cell) -> bool:
    meta = _meta(cell)
    return bool(meta.get("grade")) and not meta.get("solution")


def problems(submission, release) -> list[str]:
    """Why the submission's nbgrader metadata does not match the release's (``[]``: intact)."""
    found = []
    wanted = {_meta(c)["grade_id"]: c for c in release.cells if _meta(c).get("grade_id")}
    seen: dict[str, int] = {}
    for cell in submission.cells:
        grade_id = _meta(cell).get("grade_id")
        if grade_id is None:
            continue
        seen[grade_id] = seen.get(grade_id, 0) + 1
        if grade_id not in wanted:
            found.append(f"cell with unknown grade id {grade_id!r}")
            continue
        reference = wanted[grade_id]
        if cell.cell_type != reference.cell_type:
            found.append(f"cell {grade_id!r} changed type")
        for flag in NBGRADER_FLAGS:
            if _meta(cell).get(flag) != _meta(reference).get(flag):
                found.append(f"cell {grade_id!r} has a different {flag!r}")
                break
    for grade_id in wanted:
        if seen.get(grade_id, 0) == 0:
            found.append(f"cell {grade_id!r} is missing")
        elif seen[grade_id] > 1:
            found.append(f"cell {grade_id!r} appears {seen[grade_id]} times")
    return found


_DEF = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)|^\s*([A-Za-z_]\w*)\s*=", re.MULTILINE)


def _defined_names(source: str) -> set[str]:
    return {a or b for a, b in _DEF.findall(source)}


class _Scorer:
    def __init__(self, release_cells, submission_cells):
        self.release = [(c.cell_type, _lines(c.source), c) for c in release_cells]
        self.submission = [(c.cell_type, _lines(c.source), c) for c in submission_cells]
        self.release_names = [_defined_names(c.source) if _is_answer(c) else set() for c in release_cells]

    def score(self, i: int, j: int) -> float | None:
        """How well release cell ``i`` matches submission cell ``j`` (``None``: not at all)."""
        r_type, r_lines, r_cell = self.release[i]
        s_type, s_lines, s_cell = self.submission[j]
        if r_type != s_type:
            return None
        if r_lines == s_lines:
            return 3.0 if r_lines else 0.1
        if _is_answer(r_cell):
            names = self.release_names[i]
            defines = names and names <= _defined_names(s_cell.source)
            return 1.0 + (1.0 if defines else 0.0) + _ratio(r_lines, s_lines)
        if not r_lines or not s_lines:
            return None
        ratio = _ratio(r_lines, s_lines)
        return ratio * 2 if ratio >= FUZZY else None


def _ratio(a: list[str], b: list[str]) -> float:
    """Similarity of release lines ``a`` to submission lines ``b``: the larger of difflib's ratio and the share of
    ``a`` found in ``b`` in order (a solved copy's test cell also holds the hidden tests)."""
    if not a or not b:
        return 0.0
    if len(set(a) & set(b)) < FUZZY * len(set(a)):  # cheap bound: too few of a's lines appear in b at all
        return 0.0
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    covered = sum(block.size for block in matcher.get_matching_blocks()) / len(a)
    return max(matcher.ratio(), covered)


def align(release_cells, submission_cells) -> dict[int, int]:
    """The best monotone matching ``release index -> submission index`` (dynamic programming)."""
    scorer = _Scorer(release_cells, submission_cells)
    n, m = len(release_cells), len(submission_cells)
    best = [[0.0] * (m + 1) for _ in range(n + 1)]
    move = [[0] * (m + 1) for _ in range(n + 1)]  # 0: skip release, 1: skip submission, 2: match
    for i in range(1, n + 1):
        row, previous = best[i], best[i - 1]
        for j in range(1, m + 1):
            value, how = previous[j], 0
            if row[j - 1] > value:
                value, how = row[j - 1], 1
            score = scorer.score(i - 1, j - 1)
            if score is not None and previous[j - 1] + score > value:
                value, how = previous[j - 1] + score, 2
            row[j], move[i][j] = value, how
    pairs = {}
    i, j = n, m
    while i > 0 and j > 0:
        how = move[i][j]
        if how == 2:
            pairs[i - 1] = j - 1
            i, j = i - 1, j - 1
        elif how == 1:
            j -= 1
        else:
            i -= 1
    return pairs


def repair(submission, release, assignment: str = "the lesson") -> RepairResult:
    """A copy of ``submission`` whose nbgrader metadata matches ``release`` (module docstring)."""
    submission = copy.deepcopy(submission)
    if not submission.cells or not any(c.source.strip() for c in submission.cells):
        raise RepairError("the notebook is empty")
    found = problems(submission, release)
    kernelspec = release.metadata.get("kernelspec")
    if kernelspec and submission.metadata.get("kernelspec") != kernelspec:
        submission.metadata["kernelspec"] = copy.deepcopy(kernelspec)
    if not found:
        return RepairResult(submission)
    pairs = align(release.cells, submission.cells)
    fixed = [i for i, c in enumerate(release.cells) if not _is_answer(c) and c.source.strip()]
    matched_fixed = sum(1 for i in fixed if i in pairs)
    if fixed and matched_fixed < MIN_FIXED_MATCHED * len(fixed):
        raise RepairError(
            f"its cells do not match {assignment}: only {matched_fixed} of the {len(fixed)} fixed cells of the "
            "release were found (is it the right notebook?)"
        )
    by_submission = {j: i for i, j in pairs.items()}
    notes = [f"nbgrader metadata re-attached from the release ({found[0]}{'; ...' if len(found) > 1 else ''})"]
    for j, cell in enumerate(submission.cells):
        cell.setdefault("metadata", {})
        cell.metadata.pop("nbgrader", None)
        i = by_submission.get(j)
        if i is not None and _meta(release.cells[i]):
            cell.metadata["nbgrader"] = copy.deepcopy(release.cells[i].metadata["nbgrader"])
            for key in ("deletable", "editable"):
                if key in release.cells[i].metadata:
                    cell.metadata[key] = release.cells[i].metadata[key]
    # re-insert lost test cells after the submission cell matched to the closest release cell before them
    cells = list(submission.cells)
    inserted = []
    for i, reference in enumerate(release.cells):
        if i in pairs or not _is_test(reference):
            continue
        anchor = max((k for k in pairs if k < i), default=None)
        new = copy.deepcopy(reference)
        if new.cell_type == "code":
            new.outputs, new.execution_count = [], None
        position = 0 if anchor is None else cells.index(submission.cells[pairs[anchor]]) + 1
        while position < len(cells) and any(cells[position] is c for c in inserted):
            position += 1
        cells.insert(position, new)
        inserted.append(new)
        pairs[i] = -1
        notes.append(f"test cell {_meta(reference)['grade_id']!r} was missing and was put back")
    for i, reference in enumerate(release.cells):
        if _is_answer(reference) and i not in pairs:
            notes.append(f"no answer found for {_meta(reference)['grade_id']!r}")
    submission.cells = cells
    _ensure_cell_ids(submission)
    return RepairResult(submission, notes)


def _ensure_cell_ids(nb) -> None:
    """nbformat 4.5 with a unique id on every cell (Colab saves 4.0 without ids; release cells bring theirs)."""
    nb.nbformat, nb.nbformat_minor = 4, max(5, nb.get("nbformat_minor", 0))
    taken: set[str] = set()
    for index, cell in enumerate(nb.cells):
        cell_id = cell.get("id")
        if not isinstance(cell_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", cell_id) or cell_id in taken:
            cell_id = f"cell-{index}"
            while cell_id in taken:
                cell_id += "x"
        cell["id"] = cell_id
        taken.add(cell_id)


def declared_edition(nb) -> str | None:
    """The edition a notebook's metadata declares (``metadata.gpulab.edition``), if any."""
    declared = nb.get("metadata", {}).get("gpulab")
    edition = declared.get("edition") if isinstance(declared, dict) else None
    return edition if isinstance(edition, str) else None


def edition_of(submission, releases: dict[str, nbformat.NotebookNode]) -> str:
    """Which of a lesson's ``releases`` (edition -> release notebook, English first) the submission was made
    from: the one its metadata declares, else the one whose markdown cells it holds most of (English on a tie)."""
    declared = declared_edition(submission)
    if declared in releases:
        return declared
    texts = {tuple(_lines(c.source)) for c in submission.cells if c.cell_type == "markdown" and c.source.strip()}

    def shared(release) -> int:
        return sum(1 for c in release.cells if c.cell_type == "markdown" and tuple(_lines(c.source)) in texts)

    return max(releases, key=lambda edition: (shared(releases[edition]), edition == "en"))


def read_notebook(path) -> nbformat.NotebookNode:
    """Read a submitted notebook (any nbformat 4 minor); ``RepairError`` if it is not a notebook."""
    try:
        return nbformat.read(str(path), as_version=4)
    except Exception as error:  # noqa: BLE001 - any reason makes it unreadable
        raise RepairError(f"not a readable notebook ({type(error).__name__}: {error})") from None
