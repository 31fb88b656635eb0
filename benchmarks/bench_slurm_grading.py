"""Grading a class as a Slurm job array (``class_hub.py grade --slurm``) against one ``grade.py`` run, in the same run.

Every student submits the reference solution of lesson 01 (``--lesson``). On a one-node Slurm cluster
(``tests/slurm_cluster.py``; the node declares this machine's own CPU count, so the array runs as many tasks at once
as ``grade.py`` runs workers), measured wall clock, each from a fresh output folder:

* **one box**: ``autograder/grade.py <submissions> --workers <CPUs>`` (one process, a pool of workers, one
  gradebook);
* **array**: ``sbatch --array`` of the very batch script ``class_hub.py grade --slurm`` submits, with its
  default split of the learners (``class_slurm.split_learners`` over the slots ``sinfo`` shows: here one task per
  CPU, each ``grade.py --student <s> ... --workers 1`` into a folder of its own, ``--cpus-per-task 1``), then
  ``class_slurm.py merge``: from submission to the merged ``grades.csv``.

The machine is shared, so the two are timed in ``--rounds`` interleaved pairs (one box first, then the array first,
and so on) and the array's overhead is read from each pair's ratio: the JSON gives every pair, the minimum and the
median. Each run records how busy other work kept the machine meanwhile (``tests/machine_load.py``). Every run must
grade every submission at full marks, and both must give the same ``grades.csv`` scores, or no JSON is written. The
array's runs also split its time into its serial parts (submission to the first task's start, the last task's end
to ``squeue`` no longer listing the array, the merge) and the tasks' own times, so that the scaling to N nodes can
be read off (docs/instructors.md, "A class on a Slurm cluster").

    .venv/bin/python benchmarks/bench_slurm_grading.py [--students 30] [--rounds 3] [--lesson 01_splitting]  # root
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "benchmarks"))

import class_slurm  # noqa: E402
from bench_grading import describe_machine, make_submissions  # noqa: E402

from tests.machine_load import OtherWork  # noqa: E402
from tests.slurm_cluster import missing_programs, one_node_cluster  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "slurm_grading_cpu.json"
TARGET_OVERHEAD = 0.10  # the array may add at most this fraction on one node


def scores(grades_csv: Path) -> dict[str, float]:
    with open(grades_csv, newline="") as handle:
        return {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(handle)}


def all_full_marks(results: list[dict], students: int) -> bool:
    graded = [r for r in results if not r.get("error") and r.get("score") == r.get("max_score")]
    return len(results) == students and len(graded) == students


def one_box(submissions: Path, out: Path, lesson: str, workers: int, students: int) -> dict:
    command = [sys.executable, REPO / "autograder" / "grade.py", submissions, "--out", out, "--assignment", lesson]
    command += ["--no-progress", "--workers", str(workers)]
    began = time.perf_counter()
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True)
    seconds = time.perf_counter() - began
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    if done.returncode != 0 or not all_full_marks(report.get("results", []), students):
        raise SystemExit(f"grade.py did not grade everything at full marks:\n{done.stderr[-4000:]}")
    return {"seconds": round(seconds, 1), "workers": workers}


def array(cluster, submissions: Path, tasks: Path, out: Path, lesson: str, students: list[str]) -> dict:
    settings = {"slurm": {"partition": cluster.partition}}
    options = SimpleNamespace(
        task_partition=None, task_memory=2.0, task_cpus=1, task_gpus=0
    )  # class_hub.py grade --slurm's defaults, with 2 GiB (the one node's memory is shared by all its tasks)
    environment = {**os.environ, **cluster.env}
    began = time.perf_counter()
    submitted_at = time.time()
    # what grade_array does: the slots sinfo shows, the learners split over them, a time limit per task
    listed = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%c %m %G", f"--partition={cluster.partition}"],
        env=environment,
        capture_output=True,
        text=True,
    )
    slots = class_slurm.partition_slots(listed.stdout, options.task_cpus, options.task_memory, options.task_gpus)
    groups = class_slurm.split_learners(students, slots)
    time_limit = str(class_slurm.task_minutes(max(map(len, groups)), 1))
    name = class_slurm.array_name(lesson)
    script = class_slurm.task_script(
        settings, options, Path(sys.executable), REPO, submissions, tasks, lesson, None, time_limit, name
    )
    class_slurm.write_tasks(tasks, groups, script)
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--array=0-{len(groups) - 1}", str(tasks / "grade.sh")],
        env=environment,
        capture_output=True,
        text=True,
    )
    if submitted.returncode == 0:
        class_slurm.wait_for_array(name, "root", cluster.env)
    array_ended = time.perf_counter()
    array_ended_at = time.time()
    merge = [sys.executable, REPO / "scripts" / "class_slurm.py", "merge", tasks, out, "--assignment", lesson]
    merged = subprocess.run([str(part) for part in merge], capture_output=True, text=True)
    ended = time.perf_counter()
    report = json.loads((out / "merge.json").read_text()) if (out / "merge.json").is_file() else {}
    if (
        submitted.returncode != 0
        or merged.returncode != 0
        or report.get("findings")
        or not all_full_marks(report.get("results", []), len(students))
    ):
        logs = "".join(f"\n--- {p}\n{p.read_text()[-1500:]}" for p in sorted(tasks.glob("*.log"))[:3])
        raise SystemExit(f"the array did not grade everything:\n{submitted.stderr}{merged.stdout}{logs}")
    # each task's start (the time its script prints first) and end (its status file, written as its grade.py
    # ended), and grade.py's own time
    starts, ends, grade_py = [], [], []
    for index in range(len(groups)):
        log = (tasks / class_slurm.TASK_LOG.format(index=index)).read_text()
        started = re.search(r" from (\S+Z)$", log.splitlines()[0]).group(1)
        starts.append(datetime.fromisoformat(started).timestamp())
        ends.append((tasks / f"{index}.status").stat().st_mtime_ns / 1e9)
        part = tasks / class_slurm.TASK_FOLDER.format(index=index) / "report.json"
        grade_py.append(json.loads(part.read_text())["seconds"])
    return {
        "seconds": round(ended - began, 1),
        "array_seconds": round(array_ended - began, 1),
        "merge_seconds": round(ended - array_ended, 1),
        "tasks": len(groups),
        "learners_per_task": [len(group) for group in groups],
        "submission_to_first_task_start_s": round(min(starts) - submitted_at, 1),
        "last_task_end_to_array_end_s": round(array_ended_at - max(ends), 1),
        "task_wall_seconds": [round(end - start, 1) for start, end in zip(starts, ends, strict=True)],
        "task_grade_py_seconds": grade_py,
        "job": submitted.stdout.strip(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--lesson", default="01_splitting")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved pairs of runs (default 3)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("the benchmark runs Slurm's daemons: run it as root")
    if missing_programs():
        raise SystemExit(f"missing {', '.join(missing_programs())}: apt-get install slurm-wlm munge")
    from tests.nbgrader_tools import build_source

    cpus = os.cpu_count() or 1
    record = {
        "benchmark": "grading a class: one grade.py run vs a Slurm job array (its default split) plus its merge, "
        "in interleaved pairs",
        "lesson": args.lesson,
        "students": args.students,
        "submission": "the reference solution (every cell runs)",
        "cluster": f"one node, this machine: {cpus} CPUs declared to Slurm, tasks of 1 CPU",
        "machine": describe_machine(),
        "target_overhead_on_one_node": TARGET_OVERHEAD,
        "pairs": [],
    }
    root = Path(tempfile.mkdtemp(prefix="bench-slurm-", dir="/tmp"))
    os.chmod(root, 0o755)
    try:
        reference = build_source(args.lesson, root / "references")
        submissions = make_submissions(root / "submissions", args.students, {args.lesson: reference})
        students = sorted(p.name for p in submissions.iterdir())
        with one_node_cluster(root / "cluster", gpus=2, cpus=cpus, memory_mb=2048 * cpus) as cluster:
            others = OtherWork(roots=lambda: [os.getpid(), *cluster.own_processes()])
            for round_index in range(args.rounds):
                order = ["one_box", "array"] if round_index % 2 == 0 else ["array", "one_box"]
                pair = {"order": order}
                for name in order:
                    for folder in ("one-box", "tasks", "array"):
                        shutil.rmtree(root / folder, ignore_errors=True)
                    print(f"round {round_index + 1}: timing {name} ...", flush=True)
                    others.start()
                    if name == "one_box":
                        pair[name] = one_box(submissions, root / "one-box", args.lesson, cpus, len(students))
                    else:
                        pair[name] = array(cluster, submissions, root / "tasks", root / "array", args.lesson, students)
                    pair[name]["other_work"] = others.stop()
                    pair[name]["grades"] = scores(root / name.replace("_", "-") / "grades.csv")
                    print(f"  {pair[name]}", flush=True)
                if pair["one_box"].pop("grades") != pair["array"].pop("grades"):
                    raise SystemExit("the array's grades.csv differs from grade.py's")
                pair["same_grades"] = True
                pair["overhead"] = round(pair["array"]["seconds"] / pair["one_box"]["seconds"] - 1, 3)
                record["pairs"].append(pair)
        overheads = [pair["overhead"] for pair in record["pairs"]]
        record["overhead_on_one_node"] = {
            "min": min(overheads),
            "median": round(statistics.median(overheads), 3),
            "max": max(overheads),
        }
        record["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["overhead_on_one_node"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
