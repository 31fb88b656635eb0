"""The red-team set (``autograder/redteam``) graded by ``autograder/grade.py``: no attack earns a point its answers
did not earn.

* The red-team submissions are graded in ``tests/test_autograder.py``'s run (each attack is a student
  ``rt-<attack>``): on every lesson the attacks whose outcome depends on the lesson's tests, on lesson 01 also
  those aimed at the grader itself (``GRADER_REDTEAM_ALL_LESSONS=1``: on every lesson). Each graded cell must score
  exactly what the attack's answers earn without the attack (0 for attacks on the blank release).
* The limit attacks (``os._exit``, a killed kernel, loops, a memory bomb, a fork, an output flood, display
  updates, ``sys.exit``) and the sandbox escape (``escape``) are graded in a second run with short limits, with an
  honest student alongside: each costs exactly its cells, the honest student keeps every point, the escape finds
  and changes nothing of the grader, feedback holds no leaked blob, and no process of the run is left.
* Stock nbgrader, for contrast, gives full marks to the blank release plus a 20-line swallowing payload.
* Round 3 (``shared_attacks``), a third run with two workers: kernels that use up what their uid may hold (epoll and
  inotify watches, the user keyring) beside and before honest students, a quiz number and a display update past
  the grader's bounds; every student keeps what its answers earn and no key passes from one kernel to the next.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from tests.nbgrader_tools import RELEASE_ROOT, REPO, SOURCE_ROOT, build_source, builder

sys.path.insert(0, str(REPO))
from autograder.redteam import GATE_ATTACKS, LIMIT_ATTACKS, Lesson  # noqa: E402
from tests.test_autograder import REDTEAM_LESSON, failure, main_run, redteam_attacks  # noqa: E402
from tests.test_gate import active_markup  # noqa: E402

GRADE = REPO / "autograder" / "grade.py"
pytestmark = pytest.mark.timeout(1800)  # the grading runs are fixtures: their time counts in their first test's
LESSONS = [n for n in sorted(builder.find_lessons(SOURCE_ROOT)) if (RELEASE_ROOT / n / f"{n}.ipynb").is_file()]
LIMITS_LESSON = REDTEAM_LESSON
CASES = [(lesson, attack.name) for lesson in LESSONS for attack in redteam_attacks(lesson)]


def _lesson(name: str, folder: Path) -> Lesson:
    return Lesson.from_paths(name, RELEASE_ROOT / name / f"{name}.ipynb", build_source(name, folder))


def _grade(submissions: Path, out: Path, *options: str) -> dict:
    command = [sys.executable, str(GRADE), str(submissions), "--out", str(out), "--no-progress", *options]
    process = subprocess.run(command, capture_output=True, text=True, timeout=1500, cwd=REPO)
    report = json.loads((out / "report.json").read_text())
    results = {(r["task"]["student"], r["task"]["assignment"]): r for r in report["results"]}
    return {"process": process, "results": results, "out": out}


def _scores(result: dict) -> dict[str, float]:
    assert result.get("error") is None, failure(result)
    (notebook,) = result["notebooks"].values()
    return {grade_id: score for grade_id, (score, _, _) in notebook["cells"].items()}


@pytest.fixture(scope="module")
def attack_run(tmp_path_factory):
    """The red-team submissions are graded in test_autograder's run (students ``rt-<attack>``)."""
    return main_run(tmp_path_factory)


def _attack_scores(run: dict, attack: str, lesson: str) -> dict[str, float]:
    return _scores(run["results"][(f"rt-{attack}", lesson)])


@pytest.mark.slow
@pytest.mark.parametrize("lesson,attack", CASES, ids=[f"{lesson}-{attack}" for lesson, attack in CASES])
def test_attack_earns_exactly_what_its_answers_earn(attack_run, lesson, attack):
    got = _attack_scores(attack_run, attack, lesson)
    expected = attack_run["expected"][(attack, lesson)]
    assert set(got) == set(expected)
    wrong = {g: (got[g], expected[g]) for g in expected if got[g] != expected[g]}
    assert not wrong, f"(got, expected) per cell: {wrong}"


@pytest.mark.slow
def test_attacks_are_graded_not_failed(attack_run):
    failed = {k: r["error"] for k, r in attack_run["results"].items() if k[0].startswith("rt-") and r.get("error")}
    assert not failed


@pytest.mark.slow
def test_stock_nbgrader_is_fooled_where_the_checks_are_not(attack_run, tmp_path):
    """Stock nbgrader (nbgrader's own Execute and SaveAutoGrades) gives the swallowing blank notebook full marks."""
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        Execute,
        IgnorePattern,
        LimitOutput,
        SaveAutoGrades,
    )

    name = LIMITS_LESSON
    builder.stage_lesson(SOURCE_ROOT / name, tmp_path / "source")
    config = builder.generate_in_course(tmp_path, name)
    stock = [Execute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades, AssignLatePenalties]
    config.Autograde.autograde_preprocessors = [*stock, CheckCellMetadata]
    target = tmp_path / "submitted" / "s" / name
    target.mkdir(parents=True)
    shutil.copy(attack_run["submissions"] / "rt-swallow_only" / name / f"{name}.ipynb", target)
    builder.run_nbgrader("autograde", config, name, "s", create_student=True)
    with Gradebook(config.CourseDirectory.db_url) as gradebook:
        submission = gradebook.find_submission(name, "s")
        assert submission.score == submission.max_score > 0
    checked = _attack_scores(attack_run, "swallow_only", name)
    assert set(checked.values()) == {0.0}


JAPANESE_BOMB = "memory_bomb_ja"  # the memory bomb in the Japanese edition: its feedback gives the limit in Japanese


def _japanese_release():
    return nbformat.read(RELEASE_ROOT / "ja" / LIMITS_LESSON / f"{LIMITS_LESSON}.ipynb", as_version=4)


def _in_japanese(reference):
    """The reference solution as a student of the Japanese edition hands it in: the Japanese release with the
    reference's answers (the editions' cells share their ids)."""
    answers = {cell.id: cell.source for cell in reference.cells if Lesson.meta(cell).get("solution")}
    japanese = _japanese_release()
    for cell in japanese.cells:
        cell.source = answers.get(cell.id, cell.source)
    return japanese


@pytest.fixture(scope="module")
def limit_run(tmp_path_factory):
    if LIMITS_LESSON not in LESSONS:
        pytest.skip(f"{LIMITS_LESSON} is not present")
    root = tmp_path_factory.mktemp("limits")
    lesson = _lesson(LIMITS_LESSON, root / "references")
    expected = {}
    for attack in LIMIT_ATTACKS + GATE_ATTACKS:
        path = root / "submissions" / attack.name / LIMITS_LESSON / f"{LIMITS_LESSON}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(attack.build(lesson, root), path)
        expected[attack.name] = attack.expected(lesson)
    japanese = Lesson(LIMITS_LESSON, _japanese_release(), _in_japanese(lesson.reference))
    (memory_bomb,) = [a for a in LIMIT_ATTACKS if a.name == "memory_bomb"]
    path = root / "submissions" / JAPANESE_BOMB / LIMITS_LESSON / f"{LIMITS_LESSON}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(memory_bomb.build(japanese, root), path)
    expected[JAPANESE_BOMB] = memory_bomb.expected(japanese)
    honest = root / "submissions" / "honest" / LIMITS_LESSON / f"{LIMITS_LESSON}.ipynb"
    honest.parent.mkdir(parents=True)
    nbformat.write(lesson.reference, honest)  # graded alongside the attacks: must keep every point
    expected["honest"] = dict(lesson.tests)
    before = set(Path(tempfile.gettempdir()).iterdir())  # what earlier tests left is not this run's
    # a cell's 30 s: the attacks that hold a cell cost that much; an honest cell (importing torch, one of several
    # kernels on a busy machine) must never come near it
    limits = ["--cell-timeout", "30", "--memory", "1.5", "--disk", "0.25", "--workers", "2"]
    run = _grade(root / "submissions", root / "out", *limits)
    run.update(expected=expected, root=root, temporary_before=before)
    return run


@pytest.mark.slow
@pytest.mark.parametrize("attack", [a.name for a in LIMIT_ATTACKS + GATE_ATTACKS] + [JAPANESE_BOMB, "honest"])
def test_limit_attack_costs_exactly_its_cells(limit_run, attack):
    got = _scores(limit_run["results"][(attack, LIMITS_LESSON)])
    expected = limit_run["expected"][attack]
    assert got == expected, {g: (got[g], expected[g]) for g in expected if got[g] != expected[g]}


@pytest.mark.slow
def test_the_sandbox_shows_and_lets_change_nothing_of_the_grader(limit_run):
    graded = nbformat.read(limit_run["out"] / "autograded" / "escape" / LIMITS_LESSON / f"{LIMITS_LESSON}.ipynb", 4)
    printed = [o.get("text", "") for c in graded.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    (found,) = [json.loads(t.split("ESCAPE-FINDINGS ", 1)[1]) for t in printed if "ESCAPE-FINDINGS " in t]
    assert found["read"] == {}, found["read"]
    assert not any(found["written"].values()), found["written"]
    assert found["other"]["killed"] == [] and found["other"]["network"] is False
    grader_variables = [v for v in found["other"]["environment"] if v.startswith(("GRADER", "JPY_", "NBGRADER"))]
    assert grader_variables == [], grader_variables
    assert not (REPO / "utils" / "gpulab" / "zz_redteam.py").exists()
    blob = "REDTEAM-LEAK-" + base64.b64encode(b"hidden tests would go here").decode()  # what escape prints
    for page in (limit_run["out"] / "feedback").rglob("*.html"):
        text = page.read_text()
        assert blob not in text and len(text) < 5_000_000, page
    for notebook in (limit_run["out"] / "autograded").rglob("*.ipynb"):  # 200 MB of display updates were sent
        assert notebook.stat().st_size < 25_000_000, notebook
    assert not (limit_run["out"] / ".scratch").exists(), "the kernels' scratch folders are removed"
    new_in_tmp = set(Path(tempfile.gettempdir()).iterdir()) - limit_run["temporary_before"]
    leftovers = [p for p in new_in_tmp if p.name.startswith(("sandbox-probe-", "kernel-"))]
    assert not leftovers, "nothing of the grader left in /tmp"


@pytest.mark.slow
def test_feedback_gives_the_limit_in_the_students_edition(limit_run):
    def feedback(student: str) -> str:
        return (limit_run["out"] / "feedback" / student / LIMITS_LESSON / f"{LIMITS_LESSON}.html").read_text()

    english, japanese = feedback("memory_bomb"), feedback(JAPANESE_BOMB)
    assert "Not run: the memory limit (1.5 GiB) was exceeded in cell" in english
    assert "実行されませんでした：メモリの上限（1.5 GiB）を超えました（セル" in japanese
    assert "memory limit" not in japanese and "Not run" not in japanese


@pytest.mark.slow
def test_limit_attacks_are_named_refused_and_leave_no_process(limit_run):
    assert limit_run["process"].returncode == 0, limit_run["process"].stderr[-3000:]
    stdout = limit_run["process"].stdout
    said = {line.strip().split("/", 1)[0]: line.strip() for line in stdout.splitlines() if ": stopped: " in line}
    for attack, stopped in (
        ("os_exit", "the kernel died"),
        ("memory_bomb", "the memory limit (1.5 GiB) was exceeded"),
        ("stubborn_loop", "cell"),
        ("disk_fill", "the disk limit (0.25 GiB or 100000 files in its folders) was exceeded"),
        ("deep_folder", "the disk limit"),
    ):
        assert f"{attack}/01_splitting: 01_splitting: stopped: {stopped}" in said.get(attack, ""), said.get(
            attack, sorted(said)
        )
    out = str(limit_run["out"])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        assert not cwd.startswith(out), f"process {pid} left running in {cwd}"


# --------------------------------------------------------------------------------------------- the gate
def _cgroups_here() -> bool:
    from autograder import cgroups

    try:
        cgroups.Hierarchy.find()
    except cgroups.Unavailable:
        return False
    return True


CGROUPS = _cgroups_here()  # where this test process can make memory cgroups, grading must use them


def _folder_entries(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` (relative) -> what it is, never following a link."""
    kinds = {}
    for path in sorted(folder.rglob("*")):
        mode = path.lstat().st_mode
        kinds[str(path.relative_to(folder))] = (
            "link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"
        )
    return kinds


@pytest.mark.slow
def test_nothing_a_kernel_leaves_reaches_the_graders_folders(limit_run):
    out = limit_run["out"]
    shipped = {p.name for p in (out / "source" / LIMITS_LESSON).iterdir() if not p.name.endswith((".ipynb", ".py"))}
    shipped |= {p.name for p in (out / "source" / LIMITS_LESSON).glob("*.py") if not p.name[:1].isdigit()}
    for student in limit_run["expected"]:
        autograded = _folder_entries(out / "autograded" / student / LIMITS_LESSON)
        allowed = {f"{LIMITS_LESSON}.ipynb", "timestamp.txt", *shipped}
        assert set(autograded) <= allowed and set(autograded.values()) <= {"file"}, (student, autograded)
        feedback = _folder_entries(out / "feedback" / student / LIMITS_LESSON)
        assert feedback == {f"{LIMITS_LESSON}.html": "file"}, (student, feedback)
    page = (out / "feedback" / "left_files" / LIMITS_LESSON / f"{LIMITS_LESSON}.html").read_text()
    for secret in (Path("/etc/passwd").read_text().splitlines()[0], "BEGIN HIDDEN TESTS"):
        assert secret not in page


@pytest.mark.slow
def test_a_feedback_page_carries_no_more_active_html_than_an_honest_students(limit_run):
    def page(student: str) -> Path:
        return limit_run["out"] / "feedback" / student / LIMITS_LESSON / f"{LIMITS_LESSON}.html"

    honest = active_markup(page("honest").read_text())
    assert honest["<script>"] > 0  # the page's own (MathJax): the parser sees scripts
    for student in limit_run["expected"]:
        assert active_markup(page(student).read_text()) == honest, student


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["memfd_bomb", "tmpfs_bomb"])
def test_shared_memory_stays_within_the_kernels_limit(limit_run, attack):
    stdout = limit_run["process"].stdout
    assert f"{attack}/{LIMITS_LESSON}: {LIMITS_LESSON}: stopped: the memory limit (1.5 GiB) was exceeded" in stdout
    report = json.loads((limit_run["out"] / "report.json").read_text())
    (result,) = [r for r in report["results"] if r["task"]["student"] == attack]
    (notebook,) = result["notebooks"].values()
    assert notebook["report"]["memory_accounting"].startswith("cgroup v") or not CGROUPS
    assert notebook["report"]["peak_memory"] <= 1.5 * (1 << 30) * 1.01


@pytest.mark.slow
def test_no_grading_worker_exceeds_its_memory_bound(limit_run):
    report = json.loads((limit_run["out"] / "report.json").read_text())
    peaks = {r["task"]["student"]: r.get("worker_peak_rss") for r in report["results"]}
    assert all(type(p) is int for p in peaks.values()), peaks
    # an honest worker holds a few hundred MiB; the decoder bomb's answers would hold gigabytes once decoded
    assert max(peaks.values()) < 1 << 30, peaks
    assert report["memory_accounting"].startswith("cgroup v") or not CGROUPS, report["memory_accounting"]


@pytest.mark.slow
def test_grades_csv_read_back_equals_the_gradebook(limit_run):
    import csv

    from nbgrader.api import Gradebook

    out = limit_run["out"]
    with (out / "grades.csv").open(newline="") as handle:
        rows = {(r["student_id"], r["assignment"]): float(r["score"]) for r in csv.DictReader(handle)}
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gradebook:
        scores = {
            (s.id, LIMITS_LESSON): float(gradebook.find_submission(LIMITS_LESSON, s.id).score)
            for s in gradebook.students
        }
    assert rows == scores and set(s for s, _ in rows) == set(limit_run["expected"])


# --------------------------------------------------------------------------------------------- round 3
# Two workers grade, in this order: the epoll filler (which holds the watches SHARED_HOLD s) beside the keyring and
# inotify filler (which waits SHARED_WAIT s, so that the students after it start while the watches are held); then,
# one after another in the second worker, an honest student, the keyring reader, the two attacks on the grader's
# bounds and another honest student. Every kernel ran as host uid 65534: the honest student beside the filler lost
# its kernel (ZeroMQ: "No space left on device"), and the reader found the key.
SHARED_HOLD, SHARED_WAIT = 150, 75
SHARED_ORDER = [
    "a-epoll_hold",
    "b-keyring_and_inotify",
    "c-honest",
    "d-keyring_read",
    "e-quiz_number_bomb",
    "f-display_fanout",
    "g-honest",
]


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    from autograder.redteam import shared_attacks

    if LIMITS_LESSON not in LESSONS:
        pytest.skip(f"{LIMITS_LESSON} is not present")
    root = tmp_path_factory.mktemp("shared")
    lesson = _lesson(LIMITS_LESSON, root / "references")
    description = f"gpulab-redteam-{os.urandom(6).hex()}"
    attacks = {a.name: a for a in shared_attacks(description, SHARED_HOLD, SHARED_WAIT)}
    expected = {}
    for student in SHARED_ORDER:
        name = student.split("-", 1)[1]
        path = root / "submissions" / student / LIMITS_LESSON / f"{LIMITS_LESSON}.ipynb"
        path.parent.mkdir(parents=True)
        if name == "honest":
            nbformat.write(lesson.reference, path)
            expected[student] = dict(lesson.tests)
        else:
            nbformat.write(attacks[name].build(lesson, root), path)
            expected[student] = attacks[name].expected(lesson)
    options = ["--workers", "2", "--cell-timeout", "300", "--notebook-timeout", "500", "--memory", "3"]
    run = _grade(root / "submissions", root / "out", *options)
    run.update(expected=expected, description=description)
    return run


def _printed(run: dict, student: str) -> str:
    path = run["out"] / "autograded" / student / LIMITS_LESSON / f"{LIMITS_LESSON}.ipynb"
    graded = nbformat.read(path, as_version=4)
    outputs = [o for c in graded.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


def _said(run: dict, student: str, marker: str) -> list[str]:
    """The words of the line the student's notebook printed starting with ``marker``."""
    lines = [line.split() for line in _printed(run, student).splitlines() if line.startswith(marker)]
    assert lines, f"{student} printed no {marker} line"
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("student", SHARED_ORDER)
def test_a_kernel_that_uses_up_what_its_uid_may_hold_costs_no_one_anything(shared_run, student):
    """Every student of the run keeps exactly what its answers earn: the honest ones graded beside the filled epoll
    watches and inotify instances and after them every point, the attackers theirs."""
    result = shared_run["results"][(student, LIMITS_LESSON)]
    got, expected = _scores(result), shared_run["expected"][student]
    assert got == expected, {g: (got[g], expected[g]) for g in expected if got[g] != expected[g]}


@pytest.mark.slow
def test_the_attacks_took_what_their_uid_may_hold(shared_run):
    """The run shows what it claims: the epoll watches and inotify instances were used up (not merely tried)."""
    epoll = _said(shared_run, "a-epoll_hold", "EPOLL-WATCHES")
    assert int(epoll[1]) > 0 and " ".join(epoll[2:]) == "No space left on device", epoll
    added = _said(shared_run, "b-keyring_and_inotify", "KEY-ADDED")
    assert int(added[1]) > 0 and added[2] == "INOTIFY" and int(added[3]) > 0 and int(added[4]) > 0, added


@pytest.mark.slow
def test_a_key_one_kernel_left_is_not_found_by_a_kernel_graded_after_it(shared_run):
    assert _said(shared_run, "d-keyring_read", "KEY-FOUND") == ["KEY-FOUND", "-1"]


@pytest.mark.slow
def test_bounds_hold_against_a_quiz_number_and_a_display_update(shared_run):
    """The quiz answers whose fractions have billions of digits cost their two questions only, and the display
    update copied into 60 outputs is charged as such: the graded notebook stays small, and so does the worker."""
    report = json.loads((shared_run["out"] / "report.json").read_text())
    results = {r["task"]["student"]: r for r in report["results"]}
    notebook = shared_run["out"] / "autograded" / "f-display_fanout" / LIMITS_LESSON / f"{LIMITS_LESSON}.ipynb"
    assert notebook.stat().st_size < 25_000_000
    assert "output truncated by the grader" in _printed(shared_run, "f-display_fanout")
    peaks = {student: results[student].get("worker_peak_rss") for student in SHARED_ORDER}
    assert all(type(p) is int and p < 1 << 30 for p in peaks.values()), peaks
    assert shared_run["process"].returncode == 0, shared_run["process"].stderr[-3000:]
