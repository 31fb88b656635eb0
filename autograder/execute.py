"""nbgrader preprocessors of the trustworthy autograde pipeline: a sandboxed, limited kernel, verdicts decided by
the grader, scores from those verdicts.

``SandboxedExecute`` replaces nbgrader's ``Execute``:

* it runs the learner's cells as submitted in a kernel started in its own sandbox (``sandbox.py``: own user,
  mount, PID and network namespaces; only this submission's working copy writable, the lesson's own modules
  read-only in it), talking to it over Unix sockets, under resource limits set from outside (``limits.py``): a
  time limit per cell and per notebook, a memory and process cap, a disk limit (as root, on a filesystem of the
  kernel's own), and caps on the output kept per cell and per notebook (streams, displays and display updates
  alike, each charged what nbformat writes of it for every output nbclient writes it into, metadata included).
  Every message of the kernel is vetted as it is decoded and before nbclient reads it (``VettedChannel``,
  ``process_message``): comm messages and outputs nbformat cannot make are dropped, a message that cannot be read
  ends the run. A cell that times out is interrupted; one that ignores the interrupt, a kernel that dies
  (``os._exit``, a crash, the memory cap), a broken message or a used-up notebook budget ends the run: the cells
  after it are not run and score 0;
* it never runs a graded test cell's code. The cell's verdict is the check registered for its ``grade_id``
  (``autograder/checks``, one module per assignment), run in this process against the kernel
  (``checks/kernel.py``): the check asks the kernel to call the learner's definitions on inputs it chooses, reads
  back plain data and files, and compares with references it computes itself. The cell gets no output on a pass
  and one grader-made error (``CheckFailed``) on a failure. An assignment without checks, a graded test cell
  without a check, or a check that breaks is a grader error, never a learner's zero;
* it kills whatever the kernel left running (forked children) and records, per test, what happened in the cell
  metadata (``metadata.autograder``, used by the feedback) and in ``resources["autograder"]``.

``CheckedSaveAutoGrades`` replaces ``SaveAutoGrades``: an autograded test scores its points (or the partial
credit its check returns) only when its check passed, else 0. Outputs and stderr warnings do not decide a score.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import zmq
import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader import utils
from nbgrader.api import Gradebook
from nbgrader.preprocessors import Execute, SaveAutoGrades
from traitlets import Bool, Dict, DottedObjectName, Integer, Type, Unicode, default

from autograder import cgroups
from autograder import limits as limits_module
from autograder import sandbox as sandbox_module
from autograder.checks import CheckFailed, checks_for, failure_rule
from autograder.checks import wire as check_wire
from autograder.checks.kernel import CheckTimeout, KernelDied, KernelSession
from autograder.reasons import Reason, reason

METADATA_KEY = "autograder"


MAX_MESSAGE_BYTES = 24_000_000
"""Bytes of one part of a message from the kernel (its content: an answer of ``checks.MAX_ANSWER`` characters with
room to spare): ZeroMQ drops a larger one before jupyter_client decodes anything (``ZMQ_MAXMSGSIZE``)."""


OUTPUT_FIELDS = {
    "stream": {"name": str, "text": str},
    "display_data": {"data": dict, "metadata": dict},
    "update_display_data": {"data": dict, "metadata": dict},
    "execute_result": {"data": dict, "metadata": dict, "execution_count": (int, type(None))},
    "error": {"ename": str, "evalue": str, "traceback": list},
}
"""The fields nbformat's ``output_from_msg`` reads of each kind of output message, with their types: a message of
the kernel without them is dropped, never handed to nbclient (where a missing one raises in the grader)."""

MAX_OUTPUT_DEPTH = 64
"""Levels a message's content may nest (as a check's answer may, ``wire.MAX_DEPTH``): deeper, it is dropped. nbformat
builds and writes a notebook by recursing (``from_dict`` fails near 500 levels); nothing a lesson shows nests so."""
DISK_SLACK = 64 << 20
"""Bytes of a kernel's filesystem beyond the disk limit (or an eighth of it, if more): the watchdog, which measures
its folders once a second, sees a fast writer past the limit (and says so) before Linux refuses the next write."""
FILES_SLACK = 1_000  # entries of that filesystem beyond ``max_files``, for the same reason
SOCKET_FOLDER_BYTES, SOCKET_FOLDER_FILES = 1 << 20, 64  # the kernel's sockets' folder: its connection file, sockets
OUTPUT_DEPTH = 6
"""Levels above an output's fields in the notebook nbformat writes (notebook, cells, a cell, its outputs, the output,
its data): each adds a space of indentation to every line written below it."""


class LimitedContext(zmq.asyncio.Context):
    """A ZeroMQ context whose sockets refuse messages of more than ``MAX_MESSAGE_BYTES`` (the peer that sends one is
    disconnected and the message never reaches Python): a kernel cannot make the grading worker decode one
    oversized message (what it sends is metered only after it is decoded)."""

    def socket(self, socket_type, *args, **kwargs):
        sock = super().socket(socket_type, *args, **kwargs)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        return sock


MESSAGE_PARTS = {"header": dict, "parent_header": dict, "metadata": dict, "content": dict}
"""The parts of a message jupyter_client and nbclient read, with their types: a message of the kernel that decodes to
anything else (a header that is a list, content nested past the decoder's recursion limit) is broken."""


class VettedChannel(AsyncZMQSocketChannel):
    """A channel whose messages are checked as they are decoded: one that cannot be decoded, or whose parts are not of
    the types nbclient reads them as (``MESSAGE_PARTS``; a header with a text ``msg_type``), raises ``ValueError``,
    as a wrong signature does, before nbclient or a check reads any field of it (``SandboxedExecute`` ends the run
    there: the kernel broke its messages)."""

    async def _recv(self, **kwargs) -> dict:
        try:
            message = await super()._recv(**kwargs)
        except ValueError:
            raise
        except (RecursionError, KeyError, TypeError, AttributeError, IndexError) as error:
            raise ValueError(f"a message of the kernel that cannot be decoded ({type(error).__name__})") from None
        if type(message) is not dict or any(type(message.get(k)) is not t for k, t in MESSAGE_PARTS.items()):
            raise ValueError("a message of the kernel whose parts are malformed")
        if type(message["header"].get("msg_type")) is not str or type(message.get("msg_type")) is not str:
            raise ValueError("a message of the kernel without a message type")
        return message


GRADING_KERNEL_MODULE = "gpulab.kernel"
# No one watches a graded notebook run: a live plot draws its last frame only (gpulab.plots.UNWATCHED_VARIABLE), not
# a frame every quarter second that no one sees (seconds of a kernel's CPU in lesson 03).
UNWATCHED = {"GPULAB_UNWATCHED": "1"}


class LimitedKernelClient(AsyncKernelClient):
    """The grader's client of a kernel: its sockets come from a ``LimitedContext``, its messages are vetted as they
    are decoded (``VettedChannel``), and it has no stdin channel: nothing of the grader reads one (a kernel's
    ``input()`` raises at once), so nothing a kernel sends there can queue up in the grader's memory."""

    shell_channel_class = Type(VettedChannel)
    iopub_channel_class = Type(VettedChannel)
    stdin_channel_class = Type(VettedChannel)
    control_channel_class = Type(VettedChannel)

    @default("context")
    def _context_default(self) -> zmq.asyncio.Context:
        self._created_context = True
        return LimitedContext()

    def start_channels(self, shell=True, iopub=True, stdin=True, hb=True, control=True) -> None:
        super().start_channels(shell=shell, iopub=iopub, stdin=False, hb=hb, control=control)


def grading_kernel(command: list[str]) -> list[str]:
    """The kernelspec's ``python -m ipykernel_launcher ...`` as ``python -m gpulab.kernel ...``: the same kernel, its
    DDP fork server forked from it as it starts (gpulab/kernel.py), not started as a new interpreter at the first
    launch; any other command as it is."""
    for index, word in enumerate(command[:-1]):
        if word == "-m" and command[index + 1] == "ipykernel_launcher":
            return [*command[: index + 1], GRADING_KERNEL_MODULE, *command[index + 2 :]]
    return command


class LimitedKernelManager(AsyncKernelManager):
    """A kernel manager that starts the kernel through ``limits.py`` (rlimits, descriptors) and its sandbox, and
    talks to it through a ``LimitedKernelClient``."""

    client_class = DottedObjectName("autograder.execute.LimitedKernelClient")
    client_factory = Type(klass="jupyter_client.asynchronous.AsyncKernelClient", default_value=LimitedKernelClient)

    launcher_prefix: list[str] = []
    sandbox_command = None  # kernel command -> the same command inside its sandbox (``sandbox.command``)
    kernel_uid = sandbox_module.SANDBOX_UID  # the kernel's host uid as root (``sandbox.fresh_uid``)

    def format_kernel_cmd(self, extra_arguments=None):
        kernel = grading_kernel(super().format_kernel_cmd(extra_arguments))
        if self.sandbox_command is not None:
            # called once the connection file is written: the kernel's unprivileged user must be able to read it
            sandbox_module.give_to_kernel(Path(self.connection_file).parent, uid=self.kernel_uid)
            kernel = self.sandbox_command(kernel)
        return [*self.launcher_prefix, *kernel]


class SandboxedExecute(Execute):
    """nbgrader's ``Execute`` with a sandboxed, limited kernel and verdicts decided by checks (module docstring)."""

    notebook_timeout = Integer(600, help="Wall-clock seconds for the whole notebook (0: none).").tag(config=True)
    memory_limit = Integer(6 << 30, help="Bytes of memory for the kernel and its processes (0: none).").tag(config=True)
    max_processes = Integer(64, help="Processes the kernel may have below it at once.").tag(config=True)
    file_size_limit = Integer(2 << 30, help="Largest file the kernel may write (bytes).").tag(config=True)
    disk_limit = Integer(2 << 30, help="Bytes the kernel may keep on disk in its working copy and home.").tag(
        config=True
    )
    max_files = Integer(100_000, help="Files and folders the kernel may keep in its working copy and home.").tag(
        config=True
    )
    cell_output_limit = Integer(
        2_000_000, help="Bytes of output (streams, displays, display updates, comm messages) kept per cell."
    ).tag(config=True)
    notebook_output_limit = Integer(20_000_000, help="Bytes of output kept for the whole notebook.").tag(config=True)
    check_modules = Dict(
        help="Assignment -> module of its checks, in addition to autograder.checks.MODULES (e.g. a test lesson)."
    ).tag(config=True)
    kernel_env = Dict(help="Extra environment variables of the kernel.").tag(config=True)
    sandbox = Bool(
        True, help="Run the kernel in its sandbox (sandbox.py); False only for grade.py --unsafe-no-sandbox."
    ).tag(config=True)
    report_dir = Unicode("", help="Write <notebook>.json with what happened per test here.").tag(config=True)
    socket_root = Unicode("", help="Make the kernels' socket folders here (a short path); default: /tmp.").tag(
        config=True
    )
    probe_timeout = Integer(15, help="Seconds a kernel has to answer after a cell timed out.").tag(config=True)
    max_tasks = Integer(
        cgroups.DEFAULT_TASKS, help="Processes and threads the kernel's cgroup may hold at once (pids.max)."
    ).tag(config=True)
    cgroup_parent = Unicode(
        "", help="The cgroup (JSON, cgroups.describe) kernels' groups are made in; empty: this process's hierarchy."
    ).tag(config=True)

    _group = None  # the kernel's cgroup (cgroups.py), made in ``_make_group`` for each notebook

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", LimitedKernelManager)
        super().__init__(*args, **kwargs)

    @default("startup_timeout")
    def _startup_timeout_default(self) -> int:
        # gpulab.kernel imports torch before the kernel answers (it forks DDP's fork server then): as long as a
        # cell, which those imports ran in before, not nbclient's 60 s
        return max(60, int(self.timeout or 0))

    # ------------------------------------------------------------------------------------------ kernel
    def _kernel_sees_gpus(self, env: dict) -> bool:
        return bool(limits_module.visible_gpus({**os.environ, **env}))

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        home = self._scratch / "home"
        (home / ".matplotlib").mkdir(parents=True, exist_ok=True)
        cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        for folder in {os.environ.get("MPLCONFIGDIR") or "", str(cache_home / "matplotlib")} - {""}:
            for cache in Path(folder).glob("fontlist-*.json"):  # a font-cache rebuild costs seconds (and runs fc-list)
                shutil.copy(cache, home / ".matplotlib" / cache.name)
        sockets = self._sockets = sandbox_module.socket_folder(self.socket_root or None)
        mounted = self.sandbox and self._own_disk is None  # writable by the kernel: bounded like its other folders
        mounted = mounted and sandbox_module.own_filesystem(sockets, SOCKET_FOLDER_BYTES, SOCKET_FOLDER_FILES) is None
        if self._watchdog is not None:
            self._watchdog.folders += (sockets,)
            self._watchdog.filesystems += (sockets,) if mounted else ()
        km.transport = "ipc"  # Unix sockets in a folder bound into the sandbox: they cross its network namespace
        km.kernel_spec.interrupt_mode = "message"  # an interrupt_request on the control channel, not a signal
        km.connection_file = str(sockets / "kernel.json")
        km.ip = str(sockets / "kernel-ipc")
        gpus = self._kernel_sees_gpus(dict(self.kernel_env))
        limits = limits_module.Limits(
            address_space=limits_module.address_space_limit(self.memory_limit, gpus), file_size=self.file_size_limit
        )
        log = str(self._kernel_log)
        environment = sandbox_module.kernel_environment({**UNWATCHED, **self.kernel_env}, home)
        if self.sandbox:
            sandbox_module.require()
            # as root, a host uid of the kernel's own: nothing Linux counts per uid is shared with another kernel
            uid = km.kernel_uid = sandbox_module.kernel_uid()
            sandbox_module.give_to_kernel(self._workdir, home, sockets, uid=uid)
            writable = [self._workdir, home, sockets]
            shipped = [p for p in self._workdir.glob("*.py") if p.is_file() and not p.is_symlink()]
            km.sandbox_command = lambda kernel: sandbox_module.command(
                kernel,
                workdir=self._workdir,
                writable=writable,
                readonly_inside=shipped,
                environment=environment,
                gpus=gpus,
                uid=uid,
            )
            km.launcher_prefix = limits_module.launcher_command(limits, {}, log, self._group_files())
        else:
            km.launcher_prefix = limits_module.launcher_command(limits, environment, log, self._group_files())
        return km

    def _make_group(self):
        """The kernel's own cgroup (``cgroups.py``): a hard memory limit that counts shared memory, and a limit on
        tasks; made inside ``cgroup_parent`` (grade.py's group for the run) or this process's hierarchy. ``None``
        where none can be made: memory is then counted by resident pages only, and the report says why."""
        try:
            if self.cgroup_parent:
                parent = cgroups.group_from_description(json.loads(self.cgroup_parent))
                hierarchy = cgroups.Hierarchy(parent.version, dict(parent.folders))
                group = hierarchy.child(self._scratch.name, parent)
            else:
                group = cgroups.Hierarchy.find().child(f"gpulab-{self._scratch.name}")
        except (cgroups.Unavailable, OSError, ValueError) as error:
            self._accounting = f"resident pages only (no memory cgroup: {error})"
            return None
        try:
            group.limit(self.memory_limit or cgroups.UNLIMITED, self.max_tasks)
        except OSError as error:
            group.remove()
            self._accounting = f"resident pages only (the cgroup's limits cannot be set: {error})"
            return None
        self._accounting = f"cgroup v{group.version}"
        return group

    def _group_files(self) -> list[str]:
        return self._group.procs_files() if self._group is not None else []

    # ------------------------------------------------------------------------------------------ notebook
    def _autograded_tests(self, resources) -> dict[str, str]:
        """``grade_id -> source`` of the notebook's autograded test cells, from the gradebook."""
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gradebook:
            notebook = gradebook.find_notebook(info["notebook"], info["assignment"])
            solutions = {cell.name for cell in notebook.solution_cells}
            sources = {cell.name: cell.source for cell in notebook.source_cells}
            return {
                cell.name: sources[cell.name]
                for cell in notebook.grade_cells
                if cell.cell_type == "code" and cell.name not in solutions and cell.name in sources
            }

    def preprocess(self, nb, resources=None, km=None):
        root = getattr(self.config.CourseDirectory, "root", "")
        scratch_root = Path(root) / ".scratch" if root and Path(root).is_dir() else None
        if scratch_root is not None:
            scratch_root.mkdir(mode=0o700, exist_ok=True)
        self._scratch = Path(tempfile.mkdtemp(prefix="kernel-", dir=scratch_root))
        # Everything the kernel can write on disk (its working copy, home and log here, its sockets' folder) is on a
        # filesystem of its own where one can be mounted: held to the disk limit by Linux, whatever the kernel does.
        self._own_disk = "the sandbox is off"
        if self.sandbox and self.disk_limit:
            size, files = self.disk_limit + max(self.disk_limit // 8, DISK_SLACK), self.max_files + FILES_SLACK
            self._own_disk = sandbox_module.own_filesystem(self._scratch, size, files)
        # The kernel works in a copy of the notebook's folder (the lesson's modules), removed with the scratch
        # folder: nothing it writes reaches the folder nbgrader keeps and copies into feedback.
        release = Path(resources.get("metadata", {}).get("path") or ".").resolve()
        self._workdir = sandbox_module.working_copy(release, self._scratch / "work")
        self._sockets: Path | None = None
        self._started = time.monotonic()
        self._stopped: Reason | None = None
        self._not_run: dict[int, Reason] = {}  # id(cell) -> why it was not run
        self._stopped_in: dict[int, Reason] = {}  # id(cell) -> why the run stopped there
        self._timeouts: list[int] = []
        self._output_sizes: dict[int, int] = {}
        self._truncated: set[int] = set()
        self._running_cell: int | None = None
        self._watchdog = None
        self._group = None
        self._accounting = "none"
        assignment = resources.get("nbgrader", {}).get("assignment", "")
        self._checks = checks_for(assignment, self.check_modules)
        self._check_results: dict[str, tuple[str, str | None, str | None, bool]] = {}
        self._rules: dict[str, dict[str, str]] = {}  # grade_id -> the failed rule, per language (checks.rule_texts)
        self._check_feedback: dict[str, dict] = {}  # grade_id -> a check's Session.feedback (feedback.py shows it)
        self._check_cells: dict[int, str] = {}
        self._rng = random.Random(int.from_bytes(os.urandom(16), "big"))  # grader-chosen inputs differ per run
        (self._scratch / "grader").mkdir(mode=0o700)
        self._kernel_log = self._scratch / "grader" / "kernel.log"  # the kernel process's own stdout and stderr
        tests = self._autograded_tests(resources)
        cells_by_id: dict[str, NotebookNode] = {}
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if cell.cell_type == "code" and grade_id in tests:
                cells_by_id.setdefault(grade_id, cell)
        spare = frozenset(limits_module.descendants())
        if self._checks is None:
            sandbox_module.release_folder(self._scratch)
            raise RuntimeError(
                f"grader error: {assignment!r} has no checks (autograder/checks: MODULES), so nothing could decide "
                "its graded test cells outside the learner's kernel"
            )
        unchecked = sorted(set(tests) - set(self._checks))
        if unchecked:
            sandbox_module.release_folder(self._scratch)
            raise RuntimeError(f"grader error: no check registered for the graded test cells {unchecked}")
        self._check_cells = {id(cell): grade_id for grade_id, cell in cells_by_id.items()}
        try:  # everything this grading creates is removed in ``finally``, even when the kernel dies at start
            self._group = self._make_group()
            self._watchdog = limits_module.MemoryWatchdog(
                self.memory_limit,
                self.max_processes,
                spare=spare,
                group=self._group,
                folders=(self._scratch,),
                filesystems=(self._scratch,) if self._own_disk is None else (),
                disk=self.disk_limit,
                max_files=self.max_files,
            )
            self.timeout_func = self._cell_timeout
            self._watchdog.start()
            try:
                nb, resources = super().preprocess(nb, resources, km)
            except RuntimeError as error:  # e.g. "Kernel died before replying": say what the kernel printed
                raise RuntimeError(f"{error}; the kernel's own output: {self._kernel_output()}") from error
        finally:
            if self._watchdog is not None:
                self._watchdog.stop()
            limits_module.kill_descendants(spare=spare)
            if self._group is not None:
                self._group.remove()
            sandbox_module.release_folder(self._scratch)
            if self._sockets is not None:
                sandbox_module.release_folder(self._sockets)
        report = self._report(tests, cells_by_id)
        resources[METADATA_KEY] = report
        if self.report_dir:
            path = Path(self.report_dir) / f"{resources['nbgrader']['notebook']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=1, sort_keys=True))
        return nb, resources

    def _kernel_output(self, limit: int = 2000) -> str:
        try:
            return self._kernel_log.read_text(errors="replace")[-limit:].strip() or "(none)"
        except OSError:
            return "(none)"

    def _report(self, tests, cells_by_id) -> dict:
        """Per test: ``status`` (passed, failed, not run, missing), ``where`` a failure was, a reason."""
        per_test = {}
        for grade_id in tests:
            cell = cells_by_id.get(grade_id)
            entry: dict = {"status": "failed", "where": None, "reason": None, "partial": None}
            if cell is None:
                why = reason("missing_cell")
                entry.update(status="missing")
            elif grade_id in self._check_results:
                status, why, partial, shown = self._check_results[grade_id]
                entry.update(status=status, partial=partial)
                if status == "failed" and not shown:
                    entry["where"] = "hidden"  # feedback does not quote a check's message: it names hidden inputs
                    if grade_id in self._rules:
                        entry["rule"] = self._rules[grade_id]  # but names the rule that failed (a catalogue text)
            else:
                why = self._not_run.get(id(cell)) or self._stopped_in.get(id(cell)) or reason("check_not_run")
                entry.update(status="not run" if id(cell) in self._not_run else "failed")
            if why is not None:
                entry["reason"] = str(why)
            if isinstance(why, Reason):
                entry["why"] = why.record()  # feedback writes it in the student's edition (autograder/reasons.py)
            if grade_id in self._check_feedback:
                entry["feedback"] = self._check_feedback[grade_id]
            if cell is not None:
                cell.metadata[METADATA_KEY] = dict(entry)  # the grader's record only, whatever the submission had
            per_test[grade_id] = entry
        return {
            "tests": per_test,
            "stopped": None if self._stopped is None else str(self._stopped),
            "timeouts": self._timeouts,
            "seconds": round(time.monotonic() - self._started, 2),
            "peak_memory": self._watchdog.peak,
            "memory_accounting": self._accounting,
            "sandbox": self.sandbox,
            "disk_accounting": self._disk_accounting(),
        }

    def _disk_accounting(self) -> str:
        if self._own_disk is None:
            return "a filesystem of its own"
        return f"its folders, measured once a second (files it deleted but holds open are not: {self._own_disk})"

    # ------------------------------------------------------------------------------------------ cells
    def _remaining(self) -> float | None:
        if not self.notebook_timeout:
            return None
        return self.notebook_timeout - (time.monotonic() - self._started)

    def _cell_timeout(self, cell) -> int | None:
        remaining = self._remaining()
        limits = [t for t in (self.timeout, remaining) if t]
        return max(1, int(min(limits))) if limits else None

    def _skip(self, cell, why: Reason) -> None:
        text = str(why)
        cell.outputs = [new_output("error", ename="CellNotRun", evalue=text, traceback=[f"Not run: {text}"])]
        cell.execution_count = None
        self._not_run[id(cell)] = why

    def preprocess_cell(self, cell, resources, index):
        self._check_assign_resources(resources)
        if cell.cell_type != "code" or not cell.source.strip():
            return cell, self.resources
        if self._stopped:
            self._skip(cell, self._stopped)
            return cell, self.resources
        remaining = self._remaining()
        if remaining is not None and remaining < 1:
            self._stopped = reason("notebook_time", seconds=self.notebook_timeout)
            self._skip(cell, self._stopped)
            return cell, self.resources
        limit = self._cell_timeout(cell)
        number = index  # the cell's index in the submitted notebook
        if id(cell) in self._check_cells:
            self._run_check(cell, self._check_cells[id(cell)], limit, number)
            return cell, self.resources
        self.error_on_timeout = {
            "ename": "CellTimeoutError",
            "evalue": f"the cell ran past its time limit ({limit} s) and was interrupted",
            "traceback": [f"CellTimeoutError: the cell ran past its time limit ({limit} s) and was interrupted"],
        }
        self._running_cell = index
        try:
            cell = self.execute_cell(cell, index, store_history=True)
        except DeadKernelError:
            self._watchdog.over_memory()  # the cgroup's OOM killer may have ended it before the watchdog looked
            why = self._watchdog.tripped or reason("kernel_died")
            self._stop(cell, reason("in_cell", why=why, cell=number))
        except CellTimeoutError:
            self._timeouts.append(number)
            self._stop(cell, reason("cell_stuck", cell=number, seconds=limit))
        except ValueError as error:  # a message refused ("Invalid Signature", or by VettedChannel): cell errors are
            # outputs, so only the kernel's broken messages get here (learner code rewrote what signs or sends them)
            self._stop(cell, reason("broken_messages", cell=number, detail=str(error)[:120]))
        finally:
            self._running_cell = None
        if not self._stopped and self._watchdog.check_disk():  # its writes refused, the kernel went on: stop it here
            self._stop(cell, reason("in_cell", why=self._watchdog.tripped, cell=number))
        if not self._stopped and any(o.get("ename") == "CellTimeoutError" for o in cell.get("outputs", [])):
            self._timeouts.append(number)
            if not self._responsive():
                self._stop(cell, reason("unresponsive", cell=number, seconds=limit))
        return cell, self.resources

    # ------------------------------------------------------------------------------------------ checks
    def _run_check(self, cell, grade_id: str, limit: int | None, number: int) -> None:
        """The verdict of a graded test cell, decided here by its check (``autograder/checks``); the cell's own
        code is not run. Its outputs: none on a pass, one error written by the grader on a failure."""
        deadline = time.monotonic() + (limit if limit else 24 * 3600)
        session = KernelSession(self, self._workdir, deadline, self._rng)
        partial = None
        try:
            with limits_module.cpu_budget():  # past it, the system ends this worker: this notebook fails, no other
                value = self._checks[grade_id](session)
            if value is not None:
                if type(value) not in (int, float):
                    raise TypeError(f"the check of {grade_id} returned {value!r}: None or partial credit")
                partial = str(value)
        except CheckTimeout as failure:
            self._timeouts.append(number)
            self._fail_check(cell, grade_id, failure.args[0], shown=True)
            if not self._responsive():
                self._stop(cell, reason("unresponsive", cell=number, seconds=limit))
        except KernelDied:
            self._watchdog.over_memory()  # the cgroup's OOM killer may have ended it before the watchdog looked
            why = self._watchdog.tripped or reason("kernel_died")
            self._fail_check(cell, grade_id, why, shown=True)
            self._stop(cell, reason("in_cell", why=why, cell=number))
        except CheckFailed as failure:
            texts = failure_rule(failure, grade_id, getattr(self._checks[grade_id], "__module__", ""))
            if texts is not None:
                self._rules[grade_id] = texts
            self._fail_check(cell, grade_id, str(failure))
        except Exception as error:
            raise RuntimeError(
                f"grader error: the check of {grade_id!r} raised {type(error).__name__}: {error}"
            ) from error
        else:
            cell.outputs = []
            cell.execution_count = None
            self._check_results[grade_id] = ("passed", None, partial, False)
        finally:
            if type(session.feedback) is dict:
                self._check_feedback[grade_id] = session.feedback
            session.close()

    def _fail_check(self, cell, grade_id: str, message: str | Reason, shown: bool = False) -> None:
        """The grader's error output; ``shown``: the reason is about limits, not the hidden tests (feedback)."""
        text = str(message)
        cell.outputs = [new_output("error", ename="CheckFailed", evalue=text, traceback=[f"CheckFailed: {text}"])]
        cell.execution_count = None
        self._check_results[grade_id] = ("failed", message, None, shown)

    async def interrupt(self) -> None:
        """Interrupt the kernel (a check ran past its cell's time limit)."""
        from jupyter_core.utils import ensure_async

        await ensure_async(self.km.interrupt_kernel())

    async def kernel_alive(self) -> bool:
        from jupyter_core.utils import ensure_async

        return bool(await ensure_async(self.km.is_alive()))

    def _responsive(self) -> bool:
        """Whether the kernel answers a trivial request within ``probe_timeout`` seconds (after a timeout)."""

        async def probe() -> bool:
            msg_id = self.kc.execute("", silent=True, store_history=False)
            deadline = time.monotonic() + self.probe_timeout
            while time.monotonic() < deadline:
                try:
                    reply = await self.kc.shell_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - queue.Empty: no answer in time
                    return False
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    return True
            return False

        try:
            return bool(run_sync(probe)())
        except Exception:  # noqa: BLE001 - a dead or broken kernel
            return False

    def _stop(self, cell, why: Reason) -> None:
        """End the run: kill the kernel's processes; this cell errs, later ones are not run."""
        self._stopped = why
        self._stopped_in[id(cell)] = why
        limits_module.kill_descendants(spare=self._watchdog.spare)
        text = str(why)
        cell.outputs = list(cell.get("outputs", [])) + [
            new_output("error", ename="KernelStopped", evalue=text, traceback=[f"KernelStopped: {text}"])
        ]

    @staticmethod
    def _message_size(msg) -> int | None:
        """What nbformat writes of one message once nbclient has put it in the notebook (``json.dumps(..., indent=1,
        ensure_ascii=False)``, each text of an output split into its lines): every text as JSON escapes it (a control
        character takes 6 bytes), each of its lines on a line of its own, every key, number and container, each on
        a line indented by its depth in the notebook, and the buffers (base64). Walked without recursion; ``None``
        when the content nests deeper than ``MAX_OUTPUT_DEPTH`` (the grader would only write it by recursing)."""
        size, pending = 64, [(msg.get("content"), OUTPUT_DEPTH)]  # 64: the output's own few fields
        while pending:
            item, depth = pending.pop()
            if depth > OUTPUT_DEPTH + MAX_OUTPUT_DEPTH:
                return None
            line = depth + 4  # a line of this depth: its indentation, a comma and a line break
            if isinstance(item, str):
                size += len(json.dumps(item, ensure_ascii=False)) + (item.count("\n") + 1) * (line + 2)
            elif isinstance(item, dict):
                for key, value in item.items():
                    size += len(json.dumps(str(key), ensure_ascii=False)) + 2
                    pending.append((value, depth + 1))
                size += 2 * line  # its opening and closing lines
            elif isinstance(item, list):
                pending.extend((value, depth + 1) for value in item)
                size += 2 * line
            else:
                size += len(repr(item)) + line
        return size + sum(4 * len(buffer) // 3 + 4 for buffer in msg.get("buffers", []) or [])

    def _copies(self, msg) -> int:
        """How many outputs nbclient writes this message into: a display update (``update_display_data``, or a
        ``display_data``/``execute_result`` carrying a ``display_id``) replaces the data of every output shown so
        far with that ``display_id``, in any cell (``NotebookClient._update_display_id``: one update reaches 60
        outputs when 60 were given one id), and a display is appended besides; anything else is written once."""
        kind = msg.get("msg_type", "")
        transient = (msg.get("content") or {}).get("transient")
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        if not display_id or kind not in ("display_data", "update_display_data", "execute_result"):
            return 1
        shown = sum(len(places) for places in (self._display_id_map.get(display_id) or {}).values())
        return max(1, shown + (kind != "update_display_data"))

    def process_message(self, msg, cell, cell_index):
        """Vet every message before nbclient reads it, and meter those that can grow the notebook.

        Dropped: comm messages (grading has no frontend: no widget state or output widget is kept), an output
        message nbformat cannot make (a field missing or of another type, ``OUTPUT_FIELDS``), a status without a
        state, and anything nesting deeper than ``MAX_OUTPUT_DEPTH``. An ``execution_count`` that is no count, which
        nbclient would write into the cell from any message, is taken out. Outputs, displays and display updates
        are charged what nbformat writes of them (``_message_size``) times the outputs they reach (``_copies``);
        past ``cell_output_limit`` bytes in a cell or ``notebook_output_limit`` in the notebook one is dropped whole
        (no output is updated)."""
        kind = msg.get("msg_type", "")
        content = msg.get("content")
        if not isinstance(content, dict) or kind.startswith("comm"):  # JSON that is no object: nbclient would fail
            return None
        data = content.get("data")
        if isinstance(data, dict) and check_wire.MIME in data:  # the checks' private answers are never kept
            return None
        if kind in OUTPUT_FIELDS and not all(
            k in content and isinstance(content[k], t) for k, t in OUTPUT_FIELDS[kind].items()
        ):
            return None  # an output nbformat cannot make (a field missing or of another type)
        if kind == "status" and type(content.get("execution_state")) is not str:
            return None
        count = content.get("execution_count")
        if "execution_count" in content and not (type(count) is int and 0 <= count < 1 << 31 or count is None):
            del content["execution_count"]  # nbclient copies it into the cell from any message: a count or nothing
        transient = content.get("transient")
        if transient and not (isinstance(transient, dict) and isinstance(transient.get("display_id", ""), str)):
            content["transient"] = None  # a display_id that is no text (a list: unhashable in nbclient's map)
        if kind in ("stream", "display_data", "update_display_data", "execute_result", "error"):
            size = self._message_size(msg)
            if size is None:
                return None
            size *= self._copies(msg)
            used = self._output_sizes.get(cell_index, 0)
            total = sum(self._output_sizes.values())
            over_cell = self.cell_output_limit and used + size > self.cell_output_limit
            over_notebook = self.notebook_output_limit and total + size > self.notebook_output_limit
            if over_cell or over_notebook:
                if cell_index not in self._truncated:
                    self._truncated.add(cell_index)
                    limit = self.cell_output_limit if over_cell else self.notebook_output_limit
                    what = "this cell" if over_cell else "this notebook"
                    note = f"[output truncated by the grader: more than {limit} bytes in {what}]\n"
                    cell.outputs.append(new_output("stream", name="stdout", text=note))
                return None
            self._output_sizes[cell_index] = used + size
        return super().process_message(msg, cell, cell_index)


class CheckedSaveAutoGrades(SaveAutoGrades):
    """Score autograded tests from ``resources["autograder"]`` (their checks), other grade cells as nbgrader does."""

    def _add_score(self, cell, resources):
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        tests = resources.get(METADATA_KEY, {}).get("tests", {})
        if grade_id not in tests or utils.is_solution(cell):
            return super()._add_score(cell, resources)
        grade = self.gradebook.find_grade(grade_id, self.notebook_id, self.assignment_id, self.student_id)
        max_points = float(cell.metadata["nbgrader"]["points"])
        entry = tests[grade_id]
        score = 0.0
        if entry["status"] == "passed":
            score = max_points
            if entry.get("partial"):
                try:
                    score = min(max(float(entry["partial"]), 0.0), max_points)
                except ValueError:
                    score = max_points
        grade.auto_score = score
        grade.needs_manual_grade = grade.manual_score is not None
        self.gradebook.db.commit()


def _autograde_preprocessors() -> list:
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import AssignLatePenalties, CheckCellMetadata, IgnorePattern, LimitOutput

    return [
        SandboxedExecute,
        IgnorePattern,
        ClearMetadataPreprocessor,
        LimitOutput,
        CheckedSaveAutoGrades,
        AssignLatePenalties,
        CheckCellMetadata,
    ]


AUTOGRADE_PREPROCESSORS = _autograde_preprocessors()
"""nbgrader's ``Autograde.autograde_preprocessors`` with ``Execute`` and ``SaveAutoGrades`` replaced."""
