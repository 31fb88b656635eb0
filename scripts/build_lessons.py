"""Build the learner notebooks in ``lessons/`` from the jupytext sources in ``source/``.

Each lesson is a folder ``source/NN_name/`` holding ``NN_name.py``: a jupytext *percent* file with nbgrader's
cell metadata as JSON in the ``# %%`` headers, e.g. ``# %% nbgrader={"grade": true, "grade_id": ...}``.
For every lesson this script

1. builds ``source/NN_name/NN_name.ipynb`` (git-ignored) from ``NN_name.py``, deterministically: cell ids
   derived from the nbgrader ``grade_id`` (else from the cell's content), kernelspec ``python3``, only
   meaningful metadata kept, nbformat's canonical JSON;
2. runs nbgrader's ``generate_assignment`` through its Python API, with the course configuration
   (``autograder/nbgrader_config.py``) pointed at a staging copy of the course (the lesson folder without its
   jupytext source, a throw-away gradebook), and replaces ``lessons/NN_name/`` with the result.

Rebuilding an unchanged source changes no byte of ``lessons/``.

Every lesson notebook (source and release) also gets the *install cell*, ``source/install_gpulab.py`` with the
repository's address (``[project.urls] Repository`` in ``pyproject.toml``) filled in, right before its set-up
cell (the first code cell that imports gpulab). On Colab or Kaggle it installs gpulab from the repository; where
gpulab is installed it does nothing. It is a plain code cell, collapsed (``jupyter.source_hidden``; Colab shows
its ``# @title`` line as a form), never graded.

Usage (from any directory)::

    python scripts/build_lessons.py                  # every lesson (also removes lessons/ folders with no source)
    python scripts/build_lessons.py 01_splitting     # only these lessons
    python scripts/build_lessons.py --check          # exit 1, listing lessons whose release is out of date
    python scripts/build_lessons.py --check 01_splitting

Exit status: 0 done / up to date, 1 ``--check`` found differences, 2 a lesson failed to build.
``make lessons`` runs the first form (``make lessons LESSONS=01_splitting`` the second), ``make check-lessons``
the third. The functions here (``load_config``, ``build_source_notebook``, ``stage_lesson``,
``generate_release``, ``register_assignment``, ``run_nbgrader``) are also used by the tests and grading tools.
"""

from __future__ import annotations

import argparse
import atexit
import filecmp
import fnmatch
import hashlib
import json
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG_FILE = REPO / "autograder" / "nbgrader_config.py"
SOURCE_ROOT = REPO / "source"
RELEASE_ROOT = REPO / "lessons"
PYPROJECT = REPO / "pyproject.toml"
INSTALL_CELL_TEMPLATE = SOURCE_ROOT / "install_gpulab.py"
REPOSITORY_PLACEHOLDER = "{repository}"
# The install cell: collapsed in JupyterLab and Notebook, a form showing only its `# @title` line on Colab.
INSTALL_CELL_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}}
_IMPORTS_GPULAB = re.compile(r"^\s*(?:import|from)\s+gpulab\b", re.MULTILINE)

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
NOTEBOOK_METADATA = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
# Cell metadata worth keeping in a notebook; jupytext's own keys (lines_to_next_cell, title, ...) are dropped.
KEPT_CELL_METADATA = (
    "nbgrader",
    "tags",
    "deletable",
    "editable",
    "slideshow",
    "jupyter",
    "collapsed",
    "scrolled",
    "cellView",
)
# Files of a lesson folder that never reach a staging copy (besides the jupytext source and the built notebook).
IGNORED_FILES = (".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*")

_CELL_ID_INVALID = re.compile(r"[^A-Za-z0-9_-]+")


class BuildError(RuntimeError):
    """A lesson could not be built; the message carries nbgrader's log."""


# --------------------------------------------------------------------------------------------- configuration
def load_config(config_file: Path | str = CONFIG_FILE, **course_directory: str):
    """Load the course's nbgrader configuration (``autograder/nbgrader_config.py``) as a traitlets ``Config``.

    nbgrader itself only looks for ``nbgrader_config.py`` in the working directory; loading the file explicitly
    makes every script independent of where it runs. Keyword arguments override ``CourseDirectory`` options,
    e.g. ``load_config(root="/tmp/course", db_url="sqlite:////tmp/course/gradebook.db")``.
    """
    from traitlets.config.loader import PyFileConfigLoader

    config_file = Path(config_file).resolve()
    config = PyFileConfigLoader(config_file.name, path=str(config_file.parent)).load_config()
    for key, value in course_directory.items():
        setattr(config.CourseDirectory, key, str(value))
    return config


# --------------------------------------------------------------------------------------------- the repository
def repository_url(pyproject: Path | str = PYPROJECT) -> str:
    """The repository's address, ``[project.urls] Repository`` in ``pyproject.toml``: the one place it is written."""
    import tomllib

    urls = tomllib.loads(Path(pyproject).read_text(encoding="utf-8"))["project"].get("urls", {})
    if "Repository" not in urls:
        raise BuildError(f"{pyproject} declares no [project.urls] Repository")
    return urls["Repository"].rstrip("/")


def install_cell_source(repository: str | None = None) -> str:
    """The install cell's code: ``source/install_gpulab.py`` with the repository's address filled in."""
    template = INSTALL_CELL_TEMPLATE.read_text(encoding="utf-8")
    if template.count(REPOSITORY_PLACEHOLDER) != 1:
        raise BuildError(f"{INSTALL_CELL_TEMPLATE} must hold {REPOSITORY_PLACEHOLDER} exactly once")
    return template.replace(REPOSITORY_PLACEHOLDER, repository or repository_url()).rstrip("\n")


def add_install_cell(nb, repository: str | None = None) -> bool:
    """Insert the install cell before the notebook's set-up cell (its first code cell importing gpulab).

    Returns whether it did: a notebook that never imports gpulab gets no install cell.
    """
    import nbformat

    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and _IMPORTS_GPULAB.search(cell.source):
            metadata = json.loads(json.dumps(INSTALL_CELL_METADATA))
            nb.cells.insert(index, nbformat.v4.new_code_cell(install_cell_source(repository), metadata=metadata))
            return True
    return False


# --------------------------------------------------------------------------------------------- lessons
def lesson_source(lesson_dir: Path | str) -> Path:
    """The jupytext source of a lesson folder: ``<folder>/<folder name>.py``."""
    lesson_dir = Path(lesson_dir)
    return lesson_dir / f"{lesson_dir.name}.py"


def find_lessons(source_root: Path | str = SOURCE_ROOT) -> dict[str, Path]:
    """Every lesson under ``source_root``, by name, sorted: folders ``NAME`` that hold ``NAME/NAME.py``."""
    source_root = Path(source_root)
    if not source_root.is_dir():
        return {}
    return {d.name: d for d in sorted(source_root.iterdir()) if d.is_dir() and lesson_source(d).is_file()}


def _cell_id(cell, taken: set[str]) -> str:
    """A valid nbformat cell id (``[A-Za-z0-9_-]{1,64}``), stable across builds and unique in the notebook.

    A graded or solution cell is named after its nbgrader ``grade_id`` (so graders and tools can find it by id);
    any other cell after a hash of its type and text, so inserting a cell does not rename all the cells after
    it (no churn in the committed ``lessons/``). Repeats get ``-2``, ``-3``, ... in order.
    """
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
    base = _CELL_ID_INVALID.sub("-", str(grade_id)).strip("-")[:56] if grade_id else ""
    if not base:
        digest = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:10]
        base = f"cell-{digest}"
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    taken.add(candidate)
    return candidate


def notebook_from_source(py_path: Path | str):
    """Read a jupytext percent file and return the normalised notebook (an ``nbformat.NotebookNode``).

    The install cell (``add_install_cell``) goes before the set-up cell. Normalised means: nbformat 4.5; notebook
    metadata exactly ``NOTEBOOK_METADATA`` (kernelspec ``python3``; no jupytext version or pairing information);
    each cell's metadata reduced to ``KEPT_CELL_METADATA``; no outputs or execution counts; cell ids derived from
    the nbgrader ``grade_id`` when the cell has one, else ``cell-<hash of its content>`` (see ``_cell_id``). The
    same source always gives the same notebook.
    """
    import jupytext
    import nbformat

    nb = jupytext.read(Path(py_path), fmt="py:percent")
    add_install_cell(nb)
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata = nbformat.from_dict(json.loads(json.dumps(NOTEBOOK_METADATA)))
    # grade_ids first, so another cell's id can never take a grade_id's name
    taken: set[str] = set()
    ids = {}
    for index, cell in enumerate(nb.cells):
        if cell.metadata.get("nbgrader", {}).get("grade_id"):
            ids[index] = _cell_id(cell, taken)
    for index, cell in enumerate(nb.cells):
        if index not in ids:
            ids[index] = _cell_id(cell, taken)
    cells = []
    for index, cell in enumerate(nb.cells):
        metadata = {key: cell.metadata[key] for key in KEPT_CELL_METADATA if key in cell.metadata}
        source = cell.source
        if cell.cell_type == "code":
            new = nbformat.v4.new_code_cell(source=source, metadata=metadata)
        elif cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(source=source, metadata=metadata)
        else:
            new = nbformat.v4.new_raw_cell(source=source, metadata=metadata)
        new.id = ids[index]
        cells.append(new)
    nb.cells = cells
    nbformat.validate(nb)
    return nb


def notebook_bytes(nb) -> bytes:
    """nbformat's canonical JSON (sorted keys, indent 1, UTF-8, trailing newline)."""
    import nbformat

    text = nbformat.writes(nb, version=4)
    return (text if text.endswith("\n") else text + "\n").encode("utf-8")


def write_if_changed(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` unless it already holds exactly these bytes; return whether it wrote."""
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def build_source_notebook(lesson_dir: Path | str, notebook_path: Path | str | None = None) -> Path:
    """Build the nbgrader *source* notebook of a lesson from its jupytext file.

    Writes ``notebook_path`` (default ``<lesson_dir>/<name>.ipynb``, the git-ignored build artefact) only when
    its bytes change, and returns its path.
    """
    lesson_dir = Path(lesson_dir)
    if notebook_path is None:
        notebook_path = lesson_dir / f"{lesson_dir.name}.ipynb"
    notebook_path = Path(notebook_path)
    write_if_changed(notebook_path, notebook_bytes(notebook_from_source(lesson_source(lesson_dir))))
    return notebook_path


def _ignored(name: str, lesson_name: str, top_level: bool) -> bool:
    if top_level and name in (f"{lesson_name}.py", f"{lesson_name}.ipynb"):
        return True
    return any(fnmatch.fnmatch(name, pattern) for pattern in IGNORED_FILES)


def stage_lesson(lesson_dir: Path | str, dest_root: Path | str) -> Path:
    """Copy a lesson into ``dest_root/<name>/`` as nbgrader should see it, and return the notebook's path.

    The copy holds the freshly built ``<name>.ipynb`` and the lesson's other files (helper modules, data), but
    never the jupytext source (it contains the solutions and hidden tests), a stale built notebook, caches or
    hidden files. ``dest_root/<name>/`` is replaced if it exists.
    """
    lesson_dir = Path(lesson_dir).resolve()
    name = lesson_dir.name
    if not lesson_source(lesson_dir).is_file():
        raise BuildError(f"{lesson_dir} has no jupytext source {name}.py")
    dest = Path(dest_root) / name
    if dest.exists():
        shutil.rmtree(dest)

    def ignore(directory: str, names: list[str]) -> list[str]:
        top = Path(directory).resolve() == lesson_dir
        return [n for n in names if _ignored(n, name, top)]

    shutil.copytree(lesson_dir, dest, ignore=ignore)
    return build_source_notebook(lesson_dir, dest / f"{name}.ipynb")


def ensure_scripts_on_path() -> None:
    """Put this interpreter's scripts folder (e.g. ``.venv/bin``) first on ``PATH``.

    nbgrader creates a new gradebook by running the ``alembic`` *command* found on ``PATH``; a script started
    as ``.venv/bin/python ...`` without activating the venv would otherwise fail with
    ``FileNotFoundError: 'alembic'`` (or use another environment's alembic).
    """
    scripts = sysconfig.get_path("scripts")
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != scripts:
        os.environ["PATH"] = os.pathsep.join([scripts, path]) if path else scripts


_BLANK_GRADEBOOK: list[Path] = []


def new_gradebook(path: Path | str) -> str:
    """Create an empty gradebook at ``path`` and return its ``db_url`` (with ``?timeout=30``).

    nbgrader stamps a new gradebook by running ``alembic heads`` in a subprocess, which costs ~2 s; here that
    happens once per process (a blank template gradebook) and each new gradebook is a copy of the template.
    """
    from nbgrader.api import Gradebook

    if not _BLANK_GRADEBOOK:
        ensure_scripts_on_path()
        folder = Path(tempfile.mkdtemp(prefix="blank-gradebook-"))
        atexit.register(shutil.rmtree, folder, True)
        with Gradebook(f"sqlite:///{folder / 'gradebook.db'}"):
            pass
        _BLANK_GRADEBOOK.append(folder / "gradebook.db")
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_BLANK_GRADEBOOK[0], path)
    return f"sqlite:///{path}?timeout=30"


NBGRADER_STEPS = ("generate_assignment", "autograde", "generate_feedback")


def run_nbgrader(step: str, config, assignment: str, student: str | None = None, **options) -> str:
    """Run one nbgrader step through its Python API and return its log; raise ``BuildError`` if it fails.

    ``step`` is ``"generate_assignment"``, ``"autograde"`` or ``"generate_feedback"``; ``config`` a traitlets
    ``Config`` (``load_config(...)``) whose ``CourseDirectory`` says where the course and gradebook are. This
    is what ``nbgrader.apps.NbGraderAPI.<step>`` does (converter, ``force=True``, log captured), minus the
    exchange that ``NbGraderAPI()`` probes on creation (it logs CRITICAL "Unwritable directory ... exchange"
    in a course, like this one, that has none). ``options`` set converter traits, e.g. ``create_student=True``.
    A failing *cell* is not a failure here: it only costs its points.
    """
    from nbgrader.converters import Autograde, GenerateAssignment, GenerateFeedback
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.utils import capture_log

    converters = dict(zip(NBGRADER_STEPS, (GenerateAssignment, Autograde, GenerateFeedback), strict=True))
    ensure_scripts_on_path()
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id = assignment
    if student is not None:
        coursedir.student_id = student
    converter = converters[step](coursedir=coursedir, config=config)
    converter.force = True
    for key, value in options.items():
        setattr(converter, key, value)
    with warnings.catch_warnings():
        # nbgrader 0.9.6's Gradebook.add_submission (autograde) builds rows through SQLAlchemy backrefs before
        # adding them to the session; SQLAlchemy 2.0 warns (SAWarning "Object of type <SubmittedAssignment> not in
        # session, add operation along ... will not proceed"). Harmless: nbgrader adds the rows right after.
        warnings.filterwarnings("ignore", message=r".*not in session, add operation along")
        result = capture_log(converter)
    if not result.get("success"):
        who = f" for {student}" if student else ""
        raise BuildError(f"nbgrader {step} {assignment}{who} failed:\n{result.get('log', '')}{result.get('error', '')}")
    return result.get("log", "")


def course_config(course_root: Path | str, db_url: str | None = None):
    """The course configuration pointed at another course root (and gradebook), e.g. a temporary one.

    Without ``db_url`` the gradebook is ``<course_root>/gradebook.db``, created empty if missing.
    """
    course_root = Path(course_root).resolve()
    if db_url is None:
        gradebook = course_root / "gradebook.db"
        db_url = f"sqlite:///{gradebook}?timeout=30" if gradebook.exists() else new_gradebook(gradebook)
    return load_config(root=course_root, db_url=db_url)


def generate_in_course(course_root: Path | str, name: str, config=None):
    """Run nbgrader ``generate_assignment`` for assignment ``name`` of the course at ``course_root``.

    ``course_root/source/<name>/`` must already be staged (``stage_lesson``). The release lands in
    ``course_root/lessons/<name>/`` and the assignment (its notebooks, graded cells and their source) is recorded
    in the gradebook, which autograding needs. ``config`` defaults to ``course_config(course_root)``. Returns
    the config used, for the steps that follow (``run_nbgrader("autograde", config, name, student)``).
    """
    if config is None:
        config = course_config(course_root)
    run_nbgrader("generate_assignment", config, name, create_assignment=True)
    return config


def register_assignment(name: str, config=None) -> None:
    """Record lesson ``name`` in a course's gradebook, as ``autograde`` requires, without touching ``lessons/``.

    Autograding needs the assignment's notebooks, graded cells and their source in the gradebook, and only
    ``generate_assignment`` puts them there. This builds ``source/<name>/<name>.ipynb`` and runs
    ``generate_assignment`` against the course's gradebook with the release redirected to a temporary folder.
    ``config`` defaults to the course's configuration (repo root, ``gradebook.db``). Safe to repeat; nbgrader
    refuses (``BuildError``) to drop a notebook from an assignment that already has submissions.
    """
    import copy

    config = copy.deepcopy(config) if config is not None else load_config()
    root = Path(config.CourseDirectory.root)
    build_source_notebook(root / config.CourseDirectory.source_directory / name)
    with tempfile.TemporaryDirectory(prefix=f"register-{name}-") as tmp:
        config.CourseDirectory.release_directory = tmp  # absolute: nbgrader's os.path.join drops the root
        run_nbgrader("generate_assignment", config, name, create_assignment=True)


def generate_release(lesson_dir: Path | str, release_root: Path | str) -> Path:
    """Generate the learner version of one lesson into ``release_root/<name>/`` and return that folder.

    Works on a staging course in a temporary directory (throw-away gradebook), so neither the lesson folder nor
    any gradebook is touched; then replaces ``release_root/<name>/`` with nbgrader's output, byte-stable.
    """
    lesson_dir = Path(lesson_dir)
    name = lesson_dir.name
    with tempfile.TemporaryDirectory(prefix=f"build-{name}-") as tmp:
        course = Path(tmp)
        stage_lesson(lesson_dir, course / "source")
        generate_in_course(course, name)
        produced = course / "lessons" / name
        if not (produced / f"{name}.ipynb").is_file():
            raise BuildError(f"nbgrader produced no {name}.ipynb for {lesson_dir}")
        _normalise_release(produced)
        dest = Path(release_root) / name
        if dest.exists() and _same_tree(produced, dest):
            return dest  # unchanged: leave files (and their times) alone
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(produced, dest)
        for path in dest.rglob("*"):
            if path.is_file():
                path.chmod(0o644)
    return dest


def _normalise_release(folder: Path) -> None:
    """Rewrite every notebook nbgrader wrote in nbformat's canonical form (already so in nbgrader 0.9.6)."""
    import nbformat

    for path in sorted(folder.rglob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        path.write_bytes(notebook_bytes(nb))


def _tree_files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def _same_tree(a: Path, b: Path) -> bool:
    return not tree_differences(a, b)


def tree_differences(expected: Path, actual: Path) -> list[str]:
    """Files that differ between two folders (missing, extra, or different bytes), as relative paths."""
    if not actual.is_dir():
        return ["(missing folder)"]
    want, have = _tree_files(expected), _tree_files(actual)
    problems = [f"{f} (missing)" for f in sorted(want - have)]
    problems += [f"{f} (not generated from the source)" for f in sorted(have - want)]
    problems += [
        f"{f} (differs)" for f in sorted(want & have) if not filecmp.cmp(expected / f, actual / f, shallow=False)
    ]
    return problems


# --------------------------------------------------------------------------------------------- commands
def _select(names: Sequence[str], source_root: Path) -> dict[str, Path]:
    lessons = find_lessons(source_root)
    if not names:
        return lessons
    chosen = {}
    for raw in names:
        name = Path(raw.rstrip("/")).name.removesuffix(".py").removesuffix(".ipynb")
        if name not in lessons:
            known = ", ".join(lessons) or "none"
            raise SystemExit(f"no lesson {raw!r} in {source_root} (lessons: {known})")
        chosen[name] = lessons[name]
    return chosen


def build(names: Sequence[str] = (), source_root: Path = SOURCE_ROOT, release_root: Path = RELEASE_ROOT) -> int:
    """Build the source notebooks and releases of the named lessons (all when none are named)."""
    lessons = _select(names, source_root)
    for name, lesson_dir in lessons.items():
        notebook = build_source_notebook(lesson_dir)
        release = generate_release(lesson_dir, release_root)
        print(f"{name}: {_show(notebook)} -> {_show(release / f'{name}.ipynb')}")
    if not names and release_root.is_dir():
        for orphan in sorted(d for d in release_root.iterdir() if d.is_dir() and d.name not in lessons):
            print(f"{orphan.name}: no source in {_show(source_root)}; removing {_show(orphan)}")
            shutil.rmtree(orphan)
    if not lessons:
        print(f"no lessons found in {_show(source_root)}")
    return 0


def check(names: Sequence[str] = (), source_root: Path = SOURCE_ROOT, release_root: Path = RELEASE_ROOT) -> int:
    """Rebuild into a temporary folder and compare with ``release_root``; print problems, return 1 if any."""
    lessons = _select(names, source_root)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="check-lessons-") as tmp:
        for name, lesson_dir in lessons.items():
            fresh = generate_release(lesson_dir, Path(tmp))
            committed = release_root / name
            if not committed.is_dir():
                problems.append(f"{name}: source has no release in {_show(committed)}")
                continue
            for difference in tree_differences(fresh, committed):
                problems.append(f"{name}: {_show(committed)}/{difference}")
    if not names and release_root.is_dir():
        for orphan in sorted(d for d in release_root.iterdir() if d.is_dir() and d.name not in lessons):
            problems.append(f"{orphan.name}: release {_show(orphan)} has no source in {_show(source_root)}")
    for problem in problems:
        print(problem)
    if problems:
        print("lessons/ is out of date: run `make lessons` and commit the result", file=sys.stderr)
        return 1
    print(f"lessons up to date: {', '.join(lessons) or 'none'}")
    return 0


def _show(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lessons", nargs="*", help="lesson names (e.g. 01_splitting); default: every lesson")
    parser.add_argument(
        "--check",
        action="store_true",
        help="rebuild into a temporary folder and fail, listing the lessons whose committed release differs",
    )
    parser.add_argument("--source-root", type=Path, default=SOURCE_ROOT, help="folder of lesson sources")
    parser.add_argument("--release-root", type=Path, default=RELEASE_ROOT, help="folder of releases")
    args = parser.parse_args(None if argv is None else list(argv))
    command = check if args.check else build
    try:
        return command(args.lessons, args.source_root.resolve(), args.release_root.resolve())
    except BuildError as error:
        print(error, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
