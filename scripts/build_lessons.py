"""Build the learner notebooks in ``lessons/`` from the jupytext sources in ``source/``.

Each lesson is a folder ``source/NN_name/`` holding ``NN_name.py``: a jupytext *percent* file with nbgrader's
cell metadata as JSON in the ``# %%`` headers, e.g. ``# %% nbgrader={"grade": true, "grade_id": ...}``.
For every lesson this script

1. builds ``source/NN_name/NN_name.ipynb`` (git-ignored) from ``NN_name.py``, deterministically: cell ids
   derived from the nbgrader ``grade_id`` (else from the cell's content), the course kernel's own kernelspec and
   language_info (JupyterLab then opens it without unsaved changes), only meaningful metadata kept, nbformat's
   canonical JSON;
2. runs nbgrader's ``generate_assignment`` through its Python API, with the course configuration
   (``autograder/nbgrader_config.py``) pointed at a staging copy of the course (the lesson folder without its
   jupytext source, a throw-away gradebook), and replaces ``lessons/NN_name/`` with the result.

Rebuilding an unchanged source changes no byte of ``lessons/``.

Every lesson notebook (source and release) also gets the *install cell*, ``source/install_gpulab.py`` with the
repository's address (``[project.urls] Repository`` in ``pyproject.toml``) filled in, right before its set-up
cell (the first code cell that imports gpulab). On Colab or Kaggle it installs gpulab from the repository; where
gpulab is installed it does nothing. It is a plain code cell, collapsed (``jupyter.source_hidden``; Colab shows
its ``# @title`` line as a form), never graded.
The README's table of "Open in Colab" / "Open in Kaggle" links, between the ``LINKS_BEGIN`` and ``LINKS_END``
markers, is generated from the same address and the lessons in ``source/``.

Translated editions (``TRANSLATED_EDITIONS``: Japanese) come from the same source. Each lesson keeps a gettext
catalogue beside it, ``source/NN_name/NN_name.ja.po``, whose ``msgid`` is a markdown cell exactly as jupytext reads
it and ``msgstr`` its translation; code cells are never translated. ``lessons/ja/NN_name/`` is the English release
with its markdown replaced and its install cell made for the edition (``GPULAB_LANGUAGE=ja``, the edition's files),
so its graded cells, ids, points and checksums are the English ones and both editions grade on one assignment.
A markdown cell with no current, reviewed translation (new, changed, untranslated or fuzzy) and an entry that
matches no cell fail the build and ``--check``, naming the cell by id and first line. ``README.ja.md`` gets the
edition's links. ``--refresh-translations`` (``make translations``) brings the catalogues in step for translators.

Usage (from any directory)::

    python scripts/build_lessons.py                  # every lesson (also removes lessons/ folders with no source)
    python scripts/build_lessons.py 01_splitting     # only these lessons
    python scripts/build_lessons.py --check          # exit 1, listing lessons whose release is out of date
    python scripts/build_lessons.py --check 01_splitting
    python scripts/build_lessons.py --refresh-translations   # update the NN_name.ja.po catalogues

The repository's own build also records the expected outcomes of the exercises' visible and extra inputs for the
self-check (``gpulab_solutions.recorded``: ``utils/gpulab/exercises/expected.pt``), and ``--check`` fails where
they are stale.

Exit status: 0 done / up to date, 1 ``--check`` found differences, 2 a lesson failed to build (a stale
translation included). With other
``--source-root`` / ``--release-root`` folders the README is left alone (it describes this repository's lessons).
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
README = REPO / "README.md"
# The editions besides English (the sources' own language): each has a README of its own, ``README.<edition>.md``.
TRANSLATED_EDITIONS = ("ja",)
EDITION_TITLES = {"en": "English", "ja": "日本語"}
# The title of the install cell's Colab form, per edition.
INSTALL_CELL_TITLES = {
    "en": "Install gpulab and this lesson's files (only where they are missing: Colab, Kaggle)",
    "ja": "gpulabとこのレッスンのファイルをインストール（Colab、Kaggleなど、ない場合のみ）",
}
# What the install cell says, in a translated edition: each English text of source/install_gpulab.py (it must occur
# there exactly once) and its translation.
INSTALL_CELL_TEXTS = {
    "ja": {
        '"turn Internet on (Settings → Internet → On)"': '"Internetをオンにしてください（Settings → Internet → On）"',
        '"check the internet connection"': '"インターネット接続を確認してください"',
        '"this Jupyter"': '"このJupyter"',
        'f"Installing gpulab on {where} … (once per session)"': (
            'f"{where}にgpulabをインストールしています…（セッションごとに1回）"'
        ),
        'f"Could not install gpulab from {requirement}: no internet, or the repository is unreachable.\\n"': (
            'f"{requirement}からgpulabをインストールできませんでした。インターネットに接続されていないか、'
            'リポジトリに到達できません。\\n"'
        ),
        'f"To fix: {fix}, then run this cell again. The last lines from pip:\\n{pip_said}"': (
            'f"対処法：{fix}。そのあと、このセルをもう一度実行してください。pipの最後の出力：\\n{pip_said}"'
        ),
        'f"gpulab installed: {requirement}"': 'f"gpulabをインストールしました：{requirement}"',
        'f"Could not download {url} ({error}).\\nTo fix: {fix}, then run this cell again."': (
            'f"{url}をダウンロードできませんでした（{error}）。\\n対処法：{fix}。そのあと、このセルをもう一度実行してください。"'
        ),
        'f"downloaded {name}"': 'f"{name}をダウンロードしました"',
        'f"gpulab needs Python {floor} or newer; this runtime has Python {have}.\\n"': (
            'f"gpulabにはPython {floor}以降が必要ですが、このランタイムのPythonは{have}です。\\n"'
        ),
        '"To fix: choose a runtime or image with a newer Python, then run this cell again."': (
            '"対処法：より新しいPythonのランタイム（イメージ）を選び、そのあと、このセルをもう一度実行してください。"'
        ),
    },
}
BRANCH = "main"  # the branch Colab and Kaggle open the lessons from
LINKS_BEGIN = "<!-- lesson links: generated by `make lessons` from pyproject.toml's Repository; do not edit -->"
LINKS_END = "<!-- end of lesson links -->"
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"
INSTALL_CELL_TEMPLATE = SOURCE_ROOT / "install_gpulab.py"
# The install cell: collapsed in JupyterLab and Notebook, a form showing only its `# @title` line on Colab.
INSTALL_CELL_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}}
# JupyterLab's Run All and nbclient continue past a cell with this tag when it raises.
RAISES_EXCEPTION = "raises-exception"
_IMPORTS_GPULAB = re.compile(r"^\s*(?:import|from)\s+gpulab\b", re.MULTILINE)

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
IGNORED_FILES = (".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*", "*.po", "*.pot")

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


def lesson_files(lesson_dir: Path | str) -> list[str]:
    """The files a lesson's release holds besides its notebook (e.g. ``ddp_averaging.py``), as paths from the
    release root (``02_gradient_averaging/ddp_averaging.py``): what the install cell fetches on Colab and Kaggle."""
    lesson_dir = Path(lesson_dir)
    files = []
    for path in lesson_dir.rglob("*"):
        parts = path.relative_to(lesson_dir).parts  # skipped as stage_lesson skips them: by _ignored, level by level
        if path.is_file() and not any(_ignored(part, lesson_dir.name, i == 0) for i, part in enumerate(parts)):
            files.append("/".join((lesson_dir.name, *parts)))
    return sorted(files)


def python_floor() -> str:
    """The oldest Python gpulab supports, from pyproject.toml's ``requires-python`` (``">=3.10"`` -> ``"3.10"``)."""
    import tomllib

    requires = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["requires-python"]
    match = re.fullmatch(r">=\s*(\d+\.\d+)", requires.strip())
    if match is None:
        raise BuildError(f"pyproject.toml's requires-python must read '>=X.Y', got {requires!r}")
    return match.group(1)


def install_cell_source(lesson_dir: Path | str, repository: str | None = None, edition: str = "en") -> str:
    """The install cell's code for a lesson: ``source/install_gpulab.py`` with the repository's address, the
    address of its lessons' raw files and the lesson's own files (``lesson_files``) filled in, for ``edition``
    (the form's title, the edition's release folder, and ``GPULAB_LANGUAGE``, which gpulab's messages follow)."""
    repository = repository or repository_url()
    values = {
        "{title}": INSTALL_CELL_TITLES[edition],
        "{language}": edition,
        "{repository}": repository,
        "{lessons_url}": raw_url(edition_root(RELEASE_ROOT, edition), repository),
        "{lesson_files}": " ".join(lesson_files(lesson_dir)),
        "{python_floor}": python_floor(),
    }
    code = INSTALL_CELL_TEMPLATE.read_text(encoding="utf-8")
    for english, translated in INSTALL_CELL_TEXTS.get(edition, {}).items():
        if code.count(english) != 1:
            raise BuildError(f"{INSTALL_CELL_TEMPLATE} must hold {english} exactly once (INSTALL_CELL_TEXTS)")
        code = code.replace(english, translated)
    for placeholder, value in values.items():
        if code.count(placeholder) != 1:
            raise BuildError(f"{INSTALL_CELL_TEMPLATE} must hold {placeholder} exactly once")
        code = code.replace(placeholder, value)
    return code.rstrip("\n")


def add_install_cell(nb, lesson_dir: Path | str, repository: str | None = None, edition: str = "en") -> bool:
    """Insert the install cell before the notebook's set-up cell (its first code cell importing gpulab).

    Returns whether it did: a notebook that never imports gpulab gets no install cell.
    """
    import nbformat

    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and _IMPORTS_GPULAB.search(cell.source):
            metadata = json.loads(json.dumps(INSTALL_CELL_METADATA))
            code = install_cell_source(lesson_dir, repository, edition)
            nb.cells.insert(index, nbformat.v4.new_code_cell(code, metadata=metadata))
            return True
    return False


def github_repository(repository: str | None = None) -> tuple[str, str]:
    """``(owner, name)`` of the repository on GitHub, where Colab and Kaggle open notebooks from."""
    from urllib.parse import urlparse

    url = urlparse(repository or repository_url())
    parts = url.path.strip("/").removesuffix(".git").split("/")
    if url.netloc != "github.com" or len(parts) != 2:
        raise BuildError(f"Colab and Kaggle links need a https://github.com/OWNER/NAME repository, not {url.geturl()}")
    return parts[0], parts[1]


def raw_url(folder: Path, repository: str | None = None) -> str:
    """The address of ``folder`` (inside this repository) in the ``BRANCH`` branch's raw files on GitHub."""
    owner, repo = github_repository(repository)
    path = Path(folder).resolve().relative_to(REPO).as_posix()
    return f"https://raw.githubusercontent.com/{owner}/{repo}/{BRANCH}/{path}"


def lesson_links(name: str, release_root: Path = RELEASE_ROOT, repository: str | None = None) -> dict[str, str]:
    """The addresses that open lesson ``name``'s release on Colab and on Kaggle (from the ``BRANCH`` branch)."""
    owner, repo = github_repository(repository)
    path = f"{Path(release_root).resolve().relative_to(REPO).as_posix()}/{name}/{name}.ipynb"
    raw = f"{raw_url(Path(release_root) / name, repository)}/{name}.ipynb"
    return {
        "colab": f"https://colab.research.google.com/github/{owner}/{repo}/blob/{BRANCH}/{path}",
        "kaggle": f"https://kaggle.com/kernels/welcome?src={raw}",
    }


def lesson_title(lesson_dir: Path, edition: str = "en") -> str:
    """A lesson's title: the first markdown heading of its source (``# # Lesson 01 — ...``), else its name; in a
    translated edition the heading of that cell's translation, where there is one."""
    match = re.search(r"^# # (.+)$", lesson_source(lesson_dir).read_text(encoding="utf-8"), re.MULTILINE)
    title = match.group(1).strip() if match else lesson_dir.name
    path = translation_file(lesson_dir, edition)
    if edition != "en" and match and path.is_file():
        for entry in _read_po(path):
            if not entry.obsolete and re.search(rf"^# {re.escape(title)}$", entry.msgid, re.MULTILINE):
                translated = re.search(r"^# (.+)$", entry.msgstr, re.MULTILINE)
                return translated.group(1).strip() if translated else title
    return title


LINKS_HEADER = {"en": "| lesson | Colab | Kaggle |", "ja": "| レッスン | Colab | Kaggle |"}


def links_table(
    lessons: dict[str, Path], release_root: Path = RELEASE_ROOT, repository: str | None = None, edition: str = "en"
) -> str:
    """A README's table of links, markers included: one row per lesson, a Colab and a Kaggle badge each, opening
    the lesson's ``edition``."""
    rows = [LINKS_BEGIN, LINKS_HEADER[edition], "|---|---|---|"]
    for name, lesson_dir in lessons.items():
        links = lesson_links(name, edition_root(release_root, edition), repository)
        colab = f"[![Open In Colab]({COLAB_BADGE})]({links['colab']})"
        kaggle = f"[![Open In Kaggle]({KAGGLE_BADGE})]({links['kaggle']})"
        rows.append(f"| {lesson_title(lesson_dir, edition)} | {colab} | {kaggle} |")
    rows.append(LINKS_END)
    return "\n".join(rows)


def readme_with_links(readme_text: str, table: str) -> str:
    """``readme_text`` with the part between the link markers replaced by ``table``."""
    begin, end = readme_text.find(LINKS_BEGIN), readme_text.find(LINKS_END)
    if begin < 0 or end < begin:
        raise BuildError(f"README.md has no lesson links section ({LINKS_BEGIN} ... {LINKS_END})")
    return readme_text[:begin] + table + readme_text[end + len(LINKS_END) :]


def readme_links(readme: Path, source_root: Path, release_root: Path, edition: str = "en") -> tuple[str, str]:
    """``readme``'s text, and that text with its lesson links made current for the lessons in ``source_root``."""
    text = readme.read_text(encoding="utf-8")
    return text, readme_with_links(text, links_table(find_lessons(source_root), release_root, edition=edition))


def _readmes(readme: Path, editions: Sequence[str]) -> list[tuple[Path, str]]:
    """The README and each translated edition's ``README.<edition>.md`` beside it."""
    return [(readme, "en"), *((readme.with_name(f"{readme.stem}.{edition}.md"), edition) for edition in editions)]


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


def course_kernel_metadata() -> dict:
    """The notebook metadata the course's kernel gives a notebook when JupyterLab starts it: its ``kernelspec``
    (``python3``, "Python 3 (gpulab)", as ``scripts/setup_env.py`` installs it) and the ``language_info`` ipykernel
    reports for this environment's Python.

    JupyterLab writes both into a notebook as soon as its kernel is up and marks the notebook changed unless they are
    already there, equal (``NotebookPanel._updateSpec`` / ``_updateLanguage``; the model's ``setMetadata`` skips a
    deep-equal value): a lesson carrying anything else opens with unsaved changes. ``language_info`` holds the
    Python version (``3.11.7``), so a release opens clean with a kernel of the Python that built it: ``make lessons``
    runs in the course's environment, whose kernel ``make lab`` starts. With another Python, JupyterLab updates the
    version and shows the notebook changed, as for any notebook saved elsewhere.
    """
    from ipykernel.ipkernel import IPythonKernel

    install = _setup_env().KERNEL_INSTALL
    kernelspec = {
        "display_name": install[install.index("--display-name") + 1],
        "language": "python",
        "name": install[install.index("--name") + 1],
    }
    return json.loads(json.dumps({"kernelspec": kernelspec, "language_info": IPythonKernel.language_info}))


def _setup_env():
    """``scripts/setup_env.py``, where the course's kernel is named, as a module (this file is also loaded by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("setup_env", Path(__file__).with_name("setup_env.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def notebook_from_source(py_path: Path | str):
    """Read a jupytext percent file and return the normalised notebook (an ``nbformat.NotebookNode``).

    The install cell (``add_install_cell``) goes before the set-up cell. Normalised means: nbformat 4.5; notebook
    metadata exactly ``course_kernel_metadata()`` (no jupytext version or pairing information);
    each cell's metadata reduced to ``KEPT_CELL_METADATA`` (answer and graded cells tagged
    ``raises-exception``, see ``expected_to_fail_blank``); no outputs or execution counts; cell ids derived from
    the nbgrader ``grade_id`` when the cell has one, else ``cell-<hash of its content>`` (see ``_cell_id``). The
    same source always gives the same notebook.
    """
    import jupytext
    import nbformat

    nb = jupytext.read(Path(py_path), fmt="py:percent")
    add_install_cell(nb, Path(py_path).parent)
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata = nbformat.from_dict(course_kernel_metadata())
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
        if expected_to_fail_blank(cell):
            metadata["tags"] = sorted({*metadata.get("tags", []), RAISES_EXCEPTION})
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


def expected_to_fail_blank(cell) -> bool:
    """Whether a code cell may raise in a blank release, before the learner answers: an answer cell (nbgrader
    ``solution``: it holds ``raise NotImplementedError()``) or a graded test cell (nbgrader ``grade``).

    The build tags these cells ``raises-exception``, so that JupyterLab's Run All and nbclient run past them to
    the end of the notebook (each lesson says at its top what a red cell means). nbgrader's checksums and
    grading ignore tags. Self-check cells need no tag: ``gpulab.check`` reports an unanswered exercise as
    "Not written yet" instead of raising. Every other cell, demos included, must run in a blank release
    (``tests/test_blank_releases.py``).
    """
    nbgrader = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and bool(nbgrader.get("solution") or nbgrader.get("grade"))


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
        return _replace_tree(produced, Path(release_root) / name)


def _replace_tree(produced: Path, dest: Path) -> Path:
    """Replace folder ``dest`` by a copy of ``produced``, unless they already hold the same bytes."""
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
        f"{f} ({_how_it_differs(expected / f, actual / f)})"
        for f in sorted(want & have)
        if not filecmp.cmp(expected / f, actual / f, shallow=False)
    ]
    return problems


def _how_it_differs(built: Path, committed: Path) -> str:
    """How a built file differs from the release's: for a notebook that differs only in its kernel's Python version
    (``language_info``, see ``course_kernel_metadata``), the two versions."""
    try:
        notebooks = [json.loads(path.read_text(encoding="utf-8")) for path in (built, committed)]
        versions = [notebook["metadata"]["language_info"].pop("version", None) for notebook in notebooks]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return "differs"
    if notebooks[0] != notebooks[1] or versions[0] == versions[1]:  # the same content written otherwise: bytes
        return "differs"
    return (
        f"differs only in the kernel's Python version: {versions[0]} here, {versions[1]} in the release; "
        "the release records the course environment's, so that JupyterLab opens it without unsaved changes"
    )


# --------------------------------------------------------------------------------------------- translations
# A translated edition (``TRANSLATED_EDITIONS``) of a lesson is its English release with every markdown cell
# replaced by its translation and the install cell made for the edition: code cells, graded cells, cell ids,
# points and checksums are the English release's own, so both editions grade on the one nbgrader assignment.
# Translations are gettext catalogues next to the source, ``source/NN_name/NN_name.<edition>.po``: one entry per
# distinct markdown cell, ``msgid`` the cell's markdown exactly as jupytext reads it from ``NN_name.py``, ``msgstr``
# its translation. A markdown cell without a current, reviewed translation fails the build, naming the cell.
class StaleTranslation(BuildError):
    """A lesson's translation does not match its English cells; the message lists the cells."""


def edition_root(release_root: Path | str, edition: str) -> Path:
    """Where an edition's releases go: ``lessons/`` for English, ``lessons/<edition>/`` for a translation."""
    return Path(release_root) if edition == "en" else Path(release_root) / edition


def translation_file(lesson_dir: Path | str, edition: str) -> Path:
    """A lesson's translation catalogue: ``<folder>/<folder name>.<edition>.po``."""
    lesson_dir = Path(lesson_dir)
    return lesson_dir / f"{lesson_dir.name}.{edition}.po"


def course_editions(source_root: Path | str = SOURCE_ROOT) -> tuple[str, ...]:
    """The translated editions of the lessons in ``source_root``: ``TRANSLATED_EDITIONS`` for this course's own
    ``source/``, and for any folder those of the catalogues found in it (every lesson then needs one)."""
    source_root = Path(source_root).resolve()
    found = {path.suffixes[-2].lstrip(".") for path in source_root.glob("*/*.po") if len(path.suffixes) >= 2}
    if source_root == SOURCE_ROOT.resolve():
        found |= set(TRANSLATED_EDITIONS)
    return tuple(sorted(found))


def markdown_cells(lesson_dir: Path | str) -> list[tuple[str, str]]:
    """``(cell id, markdown)`` of each markdown cell of a lesson's English source notebook, in order."""
    nb = notebook_from_source(lesson_source(lesson_dir))
    return [(cell.id, cell.source) for cell in nb.cells if cell.cell_type == "markdown"]


def _first_line(text: str, limit: int = 70) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _read_po(path: Path):
    import polib

    return polib.pofile(str(path), wrapwidth=0, encoding="utf-8")


def translation_problems(lesson_dir: Path | str, edition: str) -> list[str]:
    """Why a lesson's ``edition`` cannot be built (``[]``: every markdown cell has a current, reviewed
    translation): English cells with no entry (new or changed), untranslated or fuzzy entries, and entries that
    match no English cell any more (obsolete entries not yet marked so). Each names the cell or entry."""
    lesson_dir = Path(lesson_dir)
    name, path = lesson_dir.name, translation_file(lesson_dir, edition)
    if not path.is_file():
        return [f"{name}: no {edition} translation ({_show(path)} is missing; `make translations` creates it)"]
    entries = {entry.msgid: entry for entry in _read_po(path) if not entry.obsolete}
    problems, english = [], set()
    for cell_id, text in markdown_cells(lesson_dir):
        english.add(text)
        entry = entries.get(text)
        where = f"{name}: cell {cell_id} ({_first_line(text)!r})"
        if entry is None:
            problems.append(f"{where}: no {edition} translation of this English text (a new or changed cell)")
        elif "fuzzy" in entry.flags:
            problems.append(f"{where}: the {edition} translation is marked fuzzy (the English changed; review it)")
        elif not entry.msgstr.strip():
            problems.append(f"{where}: not translated into {edition} yet")
    for msgid in entries:
        if msgid not in english:
            problems.append(f"{name}: {_show(path)}: obsolete entry {_first_line(msgid)!r} matches no English cell")
    return problems


def translation_catalogue(lesson_dir: Path | str, edition: str) -> dict[str, str]:
    """``{English markdown: translation}`` of a lesson; ``StaleTranslation`` listing the cells if any is stale."""
    problems = translation_problems(lesson_dir, edition)
    if problems:
        raise StaleTranslation("\n".join(problems))
    path = translation_file(lesson_dir, edition)
    return {entry.msgid: entry.msgstr for entry in _read_po(path) if not entry.obsolete}


def translate_notebook(nb, lesson_dir: Path | str, edition: str, catalogue: dict[str, str] | None = None):
    """A copy of a lesson's English notebook (source or release) in ``edition``: each markdown cell's text
    replaced by its translation, the install cell made for the edition, ``metadata.gpulab.edition`` set. Cell
    ids, code cells and nbgrader metadata stay as they are. ``catalogue`` defaults to the lesson's own
    (``translation_catalogue``)."""
    import copy

    import nbformat

    catalogue = translation_catalogue(lesson_dir, edition) if catalogue is None else catalogue
    english_install = install_cell_source(lesson_dir)
    translated = copy.deepcopy(nb)
    for cell in translated.cells:
        if cell.cell_type == "markdown":
            if cell.get("metadata", {}).get("nbgrader"):
                raise BuildError(
                    f"{Path(lesson_dir).name}: cell {cell.id} is a graded markdown cell (not translatable)"
                )
            if cell.source not in catalogue:
                raise StaleTranslation(
                    f"{Path(lesson_dir).name}: cell {cell.id} ({_first_line(cell.source)!r}) "
                    f"has no {edition} translation"
                )
            cell.source = catalogue[cell.source]
        elif cell.cell_type == "code" and cell.source == english_install:
            cell.source = install_cell_source(lesson_dir, edition=edition)
    translated.metadata["gpulab"] = {"edition": edition}
    nbformat.validate(translated)
    return translated


def notebook_edition(nb) -> str:
    """The edition a built notebook declares (``metadata.gpulab.edition``); ``"en"`` when it declares none."""
    declared = nb.get("metadata", {}).get("gpulab", {})
    return declared.get("edition", "en") if isinstance(declared, dict) else "en"


def generate_translation(
    lesson_dir: Path | str,
    english_release: Path | str,
    release_root: Path | str,
    edition: str,
    catalogue: dict[str, str] | None = None,
) -> Path:
    """Write lesson ``edition`` of an English release folder (``generate_release``'s result) into
    ``edition_root(release_root, edition)/<name>/`` (same files, the notebooks translated) and return that folder.
    Unchanged files are left alone, as ``generate_release`` does."""
    lesson_dir, english_release = Path(lesson_dir), Path(english_release)
    import nbformat

    with tempfile.TemporaryDirectory(prefix=f"translate-{lesson_dir.name}-") as tmp:
        produced = Path(tmp) / lesson_dir.name
        shutil.copytree(english_release, produced)
        for path in sorted(produced.rglob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            path.write_bytes(notebook_bytes(translate_notebook(nb, lesson_dir, edition, catalogue)))
        return _replace_tree(produced, edition_root(release_root, edition) / lesson_dir.name)


def build_translated_source(lesson_dir: Path | str, notebook_path: Path | str, edition: str, catalogue=None) -> Path:
    """The source notebook (solutions and hidden tests) of a lesson's ``edition``, written to ``notebook_path``."""
    nb = notebook_from_source(lesson_source(lesson_dir))
    notebook_path = Path(notebook_path)
    write_if_changed(notebook_path, notebook_bytes(translate_notebook(nb, lesson_dir, edition, catalogue)))
    return notebook_path


FUZZY_CARRY_OVER = 0.6  # how alike a changed English cell must be to its old text for the old translation to carry


def refresh_translation(lesson_dir: Path | str, edition: str) -> tuple[Path, dict[str, int]]:
    """Bring a lesson's catalogue in step with its English cells, for translators (``make translations``).

    Entries follow the cells' order, each with the cell's id as an extracted comment. A new English cell gets an
    empty entry, or, when it is a changed cell (at least ``FUZZY_CARRY_OVER`` alike to an entry that matches no
    cell any more), that entry's translation marked ``fuzzy`` with the old English as ``#| msgid`` (as gettext's
    ``msgmerge`` does); entries that match no cell are kept at the end marked obsolete (``#~``). Translations
    are never lost. Returns the file and counts (``kept``, ``new``, ``fuzzy``, ``obsolete``).
    """
    import difflib

    import polib

    lesson_dir = Path(lesson_dir)
    path = translation_file(lesson_dir, edition)
    old = _read_po(path) if path.is_file() else None
    fresh = polib.POFile(wrapwidth=0, encoding="utf-8")
    fresh.metadata = dict(old.metadata) if old is not None and old.metadata else {}
    fresh.metadata.setdefault("Project-Id-Version", f"{lesson_dir.name}")
    fresh.metadata.setdefault("Language", edition)
    fresh.metadata.setdefault("MIME-Version", "1.0")
    fresh.metadata.setdefault("Content-Type", "text/plain; charset=UTF-8")
    fresh.metadata.setdefault("Content-Transfer-Encoding", "8bit")
    active = {e.msgid: e for e in old if not e.obsolete} if old is not None else {}
    retired = [e for e in old if e.obsolete] if old is not None else []
    cells, seen = [], set()
    for cell_id, text in markdown_cells(lesson_dir):
        if text not in seen:
            seen.add(text)
            cells.append((cell_id, text))
    counts = {"kept": 0, "new": 0, "fuzzy": 0, "obsolete": 0}
    matched = {text: active.pop(text) for _, text in cells if text in active}
    for cell_id, text in cells:
        entry = matched.get(text)
        if entry is not None:
            counts["kept"] += 1
        else:
            entry = polib.POEntry(msgid=text, msgstr="")
            candidates = {msgid: e for msgid, e in active.items() if e.msgstr.strip()}
            best = difflib.get_close_matches(text, list(candidates), n=1, cutoff=FUZZY_CARRY_OVER)
            if best:
                previous = active.pop(best[0])
                entry.msgstr, entry.flags, entry.previous_msgid = previous.msgstr, ["fuzzy"], previous.msgid
                counts["fuzzy"] += 1
            else:
                counts["new"] += 1
        entry.comment = f"cell {cell_id}"
        entry.occurrences = []
        fresh.append(entry)
    for entry in [*active.values(), *retired]:
        entry.obsolete = True
        fresh.append(entry)
        counts["obsolete"] += 1
    write_if_changed(path, str(fresh).encode("utf-8") + (b"" if str(fresh).endswith("\n") else b"\n"))
    return path, counts


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


def _orphans(release_root: Path, lessons: dict[str, Path], editions: Sequence[str]) -> list[Path]:
    """Release folders, in every edition, whose lesson has no source (an edition's own folder is none)."""
    found = []
    for edition in ("en", *editions):
        root = edition_root(release_root, edition)
        if root.is_dir():
            keep = set(lessons) | (set(editions) if edition == "en" else set())
            found += sorted(d for d in root.iterdir() if d.is_dir() and d.name not in keep)
    return found


STALE_TRANSLATIONS = (
    "the translations are out of step with the English cells named above: run `make translations`, translate "
    "(or review the fuzzy entries of) the cells named in source/NN_name/NN_name.<edition>.po, then `make lessons`"
)


def build(
    names: Sequence[str] = (),
    source_root: Path = SOURCE_ROOT,
    release_root: Path = RELEASE_ROOT,
    readme: Path | None = README,
) -> int:
    """Build the source notebooks and releases of the named lessons (all when none are named), in English and
    in every translated edition (``course_editions``).

    Also rewrites the lesson links in ``readme`` and in each edition's ``README.<edition>.md`` beside it (none:
    leave them alone) for every lesson in ``source_root``. A stale translation fails the build (exit status 2)
    after the English releases are written, listing the cells.
    """
    lessons = _select(names, source_root)
    editions = course_editions(source_root)
    if readme is not None:
        for path, edition in _readmes(readme, editions):
            _, updated = readme_links(path, source_root, release_root, edition)
            if write_if_changed(path, updated.encode("utf-8")):
                print(f"{_show(path)}: Colab and Kaggle links updated")
    stale: list[str] = []
    for name, lesson_dir in lessons.items():
        notebook = build_source_notebook(lesson_dir)
        release = generate_release(lesson_dir, release_root)
        print(f"{name}: {_show(notebook)} -> {_show(release / f'{name}.ipynb')}")
        for edition in editions:
            try:
                translated = generate_translation(lesson_dir, release, release_root, edition)
            except StaleTranslation as error:
                stale += str(error).splitlines()
                continue
            print(f"{name} ({edition}): -> {_show(translated / f'{name}.ipynb')}")
    if not names:
        for orphan in _orphans(release_root, lessons, editions):
            print(f"{orphan.name}: no source in {_show(source_root)}; removing {_show(orphan)}")
            shutil.rmtree(orphan)
    if not lessons:
        print(f"no lessons found in {_show(source_root)}")
    if stale:
        print("\n".join(stale))
        print(STALE_TRANSLATIONS, file=sys.stderr)
        return 2
    return 0


def check(
    names: Sequence[str] = (),
    source_root: Path = SOURCE_ROOT,
    release_root: Path = RELEASE_ROOT,
    readme: Path | None = README,
) -> int:
    """Rebuild into a temporary folder and compare with ``release_root`` in every edition (and the READMEs'
    lesson links); print problems, stale translations named cell by cell, and return 1 if any."""
    lessons = _select(names, source_root)
    editions = course_editions(source_root)
    problems: list[str] = []
    if readme is not None:
        for path, edition in _readmes(readme, editions):
            if not path.is_file():
                problems.append(f"{_show(path)}: missing (the {edition} learners' README)")
                continue
            text, updated = readme_links(path, source_root, release_root, edition)
            if updated != text:
                problems.append(f"{_show(path)}: the Colab and Kaggle links differ from the lessons and pyproject.toml")
    with tempfile.TemporaryDirectory(prefix="check-lessons-") as tmp:
        for name, lesson_dir in lessons.items():
            fresh = generate_release(lesson_dir, Path(tmp))
            releases = {"en": fresh}
            for edition in editions:
                try:
                    releases[edition] = generate_translation(lesson_dir, fresh, Path(tmp), edition)
                except StaleTranslation as error:
                    problems += str(error).splitlines()
            for edition, produced in releases.items():
                committed = edition_root(release_root, edition) / name
                if not committed.is_dir():
                    problems.append(f"{name}: source has no release in {_show(committed)}")
                    continue
                for difference in tree_differences(produced, committed):
                    problems.append(f"{name}: {_show(committed)}/{difference}")
    if not names:
        for orphan in _orphans(release_root, lessons, editions):
            problems.append(f"{orphan.name}: release {_show(orphan)} has no source in {_show(source_root)}")
    for problem in problems:
        print(problem)
    if problems:
        print("lessons/ is out of date: run `make lessons` and commit the result", file=sys.stderr)
        return 1
    print(f"lessons up to date: {', '.join(lessons) or 'none'} ({', '.join(('en', *editions))})")
    return 0


def refresh(names: Sequence[str] = (), source_root: Path = SOURCE_ROOT) -> int:
    """``make translations``: refresh every translated edition's catalogue of the named lessons (all when none)."""
    for name, lesson_dir in _select(names, source_root).items():
        for edition in course_editions(source_root):
            path, counts = refresh_translation(lesson_dir, edition)
            summary = ", ".join(f"{count} {what}" for what, count in counts.items())
            print(f"{name} ({edition}): {_show(path)}: {summary}")
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
    parser.add_argument(
        "--refresh-translations",
        action="store_true",
        help="bring each lesson's translation catalogues (NN_name.<edition>.po) in step with its English cells",
    )
    parser.add_argument("--source-root", type=Path, default=SOURCE_ROOT, help="folder of lesson sources")
    parser.add_argument("--release-root", type=Path, default=RELEASE_ROOT, help="folder of releases")
    args = parser.parse_args(None if argv is None else list(argv))
    command = check if args.check else build
    source_root, release_root = args.source_root.resolve(), args.release_root.resolve()
    readme = README if (source_root, release_root) == (SOURCE_ROOT, RELEASE_ROOT) else None
    try:
        if args.refresh_translations:
            return refresh(args.lessons, source_root)
        code = command(args.lessons, source_root, release_root, readme)
        if readme is not None:  # the repository's own lessons: their self-check's recorded outcomes too
            from gpulab_solutions import recorded

            code = max(code, recorded.main(["--check"] if args.check else []))
        return code
    except BuildError as error:
        print(error, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
