"""Attacks on the class's collect (``scripts/class_collect.py``), the learners' server limits
(``jupyter/hub/server_limits.py``) and what a learner can read of the repository (``scripts/class_hub.py``), each
made the way a learner could make it.

A test of an attack that still works fails until the defect is fixed; a test of an attack that is stopped guards
the defence. The learners are uids without accounts (root may own files by any uid), as in
``tests/test_class_collect.py``, so nothing is left on the system.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "jupyter" / "hub"))

import class_collect  # noqa: E402
from class_collect import collect  # noqa: E402
from server_limits import Limits, preexec, server_group  # noqa: E402

from tests.class_entries import ASSIGNMENTS, LEARNERS_PYTHON, LESSON, NOTEBOOK, NOTEBOOK_NAME, ROSTER  # noqa: E402
from tests.class_entries import entry as _entry  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="entries owned by several uids need root")

TICK = timedelta(seconds=0.5)  # change times come from the kernel's coarse clock, a few ms behind datetime.now()


def _own_by(path: Path, learner: str) -> None:
    os.lchown(path, ROSTER[learner], ROSTER[learner])


def _as_mallory() -> None:
    """A ``preexec_fn``: become the learner mallory (no account needed: root may take any uid)."""
    os.setgroups([])
    os.setgid(ROSTER["mallory"])
    os.setuid(ROSTER["mallory"])


def _tmpfs(path: str) -> bool:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == path:
            return fields[2] == "tmpfs"
    return False


# ------------------------------------------------------------------------------------------------ collect: time
def test_a_mapped_write_after_the_due_time_is_not_dated_before_it():
    """Back-dating through a shared writable mapping (``mmap``) of the learner's own notebook.

    The learner maps their entry's notebook before the due time and writes one byte through the mapping: the
    kernel sets the change time at that first write fault. Later writes through the same mapping change the
    notebook's bytes but fault no more where the page stays writable, so they set no change time. On a disk file
    system that lasts until the page is written back (about 30 s, or a ``sync``); on tmpfs pages are never written
    back, so the learner can rewrite the notebook at any time after the due date, and collect still dates it
    before the due date. Here the exchange is on tmpfs (``/dev/shm``); a ``sync`` shows it is not a write-back
    window. Fix: refuse an inbound on a file system whose mapped writes set no change time (tmpfs), or snapshot
    (copy) the inbound at the due time: a mapping opened before survives any change of owner or mode."""
    if not _tmpfs("/dev/shm"):
        pytest.skip("no tmpfs at /dev/shm")
    root = Path(tempfile.mkdtemp(prefix="gpulab-attack-", dir="/dev/shm"))
    try:
        inbound = root / "inbound"
        inbound.mkdir()
        honest = NOTEBOOK.ljust(4096)
        late = json.dumps({"cells": [], "metadata": {"late": True}, "nbformat": 4, "nbformat_minor": 5}).ljust(4096)
        entry = _entry(inbound, f"mallory+{LESSON}+t+mapped", "mallory", {NOTEBOOK_NAME: honest})
        with open(entry / NOTEBOOK_NAME, "r+b") as handle, mmap.mmap(handle.fileno(), 0) as mapped:
            mapped[0:1] = mapped[0:1]  # before the due time: the page becomes writable in the mapping
            os.sync()
            time.sleep(1.1)
            due = datetime.now(UTC)
            mapped[: len(late)] = late.encode()  # after the due time
            try:
                collected = collect(inbound, ROSTER, ASSIGNMENTS)
            except SystemExit:
                return  # an inbound where such a write leaves no trace is refused outright
        taken = collected.chosen.get("mallory")
        assert taken is not None
        if taken.notebooks.get(NOTEBOOK_NAME) == late.encode():
            assert taken.made_at >= due - TICK, f"rewritten after {due}, dated {taken.made_at}"
    finally:
        shutil.rmtree(root)


def test_a_folder_made_before_the_due_time_and_moved_into_inbound_is_dated_at_the_move(inbound, tmp_path):
    """Back-dating by ``rename``: an entry folder (and notebook) prepared before the due time, outside the
    exchange, then moved into ``inbound/`` after it. The kernel sets the moved folder's change time at the rename
    (ext4, tmpfs, xfs, btrfs), so collect dates it at the move. Held: this guards it."""
    early = tmp_path / f"mallory+{LESSON}+t+early"
    early.mkdir()
    (early / NOTEBOOK_NAME).write_text(NOTEBOOK)
    _own_by(early / NOTEBOOK_NAME, "mallory")
    _own_by(early, "mallory")
    time.sleep(1.1)
    moved_at = datetime.now(UTC)
    early.rename(inbound / early.name)
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    assert collected.chosen["mallory"].made_at >= moved_at - TICK


# ------------------------------------------------------------------------------------------------ collect: cost
def test_many_entries_of_one_learner_do_not_make_collect_hold_them_all(inbound, monkeypatch):
    """Exhausting the collect's memory with entries that cost the learner no disk.

    A learner makes many entries, each holding five notebooks (none named like the lesson's, so that collect
    reads up to ``MAX_NOTEBOOKS + 1`` "other" notebooks) that are hard links to one sparse file of
    ``MAX_NOTEBOOK_BYTES``: no disk block is used, and the file-size limit is not reached. Collect reads every
    entry fully into memory and keeps every candidate until it picks the latest, so it holds entries x 5 x 50 MiB
    (100 entries: 25 GiB) at once, with no limit of its own: the instructor's collect is killed or the box runs
    out of memory, and nobody is graded. It reads as many bytes too (time). Here the limit is 1 MiB and 60 entries
    (300 MiB). Fix: pick each learner's latest entry by its change times first, read only that one (or keep only
    the best so far), and bound the entries looked at per learner."""
    limit = 1 << 20
    monkeypatch.setattr(class_collect, "MAX_NOTEBOOK_BYTES", limit)
    sparse = inbound.parent / "sparse"
    with open(sparse, "wb") as handle:
        handle.truncate(limit)
    _own_by(sparse, "mallory")
    for number in range(60):
        folder = inbound / f"mallory+{LESSON}+t+{number}"
        folder.mkdir()
        for copy in range(5):
            os.link(sparse, folder / f"copy{copy}.ipynb")
        _own_by(folder, "mallory")
    _entry(inbound, f"alice+{LESSON}+t+a", "alice")
    tracemalloc.start()
    try:
        collected = collect(inbound, ROSTER, ASSIGNMENTS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sorted(collected.chosen) == ["alice", "mallory"]
    one_entry = 5 * limit
    assert peak < 4 * one_entry, f"collect held {peak >> 20} MiB for entries of at most {one_entry >> 20} MiB"


def test_a_lease_on_a_notebook_does_not_stall_collect(inbound):
    """Stalling collect with a file lease: the learner takes a write lease (``F_SETLEASE``) on their own notebook,
    so that any open of it waits for the lease to be broken (``lease-break-time``, 45 s by default, per file and
    entry). Collect opens with ``O_NONBLOCK``: the open fails at once and the notebook is skipped. Held: this
    guards it."""
    _entry(inbound, f"alice+{LESSON}+t+a", "alice")
    entry = _entry(inbound, f"mallory+{LESSON}+t+leased", "mallory")
    previous = signal.signal(signal.SIGIO, signal.SIG_IGN)  # the lease holder is told of the break by SIGIO
    descriptor = os.open(entry / NOTEBOOK_NAME, os.O_RDONLY)
    try:
        fcntl.fcntl(descriptor, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        began = time.monotonic()
        collected = collect(inbound, ROSTER, ASSIGNMENTS)
        assert time.monotonic() - began < 5
    finally:
        fcntl.fcntl(descriptor, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(descriptor)
        signal.signal(signal.SIGIO, previous)
    assert sorted(collected.chosen) == ["alice"]
    assert any(f.learner == "mallory" and f.verdict == "skipped" for f in collected.findings)


def test_names_with_line_breaks_escapes_and_bytes_reach_no_report_raw(inbound):
    """Report injection: entry and notebook names with a line break, a terminal escape and bytes that are not
    UTF-8. Every finding is printable ASCII (``ascii()``), so nothing reaches ``collect.csv`` or the terminal raw,
    and the findings pass the JSON pipe from the instructor's child. Held: this guards it."""
    odd = os.fsdecode(b"mallory+" + LESSON.encode() + b"+t\n\x1b[2J+\xff")
    _entry(inbound, odd, "mallory", {os.fsdecode(b"a\n\x1b[31m\xfe.ipynb"): NOTEBOOK, "b.ipynb": NOTEBOOK})
    _entry(inbound, os.fsdecode(b"\xffalice+" + LESSON.encode() + b"+t+x"), "mallory")
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    assert collected.findings
    for finding in collected.findings:
        for text in (finding.learner, finding.entry, finding.reason):
            assert text.isascii() and text.isprintable(), finding
    json.dumps([finding.__dict__ for finding in collected.findings])


# ------------------------------------------------------------------------------------------------ server limits
WRITER = """
import sys
chunk = b"x" * (1 << 20)
with open(sys.argv[1], "wb") as handle:
    for _ in range(int(sys.argv[2])):
        handle.write(chunk)
"""


def test_shared_memory_left_by_a_server_stays_within_its_memory_limit():
    """Escaping the server's memory limit through ``/dev/shm`` (tmpfs; the same for a tmpfs ``/tmp`` and SysV
    shared memory). What a server writes there is memory charged to its control group while it runs, but the file
    outlives the server: when the group is removed (the server stopped, or restarted from the hub's page), its
    charge moves to the parent group, which has no limit. Each restart lets the learner pin one more memory limit
    of RAM (8 GiB by default), until ``/dev/shm`` (half the RAM) is full and the box's OOM killer picks its
    victims among everyone. Here: two lives of a server limited to 96 MiB each leave 64 MiB behind. Fix: give each
    server a private ``/dev/shm`` (and ``/tmp``) that ends with it (a mount namespace made in ``preexec`` before the
    drop), or remove the learner's files there when the server's group is removed, or tmpfs quotas per user."""
    if not _tmpfs("/dev/shm"):
        pytest.skip("no tmpfs at /dev/shm")
    limits = Limits(memory=96 << 20, cpus=1, tasks=32, file_size=128 << 20)
    name = f"gpulab-test-{secrets.token_hex(3)}"
    prefix = f"gpulab-attack-{secrets.token_hex(4)}-"
    try:
        for life in range(2):
            group = server_group(name, limits, allowed_gpus=[0], gpu_count=1, minors=[0])
            try:
                subprocess.run(
                    [LEARNERS_PYTHON, "-c", WRITER, f"/dev/shm/{prefix}{life}", "64"],
                    preexec_fn=preexec(group, limits, _as_mallory),
                    env={"PATH": "/usr/bin:/bin"},
                    capture_output=True,
                    timeout=60,
                )
            finally:
                group.remove()
        kept = sum(
            path.stat().st_size
            for path in Path("/dev/shm").glob(f"{prefix}*")
            if path.stat().st_uid == ROSTER["mallory"]
        )
        assert kept <= limits.memory, f"{kept >> 20} MiB of shared memory outlived a server limited to 96 MiB"
    finally:
        for path in Path("/dev/shm").glob(f"{prefix}*"):
            path.unlink()


ESCAPE = """
import json, os, resource, sys
tried = {}
for path, text in json.loads(sys.argv[1]).items():
    try:
        with open(path, "w") as handle:
            handle.write(text)
        tried[path] = "written"
    except OSError as error:
        tried[path] = error.strerror
try:
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    tried["RLIMIT_FSIZE"] = "raised"
except (OSError, ValueError) as error:
    tried["RLIMIT_FSIZE"] = str(error)
print(json.dumps(tried))
"""


def test_a_server_can_neither_leave_its_group_nor_lift_its_limits():
    """Leaving the server's control group or lifting its limits from inside: the learner's process writes its pid
    to the parent groups' ``cgroup.procs`` (and the root's), raises its own group's memory and task limits, allows
    every device in its ``devices`` group, and raises ``RLIMIT_FSIZE``'s hard limit. The groups are root's (unlike
    the grading's, which is handed to the instructor), so every write is refused. Held: this guards it."""
    limits = Limits(memory=200 << 20, cpus=1, tasks=32, file_size=1 << 20)
    name = f"gpulab-test-{secrets.token_hex(3)}"
    group = server_group(name, limits, allowed_gpus=[0], gpu_count=2, minors=[0, 1])
    try:
        assert group.group is not None
        writes = {}
        folders = [*group.group.folders.values(), *([group.devices] if group.devices is not None else [])]
        for folder in folders:
            for above in folder.parents:  # every group above the server's, up to each hierarchy's root
                if (above / "cgroup.procs").is_file():
                    writes[str(above / "cgroup.procs")] = "0"
        memory = group.group.folders["unified" if group.group.version == 2 else "memory"]
        writes[str(memory / ("memory.max" if group.group.version == 2 else "memory.limit_in_bytes"))] = str(1 << 40)
        tasks = group.group.folders["unified" if group.group.version == 2 else "pids"]
        writes[str(tasks / "pids.max")] = "max"
        if group.devices is not None:
            writes[str(group.devices / "devices.allow")] = "a *:* rwm"
        done = subprocess.run(
            [LEARNERS_PYTHON, "-c", ESCAPE, json.dumps(writes)],
            preexec_fn=preexec(group, limits, _as_mallory),
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        tried = json.loads(done.stdout)
        assert "written" not in tried.values() and tried["RLIMIT_FSIZE"] != "raised", tried
        assert int((memory / ("memory.max" if group.group.version == 2 else "memory.limit_in_bytes")).read_text()) == (
            limits.memory
        )
    finally:
        group.remove()


# ------------------------------------------------------------------------------------------------ reading
def test_setup_refuses_a_repository_whose_tests_hold_the_answers():
    """Reading the answers from the repository's ``tests/``. ``refuse_an_open_repository`` (``setup``, ``start``)
    only asks whether a learner can read ``source/``, ``autograder/`` and ``.git``; ``tests/`` holds, for every
    lesson, submissions that earn full marks (``tests/test_lesson_01.py``: ``CORRECT_BUT_DIFFERENT``, every graded
    cell's code and the quiz's answers). The default course environment is the repository's own ``.venv``, which
    every learner must reach, so the clone is open to them and ``tests/`` with it (git checks it out 755/644).
    Fixed: a learner may read nothing of the clone."""
    from class_hub import refuse_an_open_repository

    clone = Path(tempfile.mkdtemp(prefix="gpulab-clone-", dir="/tmp"))
    try:
        os.chmod(clone, 0o755)
        for name in ("source", "autograder", ".git"):
            (clone / name).mkdir(mode=0o700)
        (clone / "tests").mkdir(mode=0o755)
        shutil.copyfile(REPO / "tests" / "test_lesson_01.py", clone / "tests" / "test_lesson_01.py")
        os.chmod(clone / "tests" / "test_lesson_01.py", 0o644)
        assert "quiz_answers" in (clone / "tests" / "test_lesson_01.py").read_text()
        with pytest.raises(SystemExit, match="tests"):
            refuse_an_open_repository(["nobody"], clone)  # any account stands for a learner here
    finally:
        shutil.rmtree(clone)
