"""A graded cell's verdict from its exercise's specification (``gpulab.check.Rule``): one truth for all.

The rules that the self-check and the visible test cell assert are the rules this grader enforces: for each rule of the
cell, the kernel calls the notebook's function on the rule's visible inputs and on more inputs drawn under the same rule
(``gpulab_solutions.drawn_calls``: the instructor's package, never the kernel's); the expected outcome is computed here,
in the grader's process (the rule's reference in ``gpulab_solutions``, or ``Raises``), and compared with the rule's own
comparison on the decoded answer (plain data: ``wire.py``). Nothing the kernel says about itself enters the verdict.

A failure names its rule for the learner (``expect``'s ``rule``) by the rule's statement, the lesson's own sentence,
or by the case of the rule its input is (``Rule.case_name``: fixed texts declared beside the rule); their Japanese
is the exercise module's ``TRANSLATIONS``, so feedback needs no second copy of a rule (``rule_texts`` finds them
among gpulab's texts) and never names the input, hidden or not.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable

import gpulab_solutions
from gpulab import check as gpulab_check
from gpulab.check import Call, Raises, Rule, plain_state, same_values

from autograder.checks import CheckFailed, TooSlow, expect, raised_on

SHOWN = 120  # characters of a value quoted in a failure


def _pieces(value):
    """``repr(value)`` in pieces, produced lazily: containers and texts of a decoded answer (up to 16 M characters,
    200,000 nodes) are written only as far as a failure quotes them."""
    kind = type(value)
    if kind is str:
        yield repr(value) if len(value) <= SHOWN else repr(value[:SHOWN])
    elif kind is list or kind is tuple:
        yield "[" if kind is list else "("
        for index, item in enumerate(value):
            yield ", " if index else ""
            yield from _pieces(item)
        yield "]" if kind is list else ("," if len(value) == 1 else "") + ")"
    elif kind is dict or (kind is OrderedDict and value):
        pairs = kind is OrderedDict and sys.version_info < (3, 12)  # OrderedDict([('k', v)]) until 3.12
        yield "{" if kind is dict else "OrderedDict([" if pairs else "OrderedDict({"
        for index, (key, item) in enumerate(dict.items(value)):
            yield ", " if index else ""
            yield "(" if pairs else ""
            yield from _pieces(key)
            yield ", " if pairs else ": "
            yield from _pieces(item)
            yield ")" if pairs else ""
        yield "}" if kind is dict else "])" if pairs else "})"
    else:
        try:
            yield repr(value)
        except Exception:  # noqa: BLE001 - a decoded value whose repr fails (a tensor of bits) is shown by its type
            yield f"<{type(value).__name__}>"


def _show(value) -> str:
    """``repr(value)``, cut at ``SHOWN`` characters, without writing more of it than that."""
    text = ""
    for piece in _pieces(value):
        text += piece
        if len(text) > SHOWN:
            break
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def _describe(name: str, call: Call) -> str:
    arguments = [*map(_show, call.args), *(f"{key}={_show(value)}" for key, value in call.kwargs.items())]
    return f"{name}({', '.join(arguments)})"


def _left_right(name: str, rule: Rule, left, call: Call) -> bool:
    """Whether the arguments the kernel reports after ``call`` are as ``rule`` says it must leave them (a report
    the comparison cannot take is wrong)."""
    try:
        return rule.left_right(left, gpulab_solutions.left(name, rule, call)) is True
    except Exception:  # noqa: BLE001 - a decoded answer the comparison cannot take is wrong
        return False


def _adapter_name(rule: Rule) -> str | None:
    """How the kernel finds ``rule``'s adapter: ``"module:function"`` (a top-level function of gpulab)."""
    if rule.adapter is None:
        return None
    return f"{rule.adapter.__module__}:{rule.adapter.__qualname__}"


def _folder(index: int) -> str:
    return f"call-{index}"


def _in_its_folder(session, index: int, rule: Rule, call: Call) -> tuple:
    """The arguments the kernel gets for ``call``: for a rule of files, the path of the call's own folder first,
    made here with the files the rule plants (computed here), then the call's; else the call's."""
    if rule.observe is None:
        return call.args
    folder = session.make_folder(_folder(index))
    for name, data in rule.planted(str(folder), call).items():
        session.write_bytes(f"{_folder(index)}/{name}", data)
    return (str(folder), *rule.sent_args(call))


class CallFolder:
    """A call's folder as a rule of files reads it here (``gpulab.check.Folder``'s methods): through the session,
    so no link is followed, a file is capped and a checkpoint loaded with ``weights_only=True``, its size checked
    (``checks/files.py``)."""

    def __init__(self, session, name: str):
        self.session, self.name = session, name

    def listdir(self, relative: str = ".") -> list[str]:
        return self.session.listdir(f"{self.name}/{relative}")

    def read_bytes(self, relative: str) -> bytes:
        return self.session.read_bytes(f"{self.name}/{relative}")

    def load(self, relative: str):
        return self.session.load_weights(f"{self.name}/{relative}")


def statement(name: str, kind: str) -> str:
    """The statement of the first rule the cell ``kind`` of exercise ``name`` enforces: what that cell tests, for a
    check module's ``CELL_RULES`` (feedback on a failure that names no rule of its own)."""
    return gpulab_check.exercise(name).rules_of(kind)[0].statement


def enforce(session, name: str, kind: str, calls: Callable | None = None) -> None:
    """Fail the cell (``CheckFailed``) unless the notebook's ``name`` keeps every rule of the cell ``kind`` on the
    rules' visible inputs and on hidden ones drawn with ``session.rng``; all calls go in one round trip.

    ``calls(session, [Call, ...]) -> [Outcome, ...]``: how the calls reach the kernel when their arguments are not
    plain data (a torch dtype, a model: a probe of the check module rebuilds them there from a description);
    ``session.calls`` by default. For a rule about the arguments after the call (``unchanged``, ``leaves``),
    ``calls`` gives each outcome's ``args_after``: ``[args, kwargs]`` after the call, as
    ``gpulab.check.plain_state`` has them.

    A cell whose every rule names an error (``Raise ValueError if ...``) is judged on valid inputs too: the inputs of
    the exercise's other rules (``valid_calls``) must not raise that error. An answer that raises it whatever it is
    given tells no invalid input from a valid one, and earns nothing; what it returns there is the other cells'
    concern (a wrong value, or another exception, costs only their points)."""
    rules = gpulab_check.exercise(name).rules_of(kind)
    if not rules:
        raise ValueError(f"exercise {name!r} has no rule of kind {kind!r}")  # a grader bug, not a wrong answer
    pending: list[tuple[Rule, Call]] = [
        (rule, call) for rule in rules for call in gpulab_solutions.drawn_calls(name, rule, session.rng)
    ]
    judged = len(pending)
    errors = {rule.raises.__name__ for rule in rules if rule.raises is not None}
    if len(errors) == 1 and all(rule.raises is not None for rule in rules):
        pending += valid_calls(name, session.rng)
    after = any(rule.unchanged or rule.leaves for rule in rules)
    fresh = any(rule.fresh for rule in rules)
    if calls is not None:
        if fresh or any(rule.observe is not None for rule in rules):
            raise ValueError("a rule that asks for a new object or of files needs session.calls")  # a grader bug
        outcomes = calls(session, [call for _, call in pending])
    else:
        arguments = [
            (_in_its_folder(session, index, rule, call), {} if rule.observe is not None else call.kwargs)
            for index, (rule, call) in enumerate(pending)
        ]
        adapters = [_adapter_name(rule) for rule, _ in pending]
        adapters = adapters if any(adapters) else None
        seconds = [rule.seconds for rule, _ in pending]
        seconds = seconds if any(seconds) else None
        try:
            outcomes = session.calls(name, arguments, args_after=after, fresh=fresh, adapters=adapters, seconds=seconds)
        except TooSlow as slow:  # the self-check's limit on one input (``Rule.seconds``), named with that input
            rule, call = pending[slow.index]
            too_long = f"{_describe(name, call)} took longer than {slow.seconds:g} s"
            raise CheckFailed(too_long, rule.named(call)) from slow
    for index, ((rule, call), outcome) in enumerate(zip(pending[:judged], outcomes[:judged], strict=True)):
        expected = gpulab_solutions.expected(name, rule, call)
        described, named = _describe(name, call), rule.named(call)
        if rule.unchanged and not outcome.missing:
            left = outcome.args_after
            kept = type(left) is list and len(left) == 2
            kept = kept and same_values(left[0], plain_state(list(call.args)))
            kept = kept and same_values(left[1], plain_state(dict(call.kwargs)))
            expect(kept, f"{described} changed its arguments", named)
        if rule.leaves and not outcome.missing:
            left = outcome.args_after
            right = type(left) is list and len(left) == 2 and _left_right(name, rule, left[0], call)
            expect(right, f"{described} left its arguments otherwise than the rule asks", named)
        if rule.fresh:
            expect(outcome.returned_an_argument is False, f"{described} returned its argument itself", named)
        if isinstance(expected, Raises):
            if outcome.missing:
                outcome.value  # noqa: B018 - raises CheckFailed: not defined
            error = expected.error.__name__
            expect(error in outcome.raised_types, f"{described} should raise {error}", named)
            continue
        if outcome.raised is not None:  # an exception where a value is due: named with the rule the input is of
            raise CheckFailed(f"{described} raised {outcome.raised}", raised_on(named))
        got = outcome.value
        try:
            if rule.observe is not None:  # what the grader reads in the call's folder, with what came back
                got = rule.observe(CallFolder(session, _folder(index)), got, *call.args, **call.kwargs)
            right = rule.same(got, expected) is True
        except Exception as failure:  # noqa: BLE001 - a decoded answer the comparison cannot take is wrong
            raise CheckFailed(f"{described} returned {_show(got)}, expected {_show(expected)}", named) from failure
        expect(right, f"{described} returned {_show(got)}, expected {_show(expected)}", named)
    for (_, call), outcome in zip(pending[judged:], outcomes[judged:], strict=True):
        (error,) = errors
        raised = error in outcome.raised_types
        expect(not raised, f"{_describe(name, call)} raised {error} on a valid input", raised_on(rules[0].statement))


def valid_calls(name: str, rng) -> list[tuple[Rule, Call]]:
    """Valid inputs of exercise ``name``: the visible and drawn inputs of its rules that name no error (and read no
    files), each with its rule (whose adapter, if any, carries the call). A cell of error rules calls the answer on
    them as well (``enforce``)."""
    return [
        (rule, call)
        for rule in gpulab_check.exercise(name).rules
        if rule.raises is None and rule.observe is None
        for call in gpulab_solutions.drawn_calls(name, rule, rng)
    ]
