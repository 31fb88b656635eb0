"""Lesson 04's checks (``autograder/checks/checkpoints.py``) through a ``LocalSession`` (no kernel): the reference
earns every cell and answers that lie about equality earn nothing (``tests/test_checks_draws.py`` grades the
grading tests' answers)."""

from __future__ import annotations

import json
import random
import re
import sys

import pytest
import torch

from tests.nbgrader_tools import REPO, SOURCE_ROOT

sys.path.insert(0, str(REPO))
from autograder.checks import checks_for, wire  # noqa: E402
from autograder.checks.checkpoints import PREFIX, _random_keys, is_epoch  # noqa: E402
from tests.local_checks import lesson_04_namespace, lesson_04_reference_answers, lost_cells  # noqa: E402


def round_trip(value):
    return wire.decode(json.loads(json.dumps(wire.encode(value, torch))), torch)


def test_every_graded_cell_has_a_check_and_the_reference_earns_them_all(tmp_path):
    source = (SOURCE_ROOT / "04_checkpoints" / "04_checkpoints.py").read_text()
    graded = set(re.findall(r'"grade": true, "grade_id": "(\w+)"', source))
    assert len(graded) == 13 and set(checks_for("04_checkpoints")) == graded
    assert lost_cells("04_checkpoints", lesson_04_namespace(), tmp_path, seed=1) == set()


def test_liars_earn_nothing(tmp_path):
    liar = """
class Anything(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__


_load = load_checkpoint


def load_checkpoint(path, model, optimizer=None, map_location=None):
    _load(path, model, optimizer, map_location)
    return Anything(0)
"""
    lost = lost_cells(
        "04_checkpoints",
        lesson_04_namespace({"load_checkpoint_answer": lesson_04_reference_answers()["load_checkpoint_answer"] + liar}),
        tmp_path,
        4,
    )
    assert {"load_checkpoint_models", "load_checkpoint_resume", "load_checkpoint_refuses_code"} <= lost


def test_an_epoch_is_compared_as_the_lessons_tests_compared_it():
    assert is_epoch(4, 4) and is_epoch(4.0, 4) and is_epoch(torch.tensor(4), 4)
    assert not is_epoch(True, 1) and is_epoch(True, 1, allow_bool=True)
    assert not is_epoch("4", 4) and not is_epoch(torch.tensor([4, 4]), 4) and not is_epoch(None, 4)
    numpy = pytest.importorskip("numpy")
    assert round_trip(numpy.int64(4)) == 4 and is_epoch(round_trip(numpy.int64(4)), 4)
    assert is_epoch(round_trip(numpy.float32(4.0)), 4) and not is_epoch(round_trip(numpy.int64(5)), 4)


@pytest.mark.parametrize("seed", range(20))
def test_random_keys_never_collide_once_stripped(seed):
    keys = _random_keys(random.Random(seed))
    stripped = [key.removeprefix(PREFIX) for key in keys]
    assert keys and len(set(stripped)) == len(keys)
