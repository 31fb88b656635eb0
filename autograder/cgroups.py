"""Memory and process accounting for grading: one control group (cgroup) per sandboxed kernel and per worker.

Summing the resident pages of a kernel's processes misses what Linux charges elsewhere: shared memory (``memfd``,
``/dev/shm``, the tmpfs ``/tmp``) is not resident in any process's count until touched, and pages of shared
libraries are counted once per process (three CUDA processes map the same gigabyte of libraries three times). A
memory cgroup counts every page once, where Linux charges it (anonymous memory, shmem, memfd and tmpfs included;
file pages are reclaimed before anything is killed), and its hard limit is enforced by the kernel's own OOM killer.
So each grading kernel starts inside a fresh group (``limits.py --cgroup``, before ``exec`` of its sandbox)
holding it and everything it starts (DDP ranks, shells, a fork bomb), with:

* a hard memory limit (swap included where the host has swap accounting); ``GroupWatch`` (``limits.py``) notices
  the group's OOM kill and stops the whole group, reporting the memory limit;
* a limit on tasks (``pids.max``: processes and threads alike);
* an equal share of the CPU with every other kernel, whatever its number of threads (the ``cpu`` controller's
  default weight, where the host lets the grader use it): a kernel spinning a thousand threads slows another
  student's cells, and their time limits, no more than one busy kernel does;
* one ``kill()`` that ends every process in it, and ``remove()``.

The grading workers get groups of their own too (``grade.py``), so that a worker that decodes something huge
despite ``checks/wire.py``'s bounds is stopped alone: one notebook is lost, not the class.

Where groups come from (``Hierarchy.find``):

* **cgroup v2** (most hosts today): the unified hierarchy, in the grader's own group where it may pass ``memory``
  and ``pids`` on (a delegated group: ``systemd-run --user --scope -p Delegate=yes``; the grader moves itself into a
  leaf ``grader`` inside it first, as v2 wants), else its root as root (``/sys/fs/cgroup``). Groups made
  there get ``memory.max``, ``memory.swap.max`` = 0, ``memory.oom.group`` = 1, ``pids.max``; the OOM count is
  ``memory.events``' ``oom_kill``, the peak ``memory.peak``.
* **cgroup v1** (this project's CI machine): the ``memory`` and ``pids`` hierarchies, under the grader's own group
  in each (nested groups need no delegation there). ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``),
  ``pids.max``; the OOM count is ``memory.oom_control``'s ``oom_kill``, the peak ``memory.max_usage_in_bytes``.

Where neither works (no controller, a non-root grader without a delegated group), ``Hierarchy.find`` says why;
grading then falls back to the resident-page watchdog and every report says that shared memory was not counted.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

MOUNTS = Path("/proc/self/mounts")
OWN_GROUPS = Path("/proc/self/cgroup")
UNLIMITED = 1 << 62  # a memory limit that never binds (a group used for accounting only)
DEFAULT_TASKS = 1024  # pids.max of a kernel's group: processes and threads (torch starts a few dozen per process)


class Unavailable(RuntimeError):
    """No cgroup can be made here; the message says why."""


@dataclass
class Group:
    """One cgroup (v2: one folder; v1: one folder per controller, ``memory`` and ``pids``)."""

    version: int
    folders: dict[str, Path]  # controller ("memory", "pids", "cpu" where it can; v2: "unified") -> folder
    name: str = ""
    _removed: bool = field(default=False, repr=False)

    # ------------------------------------------------------------------------------------------ files
    def _write(self, controller: str, name: str, value: str) -> None:
        (self.folders[controller] / name).write_text(value)

    def _read(self, controller: str, name: str) -> str:
        try:
            return (self.folders[controller] / name).read_text()
        except OSError:
            return ""

    @property
    def _memory(self) -> str:
        return "unified" if self.version == 2 else "memory"

    @property
    def _pids(self) -> str:
        return "unified" if self.version == 2 else "pids"

    # ------------------------------------------------------------------------------------------ limits
    def limit(self, memory: int, tasks: int = DEFAULT_TASKS) -> None:
        """A hard memory limit (bytes; swap none) and a limit on tasks."""
        if self.version == 2:
            self._write("unified", "memory.max", str(memory))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (self.folders["unified"] / name).exists():
                    self._write("unified", name, value)
        else:
            self._write("memory", "memory.limit_in_bytes", str(memory))
            if (self.folders["memory"] / "memory.memsw.limit_in_bytes").exists():
                self._write("memory", "memory.memsw.limit_in_bytes", str(memory))
        if self._pids in self.folders and (self.folders[self._pids] / "pids.max").exists():
            self._write(self._pids, "pids.max", str(tasks))

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to enter this group (``limits.py --cgroup``)."""
        return [str(folder / "cgroup.procs") for folder in self.folders.values()]

    def add(self, pid: int) -> None:
        """Move process ``pid`` into this group."""
        for path in self.procs_files():
            Path(path).write_text(str(pid))

    # ------------------------------------------------------------------------------------------ readings
    def pids(self) -> list[int]:
        return [int(p) for p in self._read(self._memory, "cgroup.procs").split() if p.isdigit()]

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer ended in this group (its memory limit was reached)."""
        text = self._read(self._memory, "memory.events" if self.version == 2 else "memory.oom_control")
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def memory(self) -> int:
        """Bytes charged to the group now."""
        text = self._read(self._memory, "memory.current" if self.version == 2 else "memory.usage_in_bytes")
        return int(text) if text.strip().isdigit() else 0

    def peak(self) -> int:
        """The most bytes charged to the group at once (0 where the host does not keep it)."""
        text = self._read(self._memory, "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")
        return int(text) if text.strip().isdigit() else 0

    # ------------------------------------------------------------------------------------------ the end
    def kill(self, rounds: int = 50) -> None:
        """SIGKILL every process in the group, until none is left (forks race) or ``rounds`` tries."""
        if self.version == 2 and (self.folders["unified"] / "cgroup.kill").exists():
            try:
                self._write("unified", "cgroup.kill", "1")
            except OSError:
                pass
        for _ in range(rounds):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        """Kill what is left in the group and remove it (a group's charges go to its parent)."""
        if self._removed:
            return
        self.kill()
        for folder in self.folders.values():
            for _ in range(100):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: a killed process not yet reaped
                    time.sleep(0.02)
        self._removed = True


@dataclass
class Hierarchy:
    """Where this process makes groups: a parent folder per controller."""

    version: int
    parents: dict[str, Path]

    @classmethod
    def find(cls, mounts: Path = MOUNTS, own: Path = OWN_GROUPS) -> Hierarchy:
        """The hierarchy groups are made in (module docstring), or ``Unavailable`` saying why none."""
        v1, v2 = {}, None
        for line in Path(mounts).read_text().splitlines():
            fields = line.split()
            if len(fields) < 4:
                continue
            where, kind, options = fields[1], fields[2], fields[3].split(",")
            if kind == "cgroup2":
                v2 = Path(where)
            elif kind == "cgroup":
                for controller in ("memory", "pids", "cpu"):
                    if controller in options:
                        v1[controller] = Path(where)
        paths = {}
        for line in Path(own).read_text().splitlines():
            number, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else ["unified"]:
                paths[controller] = path.lstrip("/")
        reasons = []
        if "memory" in v1:
            parents = {c: v1[c] / paths.get(c, "") for c in v1}
            if all(os.access(parents[c], os.W_OK) for c in parents if c != "cpu"):
                if not os.access(parents.get("cpu", "/nonexistent"), os.W_OK):
                    parents.pop("cpu", None)  # fairness is a bonus: memory and tasks are what must be limited
                return cls(1, parents)
            reasons.append(f"cgroup v1: {parents['memory']} is not writable by this user")
        if v2 is not None:
            own_group = v2 / paths.get("unified", "")
            if own_group != v2 and os.access(own_group, os.W_OK):
                try:
                    _delegate(own_group)
                    _share_cpu(own_group)
                    return cls(2, {"unified": own_group})
                except Unavailable as error:
                    reasons.append(str(error))
            if {"memory", "pids"} <= _words(v2 / "cgroup.subtree_control") and os.access(v2, os.W_OK):
                _share_cpu(v2)
                return cls(2, {"unified": v2})
            if "memory" in _words(v2 / "cgroup.controllers") and os.access(v2, os.W_OK):
                try:  # the root group may have controllers it does not enable for its children yet
                    (v2 / "cgroup.subtree_control").write_text("+memory +pids")
                    _share_cpu(v2)
                    return cls(2, {"unified": v2})
                except OSError as error:
                    reasons.append(f"cgroup v2: cannot enable memory and pids in {v2}: {error.strerror}")
            if not reasons:
                reasons.append(f"cgroup v2: no group under {v2} delegates memory and pids to this user")
        if not reasons:
            reasons.append("no cgroup hierarchy with a memory controller is mounted")
        raise Unavailable("; ".join(reasons))

    def child(self, name: str, parent: Group | None = None) -> Group:
        """A new group ``name`` in this hierarchy (or inside ``parent``, a group made here)."""
        bases = parent.folders if parent is not None else self.parents
        folders = {}
        try:
            if self.version == 2 and parent is not None:  # a v2 group passes controllers on only when told to
                (bases["unified"] / "cgroup.subtree_control").write_text("+memory +pids")
                _share_cpu(bases["unified"])
            for controller, base in bases.items():
                folder = base / name
                folder.mkdir()
                folders[controller] = folder
        except OSError as error:
            for folder in folders.values():
                folder.rmdir()
            raise Unavailable(f"cannot make the cgroup {name}: {error.strerror or error}") from error
        return Group(self.version, folders, name)

    def describe(self) -> dict:
        return {"version": self.version, "parents": {k: str(v) for k, v in self.parents.items()}}

    @classmethod
    def from_description(cls, description: dict) -> Hierarchy:
        return cls(int(description["version"]), {k: Path(v) for k, v in description["parents"].items()})


def group_from_description(description: dict) -> Group:
    """A group made in another process (``Group``'s ``version``, ``folders`` and ``name``, as plain data)."""
    folders = {k: Path(v) for k, v in description["folders"].items()}
    return Group(int(description["version"]), folders, description.get("name", ""))


def describe(group: Group) -> dict:
    return {"version": group.version, "folders": {k: str(v) for k, v in group.folders.items()}, "name": group.name}


def _delegate(group: Path) -> None:
    """Let a delegated cgroup v2 group (``systemd-run --user --scope -p Delegate=yes``, owned by this user) pass
    ``memory`` and ``pids`` to groups made inside it. A v2 group whose children use controllers may hold no process
    itself, so this process moves into a leaf of its own (``grader``) first; that works only when it is alone in the
    group (start ``grade.py`` itself under ``systemd-run``, not a shell or ``make``)."""
    if {"memory", "pids"} <= _words(group / "cgroup.subtree_control"):
        return
    if not {"memory", "pids"} <= _words(group / "cgroup.controllers"):
        raise Unavailable(f"cgroup v2: {group} has no memory and pids controllers to delegate")
    others = [p for p in _words(group / "cgroup.procs") if p != str(os.getpid())]
    if others:
        raise Unavailable(
            f"cgroup v2: {group} holds other processes ({len(others)}): start grade.py alone in a delegated group "
            "(systemd-run --user --scope -p Delegate=yes .venv/bin/python autograder/grade.py ...)"
        )
    try:
        leaf = group / "grader"
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        (group / "cgroup.subtree_control").write_text("+memory +pids")
    except OSError as error:
        why = error.strerror or error
        raise Unavailable(f"cgroup v2: cannot delegate memory and pids in {group}: {why}") from error


def _share_cpu(group: Path) -> None:
    """Pass v2's ``cpu`` controller on to the groups made in ``group`` where it can (each group then gets an equal
    ``cpu.weight``, whatever its number of threads); without it, memory and tasks are still limited."""
    if "cpu" in _words(group / "cgroup.controllers") and "cpu" not in _words(group / "cgroup.subtree_control"):
        try:
            (group / "cgroup.subtree_control").write_text("+cpu")
        except OSError:
            pass


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def enter(procs_files: list[str]) -> None:
    """Move this process into a group (its ``cgroup.procs`` files): ``limits.py --cgroup``, before ``exec``."""
    for path in procs_files:
        with open(path, "w") as handle:
            handle.write(str(os.getpid()))
