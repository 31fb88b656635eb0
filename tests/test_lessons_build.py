"""The lesson pipeline: jupytext sources -> nbgrader source notebooks -> committed releases in lessons/.

For every lesson in source/ (parametrized): its release is committed and up to date, byte for byte; building
twice gives the same bytes; the source notebook passes `nbgrader validate`; the release fails every graded test
(`validate --invert`); the release shows no solution code and no hidden tests.

The fixture lesson tests/fixtures/pipeline_lesson tests the pipeline itself (built in temporary folders), and
its autograding: the reference solution gets full marks, the blank release zero.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from tests.nbgrader_tools import (
    FIXTURES,
    RELEASE_ROOT,
    REPO,
    SOURCE_ROOT,
    autograde_notebook,
    build_release,
    build_source,
    builder,
    find_leaks,
    graded_cells,
    validate,
)
from tests.pipeline_checks import FIXTURE_CHECK_MODULES

LESSONS = sorted(builder.find_lessons(SOURCE_ROOT))
FIXTURE = FIXTURES / "pipeline_lesson"


# --------------------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def twice_built(tmp_path_factory):
    """``name -> (release folder of build 1, release folder of build 2)``, each lesson built once per module."""
    cache: dict[str, tuple[Path, Path]] = {}

    def get(lesson: str | Path) -> tuple[Path, Path]:
        key = str(lesson)
        if key not in cache:
            first = build_release(lesson, tmp_path_factory.mktemp("build1")).parent
            second = build_release(lesson, tmp_path_factory.mktemp("build2")).parent
            cache[key] = (first, second)
        return cache[key]

    return get


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and modification time of every file under ``folder``."""
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# --------------------------------------------------------------------------------------------- every lesson
@pytest.mark.parametrize("lesson", LESSONS)
def test_committed_release_is_up_to_date(lesson, twice_built):
    fresh, _ = twice_built(lesson)
    assert (RELEASE_ROOT / lesson).is_dir(), f"lessons/{lesson} is missing: run `make lessons` and commit it"
    differences = builder.tree_differences(fresh, RELEASE_ROOT / lesson)
    assert not differences, f"lessons/{lesson} is out of date (run `make lessons`): {differences}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_build_is_deterministic(lesson, twice_built):
    first, second = twice_built(lesson)
    assert not builder.tree_differences(first, second)


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_source_passes_validate(lesson, tmp_path):
    result = validate(build_source(lesson, tmp_path))
    assert result.ok, str(result)


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_release_fails_every_test(lesson, twice_built):
    release = twice_built(lesson)[0] / f"{lesson}.ipynb"
    assert graded_cells(release), f"{lesson} has no graded test cell"
    result = validate(release, invert=True)
    assert result.ok, str(result)


@pytest.mark.parametrize("lesson", LESSONS)
def test_release_shows_no_solution_or_hidden_test(lesson, tmp_path, twice_built):
    source = build_source(lesson, tmp_path)
    release = twice_built(lesson)[0] / f"{lesson}.ipynb"
    assert not find_leaks(source, release)
    assert not list(release.parent.rglob(f"{lesson}.py")), "the jupytext source (solutions) reached the release"


@pytest.mark.parametrize("lesson", LESSONS)
def test_install_cell_precedes_the_setup_cell(lesson, tmp_path, twice_built):
    """Source and release: one install cell, right before the first code cell that imports gpulab, collapsed,
    not an nbgrader cell, and its code is source/install_gpulab.py with pyproject's repository filled in."""
    expected = builder.install_cell_source(REPO / "source" / lesson)
    source = nbformat.read(build_source(lesson, tmp_path), as_version=4)
    release = nbformat.read(twice_built(lesson)[0] / f"{lesson}.ipynb", as_version=4)
    for nb in (source, release):
        code = [cell for cell in nb.cells if cell.cell_type == "code"]
        installs = [i for i, cell in enumerate(code) if cell.source == expected]
        assert len(installs) == 1, f"{lesson}: {len(installs)} install cells"
        imports = [i for i, cell in enumerate(code) if re.search(r"^(import|from) gpulab\b", cell.source, re.M)]
        assert installs[0] + 1 == imports[0], f"{lesson}: the install cell is not right before the set-up cell"
        assert code[installs[0]].metadata == {"cellView": "form", "jupyter": {"source_hidden": True}}


def test_install_cell_goes_before_the_first_code_cell_importing_gpulab():
    import nbformat.v4 as v4

    cells = [
        v4.new_markdown_cell("import gpulab"),
        v4.new_code_cell("x = 1  # gpulab later"),
        v4.new_code_cell("y = 2"),
    ]
    nb = v4.new_notebook(cells=[*cells, v4.new_code_cell("import torch\nfrom gpulab import check")])
    assert builder.add_install_cell(nb, REPO / "source" / "01_splitting", repository="https://github.com/fork/course")
    assert [cell.source for cell in nb.cells[:3]] == [cell.source for cell in cells]
    assert 'git+https://github.com/fork/course"' in nb.cells[3].source and nb.cells[4].source.startswith("import torch")
    without = v4.new_notebook(cells=list(cells))
    assert not builder.add_install_cell(without, REPO / "source" / "01_splitting") and len(without.cells) == 3


def test_install_cell_names_the_files_each_lesson_imports_from_its_folder():
    """The install cell fetches exactly the files the release holds besides the notebook (the DDP modules)."""
    for lesson in LESSONS:
        shipped = sorted(
            f"{lesson}/{path.name}"
            for path in (REPO / "lessons" / lesson).iterdir()
            if path.is_file() and path.name != f"{lesson}.ipynb"
        )
        assert builder.lesson_files(REPO / "source" / lesson) == shipped
        code = builder.install_cell_source(REPO / "source" / lesson)
        assert f'for lesson_file in "{" ".join(shipped)}".split():' in code
    assert builder.lesson_files(REPO / "source" / "02_gradient_averaging") == ["02_gradient_averaging/ddp_averaging.py"]


def test_check_command_passes():
    """`scripts/build_lessons.py --check` (what CI runs): every source has a current release, and vice versa."""
    assert builder.main(["--check"]) == 0


# --------------------------------------------------------------------------------------------- the fixture lesson
def test_fixture_release_is_deterministic(twice_built, tmp_path):
    first, second = twice_built(FIXTURE)
    assert not builder.tree_differences(first, second)
    # rebuilding into the same place changes no byte (and does not even touch the files)
    before = snapshot(first)
    build_release(FIXTURE, first.parent)
    assert snapshot(first) == before


def test_fixture_notebooks_are_normalised(tmp_path, twice_built):
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    # the kernel JupyterLab starts for a lesson here, and what it reports of itself
    spec = KernelSpecManager().get_kernel_spec("python3")
    kernelspec = {"display_name": spec.display_name, "language": spec.language, "name": "python3"}
    course_kernel = {"kernelspec": kernelspec, "language_info": IPythonKernel.language_info}
    source = nbformat.read(build_source(FIXTURE, tmp_path), as_version=4)
    release_path = twice_built(FIXTURE)[0] / "pipeline_lesson.ipynb"
    release = nbformat.read(release_path, as_version=4)
    markdown_id = "cell-" + hashlib.sha1(f"markdown\n{source.cells[0].source}".encode()).hexdigest()[:10]
    for nb in (source, release):
        assert [cell.id for cell in nb.cells] == [markdown_id, "count_chunks_answer", "count_chunks_test"]
        assert nb.metadata == course_kernel  # what JupyterLab writes when the kernel starts: nothing to change
        assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
        for cell in nb.cells:
            assert set(cell.metadata) <= set(builder.KEPT_CELL_METADATA)  # no jupytext lines_to_next_cell
            assert cell.get("outputs", []) == [] and cell.get("execution_count") is None
    text = release_path.read_text(encoding="utf-8")
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    assert release.cells[2].metadata.nbgrader.checksum  # nbgrader's locking survived the normalisation


def test_fixture_release_has_no_solution_or_hidden_tests(tmp_path, twice_built):
    source = build_source(FIXTURE, tmp_path / "source")
    release = twice_built(FIXTURE)[0] / "pipeline_lesson.ipynb"
    assert find_leaks(source, release) == []
    text = release.read_text(encoding="utf-8")
    for secret in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "-(-batch_size // chunk_size)", "range(1, 30)"):
        assert secret not in text
    assert "raise NotImplementedError()" in text
    assert "count_chunks(10, 4) == 3" in text  # the visible test stays
    # the jupytext source holds the solutions: it is never staged nor released
    assert sorted(p.name for p in source.parent.iterdir()) == ["pipeline_lesson.ipynb"]
    assert sorted(p.name for p in release.parent.iterdir()) == ["pipeline_lesson.ipynb"]
    # the leak detector itself works: the source "leaks" everything into itself
    leaks = find_leaks(source, source)
    assert any("BEGIN HIDDEN TESTS" in leak for leak in leaks)
    assert any("-(-batch_size // chunk_size)" in leak for leak in leaks)


def test_fixture_source_passes_validate(tmp_path):
    result = validate(build_source(FIXTURE, tmp_path))
    assert result.ok, str(result)


def test_fixture_release_fails_validate(twice_built):
    release = twice_built(FIXTURE)[0] / "pipeline_lesson.ipynb"
    inverted = validate(release, invert=True)
    assert inverted.ok, str(inverted)
    plain = validate(release)
    assert not plain.ok and len(plain.details["failed"]) == 1
    assert "NotImplementedError" in plain.details["failed"][0]["raw_error"]


def test_fixture_autograde_reference_full_blank_zero(tmp_path, twice_built):
    reference = build_source(FIXTURE, tmp_path)
    blank = twice_built(FIXTURE)[0] / "pipeline_lesson.ipynb"
    blank_bytes = blank.read_bytes()
    started = time.perf_counter()
    assert autograde_notebook(FIXTURE, reference) == {"count_chunks_test": (2.0, 2.0)}
    seconds = time.perf_counter() - started
    assert autograde_notebook(FIXTURE, blank, student="blank") == {"count_chunks_test": (0.0, 2.0)}
    assert blank.read_bytes() == blank_bytes, "grading must not edit the submission"
    print(f"autograding one notebook through the API took {seconds:.2f} s")


def test_fixture_hidden_tests_count(tmp_path, twice_built):
    """An answer that passes the visible assert but not the hidden tests gets no points."""
    release = twice_built(FIXTURE)[0] / "pipeline_lesson.ipynb"
    nb = nbformat.read(release, as_version=4)
    answer = nb.cells[1]
    assert answer.metadata.nbgrader.grade_id == "count_chunks_answer"
    answer.source = "def count_chunks(batch_size, chunk_size):\n    return batch_size // chunk_size + 1"
    submission = tmp_path / "pipeline_lesson.ipynb"
    nbformat.write(nb, submission)
    assert autograde_notebook(FIXTURE, submission) == {"count_chunks_test": (0.0, 2.0)}


def test_kernel_is_this_interpreter(tmp_path):
    """validate and autograde run the `python3` kernel of this environment, whatever kernelspec a file names."""
    lesson = tmp_path / "lessons_src" / "interpreter_lesson"
    lesson.mkdir(parents=True)
    text = (FIXTURE / "pipeline_lesson.py").read_text(encoding="utf-8")
    text += (
        '\n\n# %% nbgrader={"grade": true, "grade_id": "interpreter_test", "locked": true, "points": 1,'
        ' "schema_version": 3, "solution": false}\n'
        "import importlib.util\nimport sys\n\n"
        f"assert sys.prefix == {sys.prefix!r}, sys.prefix\n"
        'assert importlib.util.find_spec("gpulab") is not None, "gpulab is not installed in the kernel"\n'
    )
    (lesson / "interpreter_lesson.py").write_text(text, encoding="utf-8")
    reference = build_source(lesson, tmp_path / "staged")
    # a foreign kernelspec (another machine's conda env) must not matter
    nb = nbformat.read(reference, as_version=4)
    nb.metadata.kernelspec = {"name": "conda-env-elsewhere-py", "display_name": "elsewhere", "language": "python"}
    nbformat.write(nb, reference)
    result = validate(reference)
    assert result.ok, str(result)
    scores = autograde_notebook(lesson, reference)
    assert scores == {"count_chunks_test": (2.0, 2.0), "interpreter_test": (1.0, 1.0)}


# --------------------------------------------------------------------------------------------- build script
def test_cell_ids_are_valid_unique_and_stable(tmp_path):
    header = (
        '# %% nbgrader={{"grade": false, "grade_id": "{}", "locked": true, "schema_version": 3, "solution": false}}'
    )
    cells = [
        "# %%\nx = 1",
        header.format("first_answer") + "\ny = 2",
        "# %% [markdown]\n# Some text",
        header.format("has spaces/and:colons") + "\nw = 4",
        header.format("a" * 80) + "\nv = 5",
        "# %%\nx = 1",  # the same content twice
    ]
    source = tmp_path / "ids_lesson.py"

    def ids_of(cell_texts):
        source.write_text("\n\n".join(cell_texts) + "\n", encoding="utf-8")
        return [cell.id for cell in builder.notebook_from_source(source).cells]

    ids = ids_of(cells)
    assert ids[1:5] == ["first_answer", ids[2], "has-spaces-and-colons", "a" * 56]
    assert re.fullmatch(r"cell-[0-9a-f]{10}", ids[0]) and re.fullmatch(r"cell-[0-9a-f]{10}", ids[2])
    assert ids[5] == ids[0] + "-2"
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", i) for i in ids)
    assert ids_of(cells) == ids  # stable
    # inserting a cell renames no other cell: no churn in the committed lessons/
    inserted = ids_of(cells[:2] + ["# %%\nnew = 0"] + cells[2:])
    assert inserted[:2] + inserted[3:] == ids


def test_command_line_build_and_check(tmp_path):
    """`build_lessons.py` run as a script from elsewhere (venv not activated), then `--check` on drift."""
    sources, releases = tmp_path / "source", tmp_path / "lessons"
    shutil.copytree(FIXTURE, sources / "pipeline_lesson")
    roots = ["--source-root", str(sources), "--release-root", str(releases)]
    env = dict(os.environ, PATH="/usr/bin:/bin")  # nbgrader runs `alembic` from PATH: the script must cope
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_lessons.py"), *roots],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    release = releases / "pipeline_lesson" / "pipeline_lesson.ipynb"
    assert release.is_file()
    assert (sources / "pipeline_lesson" / "pipeline_lesson.ipynb").is_file()  # the source notebook too
    assert builder.main(["--check", *roots]) == 0

    release.write_text(release.read_text(encoding="utf-8").replace("YOUR CODE HERE", "edited by hand"))
    (releases / "orphan").mkdir()
    (releases / "orphan" / "orphan.ipynb").write_text("{}")
    shutil.copytree(FIXTURE, sources / "unreleased")
    (sources / "unreleased" / "pipeline_lesson.py").rename(sources / "unreleased" / "unreleased.py")
    assert builder.main(["--check", *roots]) == 1
    assert builder.main(["--check", "pipeline_lesson", *roots]) == 1

    # a full build repairs everything: stale release rebuilt, orphan removed, missing release made
    assert builder.main(roots) == 0
    assert not (releases / "orphan").exists()
    assert builder.main(["--check", *roots]) == 0


def test_check_lists_the_problems(tmp_path, capsys):
    sources, releases = tmp_path / "source", tmp_path / "lessons"
    shutil.copytree(FIXTURE, sources / "pipeline_lesson")
    roots = ["--source-root", str(sources), "--release-root", str(releases)]
    assert builder.main(roots) == 0
    release = releases / "pipeline_lesson" / "pipeline_lesson.ipynb"
    release.write_bytes(release.read_bytes() + b"\n")
    (releases / "orphan").mkdir()
    capsys.readouterr()
    assert builder.main(["--check", *roots]) == 1
    out = capsys.readouterr().out
    assert "pipeline_lesson: " in out and "pipeline_lesson.ipynb (differs)" in out
    assert "orphan: release" in out and "has no source" in out


def test_instructor_workflow_at_the_course_root(tmp_path):
    """register_assignment + autograde with the course config at a root laid out like the repo."""
    from nbgrader.api import Gradebook

    lesson = tmp_path / "source" / "99_pipeline"
    lesson.mkdir(parents=True)
    shutil.copyfile(FIXTURE / "pipeline_lesson.py", lesson / "99_pipeline.py")
    config = builder.course_config(tmp_path)
    config.SandboxedExecute.check_modules = FIXTURE_CHECK_MODULES  # the fixture's checks (tests/pipeline_checks.py)
    builder.register_assignment("99_pipeline", config)
    assert not (tmp_path / "lessons").exists(), "registering must not write a release"
    with Gradebook(config.CourseDirectory.db_url) as gradebook:
        notebook = gradebook.find_notebook("99_pipeline", "99_pipeline")
        assert [cell.name for cell in notebook.grade_cells] == ["count_chunks_test"]
    submitted = tmp_path / "submitted" / "s1" / "99_pipeline"
    submitted.mkdir(parents=True)
    shutil.copyfile(lesson / "99_pipeline.ipynb", submitted / "99_pipeline.ipynb")
    builder.run_nbgrader("autograde", config, "99_pipeline", "s1", create_student=True)
    autograded = tmp_path / "autograded" / "s1" / "99_pipeline"
    assert sorted(p.name for p in autograded.iterdir()) == ["99_pipeline.ipynb"]  # the solutions stay behind
    with Gradebook(config.CourseDirectory.db_url) as gradebook:
        assert gradebook.find_submission("99_pipeline", "s1").score == 2.0


# --------------------------------------------------------------------------------------------- configuration
def test_config_is_loaded_from_any_directory(tmp_path, monkeypatch):
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.preprocessors import Execute

    monkeypatch.chdir(tmp_path)
    config = builder.load_config()
    coursedir = CourseDirectory(config=config)
    assert coursedir.root == str(REPO)
    assert (coursedir.source_directory, coursedir.release_directory) == ("source", "lessons")
    assert (coursedir.submitted_directory, coursedir.autograded_directory) == ("submitted", "autograded")
    assert coursedir.db_url == f"sqlite:///{REPO / 'gradebook.db'}?timeout=30"  # /gradebook.db is git-ignored
    assert "[0-9][0-9]_*.py" in coursedir.ignore
    execute = Execute(config=config)
    assert execute.kernel_name == "python3"
    assert execute.timeout == 120
    overridden = CourseDirectory(config=builder.load_config(root=tmp_path))
    assert overridden.root == str(tmp_path)


def test_gitignore_covers_build_artefacts():
    ignored = subprocess.run(
        ["git", "check-ignore", "source/01_splitting/01_splitting.ipynb", "gradebook.db"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert ignored.stdout.split() == ["source/01_splitting/01_splitting.ipynb", "gradebook.db"]
