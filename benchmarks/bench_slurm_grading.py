"""Grading a class as a Slurm job array (``class_hub.py grade --slurm``) against one ``grade.py`` run, in the same run.

Every student submits the reference solution of lesson 01 (``--lesson``). On a one-node Slurm cluster
(``tests/slurm_cluster.py``; the node declares this machine's own CPU count, so the array runs as many tasks at once
as ``grade.py`` runs workers), measured wall clock, each from a fresh output folder, in the order given by
``--order`` (default: one box first):

* **one box**: ``autograder/grade.py <submissions> --workers <CPUs>`` (one process, a pool of workers, one
  gradebook);
* **array**: ``sbatch --wait --array`` of the very batch script ``class_hub.py grade --slurm`` submits
  (``class_slurm.task_script``: one task per student, each ``grade.py --student <s> --workers 1`` into a folder of
  its own, ``--cpus-per-task 1``), then ``class_slurm.py merge``: from submission to the merged ``grades.csv``.

Both must grade every submission at full marks and give the same ``grades.csv`` scores, or no JSON is written. The
JSON also splits the array's time into its serial parts (submission to first task start, merge) and the tasks'
own times, so that the scaling to N nodes can be read off (docs/instructors.md, "A class on a Slurm cluster").

    .venv/bin/python benchmarks/bench_slurm_grading.py [--students 30] [--lesson 01_splitting]   # as root
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "benchmarks"))

import class_slurm  # noqa: E402
from bench_grading import describe_machine, make_submissions  # noqa: E402

from tests.slurm_cluster import missing_programs, one_node_cluster  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "slurm_grading_cpu.json"
TARGET_OVERHEAD = 0.10  # the array may add at most this fraction on one node


def scores(grades_csv: Path) -> dict[str, float]:
    with open(grades_csv, newline="") as handle:
        return {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(handle)}


def full_marks(out: Path) -> bool:
    report = json.loads((out / "report.json").read_text())
    return bool(report["results"]) and all(
        not r.get("error") and r["score"] == r["max_score"] for r in report["results"]
    )


def one_box(submissions: Path, out: Path, lesson: str, workers: int) -> dict:
    command = [sys.executable, REPO / "autograder" / "grade.py", submissions, "--out", out, "--assignment", lesson]
    command += ["--no-progress", "--workers", str(workers)]
    began = time.perf_counter()
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0 or not full_marks(out):
        raise SystemExit(f"grade.py did not grade everything at full marks:\n{done.stderr[-4000:]}")
    return {"seconds": round(seconds, 1), "workers": workers}


def array(cluster, submissions: Path, tasks: Path, out: Path, lesson: str, students: list[str]) -> dict:
    settings = {"slurm": {"partition": cluster.partition}}
    options = SimpleNamespace(
        task_partition=None, task_time="1:00:00", task_memory=2.0, task_cpus=1, task_gpus=0
    )  # class_hub.py grade --slurm's defaults, with 2 GiB (the one node's memory is shared by all its tasks)
    tasks.mkdir(mode=0o700)
    (tasks / "learners.txt").write_text("".join(f"{name}\n" for name in students))
    script = class_slurm.task_script(settings, options, Path(sys.executable), REPO, submissions, tasks, lesson, None)
    (tasks / "grade.sh").write_text(script)
    environment = {**os.environ, **cluster.env}
    began = time.perf_counter()
    submitted = subprocess.run(
        ["sbatch", "--wait", "--parsable", f"--array=0-{len(students) - 1}", str(tasks / "grade.sh")],
        env=environment,
        capture_output=True,
        text=True,
    )
    array_ended = time.perf_counter()
    merge = [sys.executable, REPO / "scripts" / "class_slurm.py", "merge", tasks, out, "--assignment", lesson]
    merged = subprocess.run([str(part) for part in merge], capture_output=True, text=True)
    ended = time.perf_counter()
    report = json.loads((out / "merge.json").read_text()) if (out / "merge.json").is_file() else {}
    if submitted.returncode != 0 or merged.returncode != 0 or report.get("findings") or not full_marks_merged(out):
        logs = "".join(f"\n--- {p}\n{p.read_text()[-1500:]}" for p in sorted(tasks.glob("*.log"))[:3])
        raise SystemExit(f"the array did not grade everything:\n{submitted.stderr}{merged.stdout}{logs}")
    task_seconds = []
    for student in students:
        part = json.loads((tasks / student / "report.json").read_text())
        task_seconds.append(part["seconds"])
    return {
        "seconds": round(ended - began, 1),
        "array_seconds": round(array_ended - began, 1),
        "merge_seconds": round(ended - array_ended, 1),
        "tasks": len(students),
        "mean_grade_py_seconds_per_task": round(sum(task_seconds) / len(task_seconds), 1),
        "job": submitted.stdout.strip(),
    }


def full_marks_merged(out: Path) -> bool:
    report = json.loads((out / "merge.json").read_text())
    results = report.get("results", [])
    return bool(results) and all(not r.get("error") and r["score"] == r["max_score"] for r in results)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--lesson", default="01_splitting")
    parser.add_argument("--order", choices=("one-box-first", "array-first"), default="one-box-first")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("the benchmark runs Slurm's daemons: run it as root")
    if missing_programs():
        raise SystemExit(f"missing {', '.join(missing_programs())}: apt-get install slurm-wlm munge")
    from tests.nbgrader_tools import build_source

    cpus = os.cpu_count() or 1
    record = {
        "benchmark": "grading a class: one grade.py run vs a Slurm job array (one task per student) plus its merge",
        "lesson": args.lesson,
        "students": args.students,
        "submission": "the reference solution (every cell runs)",
        "cluster": f"one node, this machine: {cpus} CPUs declared to Slurm, tasks of 1 CPU",
        "machine": describe_machine(),
        "target_overhead_on_one_node": TARGET_OVERHEAD,
    }
    root = Path(tempfile.mkdtemp(prefix="bench-slurm-", dir="/tmp"))
    os.chmod(root, 0o755)
    try:
        reference = build_source(args.lesson, root / "references")
        submissions = make_submissions(root / "submissions", args.students, {args.lesson: reference})
        students = sorted(p.name for p in submissions.iterdir())
        with one_node_cluster(root / "cluster", gpus=2, cpus=cpus, memory_mb=2048 * cpus) as cluster:
            runs = {
                "one_box": lambda: one_box(submissions, root / "one-box", args.lesson, cpus),
                "array": lambda: array(cluster, submissions, root / "tasks", root / "array", args.lesson, students),
            }
            order = ["one_box", "array"] if args.order == "one-box-first" else ["array", "one_box"]
            for name in order:
                print(f"timing {name} ...", flush=True)
                record[name] = runs[name]()
                print(f"  {record[name]}", flush=True)
        same = scores(root / "one-box" / "grades.csv") == scores(root / "array" / "grades.csv")
        if not same:
            raise SystemExit("the array's grades.csv differs from grade.py's")
        record["same_grades"] = same
        record["overhead_on_one_node"] = round(record["array"]["seconds"] / record["one_box"]["seconds"] - 1, 3)
        record["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
