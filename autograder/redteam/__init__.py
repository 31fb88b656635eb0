"""Red-team submissions: notebooks that try to earn points they did not earn, with the scores they must get.

Each ``Attack`` builds a submission from a lesson's release (the blank notebook a learner starts from) or its
reference solution, and says, per graded cell, the score it must get: what the same answers would earn without
the attack. ``tests/test_redteam.py`` grades them all with ``autograder/grade.py`` (several attacks, each as its
own student, in one run) and compares.

* ``GENERIC_ATTACKS`` work on any lesson (they find answer cells and tests by their nbgrader metadata) and start
  from the blank release, so they must score 0 everywhere: liars (objects equal to anything) with patched
  comparisons, builtins, gpulab and ``sys.modules``; failures swallowed (an input transformer wrapping every cell
  in ``try``, tracebacks and stderr silenced, "All tests passed" printed, outputs forged, tests emptied or
  deleted, fake evidence written); a trace function that jumps over every ``assert``.
* ``LIMIT_ATTACKS`` (lesson 01, under short time limits) check that ``os._exit``, a killed kernel, an
  uninterruptible loop and a memory bomb cost only the cells from there on, that ``sys.exit``, ``SystemExit``, an
  interruptible loop, a ``MemoryError``, a fork and an output flood (also through display updates) cost only
  their own cell, and that the sandbox shows and lets change nothing of the grader (``escape``: the source
  notebooks, the gradebook, other students' work, the grader's files and variables, the packages, other kernels,
  the network).
* ``lessons.LESSON_ATTACKS`` are aimed at one lesson's tests (wrong answers that rebind the tests' globals,
  patch the references' torch functions, read the tests' frames, or return liars).

* ``shared_attacks`` (lesson 01, two workers, honest students beside and after): per-uid limits of the machine
  used up and held (epoll and inotify watches), a key left in the user keyring for later kernels, quiz numbers
  whose exact fractions have billions of digits, one display update copied into 60 outputs.

* Attacks on the checks (``autograder/checks``, lesson 01): list's C-level comparison rewritten with ctypes,
  answers compiled under trusted-looking file names, forged answers in the checks' private MIME type (before and
  during a check, with forged and with stolen nonces), objects equal to anything, answers above the size cap.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_output

from autograder.redteam import payloads


# --------------------------------------------------------------------------------------------- lessons
@dataclass
class Lesson:
    """A lesson's release and reference notebooks, and where its graded cells are."""

    name: str
    release: nbformat.NotebookNode
    reference: nbformat.NotebookNode

    @classmethod
    def from_paths(cls, name: str, release: str | Path, reference: str | Path) -> Lesson:
        return cls(name, nbformat.read(str(release), as_version=4), nbformat.read(str(reference), as_version=4))

    @staticmethod
    def meta(cell) -> dict:
        return cell.get("metadata", {}).get("nbgrader", {})

    @property
    def tests(self) -> list[tuple[str, float]]:
        """``(grade_id, points)`` of the autograded test cells, in order."""
        return [
            (self.meta(c)["grade_id"], float(self.meta(c).get("points", 0)))
            for c in self.reference.cells
            if self.meta(c).get("grade") and not self.meta(c).get("solution")
        ]

    @property
    def answers(self) -> list[str]:
        """grade ids of the answer cells, in order."""
        return [self.meta(c)["grade_id"] for c in self.reference.cells if self.meta(c).get("solution")]

    def order(self) -> list[str]:
        return [self.meta(c)["grade_id"] for c in self.reference.cells if self.meta(c).get("grade_id")]

    def tests_of(self, answer: str) -> set[str]:
        """The tests between answer cell ``answer`` and the next answer cell (that exercise's tests)."""
        order, answers = self.order(), set(self.answers)
        start = order.index(answer) + 1
        end = next((i for i in range(start, len(order)) if order[i] in answers), len(order))
        tested = {gid for gid, _ in self.tests}
        return {gid for gid in order[start:end] if gid in tested}

    def tests_from(self, answer: str) -> set[str]:
        """The tests after answer cell ``answer``."""
        order = self.order()
        tested = {gid for gid, _ in self.tests}
        return {gid for gid in order[order.index(answer) + 1 :] if gid in tested}


# --------------------------------------------------------------------------------------------- expectations
def nothing(lesson: Lesson) -> dict[str, float]:
    return {gid: 0.0 for gid, _ in lesson.tests}


def full_except(lost: set[str] | Callable[[Lesson], set[str]]) -> Callable[[Lesson], dict[str, float]]:
    def expected(lesson: Lesson) -> dict[str, float]:
        gone = lost(lesson) if callable(lost) else lost
        return {gid: 0.0 if gid in gone else points for gid, points in lesson.tests}

    return expected


# --------------------------------------------------------------------------------------------- attacks
@dataclass(frozen=True)
class Attack:
    name: str
    what: str
    build: Callable[[Lesson, Path], nbformat.NotebookNode]
    expected: Callable[[Lesson], dict[str, float]] = nothing
    lesson_specific: bool = True  # False: aims at the grader, not at the lesson's tests (one lesson shows it)


def insert_after_setup(nb, *sources: str):
    """Insert code cells right after the notebook's first code cell (the lesson's set-up)."""
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    for offset, source in enumerate(sources, start=1):
        nb.cells.insert(first + offset, new_code_cell(source))
    return nb


def set_answers(nb, answer: Callable[[str, str], str]):
    """Replace each answer cell's source by ``answer(grade_id, current source)``."""
    for cell in nb.cells:
        meta = Lesson.meta(cell)
        if meta.get("solution"):
            cell.source = answer(meta["grade_id"], cell.source)
    return nb


def replace_answers(nb, answers: dict[str, str]):
    """Replace the answer cells named in ``answers`` (grade id -> code)."""
    return set_answers(nb, lambda gid, source: answers.get(gid, source))


_DEF = re.compile(r"^def\s+(\w+)\s*\(", re.MULTILINE)


def liar_answer(prefix: str = "", value: str = "_Liar()") -> Callable[[str, str], str]:
    """An answer that defines the stub's function returning ``value`` (a liar by default), or, for an answer
    cell that defines no function (a quiz), a dict ``{"q1": value, ...}`` under the cell's grade id."""

    def answer(grade_id: str, stub: str) -> str:
        found = _DEF.search(stub)
        if found:
            body = f"    {prefix}\n" if prefix else ""
            return f"def {found.group(1)}(*args, **kwargs):\n{body}    return {value}\n"
        return f"{grade_id} = {{'q%d' % i: {value} for i in range(1, 10)}}\n"

    return answer


def _blank(lesson: Lesson):
    return copy.deepcopy(lesson.release)


def _build_liars(lesson: Lesson, workdir: Path):
    nb = insert_after_setup(_blank(lesson), payloads.LIARS, payloads.PATCHES)
    return set_answers(nb, liar_answer())


def _build_swallow(lesson: Lesson, workdir: Path):
    nb = _blank(lesson)
    grade_ids = [gid for gid, _ in lesson.tests]
    insert_after_setup(nb, f"GRADE_IDS = {grade_ids!r}\n" + payloads.SWALLOW)
    tests = [c for c in nb.cells if Lesson.meta(c).get("grade") and not Lesson.meta(c).get("solution")]
    for index, cell in enumerate(tests):
        if index % 2:
            nb.cells.remove(cell)  # deleted test (its metadata with it)
        else:
            cell.source = "pass"  # emptied test, metadata intact, output forged
            cell.execution_count = 7
            cell.outputs = [new_output("stream", name="stdout", text="All tests passed!\n")]
    bonus = new_code_cell("print('bonus')", metadata={"nbgrader": {"grade": True, "grade_id": "bonus", "points": 100}})
    bonus.metadata["nbgrader"].update(locked=True, solution=False, schema_version=3)
    nb.cells.append(bonus)
    return nb


def _build_tracer(lesson: Lesson, workdir: Path):
    nb = insert_after_setup(_blank(lesson), payloads.TRACER)
    return set_answers(nb, liar_answer(prefix="_arm()", value="None"))


FORGE_COMPILED_TESTS = """
_guard = globals()["__gpulab_guard__"]
_nothing = compile("pass", "<test forged>", "exec")
for _entry in vars(_guard)["_tests"].values():
    _entry["body"], _entry["last"] = _nothing, None
"""


def _build_forge_compiled_tests(lesson: Lesson, workdir: Path):
    return insert_after_setup(_blank(lesson), FORGE_COMPILED_TESTS)


def _build_list_compare(lesson: Lesson, workdir: Path):
    nb = insert_after_setup(_blank(lesson), payloads.LIST_COMPARE)
    return set_answers(nb, liar_answer(value="[0]"))


def _build_trusted_names(lesson: Lesson, workdir: Path):
    nb = insert_after_setup(_blank(lesson), payloads.TRUSTED_NAMES)
    return set_answers(nb, lambda grade_id, stub: "pass\n")  # the answers come from the cell above


def _build_forged_answers(lesson: Lesson, workdir: Path):
    nb = insert_after_setup(_blank(lesson), payloads.FORGED_ANSWERS)
    return set_answers(nb, liar_answer(prefix="_forge_from_inside()", value="[1]"))


def _build_equal_objects(lesson: Lesson, workdir: Path):
    nb = insert_after_setup(_blank(lesson), payloads.EQUAL_OBJECTS)
    answers = [liar_answer(value="_EqualList([1])"), liar_answer(value="_Equal()")]
    count = iter(range(1000))
    return set_answers(nb, lambda grade_id, stub: answers[next(count) % 2](grade_id, stub))


def _build_huge_answer(lesson: Lesson, workdir: Path):
    nb = insert_after_setup(_blank(lesson), payloads.HUGE)
    return set_answers(nb, liar_answer(value="_HUGE"))


GENERIC_ATTACKS = [
    Attack(
        "forge_compiled_tests",
        "replaces, outside any test, the guard's compiled tests by `pass` (on a lesson graded by checks there are "
        "none to replace: the verdict is decided in the grader's process)",
        _build_forge_compiled_tests,
        lesson_specific=False,
    ),
    Attack(
        "list_compare",
        "rewrites list's C-level comparison slot with ctypes so that every `==` on lists in the kernel is True; "
        "answers return [0]",
        _build_list_compare,
        lesson_specific=False,
    ),
    Attack(
        "trusted_names",
        "answers compiled under torch's and gpulab's file names, returning what the visible cases expect",
        _build_trusted_names,
        lesson_specific=False,
    ),
    Attack(
        "forged_answers",
        "answers in the checks' private MIME type displayed before any check, sent by a thread, and sent from "
        "inside each call with the request's nonce while the real answer is swallowed; forged nonces",
        _build_forged_answers,
        lesson_specific=False,
    ),
    Attack(
        "equal_objects",
        "answers return a list subclass equal to anything, or an object whose __eq__ is always True",
        _build_equal_objects,
        lesson_specific=False,
    ),
    Attack(
        "huge_answer",
        "answers return a 40 MB string (above the cap on a kernel's answer)",
        _build_huge_answer,
        lesson_specific=False,
    ),
    Attack(
        "liars",
        "answers return objects equal to anything; torch comparisons, tolist, isinstance, AssertionError, "
        "gpulab.check.cases and sys.modules['gpulab'] replaced, len shadowed",
        _build_liars,
    ),
    Attack(
        "swallow",
        "every later cell wrapped in try/except by an input transformer; tracebacks, excepthook and stderr "
        "silenced; 'All tests passed' printed; tests emptied or deleted with outputs forged; a 100-point fake "
        "test cell; fake evidence written to every open file",
        _build_swallow,
        lesson_specific=False,
    ),
    Attack(
        "tracer",
        "a trace function that jumps over every assert/raise line, re-armed on the test's frame by each answer "
        "(which returns None)",
        _build_tracer,
        lesson_specific=False,
    ),
]


# --------------------------------------------------------------------------------------------- limits
def _cell_before(nb, grade_id: str, source: str):
    index = next(i for i, c in enumerate(nb.cells) if Lesson.meta(c).get("grade_id") == grade_id)
    nb.cells.insert(index, new_code_cell(source))
    return nb


def _prepend(nb, grade_id: str, source: str):
    cell = next(c for c in nb.cells if Lesson.meta(c).get("grade_id") == grade_id)
    cell.source = source + "\n" + cell.source
    return nb


def _fatal(code: str, at: int):
    def build(lesson: Lesson, workdir: Path):
        return _cell_before(copy.deepcopy(lesson.reference), lesson.answers[at], code)

    def expected(lesson: Lesson):
        return full_except(lesson.tests_from(lesson.answers[at]))(lesson)

    return build, expected


STUBBORN_LOOP = """
import time
while True:
    try:
        time.sleep(0.05)
    except KeyboardInterrupt:
        pass
"""
MEMORY_BOMB = """
import torch
_hog = []
while True:
    _hog.append(torch.ones(2**25))
"""
HARMLESS = """
import os
import time
try:
    _too_big = bytearray(1 << 40)
except MemoryError:
    pass
_child = os.fork()
if _child == 0:
    time.sleep(600)
    os._exit(0)
print("x" * 10_000_000)
"""


ESCAPE = r"""
import ctypes
import ctypes.util
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig

import gpulab

_found = {"read": {}, "written": {}, "other": {}}
_here = os.getcwd()
# reading what the grader keeps: walk up from the working folder; the usual places of a course
_candidates = [os.path.join(_here, *[".."] * _up) for _up in range(1, 6)]
_candidates += ["/work", "/root", "/home", os.path.expanduser("~instructor")]
_names = ["source", "gradebook.db", "submitted", "autograded", "autograder", ".git", "feedback", "nbgrader_config.py"]
for _folder in _candidates:
    for _name in _names:
        _path = os.path.abspath(os.path.join(_folder, _name))
        if os.path.exists(_path) and not (_here + os.sep).startswith(_path + os.sep):  # not its own folder's path
            _found["read"][_path] = True
for _path in glob.glob("/tmp/**", recursive=True) + glob.glob("/dev/shm/*"):
    if "evidence" in _path or "grading" in _path or "guard" in _path or _path.endswith(".db"):
        _found["read"][_path] = True
_found["other"]["environment"] = sorted(os.environ)
# writing what the grader trusts: the packages, gpulab (from a child with an empty environment), a .pth
_targets = {
    "site-packages": os.path.join(sysconfig.get_paths()["purelib"], "zz_redteam.pth"),
    "gpulab": os.path.join(os.path.dirname(gpulab.__file__), "__init__.py"),
    "stdlib": os.path.join(os.path.dirname(os.__file__), "zz_redteam.py"),
}
for _name, _path in _targets.items():
    _code = f"open({_path!r}, 'a').write('')"
    _child = subprocess.run([sys.executable, "-I", "-c", _code], env={}, capture_output=True)
    _found["written"][_name] = _child.returncode == 0
# sqlite from C on any gradebook it can find (no Python audit hook sees this)
_sqlite = ctypes.util.find_library("sqlite3")
_found["other"]["sqlite_c_library"] = bool(_sqlite)
# harming others: signal every process it can see that is not its own kernel or its own sandbox (its ancestors)
_own, _up = set(), os.getpid()
while _up > 1 and _up not in _own:
    _own.add(_up)
    _up = int(open(f"/proc/{_up}/stat").read().rsplit(")", 1)[1].split()[1])
_killed = []
for _pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
    if _pid in _own or _pid == 1:
        continue
    try:
        _cmdline = open(f"/proc/{_pid}/cmdline", "rb").read()
    except OSError:
        continue
    if b"ipykernel" in _cmdline or b"grade" in _cmdline or b"nbgrader" in _cmdline:
        try:
            os.kill(_pid, signal.SIGKILL)
            _killed.append(_pid)
        except OSError:
            pass
_found["other"]["killed"] = _killed
# the network
try:
    socket.create_connection(("1.1.1.1", 80), timeout=2).close()
    _found["other"]["network"] = True
except OSError:
    _found["other"]["network"] = False
# leaking through feedback: an encoded blob printed in the learner's own cell
print("REDTEAM-LEAK-" + __import__("base64").b64encode(b"hidden tests would go here").decode())
print("ESCAPE-FINDINGS " + json.dumps(_found))
"""

FLOOD = """
from IPython.display import display

_handle = display("a small display", display_id=True)
for _round in range(2):
    _handle.update("y" * 100_000_000)
"""


def _build_escape(lesson: Lesson, workdir: Path):
    nb = copy.deepcopy(lesson.reference)
    return _cell_before(nb, lesson.answers[1], ESCAPE)


def _build_exits(lesson: Lesson, workdir: Path):
    nb = copy.deepcopy(lesson.reference)
    first, second, third, last = lesson.answers[0], lesson.answers[1], lesson.answers[2], lesson.answers[-1]
    _prepend(nb, first, "import sys\nsys.exit(1)")
    _prepend(nb, second, "raise SystemExit('bye')")
    _prepend(nb, third, "while True:\n    pass")
    _prepend(nb, last, HARMLESS)
    nb.cells.append(new_code_cell(FLOOD))  # last: the kernel may hit its memory cap building 100 MB messages
    return nb


def _without_first_three(lesson: Lesson):
    return lesson.tests_of(lesson.answers[0]) | lesson.tests_of(lesson.answers[1]) | lesson.tests_of(lesson.answers[2])


LIMIT_ATTACKS = [
    Attack("os_exit", "os._exit(0) before the second exercise", *_fatal("import os\nos._exit(0)", 1)),
    Attack(
        "kill_kernel",
        "the kernel kills itself (SIGKILL) before the third exercise",
        *_fatal("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", 2),
    ),
    Attack(
        "stubborn_loop",
        "an infinite loop that ignores the interrupt, before the second exercise",
        *_fatal(STUBBORN_LOOP, 1),
    ),
    Attack(
        "memory_bomb", "allocates 128 MiB tensors until stopped, before the third exercise", *_fatal(MEMORY_BOMB, 2)
    ),
    Attack(
        "escape",
        "looks for the source notebooks, the gradebook, other students' work and the grader's files and variables, "
        "writes into the packages and gpulab from a child with an empty environment, kills every kernel it sees, "
        "opens the network and prints an encoded blob (finds nothing, changes nothing, costs nothing); prints "
        "what it found (the graded notebook keeps it)",
        _build_escape,
        full_except(set()),
    ),
    Attack(
        "exits_and_loops",
        "sys.exit, SystemExit and an infinite loop at the top of the first three answers (each loses only its "
        "exercise); a MemoryError, a forked child that lives on and 10 MB of output in the last one (lose nothing); "
        "a display updated twice with 100 MB at the end (the feedback stays small)",
        _build_exits,
        full_except(_without_first_three),
    ),
]


# --------------------------------------------------------------------------------------------- the gate
def _build_left_files(lesson: Lesson, workdir: Path):
    return _cell_before(copy.deepcopy(lesson.reference), lesson.answers[1], payloads.LEFT_FILES)


def _build_markup(lesson: Lesson, workdir: Path):
    from nbformat.v4 import new_markdown_cell

    nb = copy.deepcopy(lesson.reference)
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    for offset, text in enumerate(payloads.MARKUP, start=1):
        nb.cells.insert(first + offset, new_markdown_cell(text))
    svg = '<svg xmlns="http://www.w3.org/2000/svg" onload="alert(5)"><script>alert(6)</script></svg>'
    pictured = new_markdown_cell("![picture](attachment:picture.svg)")
    pictured.attachments = {"picture.svg": {"image/svg+xml": svg}}
    nb.cells.insert(first + 1, pictured)
    nb.metadata["title"] = "<script>alert('title')</script>"
    return nb


def _build_shared_memory(lesson: Lesson, workdir: Path):
    return _prepend(copy.deepcopy(lesson.reference), lesson.answers[0], payloads.SHARED_MEMORY_HONEST)


def _build_decoder_bomb(lesson: Lesson, workdir: Path):
    return _cell_before(copy.deepcopy(lesson.reference), lesson.answers[0], payloads.DECODER_BOMB)


def _tensor_tests(lesson: Lesson) -> set[str]:
    """The tests whose answers carry tensors: those of the exercise that returns them (lesson 01's split_batch)."""
    return {gid for gid, _ in lesson.tests if gid.startswith("split_batch")}


GATE_ATTACKS = [
    Attack(
        "left_files",
        "leaves, in its working folder, symbolic links to /etc/shadow, /, the gradebook and source/, one named like "
        "the feedback page, hard links, a FIFO, its own index.html, a link deep in a folder and a 3 GiB sparse "
        "file (none reaches the autograded or feedback folders; costs nothing)",
        _build_left_files,
        full_except(set()),
    ),
    Attack(
        "markup",
        "markdown with scripts, event handlers, frames, forms, styles, javascript: and data: links, an SVG "
        "attachment with a script, a mutation-XSS string and a script in the notebook's title (the feedback page "
        "carries no more active HTML than an honest student's; costs nothing)",
        _build_markup,
        full_except(set()),
    ),
    Attack(
        "shared_memory",
        "an honest 64 MiB block of shared memory in /dev/shm at the top of the first answer (the sandbox's own "
        "/dev/shm is writable: costs nothing)",
        _build_shared_memory,
        full_except(set()),
    ),
    Attack(
        "memfd_bomb",
        "fills a memfd (shared memory resident in no process) until stopped, before the third exercise",
        *_fatal(payloads.MEMFD_BOMB, 2),
    ),
    Attack(
        "tmpfs_bomb",
        "fills /dev/shm and /tmp (tmpfs, each capped at 1 GiB: together past the memory limit) before the third "
        "exercise",
        *_fatal(payloads.TMPFS_BOMB, 2),
    ),
    Attack(
        "disk_fill",
        "writes 64 MiB files into its working copy until stopped, before the third exercise (the disk is the one "
        "every student's grading shares)",
        *_fatal(payloads.DISK_FILL, 2),
    ),
    Attack(
        "deep_folder",
        "makes a folder 1,100 levels deep in its working copy before the third exercise (too deep to measure: over "
        "the disk limit; removed without recursion, so grading and grades.csv go on)",
        *_fatal(payloads.DEEP_FOLDER, 2),
    ),
    Attack(
        "big_message",
        "sends one pre-packed 36 MB message that decodes to 12 million lists, before the second exercise (ZeroMQ "
        "drops it before anything decodes it and the kernel's messages are lost from there on: it costs the cells "
        "from there on; the grading worker stays small)",
        *_fatal(payloads.BIG_MESSAGE, 1),
    ),
    Attack(
        "decoder_bomb",
        "replaces every tensor in the kernel's answers by a few bytes that decode to gigabytes (an expanded view, a "
        "stride-0 view, a deflated storage record): the cells whose answers carry tensors fail, the grading worker "
        "stays small",
        _build_decoder_bomb,
        full_except(_tensor_tests),
    ),
]
"""Attacks on what comes out of a kernel (files, pages, answers, memory), graded on lesson 01 with the limit
attacks (``tests/test_redteam.py``), an honest student alongside."""


# --------------------------------------------------------------------------------------------- round 3
# epoll watches the filler gives back once its uid is full, for its own kernel's sockets: fewer than a kernel needs to
# start (an idle ipykernel, its ZeroMQ sockets, their signalers and event loops, held 31 here)
EPOLL_RESERVE = 16


def _build_epoll_hold(seconds: int):
    def build(lesson: Lesson, workdir: Path):
        fill = payloads.EPOLL_FILL.replace("{reserve}", str(EPOLL_RESERVE))
        nb = _cell_before(copy.deepcopy(lesson.reference), lesson.answers[0], fill)
        nb = _cell_before(nb, lesson.answers[0], payloads.HOLD.format(seconds=seconds))
        return _cell_before(nb, lesson.answers[0], payloads.EPOLL_RELEASE)

    return build


def _build_keyring_and_inotify(description: str, seconds: int):
    def build(lesson: Lesson, workdir: Path):
        code = payloads.KEYRING_AND_INOTIFY.replace("{description}", description)
        nb = _cell_before(copy.deepcopy(lesson.reference), lesson.answers[0], code)
        return _cell_before(nb, lesson.answers[0], payloads.HOLD.format(seconds=seconds))

    return build


def _build_keyring_read(description: str):
    def build(lesson: Lesson, workdir: Path):
        code = payloads.KEYRING_READ.replace("{description}", description)
        return _cell_before(copy.deepcopy(lesson.reference), lesson.answers[0], code)

    return build


QUIZ_NUMBER_BOMBS = {"q1": "1e999999999", "q2": "1/3e99999"}


def _build_quiz_number_bomb(lesson: Lesson, workdir: Path):
    nb = copy.deepcopy(lesson.reference)
    for cell in nb.cells:  # gpulab's self-check would read the answers in the learner's own kernel: not run
        if cell.cell_type == "code" and "gpulab.check.quiz(" in cell.source and not Lesson.meta(cell):
            cell.source = "# the self-check is not run"
    answers = dict(QUIZ_NUMBER_BOMBS, q3="b")
    return replace_answers(nb, {"quiz_answers": f"quiz_answers = {answers!r}\n"})


def _build_display_fanout(lesson: Lesson, workdir: Path):
    return _cell_before(copy.deepcopy(lesson.reference), lesson.answers[0], payloads.DISPLAY_FANOUT)


def shared_attacks(description: str, hold: int, wait: int) -> list[Attack]:
    """Attacks on what kernels share and on the grader's bounds (issue: grading round 3), graded on lesson 01 in one
    run with honest students beside and after them (``tests/test_redteam.py``).

    ``epoll_hold`` fills the epoll watches of its uid, gives ``EPOLL_RESERVE`` back for its own kernel, holds the
    rest ``hold`` seconds and lets them go (its own kernel needs them again); ``keyring_and_inotify`` adds a key
    ``description`` to its user keyring, takes every inotify instance and watch and holds them ``wait`` seconds (so
    that the kernels graded after it start while the epoll watches are held); ``keyring_read``, graded after it,
    looks for the key. Each costs nothing. ``quiz_number_bomb`` answers two quiz numbers with texts whose exact
    fractions have billions of digits, its self-check cell left out (gpulab's self-check would expand them in the
    learner's own kernel): it loses those two questions. ``display_fanout`` gives 60 outputs one display_id and
    sends one 1.5 MB update: it costs nothing, and the graded notebook stays under its output limit."""
    return [
        Attack(
            "epoll_hold", "fills and holds the epoll watches of its uid", _build_epoll_hold(hold), full_except(set())
        ),
        Attack(
            "keyring_and_inotify",
            "adds a key to its user keyring; takes every inotify instance and watch of its uid and holds them",
            _build_keyring_and_inotify(description, wait),
            full_except(set()),
        ),
        Attack(
            "keyring_read",
            "looks for the key a kernel graded before it left",
            _build_keyring_read(description),
            full_except(set()),
        ),
        Attack(
            "quiz_number_bomb",
            "quiz numbers written 1e999999999 and 1/3e99999",
            _build_quiz_number_bomb,
            full_except({"quiz_q1", "quiz_q2"}),
        ),
        Attack(
            "display_fanout",
            "60 outputs of one display_id, one 1.5 MB update",
            _build_display_fanout,
            full_except(set()),
        ),
    ]


def attacks_for(lesson: str, grader_attacks: bool = True) -> list[Attack]:
    """The generic attacks and those aimed at ``lesson``; without ``grader_attacks``, only the generic attacks
    whose outcome depends on the lesson's tests (those aimed at the grader itself behave the same everywhere)."""
    from autograder.redteam.lessons import LESSON_ATTACKS

    generic = [a for a in GENERIC_ATTACKS if grader_attacks or a.lesson_specific]
    return [*generic, *LESSON_ATTACKS.get(lesson, [])]


def swallow_only(lesson: Lesson, workdir: Path):
    """The blank release plus the ``SWALLOW`` payload alone (stock nbgrader gives this full marks)."""
    return insert_after_setup(_blank(lesson), "GRADE_IDS = []\n" + payloads.SWALLOW)
