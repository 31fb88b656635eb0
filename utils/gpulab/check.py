"""Instant feedback for self-study: ``gpulab.check.<exercise>(<your function>)``.

Every lesson calls it right after each exercise (lesson 01 introduces it). A check runs the exercise's visible
cases (the very cases the lesson's nbgrader test cell asserts, from ``cases(name)``: one definition) plus a few
more, and shows a clear pass, or the first failing case with a *targeted* hint for the typical mistake. Values in
feedback are summarised (``summarise``: a tensor by its shape and dtype) and the first place an answer differs from
the expected value is named (``first_difference``), never a dump of tensors. A hint names the idea the answer
misses and points to the lesson's demo of it; it never dictates code (``tests/test_check.py`` holds it to that).
A check grades nothing and needs no Jupyter server, database or extension: in Jupyter it renders as rich text,
elsewhere it prints plain text.

``hint(name)`` gives a general hint; ``solution(name, confirm=True)`` shows a reference solution to a
self-study learner who asks for it, from the package ``gpulab_solutions`` (``solutions/`` of the repository),
which self-study installs beside gpulab and a class never does. Without it, ``solution()`` says so and the quiz's
self-check (``quiz(lesson, quiz_answers)``, ``gpulab.quiz``) checks the answers' form only.

gpulab is what a learner's kernel imports: it holds no solution, no reference implementation and no draw of the
grader's hidden inputs. The expected outcome of each visible and extra case was computed from the reference when
the lessons were built (``python -m gpulab_solutions.recorded``) and is read from ``exercises/expected.pt``; the
grader computes the expected outcome of its hidden inputs in its own process, from ``gpulab_solutions``.

Exercises are declared, learntools-style, as small ``Exercise`` objects in ``gpulab.exercises.<lesson>``. An
exercise's specification is a list of ``Rule`` objects: each carries the lesson's sentence that states it, its
inputs (visible: asserted by the graded cell; extra: the self-check's; the hidden ones are drawn by the grader,
from ``gpulab_solutions``), the expected outcome (a recorded value or ``Raises``) and the comparison. The
self-check, the visible test cell (``Case.verify``) and the grader's check (``autograder/checks/rules.py``) all
derive from these rules, so that they cannot disagree about what is right.
"""

from __future__ import annotations

import contextlib
import copy
import html
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulab import messages
from gpulab.messages import message, text

# Each lesson's exercises live in their own module, imported the first time one of them is asked for.
_LESSON_MODULES = (
    "gpulab.exercises.splitting",
    "gpulab.exercises.gradient_averaging",
    "gpulab.exercises.gpu0_imbalance",
    "gpulab.exercises.checkpoints",
)


@dataclass(frozen=True)
class Tolerance:
    """How far a number may be from the expected one and still count as equal: ``absolute`` plus ``relative``
    times the larger of ``floor`` and the expected value's size. An exercise that compares numbers within a
    tolerance gives the same ``Tolerance`` to its ``same`` and to its ``Exercise``, so that a failure message
    names the first number that is *out of* tolerance, never one that merely differs in its last digits."""

    absolute: float = 0.0
    relative: float = 0.0
    floor: float = 0.0

    def bound(self, expected: float) -> float:
        return self.absolute + self.relative * max(self.floor, abs(expected))

    def close(self, got: float, expected: float) -> bool:
        """``got`` is within tolerance of ``expected`` (NaN never is)."""
        return abs(got - expected) <= self.bound(expected)


@dataclass(frozen=True)
class Raises:
    """Expected outcome of a case that must raise ``error`` (e.g. ``Raises(ValueError)``)."""

    error: type[BaseException]

    def __repr__(self) -> str:
        return f"raises {self.error.__name__}"


@dataclass(frozen=True)
class Case:
    """One call of the learner's function: ``args``, the ``expected`` result, and ``why`` it is expected."""

    args: tuple
    expected: Any
    why: str
    kwargs: dict = field(default_factory=dict)
    # The graded cell whose visible part asserts this case, for lessons that split an exercise over several cells.
    kind: str = ""
    # The rule of the exercise's specification this case is an input of (None for cases declared on their own).
    rule: Rule | None = field(default=None, compare=False, repr=False)
    # The arguments as the call must leave them, where the rule says so (``Rule.leaves``).
    left: Any = field(default=None, compare=False, repr=False)

    def call(self, function: Callable) -> Any:
        if self.rule is not None and self.rule.observe is not None:
            return self.rule.in_a_folder(function, self.args, self.kwargs)
        if self.rule is not None and self.rule.adapter is not None:
            return self.rule.adapter(function, *self.args, **self.kwargs)
        return function(*self.args, **self.kwargs)

    def snapshot(self) -> tuple:
        """This case's arguments as ``plain_state`` copies them, to compare with after the call (``left_as``)."""
        return plain_state((self.args, self.kwargs))

    def left_as(self, before: tuple) -> bool:
        """Whether this case's arguments are as ``before`` (their ``snapshot`` taken before the call)."""
        args, kwargs = plain_state(list(self.args)), plain_state(dict(self.kwargs))
        return same_values(args, list(before[0])) and same_values(kwargs, dict(before[1]))

    def left_right(self) -> bool:
        """Whether the arguments are now as this case's rule says a call must leave them (True without one)."""
        if self.rule is None or not self.rule.leaves:
            return True
        return bool(self.rule.left_right(plain_state(list(self.args)), self.left))

    def same(self, got: Any) -> bool:
        """Whether ``got`` is right by this case's rule (its comparison); plain ``==`` for a case without one. A
        value the comparison cannot take (a sparse or meta tensor where numbers are expected) is wrong, as the
        grader has it (``autograder/checks/rules.py``)."""
        try:
            if self.rule is not None:
                return bool(self.rule.same(got, self.expected))
            return bool(got == self.expected)
        except Exception:  # noqa: BLE001 - an answer the comparison cannot take is wrong
            return False

    def returned_an_argument(self, got: Any) -> bool:
        """Whether ``got`` is one of this case's arguments itself, where its rule asks for a new object."""
        return self.rule is not None and self.rule.fresh and any(got is a for a in [*self.args, *self.kwargs.values()])

    def verify(self, function: Callable) -> None:
        """Assert this case as a visible test cell does: call ``function``, then check the error it raises or the
        value it returns by the case's rule; an ``AssertionError`` with the feedback message when it is wrong."""
        name = getattr(function, "__name__", "answer")
        if self.rule is not None and (self.rule.unchanged or self.rule.fresh or self.rule.leaves):
            before = self.snapshot() if self.rule.unchanged else None
            got = self.call(function)
            if before is not None and not self.left_as(before):
                raise AssertionError(message("check.changed_arguments", call=self.describe(name), why=text(self.why)))
            if not self.left_right():
                raise AssertionError(message("check.left_arguments", call=self.describe(name), why=text(self.why)))
            if self.returned_an_argument(got):
                itself = message("check.returned_an_argument", call=self.describe(name), why=text(self.why))
                raise AssertionError(itself)
            if not self.same(got):
                raise AssertionError(self.message(name, got))
            return
        if isinstance(self.expected, Raises):
            try:
                got = self.call(function)
            except self.expected.error:
                return
            raise AssertionError(
                message(
                    "check.should_raise",
                    call=self.describe(name),
                    got=_short(got),
                    error=self.expected.error.__name__,
                    why=text(self.why),
                )
            )
        got = self.call(function)
        if not self.same(got):
            raise AssertionError(self.message(name, got))

    def describe(self, name: str) -> str:
        arguments = ", ".join([*map(_short, self.args), *(f"{k}={_short(v)}" for k, v in self.kwargs.items())])
        if self.rule is not None and self.rule.observe is not None:  # its inputs describe a scenario: see why
            return f"{self.rule.adapter.__name__}({name}, …)"
        if self.rule is not None and self.rule.adapter is not None:
            return f"{self.rule.adapter.__name__}({name}, {arguments})"
        return f"{name}({arguments})"

    def message(self, name: str, got: Any) -> str:
        """The assertion message a visible test shows when this case fails: a summary of what came back and of
        what was expected (shapes and dtypes, never a dump of tensors), and the first place they differ by more
        than exercise ``name``'s tolerance (``Exercise.tolerance``: the one its comparison uses)."""
        tolerance = _tolerance_of(name)
        where = first_difference(got, _compared(self.expected), tolerance=tolerance)
        differs = message("check.differs_at", where=where) if where else ""
        if _is_number(got) and _is_number(self.expected):
            shown_got, shown_expected = (
                format_pair(got, self.expected)
                if _number_difference(got, self.expected, tolerance)
                else (format_number(got), format_number(self.expected))
            )
        else:
            shown_got, shown_expected = summarise(got), summarise(self.expected)
        return message(
            "check.returned",
            call=self.describe(name),
            got=shown_got,
            expected=shown_expected,
            differs=differs,
            why=text(self.why),
        )


@dataclass(frozen=True)
class Call:
    """One input of a rule: ``args`` (and ``kwargs``), and ``why`` its outcome is what it is (the rule's statement
    when empty)."""

    args: tuple
    why: str = ""
    kwargs: dict = field(default_factory=dict)
    # The expected value, when the input was made together with it (a model's chunk gradients and its full-batch
    # gradient); computed by whoever makes the input: the grader, for its hidden inputs. Else the reference's.
    expected: Any = field(default=None, compare=False)


def _calls(items: Sequence) -> list[Call]:
    return [item if isinstance(item, Call) else Call(tuple(item)) for item in items]


@dataclass(frozen=True)
class Rule:
    """One rule of an exercise's specification.

    ``statement``: the sentence of the lesson's text that states the rule (English; its translations in the
    exercise module's ``TRANSLATIONS``). ``kind``: the graded cell that enforces it (its ``grade_id`` is
    ``<exercise>_<kind>``). The expected outcome of an input is ``Raises(raises)`` for an error rule, else the
    value of the rule's reference (kept in ``gpulab_solutions``, never here; recorded for the visible and extra
    inputs), and an answer's value is right when ``same(got, expected)``. Inputs: ``visible()`` (asserted by the
    graded cell and the self-check), ``extra()`` (the self-check's), each a list of ``Call`` or of argument
    tuples; the grader draws more (``gpulab_solutions``). With ``unchanged``, the call must also leave its
    arguments as they were; with ``leaves``, as the reference says (trained weights); with ``fresh``, return none
    of them. A failure in the grader names the rule for the learner by its statement, or by the case of the rule its
    input is (``case_name``), never by the input.

    An exercise whose answer is not a function of plain data (a class: lesson 03's ``LossInForward``) states its
    rules through an ``adapter``: ``adapter(answer, *args, **kwargs)`` builds the rule's scenario from the plain
    inputs, runs the answer in it and returns what the rule compares (the value ``forward`` returns, gradients).
    It is a top-level function of a gpulab module: the grader asks its kernel to run it by name, on the notebook's
    answer, so that the self-check, the visible cell and the grader run the very same scenario; the expected
    outcome is still the rule's reference's.

    A rule whose inputs or outcome are files (lesson 04's checkpoints) also has ``observe``, and then its adapter
    runs in a folder of its own: ``adapter(answer, folder_path, *args, **kwargs)``. Before the call, the process
    that judges writes there the files ``plant(folder_path, *args, **kwargs)`` makes (a checkpoint to load); after
    it, that process reads the folder itself and the outcome compared is ``observe(folder, returned, *args,
    **kwargs)``, ``folder`` a ``Folder`` (listing, bytes, a weights-only load), ``returned`` what the adapter
    returned. The files an answer wrote are thus judged as the judge reads them, never as the answer reports them.
    ``sent(*args, **kwargs) -> args`` picks what of a call's inputs the answer's side gets (a loader gets the model
    it loads into, never what the planted file holds); all of them when None.
    """

    statement: str
    kind: str
    raises: type[BaseException] | None = None
    same: Callable[[Any, Any], bool] = lambda got, expected: bool(got == expected)
    visible: Callable[[], Sequence] = list
    extra: Callable[[], Sequence] = list
    # The call must also leave its arguments as they were (compared with ``same_values``).
    unchanged: bool = False
    # The value returned must be a new object, none of the call's arguments (``is``).
    fresh: bool = False
    # The call must leave its arguments as the reference's ``leaves`` says: the arguments (a list) as they must be
    # afterwards, in ``plain_state`` form; an answer left them right when ``left_right(its arguments afterwards,
    # that list)`` (the trained weights in a model).
    leaves: bool = False
    left_right: Callable[[Any, Any], bool] = lambda got, expected: same_values(got, expected)
    # The cases of the rule the grader's feedback names instead of the statement (fixed texts, translated in the
    # module's ``TRANSLATIONS``), and which of them an input is: ``case_name(*args, **kwargs)``.
    case_names: tuple[str, ...] = ()
    case_name: Callable[..., str] | None = None
    # How a call reaches an answer that is not called with the inputs themselves (above).
    adapter: Callable[..., Any] | None = None
    # A rule of files (above): what the judge plants before the call, and what it reads afterwards.
    plant: Callable[..., dict[str, bytes]] | None = None
    observe: Callable[..., Any] | None = None
    # What of a call's inputs the answer's side gets, ``sent(*args, **kwargs) -> args`` (all of them when None): a
    # loader's call keeps the description of the file it must read with the judge.
    sent: Callable[..., tuple] | None = None
    # Seconds of CPU time the self-check gives an answer on one input of the rule before it stops it
    # (``time_limit``; a call that waits, at most ``WALL_TIME_FACTOR`` times as many of wall time): for inputs far
    # too large to run or play, where only a count finishes. The grader gives each call the same seconds in the
    # kernel and makes no later call of the cell (its cell's time bounds an answer that ignores the timer).
    seconds: float | None = None

    def named(self, call: Call) -> str:
        """What a failure on ``call`` names for the learner: its case, one of ``case_names``, else the rule's
        statement (also for an input the case names cannot describe)."""
        if self.case_name is None:
            return self.statement
        try:
            name = self.case_name(*call.args, **call.kwargs)
        except Exception:  # noqa: BLE001 - an input outside the names' reach is named by the statement
            return self.statement
        return name if name in self.case_names else self.statement

    @property
    def key(self) -> str:
        """The rule's name among its exercise's rules: its kind and statement."""
        return f"{self.kind}: {self.statement}"

    def calls(self, which: str) -> list[Call]:
        """The ``"visible"`` or ``"extra"`` inputs, as ``Call`` objects."""
        return _calls(getattr(self, which)())

    def case(self, call: Call, expected: Any = None, left: Any = None) -> Case:
        """The case of ``call`` whose expected outcome is ``expected`` (``Raises`` for an error rule, whatever is
        given) and whose arguments must be left as ``left``."""
        why = call.why or self.statement
        expected = Raises(self.raises) if self.raises is not None else expected
        return Case(call.args, expected, why, call.kwargs, self.kind, self, left if self.leaves else None)

    def planted(self, path: str, call: Call) -> dict[str, bytes]:
        """The files a rule of files plants in the folder ``path`` before ``call`` (relative name -> bytes)."""
        return {} if self.plant is None else dict(self.plant(path, *call.args, **call.kwargs))

    def in_a_folder(self, answer: Callable, args: tuple, kwargs: dict) -> Any:
        """A rule of files run where the self-check or the visible cell runs: plant, call the adapter in a fresh
        temporary folder, and observe that folder (removed afterwards)."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="gpulab-check-") as path:
            folder = Folder(path)
            for name, data in self.planted(path, Call(args, kwargs=kwargs)).items():
                folder.write_bytes(name, data)
            returned = self.adapter(answer, path, *self.sent_args(Call(args, kwargs=kwargs)))
            return self.observe(folder, returned, *args, **kwargs)

    def sent_args(self, call: Call) -> tuple:
        """The arguments the adapter of a rule of files gets after the folder's path (``sent``)."""
        if self.sent is None:
            return tuple(call.args)
        return tuple(self.sent(*call.args, **call.kwargs))


# Where the expected outcomes of the visible and extra inputs are, computed from the references when the lessons
# are built (``gpulab_solutions.recorded``): {exercise: {rule key: {"visible"|"extra": [(expected, left), ...]}}}.
RECORDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exercises", "expected.pt")
_recorded_outcomes: dict | None = None


def recorded_outcomes() -> dict:
    """The recorded expected outcomes (``RECORDED``), read once per kernel."""
    global _recorded_outcomes
    if _recorded_outcomes is None:
        import warnings

        import torch

        with warnings.catch_warnings():  # torch 2.4-2.5 warn about weights_only=False: gpulab's own file
            warnings.simplefilter("ignore")
            _recorded_outcomes = torch.load(RECORDED, map_location="cpu", weights_only=False)
    return _recorded_outcomes


@dataclass(frozen=True)
class ArgumentAt:
    """In a recorded outcome: the call's own argument at ``path`` (``("args", 0, "key")``...), where the
    reference gave back an argument itself (a rule that wants the object, not a copy)."""

    path: tuple


def _followed(call: Call, path: tuple) -> Any:
    value: Any = {"args": call.args, "kwargs": call.kwargs}
    for step in path:
        value = value[step]
    return value


def with_arguments(value: Any, call: Call) -> Any:
    """``value`` with each ``ArgumentAt`` in it replaced by that argument of ``call`` (containers rebuilt)."""
    if isinstance(value, ArgumentAt):
        return _followed(call, value.path)
    if type(value) in (list, tuple):
        return type(value)(with_arguments(item, call) for item in value)
    if type(value) in (dict, OrderedDict):
        return type(value)((key, with_arguments(item, call)) for key, item in value.items())
    return value


def recorded_cases(exercise_name: str, rule: Rule, which: str) -> list[Case]:
    """The cases of ``rule``'s ``which`` inputs with their recorded expected outcomes."""
    calls = rule.calls(which)
    if rule.raises is not None:
        return [rule.case(call) for call in calls]
    outcomes = recorded_outcomes().get(exercise_name, {}).get(rule.key, {}).get(which, [])
    if len(outcomes) != len(calls):
        raise RuntimeError(
            f"gpulab's recorded outcomes for {exercise_name!r} ({rule.key}) do not match its {which} inputs: "
            "this gpulab was installed from a build whose exercises/expected.pt is stale"
        )
    return [
        rule.case(call, *(with_arguments(copy.deepcopy(part), call) for part in outcome))
        for call, outcome in zip(calls, outcomes, strict=True)
    ]


class Folder:
    """The folder a rule of files runs in, as the process that judges reads it: names, the bytes of a regular file
    (a link is not followed), and a checkpoint loaded with ``weights_only=True`` onto the CPU. The grader has its
    own, which reads through ``autograder/checks/files.py`` (capped, every folder opened without following a link).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)

    def listdir(self, relative: str = ".") -> list[str]:
        return sorted(os.listdir(os.path.join(self.path, relative)))

    def read_bytes(self, relative: str) -> bytes:
        import stat

        descriptor = os.open(os.path.join(self.path, relative), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(descriptor, "rb") as handle:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise OSError(f"{relative} is not a regular file")
            return handle.read()

    def load(self, relative: str) -> Any:
        """``torch.load(..., weights_only=True)`` onto the CPU of a file in the format ``torch.save`` writes (a zip
        archive); the legacy format (``_use_new_zipfile_serialization=False``) is refused, as the grader refuses it."""
        import io
        import zipfile

        import torch

        data = self.read_bytes(relative)
        if not zipfile.is_zipfile(io.BytesIO(data)):
            raise ValueError(f"{relative} is not in torch.save's format (a zip archive)")
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)

    def write_bytes(self, relative: str, data: bytes) -> None:
        path = os.path.join(self.path, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)


@dataclass
class Hint:
    """A targeted hint: shown when ``applies(case, got)`` says the answer has this typical mistake."""

    applies: Callable[[Case, Any], bool]
    text: str


@dataclass
class Exercise:
    """A self-check: visible cases (shared with the nbgrader visible test), extra cases and hints."""

    name: str
    visible_cases: Callable[[], list[Case]] = list
    extra_cases: Callable[[], list[Case]] = list
    same: Callable[[Any, Any], bool] = lambda got, expected: got == expected
    # The tolerance ``same`` compares numbers with (None: exactly), for the failure messages.
    tolerance: Tolerance | None = None
    hints: Sequence[Hint] = ()
    general_hint: str = ""
    # The specification: the cases of its rules come after the cases declared on their own (above).
    rules: Sequence[Rule] = ()
    # Words its observations and expected values show in feedback (a key such as "temporary files", a label such as
    # "<the full-batch gradients of {names}>"), translated like its hints (TRANSLATIONS of its module).
    shown_words: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.rules:
            own_visible, own_extra = self.visible_cases, self.extra_cases
            rules = tuple(self.rules)
            name = self.name
            self.visible_cases = lambda: [
                *own_visible(),
                *(case for rule in rules for case in recorded_cases(name, rule, "visible")),
            ]
            self.extra_cases = lambda: [
                *own_extra(),
                *(case for rule in rules for case in recorded_cases(name, rule, "extra")),
            ]

    def rules_of(self, kind: str) -> list[Rule]:
        """The rules the graded cell of ``kind`` enforces."""
        return [rule for rule in self.rules if rule.kind == kind]

    def run(self, function: Callable) -> CheckResult:
        if not callable(function):
            return CheckResult(self.name, False, message("check.not_a_function", name=self.name, got=_short(function)))
        cases = [*self.visible_cases(), *self.extra_cases()]
        for case in cases:
            outcome = _outcome(self, case, function)
            if outcome is not None:
                return outcome
        return CheckResult(self.name, True, message("check.correct", count=len(cases)))


@dataclass(repr=False)
class CheckResult:
    """What a check found; renders as rich text in Jupyter and plain text elsewhere."""

    name: str
    passed: bool
    detail: str
    hint: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        mark = "✓" if self.passed else "✗"
        text = f"{mark} {self.name}: {self.detail}"
        return text + (f"\n  {message('check.hint_label')}: {self.hint}" if self.hint else "")

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = "#1b7f3b" if self.passed else "#b3261e"
        mark = message("check.passed_badge" if self.passed else "check.failed_badge")
        body = f"<div style='white-space:pre-wrap'>{html.escape(self.detail)}</div>"
        if self.hint:
            body += f"<div><b>{html.escape(message('check.hint_label'))}:</b> {html.escape(self.hint)}</div>"
        return (
            f"<div class='gpulab-check' style='border-left:4px solid {colour};padding:4px 10px'>"
            f"<b style='color:{colour}'>{mark}</b> — <code>{html.escape(self.name)}</code>{body}</div>"
        )


def same_values(got: Any, expected: Any) -> bool:
    """Equal as plain data: tensors (exactly ``torch.Tensor``) of the same shape, dtype and values; lists, tuples,
    dicts and ``OrderedDict``s of exactly those types, equal item by item (dicts in the same key order);
    ``True`` and ``False`` only themselves (not ``1`` and ``0``); anything else by ``==``."""
    import torch

    if type(expected) is bool:
        return got is expected
    if isinstance(expected, torch.Tensor):
        return (
            type(got) is torch.Tensor
            and got.shape == expected.shape
            and got.dtype == expected.dtype
            and bool(torch.equal(got.detach().cpu(), expected.detach().cpu()))
        )
    if type(expected) in (list, tuple):
        return (
            type(got) is type(expected)
            and len(got) == len(expected)
            and all(same_values(g, e) for g, e in zip(got, expected, strict=True))
        )
    if type(expected) in (dict, OrderedDict):
        return (
            type(got) is type(expected)
            and list(got) == list(expected)
            and all(same_values(got[k], expected[k]) for k in expected)
        )
    try:
        return bool(got == expected)
    except Exception:  # noqa: BLE001 - an uncomparable value differs
        return False


def plain_state(value: Any) -> Any:
    """What of ``value`` a rule that asks for unchanged arguments compares (with ``same_values``), copied: a
    tensor's values (a plain ``torch.Tensor``); a module as ``{"parameters": [[name, weight, .grad or None,
    requires_grad], ...], "training": [[name, training], ...]}``, each submodule's mode under its name (``""``: the
    module itself; a deep copy of a module loses ``.grad``); lists, tuples, dicts and ``OrderedDict``s item by item;
    anything else a deep copy, or the value itself when it cannot be copied. The grader's probes report arguments
    after a call in this form (``autograder/checks/rules.py``)."""
    import torch
    from torch import nn

    if isinstance(value, torch.Tensor):
        return value.detach().clone().as_subclass(torch.Tensor)
    if isinstance(value, nn.Module):
        return {
            "parameters": [
                [
                    name,
                    plain_state(parameter),
                    None if parameter.grad is None else plain_state(parameter.grad),
                    parameter.requires_grad,
                ]
                for name, parameter in value.named_parameters()
            ],
            "training": [[name, module.training] for name, module in value.named_modules()],
        }
    if type(value) in (list, tuple):
        return type(value)(plain_state(item) for item in value)
    if type(value) in (dict, OrderedDict):
        return type(value)((key, plain_state(item)) for key, item in value.items())
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - a value that cannot be copied is compared as itself
        return value


class TooSlow(Exception):
    """An answer the self-check stopped on one input, past its rule's ``seconds`` (lesson 03's counts)."""


# a call stopped by ``time_limit`` has used its seconds of CPU time, or waited this many times as long
WALL_TIME_FACTOR = 6
MIN_RING = 0.01  # seconds: the timer's shortest ring; CPU time within this of the limit counts as the limit


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``TooSlow`` in the block once it has used ``seconds`` of this process's CPU time, or once
    ``WALL_TIME_FACTOR`` times as many seconds of wall time have passed (a block that waits: a sleep, a lock).

    CPU time is the block's own work, whatever else the machine runs: a kernel slowed by other kernels on the same
    cores (a grading worker's neighbours, where no CPU controller shares the cores out) is not stopped for it. The
    wall time is checked by a real-time signal timer, which rings when the block could have used its seconds and is
    wound on by what it has not used, so only in the main thread of a process that has one (a notebook's kernel runs
    cells there), and only where no timer of the caller's would ring first (a test's time-out keeps its own);
    elsewhere the block runs without a limit."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    earlier = signal.getitimer(signal.ITIMER_REAL) if usable else (0.0, 0.0)
    if not seconds or not usable or 0 < earlier[0] <= seconds * WALL_TIME_FACTOR:
        yield
        return
    armed = True  # a ring after the block has ended (before the timer is stopped below) stops nothing
    started, cpu_started = time.monotonic(), time.process_time()
    last = started + seconds * WALL_TIME_FACTOR

    def stop(signum, frame):
        if not armed:
            return
        unused, now = seconds - (time.process_time() - cpu_started), time.monotonic()
        if unused <= MIN_RING or now >= last:
            raise TooSlow(message("check.too_slow", seconds=format_number(seconds)))
        signal.setitimer(signal.ITIMER_REAL, max(min(unused, last - now), MIN_RING))

    handler = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler if handler is not None else signal.SIG_DFL)
        if earlier[0]:
            signal.setitimer(signal.ITIMER_REAL, max(earlier[0] - (time.monotonic() - started), 1e-3), earlier[1])


def _outcome(exercise: Exercise, case: Case, function: Callable) -> CheckResult | None:
    """None when the case passes; otherwise a failed result with the best hint."""
    name = exercise.name
    before = case.snapshot() if case.rule is not None and case.rule.unchanged else None
    try:
        with time_limit(case.rule.seconds if case.rule is not None else None):
            got = case.call(function)
    except NotImplementedError:
        return CheckResult(name, False, message("check.not_written"))
    except Exception as error:  # noqa: BLE001 - any error is feedback for the learner
        if isinstance(case.expected, Raises) and isinstance(error, case.expected.error):
            return None
        where = traceback.format_exception_only(error)[-1].strip()
        return CheckResult(
            name,
            False,
            message("check.raised", call=case.describe(name), error=where, expected=_short(case.expected)),
            _hint_for(exercise, case, error),
        )
    if isinstance(case.expected, Raises):
        return CheckResult(
            name,
            False,
            message(
                "check.should_raise",
                call=case.describe(name),
                got=_short(got),
                error=case.expected.error.__name__,
                why=text(case.why),
            ),
            _hint_for(exercise, case, got),
        )
    if before is not None and not case.left_as(before):
        changed = message("check.changed_arguments", call=case.describe(name), why=text(case.why))
        return CheckResult(name, False, changed, _hint_for(exercise, case, got))
    if not case.left_right():
        left = message("check.left_arguments", call=case.describe(name), why=text(case.why))
        return CheckResult(name, False, left, _hint_for(exercise, case, got))
    if case.returned_an_argument(got):
        itself = message("check.returned_an_argument", call=case.describe(name), why=text(case.why))
        return CheckResult(name, False, itself, _hint_for(exercise, case, got))
    if case.same(got) if case.rule is not None else exercise.same(got, case.expected):
        return None
    return CheckResult(name, False, case.message(name, got), _hint_for(exercise, case, got))


def _hint_for(exercise: Exercise, case: Case, got: Any) -> str:
    for hint in exercise.hints:
        try:
            if hint.applies(case, got):
                return text(hint.text)
        except Exception:  # noqa: BLE001 - a hint predicate must never hide the feedback
            continue
    return text(exercise.general_hint)


def _short(value: Any, limit: int = 120) -> str:
    text = summarise(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summarise(value: Any, depth: int = 2, items: int = 3) -> str:
    """A short description of a value for feedback: a tensor by its shape and dtype (and its values when it is a
    vector of at most 6), a list, tuple or dict by its length and its first ``items`` entries, described
    ``depth`` levels deep; anything else by its ``repr``, cut at 80 characters."""
    import torch

    if isinstance(value, torch.Tensor):
        shape, dtype = list(value.shape), str(value.dtype).removeprefix("torch.")
        unusual = _unusual_kind(value)
        if unusual:  # no values to show
            return f"tensor(shape={shape}, dtype={dtype}, {unusual})"
        if value.dim() <= 1 and value.numel() <= 6:
            values = value.tolist()
            shown = format_number(values) if value.dim() == 0 else f"[{', '.join(map(format_number, values))}]"
            return f"tensor({shown}, dtype={dtype})"
        return f"tensor(shape={shape}, dtype={dtype})"
    if isinstance(value, (list, tuple, dict)) and _describes_itself(value):
        return _short_repr(value)
    if isinstance(value, (list, tuple, dict)):
        kind = type(value).__name__
        if depth == 0:
            return f"<{kind} of {len(value)}>"
        entries = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        shown = [
            f"{_shown_repr(key)}: {summarise(item, depth - 1, items)}"
            if isinstance(value, dict)
            else summarise(item, depth - 1)
            for key, item in entries[:items]
        ]
        more = [f"... {len(entries) - items} more"] if len(entries) > items else []
        opening, closing = "{}" if isinstance(value, dict) else "()" if isinstance(value, tuple) else "[]"
        if kind not in ("list", "tuple", "dict"):
            opening = kind + opening  # e.g. OrderedDict{...}
        return opening + ", ".join(shown + more) + closing
    if _is_number(value):
        return format_number(value)
    return _short_repr(value)


def _short_repr(value: Any, limit: int = 80) -> str:
    text = _shown_repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown_repr(value: Any) -> str:
    """``repr(value)``; a string an exercise's observation holds (a key such as ``"temporary files"``, a finding
    such as ``"no file at path"``) in the learner's language (``gpulab.text``: itself when it has no translation)."""
    return repr(messages.text(value)) if isinstance(value, str) else repr(value)


def _describes_itself(value: Any) -> bool:
    """A container of a class of its own with its own ``__repr__`` (an exercise's short label for its cases)."""
    kind = type(value)
    return getattr(kind, "__module__", None) not in ("builtins", "collections") and kind.__repr__ not in (
        list.__repr__,
        tuple.__repr__,
        dict.__repr__,
    )


def _is_number(value: Any) -> bool:
    import numbers

    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def format_number(value: Any, digits: int = 6) -> str:
    """A number as a learner reads it: an int as it is, a float to ``digits`` significant digits, still written as
    a float (``3.0``, not ``3``)."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return repr(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    number = float(value)
    shown = f"{number:.{digits}g}"
    if shown.lstrip("-").isdigit():
        shown += ".0"
    return shown


def format_pair(got: Any, expected: Any, digits: int = 6) -> tuple[str, str]:
    """``got`` and ``expected`` to the precision that tells them apart: ``digits`` significant digits, more only
    when they would print alike (up to every digit of the floats)."""
    for precision in range(digits, 16):
        shown = format_number(got, precision), format_number(expected, precision)
        if shown[0] != shown[1] or got == expected:
            return shown
    return repr(got), repr(expected)  # the shortest text that gives each float back


def _kind_of_number(value: Any) -> str:
    import numbers

    kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, numbers.Integral) else "float"
    return message(f"diff.{kind}")


def _instead(got: str, expected: str, key: str = "diff.instead") -> str:
    """ "``got`` instead of ``expected``" in the lesson's language (``key``: a message that names what differs)."""
    return message(key, got=got, expected=expected)


def _a(kind: str) -> str:
    """A type named as the messages say it ("a list"; in Japanese the name alone)."""
    return message("diff.a_kind", kind=kind)


def _number_difference(got: Any, expected: Any, tolerance: Tolerance | None) -> str:
    """What differs between two numbers ("" when they count as equal)."""
    import numbers

    if isinstance(got, bool) != isinstance(expected, bool) or (
        isinstance(expected, numbers.Integral) and not isinstance(got, numbers.Integral)
    ):
        if got == expected:
            return _instead(
                message("diff.with_kind", value=format_number(got), kind=_kind_of_number(got)),
                message("diff.with_kind", value=format_number(expected), kind=_kind_of_number(expected)),
            )
    equal = tolerance.close(float(got), float(expected)) if tolerance is not None else got == expected
    if equal:
        return ""
    return _instead(*format_pair(got, expected))


def _tensor_difference(got: Any, expected: Any, tolerance: Tolerance | None) -> tuple[list[int], str] | None:
    """The index of the first element of two tensors of one shape that differs (beyond ``tolerance`` for floating
    tensors), and what differs there; None when none does."""

    got, expected = got.detach().cpu(), expected.detach().cpu()
    floating = got.is_floating_point() or expected.is_floating_point()
    if tolerance is not None and floating:
        g, e = got.double(), expected.double()
        bound = tolerance.absolute + tolerance.relative * e.abs().clamp(min=tolerance.floor)
        unequal = ~((g - e).abs() <= bound)
    else:
        unequal = got != expected
    if got.dim() == 0:
        unequal = unequal.reshape(1)
    positions = unequal.nonzero()
    if not len(positions):
        return None
    index = tuple(positions[0].tolist())[: got.dim()]
    g, e = got[index].item(), expected[index].item()
    if isinstance(g, float) or isinstance(e, float):
        g, e = float(g), float(e)
    return list(index), _instead(*format_pair(g, e))


def _unusual_kind(tensor: Any) -> str:
    """What makes ``tensor`` no ordinary dense tensor with values (its sparse layout, the ``meta`` device, being
    quantised); "" for an ordinary one."""
    import torch

    if tensor.layout != torch.strided:
        return str(tensor.layout).removeprefix("torch.")
    if tensor.device.type == "meta":
        return "meta"
    return "quantized" if tensor.is_quantized else ""


def first_difference(got: Any, expected: Any, path: str = "", tolerance: Tolerance | None = None) -> str:
    """Where ``got`` first differs from ``expected``, as an index path (``[1]['labels']``) and what differs
    there (type, length, a missing or extra key, shape, dtype or the first differing element); "" when no
    difference is found. Numbers (and floating tensors' elements) within ``tolerance`` count as equal, and the
    numbers shown have the digits it takes to see the difference."""
    import torch

    here = path or message("diff.top_level")

    def at(where: str, what: str) -> str:
        return message("diff.at", where=where, what=what)

    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return at(here, _instead(_a(type(got).__name__), _a("tensor")))
        if got.shape != expected.shape:
            return at(here, _instead(str(list(got.shape)), str(list(expected.shape)), "diff.shape"))
        unusual = _unusual_kind(got)
        if unusual:  # no values to compare element by element
            return at(here, message("diff.unusual_tensor", kind=unusual))
        found = _tensor_difference(got, expected, tolerance)
        if found is not None:
            index, what = found
            return at(f"{path}{index}" if index else here, what)
        if got.dtype != expected.dtype:
            return at(here, _instead(str(got.dtype), str(expected.dtype), "diff.dtype"))
        return ""
    if isinstance(expected, (list, tuple)):
        base = list if isinstance(expected, list) else tuple
        if not isinstance(got, base):
            return at(here, _instead(_a(type(got).__name__), _a(base.__name__)))
        for index, (g, e) in enumerate(zip(got, expected, strict=False)):
            found = first_difference(g, e, f"{path}[{index}]", tolerance)
            if found:
                return found
        if len(got) != len(expected):
            return at(here, _instead(str(len(got)), str(len(expected)), "diff.entries"))
        return ""
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return at(here, _instead(_a(type(got).__name__), _a("dict")))
        for key in expected:
            if key not in got:
                return at(here, message("diff.missing_key", name=_shown_repr(key)))
            found = first_difference(got[key], expected[key], f"{path}[{_shown_repr(key)}]", tolerance)
            if found:
                return found
        extra = [key for key in got if key not in expected]
        return at(here, message("diff.extra_key", name=_shown_repr(extra[0]))) if extra else ""
    if _is_number(expected) or isinstance(expected, bool):
        if not (_is_number(got) or isinstance(got, bool)):
            return at(here, _instead(summarise(got), format_number(expected))) if path else ""
        found = _number_difference(got, expected, tolerance)
        return at(here, found) if found and path else ""
    try:
        equal = bool(got == expected)
    except Exception:  # noqa: BLE001 - an uncomparable value simply differs
        equal = False
    return "" if equal else (at(here, _instead(summarise(got), summarise(expected))) if path else "")


def _compared(expected: Any) -> Any:
    """What a returned value is compared with: an expected value that carries more requirements (the trained
    weights, arguments left unchanged) names it ``expected``."""
    return getattr(expected, "expected", expected)


def _tolerance_of(name: str) -> Tolerance | None:
    """The tolerance exercise ``name`` compares numbers with (None for an unknown name or an exact exercise)."""
    try:
        return exercise(name).tolerance
    except AttributeError:
        return None


def _registry() -> dict[str, Exercise]:
    exercises: dict[str, Exercise] = {}
    for module_name in _LESSON_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue
        exercises.update({exercise.name: exercise for exercise in module.EXERCISES})
        for language, texts in getattr(module, "TRANSLATIONS", {}).items():
            messages.TEXTS.setdefault(language, {}).update(texts)
    return exercises


def exercise(name: str) -> Exercise:
    """The ``Exercise`` called ``name`` (e.g. ``"chunk_sizes"``)."""
    exercises = _registry()
    if name not in exercises:
        raise AttributeError(f"gpulab.check has no exercise {name!r}; known: {', '.join(sorted(exercises))}")
    return exercises[name]


def cases(name: str, kind: str | None = None) -> list[Case]:
    """The visible cases of exercise ``name``: what its nbgrader visible test cells assert.

    With ``kind``, only the cases of that kind (the graded cell that asserts them, e.g. lesson 03's
    ``gpulab.check.cases("LossInForward", kind="memory")``). A kind the exercise does not have is an error, so a
    visible test cell with a mistyped kind fails instead of asserting nothing.
    """
    visible = exercise(name).visible_cases()
    if kind is None:
        return visible
    chosen = [case for case in visible if case.kind == kind]
    if not chosen:
        kinds = sorted({case.kind for case in visible if case.kind is not None})
        raise ValueError(f"exercise {name!r} has no visible case of kind {kind!r}; its kinds: {kinds}")
    return chosen


def run(name: str, function: Callable) -> CheckResult:
    """Check ``function`` against exercise ``name`` and return the result without displaying it."""
    return exercise(name).run(function)


def show(result: Any) -> None:
    """Display a result as rich text in Jupyter, or print it as plain text elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(result)
            return
    except ImportError:
        pass
    print(result)


def hint(name: str) -> None:
    """Show the general hint of exercise ``name``."""
    show(CheckResult(name, False, message("check.hint_intro"), text(exercise(name).general_hint)))


def solutions():
    """The package of solutions (``gpulab_solutions``) where self-study installed it, else None (a class)."""
    try:
        module = importlib.import_module("gpulab_solutions")
    except ImportError:
        return None
    # a folder of that name with nothing in it (the grading sandbox lays one over an installed copy) is none
    return module if hasattr(module, "solution_of") else None


def solution(name: str, confirm: bool = False) -> None:
    """Show a reference solution of exercise ``name`` from ``gpulab_solutions``; it asks for ``confirm=True``
    first. Where that package is not installed (a graded class), it says so."""
    exercise(name)  # an unknown name is an error before anything else
    installed = solutions()
    if installed is None:
        show(CheckResult(name, False, message("check.solutions_off")))
        return
    if not confirm:
        show(CheckResult(name, False, message("check.sure", name=name)))
        return
    show(_Solution(name, installed.solution_of(name)))


_NOT_GIVEN = object()


def quiz(lesson: str, answers: Any = _NOT_GIVEN) -> None:
    """Self-check of lesson ``lesson``'s quiz (``"01"``), declared in ``gpulab.exercises.quizzes``: right or not
    yet per question, with a hint to the section to re-read (never the right option) for a wrong answer, from the
    salted digests of the right answers that ``gpulab_solutions`` holds. Without that package (a class), it only
    says whether each answer can be read. Grades nothing.

    ``answers`` defaults to the caller's global ``quiz_answers`` (the notebook's), so that the lesson's cell
    ``gpulab.check.quiz("01")`` runs, and says what is missing, before the learner has answered."""
    if answers is _NOT_GIVEN:
        answers = sys._getframe(1).f_globals.get("quiz_answers")
    show(quiz_report(lesson, answers))


def quiz_report(lesson: str, answers: Any, language: str | None = None):
    """What ``quiz()`` shows (a ``gpulab.quiz.QuizReport``): right or wrong where ``gpulab_solutions`` is
    installed, the answers' form only elsewhere."""
    from gpulab import quiz as quizzes

    installed = solutions()
    digests = None if installed is None else installed.quiz_digests(lesson)
    return quizzes.self_check(lesson, answers, language, digests=digests)


@dataclass
class _Solution:
    name: str
    code: str

    def __str__(self) -> str:
        return f"{message('check.solution_of', name=self.name)}\n{self.code}"

    def _title_html(self) -> str:
        name = html.escape(self.name)
        return html.escape(message("check.solution_of", name=self.name)).replace(name, f"<code>{name}</code>", 1)

    def _repr_html_(self) -> str:
        return f"<div><b>{self._title_html()}</b><pre>{html.escape(self.code)}</pre></div>"


def __getattr__(name: str) -> Callable[[Callable], None]:
    """``check.chunk_sizes(chunk_sizes)``: run the self-check of that exercise and show the result."""
    if name.startswith("__"):
        raise AttributeError(name)
    known = exercise(name)

    def check_exercise(function: Callable) -> None:
        show(known.run(function))

    check_exercise.__name__ = name
    check_exercise.__doc__ = f"Check your `{name}` and show a pass or a hint (grades nothing)."
    return check_exercise
