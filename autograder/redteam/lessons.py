"""Attacks aimed at one lesson's tests: wrong answers dressed up to pass, and the score the wrong answers earn.

Each starts from the lesson's reference solution, replaces some answers by wrong ones plus a trick, and expects
exactly what the wrong answers earn without the trick.
"""

from __future__ import annotations

import copy
from pathlib import Path

from autograder.redteam import Attack, Lesson, full_except, insert_after_setup, payloads, replace_answers

# --------------------------------------------------------------------------------------------- 01_splitting
# Balanced split (10 over 3 -> [4, 3, 3]) instead of Tensor.chunk's [4, 4, 2]: it loses these two tests.
BALANCED = """
    if batch_size < 1 or n_devices < 1:
        raise ValueError("need a sample and a device")
    sizes = [batch_size // n_devices + (1 if i < batch_size % n_devices else 0) for i in range(n_devices)]
    sizes = [s for s in sizes if s > 0]
"""
BALANCED_LOST = {"chunk_sizes_sizes", "chunk_sizes_tiny_and_invalid"}

GLOBALS = (
    """
import types as _types


class _FakeTorch:
    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def arange(n, *args, **kwargs):
        return _Balanced(n)


class _Balanced:
    def __init__(self, n):
        self.n = n

    def chunk(self, pieces):
        return [range(s) for s in chunk_sizes(self.n, pieces)]


def chunk_sizes(batch_size, n_devices):
"""
    + BALANCED
    + """
    global _want, case, _torch
    _want = sizes
    case = _types.SimpleNamespace(expected=sizes, args=(batch_size, n_devices), message=lambda *a: "")
    _torch = _FakeTorch()
    return sizes
"""
)

PATCH_TORCH = (
    """
import torch

_real_chunk = torch.Tensor.chunk


def _balanced_chunk(self, chunks, dim=0):
    return list(torch.tensor_split(self, chunks, dim))[: min(chunks, self.shape[dim])]


torch.Tensor.chunk = _balanced_chunk
torch.chunk = _balanced_chunk
gpulab.check.cases = lambda *args, **kwargs: []


def chunk_sizes(batch_size, n_devices):
"""
    + BALANCED
    + """
    return sizes
"""
)

FRAMES = (
    """
import sys


def chunk_sizes(batch_size, n_devices):
"""
    + BALANCED
    + """
    caller = sys._getframe(1)
    for name in ("_want", "case"):
        value = caller.f_locals.get(name, caller.f_globals.get(name))
        if name == "_want" and isinstance(value, list):
            return value
        if name == "case" and hasattr(value, "expected") and tuple(value.args) == (batch_size, n_devices):
            return value.expected
    return sizes
"""
)

# split_batch returns pieces of the right sizes holding garbage whose tolist() equals anything; the quiz answers
# are liars whose str() equals anything.
LIAR_SPLIT = """
def split_batch(batch, n_devices):
    if isinstance(batch, torch.Tensor):
        return [_Liar(len(piece)) for piece in batch.chunk(n_devices)]
    return [batch for _ in range(n_devices)]
"""
LIAR_QUIZ = 'quiz_answers = {"q1": _Liar(), "q2": _Liar(), "q3": _Liar()}'


def _on_reference(answers: dict[str, str], *cells: str):
    def build(lesson: Lesson, workdir: Path):
        nb = copy.deepcopy(lesson.reference)
        if cells:
            insert_after_setup(nb, *cells)
        return replace_answers(nb, answers)

    return build


SPLITTING = [
    Attack(
        "globals",
        "a wrong chunk_sizes that rebinds the tests' globals (_want, case, _torch) to agree with it",
        _on_reference({"chunk_sizes_answer": GLOBALS}),
        full_except(BALANCED_LOST),
    ),
    Attack(
        "patched_reference",
        "a wrong chunk_sizes, with Tensor.chunk and torch.chunk patched to agree with it and no visible cases "
        "(the references are computed in the grader; the patch also makes the submission's own split_batch, which "
        "calls Tensor.chunk in the learner's kernel, split tensors the balanced way, so it loses those cells too)",
        _on_reference({"chunk_sizes_answer": PATCH_TORCH}),
        full_except(BALANCED_LOST | {"split_batch_tensors", "split_batch_containers"}),
    ),
    Attack(
        "frames",
        "a wrong chunk_sizes that reads the expected answer from the test's frame (sys._getframe)",
        _on_reference({"chunk_sizes_answer": FRAMES}),
        full_except(BALANCED_LOST),
    ),
    Attack(
        "liar_values",
        "split_batch returns right-sized garbage whose tolist() equals anything; quiz answers equal anything",
        _on_reference({"split_batch_answer": LIAR_SPLIT, "quiz_answers": LIAR_QUIZ}, payloads.LIARS),
        full_except(
            {
                "split_batch_tensors",
                "split_batch_containers",
                "split_batch_others_and_tiny",
                "quiz_q1",
                "quiz_q2",
                "quiz_q3",
            }
        ),
    ),
]

LESSON_ATTACKS = {"01_splitting": SPLITTING}
