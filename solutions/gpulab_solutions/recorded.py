"""Record the expected outcome of every visible and extra input, for the self-check (gpulab's ``expected.pt``).

gpulab holds no reference, so its self-check reads what the references say about its fixed inputs from a file
made here, from this package's references, when the lessons are built (``scripts/build_lessons.py``)::

    python -m gpulab_solutions.recorded          # write utils/gpulab/exercises/expected.pt
    python -m gpulab_solutions.recorded --check  # exit 1, naming them, where the file and the references differ

The file maps ``{exercise: {rule key: {"visible"|"extra": [(expected, left), ...]}}}`` (``left``: the arguments as
the call must leave them, for a rule with ``leaves``), read onto the CPU; a rule of errors records nothing
(its outcome is ``Raises``). ``--check`` compares values, not bytes, so a rebuild that changes nothing leaves the
file alone; floats and floating tensors count as equal within float32's rounding (``ROUNDING``), since a reference
that trains a model gives values that differ in their last bits from one CPU to another (the exercises compare those
within a tolerance of their own, e.g. ``checkpoints.SAVED_TOLERANCE``).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import sys
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from gpulab import check
from gpulab.check import ArgumentAt, Call

import gpulab_solutions

WHICH = ("visible", "extra")


_PLAIN = (int, float, complex, str, bytes, bool, type(None))
# how far a recorded float or floating tensor may be from a fresh one and still be the same value (torch.allclose's
# terms): what another order of summing changes in float32 (up to 1e-6 in a loss of 12 and 2.4e-7 in a gradient,
# between two x86 CPUs), far from any change of a reference's meaning
ROUNDING = {"rtol": 1e-5, "atol": 1e-6}


def _arguments_by_identity(call: Call) -> dict[int, tuple]:
    """``{id(object): path}`` of every object among ``call``'s arguments (containers entered), plain values left
    out (their identity means nothing)."""
    found: dict[int, tuple] = {}

    def visit(value: Any, path: tuple) -> None:
        if isinstance(value, _PLAIN) or id(value) in found:
            return
        found[id(value)] = path
        if type(value) in (list, tuple):
            for index, item in enumerate(value):
                visit(item, (*path, index))
        elif type(value) in (dict, OrderedDict):
            for key, item in value.items():
                visit(item, (*path, key))

    visit(call.args, ("args",))
    visit(call.kwargs, ("kwargs",))
    return found


def _marked(value: Any, arguments: dict[int, tuple]) -> Any:
    """``value`` with every argument of the call in it (by identity) replaced by ``ArgumentAt`` its path."""
    if not isinstance(value, _PLAIN) and id(value) in arguments:
        return ArgumentAt(arguments[id(value)]) if len(arguments[id(value)]) > 1 else value
    if type(value) in (list, tuple):
        return type(value)(_marked(item, arguments) for item in value)
    if type(value) in (dict, OrderedDict):
        return type(value)((key, _marked(item, arguments)) for key, item in value.items())
    return value


def outcomes() -> dict:
    """The table (module docstring), computed now from the references."""
    table: dict = {}
    for name, exercise in sorted(check._registry().items()):
        for rule in exercise.rules:
            if rule.raises is not None:
                continue
            for which in WHICH:
                recorded = []
                for call in rule.calls(which):
                    arguments = _arguments_by_identity(call)
                    expected = _marked(gpulab_solutions.expected(name, rule, call), arguments)
                    left = _marked(gpulab_solutions.left(name, rule, call), arguments)
                    recorded.append((expected, left))
                if recorded:
                    table.setdefault(name, {}).setdefault(rule.key, {})[which] = recorded
    return table


def _equal(a: Any, b: Any) -> bool:
    """Equal as recorded values: tensors by dtype, shape and values, and floats, NaN equal to NaN and within
    ``ROUNDING``; containers item by item (and their attributes)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, **ROUNDING, equal_nan=True)))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):  # a dict of a class of its own carries attributes too (how feedback names it)
        return (
            list(a) == list(b)
            and all(_equal(a[key], b[key]) for key in a)
            and _equal(getattr(a, "__dict__", None), getattr(b, "__dict__", None))
        )
    if dataclasses.is_dataclass(a):
        return _equal(dataclasses.asdict(a), dataclasses.asdict(b))
    if isinstance(a, float):  # a number a reference computed in float32 (a loss), NaN equal to NaN
        return b != b if a != a else abs(a - b) <= ROUNDING["atol"] + ROUNDING["rtol"] * abs(b)
    return bool(a == b)


def differences(recorded: dict, fresh: dict) -> Iterator[str]:
    """Where ``recorded`` and ``fresh`` differ: one line per exercise, rule and input list."""
    for name in sorted(set(recorded) | set(fresh)):
        rules_a, rules_b = recorded.get(name, {}), fresh.get(name, {})
        for key in sorted(set(rules_a) | set(rules_b)):
            for which in WHICH:
                a, b = rules_a.get(key, {}).get(which), rules_b.get(key, {}).get(which)
                if (a is None) != (b is None) or (a is not None and not _equal(a, b)):
                    yield f"{name}: {key} ({which})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare the file with the references, write nothing")
    args = parser.parse_args(argv)
    fresh = outcomes()
    try:
        recorded = check.recorded_outcomes()
    except FileNotFoundError:
        recorded = {}
    stale = list(differences(recorded, fresh))
    if args.check:
        for line in stale:
            print(f"stale: {line}", file=sys.stderr)
        if stale:
            print("run: python -m gpulab_solutions.recorded (or make lessons)", file=sys.stderr)
        return 1 if stale else 0
    if stale:
        buffer = io.BytesIO()
        torch.save(fresh, buffer)
        with open(check.RECORDED, "wb") as handle:
            handle.write(buffer.getvalue())
        print(f"recorded {len(stale)} changed input list(s) in {check.RECORDED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
