"""Grade a folder of submissions: ``python autograder/grade.py SUBMISSIONS_DIR --out OUT_DIR``.

SUBMISSIONS_DIR is laid out ``<student>/<assignment>/<notebook>.ipynb`` (nbgrader's ``submitted/`` layout; a
``timestamp.txt`` next to the notebook is used when present, and a lone notebook with another name, e.g.
``Copy of 01_splitting.ipynb``, stands for the lesson's notebook). Assignments are the lessons in ``source/``.

OUT_DIR becomes a complete nbgrader course directory for this grading: ``gradebook.db``, ``grades.csv`` (exactly
``nbgrader export``'s format), ``feedback/<student>/<assignment>/<notebook>.html`` (no hidden test in it),
``autograded/`` (the executed notebooks), ``submitted/`` (the copies that were graded, metadata repaired where it
was lost), ``source/`` and ``lessons/`` (the lessons as graded), ``report.json`` (per test: passed, failed, void,
not run, and why) and an ``nbgrader_config.py``, so that ``nbgrader export`` or ``nbgrader formgrader`` run in
OUT_DIR see the same gradebook. Hand out ``feedback/`` only: ``source/`` holds the solutions.

What it guarantees:

* Every kernel runs in its own sandbox (``sandbox.py``: own user, mount, PID and network namespaces; it sees this
  submission's working copy, the interpreter and packages read-only, and nothing of ``source/``, the gradebook,
  ``submitted/`` or other students). Where no sandbox can be created the command stops and says what is missing;
  ``--unsafe-no-sandbox`` grades without one, and the table, ``report.json`` and stderr then say so.
* Every submission is graded in a separate worker process (a process pool; threads are not safe with nbgrader),
  all writing one sqlite gradebook (``?timeout=30``). GPUs (see ``plan_workers``): each kernel sees a group of
  ``--gpus-per-worker`` GPUs (default 2 where there are two or more, so that the tests' real-GPU branches run),
  and several workers share a group (grading needs megabytes of GPU memory), as many as the cores allow.
* Symbolic links, devices and other special files anywhere under SUBMISSIONS_DIR are refused (the submission that
  holds one is named and not graded; a student's or an assignment's folder that is a link, or a file where a folder
  is expected, is a refused submission of its own, never followed; hidden entries are listed as skipped in the
  output and ``report.json``); the gradebook's schema is checked (no trigger, view or extra table) before
  ``grades.csv`` is written.
* Each notebook runs under limits (``--cell-timeout``, ``--notebook-timeout``, ``--memory``; see ``limits.py``):
  an infinite loop, a memory bomb, ``sys.exit``/``os._exit``, a crashed or killed kernel, a fork or a GPU OOM costs
  that student the cells it hit and the ones after it, never another student or the grader. A worker that does
  not finish a task in time is killed and replaced.
* Verdicts are decided in the grader's process by each lesson's checks (``checks/``), which call the learner's
  functions in the kernel and compare the plain data returned with references computed here; a graded test cell's
  own code is never run, and an assignment without checks is a grader error.
* Lost or edited nbgrader metadata is re-attached by aligning the cells with the release (``repair.py``).
* A notebook from the Japanese edition (``lessons/ja/``) is graded on the same assignment, cells and points, so the
  gradebook and ``grades.csv`` have one score per student and lesson; it is recognised (``repair.edition_of``),
  repaired against that edition's release, and its feedback is in Japanese (``report.json``: ``editions``).
* A submission that cannot be graded (not a notebook, not this lesson, missing, the grader failed) is named,
  with the reason, and the command exits 1. Nothing under SUBMISSIONS_DIR is ever written.
* Running it twice gives the same grades.

Exit status: 0 every submission graded; 1 some could not be graded (listed on stderr); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import signal
import stat
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from autograder import limits as limits_module  # noqa: E402
from autograder import sandbox  # noqa: E402
from autograder.export import unsafe_id_reason  # noqa: E402

SOURCE_ROOT = REPO / "source"
CONFIG_FILE = REPO / "autograder" / "nbgrader_config.py"
TASK_MARGIN = 180  # seconds a task may take beyond its notebooks' time limits (kernel start, feedback, sqlite)


def load_builder():
    """``scripts/build_lessons.py`` as a module (load_config, stage_lesson, run_nbgrader, ...)."""
    name = "build_lessons"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "build_lessons.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# --------------------------------------------------------------------------------------------- discovery
@dataclass
class Task:
    """One student's submission of one assignment."""

    student: str
    assignment: str
    folder: str
    notebooks: dict[str, str] = field(default_factory=dict)  # release notebook name -> submitted file
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def name(self) -> str:
        return f"{self.student}/{self.assignment}"


MAX_NOTEBOOK_BYTES = 50 << 20  # a submitted notebook larger than this is refused unread


def _visible(path: Path) -> bool:
    return not path.name.startswith((".", "__")) and path.name != "ipynb_checkpoints"


def special_files(folder: Path) -> list[str]:
    """Symbolic links and anything but regular files and folders under ``folder`` (never followed), relative."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            path = Path(root) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found.append(str(path.relative_to(folder)))
    return sorted(found)


ALL = "*"
"""The assignment named by a refusal of a whole student folder (a link, a file: no assignment is looked into)."""
HIDDEN = "a hidden entry (its name starts with '.' or '__', or is ipynb_checkpoints): not graded"


def _not_a_folder(path: Path) -> str:
    """What ``path`` is, when it is not a folder of its own (never followed)."""
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        return "a symbolic link (not followed)"
    return "a file" if stat.S_ISREG(mode) else "a special file"


def skipped_entries(submissions: Path) -> list[dict]:
    """The entries ``discover`` passes over without a task (hidden ones, at the students' and the assignments'
    level), each with why: the report names them, so that nothing under SUBMISSIONS_DIR is skipped unsaid."""
    found = []
    for student_dir in sorted(submissions.iterdir()):
        if not _visible(student_dir):
            found.append({"entry": student_dir.name, "why": HIDDEN})
        elif _real_dir(student_dir):
            for folder in sorted(student_dir.iterdir()):
                if not _visible(folder):
                    found.append({"entry": f"{student_dir.name}/{folder.name}", "why": HIDDEN})
    return found


def discover(submissions: Path, lessons: dict[str, Path], release_root: Path) -> list[Task]:
    """Every ``<student>/<assignment>/`` folder under ``submissions``, matched to the lessons' notebooks. An entry
    that is not a folder of its own (a symbolic link, a file, a special file) where a student's or an assignment's
    folder is expected is a refused task, named with why (a student's as assignment ``ALL``); hidden entries are
    listed by ``skipped_entries``."""
    tasks = []
    for student_dir in sorted(p for p in submissions.iterdir() if _visible(p)):
        if not _real_dir(student_dir):
            what = _not_a_folder(student_dir)
            tasks.append(Task(student_dir.name, ALL, str(student_dir), error=f"refused: the student folder is {what}"))
            continue
        for folder in sorted(p for p in student_dir.iterdir() if _visible(p)):
            if not _real_dir(folder):
                error = f"refused: the assignment folder is {_not_a_folder(folder)}"
                tasks.append(Task(student_dir.name, folder.name, str(folder), error=error))
                continue
            task = Task(student_dir.name, folder.name, str(folder))
            tasks.append(task)
            task.error = unsafe_id_reason(student_dir.name)
            if task.error:
                continue
            refused = special_files(folder)
            if refused:
                task.error = f"refused: symbolic links or special files in the submission: {', '.join(refused[:5])}"
                continue
            if folder.name not in lessons:
                known = ", ".join(lessons) or "none"
                task.error = f"unknown assignment {folder.name!r} (lessons: {known})"
                continue
            wanted = sorted(p.name for p in (release_root / folder.name).glob("*.ipynb"))
            present = {p.name: p for p in sorted(folder.glob("*.ipynb")) if _visible(p)}
            for name in wanted:
                if name in present:
                    task.notebooks[name] = str(present.pop(name))
            missing = [n for n in wanted if n not in task.notebooks]
            if len(missing) == 1 and len(present) == 1:
                (other,) = present.values()
                task.notebooks[missing[0]] = str(other)
                task.notes.append(f"{other.name!r} graded as {missing[0]!r}")
                present.clear()
                missing = []
            if missing:
                found = ", ".join(sorted(present)) or "no notebook"
                task.error = f"missing notebook {', '.join(missing)} (found: {found})"
            for extra in present:
                task.notes.append(f"{extra!r} ignored (not a notebook of {folder.name})")
            task.notes += ignored_entries(folder, {Path(f).name for f in task.notebooks.values()} | set(present))
            large = [n for n, f in task.notebooks.items() if Path(f).stat().st_size > MAX_NOTEBOOK_BYTES]
            if large and not task.error:
                task.error = f"refused: {', '.join(large)} is larger than {MAX_NOTEBOOK_BYTES >> 20} MiB"
    return tasks


def longest_first(tasks: list[Task], release_root: Path) -> list[Task]:
    """``tasks`` in the order the workers take them: the assignments with the most code first (the code its
    release's notebooks hold, the proxy of its grading time: lesson 03 takes about twice lesson 01's), students in
    their order within one. The last tasks of a run are then short ones, so the workers finish close together
    instead of all but one waiting for a long notebook at the end."""
    sizes: dict[str, int] = {}
    for name in {task.assignment for task in tasks}:
        notebooks = sorted((release_root / name).glob("*.ipynb"))
        cells = [c for n in notebooks for c in json.loads(n.read_text()).get("cells", [])]
        code = (c.get("source", "") for c in cells if c.get("cell_type") == "code")
        sizes[name] = sum(len("".join(text) if isinstance(text, list) else text) for text in code)
    return sorted(tasks, key=lambda task: -sizes[task.assignment])


MAX_IGNORED_NAMED = 20  # entries of one assignment folder named as ignored; the rest are counted


def ignored_entries(folder: Path, graded: set[str]) -> list[str]:
    """Notes naming every entry of the assignment ``folder`` that is not graded: anything but its notebooks (``graded``,
    the extra notebooks noted already) and ``timestamp.txt``, hidden entries and folders included, never followed
    (a module the notebook imports is not graded with it: its kernel works in a copy of the lesson's own folder)."""
    notes, more = [], 0
    for entry in sorted(folder.iterdir()):
        if entry.name in graded or entry.name == "timestamp.txt":
            continue
        if len(notes) == MAX_IGNORED_NAMED:
            more += 1
            continue
        why = "a hidden entry" if not _visible(entry) else "a folder" if _real_dir(entry) else "not a notebook"
        notes.append(f"{entry.name!r} ignored ({why}: not graded)")
    return notes + ([f"and {more} more entries ignored"] if more else [])


def _real_dir(path: Path) -> bool:
    """A folder, not a symbolic link to one (a link is a refused task of ``discover``)."""
    return path.is_dir() and not path.is_symlink()


def lessons_present(source_root: Path = SOURCE_ROOT) -> dict[str, Path]:
    return load_builder().find_lessons(source_root)


# --------------------------------------------------------------------------------------------- course
def course_config(out: Path, settings: dict | None = None):
    """The course configuration pointed at ``out``, with this command's limits (``settings``)."""
    builder = load_builder()
    config = builder.load_config(root=out, db_url=f"sqlite:///{out / 'gradebook.db'}?timeout=30")
    if settings:
        execute = config.SandboxedExecute
        execute.timeout = settings["cell_timeout"]
        execute.notebook_timeout = settings["notebook_timeout"]
        execute.memory_limit = settings["memory"]
        if settings.get("disk"):
            execute.disk_limit = settings["disk"]
        execute.sandbox = settings["sandbox"]
        execute.kernel_env = settings.get("kernel_env", {})
        execute.socket_root = settings.get("socket_root", "")
        execute.cgroup_parent = settings.get("cgroup_parent", "")
    return config


NBGRADER_CONFIG = '''"""nbgrader configuration of this grading folder (written by autograder/grade.py).

Run nbgrader here (``nbgrader export``, ``nbgrader formgrader``, ...) to work with the same gradebook.
"""

import os

c = get_config()  # noqa: F821
load_subconfig({config!r})  # noqa: F821 - the course's configuration
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(c.CourseDirectory.root, "gradebook.db") + "?timeout=30"
'''


def prepare_course(out: Path, assignments: list[str], lessons: dict[str, Path]):
    """Stage the lessons in ``out/source``, generate their releases and record them in ``out/gradebook.db``."""
    builder = load_builder()
    out.mkdir(parents=True, exist_ok=True)
    (out / "nbgrader_config.py").write_text(NBGRADER_CONFIG.format(config=str(CONFIG_FILE)))
    gradebook = out / "gradebook.db"
    if not gradebook.exists():
        builder.new_gradebook(gradebook)
    config = course_config(out)
    for name in assignments:
        builder.stage_lesson(lessons[name], out / "source")
        builder.generate_in_course(out, name, config)
        release = out / "lessons" / name
        for edition in builder.course_editions(lessons[name].parent):
            # the edition's release, next to the English one, for recognising and repairing its submissions
            try:
                builder.generate_translation(lessons[name], release, out / "lessons", edition)
            except builder.StaleTranslation as error:
                first = str(error).splitlines()[0]
                print(
                    f"{name}: no {edition} release to align {edition} submissions with ({first} ...)", file=sys.stderr
                )
    return config


def edition_releases(out: Path, assignment: str, name: str) -> dict:
    """The releases of notebook ``name`` of ``assignment`` in every edition the grading course has, English first."""
    import nbformat

    builder = load_builder()
    releases = {"en": nbformat.read(out / "lessons" / assignment / name, as_version=4)}
    for edition in builder.TRANSLATED_EDITIONS:
        path = builder.edition_root(out / "lessons", edition) / assignment / name
        if path.is_file():
            releases[edition] = nbformat.read(path, as_version=4)
    return releases


def due_date(text: str):
    """``--duedate``: an ISO 8601 time, as nbgrader parses it (``nbgrader.utils.parse_utc``: UTC unless a zone is
    named)."""
    from nbgrader.utils import parse_utc

    try:
        return parse_utc(text)
    except (ValueError, OverflowError, TypeError) as error:
        raise argparse.ArgumentTypeError(f"not a date and time: {text!r} ({error})") from None


def record_due_date(config, assignments: list[str], due) -> None:
    """Record ``due`` for ``assignments`` in the gradebook: nbgrader's autograde then counts each submission's
    seconds late from its ``timestamp.txt`` (``AssignLatePenalties``), and grades.csv carries both times."""
    from nbgrader.api import Gradebook

    with Gradebook(config.CourseDirectory.db_url) as gradebook:
        for name in assignments:
            gradebook.update_or_create_assignment(name, duedate=due)


def read_roster(path: Path) -> set[str]:
    """The student ids of ``--roster`` (one a line, blank lines and ``#`` comments skipped); an id ``grade.py`` would
    refuse as a folder name is refused here too (``export.unsafe_id_reason``)."""
    students = set()
    for line in Path(path).read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        why = unsafe_id_reason(name)
        if why:
            raise SystemExit(f"grade.py: {path}: {why}")
        students.add(name)
    return students


def register_students(config, students) -> None:
    """Add every student to the gradebook, from one process, before any worker starts.

    nbgrader's autograde can create a missing student itself (``Autograde.create_student``), but it does so with
    a find-then-insert: when several workers start on the same student's lessons at once (a class graded in
    parallel starts with one student's four lessons), all find no student, all insert, and sqlite's UNIQUE
    constraint fails all but one (``InvalidEntry``: the submission is reported as not graded). So the students
    are registered here, and ``grade_task`` runs autograde with ``create_student=False``.
    """
    from nbgrader.api import Gradebook

    with Gradebook(config.CourseDirectory.db_url) as gradebook:
        for student in sorted(students):
            gradebook.update_or_create_student(student)


# --------------------------------------------------------------------------------------------- one task
def grade_task(task: Task, out: Path, settings: dict) -> dict:
    """Repair, autograde and give feedback on one submission (in a worker process); return what happened."""
    from nbgrader.api import Gradebook

    from autograder.repair import RepairError, edition_of, read_notebook, repair

    builder = load_builder()
    result = {"task": asdict(task), "notebooks": {}, "error": None, "notes": list(task.notes)}
    started = time.monotonic()
    submitted = out / "submitted" / task.student / task.assignment
    log = out / "logs" / task.student / f"{task.assignment}.log"  # nbgrader's log, kept when it fails
    log.unlink(missing_ok=True)
    if submitted.exists():
        shutil.rmtree(submitted)
    submitted.mkdir(parents=True)
    import nbformat

    result["editions"] = {}
    for name, path in task.notebooks.items():
        releases = edition_releases(out, task.assignment, name)
        try:
            submission = read_notebook(path)
            edition = edition_of(submission, releases)
            fixed = repair(submission, releases[edition], task.assignment)
        except RepairError as error:
            result["error"] = f"{Path(path).name}: {error}"
            return result
        result["notes"] += [f"{name}: {note}" for note in fixed.notes]
        result["editions"][name] = edition
        # the edition travels with the notebook: feedback (feedback.py) is written in it
        fixed.notebook.metadata["gpulab"] = {"edition": edition}
        nbformat.write(fixed.notebook, submitted / name)
    timestamp = Path(task.folder) / "timestamp.txt"
    if timestamp.is_file():
        shutil.copyfile(timestamp, submitted / "timestamp.txt")
    reports = out / ".reports" / task.student / task.assignment
    shutil.rmtree(reports, ignore_errors=True)
    config = course_config(out, settings)
    config.SandboxedExecute.report_dir = str(reports)
    try:
        # the student is in the gradebook already (register_students): no worker inserts one, so none races
        builder.run_nbgrader("autograde", config, task.assignment, task.student, create_student=False)
        builder.run_nbgrader("generate_feedback", config, task.assignment, task.student)
        pages = {Path(name).stem + ".html" for name in task.notebooks}
        keep_only(out / "feedback" / task.student / task.assignment, pages)
    except builder.BuildError as error:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(str(error))
        result["error"] = f"nbgrader failed (log: {log}): {str(error).strip().splitlines()[-1][:300]}"
        result["log"] = str(error)[-5000:]
        return result
    with Gradebook(config.CourseDirectory.db_url) as gradebook:
        submission = gradebook.find_submission(task.assignment, task.student)
        result["score"], result["max_score"] = float(submission.score), float(submission.max_score)
        for notebook in submission.notebooks:
            cells = {g.name: [g.score, g.max_score, g.needs_manual_grade] for g in notebook.grades}
            result["notebooks"][notebook.name] = {"cells": cells}
    for name in result["notebooks"]:
        report_file = reports / f"{name}.json"
        report = json.loads(report_file.read_text()) if report_file.is_file() else {}
        entry = result["notebooks"][name]
        entry["report"] = report
        for grade_id, (score, _, manual) in entry["cells"].items():
            if score is None or manual:
                result["error"] = result["error"] or f"{name}: cell {grade_id!r} got no automatic score"
        if report.get("stopped"):
            result["notes"].append(f"{name}: stopped: {report['stopped']}")
    shutil.rmtree(reports, ignore_errors=True)
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def keep_only(folder: Path, names: set[str]) -> None:
    """Remove from ``folder`` everything but the regular files ``names`` (never following a link).

    nbgrader's ``generate_feedback`` copies every non-notebook file of the autograded folder next to the pages
    (the lesson's modules, ``timestamp.txt``); the feedback folder a student receives holds the grader's pages
    only."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for entry in os.scandir(folder):
        if entry.name in names and entry.is_file(follow_symlinks=False):
            continue
        sandbox.remove_tree(entry.path)


# --------------------------------------------------------------------------------------------- workers
def _worker(connection, out: str, settings: dict, environment: dict, group: list[str]) -> None:
    """A grading worker: one process, one task at a time, limits and cleanup around each. ``group``: the
    ``cgroup.procs`` files of its own memory cgroup (``Pool``), entered first."""
    from autograder import cgroups

    cgroups.enter(group)
    os.environ.update(environment)
    sys.dont_write_bytecode = True
    limits_module.become_subreaper()
    load_builder().ensure_scripts_on_path()
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task = Task(**message)
        try:
            result = grade_task(task, Path(out), settings)
        except Exception:  # noqa: BLE001 - report any grader failure as this task's, keep the worker
            result = {"task": asdict(task), "error": "the grader failed: " + traceback.format_exc()[-2000:]}
        finally:
            limits_module.kill_descendants()
        # the worker's own high-water mark, for the red-team tests' bound on the grader's memory
        result["worker_peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        connection.send(result)


def default_cpu_workers() -> int:
    """Workers without GPUs: a few more than the cores (a grading task also waits: kernel start-up, DDP rendezvous,
    the gradebook), as many as fit in memory at 2 GiB each. Measured on 2 cores: benchmarks/bench_grading.py."""
    cores = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        memory = 8 * limits_module.GiB
    return max(1, min(2 * cores, cores + 4, int(memory * 0.75 // (2 * limits_module.GiB))))


def default_gpus_per_worker(gpus: list[str]) -> int:
    """GPUs each kernel sees by default: 2 where there are two or more (the lessons' real ``nn.DataParallel`` mode
    and every ``device_count() >= 2`` test branch need two), else the one GPU or none."""
    return 2 if len(gpus) >= 2 else len(gpus)


def plan_workers(tasks: int, requested: int | None, gpus: list[str], gpus_per_worker: int | None) -> list[dict]:
    """The environment of each worker: which GPUs its kernels see (``CUDA_VISIBLE_DEVICES``).

    The GPUs are cut into groups of ``gpus_per_worker`` (default ``default_gpus_per_worker``; a remainder too small
    for a group is left unused, unless there is no full group at all). Workers are as many as without GPUs
    (``default_cpu_workers``, or ``requested``), at least one per group, never more than the tasks, and are dealt
    to the groups in turn: several workers share a group, because grading a lesson needs megabytes of GPU memory
    and the CPU, not the GPU, is what a grading worker waits for. Without GPUs every kernel sees none.
    """
    if not gpus:
        count = min(requested or default_cpu_workers(), max(tasks, 1))
        return [{"CUDA_VISIBLE_DEVICES": ""} for _ in range(count)]
    size = gpus_per_worker or default_gpus_per_worker(gpus)
    groups = [gpus[i : i + size] for i in range(0, len(gpus), size)]
    groups = [g for g in groups if len(g) == size] or [gpus]
    count = min(requested or max(len(groups), default_cpu_workers()), max(tasks, 1))
    return [{"CUDA_VISIBLE_DEVICES": ",".join(groups[i % len(groups)])} for i in range(count)]


class Pool:
    """Worker processes (spawned), each given one task at a time; a task past its deadline kills its worker."""

    def __init__(self, environments: list[dict], out: Path, settings: dict, run_group=None):
        import multiprocessing

        self._context = multiprocessing.get_context("spawn")
        self._out, self._settings = str(out), settings
        self._environments = environments
        self._run_group = run_group  # each worker gets a memory cgroup of its own inside it (cgroups.py)
        self._started = 0
        self._workers: list[dict] = []
        for index, environment in enumerate(environments):
            self._workers.append(self._start(index, environment))

    def _start(self, index: int, environment: dict) -> dict:
        parent, child = self._context.Pipe()
        group = None
        if self._run_group is not None:
            from autograder import cgroups

            self._started += 1
            hierarchy = cgroups.Hierarchy(self._run_group.version, dict(self._run_group.folders))
            group = hierarchy.child(f"worker-{self._started}", self._run_group)
            group.limit(self._settings["worker_memory"])
        files = group.procs_files() if group is not None else []
        process = self._context.Process(
            target=_worker,
            args=(child, self._out, self._settings, environment, files),
            name=f"grader-{index}",
            daemon=True,
        )
        process.start()
        child.close()
        worker = {"index": index, "process": process, "connection": parent, "task": None, "deadline": None}
        return {**worker, "group": group}

    def _why_it_died(self, worker: dict) -> str:
        """Why a worker ended in the middle of a task: its memory cgroup's limit, a check's CPU budget, or else."""
        if worker["group"] is not None and worker["group"].oom_kills() > 0:
            gib = self._settings.get("worker_memory", 0) / (1 << 30)
            return f"the grading worker died past its memory limit ({gib:g} GiB)"
        worker["process"].join(timeout=10)
        if worker["process"].exitcode == -signal.SIGXCPU:
            return (
                f"a check used more than {limits_module.CHECK_CPU_SECONDS} s of the grader's CPU time: this notebook "
                "is not graded"
            )
        return "the grading worker died"

    def _restart(self, worker: dict) -> None:
        self._kill(worker)
        self._workers[worker["index"]] = self._start(worker["index"], self._environments[worker["index"]])

    @staticmethod
    def _kill(worker: dict) -> None:
        process = worker["process"]
        if process.pid is not None:
            limits_module.kill_descendants(process.pid)
            try:
                os.kill(process.pid, signal.SIGKILL)
            except OSError:
                pass
        process.join(timeout=10)
        worker["connection"].close()
        if worker["group"] is not None:
            worker["group"].remove()

    def run(self, tasks: list[Task], deadline_of, on_result) -> None:
        pending = list(tasks)
        busy = 0
        while pending or busy:
            for worker in self._workers:
                if worker["task"] is None and pending:
                    task = pending.pop(0)
                    worker["connection"].send(asdict(task))
                    worker["task"], worker["deadline"] = task, time.monotonic() + deadline_of(task)
                    busy += 1
            connections = [w["connection"] for w in self._workers if w["task"] is not None]
            ready = wait(connections, timeout=1.0)
            now = time.monotonic()
            for worker in list(self._workers):
                task = worker["task"]
                if task is None:
                    continue
                if worker["connection"] in ready:
                    try:
                        result = worker["connection"].recv()
                    except (EOFError, OSError):
                        result = {"task": asdict(task), "error": self._why_it_died(worker)}
                        self._restart(worker)
                    else:
                        worker["task"] = None
                    busy -= 1
                    self._workers[worker["index"]]["task"] = None
                    if on_result(result) == "stop":
                        pending.clear()
                elif now > worker["deadline"]:
                    busy -= 1
                    self._restart(worker)
                    on_result({"task": asdict(task), "error": f"grading took longer than {deadline_of(task)} s"})

    def close(self) -> None:
        for worker in self._workers:
            try:
                worker["connection"].send(None)
            except OSError:
                pass
        for worker in self._workers:
            worker["process"].join(timeout=20)
            if worker["process"].is_alive():
                self._kill(worker)
            elif worker["group"] is not None:
                worker["group"].remove()


# --------------------------------------------------------------------------------------------- output
UNSAFE_WARNING = (
    "UNSAFE: graded with --unsafe-no-sandbox: learner code ran without its sandbox and could read the solutions, "
    "other students' work and the gradebook, and change them; do not trust these grades."
)


def schema_problems(gradebook: Path) -> list[str]:
    """How the gradebook's schema differs from a fresh nbgrader gradebook's: triggers, views, indexes or tables
    added, changed or removed (``[]`` when it is the same). Read without running anything the file holds."""
    import sqlite3
    import tempfile

    def schema(path: Path) -> set[tuple]:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return set(connection.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall())
        finally:
            connection.close()

    with tempfile.TemporaryDirectory(prefix="gradebook-schema-") as folder:
        load_builder().new_gradebook(Path(folder) / "gradebook.db")
        expected = schema(Path(folder) / "gradebook.db")
    found = schema(gradebook)
    problems = [f"unexpected {kind} {name!r}" for kind, name, _, _ in sorted(found - expected, key=str)]
    problems += [f"missing or changed {kind} {name!r}" for kind, name, _, _ in sorted(expected - found, key=str)]
    return problems


def export_grades(out: Path) -> Path:
    """``out/grades.csv`` in ``nbgrader export``'s format, quoted and formula-safe (``autograder/export.py``)."""
    from nbgrader.api import Gradebook

    from autograder.export import SafeCsvExportPlugin

    path = out / "grades.csv"
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}?timeout=30") as gradebook:
        SafeCsvExportPlugin(to=str(path)).export(gradebook)
    return path


def shown(name: str) -> str:
    """A folder name as printed in the table and messages: as it is when it is a safe id, else Python's ``ascii``
    of it (a refused id never writes a line break or a terminal escape into the grader's output)."""
    return name if name == ALL or unsafe_id_reason(name) is None else ascii(name)


def table(results: list[dict], assignments: list[str]) -> str:
    """Students down, assignments across, ``score / max`` (or FAILED), and a total."""
    by_student: dict[str, dict[str, dict]] = {}
    for result in results:
        task = result["task"]
        by_student.setdefault(task["student"], {})[task["assignment"]] = result
    headers = ["student", *map(shown, assignments), "total"]
    rows = []
    for student in sorted(by_student):
        row, total, maximum = [shown(student)], 0.0, 0.0
        for assignment in assignments:
            result = by_student[student].get(assignment)
            if result is None:
                row.append("-")
            elif result.get("error") or "score" not in result:
                row.append("FAILED")
            else:
                row.append(f"{result['score']:g} / {result['max_score']:g}")
                total += result["score"]
                maximum += result["max_score"]
        row.append(f"{total:g} / {maximum:g}")
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [headers, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- command
def memory_groups(settings: dict):
    """The run's cgroup (kernels' and workers' groups are made in it) and a line saying how memory is counted; the
    group is ``None`` where no cgroup can be made (``cgroups.py``), and the line then says why."""
    from autograder import cgroups

    try:
        group = cgroups.Hierarchy.find().child(f"gpulab-grading-{os.getpid()}")
    except cgroups.Unavailable as error:
        settings["cgroup_parent"] = ""
        return None, f"memory counted by resident pages only (shared memory not counted): no memory cgroup: {error}"
    settings["cgroup_parent"] = json.dumps(cgroups.describe(group))
    return group, f"cgroup v{group.version}"


def _terminate(signum, frame):
    raise KeyboardInterrupt  # clean up workers and kernels as on Ctrl-C


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="grade.py",
        description="Grade a folder of submissions <student>/<assignment>/<notebook>.ipynb with nbgrader.",
        epilog="Exit status: 0 all graded, 1 some submission could not be graded (named on stderr), 2 usage.",
    )
    parser.add_argument("submissions", type=Path, help="folder laid out <student>/<assignment>/<notebook>.ipynb")
    parser.add_argument("--out", type=Path, required=True, help="output folder (an nbgrader course directory)")
    parser.add_argument(
        "--workers", type=int, default=None, help="parallel graders (default: CPUs + a few, at least one per GPU group)"
    )
    parser.add_argument(
        "--gpus-per-worker", type=int, default=None, help="GPUs each kernel sees (default 2 with two or more GPUs)"
    )
    parser.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run kernels WITHOUT their sandbox (learner code can then read the solutions and other students' work)",
    )
    parser.add_argument("--cell-timeout", type=int, default=120, help="seconds per cell (default 120)")
    parser.add_argument("--notebook-timeout", type=int, default=600, help="seconds per notebook (default 600)")
    parser.add_argument("--memory", type=float, default=None, help="GiB per submission (default: fits the machine)")
    parser.add_argument(
        "--disk", type=float, default=2.0, help="GiB a kernel may keep on disk in its folders (default 2)"
    )
    parser.add_argument(
        "--worker-memory", type=float, default=2.0, help="GiB of a grading worker's own memory cgroup (default 2)"
    )
    parser.add_argument("--student", action="append", default=[], help="grade only these students (repeatable)")
    parser.add_argument(
        "--roster",
        type=Path,
        default=None,
        help="a file of the class's student ids, one a line: each gets a row in grades.csv for every graded "
        "assignment, 0 where nothing of theirs was graded (a class's collect found no entry, or refused it)",
    )
    parser.add_argument("--assignment", action="append", default=[], help="grade only these assignments")
    parser.add_argument(
        "--duedate",
        type=due_date,
        default=None,
        help="due date of the graded assignments, ISO 8601 (UTC unless it names a zone): a submission whose "
        "timestamp.txt is later is marked late in the gradebook and grades.csv; kept for later runs",
    )
    parser.add_argument("--source-root", type=Path, default=SOURCE_ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    submissions, out = args.submissions.resolve(), args.out.resolve()
    if not submissions.is_dir():
        print(f"grade.py: {submissions} is not a folder", file=sys.stderr)
        return 2
    if out == submissions or submissions in out.parents or out in submissions.parents:
        print("grade.py: --out must be outside the submissions folder (and not contain it)", file=sys.stderr)
        return 2
    if args.unsafe_no_sandbox:
        print(UNSAFE_WARNING, file=sys.stderr)
    else:
        reason = sandbox.unavailable_reason()
        if reason:
            print(f"grade.py: cannot grade safely: {reason}.", file=sys.stderr)
            print("grade.py: (--unsafe-no-sandbox grades without one; every report then says so)", file=sys.stderr)
            return 2
    os.environ["CUDA_DEVICE_ORDER"] = sandbox.CUDA_DEVICE_ORDER  # NVML's order: the workers' and kernels' too
    gpus = limits_module.visible_gpus()
    if gpus and not args.unsafe_no_sandbox:
        reason = sandbox.gpu_nodes_reason(len(gpus)) or sandbox.kernels_gpus_reason(gpus)
        if reason:
            print(f"grade.py: cannot grade on the GPUs: {reason}.", file=sys.stderr)
            return 2
    lessons = lessons_present(args.source_root)
    builder = load_builder()
    builder.ensure_scripts_on_path()
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)

    def wanted(student: str, assignment: str) -> bool:
        chosen = not args.assignment or assignment in args.assignment or assignment == ALL
        return (not args.student or student in args.student) and chosen

    # the releases the submissions are matched against are generated into out/lessons/ first
    folders = [(s.name, a.name) for s in submissions.iterdir() if _real_dir(s) for a in s.iterdir() if _real_dir(a)]
    assignments = sorted({a for s, a in folders if a in lessons and wanted(s, a)})
    config = prepare_course(out, assignments, lessons)
    if args.duedate is not None:
        record_due_date(config, assignments, args.duedate)
    tasks = [t for t in discover(submissions, lessons, out / "lessons") if wanted(t.student, t.assignment)]
    skipped = skipped_entries(submissions)
    roster = read_roster(args.roster) if args.roster else set()
    register_students(config, {t.student for t in tasks if not t.error} | roster)

    environments = plan_workers(len(tasks), args.workers, gpus, args.gpus_per_worker)
    memory = (
        int(args.memory * limits_module.GiB)
        if args.memory
        else limits_module.default_memory(len(environments), bool(gpus))
    )
    threads = str(max(1, (os.cpu_count() or 1) // len(environments)))
    kernel_env = {k: os.environ.get(k, threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    settings = {
        "cell_timeout": args.cell_timeout,
        "notebook_timeout": args.notebook_timeout,
        "memory": memory,
        "sandbox": not args.unsafe_no_sandbox,
        "kernel_env": kernel_env,
        "worker_memory": int(args.worker_memory * limits_module.GiB),
        "disk": int(args.disk * limits_module.GiB),
    }
    results: list[dict] = []
    failed_early = [t for t in tasks if t.error]
    for task in failed_early:
        results.append({"task": asdict(task), "error": task.error, "notes": list(task.notes)})
    runnable = longest_first([t for t in tasks if not t.error], out / "lessons")

    progress = None
    if not args.no_progress:
        from tqdm import tqdm

        progress = tqdm(total=len(runnable), desc="grading", unit="submission", file=sys.stderr, dynamic_ncols=True)

    def on_result(result: dict):
        results.append(result)
        if progress is not None:
            task = result["task"]
            progress.set_postfix_str(f"{shown(task['student'])}/{shown(task['assignment'])}", refresh=False)
            progress.update(1)

    def deadline_of(task: Task) -> int:
        return max(1, len(task.notebooks)) * (args.notebook_timeout + TASK_MARGIN)

    from autograder.sandbox import socket_folder

    settings["socket_root"] = str(socket_folder())  # the kernels' sockets: removed below, whatever became of them
    spare = frozenset(limits_module.descendants())
    limits_module.become_subreaper()
    signal.signal(signal.SIGTERM, _terminate)
    run_group, accounting = memory_groups(settings)
    pool = Pool(environments, out, settings, run_group) if runnable else None
    try:
        if pool is not None:
            pool.run(runnable, deadline_of, on_result)
    except KeyboardInterrupt:
        print("\ngrade.py: interrupted", file=sys.stderr)
        return 130
    finally:
        if pool is not None:
            pool.close()
        if progress is not None:
            progress.close()
        limits_module.kill_descendants(spare=spare)
        if run_group is not None:
            run_group.remove()
        for scratch in (out / ".scratch", out / ".reports", Path(settings.pop("socket_root"))):
            sandbox.release_folder(scratch)  # a killed worker's kernel filesystems too
    graded_names = {(r["task"]["student"], r["task"]["assignment"]) for r in results}
    for task in runnable:
        if (task.student, task.assignment) not in graded_names:
            results.append({"task": asdict(task), "error": "not graded: the run stopped"})

    problems = schema_problems(out / "gradebook.db")
    if problems:
        print(f"grade.py: the gradebook was tampered with ({'; '.join(problems)}): no grades.csv", file=sys.stderr)
        return 1
    export_grades(out)
    results.sort(key=lambda r: (r["task"]["student"], r["task"]["assignment"]))
    report = {
        "submissions": str(submissions),
        "seconds": round(time.monotonic() - started, 1),
        "workers": len(environments),
        "gpus": gpus,
        "limits": settings,
        "sandbox": not args.unsafe_no_sandbox,
        "memory_accounting": accounting,
        "warning": UNSAFE_WARNING if args.unsafe_no_sandbox else None,
        "results": results,
        "skipped": skipped,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    print(table(results, sorted({r["task"]["assignment"] for r in results})))
    notes = [(r["task"], n) for r in results for n in r.get("notes", [])]
    if notes:
        print("\nnotes:")
        for task, note in notes:
            print(f"  {shown(task['student'])}/{task['assignment']}: {note}")
    if skipped:
        print("\nskipped:")
        for entry in skipped:
            print(f"  {ascii(entry['entry'])[1:-1]}: {entry['why']}")
    failures = [r for r in results if r.get("error")]
    print(
        f"\n{len(results) - len(failures)} of {len(results)} submissions graded in {report['seconds']} s "
        f"with {len(environments)} worker(s); grades: {out / 'grades.csv'}; feedback: {out / 'feedback'}"
    )
    print(f"\n{UNSAFE_WARNING}" if args.unsafe_no_sandbox else "every kernel ran in its sandbox (sandbox.py)")
    if run_group is not None:
        print(f"every kernel and worker had its own memory cgroup ({accounting}; cgroups.py)")
    else:
        print(f"warning: {accounting}", file=sys.stderr)
    if args.unsafe_no_sandbox:
        print(UNSAFE_WARNING, file=sys.stderr)
    if failures:
        print(f"\n{len(failures)} submission(s) could not be graded:", file=sys.stderr)
        for result in failures:
            first_line = str(result["error"]).strip().splitlines()[0]
            task = result["task"]
            print(f"  {shown(task['student'])}/{shown(task['assignment'])}: {first_line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
