"""The gate of grading: what comes out of a sandbox is hostile data (issue: grading round 2).

Unit tests, seconds each; the same classes graded end to end are in ``tests/test_redteam.py`` (``GATE_ATTACKS``):

* files: the kernel works in a throw-away copy (``sandbox.working_copy``), the feedback folder keeps the pages only;
* markup: the feedback template passes markdown through nbconvert's sanitizer (``feedback.sanitize_markup``);
* answers: sizes are checked before anything is inflated or materialised (``checks/wire.py``, ``checks/files.py``);
* memory: kernels and workers in memory cgroups (``cgroups.py``; v1 for real where this machine has it, v2 on a
  simulated hierarchy), GPUs found through NVML (``limits.gpu_count``), the memory cap per device kind;
* grades.csv: quoted, formula-safe, ids outside a safe set refused (``export.py``, ``grade.discover``).
"""

from __future__ import annotations

import base64
import collections
import csv
import html.parser
import io
import json
import os
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest
import torch

from tests.nbgrader_tools import REPO

sys.path.insert(0, str(REPO))
from autograder import cgroups, export, feedback, grade, limits, sandbox  # noqa: E402
from autograder.checks import CheckFailed, files, wire  # noqa: E402


# --------------------------------------------------------------------------------------------- files
def test_the_kernels_working_copy_holds_only_regular_files_and_folders(tmp_path):
    release = tmp_path / "release"
    (release / "sub").mkdir(parents=True)
    (release / "lesson.ipynb").write_text("{}")
    (release / "ddp_module.py").write_text("x = 1")
    (release / "sub" / "data.txt").write_text("data")
    (release / "shadow").symlink_to("/etc/shadow")
    (release / "linked").symlink_to(release / "sub")
    os.mkfifo(release / "pipe")
    (release / ".scratch" / "other-kernel").mkdir(parents=True)  # a course whose scratch folder is in its root
    (release / ".scratch" / "other-kernel" / "answer.txt").write_text("another student's")
    (release / ".scratch" / "this-kernel").mkdir()
    copy = sandbox.working_copy(release, release / ".scratch" / "this-kernel" / "work")
    found = {str(p.relative_to(copy)): p.is_symlink() or not (p.is_file() or p.is_dir()) for p in copy.rglob("*")}
    assert found == {"lesson.ipynb": False, "ddp_module.py": False, "sub": False, "sub/data.txt": False}
    assert (copy / "ddp_module.py").read_text() == "x = 1"


def test_the_feedback_folder_keeps_only_the_pages(tmp_path):
    (tmp_path / "lesson.html").write_text("page")
    (tmp_path / "ddp_module.py").write_text("x")
    (tmp_path / "index.html").symlink_to("/etc/passwd")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "inner").symlink_to("/")
    grade.keep_only(tmp_path, {"lesson.html", "index.html"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lesson.html"]
    assert Path("/etc/passwd").exists()


# --------------------------------------------------------------------------------------------- markup
class ActiveMarkup(html.parser.HTMLParser):
    """What in a page can act in a browser: script-like elements, event handlers, active URLs."""

    ELEMENTS = {"script", "iframe", "frame", "object", "embed", "form", "meta", "base", "link", "style", "svg", "math"}
    URL_ATTRIBUTES = {"href", "src", "action", "formaction", "data", "srcdoc", "xlink:href", "background"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: collections.Counter = collections.Counter()

    def handle_starttag(self, tag, attrs):
        if tag in self.ELEMENTS:
            self.found[f"<{tag}>"] += 1
        for name, value in attrs:
            if name.startswith("on"):
                self.found[f"{tag} {name}"] += 1
            if name in self.URL_ATTRIBUTES and (value or "").strip().lower().startswith(("javascript:", "data:")):
                self.found[f"{tag} {name}={value.split(':')[0]}:"] += 1
            if name in self.URL_ATTRIBUTES and (value or "").strip().lower().startswith(("http:", "https:", "//")):
                self.found[f"{tag} {name}=external"] += 1


def active_markup(text: str) -> collections.Counter:
    """What in an HTML text can act in a browser, counted (``ActiveMarkup``)."""
    parser = ActiveMarkup()
    parser.feed(text)
    return parser.found


def test_feedback_markup_keeps_the_lessons_prose_and_drops_what_can_act():
    from nbconvert.filters import markdown2html_mistune

    honest = "# Title\n\nSome *text*, `code` and a [link](https://pytorch.org).\n\n| a | b |\n|---|---|\n| 1 | 2 |"
    kept = feedback.sanitize_markup(markdown2html_mistune(honest))
    for piece in ("<h1", "<em>text</em>", "<code>code</code>", 'href="https://pytorch.org"', "<table>", "<td>1</td>"):
        assert piece in kept, piece
    hostile = "\n\n".join(
        [
            "<script>alert(1)</script>",
            "<img src=x onerror=alert(2)> <iframe srcdoc='x'></iframe>",
            "[a](javascript:alert(3)) <a href='data:text/html,x'>b</a> <svg onload=alert(4)></svg>",
            "<form action='https://example.org'></form> <style>*{}</style> ![p](https://example.org/p.png)",
        ]
    )
    assert active_markup(markdown2html_mistune(hostile))  # what the page would carry unsanitised
    assert active_markup(feedback.sanitize_markup(markdown2html_mistune(hostile))) == collections.Counter()


# --------------------------------------------------------------------------------------------- answers
def _saved(tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def _deflated(payload: bytes, inflate_to: int | None = None) -> bytes:
    plain, out = zipfile.ZipFile(io.BytesIO(payload)), io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for record in plain.infolist():
            data = plain.read(record)
            if inflate_to and record.filename.endswith("/data/0"):
                data = bytes(inflate_to)
            archive.writestr(record.filename, data, compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


BOMBS = {
    "expanded": _saved(torch.zeros(1).expand(1 << 31)),
    "stride 0": _saved(torch.zeros(2).as_strided((1 << 12, 1 << 10), (0, 0))),
    "sparse": _saved(torch.sparse_coo_tensor([[0], [0]], [1.0], (1 << 20, 1 << 20), check_invariants=True)),
    "deflated record": _deflated(_saved(torch.zeros(4)), inflate_to=64 << 20),
    "deflated, same size": _deflated(_saved(torch.zeros(4))),
    "not an archive": b"\x80\x02K\x01.",
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_an_answers_tensor_is_refused_before_it_can_inflate(bomb):
    with pytest.raises(wire.WireError):
        wire.decode(["tensor", base64.b64encode(BOMBS[bomb]).decode()], torch)


def test_an_ordinary_tensor_still_decodes():
    value = torch.arange(12.0).reshape(3, 4)[:, 1:]  # a view: its storage is larger than itself
    decoded = wire.decode(wire.encode(value, torch), torch)
    assert decoded.tolist() == value.tolist()


@pytest.mark.parametrize("bomb", ["expanded", "deflated record"])
def test_a_checkpoint_the_kernel_wrote_is_refused_before_it_can_inflate(bomb):
    if bomb == "expanded":
        data = _saved({"model": {"weight": torch.zeros(1).expand(1 << 30)}, "epoch": 1})
    else:
        data = _deflated(_saved({"model": {"weight": torch.zeros(4)}, "epoch": 1}), inflate_to=64 << 20)
    with pytest.raises(CheckFailed, match="refused"):
        files.load_weights(data)
    assert files.load_weights(_saved({"model": {"weight": torch.ones(2)}, "epoch": 3}))["epoch"] == 3


def test_an_answer_nested_past_the_parsers_depth_is_a_malformed_answer():
    from autograder.checks import Session

    with pytest.raises(CheckFailed, match="malformed"):
        Session._parse("[" * 100_000 + "]" * 100_000)


# --------------------------------------------------------------------------------------------- memory
def _fake_v2(root: Path, own_group: str) -> tuple[Path, Path]:
    """A cgroup v2 hierarchy as files, this process in ``/grader.service``: ``own_group`` says whether that group
    already passes memory and pids on (``delegated``), may be made to (``delegable``: this process alone in it),
    holds another process too (``busy``), or has no controllers (``none``)."""
    mount = root / "cgroup"
    own = mount / "grader.service"
    own.mkdir(parents=True)
    (mount / "cgroup.controllers").write_text("cpu memory pids\n")
    (mount / "cgroup.subtree_control").write_text("memory pids\n")
    (own / "cgroup.subtree_control").write_text("memory pids\n" if own_group == "delegated" else "\n")
    (own / "cgroup.controllers").write_text("\n" if own_group == "none" else "memory pids\n")
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n" + ("1\n" if own_group == "busy" else ""))
    mounts = root / "mounts"
    mounts.write_text(f"cgroup2 {mount} cgroup2 rw,nosuid 0 0\nproc /proc proc rw 0 0\n")
    self_file = root / "cgroup-of-self"
    self_file.write_text("0::/grader.service\n")
    return mounts, self_file


@pytest.mark.parametrize("own_group", ["delegated", "delegable", "busy", "none"])
def test_cgroup_v2_groups_are_made_where_memory_is_delegated_else_at_the_root(tmp_path, own_group):
    mounts, own = _fake_v2(tmp_path, own_group)
    hierarchy = cgroups.Hierarchy.find(mounts, own)
    assert hierarchy.version == 2
    here = own_group in ("delegated", "delegable")
    where = tmp_path / "cgroup" / ("grader.service" if here else "")
    assert hierarchy.parents == {"unified": where}
    if own_group == "delegable":  # this process moved into a leaf, then the group passed its controllers on
        assert (where / "grader" / "cgroup.procs").read_text() == str(os.getpid())
        assert (where / "cgroup.subtree_control").read_text() == "+memory +pids"
    run = hierarchy.child("run")
    kernel = hierarchy.child("kernel", run)
    assert (run.folders["unified"] / "cgroup.subtree_control").read_text() == "+memory +pids"
    for name in ("memory.swap.max", "memory.oom.group"):
        (kernel.folders["unified"] / name).write_text("")
    kernel.limit(1 << 30, tasks=99)
    written = {p.name: p.read_text() for p in kernel.folders["unified"].iterdir()}
    assert written == {"memory.max": str(1 << 30), "memory.swap.max": "0", "memory.oom.group": "1"}
    (kernel.folders["unified"] / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert kernel.oom_kills() == 2
    assert kernel.procs_files() == [str(kernel.folders["unified"] / "cgroup.procs")]


def test_no_cgroup_is_said_plainly(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n")
    own = tmp_path / "own"
    own.write_text("0::/\n")
    with pytest.raises(cgroups.Unavailable, match="no cgroup hierarchy with a memory controller"):
        cgroups.Hierarchy.find(mounts, own)


def _real_hierarchy():
    try:
        return cgroups.Hierarchy.find()
    except cgroups.Unavailable as error:
        pytest.skip(f"no memory cgroup here: {error}")


HOARD = """
import os
fd = os.memfd_create("hoard")
for _ in range(64):
    os.write(fd, bytes(16 << 20))  # 1 GiB of shared memory, resident in no process
print("survived")
"""


def test_a_kernels_group_counts_shared_memory_and_stops_it_at_the_limit():
    hierarchy = _real_hierarchy()
    group = hierarchy.child(f"gpulab-test-{os.getpid()}")
    try:
        group.limit(256 << 20)
        command = [*limits.launcher_command(limits.Limits(address_space=0), cgroup=group.procs_files())]
        process = subprocess.run([*command, sys.executable, "-c", HOARD], capture_output=True, text=True, timeout=120)
        assert "survived" not in process.stdout and process.returncode != 0
        assert group.oom_kills() >= 1
        assert group.peak() <= (256 << 20) * 1.01
    finally:
        group.remove()
    assert not any(folder.exists() for folder in group.folders.values())


def test_a_groups_kill_ends_every_process_in_it():
    hierarchy = _real_hierarchy()
    group = hierarchy.child(f"gpulab-test-kill-{os.getpid()}")
    try:
        sleepers = "import os, time\nfor _ in range(3):\n    os.fork()\ntime.sleep(60)"
        command = limits.launcher_command(limits.Limits(address_space=0), cgroup=group.procs_files())
        process = subprocess.Popen([*command, sys.executable, "-c", sleepers])
        for _ in range(100):
            if len(group.pids()) == 8:
                break
            subprocess.run(["sleep", "0.05"])
        assert len(group.pids()) == 8
        group.kill()
        assert group.pids() == []
        process.wait(timeout=10)
    finally:
        group.remove()


def test_gpus_are_found_through_nvml_without_nvidia_smi(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlDeviceGetCount=lambda: 4,
        nvmlShutdown=lambda: calls.append("shutdown"),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi anywhere
    assert limits.visible_gpus() == ["0", "1", "2", "3"]
    assert calls == ["init", "shutdown"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert limits.visible_gpus() == ["2", "3"]


def test_the_memory_cap_depends_on_the_device_kind(monkeypatch):
    monkeypatch.setattr(os, "sysconf", lambda name: 1 << 20 if name == "SC_PHYS_PAGES" else 1 << 16)  # 64 GiB
    assert limits.default_memory(1) == limits.CPU_KERNEL_MEMORY
    assert limits.default_memory(1, gpus=True) == limits.GPU_KERNEL_MEMORY > limits.CPU_KERNEL_MEMORY
    assert limits.default_memory(16, gpus=True) == int(0.75 * (64 << 30) / 16)


# --------------------------------------------------------------------------------------------- grades.csv
HOSTILE = ["a,b", '=HYPERLINK("https://example.org")', "+1", "-2", "@SUM(A1)", "line\nbreak", 'quote"d', "\tTab"]


def test_grades_csv_reads_back_as_the_gradebook_whatever_the_names(tmp_path):
    from nbgrader.api import Gradebook
    from nbgrader.plugins.export import CsvExportPlugin

    grade.load_builder().new_gradebook(tmp_path / "gradebook.db")
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gradebook:
        gradebook.add_assignment("01_splitting")
        gradebook.add_student("alice", first_name="Alice", last_name="Smith", email="alice@example.org")
        stock, safe = tmp_path / "stock.csv", tmp_path / "safe.csv"
        CsvExportPlugin(to=str(stock)).export(gradebook)
        export.SafeCsvExportPlugin(to=str(safe)).export(gradebook)
        assert safe.read_bytes() == stock.read_bytes()  # nbgrader export's format, byte for byte, for honest names
        for number, name in enumerate(HOSTILE):
            gradebook.add_student(f"s{number}", first_name=name, last_name=name, email=name)
        export.SafeCsvExportPlugin(to=str(safe)).export(gradebook)
        with safe.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        students = {s.id: s for s in gradebook.students}
    assert len(rows) == len(students) and {r["student_id"] for r in rows} == set(students)
    for row in rows:
        student = students[row["student_id"]]
        assert row["max_score"] == "0.0" and row["score"] == "0.0"
        for column in ("first_name", "last_name", "email"):
            value = getattr(student, column) or ""
            assert row[column] == export.neutralised(value)
            assert not row[column].startswith(("=", "+", "-", "@", "\t", "\n"))


@pytest.mark.parametrize("student", [*HOSTILE, "-rf", "ünïcode", "x" * 129, "a b"])
def test_student_ids_outside_the_safe_set_are_refused_when_collecting(tmp_path, student):
    folder = tmp_path / "submissions" / student / "01_splitting"
    folder.mkdir(parents=True)
    (folder / "01_splitting.ipynb").write_text("{}")
    (task,) = grade.discover(tmp_path / "submissions", {"01_splitting": tmp_path}, tmp_path)
    assert task.error and "refused" in task.error
    assert "\n" not in grade.shown(student)


def test_logins_and_email_addresses_are_accepted_ids():
    for student in ("alice", "bob.smith", "s12345", "carol+course@example.org", "d_e-f"):
        assert export.unsafe_id_reason(student) is None


# --------------------------------------------------------------------------------------------- round two
def test_a_checks_files_are_opened_to_the_kernel_by_mode_never_by_owner(tmp_path, monkeypatch):
    """Giving the kernel's user a path by ``chown`` while the kernel runs lets it swap the path for a link to a host
    file first: checks plant files through descriptors and open them to the kernel by their mode only."""
    from autograder.checks import LocalSession

    def refused(*args, **kwargs):
        raise AssertionError("no owner may change while the kernel runs")

    for name in ("chown", "fchown", "lchown"):
        monkeypatch.setattr(os, name, refused)
    session = LocalSession({}, tmp_path)
    planted = session.write_bytes("a/b/c.pt", b"weights")
    assert planted.read_bytes() == b"weights"
    modes = {
        p.name: p.stat().st_mode & 0o777 for p in (session.workdir, planted.parent.parent, planted.parent, planted)
    }
    assert modes == {session.workdir.name: 0o777, "a": 0o777, "b": 0o777, "c.pt": 0o644}
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (session.workdir / "a").rename(tmp_path / "moved")
    (session.workdir / "a").symlink_to(decoy)  # the kernel swaps a folder for a link to a host folder
    with pytest.raises(CheckFailed, match="not a folder"):
        session.write_bytes("a/d.pt", b"payload")
    assert list(decoy.iterdir()) == []
    workdir = session.workdir
    workdir.rename(tmp_path / "moved-too")
    workdir.symlink_to(decoy)  # ... or the check's whole folder
    with pytest.raises(CheckFailed):
        session.write_bytes("e.pt", b"payload")
    assert list(decoy.iterdir()) == []


def test_keys_chosen_to_collide_cannot_make_decoding_quadratic():
    colliding = [["int", str(k * (2**61 - 1))] for k in range(wire.MAX_UNSALTED_KEYS + 1)]
    tree = ["dict", [[key, ["none"]] for key in colliding]]
    with pytest.raises(wire.WireError, match="not strings"):
        wire.decode(tree)
    assert len(wire.decode(["dict", [[["str", str(k)], ["none"]] for k in range(5000)]])) == 5000


def test_arguments_sent_back_unasked_are_a_malformed_answer():
    from autograder.checks import Session

    entry = {"value": ["none"], "args_after": ["list", []]}
    with pytest.raises(CheckFailed, match="did not ask"):
        Session._outcome("f", entry, torch)
    assert Session._outcome("f", entry, torch, args_after=True).args_after == []


def test_a_kernel_that_says_nothing_of_returning_an_argument_when_asked_gives_a_malformed_answer():
    from autograder.checks import Session

    with pytest.raises(CheckFailed, match="whether the value returned is an argument"):
        Session._outcome("f", {"value": ["none"]}, torch, fresh=True)
    for said in ("yes", 1, None):
        with pytest.raises(CheckFailed):
            Session._outcome("f", {"value": ["none"], "returned_an_argument": said}, torch, fresh=True)
    assert Session._outcome(
        "f", {"value": ["none"], "returned_an_argument": True}, torch, fresh=True
    ).returned_an_argument


def _tripped(watchdog, seconds: float = 10) -> str | None:
    """The key of the limit ``watchdog`` stopped its kernel for, waiting up to ``seconds`` for it."""
    import time

    deadline = time.monotonic() + seconds
    while watchdog.tripped is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return None if watchdog.tripped is None else watchdog.tripped.key


def test_the_kernels_folders_on_disk_are_limited(tmp_path):
    import time

    watchdog = limits.MemoryWatchdog(0, 0, interval=0.02, folders=(tmp_path,), disk=1 << 20, max_files=50)
    watchdog.start()
    try:
        (tmp_path / "small.bin").write_bytes(bytes(100_000))
        with (tmp_path / "sparse.bin").open("wb") as sparse:
            sparse.truncate(1 << 30)  # a sparse file holds no disk
        time.sleep(0.5)
        assert watchdog.tripped is None
        (tmp_path / "big.bin").write_bytes(bytes(2 << 20))
        assert _tripped(watchdog) == "disk"
    finally:
        watchdog.stop()
    assert limits.disk_usage([tmp_path])[1] == 3


class _OutOfMemoryGroup:
    """A kernel's memory group whose OOM killer has acted (the accounting a ``cgroups.Group`` gives the watchdog)."""

    def peak(self) -> int:
        return 0

    memory = peak

    def oom_kills(self) -> int:
        return 1

    def kill(self) -> None:
        pass


@pytest.mark.parametrize("written,limit", [(2 << 20, "disk"), (100_000, "memory")])
def test_a_memory_limit_met_by_files_over_the_disk_limit_is_named_the_disk_limit(tmp_path, written, limit):
    """A memory group charges the page cache of written files: a kernel that fills its folders between two
    measurements meets the memory limit first, and is told of the disk limit it overran (not of memory) exactly
    when its folders hold more than the disk limit."""
    (tmp_path / "fill.bin").write_bytes(bytes(written))
    watchdog = limits.MemoryWatchdog(
        1 << 30, 0, interval=0.02, group=_OutOfMemoryGroup(), folders=(tmp_path,), disk=1 << 20, max_files=50
    )
    watchdog.start()
    try:
        assert _tripped(watchdog) == limit
    finally:
        watchdog.stop()
    fresh = limits.MemoryWatchdog(1 << 30, 0, group=_OutOfMemoryGroup(), folders=(tmp_path,), disk=1 << 20)
    assert fresh.over_memory() and fresh.tripped.key == limit  # the kernel died before the watchdog looked


SPIN = """
import resource, time
end = time.time() + 2.0
while time.time() < end:
    pass
print(resource.getrusage(resource.RUSAGE_SELF).ru_utime)
"""


def test_a_kernel_with_many_busy_processes_gets_no_more_cpu_than_one_with_one():
    """Each kernel's group has the CPU controller's equal default share: eight spinning processes in one group and
    one in another get the CPU group for group, so the lone process gets several times what each of the eight gets
    (a ratio within one run: it holds on a loaded machine)."""
    hierarchy = _real_hierarchy()
    if "cpu" not in hierarchy.parents and hierarchy.version == 1:
        pytest.skip("no cpu controller here")
    hog, alone = (hierarchy.child(f"gpulab-test-{name}-{os.getpid()}") for name in ("hog", "alone"))
    try:
        runs = []
        for group, count in ((hog, 8), (alone, 1)):
            command = limits.launcher_command(limits.Limits(address_space=0), cgroup=group.procs_files())
            runs += [
                (group, subprocess.Popen([*command, sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True))
                for _ in range(count)
            ]
        used = {id(hog): [], id(alone): []}
        for group, process in runs:
            used[id(group)].append(float(process.communicate(timeout=60)[0]))
    finally:
        hog.remove()
        alone.remove()
    each_hog = sum(used[id(hog)]) / len(used[id(hog)])
    assert used[id(alone)][0] >= 3 * each_hog, used


# --------------------------------------------------------------------------------------------- round three
def _deep(root: Path, levels: int) -> Path:
    """A folder ``levels`` deep under ``root`` (made relative to each level: its path outgrows PATH_MAX)."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    with open(os.open("leaf.bin", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as leaf:
        leaf.write(bytes(4096))
    os.symlink("/etc", "etc", dir_fd=fd)
    os.close(fd)
    return root


def test_a_folder_thousands_of_levels_deep_is_removed_without_recursion_or_long_paths(tmp_path):
    deep = _deep(tmp_path / "work", 3000)  # 2 characters a level: 6,000 characters, past PATH_MAX
    (deep / "link").symlink_to(tmp_path / "kept")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "file").write_text("not the kernel's")
    sandbox.remove_tree(deep)
    assert not deep.exists() and (tmp_path / "kept" / "file").read_text() == "not the kernel's"


def test_a_folder_too_deep_to_measure_is_over_the_disk_limit(tmp_path):

    deep = _deep(tmp_path / "work", 200)
    with pytest.raises(limits.TooDeep):
        limits.disk_usage([deep])
    watchdog = limits.MemoryWatchdog(0, 0, interval=0.02, folders=(deep,), disk=1 << 30, max_files=10**6)
    watchdog.start()
    try:
        assert _tripped(watchdog) == "disk"
    finally:
        watchdog.stop()
    sandbox.remove_tree(deep)


def test_a_fifo_or_a_hard_link_under_a_planted_files_name_is_refused_without_blocking(tmp_path):
    """A planted file is always a new file: a FIFO the kernel left under its name never holds the grader, and a hard
    link to another file is never written through (``O_EXCL``)."""
    from autograder.checks import LocalSession

    outside = tmp_path / "outside.txt"
    outside.write_text("the grader's own file")
    session = LocalSession({}, tmp_path / "submission")
    (tmp_path / "submission").mkdir()
    os.mkfifo(session.workdir / "clean.pt")  # left by the kernel where a check plants a checkpoint
    os.link(outside, session.workdir / "other.pt")
    reader = os.open(session.workdir / "clean.pt", os.O_RDONLY | os.O_NONBLOCK)  # the kernel holds the other end
    try:
        for name in ("clean.pt", "other.pt"):
            with pytest.raises(CheckFailed, match="File exists"):
                session.write_bytes(name, b"weights")
    finally:
        os.close(reader)
    assert outside.read_text() == "the grader's own file"
    session.close()
    assert not any((tmp_path / "submission").iterdir())


def test_an_ordered_dict_node_is_held_to_a_dicts_limits():
    """A hostile ``ordered_dict`` answer gets no more than a ``dict`` one: an unhashable key, more than
    ``MAX_UNSALTED_KEYS`` keys whose hashes can be made to collide, or nesting past ``MAX_DEPTH`` is malformed."""
    none = ["none"]
    for tag in ("dict", "ordered_dict"):
        for key in (["list", []], ["ordered_dict", []], ["tuple", [["list", []]]]):
            with pytest.raises(wire.WireError, match="a dict key of type"):
                wire.decode([tag, [[key, none]]], torch)
        colliding = [[["int", str(i * (2**61 - 1))], none] for i in range(wire.MAX_UNSALTED_KEYS + 1)]
        with pytest.raises(wire.WireError, match="not strings"):
            wire.decode([tag, colliding], torch)
        deep = none
        for _ in range(wire.MAX_DEPTH + 1):
            deep = [tag, [[["str", "k"], deep]]]
        with pytest.raises(wire.WireError, match="too deep"):
            wire.decode(deep, torch)
    assert type(wire.decode(["ordered_dict", colliding[:-1]], torch)) is collections.OrderedDict


# --------------------------------------------------------------------------------------------- round 3: bounds
QUIZ_NUMBER_BOMBS = ["1e999999999", "1/3e99999", "9" * 10**6, "1e5000", "-2.25E-5000", "1_0e4_000", "1e 401"]


def test_a_quiz_number_answer_too_large_to_read_fails_its_question_and_nothing_else():
    """``fractions.Fraction("1e999999999")`` computes a billion-digit integer and ``"1e5000"`` a fraction too long
    to write: such a text is unreadable (checked on the text first), in a fresh process that must answer within a
    minute; numbers of every honest size still read, right or wrong."""
    code = (
        "import json, sys\n"
        "from autograder import quizzes\n"
        "answers = json.loads(sys.stdin.read())\n"
        "print(json.dumps([quizzes.judge('03_gpu0_imbalance', 'q2', {'q2': a}).status for a in answers]))\n"
    )
    honest = ["2.25", "9/4", "225e-2", "0.0225E+2", "2_25e-2", 2.25, "1e400", "1e-400", "2.5", 2]
    answers = honest + QUIZ_NUMBER_BOMBS
    process = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(answers), capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert process.returncode == 0, process.stderr[-2000:]
    statuses = json.loads(process.stdout)
    assert statuses[: len(honest)] == ["right"] * 6 + ["wrong"] * 4
    assert statuses[len(honest) :] == ["unreadable"] * len(QUIZ_NUMBER_BOMBS)


def test_a_float_node_is_bounded_on_its_text_before_it_is_converted():
    assert wire.decode(["float", float.hex(-1.7976931348623157e308)]) == -1.7976931348623157e308
    for payload in ("0x1." + "0" * 1000 + "p0", " " * 100 + "0x1p0"):
        with pytest.raises(wire.WireError):
            wire.decode(["float", payload])


def test_a_failure_quotes_a_decoded_answer_without_writing_all_of_it():
    """A failed rule quotes what came back, cut at 120 characters: a 200,000-node answer is not written whole first
    (``rules._show`` writes only as far as it quotes)."""
    from autograder.checks import rules

    written = []

    class Counted:
        def __repr__(self):
            written.append(1)
            return "x"

    shown = rules._show([Counted() for _ in range(200_000)])
    assert len(shown) == 120 and shown.endswith("...")
    assert len(written) < 100
    assert rules._show({"a": [1, (2,)], "b": "s" * 10}) == repr({"a": [1, (2,)], "b": "s" * 10})


def _metered_client():
    """The grader's preprocessor as nbclient meets a kernel's messages, on a notebook of two cells (no kernel)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from autograder.execute import SandboxedExecute

    client = SandboxedExecute()
    client.nb = new_notebook(cells=[new_code_cell("shown()"), new_code_cell("update()")])
    client.reset_execution_trackers()
    client._output_sizes, client._truncated, client.clear_before_next_output = {}, set(), False

    def send(kind: str, content: dict, cell: int) -> None:
        header = {"msg_type": kind, "msg_id": f"m{id(content)}"}
        message = {"msg_type": kind, "header": header, "parent_header": {}, "metadata": {}, "content": content}
        client.process_message(message, client.nb.cells[cell], cell)

    return client, send, lambda: len(nbformat.writes(client.nb))


def test_a_display_update_is_charged_for_every_output_it_reaches():
    """60 outputs given one ``display_id``, then one 1.5 MB ``update_display_data``: nbclient copies it into all 60
    (an 86 MB notebook). The meter charges what nbclient writes, so the notebook stays within its limit."""
    client, send, written = _metered_client()
    for _ in range(60):
        send("display_data", {"data": {"text/plain": "0"}, "metadata": {}, "transient": {"display_id": "d"}}, 0)
    assert sum(len(places) for places in client._display_id_map["d"].values()) == 60
    update = {"data": {"text/plain": "u" * 1_500_000}, "metadata": {}, "transient": {"display_id": "d"}}
    send("update_display_data", update, 1)
    assert written() < client.notebook_output_limit
    client.cell_output_limit = client.notebook_output_limit = 0  # no limit: the update reaches every output
    send("update_display_data", update, 1)
    assert written() > 60 * 1_500_000


def test_what_an_output_keeps_besides_its_data_is_metered():
    """An output keeps its ``metadata`` (and an error its ``ename`` and ``evalue``) besides data and text: each is
    charged, so ten 3 MB metadata blobs on one-character displays do not pass the meter."""
    client, send, written = _metered_client()
    for _ in range(10):
        send("display_data", {"data": {"text/plain": "x"}, "metadata": {"blob": "m" * 3_000_000}}, 0)
        send("error", {"ename": "E", "evalue": "v" * 3_000_000, "traceback": []}, 1)
    assert written() < client.notebook_output_limit


def test_an_output_message_nbformat_cannot_make_is_dropped_not_raised():
    client, send, _ = _metered_client()
    display = {"data": {"text/plain": "y"}, "metadata": {}}
    send("display_data", dict(display, transient={"display_id": ["not", "text"]}), 0)  # unhashable in nbclient
    send("update_display_data", dict(display, transient={"display_id": {"a": 1}}), 0)
    send("display_data", {"data": {"text/plain": "no metadata"}}, 0)
    send("execute_result", {"data": [], "metadata": {}, "execution_count": 1}, 0)
    send("execute_result", {"data": {}, "metadata": {}}, 0)
    send("error", {"ename": "E", "evalue": 1, "traceback": []}, 1)
    send("stream", ["not", "an", "object"], 1)
    assert [o.get("data") for o in client.nb.cells[0].outputs] == [{"text/plain": "y"}]
    assert client.nb.cells[1].outputs == []


# --------------------------------------------------------------------------------------------- round 3: skipped
def test_every_entry_the_grader_skips_is_named_in_its_report(tmp_path):
    """A student's or an assignment's folder that is a symbolic link (or a file where a folder is expected) is a
    refused submission, named with why in report.json, the table and stderr, never followed; a hidden entry is
    listed as skipped. Only such entries here: no kernel starts."""
    elsewhere = tmp_path / "elsewhere" / "01_splitting"
    elsewhere.mkdir(parents=True)
    (elsewhere / "01_splitting.ipynb").write_text("{}")
    submissions, out = tmp_path / "submissions", tmp_path / "out"
    (submissions / "mallory").mkdir(parents=True)
    (submissions / "eve").symlink_to(elsewhere.parent)  # a student folder that is a link
    (submissions / "mallory" / "01_splitting").symlink_to(elsewhere)  # an assignment folder that is a link
    (submissions / "mallory" / "notes.txt").write_text("a file where an assignment folder belongs")
    (submissions / "trent.ipynb").write_text("{}")  # a file where a student folder belongs
    (submissions / ".ipynb_checkpoints").mkdir()
    command = [sys.executable, str(REPO / "autograder" / "grade.py"), str(submissions), "--out", str(out)]
    process = subprocess.run([*command, "--no-progress"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert process.returncode == 1, process.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    refused = {(r["task"]["student"], r["task"]["assignment"]): r["error"] for r in report["results"]}
    assert refused == {
        ("eve", grade.ALL): "refused: the student folder is a symbolic link (not followed)",
        ("mallory", "01_splitting"): "refused: the assignment folder is a symbolic link (not followed)",
        ("mallory", "notes.txt"): "refused: the assignment folder is a file",
        ("trent.ipynb", grade.ALL): "refused: the student folder is a file",
    }
    for (student, assignment), error in refused.items():
        assert f"{grade.shown(student)}/{grade.shown(assignment)}: {error}" in process.stderr, process.stderr
    rows = [line.split()[0] for line in process.stdout.splitlines()[2:] if line.strip()]
    assert {"eve", "mallory", "trent.ipynb"} <= set(rows), process.stdout
    assert report["skipped"] == [{"entry": ".ipynb_checkpoints", "why": grade.HIDDEN}]
    assert ".ipynb_checkpoints: " + grade.HIDDEN in process.stdout


# --------------------------------------------------------------------------------------------- round 3: per uid
def _sandboxed(code: str, folder: Path) -> subprocess.Popen:
    """``python -c code`` in a kernel's sandbox, as ``execute.py`` starts one: a uid of its own (as root), working in
    ``folder`` (given to it)."""
    folder.mkdir()
    uid = sandbox.kernel_uid()
    sandbox.give_to_kernel(folder, uid=uid)
    argv = sandbox.command(
        [sys.executable, "-c", code],
        workdir=folder,
        writable=[folder],
        environment=sandbox.kernel_environment({}, folder),
        uid=uid,
    )
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _answer(process: subprocess.Popen) -> str:
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-2000:]
    return stdout.strip()


SANDBOX = pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this machine")
KEYS = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[__import__("os").uname().machine]
USER_KEYRING, SEARCH = -4, 10
def add(description, payload):
    return libc.syscall(ADD_KEY, b"user", description, payload, len(payload), ctypes.c_int(USER_KEYRING))
def search(description):
    return libc.syscall(KEYCTL, SEARCH, ctypes.c_int(USER_KEYRING), b"user", description, 0)
"""


@SANDBOX
def test_a_key_one_kernel_adds_is_not_seen_by_a_kernel_sandboxed_after_it(tmp_path):
    """Every kernel ran as host uid 65534: a key added to the user keyring by one was read by every later one."""
    mark = os.urandom(8).hex().encode()
    added = _answer(_sandboxed(KEYS + f"print(add(b'gpulab-{mark.decode()}', b'left for later'))", tmp_path / "a"))
    assert int(added) > 0, "the keyring works in a sandbox"
    again = KEYS + f"print(search(b'gpulab-{mark.decode()}'), add(b'own', b'mine') > 0)"
    assert _answer(_sandboxed(again, tmp_path / "b")).split() == ["-1", "True"]


INOTIFY_FILL = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while len(held) < 100_000:
    handle = libc.inotify_init1(0)
    if handle < 0:
        break
    held.append(handle)
print(len(held), os.strerror(ctypes.get_errno()), flush=True)
while not os.path.exists("done"):
    time.sleep(0.05)
"""


@SANDBOX
def test_a_kernel_that_uses_up_a_per_uid_limit_leaves_the_kernels_beside_it_theirs(tmp_path):
    """One kernel takes every inotify instance its uid may have (``fs.inotify.max_user_instances``, counted per uid
    for the whole machine, as epoll watches are) and holds them: a kernel started beside it still gets its own."""
    filler = _sandboxed(INOTIFY_FILL, tmp_path / "filler")
    try:
        taken, why = filler.stdout.readline().split(" ", 1)
        assert int(taken) > 0 and "Too many open files" in why, (taken, why)
        beside = "import ctypes; print(ctypes.CDLL(None, use_errno=True).inotify_init1(0) >= 0)"
        assert _answer(_sandboxed(beside, tmp_path / "beside")) == "True"
    finally:
        (tmp_path / "filler" / "done").touch()
        filler.communicate(timeout=60)


@SANDBOX
def test_no_kernel_can_make_a_user_namespace(tmp_path):
    """As root the sandbox let a kernel make user namespaces (``--disable-userns`` was passed only to an
    unprivileged bwrap); in both modes it now cannot."""
    code = "import ctypes; print(ctypes.CDLL(None, use_errno=True).unshare(0x10000000), ctypes.get_errno())"
    made, errno = _answer(_sandboxed(code, tmp_path / "work")).split()
    assert made == "-1" and int(errno) in (1, 28), (made, errno)  # EPERM, or ENOSPC from max_user_namespaces


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid per kernel needs root")
def test_as_root_each_kernel_gets_a_host_uid_no_account_and_no_other_kernel_has(tmp_path):
    import pwd

    uids = {sandbox.kernel_uid() for _ in range(3)}
    assert len(uids) == 3 and uids.isdisjoint({p.pw_uid for p in pwd.getpwall()} | {sandbox.SANDBOX_UID})
    process = _sandboxed("import os, time; print(os.getuid()); time.sleep(1)", tmp_path / "work")
    host = set()
    for _ in range(50):
        host = {os.stat(f"/proc/{pid}").st_uid for pid in _children(process.pid)}
        if host:
            break
        time.sleep(0.05)
    assert _answer(process) == str(sandbox.SANDBOX_UID)  # nobody, inside
    assert len(host) == 1 and host.isdisjoint({0, sandbox.SANDBOX_UID} | uids), host
    assert os.stat(tmp_path / "work").st_uid in host


def _children(pid: int) -> list[int]:
    """The processes below ``pid`` that no longer run as root (the kernel's, in its sandbox)."""
    found, pending = [], [pid]
    while pending:
        parent = pending.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            pending.append(child)
            try:
                if os.stat(f"/proc/{child}").st_uid != 0:
                    found.append(child)
            except OSError:
                pass
    return found
