"""The instructor's grading command, ``autograder/grade.py``, end to end, for every lesson present.

One module-scoped run grades, for each lesson with a source and a release: the reference solution, the blank
release, a copy of the reference with its nbgrader metadata stripped (and a foreign conda kernelspec), and a copy
saved the way Colab saves it (nbformat 4.0, no cell ids, Colab's metadata and kernelspec, renamed "Copy of ...");
plus submissions that cannot be graded (not a notebook, another lesson's notebook, no notebook, an unknown
assignment), and the red-team submissions that ``tests/test_redteam.py`` checks (``main_run`` is shared: grading is
what takes the time). The tests then read its exit status, table, ``report.json``, ``grades.csv`` and feedback. A
second run of one submission into the same folder checks that grading twice gives the same grades.

Unit tests cover the parts that need no kernel: metadata repair, discovery, worker planning, evidence records,
the kernel launcher's limits and process clean-up.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import html
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from tests.nbgrader_tools import RELEASE_ROOT, REPO, SOURCE_ROOT, build_source, builder

sys.path.insert(0, str(REPO))
from autograder import grade, limits  # noqa: E402
from autograder.evidence import EvidenceSession  # noqa: E402
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


def run_grade(submissions: Path, out: Path, *options: str, timeout: int = 900) -> subprocess.CompletedProcess:
    command = [sys.executable, str(GRADE), str(submissions), "--out", str(out), "--no-progress", *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)


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
    from autograder.redteam import Lesson, known_weaknesses, swallow_only

    root = tmp_path_factory.mktemp("grading")
    submissions, out = root / "submissions", root / "out"
    references = {name: build_source(name, root / "references") for name in LESSONS}
    expected, weak = {}, {}
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
            weak[(attack.name, name)] = known_weaknesses(name, attack)
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
    process = run_grade(submissions, out, "--cell-timeout", "30")
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
        "weak": weak,
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
    assert secrets, "the lesson has hidden tests"
    for variant in ("reference", "blank", "stripped"):
        page = (graded["out"] / "feedback" / variant / lesson / f"{lesson}.html").read_text()
        assert "HIDDEN TESTS" not in page
        leaked = [s for s in secrets if s in page or html.escape(s) in page or html.escape(s, quote=False) in page]
        assert not leaked, (variant, leaked[:3])
    blank = (graded["out"] / "feedback" / "blank" / lesson / f"{lesson}.html").read_text()
    assert "failed" in blank


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
    nb.cells[tests[1]].source = nb.cells[tests[1]].source.replace("assert", "assert True or", 1)
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
    assert "assert True or" in cell.source  # nbgrader restores locked tests by checksum; the guard runs the source
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


def test_grading_benchmark_refuses_a_run_that_did_not_grade_everything():
    """benchmarks/bench_grading.py: a time counts only for a run that graded every submission at full marks."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_grading", REPO / "benchmarks" / "bench_grading.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    complete = {"seconds": 9.0, "exit_ok": True, "submissions": 4, "graded": 4, "all_full_marks": True}
    assert bench._must_have_graded_everything("run", dict(complete), 4, "") == complete
    for broken in ({"exit_ok": False}, {"graded": 2}, {"submissions": 3}, {"all_full_marks": False}):
        with pytest.raises(bench.RunFailed, match="InvalidEntry"):
            bench._must_have_graded_everything("run", complete | broken, 4, "InvalidEntry: student")


def test_one_worker_per_gpu_and_one_per_core_without(monkeypatch):
    assert grade.plan_workers(10, None, ["0", "1", "2", "3"], 1) == [{"CUDA_VISIBLE_DEVICES": str(i)} for i in range(4)]
    assert grade.plan_workers(10, None, ["0"], 1) == [{"CUDA_VISIBLE_DEVICES": "0"}]
    assert grade.plan_workers(10, None, ["0", "1", "2", "3"], 2) == [
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        {"CUDA_VISIBLE_DEVICES": "2,3"},
    ]
    assert grade.plan_workers(1, None, ["0", "1"], 1) == [{"CUDA_VISIBLE_DEVICES": "0"}]
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert grade.plan_workers(10, None, [], 1) == [{"CUDA_VISIBLE_DEVICES": ""}] * min(4, grade.default_cpu_workers())
    assert grade.plan_workers(10, 3, [], 1) == [{"CUDA_VISIBLE_DEVICES": ""}] * 3
    assert grade.plan_workers(2, None, [], 1) == [{"CUDA_VISIBLE_DEVICES": ""}] * 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert grade.visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert grade.visible_gpus() == []


def test_evidence_accepts_only_authentic_records():
    session = EvidenceSession({"t1": "assert True", "t2": "assert True"})
    try:
        mac = session._mac("ok", "t1", "")
        lines = [
            json.dumps(["ok", "t1", ""]) + " " + mac,
            json.dumps(["ok", "t2", ""]) + " " + "0" * 64,  # forged
            json.dumps(["ok", "t2", ""]) + " " + mac,  # t1's mac replayed for t2
            'ok "t2" "" ' + mac,  # malformed
        ]
        session.evidence_path.write_text("\n".join(lines) + "\n")
        assert set(session.records()) == {"t1"}
        assert "key" in json.loads(session.config_path.read_text())
    finally:
        session.close()
    assert not session.folder.exists()


def test_kernel_launcher_sets_limits_and_environment():
    code = (
        "import os, resource\n"
        "print(resource.getrlimit(resource.RLIMIT_AS)[0], resource.getrlimit(resource.RLIMIT_CORE)[0])\n"
        "print(os.environ['MARK'])"
    )
    prefix = limits.launcher_command(limits.Limits(address_space=3 << 30), {"MARK": "yes"})
    out = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(3 << 30), "0", "yes"]
    bomb = "bytearray(8 << 30)"
    process = subprocess.run([*prefix, sys.executable, "-c", bomb], capture_output=True, text=True)
    assert process.returncode != 0 and "MemoryError" in process.stderr


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
