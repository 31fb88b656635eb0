"""The instructor's grading command, ``autograder/grade.py``, end to end, for every lesson present.

One module-scoped run grades, for each lesson with a source and a release: the reference solution, the blank
release, a copy of the reference with its nbgrader metadata stripped (and a foreign conda kernelspec), and a copy
saved the way Colab saves it (nbformat 4.0, no cell ids, Colab's metadata and kernelspec, renamed "Copy of ...");
plus submissions that cannot be graded (not a notebook, another lesson's notebook, no notebook, an unknown
assignment), and the red-team submissions that ``tests/test_redteam.py`` checks (``main_run`` is shared: grading is
what takes the time). The tests then read its exit status, table, ``report.json``, ``grades.csv`` and feedback. A
second run of one submission into the same folder checks that grading twice gives the same grades.

Unit tests cover the parts that need no kernel: metadata repair, discovery, worker planning,
the kernel launcher's limits and process clean-up.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import html
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from tests.nbgrader_tools import RELEASE_ROOT, REPO, SOURCE_ROOT, build_source, builder
from tests.pipeline_checks import FIXTURE_CHECK_MODULES

sys.path.insert(0, str(REPO))
from autograder import grade, limits, sandbox  # noqa: E402
from autograder.checks import checks_for  # noqa: E402
from autograder.feedback import hidden_regions, secrets_of  # noqa: E402
from autograder.repair import RepairError, problems, repair  # noqa: E402

GRADE = REPO / "autograder" / "grade.py"
LESSONS = [
    name for name in sorted(builder.find_lessons(SOURCE_ROOT)) if (RELEASE_ROOT / name / f"{name}.ipynb").is_file()
]
VARIANTS = ("reference", "blank", "stripped", "colab")
CONDA_KERNELSPEC = {"display_name": "Python [conda env:gpulab]", "language": "python", "name": "conda-env-gpulab-py"}


# --------------------------------------------------------------------------------------------- submissions
def stripped_copy(nb):
    """The notebook with every cell's metadata gone and a foreign kernelspec (another editor, another env)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        cell.metadata = {}
    nb.metadata["kernelspec"] = dict(CONDA_KERNELSPEC)
    return nb


def colab_copy(nb):
    """The notebook as Colab saves it: nbformat 4.0 without cell ids, Colab's notebook and cell metadata."""
    nb = copy.deepcopy(nb)
    nb.nbformat_minor = 0
    nb.metadata = {
        "colab": {"provenance": [], "gpuType": "T4"},
        "kernelspec": {"name": "python3", "display_name": "Python 3"},
        "language_info": {"name": "python"},
        "accelerator": "GPU",
    }
    for index, cell in enumerate(nb.cells):
        cell.pop("id", None)
        cell.metadata["id"] = f"a1B2c3{index:04d}"
        if cell.cell_type == "code":
            cell.outputs = []
            cell.metadata["outputId"] = f"0f{index:06d}-colab"
    return nb


def write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1))  # as Colab writes: no validation, no id upgrade
    return path


def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)} {stat.st_mtime_ns} {stat.st_mode}\n".encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def run_grade(submissions: Path, out: Path, *options: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    command = [sys.executable, str(GRADE), str(submissions), "--out", str(out), "--no-progress", *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)


# The main grading run (every lesson's variants and attacks, DDP launches included) is a fixture of the first test
# that asks for it: its time counts in that test's, hence a longer limit than pyproject's 600 s.
pytestmark = pytest.mark.timeout(1800)

# One grading run serves this module and tests/test_redteam.py (grading is what takes the time).
_RUNS: dict[str, dict] = {}
REDTEAM_LESSON = "01_splitting"  # the attacks aimed at the grader itself run on this lesson (all, with
# GRADER_REDTEAM_ALL_LESSONS=1); the attacks whose outcome depends on a lesson's tests run on every lesson


def redteam_attacks(lesson: str) -> list:
    from autograder.redteam import attacks_for

    everywhere = lesson == REDTEAM_LESSON or os.environ.get("GRADER_REDTEAM_ALL_LESSONS") == "1"
    return attacks_for(lesson, grader_attacks=everywhere)


def main_run(tmp_path_factory) -> dict:
    """Grade, in one grade.py run: every variant of every lesson, the failure cases and the red-team set."""
    if "main" in _RUNS:
        return _RUNS["main"]
    from autograder.redteam import Lesson, swallow_only

    root = tmp_path_factory.mktemp("grading")
    submissions, out = root / "submissions", root / "out"
    references = {name: build_source(name, root / "references") for name in LESSONS}
    expected = {}
    for name in LESSONS:
        reference = nbformat.read(references[name], as_version=4)
        release = nbformat.read(RELEASE_ROOT / name / f"{name}.ipynb", as_version=4)
        write(reference, submissions / "reference" / name / f"{name}.ipynb")
        write(release, submissions / "blank" / name / f"{name}.ipynb")
        write(stripped_copy(reference), submissions / "stripped" / name / f"{name}.ipynb")
        write(colab_copy(reference), submissions / "colab" / name / f"Copy of {name}.ipynb")
        lesson = Lesson(name, release, reference)
        for attack in redteam_attacks(name):
            nbformat.write(attack.build(lesson, root), _path(submissions / f"rt-{attack.name}" / name, name))
            expected[(attack.name, name)] = attack.expected(lesson)
        if name == REDTEAM_LESSON:
            nbformat.write(swallow_only(lesson, root), _path(submissions / "rt-swallow_only" / name, name))
    first = LESSONS[0]
    (submissions / "garbage" / first).mkdir(parents=True)
    (submissions / "garbage" / first / f"{first}.ipynb").write_text("{ this is not json")
    (submissions / "nothing" / first).mkdir(parents=True)
    (submissions / "nothing" / first / "notes.txt").write_text("forgot the notebook")
    (submissions / "lost" / "99_no_such_lesson").mkdir(parents=True)
    if len(LESSONS) > 1:
        other = nbformat.read(references[LESSONS[1]], as_version=4)
        write(stripped_copy(other), submissions / "mixup" / first / f"{first}.ipynb")
    (submissions / "reference" / first / "timestamp.txt").write_text("2026-11-30 10:00:00.000000 UTC")
    before = tree_digest(submissions)
    started = time.monotonic()
    process = run_grade(submissions, out)  # default limits: a DDP launch runs for real in the sandbox
    seconds = time.monotonic() - started
    report = json.loads((out / "report.json").read_text())
    results = {(r["task"]["student"], r["task"]["assignment"]): r for r in report["results"]}
    _RUNS["main"] = {
        "submissions": submissions,
        "out": out,
        "process": process,
        "results": results,
        "before": before,
        "seconds": seconds,
        "references": references,
        "expected": expected,
        "root": root,
    }
    return _RUNS["main"]


def _path(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.ipynb"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return main_run(tmp_path_factory)


@pytest.fixture(scope="module")
def references(graded):
    return graded["references"]


def failure(result: dict) -> str:
    """What a failed grading says, with nbgrader's whole log when grade.py kept one."""
    text = f"{result['task']['student']}/{result['task']['assignment']}: {result.get('error')}"
    return text + "\n" + result["log"] if result.get("log") else text


def scores(result: dict) -> dict[str, tuple[float, float]]:
    (notebook,) = result["notebooks"].values()
    return {grade_id: (score, maximum) for grade_id, (score, maximum, _) in notebook["cells"].items()}


# --------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
@pytest.mark.parametrize("variant", ["reference", "stripped", "colab"])
def test_correct_copies_get_full_marks(graded, lesson, variant):
    result = graded["results"][(variant, lesson)]
    assert result.get("error") is None, failure(result)
    got = scores(result)
    assert got and all(score == maximum for score, maximum in got.values()), got
    assert result["score"] == result["max_score"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_a_reference_solution_runs_without_an_error_in_its_sandbox(graded, lesson):
    """Every cell of a reference solution runs in the grading sandbox, DDP launches included (the sandbox's own
    writable /dev/shm: bubblewrap's /dev leaves it root-owned, where the kernel's user could not write), except the
    cells the lesson tags as raising on purpose."""
    notebook = nbformat.read(graded["out"] / "autograded" / "reference" / lesson / f"{lesson}.ipynb", as_version=4)
    errors = [
        (index, output.get("ename"), str(output.get("evalue"))[:200])
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code" and "raises-exception" not in cell.metadata.get("tags", [])
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert errors == []


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_blank_release_gets_zero(graded, lesson):
    result = graded["results"][("blank", lesson)]
    assert result.get("error") is None, failure(result)
    assert all(score == 0 for score, _ in scores(result).values()), scores(result)


@pytest.mark.slow
def test_metadata_repair_is_reported(graded):
    for lesson in LESSONS:
        notes = " ".join(graded["results"][("stripped", lesson)]["notes"])
        assert "re-attached" in notes, notes
        assert "graded as" in " ".join(graded["results"][("colab", lesson)]["notes"])


@pytest.mark.slow
def test_ungradable_submissions_are_named_and_exit_status_is_1(graded):
    process = graded["process"]
    assert process.returncode == 1, process.stderr[-3000:]
    first = LESSONS[0]
    expected = {
        ("garbage", first): "not a readable notebook",
        ("nothing", first): "missing notebook",
        ("lost", "99_no_such_lesson"): "unknown assignment",
    }
    if len(LESSONS) > 1:
        expected[("mixup", first)] = "do not match"
    for (student, assignment), reason in expected.items():
        assert reason in graded["results"][(student, assignment)]["error"]
        line = next(x for x in process.stderr.splitlines() if x.strip().startswith(f"{student}/{assignment}:"))
        assert reason in line, process.stderr
    failed = {key for key, result in graded["results"].items() if result.get("error")}
    unexpected = [failure(graded["results"][key]) for key in sorted(failed - set(expected))]
    assert failed == set(expected), "\n\n".join(unexpected) or failed  # the red-team submissions are all graded


@pytest.mark.slow
def test_table_lists_every_student(graded):
    stdout = graded["process"].stdout
    header = stdout.splitlines()[0].split()
    assert header[0] == "student" and header[-1] == "total" and set(LESSONS) <= set(header)
    for student in (*VARIANTS, "garbage"):
        assert any(line.split()[:1] == [student] for line in stdout.splitlines()), stdout
    assert "FAILED" in stdout


@pytest.mark.slow
def test_grades_csv_is_nbgrader_export(graded):
    out = graded["out"]
    exported = out / "exported.csv"
    command = [str(Path(sys.executable).with_name("nbgrader")), "export", f"--to={exported}"]
    process = subprocess.run(command, cwd=out, capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr[-2000:]
    assert exported.read_bytes() == (out / "grades.csv").read_bytes()
    rows = {(r["student_id"], r["assignment"]): r for r in csv.DictReader((out / "grades.csv").open())}
    for lesson in LESSONS:
        assert float(rows[("reference", lesson)]["score"]) == float(rows[("reference", lesson)]["max_score"]) > 0
        assert float(rows[("blank", lesson)]["score"]) == 0
    assert rows[("reference", LESSONS[0])]["timestamp"].startswith("2026-11-30 10:00:00")


@pytest.mark.slow
def test_submissions_are_never_modified(graded):
    assert tree_digest(graded["submissions"]) == graded["before"]


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_feedback_shows_no_hidden_test(graded, lesson, references):
    secrets = set()
    for cell in nbformat.read(references[lesson], as_version=4).cells:
        secrets |= secrets_of(hidden_regions(cell.source))
    visible = nbformat.read(RELEASE_ROOT / lesson / f"{lesson}.ipynb", as_version=4)
    answers = [
        c
        for c in nbformat.read(references[lesson], as_version=4).cells
        if c.metadata.get("nbgrader", {}).get("solution")
    ]
    shown = "\n".join(c.source for c in [*visible.cells, *answers])  # the release, and the learner's own code
    secrets = {s for s in secrets if s not in shown}
    if checks_for(lesson) is not None:  # hidden tests are checks: their failure messages name hidden inputs
        graded_blank = nbformat.read(graded["out"] / "autograded" / "blank" / lesson / f"{lesson}.ipynb", 4)
        outputs = [o for c in graded_blank.cells for o in c.get("outputs", []) if o.get("ename") == "CheckFailed"]
        secrets = {o["evalue"] for o in outputs if o["evalue"] not in shown}
    assert secrets, "the lesson has hidden tests"
    for variant in ("reference", "blank", "stripped"):
        page = (graded["out"] / "feedback" / variant / lesson / f"{lesson}.html").read_text()
        assert "HIDDEN TESTS" not in page
        leaked = [s for s in secrets if s in page or html.escape(s) in page or html.escape(s, quote=False) in page]
        assert not leaked, (variant, leaked[:3])
    blank = (graded["out"] / "feedback" / "blank" / lesson / f"{lesson}.html").read_text()
    assert "failed" in blank


def test_the_feedback_index_names_each_test_cell_by_its_grade_id(graded):
    lesson = LESSONS[0]
    page = (graded["out"] / "feedback" / "reference" / lesson / f"{lesson}.html").read_text()
    assert page.count('<div id="toc">') == 1
    toc = page.split('<div id="toc">', 1)[1].split("</div>", 1)[0]
    graded_cells = [
        c.metadata.nbgrader["grade_id"]
        for c in nbformat.read(graded["out"] / "autograded" / "reference" / lesson / f"{lesson}.ipynb", 4).cells
        if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata.nbgrader.get("solution")
    ]
    assert len(graded_cells) >= 5
    for grade_id in graded_cells:
        assert f'<a href="#{grade_id}">Test cell <code>{grade_id}</code></a>' in toc, grade_id
    assert ">Test cell</a>" not in toc
    assert 'id="notebook-container"' in page and page.count("nbgrader_cell") >= len(graded_cells)  # the cells follow


@pytest.mark.slow
def test_grading_twice_gives_the_same_grades(graded):
    first = graded["results"]
    options = ("--student", "stripped", "--assignment", LESSONS[0], "--cell-timeout", "30")
    again = run_grade(graded["submissions"], graded["out"], *options)
    assert again.returncode == 0, again.stderr[-3000:]
    report = json.loads((graded["out"] / "report.json").read_text())
    assert len(report["results"]) == 1
    for result in report["results"]:
        key = (result["task"]["student"], result["task"]["assignment"])
        assert scores(result) == scores(first[key]), key
    assert tree_digest(graded["submissions"]) == graded["before"]


# --------------------------------------------------------------------------------------------- units
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Reference notebooks built for the unit tests (no grading): ``name -> path``, on demand."""
    folder = tmp_path_factory.mktemp("built")
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = build_source(name, folder)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def lesson_pair(built):
    name = LESSONS[0]
    return (
        nbformat.read(built(name), as_version=4),
        nbformat.read(RELEASE_ROOT / name / f"{name}.ipynb", as_version=4),
    )


def _ids(nb) -> list[str | None]:
    return [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]


def test_intact_submission_is_left_alone(lesson_pair):
    reference, release = lesson_pair
    assert problems(reference, release) == []
    fixed = repair(reference, release)
    assert not fixed.repaired and fixed.notebook == reference


def test_stripped_metadata_is_reattached_cell_for_cell(lesson_pair):
    reference, release = lesson_pair
    fixed = repair(stripped_copy(reference), release)
    assert fixed.repaired and _ids(fixed.notebook) == _ids(reference)
    assert fixed.notebook.metadata["kernelspec"] == release.metadata["kernelspec"]


def test_repair_survives_scratch_cells_deleted_edited_and_forged_tests(lesson_pair):
    reference, release = lesson_pair
    nb = stripped_copy(reference)
    tests = [i for i, c in enumerate(reference.cells) if c.metadata.get("nbgrader", {}).get("grade")]
    deleted = reference.cells[tests[0]].metadata["nbgrader"]["grade_id"]
    edited = reference.cells[tests[1]].metadata["nbgrader"]["grade_id"]
    edit = "assert True  # the learner's edit\n"  # a test cell with no assert of its own (rules' cases) too
    nb.cells[tests[1]].source = edit + nb.cells[tests[1]].source
    # a forged copy of a test, marked as an answer, before everything
    forged = copy.deepcopy(reference.cells[tests[2]])
    forged.metadata["nbgrader"].update(solution=True, grade=False)
    del nb.cells[tests[0]]
    nb.cells.insert(3, nbformat.v4.new_code_cell("print('scratch work')"))
    nb.cells.insert(1, forged)
    fixed = repair(nb, release)
    ids = [i for i in _ids(fixed.notebook) if i]
    assert ids == [i for i in _ids(reference) if i], ids
    assert any(deleted in note for note in fixed.notes)
    cell = next(c for c in fixed.notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == edited)
    assert cell.source.startswith(edit)  # an edited test cell is never run: its check decides
    assert not fixed.notebook.cells[1].metadata.get("nbgrader")  # the forged copy counts for nothing


def test_a_notebook_of_another_lesson_is_refused(lesson_pair, built):
    _, release = lesson_pair
    if len(LESSONS) < 2:
        pytest.skip("needs two lessons")
    other = nbformat.read(built(LESSONS[1]), as_version=4)
    with pytest.raises(RepairError, match="do not match"):
        repair(stripped_copy(other), release)
    with pytest.raises(RepairError, match="empty"):
        repair(nbformat.v4.new_notebook(), release)


def test_discovery_matches_renamed_notebooks_and_names_problems(tmp_path):
    name = LESSONS[0]
    (tmp_path / "ann" / name).mkdir(parents=True)
    (tmp_path / "ann" / name / f"Copy of {name}.ipynb").write_text("{}")
    (tmp_path / "bob" / name).mkdir(parents=True)
    (tmp_path / "bob" / "99_x").mkdir(parents=True)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    tasks = {t.name: t for t in grade.discover(tmp_path, builder.find_lessons(SOURCE_ROOT), RELEASE_ROOT)}
    assert set(tasks) == {f"ann/{name}", f"bob/{name}", "bob/99_x"}
    assert tasks[f"ann/{name}"].notebooks == {f"{name}.ipynb": str(tmp_path / "ann" / name / f"Copy of {name}.ipynb")}
    assert "missing notebook" in tasks[f"bob/{name}"].error
    assert "unknown assignment" in tasks["bob/99_x"].error


def test_students_are_registered_once_before_the_workers_start(tmp_path):
    """Workers autograde with ``create_student=False`` (see ``grade.register_students``): a student's lessons graded
    at once in several workers no longer race to insert the same student. Registering is idempotent."""
    from nbgrader.api import Gradebook

    db_url = builder.new_gradebook(tmp_path / "gradebook.db")
    config = builder.load_config(root=tmp_path, db_url=db_url)
    grade.register_students(config, {"ann", "bob"})
    grade.register_students(config, {"bob", "cy"})
    with Gradebook(db_url) as gradebook:
        assert sorted(student.id for student in gradebook.students) == ["ann", "bob", "cy"]


def test_a_failed_nbgrader_run_keeps_its_whole_log_until_the_next_grading(tmp_path, monkeypatch):
    name, out = LESSONS[0], tmp_path / "out"
    config = grade.prepare_course(out, [name], grade.lessons_present())
    write(
        nbformat.read(RELEASE_ROOT / name / f"{name}.ipynb", as_version=4), tmp_path / "in" / "ann" / name / "a.ipynb"
    )
    (task,) = grade.discover(tmp_path / "in", grade.lessons_present(), out / "lessons")
    grade.register_students(config, {"ann"})
    nbgrader_log = "[Autograde] Converting notebook\nTraceback (most recent call last):\n" + "x" * 9000 + "\nBoom"

    def failing(step, *args, **options):
        raise grade.load_builder().BuildError(f"nbgrader {step} failed:\n{nbgrader_log}")

    monkeypatch.setattr(grade.load_builder(), "run_nbgrader", failing)
    result = grade.grade_task(task, out, {})
    log = out / "logs" / "ann" / f"{name}.log"
    assert log.read_text() == f"nbgrader autograde failed:\n{nbgrader_log}"
    assert result["error"].startswith(f"nbgrader failed (log: {log}): ") and result["error"].endswith("Boom")

    monkeypatch.setattr(grade.load_builder(), "run_nbgrader", lambda *args, **options: "")
    with pytest.raises(Exception, match="No such submission"):  # nothing was graded; the stale log is gone
        grade.grade_task(task, out, {})
    assert not log.exists()


def _bench_grading():
    """benchmarks/bench_grading.py, a script, as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_grading", REPO / "benchmarks" / "bench_grading.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_grading_benchmark_refuses_a_run_that_did_not_grade_everything():
    """benchmarks/bench_grading.py: a time counts only for a run that graded every submission at full marks."""
    bench = _bench_grading()
    complete = {"seconds": 9.0, "exit_ok": True, "submissions": 4, "graded": 4, "all_full_marks": True}
    assert bench._must_have_graded_everything("run", dict(complete), 4, "") == complete
    for broken in ({"exit_ok": False}, {"graded": 2}, {"submissions": 3}, {"all_full_marks": False}):
        with pytest.raises(bench.RunFailed, match="InvalidEntry"):
            bench._must_have_graded_everything("run", complete | broken, 4, "InvalidEntry: student")


def test_grading_benchmark_counts_the_machines_busy_core_seconds(tmp_path):
    """benchmarks/bench_grading.py's core_seconds: user, nice, system, irq and softirq time of every core, not idle,
    iowait or steal; a run that spends CPU raises it; no /proc/stat gives None."""
    bench = _bench_grading()
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 20 30 5000 70 4 6 900 50 0\ncpu0 50 10 15 2500 35 2 3 450 25 0\n")
    assert bench.busy_core_seconds(stat) == 160 / os.sysconf("SC_CLK_TCK")
    assert bench.busy_core_seconds(tmp_path / "missing") is None
    stat.write_text("intr 1 2 3\n")
    assert bench.busy_core_seconds(stat) is None
    if Path("/proc/stat").is_file():
        before = bench.busy_core_seconds()
        spent = time.process_time() + 0.3
        while time.process_time() < spent:
            pass
        assert bench.busy_core_seconds() - before >= 0.25


def test_gpu_planning_gives_kernels_two_gpus_and_shares_them_between_workers(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(grade, "default_cpu_workers", lambda: 8)
    eight = [str(i) for i in range(8)]
    # default: two GPUs per kernel (real nn.DataParallel, the tests' device_count() >= 2 branches), 8 workers
    plan = grade.plan_workers(20, None, eight, None)
    assert [w["CUDA_VISIBLE_DEVICES"] for w in plan] == ["0,1", "2,3", "4,5", "6,7"] * 2
    # one GPU on an 8-core box: every worker shares it (grading needs megabytes of GPU memory)
    assert grade.plan_workers(20, None, ["0"], None) == [{"CUDA_VISIBLE_DEVICES": "0"}] * 8
    # Kaggle's two T4s: both in every kernel
    assert grade.plan_workers(3, None, ["0", "1"], None) == [{"CUDA_VISIBLE_DEVICES": "0,1"}] * 3
    # three GPUs in pairs: the odd one is left out; asked for one each: one group per GPU
    assert {w["CUDA_VISIBLE_DEVICES"] for w in grade.plan_workers(20, None, ["0", "1", "2"], None)} == {"0,1"}
    plan = grade.plan_workers(20, 4, ["0", "1", "2", "3"], 1)
    assert [w["CUDA_VISIBLE_DEVICES"] for w in plan] == ["0", "1", "2", "3"]
    assert grade.plan_workers(20, 1, eight, 4) == [{"CUDA_VISIBLE_DEVICES": "0,1,2,3"}]
    assert grade.plan_workers(1, None, eight, None) == [{"CUDA_VISIBLE_DEVICES": "0,1"}]
    # without GPUs: one worker per core and a few more, never more than the tasks
    assert grade.plan_workers(10, 3, [], None) == [{"CUDA_VISIBLE_DEVICES": ""}] * 3
    assert grade.plan_workers(2, None, [], None) == [{"CUDA_VISIBLE_DEVICES": ""}] * 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert limits.visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert limits.visible_gpus() == []


@pytest.mark.parametrize("gpus", [[], ["0"], ["0", "1"]])
def test_no_address_space_limit_where_a_kernel_sees_a_gpu(monkeypatch, tmp_path, gpus):
    """One decision (limits.address_space_limit) for grade.py, nbgrader autograde with the course's configuration
    and the tests' autograde helper: all three start kernels through SandboxedExecute.create_kernel_manager."""
    from autograder.execute import SandboxedExecute
    from tests.nbgrader_tools import builder

    monkeypatch.setattr(limits, "visible_gpus", lambda environment=None: list(gpus))
    assert limits.address_space_limit(6 << 30, bool(gpus)) == (0 if gpus else (6 << 30) + limits.ADDRESS_SPACE_SLACK)
    for config in (builder.load_config(), grade.course_config(tmp_path, SETTINGS_FOR_TEST)):
        execute = SandboxedExecute(config=config)
        execute._scratch, execute._workdir, execute._session = tmp_path, tmp_path, None
        execute._kernel_log, execute._watchdog = tmp_path / "kernel.log", None
        execute.sandbox = False
        try:
            prefix = execute.create_kernel_manager().launcher_prefix
        finally:
            shutil.rmtree(execute._sockets, ignore_errors=True)  # preprocess removes it; this test calls no preprocess
        assert ("--address-space" in prefix) is not bool(gpus), prefix
        # no one watches a graded run: gpulab's live plots draw their last frame only (gpulab.plots.LivePlot)
        from gpulab import plots

        assert f"{plots.UNWATCHED_VARIABLE}=1" in prefix


SETTINGS_FOR_TEST = {"cell_timeout": 30, "notebook_timeout": 60, "memory": 2 << 30, "sandbox": True}


def test_kernel_launcher_sets_limits_and_environment():
    code = (
        "import os, resource\n"
        "print(resource.getrlimit(resource.RLIMIT_AS)[0], resource.getrlimit(resource.RLIMIT_CORE)[0])\n"
        "print(os.environ['MARK'])\n"
    )
    prefix = limits.launcher_command(limits.Limits(address_space=3 << 30), {"MARK": "yes"})
    out = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(3 << 30), "0", "yes"]
    prefix = limits.launcher_command(limits.Limits(address_space=3 << 30), {"MARK": "yes"})
    bomb = "bytearray(8 << 30)"
    process = subprocess.run([*prefix, sys.executable, "-c", bomb], capture_output=True, text=True)
    assert process.returncode != 0 and "MemoryError" in process.stderr


@pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this machine")
def test_sandboxed_process_sees_only_what_it_is_given(tmp_path):
    work, secret_dir = tmp_path / "work", tmp_path / "instructor"
    work.mkdir()
    secret_dir.mkdir()
    (secret_dir / "solutions.txt").write_text("secret")
    (work / "shipped.py").write_text("x = 1")
    sandbox.give_to_kernel(work)
    probe = (
        "import json, os, socket\n"
        "found = {'uid': os.getuid(), 'cwd': os.getcwd(), 'env': sorted(os.environ)}\n"
        f"found['instructor'] = os.path.exists({str(secret_dir)!r})\n"
        f"found['repository'] = os.path.exists({str(REPO / 'source')!r})\n"
        "found['processes'] = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "try:\n    open('shipped.py', 'a').close(); found['shipped_writable'] = True\n"
        "except OSError:\n    found['shipped_writable'] = False\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); found['network'] = True\n"
        "except OSError:\n    found['network'] = False\n"
        "open('found.json', 'w').write(json.dumps(found))\n"
    )
    argv = sandbox.command(
        [sys.executable, "-c", probe],
        workdir=work,
        writable=[work],
        readonly_inside=[work / "shipped.py"],
        environment=sandbox.kernel_environment({"OMP_NUM_THREADS": "1"}, work),
    )
    subprocess.run(argv, check=True, timeout=60, env={**os.environ, "GRADER_SECRET": "x"})
    found = json.loads((work / "found.json").read_text())
    assert found["uid"] == sandbox.SANDBOX_UID and found["cwd"] == str(work)
    assert not found["instructor"] and not found["repository"] and not found["network"]
    assert not found["shipped_writable"]
    assert len(found["processes"]) <= 3, found["processes"]  # bwrap's init, setpriv's python, nothing of ours
    assert "GRADER_SECRET" not in found["env"] and set(found["env"]) <= set(sandbox.kernel_environment({}, work)) | {
        "OMP_NUM_THREADS",
        "PWD",
        "LC_CTYPE",
    }


def test_missing_bubblewrap_stops_grading_with_a_clear_message(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.unavailable_reason.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
            sandbox.require()
        assert grade.main([str(tmp_path), "--out", str(tmp_path.parent / "out-nosandbox")]) == 2
    finally:
        sandbox.unavailable_reason.cache_clear()


def test_a_due_date_is_read_as_nbgrader_reads_it_and_a_wrong_one_is_a_usage_error(capsys, tmp_path):
    assert grade.due_date("2027-01-15T17:00").isoformat() == "2027-01-15T17:00:00"  # UTC when no zone is named
    assert grade.due_date("2027-01-15 18:00+01:00").isoformat() == "2027-01-15T17:00:00"
    with pytest.raises(SystemExit) as stopped:
        grade.parse_args([str(tmp_path), "--out", str(tmp_path / "out"), "--duedate", "next friday"])
    assert stopped.value.code == 2 and "not a date and time" in capsys.readouterr().err


def test_symlinks_and_special_files_in_submissions_are_refused(tmp_path):
    lessons = {"01_splitting": SOURCE_ROOT / "01_splitting"}
    release = tmp_path / "release" / "01_splitting"
    release.mkdir(parents=True)
    (release / "01_splitting.ipynb").write_text("{}")
    folder = tmp_path / "subs" / "mallory" / "01_splitting"
    folder.mkdir(parents=True)
    (folder / "01_splitting.ipynb").symlink_to(SOURCE_ROOT / "01_splitting" / "01_splitting.py")
    os.mkfifo(tmp_path / "subs" / "mallory" / "pipe")
    honest = tmp_path / "subs" / "alice" / "01_splitting"
    honest.mkdir(parents=True)
    (honest / "01_splitting.ipynb").write_text("{}")
    (tmp_path / "subs" / "eve").symlink_to(honest.parent)
    tasks = {t.name: t for t in grade.discover(tmp_path / "subs", lessons, tmp_path / "release")}
    assert set(tasks) == {"mallory/01_splitting", "mallory/pipe", "alice/01_splitting", f"eve/{grade.ALL}"}
    refused = tasks["mallory/01_splitting"].error
    assert "refused: symbolic links" in refused and "01_splitting.ipynb" in refused
    assert tasks["mallory/pipe"].error == "refused: the assignment folder is a special file"
    assert tasks[f"eve/{grade.ALL}"].error == "refused: the student folder is a symbolic link (not followed)"
    assert tasks["alice/01_splitting"].error is None


def test_a_gradebook_with_a_trigger_or_an_extra_table_is_refused(tmp_path):
    import sqlite3

    from tests.nbgrader_tools import builder

    builder.new_gradebook(tmp_path / "gradebook.db")
    assert grade.schema_problems(tmp_path / "gradebook.db") == []
    with sqlite3.connect(tmp_path / "gradebook.db") as connection:
        connection.execute("CREATE TABLE loot (x)")
        connection.execute("CREATE TRIGGER zero AFTER UPDATE ON grade BEGIN UPDATE grade SET auto_score = 0; END")
    assert set(grade.schema_problems(tmp_path / "gradebook.db")) == {
        "unexpected table 'loot'",
        "unexpected trigger 'zero'",
    }


def test_descendants_are_found_and_killed_even_when_orphaned():
    spare = frozenset(limits.descendants())  # whatever else this test session runs
    script = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 10
        while len(set(limits.descendants()) - spare) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = set(limits.descendants()) - spare
        assert child.pid in found and len(found) == 2
        assert limits.kill_descendants(spare=spare) == 2
        assert child.wait(timeout=10) is not None
        assert set(limits.descendants()) - spare == set()
    finally:
        if child.poll() is None:
            child.kill()


@pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this machine")
def test_a_kernel_that_dies_at_start_leaves_nothing_behind(tmp_path):
    from nbformat.v4 import new_code_cell, new_notebook
    from traitlets.config import Config

    from autograder.execute import SandboxedExecute

    config = Config()
    config.CourseDirectory.root = str(tmp_path)
    config.SandboxedExecute.kernel_name = "python3"
    config.SandboxedExecute.kernel_env = {"PYTHONHOME": "/nonexistent"}  # the interpreter cannot start
    config.SandboxedExecute.startup_timeout = 30
    config.SandboxedExecute.check_modules = FIXTURE_CHECK_MODULES
    execute = SandboxedExecute(config=config)
    execute._autograded_tests = lambda resources: {"count_chunks_test": "assert True"}
    notebook = new_notebook(cells=[new_code_cell("print(1)")])
    workdir = tmp_path / "work"
    workdir.mkdir()
    resources = {"metadata": {"path": str(workdir)}, "nbgrader": {"assignment": "pipeline_lesson"}}
    with pytest.raises(RuntimeError, match="(?s)[Kk]ernel died.*kernel.s own output.*PYTHONHOME"):
        execute.preprocess(notebook, resources)
    assert list((tmp_path / ".scratch").iterdir()) == [], "the kernel's scratch folder (sockets, home) is removed"
    assert workdir.stat().st_uid == os.getuid(), "the working copy is given back to the grader"
    assert [c.source for c in notebook.cells] == ["print(1)"], "the notebook is left as it was"


def test_an_assignment_without_checks_is_a_grader_error_not_a_zero(tmp_path):
    from nbformat.v4 import new_code_cell, new_notebook
    from traitlets.config import Config

    from autograder.execute import SandboxedExecute

    config = Config()
    config.CourseDirectory.root = str(tmp_path)
    execute = SandboxedExecute(config=config)
    execute._autograded_tests = lambda resources: {"t": "assert True"}
    resources = {"metadata": {"path": str(tmp_path)}, "nbgrader": {"assignment": "99_unchecked"}}
    with pytest.raises(RuntimeError, match="grader error: '99_unchecked' has no checks"):
        execute.preprocess(new_notebook(cells=[new_code_cell("x = 1")]), resources)
    assert list((tmp_path / ".scratch").iterdir()) == [], "nothing is left behind"


def test_the_folder_nbgrader_runs_in_is_never_shown_to_a_kernel(tmp_path, monkeypatch):
    """`nbgrader autograde` puts its working folder, the grading course (gradebook, source/, submitted/), on
    sys.path: the sandbox shows no sys.path folder that is, holds or lies inside the folder grading runs in."""
    course = tmp_path / "course"
    (course / "lib").mkdir(parents=True)
    monkeypatch.chdir(course)
    monkeypatch.setattr(sys, "path", [str(course), str(course / "lib"), str(tmp_path), *sys.path])
    shown = sandbox.readonly_paths()
    assert not [path for path in shown if path == tmp_path or tmp_path in path.parents], shown
    assert Path(sys.prefix).resolve() in shown


def test_the_assignments_with_the_most_code_are_graded_first(tmp_path):
    """The workers take the lessons with the most code first (lesson 03, the longest to grade), students in their
    order within a lesson, so that a run ends on short notebooks."""
    for name in LESSONS:
        (tmp_path / name).mkdir()
        shutil.copy(RELEASE_ROOT / name / f"{name}.ipynb", tmp_path / name)
    tasks = [grade.Task(student, name, "") for student in ("ann", "bob") for name in LESSONS]
    ordered = grade.longest_first(tasks, tmp_path)
    assert [t.assignment for t in ordered[:2]] == ["03_gpu0_imbalance"] * 2
    assert [t.student for t in ordered[:2]] == ["ann", "bob"] and ordered[-1].assignment == "01_splitting"
    assert sorted(ordered, key=lambda t: (t.student, t.assignment)) == tasks


def test_the_grader_starts_the_kernelspecs_ipykernel_as_gpulab_kernel():
    """The python3 kernelspec's command, with ipykernel started by ``gpulab.kernel`` (its DDP fork server forked from
    it); any other command is left as it is."""
    from autograder.execute import grading_kernel

    spec = ["/env/bin/python", "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert grading_kernel(spec) == [*spec[:3], "gpulab.kernel", *spec[4:]]
    for other in (["/env/bin/python", "-m", "other_kernel", "-f", "x"], ["ipykernel_launcher", "-m"]):
        assert grading_kernel(other) == other
