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
  interruptible loop, a ``MemoryError``, a fork and an output flood cost only their own cell, and that writing
  into the grading environment or starting a shell is refused.
* ``lessons.LESSON_ATTACKS`` are aimed at one lesson's tests (wrong answers that rebind the tests' globals,
  patch the references' torch functions, read the tests' frames, or return liars).

``Attack.weaknesses`` lists cells where a known weakness of the *lesson's* tests lets the attack win; the tests
report them separately (strict xfail), so that fixing the lesson turns them green.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
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
    weaknesses: frozenset[str] = field(default_factory=frozenset)
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


GENERIC_ATTACKS = [
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
    with open({pid_file!r}, "w") as _handle:
        _handle.write(str(os.getpid()))
    time.sleep(600)
    os._exit(0)
print("x" * 10_000_000)
"""


PLANT = """
import json
import os
import subprocess
import sys
import sysconfig

import gpulab

_course = os.path.abspath(os.path.join(os.getcwd(), "..", "..", ".."))
_targets = {{
    "site-packages": os.path.join(sysconfig.get_paths()["purelib"], "zz_redteam.pth"),
    "gpulab": os.path.join(os.path.dirname(gpulab.__file__), "__init__.py"),
    "grader": os.path.join(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0], "sitecustomize.py"),
    "gradebook": os.path.join(_course, "gradebook.db"),
    "other student": os.path.join(_course, "autograded", "zz_redteam.ipynb"),
}}
_refused = {{}}
for _name, _path in _targets.items():
    try:
        open(_path, "a").close()  # opening for writing is enough to be refused; nothing is written
        _refused[_name] = False
    except PermissionError:
        _refused[_name] = True
for _name, _command in [("shell", ["sh", "-c", "true"]), ("python -I", [sys.executable, "-I", "-c", "pass"])]:
    try:
        subprocess.run(_command, check=False)
        _refused[_name] = False
    except PermissionError:
        _refused[_name] = True
try:
    os.system("true")
    _refused["os.system"] = False
except PermissionError:
    _refused["os.system"] = True
with open({result_file!r}, "w") as _handle:
    json.dump({{"refused": _refused, "targets": _targets}}, _handle)
"""


def _build_plant(lesson: Lesson, workdir: Path):
    nb = copy.deepcopy(lesson.reference)
    return _cell_before(nb, lesson.answers[1], PLANT.format(result_file=str(workdir / "planted.json")))


def _build_exits(lesson: Lesson, workdir: Path):
    nb = copy.deepcopy(lesson.reference)
    first, second, third, last = lesson.answers[0], lesson.answers[1], lesson.answers[2], lesson.answers[-1]
    _prepend(nb, first, "import sys\nsys.exit(1)")
    _prepend(nb, second, "raise SystemExit('bye')")
    _prepend(nb, third, "while True:\n    pass")
    _prepend(nb, last, HARMLESS.format(pid_file=str(workdir / "forked.pid")))
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
        "plant_code",
        "tries to write into site-packages, gpulab, the grader, the gradebook and another student's folder, and to "
        "start a shell and an isolated Python (all refused; costs nothing); reports to planted.json",
        _build_plant,
        full_except(set()),
    ),
    Attack(
        "exits_and_loops",
        "sys.exit, SystemExit and an infinite loop at the top of the first three answers (each loses only its "
        "exercise); a MemoryError, a forked child that lives on and 10 MB of output in the last one (lose nothing)",
        _build_exits,
        full_except(_without_first_three),
    ),
]


def attacks_for(lesson: str, grader_attacks: bool = True) -> list[Attack]:
    """The generic attacks and those aimed at ``lesson``; without ``grader_attacks``, only the generic attacks
    whose outcome depends on the lesson's tests (those aimed at the grader itself behave the same everywhere)."""
    from autograder.redteam.lessons import LESSON_ATTACKS

    generic = [a for a in GENERIC_ATTACKS if grader_attacks or a.lesson_specific]
    return [*generic, *LESSON_ATTACKS.get(lesson, [])]


def known_weaknesses(lesson: str, attack: Attack) -> frozenset[str]:
    """Cells of ``lesson`` where ``attack`` wins through a known weakness of the lesson's tests."""
    from autograder.redteam.lessons import GENERIC_WEAKNESSES

    return attack.weaknesses | GENERIC_WEAKNESSES.get((lesson, attack.name), frozenset())


def swallow_only(lesson: Lesson, workdir: Path):
    """The blank release plus the ``SWALLOW`` payload alone (stock nbgrader gives this full marks)."""
    return insert_after_setup(_blank(lesson), "GRADE_IDS = []\n" + payloads.SWALLOW)
