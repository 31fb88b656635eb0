"""Running a lesson's checks (``autograder/checks``) without a kernel: a notebook namespace built from the lesson's
reference answers, with a grading test's answers put in their place, judged through ``LocalSession``. Used by
``tests/test_checks.py``, ``tests/test_checks_checkpoints.py``, ``tests/test_checks_draws.py``,
``tests/test_one_truth.py`` and the attack tests (``tests/test_*_attacks.py``)."""

from __future__ import annotations

import copy
import math
import os
import random
import re
import sys
import tempfile
import warnings
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from tests.nbgrader_tools import REPO, SOURCE_ROOT

sys.path.insert(0, str(REPO))
from autograder.checks import CheckFailed, LocalSession, checks_for  # noqa: E402

# Wrong answers that patch torch in the process that runs them: only a kernel of their own may grade them
# (``tests/test_lesson_0N.py`` does); run here, they would change the grader's own torch.
PATCH_THE_PROCESS = {"tampering_with_comparisons", "ignores_loss_fn_rounds_and_tampers"}


def verdicts_of(assignment: str, namespace: dict, tmp_path: Path, seed: int = 0) -> dict[str, bool]:
    """``{grade_id: passed}`` of every check of ``assignment`` on a notebook namespace, each check drawing its
    random cases from ``random.Random(seed)``."""
    verdicts = {}
    for grade_id, check in checks_for(assignment).items():
        session = LocalSession(namespace, tmp_path, random.Random(seed))
        try:
            check(session)
            verdicts[grade_id] = True
        except CheckFailed:
            verdicts[grade_id] = False
        finally:
            session.close()
    return verdicts


def attacked_verdict(check, session) -> str:
    """``"passed"``, ``"failed"`` (``CheckFailed``) or ``"grader error: ..."`` (anything else escaped the check,
    which an attack must never achieve), closing the session."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check(session)
    except CheckFailed:
        return "failed"
    except Exception as error:  # noqa: BLE001 - what an attack test looks for
        return f"grader error: {type(error).__name__}: {str(error)[:120]}"
    finally:
        session.close()
    return "passed"


def lost_cells(assignment: str, namespace: dict, tmp_path: Path, seed: int = 0) -> set[str]:
    """The graded cells ``namespace`` loses."""
    return {grade_id for grade_id, passed in verdicts_of(assignment, namespace, tmp_path, seed).items() if not passed}


def _source(lesson: str) -> str:
    return (SOURCE_ROOT / lesson / f"{lesson}.py").read_text()


def _run(codes, namespace: dict) -> dict:
    for code in codes:
        exec(code, namespace)  # noqa: S102 - the lesson's reference answers and the grading tests' submissions
    return namespace


def _functions(lesson: str, names: list[str], overrides: dict[str, str]) -> list[str]:
    """The reference ``def`` of each name, or the override of its ``<name>_answer`` cell."""
    source = _source(lesson)
    return [
        overrides.get(f"{name}_answer") or re.search(rf"(def {name}\(.*?)\n\n\n", source, re.S)[1] for name in names
    ]


def reference_answer(lesson: str, name: str) -> str:
    """The lesson's own ``def`` of ``name`` (its solution, as the answer cell holds it)."""
    return _functions(lesson, [name], {})[0]


def answer_cell(lesson: str, grade_id: str) -> str:
    """The code of the lesson's answer cell ``grade_id``: its solution (a class, where ``_functions`` finds defs)."""
    return re.search(rf'grade_id": "{grade_id}".*?\n(.*?)\n\n\n# %%', _source(lesson), re.S)[1]


def lesson_01_namespace(overrides: dict[str, str] | None = None) -> dict:
    import gpulab

    overrides = overrides or {}
    codes = _functions("01_splitting", ["chunk_sizes", "device_of_sample", "split_batch"], overrides)
    codes.append(overrides.get("quiz_answers", 'quiz_answers = {"q1": 4, "q2": 1, "q3": "b"}'))
    return _run(codes, {"torch": torch, "gpulab": gpulab})


def lesson_02_namespace(overrides: dict[str, str] | None = None) -> dict:
    import gpulab

    overrides = overrides or {}
    names = ["average_gradients", "data_parallel_grads", "train_with_data_parallel"]
    codes = _functions("02_gradient_averaging", names, overrides)
    codes.append(overrides.get("quiz_answers", 'quiz_answers = {"q1": 0.2, "q2": "b", "q3": "b", "q4": "b"}'))
    return _run(codes, {"torch": torch, "gpulab": gpulab, "copy": copy, "nn": nn})


def lesson_03_namespace(overrides: dict[str, str] | None = None) -> dict:
    import gpulab

    overrides = overrides or {}
    names = ["gathered_output_bytes", "imbalance_ratio", "loss_in_forward", "dp_traffic_bytes", "ring_all_reduce_bytes"]
    codes = [overrides.get(f"{name}_answer") or answer_cell("03_gpu0_imbalance", f"{name}_answer") for name in names]
    quiz = 'quiz_answers = {"q1": 102_400_000, "q2": 2.25, "q3": "b", "q4": "b", "q5": "b"}'
    codes.append(overrides.get("quiz_answers", quiz))
    return _run(codes, {"torch": torch, "nn": nn, "gpulab": gpulab, "math": math})


LESSON_04_ANSWERS = ("strip_module_prefix_answer", "save_checkpoint_answer", "load_checkpoint_answer", "quiz_answers")


def lesson_04_reference_answers() -> dict[str, str]:
    source = _source("04_checkpoints")
    answers = {}
    for grade_id in LESSON_04_ANSWERS:
        cell = re.search(rf'grade_id": "{grade_id}".*?\n(.*?)\n# %%', source, re.S)[1]
        answers[grade_id] = "\n".join(line for line in cell.splitlines() if "### " not in line)
    return answers


def lesson_04_namespace(overrides: dict[str, str] | None = None) -> dict:
    import gpulab

    namespace = {"torch": torch, "nn": nn, "gpulab": gpulab, "OrderedDict": OrderedDict, "Path": Path}
    namespace.update(os=os, tempfile=tempfile)
    return _run({**lesson_04_reference_answers(), **(overrides or {})}.values(), namespace)


NAMESPACES = {
    "01_splitting": lesson_01_namespace,
    "02_gradient_averaging": lesson_02_namespace,
    "03_gpu0_imbalance": lesson_03_namespace,
    "04_checkpoints": lesson_04_namespace,
}
