"""How busy the machine was with other work while something was timed (``tests/test_class_slurm.py``'s first
login, ``benchmarks/bench_slurm_grading.py``'s runs): a time taken on a shared machine is a time of the code only
when the rest of the machine left it the CPUs.

``OtherWork`` reads the machine's busy CPU time (``/proc/stat``: user, nice, system, irq and softirq time of every
core; time the hypervisor took, steal, is not the machine's) when the timing starts and when it stops, and takes
away the CPU time the timed work itself used meanwhile; what is left is other work's, however short-lived its
processes were. The timed work's processes are the descendants of the processes it names (a test itself: its hub,
Chromium, the cluster's daemons), the processes of the accounts it names (the learners' servers and kernels) and
the descendants of the Slurm step daemons it names (a job's processes are theirs, not slurmd's). Their CPU time is
sampled (``psutil``) every ``interval`` seconds in a thread, each process's own time only (a child's time reaped
into its parent's would count it twice), so a process of the timed work that lives less than an interval, or the
last interval of one that ends, is counted as other work: a slight overestimate of it (a sample costs about 20 ms
of CPU here).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


def busy_and_elapsed() -> tuple[float, float]:
    """The machine's busy CPU seconds since boot over all cores, and all its CPU seconds (``/proc/stat``)."""
    with open("/proc/stat") as handle:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in handle.readline().split()[1:9])
    ticks = os.sysconf("SC_CLK_TCK")
    busy = user + nice + system + irq + softirq  # guest time is inside user time already
    return busy / ticks, (busy + idle + iowait + steal) / ticks


@dataclass
class OtherWork:
    """CPU used by other work while the timed work ran: ``start()``, then ``stop()`` returns the figures.

    ``roots``: a callable giving the pids whose descendants (themselves included) are the timed work's, asked at
    each sample (the Slurm step daemons of a cluster come and go); ``users``: accounts whose processes are the timed
    work's."""

    roots: Callable[[], Iterable[int]]
    users: Iterable[str] = ()
    interval: float = 1.0
    _first: dict = field(default_factory=dict)
    _last: dict = field(default_factory=dict)
    _began: float = 0.0
    _machine: tuple[float, float] = (0.0, 0.0)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None

    def own_processes(self) -> dict[tuple[int, float], float]:
        """The timed work's processes now, by (pid, start time), each with its own CPU seconds (user and system)."""
        import psutil

        processes = {}
        for process in psutil.process_iter(["pid", "ppid", "username", "create_time", "cpu_times"]):
            processes[process.info["pid"]] = process.info
        ours = {pid for pid in self.roots() if pid in processes}
        users = set(self.users)
        ours |= {pid for pid, info in processes.items() if info["username"] in users}
        children: dict[int, list[int]] = {}
        for pid, info in processes.items():
            children.setdefault(info["ppid"], []).append(pid)
        stack = list(ours)
        while stack:
            for child in children.get(stack.pop(), []):
                if child not in ours:
                    ours.add(child)
                    stack.append(child)
        return {
            (pid, processes[pid]["create_time"]): processes[pid]["cpu_times"].user + processes[pid]["cpu_times"].system
            for pid in ours
            if processes[pid]["cpu_times"] is not None
        }

    def _sample(self, first: bool = False) -> None:
        for key, seconds in self.own_processes().items():
            self._first.setdefault(key, seconds if first else 0.0)  # one born since the start: all its time
            self._last[key] = seconds

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            self._sample()

    def start(self) -> None:
        self._first, self._last = {}, {}
        self._sample(first=True)
        self._machine = busy_and_elapsed()
        self._began = time.monotonic()
        self._stopping.clear()
        self._sampler = threading.Thread(target=self._run, name="other-work", daemon=True)
        self._sampler.start()

    def stop(self) -> dict:
        """``seconds`` timed; ``other_cpu_s``: the CPU seconds the machine was busy with other work meanwhile;
        ``own_cpu_s``: the timed work's; ``other_cores``, ``machine_busy_cores``: CPU seconds per second."""
        seconds = time.monotonic() - self._began
        self._stopping.set()
        if self._sampler is not None:
            self._sampler.join()
        self._sample()
        busy, elapsed = busy_and_elapsed()
        own = sum(max(0.0, self._last[key] - self._first[key]) for key in self._last)
        cores = os.cpu_count() or 1
        wall = max((elapsed - self._machine[1]) / cores, 1e-9)  # the interval, as /proc/stat counted it
        machine = busy - self._machine[0]
        other = max(0.0, machine - own)
        return {
            "seconds": round(seconds, 2),
            "own_cpu_s": round(own, 2),
            "other_cpu_s": round(other, 2),
            "other_cores": round(other / wall, 2),
            "machine_busy_cores": round(machine / wall, 2),
            "cores": cores,
        }
