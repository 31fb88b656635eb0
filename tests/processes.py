"""Finding processes a test left behind (DDP ranks, kernels), for the tests of gpulab.ddp and the lessons' demos."""

from __future__ import annotations

import importlib
import sys
import time
from types import ModuleType

import psutil


def worker_processes() -> list[psutil.Process]:
    """This test process's descendants, except multiprocessing's resource tracker and fork server.

    Each is one helper process per parent that multiprocessing starts on first use (the tracker for a queue or
    an event, the fork server for ``gpulab.ddp.launch``'s ranks) and that lives as long as the parent; neither
    is a rank. The ranks the fork server forked are its children, and so still found here.
    """
    found = []
    me = psutil.Process()
    for child in me.children(recursive=True):
        try:
            command = " ".join(child.cmdline())
            if "resource_tracker" in command:
                continue
            if "multiprocessing.forkserver" in command and child.ppid() == me.pid:  # its forks share the command
                continue
        except psutil.NoSuchProcess:
            continue
        except psutil.ZombieProcess:
            pass  # a dead but unreaped child still counts as left behind
        found.append(child)
    return found


def wait_for_no_worker_processes(grace_s: float = 5.0) -> list[psutil.Process]:
    """Wait up to ``grace_s`` seconds for this test process's descendants to end; return those still running."""
    deadline = time.monotonic() + grace_s
    while (left := worker_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def import_lesson_module(monkeypatch, folder, name: str) -> ModuleType:
    """Import a lesson's DDP helper module by name, from its folder, as the spawned ranks will import it.

    Any cached copy is dropped first; call ``forget_module(name)`` when done.
    """
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def forget_module(name: str) -> None:
    sys.modules.pop(name, None)
