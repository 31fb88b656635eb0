"""Helpers for tests that build, validate and autograde lessons with nbgrader's Python API.

A lesson is a folder ``NAME/`` holding the jupytext source ``NAME/NAME.py`` (``source/NN_name/`` in the course,
or a fixture folder). Everything here works on copies in temporary folders: nothing in the working tree, and
no shared gradebook, is written. The heavy lifting is done by ``scripts/build_lessons.py`` (the code behind
``make lessons``), loaded here by path.

Typical use in a lesson's tests::

    from tests.nbgrader_tools import autograde_notebook, build_release, build_source, validate

    def test_reference_gets_full_marks(tmp_path):
        reference = build_source("01_splitting", tmp_path)          # the solved notebook
        scores = autograde_notebook("01_splitting", reference)
        assert all(score == max_score for score, max_score in scores.values()), scores

    def test_blank_release_gets_zero(tmp_path):
        blank = build_release("01_splitting", tmp_path)
        assert all(score == 0 for score, _ in autograde_notebook("01_splitting", blank).values())

nbgrader changes the working directory and ``os.environ`` while it runs: call these helpers from one thread
at a time (pytest's default).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOT = REPO / "source"
RELEASE_ROOT = REPO / "lessons"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _load_builder():
    name = "build_lessons"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "build_lessons.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


builder = _load_builder()
"""``scripts/build_lessons.py`` as a module (``builder.load_config()``, ``builder.main([...])``, ...)."""


def lesson_dir(assignment: str | Path) -> Path:
    """The folder of a lesson: a name under ``source/`` (``"01_splitting"``) or a path to a lesson folder."""
    path = Path(assignment)
    if path.is_dir():
        return path.resolve()
    candidate = SOURCE_ROOT / str(assignment)
    if builder.lesson_source(candidate).is_file():
        return candidate
    raise FileNotFoundError(f"no lesson {assignment!r}: expected {candidate}/{candidate.name}.py or a folder path")


EDITIONS = ("en", *builder.TRANSLATED_EDITIONS)


def machine_translation(text: str) -> str:
    """A Japanese stand-in for an English markdown cell (its heading level kept): what tests translate with where
    a lesson's catalogue has no current translation yet, so that they never depend on its completeness."""
    heading = re.match(r"#+ ", text)
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{heading.group(0) if heading else ''}テスト用の訳 {digest}: この段落は英語の段落の代わりです。"


def stand_in_catalogue(lesson: str | Path, edition: str = "ja") -> dict[str, str]:
    """``{English markdown: translation}`` for every markdown cell of a lesson: the lesson's own translation where
    it is current and reviewed, ``machine_translation`` elsewhere."""
    folder = lesson_dir(lesson)
    path = builder.translation_file(folder, edition)
    real = {}
    if path.is_file():
        entries = builder._read_po(path)
        real = {e.msgid: e.msgstr for e in entries if not e.obsolete and e.msgstr.strip() and "fuzzy" not in e.flags}
    return {text: real.get(text) or machine_translation(text) for _, text in builder.markdown_cells(folder)}


def write_catalogue(catalogue: dict[str, str], path: str | Path, edition: str = "ja") -> Path:
    """Write ``catalogue`` as a gettext file (as translators keep them: polib, no wrapping)."""
    import polib

    po = polib.POFile(wrapwidth=0)
    po.metadata = {"Language": edition, "Content-Type": "text/plain; charset=UTF-8"}
    for msgid, msgstr in catalogue.items():
        po.append(polib.POEntry(msgid=msgid, msgstr=msgstr))
    po.save(str(path))
    return Path(path)


def build_source(lesson: str | Path, out_dir: str | Path, edition: str = "en") -> Path:
    """Build a lesson's nbgrader *source* notebook (solutions and hidden tests) into ``out_dir/<name>/``.

    The folder also receives the lesson's other files (helper modules, data) but not its jupytext source.
    Returns the notebook's path, ``out_dir/<name>/<name>.ipynb``: the reference solution a test can validate or
    submit for grading. In a translated ``edition`` the markdown comes from ``stand_in_catalogue``.
    """
    folder = lesson_dir(lesson)
    path = builder.stage_lesson(folder, out_dir)
    if edition != "en":
        builder.build_translated_source(folder, path, edition, stand_in_catalogue(folder, edition))
    return path


def build_release(lesson: str | Path, out_dir: str | Path, edition: str = "en") -> Path:
    """Generate a lesson's learner version with nbgrader into ``out_dir/<name>/``, as ``make lessons`` does.

    ``out_dir`` plays the role of ``lessons/``. ``lesson`` is a name under ``source/`` or a lesson folder. Uses
    a throw-away gradebook. Returns the release notebook's path, ``out_dir/<name>/<name>.ipynb``; in a translated
    ``edition`` (markdown from ``stand_in_catalogue``) ``out_dir/<edition>/<name>/<name>.ipynb``.
    """
    folder = lesson_dir(lesson)
    if edition == "en":
        return builder.generate_release(folder, out_dir) / f"{folder.name}.ipynb"
    with tempfile.TemporaryDirectory(prefix=f"english-{folder.name}-") as tmp:
        english = builder.generate_release(folder, Path(tmp))
        catalogue = stand_in_catalogue(folder, edition)
        return builder.generate_translation(folder, english, out_dir, edition, catalogue) / f"{folder.name}.ipynb"


def autograde_notebook(
    assignment: str | Path, notebook_path: str | Path, student: str = "s1"
) -> dict[str, tuple[float | None, float]]:
    """Autograde one submitted notebook in an isolated, temporary course; return ``{grade_id: (score, max)}``.

    ``assignment`` is a lesson name under ``source/`` or a path to a lesson folder. The temporary course gets
    the staged source (built notebook and the lesson's other files, never the jupytext source) and a fresh
    gradebook; ``generate_assignment`` records the assignment in it, the submission is copied to
    ``submitted/<student>/<assignment>/<name>.ipynb``, and nbgrader's ``autograde`` runs through the Python API
    with the course's configuration (``autograder/nbgrader_config.py``: kernel ``python3``, 120 s per cell).
    Scores come from the gradebook, in the notebook's cell order; ``score`` is ``None`` for a cell that needs
    manual grading. ``notebook_path`` itself is never modified. Raises ``RuntimeError`` with nbgrader's log if
    autograding fails as a whole (a failing cell only costs its points).
    """
    from nbgrader.api import Gradebook

    from tests.pipeline_checks import FIXTURE_CHECK_MODULES

    folder = lesson_dir(assignment)
    name = folder.name
    with tempfile.TemporaryDirectory(prefix=f"autograde-{name}-") as tmp:
        course = Path(tmp)
        source_nb = builder.stage_lesson(folder, course / "source")
        config = builder.generate_in_course(course, name)
        config.SandboxedExecute.check_modules = FIXTURE_CHECK_MODULES  # the test lessons' checks
        notebooks = {p.name for p in source_nb.parent.glob("*.ipynb")}
        target = Path(notebook_path).name if Path(notebook_path).name in notebooks else source_nb.name
        submitted = course / "submitted" / student / name
        submitted.mkdir(parents=True)
        shutil.copyfile(notebook_path, submitted / target)
        try:
            builder.run_nbgrader("autograde", config, name, student, create_student=True)
        except builder.BuildError as error:
            raise RuntimeError(f"autograde of {notebook_path} failed: {error}") from None
        order = [cell_id for cell_id, _ in graded_cells(source_nb)]
        with Gradebook(config.CourseDirectory.db_url) as gradebook:
            notebook = gradebook.find_submission_notebook(Path(target).stem, name, student)
            scores = {grade.name: (grade.score, grade.max_score) for grade in notebook.grades}
    return {grade_id: scores[grade_id] for grade_id in sorted(scores, key=_position(order))}


def _position(order: list[str]):
    return lambda grade_id: (order.index(grade_id) if grade_id in order else len(order), grade_id)


@dataclass
class ValidationResult:
    """What ``nbgrader validate`` found, from ``nbgrader.validator.Validator.validate``.

    ``details`` is nbgrader's dictionary; each key present lists cells (dicts with ``source``, and ``error`` /
    ``raw_error`` for failures): ``type_changed`` (a cell's type changed), ``changed`` (a locked cell was
    edited: checksum mismatch), ``failed`` (a graded test did not get full marks; without ``invert``),
    ``passed`` (a graded test got full marks; with ``invert``).
    """

    path: Path
    invert: bool
    details: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Success as ``nbgrader validate`` reports it: every test passes (with ``invert``: none passes)."""
        return not any(self.details.values())

    def __str__(self) -> str:
        mode = "validate --invert" if self.invert else "validate"
        if self.ok:
            return f"{mode} {self.path}: ok"
        lines = [f"{mode} {self.path}:"]
        for kind, cells in self.details.items():
            for cell in cells:
                lines.append(f"  [{kind}] {cell['source'].splitlines()[0] if cell['source'] else ''}")
                if cell.get("raw_error"):
                    lines.append("      " + cell["raw_error"].strip().replace("\n", "\n      ")[-2000:])
        return "\n".join(lines)


def validate(notebook_path: str | Path, invert: bool = False) -> ValidationResult:
    """Run nbgrader's validator on a notebook, through the Python API, with the course's configuration.

    The notebook runs in its own folder with kernel ``python3`` (``ExecutePreprocessor.kernel_name`` from
    ``autograder/nbgrader_config.py``, whatever kernelspec the file names), i.e. this environment's interpreter.
    ``invert=True`` is ``nbgrader validate --invert``: success means no graded test passes (for a blank
    release). The notebook file is not modified.
    """
    from nbgrader.validator import Validator

    builder.ensure_scripts_on_path()
    path = Path(notebook_path).resolve()
    validator = Validator(config=builder.load_config(), invert=invert)
    return ValidationResult(path=path, invert=invert, details=validator.validate(str(path)))


def graded_cells(notebook_path: str | Path) -> list[tuple[str, float]]:
    """``[(grade_id, points), ...]`` of the graded cells of a notebook, in order."""
    import nbformat

    nb = nbformat.read(Path(notebook_path), as_version=4)
    cells = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            cells.append((meta["grade_id"], float(meta.get("points", 0))))
    return cells


_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


def _regions(source: str, begin: str, end: str) -> tuple[set[str], set[str]]:
    """Split a cell's stripped, non-empty lines into (inside begin/end regions, outside them)."""
    inside, outside, depth = set(), set(), 0
    for line in source.splitlines():
        text = line.strip()
        if begin in text:
            depth += 1
            continue
        if end in text:
            depth = max(depth - 1, 0)
            continue
        if text:
            (inside if depth else outside).add(text)
    return inside, outside


def find_leaks(source_path: str | Path, release_path: str | Path) -> list[str]:
    """Solution code or hidden tests of a source notebook that appear in its release; ``[]`` when clean.

    Checks that no nbgrader delimiter (``### BEGIN SOLUTION``, ``### BEGIN HIDDEN TESTS``, ...) is left in any
    release cell, and that, cell by cell (matched by ``grade_id``), no line of a solution region (the whole cell
    for a solution cell without delimiters) or of a hidden-test region reappears in the release, unless the
    same line is also visible outside those regions in the source cell.
    """
    import nbformat

    source = nbformat.read(Path(source_path), as_version=4)
    release = nbformat.read(Path(release_path), as_version=4)
    leaks = []
    released = {}
    for index, cell in enumerate(release.cells):
        for marker in _MARKERS:
            if marker in cell.source:
                leaks.append(f"release cell {index} ({cell.get('id')}) still contains {marker!r}")
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id:
            released[grade_id] = {line.strip() for line in cell.source.splitlines() if line.strip()}
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id")
        if not grade_id:
            continue
        secret: set[str] = set()
        visible: set[str] = set()
        if meta.get("solution"):
            inside, outside = _regions(cell.source, "BEGIN SOLUTION", "END SOLUTION")
            if "BEGIN SOLUTION" in cell.source:
                secret |= inside
                visible |= outside
            else:
                secret |= inside | outside
        if meta.get("grade"):
            inside, outside = _regions(cell.source, "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
            secret |= inside
            visible |= outside
        for line in sorted((secret - visible) & released.get(grade_id, set())):
            leaks.append(f"cell {grade_id!r}: release shows {line!r}")
    return leaks
