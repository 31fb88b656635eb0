"""The class on a Slurm cluster: each learner's JupyterLab a Slurm job, and grading a job array.

    python scripts/class_hub.py setup class.txt --slurm-partition gpu [--slurm-time 8:00:00 ...]   # as root
    python scripts/class_hub.py start
    python scripts/class_hub.py grade 01_splitting --slurm [--learners-per-task N --task-gpus 0]

``class_hub.py`` does the class as on one box (accounts, the course environment, nbgrader's exchange, the learners'
Jupyter configuration, collect, feedback); this module changes two things, and nothing else:

* **The servers.** ``setup --slurm-partition P`` (kept in ``class.json``, under ``"slurm"``) writes the hub's
  configuration with ``jupyter/hub/slurm_spawner.py`` (batchspawner's ``SlurmSpawner``) in place of the one-box
  spawner: each server is a job in partition ``P`` with ``--gres=gpu:<--gpus-per-learner>``, ``--mem`` of
  ``--server-memory``, ``--cpus-per-task`` of ``--server-cpus`` and ``--time`` of ``--slurm-time``. Slurm decides
  which GPUs a server gets and, with ``ConstrainDevices=yes`` in the cluster's ``cgroup.conf``, which it can open;
  memory and CPUs are the job's cgroup's (``ConstrainRAMSpace``, ``ConstrainCores``). batchspawner is installed
  into the course environment (the server runs ``batchspawner-singleuser`` from it, on the node).
* **Grading.** ``grade --slurm`` lays the submissions out as on one box, then submits one array job as the
  instructor (``sbatch --array``, then ``squeue`` until it has ended) whose tasks each grade several learners, one
  after the other, with one run of the same sandboxed ``grade.py`` from the instructor's copy of the grader
  (``--student`` for each, into ``<course>/grading-tasks/task-<i>``, with its own sqlite gradebook): by default the
  learners are spread evenly over as many tasks as the partition runs at once (``sinfo``: each node's CPUs, memory
  and GPUs over a task's), so that each slot pays grade.py's start-up and the release's generation once, not once
  per learner;
  ``--learners-per-task`` sets it (1: a task per learner). Each task's time limit is, by default, grade.py's own
  deadline for each of its learners plus a margin, so a learner's endless notebook is ended by grade.py, which then
  grades the next learner, never by Slurm. When the array has ended, ``merge`` (this module's command, run as the
  instructor from the same copy) checks each task's gradebook as ``grade.py`` checks its own (``schema_problems``),
  copies every task's submissions, grades and comments into one nbgrader gradebook
  (``<course>/grading/gradebook.db``), writes ``grades.csv`` with ``grade.py``'s export and gathers the feedback
  pages; ``class_hub.py grade`` then releases feedback as on one box. A task that failed, was cancelled or ran past
  its time limit leaves no result: each of its learners is reported "not graded" (in the table and in
  ``collect.csv``, with the reason from the task's log) and gets 0 in ``grades.csv``, like a learner with nothing
  taken; nobody in another task is affected.

No gradebook is written by two processes at once (one per task, then one merge), so the sqlite files on the
cluster's shared storage need no database server; PostgreSQL (nbgrader's ``db_url``) would be the choice only for
concurrent writers, e.g. a formgrader open while the array runs. What must be on storage every node sees: the
course environment (``--env``, or ``PREFIX/env``), the learners' Jupyter configuration (``PREFIX/jupyter``), the
homes, the instructor's course folder (the grader's copy, the staged submissions, every task's output) and
nbgrader's exchange. See docs/instructors.md, "A class on a Slurm cluster".
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCHSPAWNER = "batchspawner>=1.3,<2"
DEFAULTS = {
    "partition": "",
    "time": "8:00:00",  # a learner's server, at most
    "account": "",
    "hub_ip": "",  # where the nodes reach the hub's API; default: this host's address
    "options": "",  # any other sbatch option for the servers, e.g. --constraint=a100
}
TASK_LOG = "{index}.log"  # task i's Slurm output, beside its folder
TASK_FOLDER = "task-{index}"  # task i's grade.py --out


# ------------------------------------------------------------------------------------------------ setup
def add_setup_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slurm-partition",
        dest="slurm_partition",
        help="run every learner's server as a Slurm job in this partition (batchspawner); kept for later setups",
    )
    parser.add_argument("--slurm-time", dest="slurm_time", help="a server job's time limit (default 8:00:00)")
    parser.add_argument("--slurm-account", dest="slurm_account", help="the Slurm account the server jobs are charged")
    parser.add_argument(
        "--slurm-hub-ip",
        dest="slurm_hub_ip",
        help="the hub's address the nodes connect to (default: this host's address)",
    )
    parser.add_argument("--slurm-options", dest="slurm_options", help="other sbatch options for the server jobs")


def configure(settings: dict, args) -> None:
    """``settings["slurm"]``: the saved one, updated by this setup's ``--slurm-*`` options (none: unchanged)."""
    given = {key: getattr(args, f"slurm_{key}", None) for key in DEFAULTS}
    given = {key: value for key, value in given.items() if value is not None}
    if not given and not settings.get("slurm"):
        return
    slurm = {**DEFAULTS, **settings.get("slurm", {}), **given}
    if not slurm["partition"]:
        raise SystemExit("a class on Slurm needs --slurm-partition")
    if not slurm["hub_ip"]:
        slurm["hub_ip"] = socket.gethostbyname(socket.gethostname())
    settings["slurm"] = slurm


def prepare(settings: dict, run) -> None:
    """batchspawner in the course environment (the hub imports it; every server runs its ``batchspawner-singleuser``
    on the node), and the Slurm commands on this host."""
    if not settings.get("slurm"):
        return
    python = Path(settings["env"]) / "bin" / "python"
    if subprocess.run([python, "-c", "import batchspawner"], cwd="/", capture_output=True).returncode != 0:
        old = os.umask(0o022)
        try:
            run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", BATCHSPAWNER)
        finally:
            os.umask(old)
        run("chmod", "-R", "o+rX", settings["env"])
    missing = [name for name in ("sbatch", "squeue", "scancel") if shutil.which(name) is None]
    if missing:
        print(f"warning: {', '.join(missing)} not found: the hub submits the servers with them", flush=True)


def hub_config(settings: dict) -> str:
    """What the hub's configuration gets on a cluster: the Slurm spawner in place of the one-box one."""
    slurm = settings.get("slurm")
    if not slurm:
        return ""
    env = Path(settings["env"])
    memory_mib = int(float(settings["server_memory"]) * 1024)
    cpus = max(1, int(-(-float(settings["server_cpus"]) // 1)))  # whole CPUs, rounded up
    gpus = int(settings["gpus_per_learner"])
    return f"""
# On a Slurm cluster (scripts/class_slurm.py): every server is a job; Slurm gives its GPUs, memory and CPUs
from slurm_spawner import ClassSlurmSpawner  # noqa: E402

c.JupyterHub.spawner_class = ClassSlurmSpawner
c.JupyterHub.hub_ip = {slurm["hub_ip"]!r}  # the nodes reach the hub's API here (open it to the nodes only)
c.Spawner.ip = "0.0.0.0"  # the server listens on its node; the proxy reaches it by the node's name
c.Spawner.start_timeout = 300  # a job may wait in the queue
c.Spawner.http_timeout = 120
c.ClassSlurmSpawner.batchspawner_singleuser_cmd = {str(env / "bin" / "batchspawner-singleuser")!r}
c.ClassSlurmSpawner.environment_bin = {str(env / "bin")!r}
c.ClassSlurmSpawner.req_partition = {slurm["partition"]!r}
c.ClassSlurmSpawner.req_runtime = {slurm["time"]!r}
c.ClassSlurmSpawner.req_account = {slurm["account"]!r}
c.ClassSlurmSpawner.req_memory = "{memory_mib}M"
c.ClassSlurmSpawner.req_nprocs = "{cpus}"
c.ClassSlurmSpawner.req_gres = {f"gpu:{gpus}" if gpus > 0 else ""!r}
c.ClassSlurmSpawner.req_options = {slurm["options"]!r}
c.ClassSlurmSpawner.instructors = [{settings["instructor"]!r}]
c.ClassSlurmSpawner.learner_config = {str(Path(settings["prefix"]) / "jupyter" / "learner")!r}
c.ClassSlurmSpawner.instructor_config = {str(Path(settings["prefix"]) / "jupyter" / "instructor")!r}
"""


# ------------------------------------------------------------------------------------------------ grading
START_MARGIN_S = 600  # a task's time beyond its learners' grade.py deadlines: start-up, the release, feedback, export


def add_grade_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slurm",
        action="store_true",
        help="grade as a Slurm job array, several learners per task, then merge into one gradebook "
        "(scripts/class_slurm.py)",
    )
    parser.add_argument(
        "--learners-per-task",
        type=int,
        default=None,
        help="learners graded by one task, one after the other (default: the learners spread evenly over as many "
        "tasks as the partition runs at once; 1: a task per learner)",
    )
    parser.add_argument(
        "--task-time",
        help="each grading task's time limit (default: grade.py's own deadline for each of its learners, 13 min "
        "per notebook, plus 10 min)",
    )
    parser.add_argument("--task-memory", type=float, default=4.0, help="GiB each grading task may hold (default 4)")
    parser.add_argument("--task-cpus", type=int, default=1, help="CPUs of each grading task (default 1)")
    parser.add_argument("--task-gpus", type=int, default=0, help="GPUs of each grading task (default 0: CPU nodes)")
    parser.add_argument("--task-partition", help="the grading tasks' partition (default: the servers')")


def partition_slots(sinfo: str, cpus: int, memory_gib: float, gpus: int) -> int:
    """How many tasks of ``cpus`` CPUs, ``memory_gib`` GiB and ``gpus`` GPUs a partition runs at once, from
    ``sinfo -h -N -o "%c %m %G"`` (one line per node: its CPUs, its memory in MB, its GRES such as ``gpu:4`` or
    ``gpu:a100:4(S:0-1)``); 0 when no node takes one."""
    slots = 0
    for line in sinfo.splitlines():
        fields = line.split()
        if len(fields) < 3 or not fields[0].isdigit() or not fields[1].rstrip("+").isdigit():
            continue
        fits = [int(fields[0]) // max(1, cpus), int(fields[1].rstrip("+")) // max(1, int(memory_gib * 1024))]
        if gpus > 0:
            node_gpus = 0
            for gres in fields[2].split(","):
                parts = gres.split("(")[0].split(":")
                if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
                    node_gpus += int(parts[-1])
            fits.append(node_gpus // gpus)
        slots += min(fits)
    return slots


def split_learners(learners: list[str], slots: int, per_task: int | None = None) -> list[list[str]]:
    """The learners in tasks: ``per_task`` to a task at most when given, else as many tasks as ``slots`` (at least
    one, at most one per learner); the tasks' sizes differ by one at most, the learners keep their order."""
    if not learners:
        return []
    if per_task is not None and per_task < 1:
        raise SystemExit("--learners-per-task must be 1 or more")
    count = -(-len(learners) // per_task) if per_task else min(len(learners), max(1, slots))
    size, extra = divmod(len(learners), count)
    tasks, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        tasks.append(learners[start:end])
        start = end
    return tasks


def learner_deadline_s(notebooks: int) -> int:
    """The longest grade.py grades one learner's submission of ``notebooks`` notebooks before it ends that grading
    and goes on with the next learner (``--notebook-timeout``'s default and ``TASK_MARGIN`` per notebook)."""
    from autograder.grade import TASK_MARGIN, parse_args

    notebook_timeout = parse_args(["-", "--out", "-"]).notebook_timeout  # grade.py's default, not repeated here
    return max(1, notebooks) * (notebook_timeout + TASK_MARGIN)


def task_minutes(learners: int, notebooks: int) -> int:
    """A task's default time limit: grade.py's deadline for each of its ``learners`` and ``START_MARGIN_S``, so that
    Slurm never ends a task grade.py would have finished (a learner's endless notebook is ended by grade.py, which
    then grades the next learner)."""
    return -(-(learners * learner_deadline_s(notebooks) + START_MARGIN_S) // 60)


def task_script(
    settings: dict,
    args,
    python: Path,
    kit: Path,
    staged: Path,
    tasks: Path,
    lesson: str,
    due,
    time_limit: str,
    name: str,
) -> str:
    """The array's batch script: task ``i`` grades the learners on line ``i + 1`` of ``learners.txt`` with one
    grade.py into ``tasks/task-<i>``, and records grade.py's exit status in ``tasks/<i>.status`` (none when the task
    was ended). ``time_limit``: each task's, as ``sbatch --time`` takes it (minutes, or ``H:MM:SS``); ``name``: the
    array job's name (``wait_for_array`` waits for it)."""
    slurm = settings.get("slurm", {})
    partition = args.task_partition or slurm.get("partition", "")
    options = [
        f"--job-name={name}",
        f"--output={tasks / TASK_LOG.format(index='%a')}",
        f"--time={time_limit}",
        f"--mem={int(args.task_memory * 1024)}M",
        f"--cpus-per-task={args.task_cpus}",
        *([f"--partition={partition}"] if partition else []),
        *([f"--account={slurm['account']}"] if slurm.get("account") else []),
        *([f"--gres=gpu:{args.task_gpus}"] if args.task_gpus > 0 else []),
    ]
    grade = [python, kit / "autograder" / "grade.py", staged, "--assignment", lesson, "--no-progress"]
    grade += ["--workers", "1", *(["--duedate", due] if due else [])]
    quoted = " ".join(shlex.quote(str(part)) for part in grade)
    return "\n".join(
        [
            "#!/bin/bash",
            *(f"#SBATCH {option}" for option in options),
            "umask 077",
            # the kernels' threads: the task's CPUs (grade.py's default is the node's CPUs over its workers)
            'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}" MKL_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
            f"cd {shlex.quote(str(tasks))}",
            'task="$SLURM_ARRAY_TASK_ID"',
            'learners=$(sed -n "$((task + 1))p" learners.txt)',
            "students=()",
            'for learner in $learners; do students+=(--student "$learner"); done',
            'echo "task $task: grading $learners on $(hostname) from $(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"',
            f'{quoted} "${{students[@]}}" --out "{TASK_FOLDER.format(index="$task")}"',
            'echo $? > "$task.status"',
            "",
        ]
    )


def array_name(lesson: str) -> str:
    """A name for a grading array of ``lesson`` that no other job of the instructor has."""
    return f"gpulab-grade-{lesson}-{secrets.token_hex(4)}"


def wait_for_array(name: str, user: str, env: dict, interval: float = 1.0) -> None:
    """Return once no job of ``user`` named ``name`` is pending, running or completing (``squeue``, every
    ``interval`` seconds; ``sbatch --wait`` polls at 2, 8, then every 32 s, which costs up to half a minute after the
    last task has ended)."""
    squeue = [shutil.which("squeue") or "squeue", "-h", "-u", user, "-n", name, "-o", "%i"]
    reported = False
    while True:
        listed = subprocess.run(squeue, capture_output=True, text=True, env={**os.environ, **env})
        if listed.returncode == 0 and not listed.stdout.strip():
            return
        if listed.returncode != 0 and not reported:
            print(f"note: squeue failed ({listed.stderr.strip()}); asking again", flush=True)
            reported = True
        time.sleep(interval)


def write_tasks(tasks: Path, groups: list[list[str]], script: str) -> None:
    """A fresh ``tasks`` folder: ``learners.txt`` (task ``i``'s learners on line ``i + 1``) and ``grade.sh``."""
    if tasks.is_symlink() or tasks.is_file():
        tasks.unlink()
    shutil.rmtree(tasks, ignore_errors=True)
    tasks.mkdir(mode=0o700)
    (tasks / "learners.txt").write_text("".join(" ".join(group) + "\n" for group in groups))
    (tasks / "grade.sh").write_text(script)


def grade_array(settings: dict, args, run_as, kit: Path, staged: Path, out: Path, lesson: str, due, learners) -> dict:
    """Grade ``learners`` (those with a staged submission) as one array job as the instructor, several to a task
    (``split_learners``), then merge the tasks into ``out``; return ``{"code": exit status, "findings": [...]}``, a
    finding for each learner whose task left no result."""
    instructor = settings["instructor"]
    course = out.parent
    tasks = course / "grading-tasks"
    slurm = settings.get("slurm", {})
    partition = args.task_partition or slurm.get("partition", "")
    env = {name: os.environ[name] for name in ("SLURM_CONF",) if name in os.environ}
    slots = 0
    if args.learners_per_task is None:
        sinfo = ["sinfo", "-h", "-N", "-o", "%c %m %G", *([f"--partition={partition}"] if partition else [])]
        listed = subprocess.run(sinfo, capture_output=True, text=True, env={**os.environ, **env})
        slots = partition_slots(listed.stdout, args.task_cpus, args.task_memory, args.task_gpus)
        if slots == 0:
            print(f"note: sinfo shows no node of the partition that takes a task: one learner per task ({sinfo})")
    groups = split_learners(sorted(learners), slots, args.learners_per_task or (None if slots else 1))
    largest = max(map(len, groups))
    notebooks = len(list((REPO / "lessons" / lesson).glob("*.ipynb")))
    time_limit = args.task_time or str(task_minutes(largest, notebooks))
    python = Path(settings["env"]) / "bin" / "python"
    name = array_name(lesson)
    write_tasks(tasks, groups, task_script(settings, args, python, kit, staged, tasks, lesson, due, time_limit, name))
    account = __import__("pwd").getpwnam(instructor)
    for path in [tasks, *tasks.iterdir()]:
        os.lchown(path, account.pw_uid, account.pw_gid)
    at_once = f"{slots} at once in the partition" if slots else "--learners-per-task"
    print(
        f"grading {len(learners)} learner(s) in {len(groups)} task(s) of at most {largest} ({at_once}), each task "
        f"within --time={time_limit}",
        flush=True,
    )
    began = time.monotonic()
    sbatch = [shutil.which("sbatch") or "sbatch", "--parsable", f"--array=0-{len(groups) - 1}", tasks / "grade.sh"]
    if run_as(instructor, sbatch, None, env) != 0:
        raise SystemExit("sbatch refused the grading array (its message is above)")
    wait_for_array(name, instructor, env)
    print(f"array job {name} ended after {time.monotonic() - began:.1f} s", flush=True)
    merge = [python, kit / "scripts" / "class_slurm.py", "merge", tasks, out, "--assignment", lesson]
    merge += ["--roster", course / "roster.txt"]  # every learner of the class gets a row, as grade.py --roster gives
    code = run_as(instructor, merge, None, {})
    report = out / "merge.json"
    merged = json.loads(report.read_text()) if report.is_file() and not report.is_symlink() else {}
    findings = merged.get("findings", [])
    if code != 0 or not merged:
        raise SystemExit(f"merging the grading tasks failed (exit status {code})")
    failed = findings or any(result.get("error") for result in merged.get("results", []))
    return {"code": 1 if failed else 0, "findings": findings}


# ------------------------------------------------------------------------------------------------ merge
def task_failure(tasks: Path, index: int) -> str | None:
    """Why task ``index`` left no result to merge, or None when it did."""
    status_file = tasks / f"{index}.status"
    part = tasks / TASK_FOLDER.format(index=index)
    log = tasks / TASK_LOG.format(index=index)
    log_text = log.read_text(errors="replace") if log.is_file() and not log.is_symlink() else ""
    if not status_file.is_file():
        if "DUE TO TIME LIMIT" in log_text:
            return "its grading task ran past the time limit (--task-time) and was ended"
        if "CANCELLED" in log_text:
            return "its grading task was cancelled"
        return f"its grading task ended without a result (see {log})"
    status = status_file.read_text().strip()
    if status not in ("0", "1"):
        return f"grade.py exited with status {status} (see {log})"
    if not (part / "grades.csv").is_file() or not (part / "gradebook.db").is_file():
        return f"grade.py wrote no grades (see {log})"
    return None


def copy_submissions(source_url: str, target_url: str, assignment: str) -> int:
    """Copy every submission of ``assignment`` in one gradebook (its students, timestamps, grades, comments, flags
    and late penalties) into another that holds the same release; return how many."""
    from nbgrader.api import Gradebook, MissingEntry

    copied = 0
    with Gradebook(source_url) as source, Gradebook(target_url) as target:
        for student in source.students:
            target.update_or_create_student(
                student.id,
                first_name=student.first_name,
                last_name=student.last_name,
                email=student.email,
                lms_user_id=student.lms_user_id,
            )
        for submission in source.assignment_submissions(assignment):
            student = submission.student.id
            try:
                target.find_submission(assignment, student)
            except MissingEntry:
                pass
            else:
                target.remove_submission(assignment, student)
            target.add_submission(assignment, student, timestamp=submission.timestamp, extension=submission.extension)
            for notebook in submission.notebooks:
                name = notebook.notebook.name
                mine = target.find_submission_notebook(name, assignment, student)
                mine.flagged = notebook.flagged
                mine.late_submission_penalty = notebook.late_submission_penalty
                for grade in notebook.grades:
                    into = target.find_grade(grade.name, name, assignment, student)
                    into.auto_score = grade.auto_score
                    into.manual_score = grade.manual_score
                    into.extra_credit = grade.extra_credit
                    into.needs_manual_grade = grade.needs_manual_grade
                for comment in notebook.comments:
                    into = target.find_comment(comment.name, name, assignment, student)
                    into.auto_comment = comment.auto_comment
                    into.manual_comment = comment.manual_comment
            target.db.commit()
            copied += 1
    return copied


def merge(tasks: Path, out: Path, assignment: str, roster: Path | None = None) -> dict:
    """One course folder ``out`` from the tasks' folders: the first good task's gradebook and release as the base,
    every other good task's submissions copied in, every learner of ``learners.txt`` and ``roster`` registered,
    ``grades.csv`` exported as grade.py does, each learner's feedback and autograded notebooks copied;
    ``merge.json`` and the return value name each learner whose task left no result (every learner of that task,
    and nobody else)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nbgrader.api import Gradebook

    from autograder import grade as grading

    groups = [line.split() for line in (tasks / "learners.txt").read_text().splitlines()]
    learners = [learner for group in groups for learner in group]
    findings, results, good = [], [], []  # good: (task folder, its learners)
    expected = None
    for index, group in enumerate(groups):
        if not group:
            continue
        part = tasks / TASK_FOLDER.format(index=index)
        why = task_failure(tasks, index)
        if why is None:
            if expected is None:  # a fresh gradebook's schema, made once (grade.py's check makes one per call)
                with tempfile.TemporaryDirectory(prefix="gradebook-schema-") as folder:
                    grading.load_builder().new_gradebook(Path(folder) / "gradebook.db")
                    expected = _schema(Path(folder) / "gradebook.db")
            found = _schema(part / "gradebook.db")
            if found != expected:
                changed = sorted(name for _, name, _, _ in found ^ expected)
                why = f"its gradebook was tampered with (schema differs: {', '.join(changed)})"
        if why is not None:
            if len(group) > 1:
                why += f" (task {index}, which graded {', '.join(group)})"
            for learner in group:
                findings.append({"learner": learner, "entry": "", "verdict": "not graded", "reason": why})
                results.append({"task": {"student": learner, "assignment": assignment}, "error": why})
            continue
        good.append((part, group))
        report = part / "report.json"
        if report.is_file():
            results += json.loads(report.read_text()).get("results", [])
    out.mkdir(parents=True, exist_ok=True)
    gradebook = out / "gradebook.db"
    gradebook.unlink(missing_ok=True)
    url = f"sqlite:///{gradebook}?timeout=30"
    if good:
        base = good[0][0]
        shutil.copyfile(base / "gradebook.db", gradebook)
        for name in ("source", "release", "lessons"):
            if (base / name).is_dir():
                shutil.rmtree(out / name, ignore_errors=True)
                shutil.copytree(base / name, out / name, symlinks=True)
        if (base / "nbgrader_config.py").is_file():
            shutil.copyfile(base / "nbgrader_config.py", out / "nbgrader_config.py")
        for part, _ in good[1:]:
            copy_submissions(f"sqlite:///{part / 'gradebook.db'}?timeout=30", url, assignment)
    else:
        grading.load_builder().new_gradebook(gradebook)
    with Gradebook(url) as book:
        book.update_or_create_assignment(assignment)
        for learner in sorted({*learners, *(grading.read_roster(roster) if roster else ())}):
            book.update_or_create_student(learner)
    for folder in ("feedback", "autograded", "submitted"):
        for part, group in good:
            for learner in group:
                copied = part / folder / learner
                if copied.is_dir() and not copied.is_symlink():
                    shutil.rmtree(out / folder / learner, ignore_errors=True)
                    shutil.copytree(copied, out / folder / learner, symlinks=True)
    grading.export_grades(out)
    graded = [learner for _, group in good for learner in group]
    merged = {"tasks": len(groups), "merged": graded, "findings": findings, "results": results}
    (out / "merge.json").write_text(json.dumps(merged, indent=1, sort_keys=True))
    print(f"merged {len(good)} of {len(groups)} grading task(s) ({len(graded)} learner(s)) into {gradebook}")
    for finding in findings:
        print(f"  {finding['learner']}: not graded: {finding['reason']}")
    return merged


def _schema(path: Path) -> set[tuple]:
    """A gradebook's schema (``grade.py: schema_problems``'s comparison), read without running anything it holds."""
    import sqlite3

    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return set(connection.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall())
    finally:
        connection.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="merge a grading array's tasks into one course folder")
    commands = parser.add_subparsers(dest="command", required=True)
    merging = commands.add_parser("merge", help="merge the tasks' gradebooks, grades and feedback")
    merging.add_argument("tasks", type=Path)
    merging.add_argument("out", type=Path)
    merging.add_argument("--assignment", required=True)
    merging.add_argument("--roster", type=Path, help="the class's learners, one a line: each gets a row")
    args = parser.parse_args(argv)
    merge(args.tasks, args.out, args.assignment, args.roster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
