"""Attacks on the grading of lesson 04's rules of files (``save_checkpoint_contents``, ``_unwraps``, ``_atomic``,
``load_checkpoint_models``, ``_resume``, ``_refuses_code``): ``gpulab.exercises.checkpoints`` declares them,
``autograder/checks/rules.py`` and ``checks/files.py`` enforce them. Driven without a kernel (``LocalSession``), or,
where the grader's own process would crash or hang, in a child process with a time limit.

Each test asserts the secure behaviour: a wrong answer earns no cell, the self-check and the grader agree on a
plausible answer, and no file crashes or stalls the grader. Those marked "found by a red team" worked against the
first version of these rules and are kept so that they stay refused. Seconds each.
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

from tests.local_checks import attacked_verdict, lesson_04_namespace
from tests.nbgrader_tools import REPO

sys.path.insert(0, str(REPO))
import gpulab.check  # noqa: E402

from autograder.checks import LocalSession, checks_for, wire  # noqa: E402

CHECKS = checks_for("04_checkpoints")

UNWRAP = """
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    bare = model.module if isinstance(model, wrappers) else model
    checkpoint = {"model": bare.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
"""


def save_answer(body: str, preamble: str = "") -> dict:
    """A ``save_checkpoint`` answer cell: ``checkpoint`` made as the lesson's solution makes it, then ``body``."""
    code = f"{preamble}\ndef save_checkpoint(path, model, optimizer, epoch):{UNWRAP}{textwrap.indent(body, '    ')}\n"
    return {"save_checkpoint_answer": code}


def verdict(grade_id: str, overrides: dict, tmp_path, seed: int = 0) -> str:
    session = LocalSession(lesson_04_namespace(overrides), tmp_path, random.Random(seed))
    return attacked_verdict(CHECKS[grade_id], session)


def verdicts(prefix: str, overrides: dict, tmp_path, seed: int = 0) -> dict[str, str]:
    return {cell: verdict(cell, overrides, tmp_path, seed) for cell in CHECKS if cell.startswith(prefix)}


# --------------------------------------------------------------------------------------------- findings (fail today)
PEEKING_LOADER = """
import sys


def load_checkpoint(path, model, optimizer=None, map_location=None):
    # never opens path: the adapter's frame holds the description the grader planted the file from
    from gpulab.exercises.checkpoints import trained

    source = sys._getframe(1).f_locals["source"]
    if source["payload"]:
        raise RuntimeError("refused")
    saved, made = trained(source["layers"], source["seed"], source["optimizer"], source["steps"])
    getattr(model, "module", model).load_state_dict(saved.state_dict())
    if optimizer is not None and made is not None:
        optimizer.load_state_dict(made.state_dict())
    return source["epoch"]
"""


def test_a_loader_that_never_reads_the_file_earns_nothing(tmp_path):
    """Found by a red team, now refused. ``loaded_by`` runs in the kernel with ``source``, the plain description of the
    planted file (layers, seed, optimizer, steps, epoch, payload). A ``load_checkpoint`` that never opens ``path``
    rebuilds the file's contents with gpulab's own ``trained`` from its caller's frame (a forged kernel answer can do
    the same from the request's arguments) and earns every load cell: the verdict rests on values computed from the
    grader's description, not on the file."""
    got = verdicts("load_checkpoint", {"load_checkpoint_answer": PEEKING_LOADER}, tmp_path)
    assert set(got.values()) == {"failed"}, got


def test_an_unsafe_loader_that_knows_which_file_carries_code_loses_refuses_code(tmp_path):
    """Found by a red team, now refused. the same leak of ``source["payload"]``: a loader that unpickles with
    ``weights_only=False`` (it runs any file's code in real life) refuses only the files the grader says carry code, and
    earns ``load_checkpoint_refuses_code``."""
    unsafe = """
import sys


def load_checkpoint(path, model, optimizer=None, map_location=None):
    if sys._getframe(1).f_locals["source"]["payload"]:
        raise RuntimeError("refused")
    bare = getattr(model, "module", model)
    checkpoint = torch.load(path, map_location=next(bare.parameters()).device, weights_only=False)
    bare.load_state_dict(strip_module_prefix(checkpoint["model"]))
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]
"""
    assert verdict("load_checkpoint_refuses_code", {"load_checkpoint_answer": unsafe}, tmp_path) == "failed"


def test_serialising_in_memory_then_overwriting_path_is_not_atomic(tmp_path):
    """Found by a red team, now refused. every injected failure ("unpicklable", "disk full") strikes while pickling. An
    answer that pickles to memory first, then truncates and writes ``path`` in place, never meets a failure while the
    file is open: it earns ``save_checkpoint_atomic`` although a real full disk (a failed write) destroys the last good
    checkpoint."""
    in_memory = """
buffer = io.BytesIO()
torch.save(checkpoint, buffer)
with open(path, "wb") as handle:
    handle.write(buffer.getvalue())
"""
    overrides = save_answer(in_memory, "import io")
    assert verdict("save_checkpoint_atomic", overrides, tmp_path) == "failed"


def test_a_temporary_file_left_in_the_default_temp_folder_is_seen(tmp_path, monkeypatch):
    """Found by a red team, now refused. ``tempfile.mkstemp()`` without ``dir``, ``shutil.move`` onto ``path`` (a copy
    across file systems: not atomic) and no clean-up: each failed save leaves its temporary file behind, but outside the
    call's folder, where the grader never looks. ``save_checkpoint_atomic`` is earned (and the self-check agrees)."""
    elsewhere, grading = tmp_path / "default-temp", tmp_path / "grading"
    elsewhere.mkdir()
    grading.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(elsewhere))  # where the answer's mkstemp() writes, cleaned by pytest
    move = """
handle, temporary = tempfile.mkstemp(suffix=".pt")
os.close(handle)
torch.save(checkpoint, temporary)
shutil.move(temporary, path)
"""
    got = verdict("save_checkpoint_atomic", save_answer(move, "import shutil"), grading)
    assert got == "failed", got


def test_a_model_entry_that_is_no_state_dict_earns_nothing(tmp_path):
    """Found by a red team, now refused. ``observe_saved`` passes a non-mapping ``"model"`` through ``entries``
    unchanged, and ``same_entries`` takes a list of ``[key, tensor]`` lists: a checkpoint whose model is such a list
    (``load_state_dict`` cannot take it) earns ``save_checkpoint_contents`` and ``save_checkpoint_unwraps``."""
    pairs = """
checkpoint["model"] = [[key, value] for key, value in checkpoint["model"].items()]
torch.save(checkpoint, path)
"""
    got = verdicts("save_checkpoint", save_answer(pairs), tmp_path)
    assert got["save_checkpoint_contents"] == got["save_checkpoint_unwraps"] == "failed", got


def test_the_self_check_and_the_grader_agree_on_a_legacy_format_checkpoint(tmp_path):
    """FINDING (self-check vs grader): ``torch.save(..., _use_new_zipfile_serialization=False)`` (the pre-1.6 format,
    still advised "for compatibility") writes a file ``torch.load(weights_only=True)`` reads: the self-check's
    ``Folder.load`` takes it and reports every case correct; the grader's ``files.load_weights`` demands a zip archive
    (``wire.stored_records``) and fails all three save cells."""
    legacy = """
path = Path(path)
handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
os.close(handle)
try:
    torch.save(checkpoint, temporary, _use_new_zipfile_serialization=False)
    os.replace(temporary, path)
except BaseException:
    os.remove(temporary)
    raise
"""
    overrides = save_answer(legacy)
    self_check = gpulab.check.run("save_checkpoint", lesson_04_namespace(overrides)["save_checkpoint"])
    got = verdicts("save_checkpoint", overrides, tmp_path)
    assert self_check.passed == (set(got.values()) == {"passed"}), (str(self_check), got)


def test_planting_never_writes_through_a_link_the_kernel_left(tmp_path):
    """FINDING (hardening): the grader plants into names that may already exist (``files.write_bytes``: ``O_CREAT``
    without ``O_EXCL``; ``_made_folder`` takes an existing folder). The check's folder is open to the kernel from
    ``Session.workdir`` on, so a kernel thread that watches for it can make ``call-0/checkpoint.pt`` a hard link
    (no symlink: ``O_NOFOLLOW`` does not see it) to a file outside the check's folder before the grader plants;
    the grader then truncates and overwrites that file."""
    victim = tmp_path / "outside.txt"
    victim.write_bytes(b"the grader must never write here")
    session = LocalSession(lesson_04_namespace(), tmp_path, random.Random(0))
    (session.workdir / "call-0").mkdir()  # as the kernel's thread would, between open_to_kernel and the planting
    (session.workdir / "call-0" / "checkpoint.pt").hardlink_to(victim)
    attacked_verdict(CHECKS["load_checkpoint_models"], session)
    assert victim.read_bytes() == b"the grader must never write here"


# ------------------------------------------------------------------ hostile checkpoints read by the grader's process
def _torch_file(pickle_body: bytes) -> bytes:
    """A ``torch.save`` archive (records stored, as torch writes them) whose ``data.pkl`` is ``pickle_body``."""
    buffer = io.BytesIO()
    torch.save({"epoch": 3}, buffer)
    original, out = zipfile.ZipFile(io.BytesIO(buffer.getvalue())), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for info in original.infolist():
            data = original.read(info.filename)
            archive.writestr(info, pickle_body if info.filename.endswith("/data.pkl") else data)
    return out.getvalue()


def _dict_with_key(key_ops: bytes) -> bytes:
    """Pickle ops of ``{"epoch": 3, <key the ops push>: 1}``."""
    return b"\x80\x02}(X\x05\x00\x00\x00epochK\x03" + key_ops + b"K\x01u."


def deep_tuple_key(depth: int = 1_000_000) -> bytes:
    """A key ``((((0,),),)...)`` nested ``depth`` times (one byte a level): hashing it recurses in C."""
    return _torch_file(_dict_with_key(b"K\x00" + b"\x85" * depth))


def shared_tuple_key(depth: int = 40) -> bytes:
    """A key ``(t0, t1, ..., t_depth)``, ``t_l = (t_l-1, t_l-1)`` shared through the memo: 2**depth tuples to hash,
    a few hundred bytes (torch's unpickler has no POP: each level's tuple stays on the stack, in the key)."""
    ops = bytearray(b"(K\x00\x85r\x00\x00\x00\x00")
    for level in range(depth):
        get = b"j" + level.to_bytes(4, "little")
        ops += get + get + b"\x86r" + (level + 1).to_bytes(4, "little")
    return _torch_file(_dict_with_key(bytes(ops + b"t")))


def colliding_keys(count: int = 200_000) -> bytes:
    """``{"epoch": 3, "x": {k * (2**61 - 1): 0, ...}}``: int keys that all hash to 0 (quadratic to insert)."""
    ops = bytearray(b"\x80\x02}(X\x05\x00\x00\x00epochK\x03X\x01\x00\x00\x00x}(")
    for k in range(1, count):
        number = (k * (2**61 - 1)).to_bytes(12, "little", signed=True)
        ops += b"\x8a\x0c" + number + b"K\x00"
    return _torch_file(bytes(ops + b"uu."))


def shared_list_value(depth: int = 30) -> bytes:
    """``{"epoch": [l, l]}``, ``l = [l', l']`` ``depth`` levels: ``files._bounded`` walks 2**depth lists."""
    value = [0]
    for _ in range(depth):
        value = [value, value]
    buffer = io.BytesIO()
    torch.save({"epoch": value}, buffer)
    return buffer.getvalue()


def _in_a_child(code: str, data: bytes, tmp_path, seconds: float) -> tuple[int | None, str]:
    """Run ``code`` (``DATA``: the file's path) in a fresh interpreter: its exit status (None: still running after
    ``seconds``, then killed) and its output."""
    path = tmp_path / "hostile.pt"
    path.write_bytes(data)
    script = f"import sys\nsys.path.insert(0, {str(REPO)!r})\nDATA = {str(path)!r}\n" + textwrap.dedent(code)
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=seconds, cwd=REPO)
    except subprocess.TimeoutExpired:
        return None, ""
    return done.returncode, done.stdout + done.stderr[-2000:]


def test_a_deeply_nested_key_in_a_saved_file_does_not_crash_the_grader(tmp_path):
    """Found by a red team, now refused. a ``save_checkpoint`` that writes a 1 MB file whose pickle holds a dict key
    nested a million tuples deep: the grader's ``files.load_weights`` (``torch.load(weights_only=True)``) hashes the
    key, recursing in C, and the grader's process dies of a segmentation fault (``save_checkpoint_contents``, any save
    cell)."""
    code = """
    import random, tempfile
    from pathlib import Path
    from tests.local_checks import attacked_verdict, lesson_04_namespace
    from autograder.checks import LocalSession, checks_for
    answer = "def save_checkpoint(path, model, optimizer, epoch):\\n"
    answer += f"    Path(path).write_bytes(Path({DATA!r}).read_bytes())"
    namespace = lesson_04_namespace({"save_checkpoint_answer": answer})
    with tempfile.TemporaryDirectory() as folder:
        session = LocalSession(namespace, Path(folder), random.Random(0))
        print("VERDICT", attacked_verdict(checks_for("04_checkpoints")["save_checkpoint_contents"], session))
    """
    status, output = _in_a_child(code, deep_tuple_key(), tmp_path, 30)
    assert status == 0 and "VERDICT failed" in output, (status, output[-500:])


@pytest.mark.parametrize(
    "hostile",
    [shared_tuple_key, colliding_keys, shared_list_value],
    ids=["shared-tuple-key", "colliding-int-keys", "shared-list-value"],
)
def test_the_grader_reads_a_hostile_checkpoint_in_bounded_time(hostile, tmp_path):
    """Found by a red team, now refused. ``files.load_weights`` bounds a file's bytes and each tensor, not the work of
    reading its pickle: a few hundred bytes whose key is a tuple sharing itself 40 levels deep (2**40 hashes), a 3 MB
    dict of ints that all hash alike (quadratic), or a list sharing itself 30 levels deep that ``_bounded`` walks as a
    tree (2**30 visits) each hold the grader's process for minutes to hours (no deadline covers the grader's own work).
    Each must be refused (``CheckFailed``) in a second or two."""
    code = """
    import time
    from pathlib import Path
    from autograder.checks import CheckFailed, files
    data, start = Path(DATA).read_bytes(), time.monotonic()
    try:
        files.load_weights(data)
        print("LOADED", time.monotonic() - start)
    except CheckFailed as refusal:
        print("REFUSED", time.monotonic() - start, refusal)
    """
    status, output = _in_a_child(code, hostile(), tmp_path, 25)
    assert status == 0 and "REFUSED" in output, (status, output[-500:])


# --------------------------------------------------------------------------------------------- defeated (pass today)
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "trick",
    [
        # a good checkpoint beside the call's, linked to from path
        'torch.save(checkpoint, path + ".real")\nos.symlink(os.path.basename(path) + ".real", path)',
        # a FIFO at path: a grader that opened it blocking would wait for ever
        "os.mkfifo(path)",
        # the call's folder swapped for a link to a folder holding a good checkpoint
        "folder = os.path.dirname(path)\nos.rename(folder, folder + '-moved')\n"
        "torch.save(checkpoint, os.path.join(folder + '-moved', 'checkpoint.pt'))\n"
        "os.symlink(folder + '-moved', folder)",
        # a sparse file of 100 GB
        'with open(path, "wb") as handle:\n    handle.truncate(10**11)',
        # a folder at path
        "os.mkdir(path)",
    ],
    ids=["symlinked-file", "fifo", "swapped-folder", "sparse-100GB", "folder"],
)
def test_file_system_tricks_fail_the_save_cells_cleanly(trick, tmp_path):
    """Defeated: every component is opened without following a link, only a regular file is read, its size capped
    before reading: each trick fails its cell with ``CheckFailed``, quickly, never a grader error or a hang."""
    assert verdict("save_checkpoint_contents", save_answer("path = str(path)\n" + trick), tmp_path) == "failed"


@pytest.mark.parametrize(
    "epoch",
    ["10**5000", "[epoch]", "torch.tensor([epoch, epoch])", "torch.tensor(True)", "str(epoch)", "float('nan')"],
)
def test_epochs_that_are_not_the_epoch_fail_cleanly(epoch, tmp_path):
    """Defeated: ``same_epoch`` takes a number or a one-element tensor equal to the epoch, nothing else; a huge int
    (whose ``repr`` raises) is shown by its type, not a grader error."""
    overrides = save_answer(f'checkpoint["epoch"] = {epoch}\ntorch.save(checkpoint, path)')
    assert verdict("save_checkpoint_contents", overrides, tmp_path) == "failed"


class LyingKernel(LocalSession):
    """A kernel that runs the adapter honestly with the notebook's loader, then says, for every file with code, that
    the loader refused it and that no code ran."""

    def _request(self, request: dict) -> dict:
        request = json.loads(json.dumps(request))
        answer = wire.serve(request, self.namespace, torch)
        for outcome in answer["outcomes"]:  # the kernel no longer learns which file carries code: it claims all
            outcome.pop("raised", None)
            outcome["value"] = wire.encode({"raised": "UnpicklingError: refused", "code ran": False}, torch)
        return self._parse(json.dumps(answer))


def test_a_kernel_that_denies_running_the_files_code_is_not_believed(tmp_path):
    """Defeated: whether code ran is the grader's own listing of the call's folder (``observe_loaded`` overwrites the
    kernel's ``"code ran"``): an unsafe loader whose kernel claims every refusal still loses the cell."""
    unsafe = """
def load_checkpoint(path, model, optimizer=None, map_location=None):
    bare = getattr(model, "module", model)
    checkpoint = torch.load(path, map_location=next(bare.parameters()).device, weights_only=False)
    bare.load_state_dict(strip_module_prefix(checkpoint["model"]))
    return checkpoint["epoch"]
"""
    session = LyingKernel(lesson_04_namespace({"load_checkpoint_answer": unsafe}), tmp_path, random.Random(0))
    assert attacked_verdict(CHECKS["load_checkpoint_refuses_code"], session) == "failed"
