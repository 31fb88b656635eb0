"""Feedback for a failed graded cell names the rule or case that failed (from a fixed catalogue, in the student's
edition), never the hidden input the grader drew: ``autograder/checks`` (``expect``'s ``rule``, ``rule_texts``),
``autograder/execute.py`` (the record) and ``autograder/feedback.py`` (the line)."""

from __future__ import annotations

import random
import sys

import nbformat
import pytest

from tests.nbgrader_tools import REPO

sys.path.insert(0, str(REPO))
from autograder.checks import MODULES, CheckFailed, LocalSession, checks_for, failure_rule, rule_texts  # noqa: E402
from autograder.feedback import summary  # noqa: E402
from tests.local_checks import PATCH_THE_PROCESS, lesson_01_namespace, lesson_03_namespace  # noqa: E402
from tests.test_lesson_01 import WRONG as LESSON_01_WRONG  # noqa: E402
from tests.test_lesson_03 import WRONG as LESSON_03_WRONG  # noqa: E402

SPLITTING = "autograder.checks.splitting"
IMBALANCE = "autograder.checks.gpu0_imbalance"


def failures(assignment: str, namespace: dict, tmp_path, seed: int = 0, only=None) -> dict[str, CheckFailed]:
    """``{grade_id: the CheckFailed}`` of the checks (quizzes aside; ``only`` those named) that ``namespace``
    fails."""
    failed = {}
    for grade_id, check in checks_for(assignment).items():
        if grade_id.startswith("quiz") or (only is not None and grade_id not in only):
            continue
        session = LocalSession(namespace, tmp_path, random.Random(seed))
        try:
            check(session)
        except CheckFailed as failure:
            failed[grade_id] = failure
        finally:
            session.close()
    return failed


def test_an_uneven_batch_is_named_by_its_case(tmp_path):
    # floor-dividing device_of_sample fails the visible uneven case (5 over 4) and chunk_sizes without a check of
    # n_devices fails its error rule: each failure names the case of its rule (Rule.case_name), not the call
    wrong = {
        "device_of_sample_answer": """
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError(index)
    return index * n_devices // batch_size
""",
        "chunk_sizes_answer": """
def chunk_sizes(batch_size, n_devices):
    if batch_size < 1:
        raise ValueError("no samples")
    per = -(-batch_size // n_devices)
    return [min(per, batch_size - start) for start in range(0, batch_size, per)]
""",
    }
    failed = failures("01_splitting", lesson_01_namespace(wrong), tmp_path)
    assert set(failed) == {"device_of_sample_devices", "chunk_sizes_tiny_and_invalid"}, failed
    device = failed["device_of_sample_devices"]
    assert str(device) == "device_of_sample(4, 5, 4) returned 3, expected 2"  # the instructor's message: the call
    assert device.rule == "the device of each sample of an uneven batch (the last chunk is shorter)"
    invalid = failed["chunk_sizes_tiny_and_invalid"]
    assert invalid.rule == "n_devices < 1 must raise ValueError", invalid
    texts = rule_texts(invalid.rule, SPLITTING)
    assert texts == {"en": "n_devices < 1 must raise ValueError", "ja": "n_devicesが1未満ならValueErrorを送出します"}


def test_a_hidden_input_is_named_by_its_case_and_not_shown(tmp_path):
    # right on every batch at least as large as the devices, wrong when samples are fewer: the visible inputs have
    # no such batch, so the first failure is a hidden input (2 samples on 3 devices)
    wrong = {
        "device_of_sample_answer": """
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError(index)
    if batch_size < n_devices:
        return 0
    return index // -(-batch_size // n_devices)
""",
    }
    failed = failures("01_splitting", lesson_01_namespace(wrong), tmp_path, only={"device_of_sample_devices"})
    device = failed["device_of_sample_devices"]
    assert str(device) == "device_of_sample(1, 2, 3) returned 0, expected 1", device
    assert device.rule == "fewer samples than devices: only some devices receive a chunk"
    texts = rule_texts(device.rule, SPLITTING)
    assert texts["ja"] and not any(digit in texts["en"] + texts["ja"] for digit in "123")


def test_an_exception_is_named_with_the_rule_and_case_it_broke(tmp_path):
    """A split_batch that loops over range(n_devices) inside containers raises IndexError on a tuple of fewer
    samples than devices: the failure names the exception and the rule of that input, in both editions."""
    wrong = {
        "split_batch_answer": """
def split_batch(batch, n_devices):
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(n_devices))
    if isinstance(batch, (tuple, list)) and batch:
        parts = [split_batch(item, n_devices) for item in batch]
        return [type(batch)(part[i] for part in parts) for i in range(n_devices)]
    if isinstance(batch, dict) and batch:
        parts = {key: split_batch(value, n_devices) for key, value in batch.items()}
        return [{key: part[i] for key, part in parts.items()} for i in range(n_devices)]
    return [batch for _ in range(n_devices)]
""",
    }
    failed = failures("01_splitting", lesson_01_namespace(wrong), tmp_path, only={"split_batch_containers"})
    containers = failed["split_batch_containers"]
    assert "raised IndexError" in str(containers), containers
    rule = "a tuple, list or dict gives a list of tuples, lists or dicts, split element by element"
    assert containers.rule == f"the function raised an exception on one of the grader's inputs, breaking: {rule}"
    texts = rule_texts(containers.rule, SPLITTING)
    assert texts["en"] == containers.rule and texts["ja"].endswith(rule_texts(rule, SPLITTING)["ja"]), texts
    # and the self-check, before it: a case of containers with fewer samples than devices catches it
    namespace = lesson_01_namespace(wrong)
    from gpulab import check

    assert not check.run("split_batch", namespace["split_batch"]).passed


@pytest.mark.parametrize("name", sorted(LESSON_01_WRONG))
def test_every_failure_of_a_wrong_lesson_01_answer_names_a_catalogued_rule(name, tmp_path):
    answers, _lost = LESSON_01_WRONG[name]
    failed = failures("01_splitting", lesson_01_namespace(answers), tmp_path)
    assert failed, name
    for grade_id, failure in failed.items():
        texts = rule_texts(failure.rule, SPLITTING)
        assert texts is not None and texts["ja"], (grade_id, failure.rule, str(failure))


def test_a_missing_value_error_for_bytes_per_element_is_named(tmp_path):
    # the notebook's dp_traffic_bytes, but checking only the five counts before bytes_per_element
    source = (REPO / "source/03_gpu0_imbalance/03_gpu0_imbalance.py").read_text()
    reference = source.split('grade_id": "dp_traffic_bytes_answer"')[1].split("\n", 1)[1].split("\n\n\n# %%")[0]
    wrong = reference.replace(
        "counts = (batch_size, n_devices, n_params, in_features, out_features, bytes_per_element)",
        "counts = (batch_size, n_devices, n_params, in_features, out_features)",
    )
    assert wrong != reference
    namespace = lesson_03_namespace({"dp_traffic_bytes_answer": wrong})
    failed = failures("03_gpu0_imbalance", namespace, tmp_path, only={"dp_traffic_bytes_idle_devices"})
    failure = failed["dp_traffic_bytes_idle_devices"]
    assert failure.rule == "bytes_per_element < 1 must raise ValueError", failure
    assert rule_texts(failure.rule, IMBALANCE)["ja"] == "bytes_per_elementが1未満ならValueErrorを送出します"
    assert "(4, 2, 10, 3, 4, bytes_per_element=0)" in str(failure)  # the instructor's record keeps the call


@pytest.mark.parametrize("name", sorted(set(LESSON_03_WRONG) - PATCH_THE_PROCESS))
def test_every_failure_of_a_wrong_lesson_03_answer_names_a_catalogued_rule(name, tmp_path):
    answers, _lost = LESSON_03_WRONG[name]
    failed = failures("03_gpu0_imbalance", lesson_03_namespace(answers), tmp_path)
    assert failed, name
    for grade_id, failure in failed.items():
        texts = rule_texts(failure.rule, IMBALANCE)
        assert texts is not None and texts["ja"], (grade_id, failure.rule, str(failure))


@pytest.mark.parametrize("assignment", sorted(MODULES))
def test_a_failure_without_its_own_rule_is_named_by_what_its_cell_tests(assignment):
    """Lessons 02 and 04 name each graded cell's rule (``CELL_RULES``); lessons 01 and 03 name a rule on every
    failure (and may name cell rules too); every rule named has its Japanese text."""
    module = MODULES[assignment]
    for grade_id in checks_for(assignment):
        if grade_id.startswith("quiz"):
            continue
        texts = failure_rule(CheckFailed("a hidden input"), grade_id, module)
        if assignment in ("02_gradient_averaging", "04_checkpoints"):
            assert texts is not None and texts["ja"] and texts["en"] != "a hidden input", grade_id
    own = failure_rule(CheckFailed("x", "the function is not defined: run its cell"), "anything", module)
    assert own["en"] == "the function is not defined: run its cell"


def test_only_catalogue_texts_reach_the_feedback():
    # a check's own message (the hidden input) or anything else is never taken as a rule
    assert rule_texts("chunk_sizes(13, 4)", SPLITTING) is None
    assert rule_texts(None, SPLITTING) is None
    assert rule_texts("the function is not defined: run its cell", SPLITTING)["ja"]
    # a visible case's reason is a rule too, translated where gpulab translates it
    visible = rule_texts("uneven: every chunk has ceil(10/3) = 4 samples, the last the rest", SPLITTING)
    assert visible["ja"].startswith("割り切れない場合")


def test_the_feedback_line_names_the_failed_rule_in_the_students_edition():
    cell = nbformat.v4.new_code_cell("assert True")
    rule = rule_texts("an uneven batch, e.g. 7 samples over 4 devices: [2, 2, 2, 1]", SPLITTING)
    cell.metadata["autograder"] = {"status": "failed", "where": "hidden", "reason": "chunk_sizes(13, 4)", "rule": rule}
    assert summary(cell) == (
        "✘ The grader's tests of this cell failed on: an uneven batch, e.g. 7 samples over 4 devices: [2, 2, 2, 1]."
    )
    assert summary(cell, "ja") == (
        "✘ このセルの採点テストが、次の点で失敗しました：割り切れないバッチ（例：4台のデバイスに7サンプルなら"
        "[2, 2, 2, 1]）。"
    )
    assert "13" not in summary(cell) and "13" not in summary(cell, "ja")


def test_limits_in_reasons_keep_the_digits_that_matter():
    from autograder.limits import GiB, gib_text
    from autograder.reasons import reason

    assert [gib_text(size) for size in (3 * GiB // 4, 3 * GiB // 2, 24 * GiB)] == ["0.75", "1.5", "24"]
    assert str(reason("memory", gib=gib_text(GiB // 4))) == "the memory limit (0.25 GiB) was exceeded"
