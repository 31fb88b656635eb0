"""Resource limits for grading kernels: wall clock per cell and per notebook, memory, processes, output.

How each limit is enforced (Linux):

* **per cell**: nbclient's timeout (``Execute.timeout``; ``timeout_func`` also caps it by what is left of the
  notebook's budget). On timeout the kernel is interrupted; a cell that does not stop on the interrupt gets the
  kernel killed (``execute.SandboxedExecute``), so the cells after it are not run and score 0.
* **per notebook**: a deadline; cells that would start after it are not run (0 points).
* **memory**: a watchdog thread in the grading worker sums the resident memory of every process below the worker
  (the kernel and anything it forked or spawned: DDP ranks, a fork bomb) every ``interval`` seconds and kills
  them all past ``memory`` bytes or ``max_processes`` processes. Without GPUs the kernel also runs under
  ``RLIMIT_AS`` (``memory`` plus slack for virtual reservations), so most memory bombs end as an ordinary
  ``MemoryError`` in the cell instead. CUDA reserves huge virtual ranges, so with GPUs only the watchdog acts;
  a GPU out-of-memory is an ordinary exception in the cell.
* **processes left behind**: the worker is a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so anything
  the kernel forks stays below the worker even when orphaned; ``kill_descendants`` ends it all after each notebook.
* **files and core dumps**: ``RLIMIT_FSIZE`` (no file over ``file_size`` bytes), ``RLIMIT_CORE`` = 0 and
  ``RLIMIT_NOFILE`` (``KERNEL_OPEN_FILES`` per process: the machine's file table is shared); the kernel's writable
  folders on disk (its working copy, home, log and sockets' folder) are measured once a second by the watchdog,
  which stops the kernel past ``disk`` bytes or ``max_files`` entries (the disk the grader shares with every
  student); as root they are also a filesystem of the kernel's own (``sandbox.own_filesystem``), whose size Linux
  enforces on what no walk finds (files deleted but held open).
* **address space**: decided in one place, :func:`address_space_limit`: none wherever a GPU is visible to the
  kernel (CUDA reserves far more virtual address space than any sensible cap, and then fails at the first
  ``.to("cuda")`` while ``torch.cuda.device_count()`` still reports GPUs), else the memory cap plus slack.

The kernel starts through this file: ``python limits.py [--address-space N] [--file-size N] [--env K=V ...]
-- bwrap ... -- python -m gpulab.kernel -f ...`` sets the limits and environment, then ``exec``s the sandbox
and the kernel. Nothing secret is handed to a kernel: the checks' requests carry only inputs, and verdicts are
decided in the grader's process (``autograder/checks``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass

GiB = 1 << 30


def gib_text(size: int) -> str:
    """``size`` bytes in GiB as a reason prints it: up to three significant digits (0.75, 1.5, 24), so that a limit
    below 1 GiB is not rounded to another one."""
    return f"{size / GiB:.3g}"


PR_SET_CHILD_SUBREAPER = 36
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


KERNEL_OPEN_FILES = 1024
"""Files one process of a kernel may hold open (``RLIMIT_NOFILE``, the common default): the file table of the machine
(``fs.file-max``, about one file per 10 KB of memory) is shared by every process but root's, and grading runs about
one worker per 2 GiB of memory at most (``grade.default_cpu_workers``); ``max_processes`` (64) processes of 1,024 files
per kernel keep all kernels together below half of it, where 20,000 (a container's usual limit) would let two
kernels take it all and every other kernel fail to open a file."""


@dataclass(frozen=True)
class Limits:
    """Per-notebook limits (seconds, bytes). ``address_space`` 0 means no ``RLIMIT_AS`` (e.g. with GPUs)."""

    cell_timeout: int = 120
    notebook_timeout: int = 600
    memory: int = 6 * GiB  # CPU_KERNEL_MEMORY
    address_space: int = 10 * GiB
    max_processes: int = 64
    file_size: int = 2 * GiB
    cell_output: int = 2_000_000
    open_files: int = KERNEL_OPEN_FILES


ADDRESS_SPACE_SLACK = 4 * GiB  # virtual reservations (thread stacks, allocator arenas) beyond resident memory


def visible_gpus(environment: dict[str, str] | None = None) -> list[str]:
    """The GPUs a process started with ``environment`` (default: this one's) would see, as ``CUDA_VISIBLE_DEVICES``
    entries, without initialising CUDA: the declared list when ``CUDA_VISIBLE_DEVICES`` is set, else every GPU the
    driver reports (``gpu_count``)."""
    declared = (os.environ if environment is None else environment).get("CUDA_VISIBLE_DEVICES")
    if declared is not None:
        return [d.strip() for d in declared.split(",") if d.strip() and d.strip() != "-1"]
    return [str(i) for i in range(gpu_count())]


def gpu_count() -> int:
    """How many GPUs the NVIDIA driver reports: NVML first (``nvidia-ml-py``'s ``pynvml``, a gpulab dependency: it
    opens no CUDA context), which works in containers that expose the devices but not ``nvidia-smi``; where NVML
    cannot be loaded but NVIDIA device nodes exist, torch counts them in a subprocess (so that CUDA is never
    initialised in the grader); 0 without the driver."""
    import glob
    import subprocess

    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound (no driver), no pynvml module, ...
        pass
    if not glob.glob("/dev/nvidia[0-9]*"):
        return 0
    code = "import torch; print(torch.cuda.device_count())"
    try:
        found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
        return int(found.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0


def address_space_limit(memory: int, gpus_visible: bool) -> int:
    """``RLIMIT_AS`` of a grading kernel in bytes, 0 for none: the one place this is decided.

    Never where a GPU is visible to the kernel (CUDA reserves far more address space than it uses); otherwise the
    memory cap plus slack, so that most memory bombs end as a ``MemoryError`` in their cell."""
    if gpus_visible or not memory:
        return 0
    return memory + ADDRESS_SPACE_SLACK


CHECK_CPU_SECONDS = 60
"""CPU time of the grading worker one check may use (decoding the kernel's answers, computing references, comparing):
an honest check takes a few seconds. Past it, the worker is ended by the system (``RLIMIT_CPU``'s ``SIGXCPU``),
so that a check made slow by a hostile answer fails that notebook only: the pool reports it and starts a fresh
worker for the next submission (``grade.Pool``)."""


@contextlib.contextmanager
def cpu_budget(seconds: float = CHECK_CPU_SECONDS):
    """Within the block, this process may use ``seconds`` more of CPU time (all its threads) before the system ends
    it with ``SIGXCPU`` (its default action, which nothing here replaces): a limit that holds in a C call that
    never returns to Python, where a timer's handler would never run. The soft limit is put back afterwards (an
    unprivileged process may raise it again up to the hard limit, which is never touched)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    limit = int(usage.ru_utime + usage.ru_stime + seconds) + 1
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if threading.current_thread() is threading.main_thread():  # elsewhere the disposition cannot be set (nor was)
        signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


CPU_KERNEL_MEMORY = 6 * GiB
"""Memory of a grading kernel and everything it starts, without GPUs: a lesson's kernel with two DDP ranks on gloo
peaks far below it (``report.json``'s ``peak_memory``)."""
GPU_KERNEL_MEMORY = 12 * GiB
"""The same where a kernel sees GPUs. Not measured on a GPU yet: every CUDA process (the kernel, each DDP rank)
carries the driver's and CUDA libraries' host memory (1-2 GB by NVIDIA's and PyTorch's accounts), three of them in
lesson 03. The memory cgroup counts each shared library page once and reclaims file pages before it kills
anything, which a sum of resident pages does not; the GPU check (``scripts/gpu_check.py``) records what a CUDA
kernel and a rank hold, to set this from a measurement."""


def default_memory(workers: int, gpus: bool = False) -> int:
    """A memory cap per submission for its device kind (``CPU_KERNEL_MEMORY``, ``GPU_KERNEL_MEMORY``), or less so
    that ``workers`` kernels fit in 75 % of this machine."""
    cap = GPU_KERNEL_MEMORY if gpus else CPU_KERNEL_MEMORY
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        return cap
    return int(min(cap, total * 0.75 / max(1, workers)))


# --------------------------------------------------------------------------------------------- processes
def become_subreaper() -> bool:
    """Make orphaned descendants of this process re-parent to it (Linux); return whether that worked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return False


def _children_from_proc_files(pid: int) -> list[int] | None:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found += [int(p) for p in handle.read().split()]
        except FileNotFoundError:
            return None  # kernel without CONFIG_PROC_CHILDREN
        except OSError:
            continue
    return found


def _stat_fields(pid: int | str) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the command name: state, parent, ... (OSError once it is gone)."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        stat = handle.read()
    return stat[stat.rindex(b")") + 2 :].split()


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(_stat_fields(entry)[1])
            except (OSError, ValueError, IndexError):
                continue
    return parents


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this process), parents before children."""
    pid = os.getpid() if pid is None else pid
    if not os.path.isdir("/proc"):  # pragma: no cover - not Linux
        return []
    found: list[int] = []
    queue = [pid]
    parents = None
    while queue:
        current = queue.pop(0)
        children = _children_from_proc_files(current) if parents is None else None
        if children is None:
            if parents is None:
                parents = _parents()
            children = [p for p, parent in parents.items() if parent == current]
        for child in children:
            if child not in found and child != pid:
                found.append(child)
                queue.append(child)
    return found


def resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


def kill_descendants(
    pid: int | None = None, spare: frozenset[int] | set[int] = frozenset(), rounds: int = 5, wait: float = 10.0
) -> int:
    """SIGKILL every process below ``pid`` (default: this process) except ``spare``, repeatedly (forks race).

    Returns when every process signalled has exited (or after ``wait`` seconds): a SIGKILLed process may still be
    finishing a write, so a folder it wrote in is only removed after this returns. Processes that were re-parented
    to this process (it is a subreaper) are reaped. Returns how many processes were signalled.
    """
    pid = os.getpid() if pid is None else pid
    signalled: set[int] = set()
    for _ in range(rounds):
        pids = [p for p in descendants(pid) if p not in spare]
        if not pids:
            break
        for child in pids:
            try:
                os.kill(child, signal.SIGSTOP)  # stop forking first
            except OSError:
                pass
        for child in pids:
            try:
                os.kill(child, signal.SIGKILL)
                signalled.add(child)
            except OSError:
                pass
        time.sleep(0.05)
    remaining = set(signalled)
    deadline = time.monotonic() + wait
    while remaining:
        remaining = {child for child in remaining if not _exited(child)}
        if not remaining or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return len(signalled)


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited: reaped here when it is this process's child, else gone or a zombie."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    try:
        return _stat_fields(pid)[0] in (b"Z", b"X")
    except OSError:
        return True


# --------------------------------------------------------------------------------------------- watchdog
class MemoryWatchdog(threading.Thread):
    """Stop a kernel past its memory or process limits; ``tripped`` then says why (the grader reports it for the
    cell that was running).

    With a ``group`` (``cgroups.Group``, the kernel's memory cgroup), memory is the kernel's own accounting: the
    group's hard limit is enforced by Linux, which counts shared memory, memfd and tmpfs too; the watchdog notices
    the OOM kill and ends the whole group. Without one (no cgroup can be made here), it sums the resident memory of
    every process below this one (but ``spare``) and kills them all past ``memory`` bytes: memory held outside
    resident pages (``memfd``, ``/dev/shm``) is then not counted, and reports say so. Either way, more than
    ``max_processes`` processes below this one stop the kernel too.
    """

    def __init__(
        self,
        memory: int,
        max_processes: int,
        interval: float = 0.2,
        spare: frozenset[int] = frozenset(),
        group=None,
        folders: tuple = (),
        disk: int = 0,
        max_files: int = 0,
        filesystems: tuple = (),
    ):
        super().__init__(name="grading-memory-watchdog", daemon=True)
        self.spare = spare
        self.memory = memory
        self.max_processes = max_processes
        self.interval = interval
        self.group = group
        self.folders, self.disk, self.max_files = tuple(folders), disk, max_files
        self.filesystems = tuple(filesystems)  # the kernel's filesystems of its own (``sandbox.own_filesystem``)
        self.tripped = None  # a ``reasons.Reason`` once a limit was passed
        self.peak = 0
        self._stop_event = threading.Event()

    def over_memory(self) -> bool:
        """Whether the kernel's group has met its memory limit (asked at once, e.g. when the kernel died)."""
        if self.group is not None and self.group.oom_kills() > 0:
            self._trip_memory()
        return self.tripped is not None

    def _trip_memory(self) -> None:
        from autograder.reasons import reason

        # A memory cgroup charges the page cache of the files a kernel writes: a kernel that fills its folders
        # faster than they are measured (once a second) meets the memory limit first, but what it overran is the
        # disk's, and that is the limit it is told of.
        if self.tripped is None:
            self.tripped = self._disk_reason() or reason("memory", gib=gib_text(self.memory))

    def _disk_reason(self, walk: bool = True):
        """The disk limit's reason when the kernel's filesystems of its own (``statvfs``: what they hold, files it
        deleted but holds open included) or, with ``walk``, its folders hold more than ``disk`` bytes or
        ``max_files`` entries (or cannot be measured), else None."""
        from autograder.reasons import reason

        used = files = 0
        for path in self.filesystems:
            try:
                info = os.statvfs(path)
            except OSError:
                continue
            used += (info.f_blocks - info.f_bfree) * info.f_frsize
            files += info.f_files - info.f_ffree
        if walk and self.folders:
            try:
                walked, entries = disk_usage(self.folders)
            except (TooDeep, RecursionError, OSError):
                walked, entries = self.disk + 1, self.max_files + 1  # what cannot be measured is over the limit
            used, files = max(used, walked), max(files, entries)
        if (self.disk and used > self.disk) or (self.max_files and files > self.max_files):
            return reason("disk", gib=gib_text(self.disk), files=self.max_files)
        return None

    def check_disk(self) -> bool:
        """Measure the kernel's filesystems of its own now (no walk: ``statvfs``) and stop it, as the thread does,
        past the disk limit; whether the kernel is past any limit. Called after each cell, so that a kernel whose
        writes were refused (its filesystem full) is stopped in the cell that filled it."""
        if self.tripped is None and self.filesystems:
            why = self._disk_reason(walk=False)
            if why is not None and self.tripped is None:
                self.tripped = why
                if self.group is not None:
                    self.group.kill()
                kill_descendants(spare=self.spare)
        return self.tripped is not None

    def run(self) -> None:
        # Imported here: the kernel also starts through this file, as a script, without the autograder package.
        from autograder.reasons import reason

        rounds = 0
        while not self._stop_event.wait(self.interval):
            rounds += 1
            pids = [p for p in descendants() if p not in self.spare]
            if self.group is not None:
                self.peak = max(self.peak, self.group.peak(), self.group.memory())
                if self.group.oom_kills() > 0:
                    self._trip_memory()
            elif pids:
                total = sum(resident_bytes(p) for p in pids)
                self.peak = max(self.peak, total)
                if self.memory and total > self.memory:
                    self._trip_memory()
            if self.tripped is None and self.max_processes and len(pids) > self.max_processes:
                self.tripped = reason("processes", count=self.max_processes)
            if self.tripped is None:  # the filesystems of its own every round, its folders walked once a second
                self.tripped = self._disk_reason(walk=rounds % DISK_EVERY == 0)
            if self.tripped:
                if self.group is not None:
                    self.group.kill()
                kill_descendants(spare=self.spare)
                return

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)
        if self.group is not None:
            self.peak = max(self.peak, self.group.peak())


DISK_EVERY = 5  # the watchdog measures the kernel's folders every 5th round (once a second)


MAX_DEPTH = 64  # folders a kernel's files may be nested in (deeper is no lesson's, and hides from measuring)


class TooDeep(Exception):
    """A kernel's folders are nested deeper than ``MAX_DEPTH``."""


def disk_usage(folders) -> tuple[int, int]:
    """Bytes of disk (allocated blocks: a sparse file counts what it holds) and entries under ``folders``, never
    following a link and without recursion; ``TooDeep`` past ``MAX_DEPTH`` levels (a path too long to measure)."""
    used = entries = 0
    stack = [(str(folder), 0) for folder in folders]
    while stack:
        folder, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TooDeep(folder[:200])
        try:
            listing = list(os.scandir(folder))
        except OSError:
            continue
        for entry in listing:
            entries += 1
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            used += info.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, depth + 1))
    return used, entries


# --------------------------------------------------------------------------------------------- launcher
def launcher_command(
    limits: Limits,
    env: dict[str, str] | None = None,
    log: str | None = None,
    cgroup: list[str] = (),
) -> list[str]:
    """The prefix that starts a kernel command under ``limits`` (see ``main``), in the cgroup whose
    ``cgroup.procs`` files are ``cgroup`` (``cgroups.Group.procs_files``)."""
    command = [sys.executable, os.path.abspath(__file__), "--file-size", str(limits.file_size)]
    command += ["--open-files", str(limits.open_files)]
    if log:
        command += ["--log", log]
    for procs in cgroup:
        command += ["--cgroup", procs]
    if limits.address_space:
        command += ["--address-space", str(limits.address_space)]
    for key, value in sorted((env or {}).items()):
        command += ["--env", f"{key}={value}"]
    return [*command, "--"]


def main(argv: list[str] | None = None) -> None:
    import resource

    parser = argparse.ArgumentParser(description="Start a command under resource limits (used for kernels).")
    parser.add_argument("--address-space", type=int, default=0, help="RLIMIT_AS in bytes (0: unchanged)")
    parser.add_argument("--file-size", type=int, default=0, help="RLIMIT_FSIZE in bytes (0: unchanged)")
    parser.add_argument("--open-files", type=int, default=0, help="RLIMIT_NOFILE (0: unchanged)")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE to set in the environment")
    parser.add_argument("--log", default="", help="send the command's own stdout and stderr to this file")
    parser.add_argument("--cgroup", action="append", default=[], help="a cgroup.procs file to enter first")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    for procs in args.cgroup:  # first: everything the command starts is in the group, and counted
        with open(procs, "w") as handle:
            handle.write(str(os.getpid()))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if args.address_space:
        resource.setrlimit(resource.RLIMIT_AS, (args.address_space, args.address_space))
    if args.file_size:
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.file_size, args.file_size))
    if args.open_files:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        files = args.open_files if hard == resource.RLIM_INFINITY else min(args.open_files, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
    for item in args.env:
        key, _, value = item.partition("=")
        os.environ[key] = value
    if args.log:  # the kernel's own output (banners, warnings, a crash), not the cells': those go over its sockets
        log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
