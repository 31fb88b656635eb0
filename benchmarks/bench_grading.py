"""How long grading takes: one student's lessons, and a class, with ``autograder/grade.py`` and with nbgrader's CLI.

Targets (COURSE issue): one student's four lessons in <= 60 s, 30 students in <= 15 min, on the 2-core CI machine.

Every student submits the reference solution of every lesson present (the slowest case: every cell runs). Measured,
wall clock, each from a fresh output folder:

* ``grade.py`` on 1 student, then on ``--students`` students (parallel workers, one sqlite gradebook);
* a sweep of the number of workers (``--sweep-workers``) on a small class, which chose grade.py's default;
* the baseline an instructor would otherwise run, nbgrader's own command line in a course folder holding the same
  submissions and the same configuration: ``nbgrader autograde <lesson>`` then ``nbgrader generate_feedback
  <lesson>`` for each lesson (nbgrader grades the students of one assignment one after the other), on 1 student and
  on ``--baseline-students`` students.

Each timed run also gives ``core_seconds``: the CPU time the whole machine spent while it ran (``/proc/stat``: every
core's user, nice, system, irq and softirq time; nothing else should run meanwhile), which compares machines of
different speeds better than the wall clock does; ``null`` where the system has no ``/proc/stat``.

Nothing is extrapolated: the JSON says how many students each figure is for, and the machine it ran on. A run
that does not grade every submission at full marks (exit status, count, scores) stops the benchmark with what it
printed, and no JSON is written: a run that skipped submissions is not a time for grading them.

    .venv/bin/python benchmarks/bench_grading.py [--students 30] [--baseline-students N] [--sweep-workers 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autograder import grade, limits  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "grading_cpu.json"
TARGET_ONE_STUDENT_S = 60.0
TARGET_CLASS_S = 15 * 60.0
TARGET_CLASS_SIZE = 30


def describe_machine() -> dict:
    import nbgrader
    import torch

    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        memory = None
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = limits.visible_gpus()
    return {
        "accelerator": f"{len(gpus)} GPU(s)" if gpus else "CPU, no GPU",
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(memory, 1) if memory else None,
        "load_average_1_5_15_min": [round(x, 2) for x in os.getloadavg()],
        # the benchmark's scheduling priority (-10: ahead of work at nice 0 or above sharing the machine)
        "nice": os.nice(0),
        "torch": torch.__version__,
        "nbgrader": nbgrader.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def busy_core_seconds(stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds every core has spent busy since boot (``/proc/stat``'s first line, less idle, iowait and steal),
    or None where there is no such file. Its difference across a run is what the run cost the machine."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already inside user and nice]
    ticks = [int(value) for value in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4] - ticks[7]
    return busy / os.sysconf("SC_CLK_TCK")


def _cost(started_busy: float | None) -> float | None:
    ended = busy_core_seconds()
    return None if started_busy is None or ended is None else round(ended - started_busy, 1)


def make_submissions(folder: Path, students: int, references: dict[str, Path]) -> Path:
    for index in range(students):
        for lesson, notebook in references.items():
            target = folder / f"student{index:02d}" / lesson
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(notebook, target / notebook.name)
    return folder


class RunFailed(RuntimeError):
    """A timed run did not grade every submission at full marks: its time is not a figure of anything."""


def _must_have_graded_everything(what: str, measured: dict, expected: int, details: str) -> dict:
    complete = measured["submissions"] == expected and measured.get("graded", expected) == expected
    if measured["exit_ok"] and complete and measured["all_full_marks"]:
        return measured
    raise RunFailed(f"{what}: {measured}\n{details[-4000:]}")


def time_grade_py(submissions: Path, out: Path, expected: int, workers: int | None = None) -> dict:
    command = [sys.executable, str(REPO / "autograder" / "grade.py"), str(submissions), "--out", str(out)]
    command += ["--no-progress", *(["--workers", str(workers)] if workers else [])]
    busy, started = busy_core_seconds(), time.perf_counter()
    process = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    core_seconds = _cost(busy)
    report = json.loads((out / "report.json").read_text())
    per_lesson: dict[str, list[float]] = {}
    for result in report["results"]:
        per_lesson.setdefault(result["task"]["assignment"], []).append(result.get("seconds") or 0.0)
    graded = [r for r in report["results"] if not r.get("error")]
    full = all(r["score"] == r["max_score"] for r in graded)
    measured = {
        "seconds": round(seconds, 1),
        "core_seconds": core_seconds,
        "exit_status": process.returncode,
        "exit_ok": process.returncode == 0,
        "submissions": len(report["results"]),
        "graded": len(graded),
        "all_full_marks": full,
        "workers": report["workers"],
        "mean_seconds_per_submission_in_a_worker": {k: round(sum(v) / len(v), 1) for k, v in per_lesson.items()},
    }
    return _must_have_graded_everything(f"grade.py on {submissions}", measured, expected, process.stderr)


def time_nbgrader_cli(submissions: Path, course: Path, lessons: list[str], expected: int) -> dict:
    """nbgrader's CLI in a course folder prepared like grade.py's (same config, gradebook, staged lessons)."""
    grade.prepare_course(course, lessons, grade.lessons_present())
    shutil.copytree(submissions, course / "submitted")
    nbgrader = str(Path(sys.executable).with_name("nbgrader"))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    busy, started = busy_core_seconds(), time.perf_counter()
    statuses, errors = [], ""
    for lesson in lessons:
        for step in ("autograde", "generate_feedback"):
            process = subprocess.run([nbgrader, step, lesson], cwd=course, capture_output=True, text=True, env=env)
            statuses.append(process.returncode)
            errors += process.stderr if process.returncode else ""
    seconds = time.perf_counter() - started
    core_seconds = _cost(busy)
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        submissions_graded = [s for a in gradebook.assignments for s in a.submissions]
        full = all(s.score == s.max_score for s in submissions_graded)
    measured = {
        "seconds": round(seconds, 1),
        "core_seconds": core_seconds,
        "exit_statuses": statuses,
        "exit_ok": not any(statuses),
        "submissions": len(submissions_graded),
        "all_full_marks": full,
        "commands": [f"nbgrader {step} {lesson}" for lesson in lessons for step in ("autograde", "generate_feedback")],
    }
    return _must_have_graded_everything(f"nbgrader's CLI in {course}", measured, expected, errors)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=TARGET_CLASS_SIZE, help="class size for grade.py")
    parser.add_argument("--baseline-students", type=int, default=None, help="class size for the nbgrader CLI")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON results")
    parser.add_argument(
        "--sweep-workers",
        default="1,2,4",
        help="also grade --sweep-students students with each of these worker counts ('' to skip)",
    )
    parser.add_argument("--sweep-students", type=int, default=2, help="class size of the worker sweep")
    args = parser.parse_args(argv)
    baseline_students = args.baseline_students or args.students
    from tests.nbgrader_tools import build_source

    lessons = [n for n in grade.lessons_present() if (REPO / "lessons" / n / f"{n}.ipynb").is_file()]
    results: dict = {
        "benchmark": "grading wall time: autograder/grade.py vs nbgrader's command line",
        "lessons": lessons,
        "submission": "the reference solution of every lesson (every cell runs)",
        "kernels": "each in its bubblewrap sandbox (autograder/sandbox.py), for grade.py and for nbgrader's CLI "
        "with the course's configuration alike",
        "machine": describe_machine(),
        "targets": {
            "one_student_all_lessons_s": TARGET_ONE_STUDENT_S,
            "class_s": TARGET_CLASS_S,
            "class_size": TARGET_CLASS_SIZE,
        },
    }
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        root = Path(tmp)
        references = {name: build_source(name, root / "references") for name in lessons}
        runs = {
            "grade_py_one_student": (1, "grade"),
            "nbgrader_cli_one_student": (1, "cli"),
            f"grade_py_{args.students}_students": (args.students, "grade"),
            f"nbgrader_cli_{baseline_students}_students": (baseline_students, "cli"),
        }
        for name, (students, kind) in runs.items():
            submissions = make_submissions(root / f"{name}-submissions", students, references)
            print(f"{name}: {students} student(s) x {len(lessons)} lessons ...", flush=True)
            expected = students * len(lessons)
            if kind == "grade":
                measured = time_grade_py(submissions, root / f"{name}-out", expected)
            else:
                measured = time_nbgrader_cli(submissions, root / f"{name}-course", lessons, expected)
            measured["students"] = students
            results[name] = measured
            print(f"  {measured['seconds']} s", flush=True)
        sweep = [int(w) for w in args.sweep_workers.split(",") if w.strip()]
        if sweep:
            submissions = make_submissions(root / "sweep-submissions", args.sweep_students, references)
            results["worker_sweep"] = {"students": args.sweep_students, "seconds_by_workers": {}}
            for workers in sweep:
                print(f"sweep: {args.sweep_students} students with {workers} worker(s) ...", flush=True)
                measured = time_grade_py(
                    submissions, root / f"sweep-{workers}", args.sweep_students * len(lessons), workers
                )
                results["worker_sweep"]["seconds_by_workers"][str(workers)] = measured["seconds"]
                print(f"  {measured['seconds']} s", flush=True)
    one = results["grade_py_one_student"]["seconds"]
    class_run = results[f"grade_py_{args.students}_students"]
    results["one_student_within_target"] = one <= TARGET_ONE_STUDENT_S
    results["class_measured_students"] = args.students
    if args.students == TARGET_CLASS_SIZE:
        results["class_within_target"] = class_run["seconds"] <= TARGET_CLASS_S
    else:
        results["class_within_target"] = None
        results["class_note"] = (
            f"measured {args.students} students, not {TARGET_CLASS_SIZE}: no figure for {TARGET_CLASS_SIZE} is given"
        )
    results["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "machine"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
