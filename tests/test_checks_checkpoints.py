"""Lesson 04's checks (``autograder/checks/checkpoints.py``) through a ``LocalSession`` (no kernel): the reference
and the correct-but-different answers of ``tests/test_lesson_04.py`` earn every cell, each wrong answer loses
exactly its cells, and answers that lie about equality earn nothing."""

from __future__ import annotations

import json
import os
import random
import re
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.nbgrader_tools import REPO, SOURCE_ROOT

sys.path.insert(0, str(REPO))
from autograder.checks import CheckFailed, LocalSession, checks_for, wire  # noqa: E402
from autograder.checks.checkpoints import PREFIX, _random_keys, is_epoch  # noqa: E402


def round_trip(value):
    return wire.decode(json.loads(json.dumps(wire.encode(value, torch))), torch)


ANSWERS = ("strip_module_prefix_answer", "save_checkpoint_answer", "load_checkpoint_answer", "quiz_answers")


def _reference_answers() -> dict[str, str]:
    source = (SOURCE_ROOT / "04_checkpoints" / "04_checkpoints.py").read_text()
    answers = {}
    for grade_id in ANSWERS:
        cell = re.search(rf'grade_id": "{grade_id}".*?\n(.*?)\n# %%', source, re.S)[1]
        answers[grade_id] = "\n".join(line for line in cell.splitlines() if "### " not in line)
    return answers


def _namespace(overrides: dict[str, str] | None = None) -> dict:
    import gpulab

    namespace = {"torch": torch, "nn": nn, "gpulab": gpulab, "OrderedDict": OrderedDict, "Path": Path}
    namespace.update(os=os, tempfile=tempfile)
    for code in {**_reference_answers(), **(overrides or {})}.values():
        exec(code, namespace)  # noqa: S102 - the lesson's answers and the grading tests' submissions
    return namespace


def _lost(namespace, tmp_path, seed) -> set[str]:
    lost = set()
    for grade_id, check in checks_for("04_checkpoints").items():
        session = LocalSession(namespace, tmp_path, random.Random(seed))
        try:
            check(session)
        except CheckFailed:
            lost.add(grade_id)
        finally:
            session.close()
    return lost


def test_every_graded_cell_has_a_check_and_the_reference_earns_them_all(tmp_path):
    source = (SOURCE_ROOT / "04_checkpoints" / "04_checkpoints.py").read_text()
    graded = set(re.findall(r'"grade": true, "grade_id": "(\w+)"', source))
    assert len(graded) == 13 and set(checks_for("04_checkpoints")) == graded
    assert _lost(_namespace(), tmp_path, seed=1) == set()


def test_the_grading_tests_submissions_are_graded_as_they_expect(tmp_path):
    from tests.test_lesson_04 import CORRECT_BUT_DIFFERENT, WRONG

    for seed, answers in enumerate(CORRECT_BUT_DIFFERENT.values()):
        assert _lost(_namespace(answers), tmp_path, seed) == set()
    for seed, (answers, lost) in enumerate(WRONG.values()):
        assert _lost(_namespace(answers), tmp_path, seed) == lost


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
    lost = _lost(
        _namespace({"load_checkpoint_answer": _reference_answers()["load_checkpoint_answer"] + liar}), tmp_path, 4
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
