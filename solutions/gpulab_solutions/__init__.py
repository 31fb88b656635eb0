"""The course's solutions: what only self-study and the instructor hold (never a class's kernel).

gpulab, the package a learner's kernel imports, declares each exercise by its rules (``gpulab.check.Rule``): the
lesson's statement, the visible and extra inputs, the comparison, the hints. What would give an answer away lives
here instead, per lesson module (``gpulab_solutions.<lesson>``):

* each rule's ``Answers``: its ``reference`` (the expected outcome of an input), its ``hidden`` draws (the
  grader's inputs beyond the visible ones) and, for a rule that asks what a call leaves in its arguments, its
  ``leaves``;
* each exercise's reference solution (``solution_of``: what ``gpulab.check.solution`` shows in self-study);
* the salted digests of the quizzes' right answers (``quiz_digests``: the quiz's self-check in self-study).

The grader computes every expected outcome in its own process from here (``autograder/checks/rules.py``); the
self-check reads the outcomes of its visible and extra inputs from gpulab's ``exercises/expected.pt``, recorded
from here when the lessons are built (``gpulab_solutions.recorded``).
"""

from __future__ import annotations

import functools
import importlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpulab import check
from gpulab.check import Call, Raises, Rule

LESSON_MODULES = ("splitting", "gradient_averaging", "gpu0_imbalance", "checkpoints")


def no_inputs(rng: random.Random) -> list:
    return []


@dataclass(frozen=True)
class Answers:
    """What a rule's answer key holds: ``reference(*args, **kwargs)``, the expected value of an input (None for a
    rule of errors: its outcome is ``Raises``); ``hidden(rng)``, the grader's own inputs (a list of ``Call`` or
    of argument tuples); ``leaves(*args, **kwargs)``, the arguments as a call must leave them (``Rule.leaves``)."""

    reference: Callable[..., Any] | None = None
    hidden: Callable[[random.Random], Sequence] = no_inputs
    leaves: Callable[..., Any] | None = None


def for_rules(rules: Sequence[Rule], *answers: Answers) -> dict[str, Answers]:
    """``{rule.key: answers}`` for ``rules`` and their ``answers``, in the same order (one each)."""
    if len(rules) != len(answers):
        raise ValueError(f"{len(rules)} rules but {len(answers)} answers")
    return {rule.key: answer for rule, answer in zip(rules, answers, strict=True)}


def _modules():
    return [importlib.import_module(f"{__name__}.{name}") for name in LESSON_MODULES]


@functools.cache  # read by the grader for every call it judges: merged once
def _answers() -> dict[str, dict[str, Answers]]:
    found: dict[str, dict[str, Answers]] = {}
    for module in _modules():
        found.update(module.ANSWERS)
    return found


def answers(exercise_name: str, rule: Rule) -> Answers:
    """The answer key of ``rule`` of exercise ``exercise_name``."""
    table = _answers().get(exercise_name, {})
    if rule.key not in table:
        raise KeyError(f"no answers for {exercise_name!r}'s rule {rule.key!r}")
    return table[rule.key]


def expected(exercise_name: str, rule: Rule, call: Call) -> Any:
    """The expected outcome of ``call`` under ``rule``: ``Raises`` for a rule of errors, the value made with the
    input (``Call.expected``), else the reference's value."""
    if rule.raises is not None:
        return Raises(rule.raises)
    if call.expected is not None:
        return call.expected
    return answers(exercise_name, rule).reference(*call.args, **call.kwargs)


def left(exercise_name: str, rule: Rule, call: Call) -> Any:
    """The arguments of ``call`` as the call must leave them (``Rule.leaves``), or None for a rule without."""
    if not rule.leaves:
        return None
    return answers(exercise_name, rule).leaves(*call.args, **call.kwargs)


def drawn_calls(exercise_name: str, rule: Rule, rng: random.Random) -> list[Call]:
    """The grader's inputs of ``rule``: its visible ones, then those drawn with ``rng``."""
    hidden = answers(exercise_name, rule).hidden(rng)
    return [*rule.calls("visible"), *(item if isinstance(item, Call) else Call(tuple(item)) for item in hidden)]


def solution_of(name: str) -> str:
    """The reference solution of exercise ``name``: code a self-study learner may paste into the lesson."""
    check.exercise(name)  # an unknown name fails as gpulab.check says
    for module in _modules():
        if name in module.SOLUTIONS:
            return module.SOLUTIONS[name]
    raise KeyError(f"no solution for {name!r}")


def quiz_digests(lesson: str) -> dict[str, tuple[str, str]]:
    """``{question key: (salt, digest)}`` of the right answers of ``lesson``'s quiz (its assignment name)."""
    from gpulab.quiz import quiz_of

    from gpulab_solutions.quizzes import DIGESTS

    return dict(DIGESTS[quiz_of(lesson).lesson])
