"""Lesson 04's checks (``autograder/checks/checkpoints.py``) through a ``LocalSession`` (no kernel): the reference
earns every cell and answers that lie about equality earn nothing (``tests/test_checks_draws.py`` grades the
grading tests' answers)."""

from __future__ import annotations

import gc
import json
import random
import re
import sys
import weakref

import pytest
import torch
import torch.distributed as dist

from tests.nbgrader_tools import REPO, SOURCE_ROOT

sys.path.insert(0, str(REPO))
from gpulab.exercises.checkpoints import (  # noqa: E402
    ADAM,
    LINEAR_2_1,
    PREFIX,
    SEQ_BN,
    loaded_by,
    random_keys,
    same_epoch,
    target,
    trained,
)

from autograder.checks import CheckFailed, LocalSession, checks_for, wire  # noqa: E402
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


def test_training_a_scenario_gives_the_same_bits_whatever_the_thread_count():
    """The kernel and the grader train a scenario's model in two processes with different thread counts (a grading
    worker's kernel gets its own share of the CPUs); under Adam the bias before ``SEQ_BN``'s BatchNorm, whose
    gradient is only rounding, would step by the learning rate in that rounding's direction, and a right save would
    lose its cell (it did, graded by four workers)."""
    threads = torch.get_num_threads()
    runs = []
    for count in (1, 4):
        torch.set_num_threads(count)
        try:
            model, _ = trained(SEQ_BN, 2, ADAM, steps=2)
        finally:
            torch.set_num_threads(threads)
        runs.append([tensor.tolist() for tensor in model.state_dict().values()])
    assert runs[0] == runs[1]
    assert torch.get_num_threads() == threads


def test_an_epoch_is_compared_as_the_lessons_code_reads_it():
    assert same_epoch(4, 4) and same_epoch(4.0, 4) and same_epoch(torch.tensor(4), 4)
    assert not same_epoch(True, 1) and not same_epoch("4", 4) and not same_epoch(b"4", 4)
    assert not same_epoch(torch.tensor([4, 4]), 4) and not same_epoch(None, 4) and not same_epoch(torch.tensor(True), 1)
    numpy = pytest.importorskip("numpy")
    assert same_epoch(numpy.int64(4), 4) and same_epoch(round_trip(numpy.int64(4)), 4)
    assert same_epoch(round_trip(numpy.float32(4.0)), 4) and not same_epoch(round_trip(numpy.int64(5)), 4)


@pytest.mark.parametrize("seed", range(20))
def test_random_keys_never_collide_once_stripped(seed):
    keys = random_keys(random.Random(seed))
    stripped = [key.removeprefix(PREFIX) for key in keys]
    assert keys and len(set(stripped)) == len(keys)


def test_no_drawn_key_once_stripped_is_another_drawn_key():
    """``module.module.x`` stripped is ``module.x``: drawn beside ``module.x`` itself, PyTorch's in-place
    ``consume_prefix_in_state_dict_if_present`` (on a copy: an answer the lesson teaches and the self-check calls
    right) overwrites one entry with the other and loses a key, so ``strip_module_prefix_only_at_start`` would be
    lost by the luck of the draw. The draws keep such pairs out."""
    from collections import OrderedDict

    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    for seed in range(3000):
        keys = random_keys(random.Random(seed))
        stripped = {key.removeprefix(PREFIX) for key in keys if key.startswith(PREFIX)}
        assert not stripped & set(keys), (seed, keys)
        state = OrderedDict((key, index) for index, key in enumerate(keys))
        consume_prefix_in_state_dict_if_present(state, PREFIX)
        assert dict(state) == {key.removeprefix(PREFIX): index for index, key in enumerate(keys)}, (seed, keys)


@pytest.mark.parametrize("learner_raises", [False, True])
def test_models_wrapped_in_the_scenarios_group_are_freed_before_it_closes(tmp_path, learner_raises):
    """A ``DistributedDataParallel``'s reducer must never drop the last reference of the scenario's one-rank group:
    the group's destructor would then join gloo's workers without releasing the GIL, and deadlock with a worker
    that needs it (pytorch/pytorch#56297; lesson 04's gradings hung so). Each wrapped model is freed while the group
    is still up, also when the learner's function raised (the adapter reports it) and its frames travel with the
    exception. (The model lives in a reference cycle: with automatic collection off, only the scenario's own
    collection frees it in time.)"""
    freed_while_group_up = []

    def load_checkpoint(path, model, optimizer=None, map_location=None):
        weakref.finalize(model, lambda: freed_while_group_up.append(dist.is_initialized()))
        if learner_raises:
            raise ValueError("a learner's mistake")
        return 3

    gc.disable()
    try:
        for seed in (2, 3):
            got = loaded_by(
                load_checkpoint,
                str(tmp_path),
                target(LINEAR_2_1, seed, "DistributedDataParallel"),
                [],
            )
            assert got.get("raised", "").startswith("ValueError") if learner_raises else got["returned"] == 3
    finally:
        gc.enable()
    assert not dist.is_initialized()
    assert freed_while_group_up == [True, True]


def test_a_view_that_writes_through_to_its_argument_is_not_a_new_mapping(tmp_path):
    """A mapping of another object than the argument that writes through to the caller's state dict is not the new
    dict the rule asks for: ``strip_module_prefix_new_mapping`` is lost (only a dict or an ``OrderedDict``, which
    holds its own entries, counts, and the kernel says whether it is the argument itself)."""
    view = """
from collections.abc import MutableMapping


class Stripped(MutableMapping):
    def __init__(self, state):
        self.state = state

    def _key(self, key):
        return "module." + key if "module." + key in self.state else key

    def __getitem__(self, key):
        return self.state[self._key(key)]

    def __setitem__(self, key, value):
        self.state[self._key(key)] = value

    def __delitem__(self, key):
        del self.state[self._key(key)]

    def __iter__(self):
        return iter([key.removeprefix("module.") for key in self.state])

    def __len__(self):
        return len(self.state)


def strip_module_prefix(state_dict):
    return Stripped(state_dict)
"""
    assert "strip_module_prefix_new_mapping" not in lost_cells("04_checkpoints", lesson_04_namespace(), tmp_path)
    lost = lost_cells("04_checkpoints", lesson_04_namespace({"strip_module_prefix_answer": view}), tmp_path)
    assert "strip_module_prefix_new_mapping" in lost


def _strip_cells_lost(code: str, tmp_path, seeds) -> dict[int, set[str]]:
    """The ``strip_module_prefix_*`` cells the answer ``code`` loses, per seed of the grader's draws."""
    namespace = lesson_04_namespace({"strip_module_prefix_answer": code})
    checks = {name: check for name, check in checks_for("04_checkpoints").items() if name.startswith("strip_module")}
    lost = {}
    for seed in seeds:
        lost[seed] = set()
        for name, check in checks.items():
            session = LocalSession(namespace, tmp_path, random.Random(seed))
            try:
                check(session)
            except CheckFailed:
                lost[seed].add(name)
            finally:
                session.close()
    return lost


def test_returning_the_argument_when_no_key_has_the_prefix_is_not_a_new_mapping(tmp_path):
    """``return state_dict`` when a non-empty state dict has nothing to strip hands the caller its own dict back:
    the new-dict rule is broken whatever the draw, so ``strip_module_prefix_new_mapping`` is lost on every seed
    (its inputs must hold a non-empty state dict without the prefix, not only prefixed or empty ones)."""
    same_when_clean = """
def strip_module_prefix(state_dict):
    if state_dict and not any(key.startswith("module.") for key in state_dict):
        return state_dict
    return {key.removeprefix("module."): value for key, value in state_dict.items()}
"""
    lost = _strip_cells_lost(same_when_clean, tmp_path, range(3))
    assert all(cells == {"strip_module_prefix_new_mapping"} for cells in lost.values()), lost


def test_judging_the_prefix_by_the_first_key_loses_its_cell_on_every_draw(tmp_path):
    """The common idiom ``if first key starts with module.: strip`` is wrong when only some keys carry the prefix and
    the first does not; ``strip_module_prefix_only_at_start`` is lost on every seed, not only when a random key list
    happens to start with such a key."""
    first_key = """
def strip_module_prefix(state_dict):
    keys = list(state_dict)
    if keys and not keys[0].startswith("module."):
        return dict(state_dict)
    return {key.removeprefix("module."): value for key, value in state_dict.items()}
"""
    lost = _strip_cells_lost(first_key, tmp_path, range(8))
    assert all(cells == {"strip_module_prefix_only_at_start"} for cells in lost.values()), lost
