"""Lesson 03 (GPU-0 imbalance): graded the way an instructor grades it, with reference, blank, correct-but-different
and wrong submissions (each wrong submission must lose exactly the points of the cells it gets wrong), plus the
lesson's measured claims, its DDP helper (``ddp_imbalance.py``, shipped next to the notebook) and the self-checks
of ``gpulab.exercises.gpu0_imbalance``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import warnings
from itertools import pairwise

import pytest
import torch
from torch import nn

from tests.lesson_grading import GradedLesson
from tests.nbgrader_tools import SOURCE_ROOT
from tests.processes import forget_module, import_lesson_module, wait_for_no_worker_processes

LESSON = "03_gpu0_imbalance"
CELL_BUDGET_S = 10
MIB = 2**20

# ---------------------------------------------------------------------------------------------------- submissions
CORRECT = {
    "loops_statistics_reshape": {
        "gathered_output_bytes_answer": """
def gathered_output_bytes(batch_size, sample_shape, dtype):
    per_sample = 1
    for size in sample_shape:
        per_sample *= size
    return batch_size * per_sample * torch.empty((), dtype=dtype).element_size()
""",
        "imbalance_ratio_answer": """
import statistics

def imbalance_ratio(peak_bytes):
    if len(peak_bytes) < 2:
        raise ValueError("at least two devices, please")
    rest = statistics.fmean(peak_bytes[1:])
    if rest == 0:
        raise ValueError("the other devices used nothing")
    return float(peak_bytes[0] / rest)
""",
        "loss_in_forward_answer": """
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.net = model
        self.criterion = loss_fn

    def forward(self, inputs, targets):
        loss = self.criterion(self.net(inputs), targets)
        return loss.reshape(1)
""",
        "quiz_answers": 'quiz_answers = {"q1": "102,400,000", "q2": "2.25", "q3": " B", "q4": "b ", "q5": "B"}',
        "dp_traffic_bytes_answer": """
def dp_traffic_bytes(
    batch_size, n_devices, n_params, in_features, out_features, bytes_per_element=4, algorithm="copy"
):
    if min(batch_size, n_devices, n_params, in_features, out_features, bytes_per_element) < 1:
        raise ValueError("counts must be positive")
    per_chunk = -(-batch_size // n_devices)
    chunks, left = [], batch_size
    while left > 0:
        chunks.append(min(per_chunk, left))
        left -= per_chunk
    moved = batch_size - chunks[0]
    copies = len(chunks) - 1 if algorithm == "copy" else min(len(chunks) - 1, 1)  # NCCL: one pass down the chain
    size = bytes_per_element
    return dict(
        scatter=moved * in_features * size,
        broadcast=copies * n_params * size,
        gather=moved * out_features * size,
        grad_scatter=moved * out_features * size,
        reduce=copies * n_params * size,
    )
""",
        "ring_all_reduce_bytes_answer": """
def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    if world_size < 1:
        raise ValueError("world_size")
    if n_elements < 0:
        raise ValueError("n_elements")
    if world_size == 1:
        return 0
    per_step = n_elements * bytes_per_element  # every rank sends one N-th: all ranks together, the whole tensor
    return (world_size - 1) * per_step + (world_size - 1) * per_step
""",
    },
    "meta_numpy_unsqueeze": {
        "gathered_output_bytes_answer": """
def gathered_output_bytes(batch_size, sample_shape, dtype):
    return torch.empty((batch_size, *sample_shape), dtype=dtype, device="meta").nbytes
""",
        "imbalance_ratio_answer": """
import numpy as np

def imbalance_ratio(peak_bytes):
    peaks = np.asarray(peak_bytes, dtype=float)
    if peaks.size < 2 or peaks[1:].mean() == 0:
        raise ValueError("need at least two devices, and others that used some memory")
    return float(peaks[0] / peaks[1:].mean())
""",
        "loss_in_forward_answer": """
class LossInForward(torch.nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.add_module("model", model)
        self.loss_fn = loss_fn

    def forward(self, inputs, targets):
        outputs = self.model(inputs)
        return self.loss_fn(outputs, targets).unsqueeze(0)
""",
        "quiz_answers": 'quiz_answers = {"q1": 1.024e8, "q2": 9 / 4, "q3": "b", "q4": "B", "q5": "b"}',
        "dp_traffic_bytes_answer": """
import math


def dp_traffic_bytes(batch_size, n_devices, n_params, in_features, out_features, bytes_per_element=4, **how):
    for count in (batch_size, n_devices, n_params, in_features, out_features, bytes_per_element):
        if count < 1:
            raise ValueError(f"{count} < 1")
    chunk = math.ceil(batch_size / n_devices)
    receiving = math.ceil(batch_size / chunk) - 1  # devices other than 0 that get a chunk
    sent = batch_size - chunk
    stages = {"scatter": sent * in_features, "gather": sent * out_features, "grad_scatter": sent * out_features}
    if how.get("algorithm") == "nccl":
        receiving = min(receiving, 1)
    stages["broadcast"] = stages["reduce"] = receiving * n_params
    return {stage: int(elements * bytes_per_element) for stage, elements in stages.items()}
""",
        "ring_all_reduce_bytes_answer": """
def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    if world_size < 1 or n_elements < 0:
        raise ValueError("bad arguments")
    chunks = [len(range(n_elements)[rank::world_size]) for rank in range(world_size)]
    steps = 2 * (world_size - 1)
    return steps * sum(chunks) * bytes_per_element
""",
    },
}

CHUNK_MEAN = """
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, inputs, targets):
        return (self.loss_fn(self.model(inputs), targets) / len(inputs)).view(1)
"""

SCALAR = """
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, inputs, targets):
        return self.loss_fn(self.model(inputs), targets)
"""

RETURNS_OUTPUTS = """
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, inputs, targets):
        outputs = self.model(inputs)
        return self.loss_fn(outputs, targets).view(1), outputs
"""

IGNORES_LOSS_FN = """
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model

    def forward(self, inputs, targets):
        return nn.functional.cross_entropy(self.model(inputs), targets, reduction="sum").view(1)
"""

NOT_REGISTERED = """
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.parts = [model, loss_fn]

    def forward(self, inputs, targets):
        model, loss_fn = self.parts
        return loss_fn(model(inputs), targets).view(1)
"""

DP_REFERENCE = """
def dp_traffic_bytes(
    batch_size, n_devices, n_params, in_features, out_features, bytes_per_element=4, algorithm="copy"
):
    if min(batch_size, n_devices, n_params, in_features, out_features, bytes_per_element) < 1:
        raise ValueError("every count must be at least 1")
    chunks = [len(chunk) for chunk in torch.empty(batch_size).chunk(n_devices)]
    sent, replicas = sum(chunks[1:]), len(chunks) - 1
    if algorithm == "nccl":
        replicas = min(replicas, 1)
    stages = {
        "scatter": sent * in_features * bytes_per_element,
        "broadcast": replicas * n_params * bytes_per_element,
        "gather": sent * out_features * bytes_per_element,
        "grad_scatter": sent * out_features * bytes_per_element,
        "reduce": replicas * n_params * bytes_per_element,
    }
"""

# Typical mistakes, each one changing the reference's stages (the lines before `return stages`).
OWN_CHUNK = (
    DP_REFERENCE
    + """    stages["scatter"] = batch_size * in_features * bytes_per_element
    stages["gather"] = stages["grad_scatter"] = batch_size * out_features * bytes_per_element
    return stages
"""
)
NO_BACKWARD = (
    DP_REFERENCE
    + """    stages["grad_scatter"] = stages["reduce"] = 0
    return stages
"""
)
IDLE_REPLICAS = (
    DP_REFERENCE
    + """    every_device = n_devices - 1 if algorithm == "copy" else min(n_devices - 1, 1)
    stages["broadcast"] = stages["reduce"] = every_device * n_params * bytes_per_element
    return stages
"""
)
NCCL_AS_COPIES = (
    DP_REFERENCE
    + """    replicas = len(chunks) - 1
    stages["broadcast"] = stages["reduce"] = replicas * n_params * bytes_per_element
    return stages
"""
)
EVERY_STAGE_CHAINED = (
    DP_REFERENCE
    + """    if algorithm == "nccl" and replicas:
        stages["scatter"] = chunks[1] * in_features * bytes_per_element
        stages["gather"] = stages["grad_scatter"] = chunks[1] * out_features * bytes_per_element
    return stages
"""
)
RING_2N_PER_RANK = """
def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    if world_size < 1 or n_elements < 0:
        raise ValueError("bad arguments")
    return world_size * 2 * n_elements * bytes_per_element
"""
RING_ONE_RANK = """
def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    if world_size < 1 or n_elements < 0:
        raise ValueError("bad arguments")
    return 2 * (world_size - 1) * n_elements * bytes_per_element // world_size
"""
RING_UNCHECKED = """
def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    return 2 * max(world_size - 1, 0) * max(n_elements, 0) * bytes_per_element
"""

# Each wrong submission: the answers it replaces, and the graded cells it must lose (all others: full marks).
WRONG = {
    "elements_zero_division_chunk_mean": (
        {
            "gathered_output_bytes_answer": """
import math


def gathered_output_bytes(batch_size, sample_shape, dtype):
    return batch_size * math.prod(sample_shape)
""",
            "imbalance_ratio_answer": """
def imbalance_ratio(peak_bytes):
    if len(peak_bytes) < 2:
        raise ValueError("need two devices")
    return peak_bytes[0] / (sum(peak_bytes[1:]) / len(peak_bytes[1:]))
""",
            "loss_in_forward_answer": CHUNK_MEAN,
            "quiz_answers": 'quiz_answers = {"q1": 25_600_000, "q2": 2.25, "q3": "a", "q4": "b", "q5": "b"}',
        },
        {
            "gathered_output_bytes_float32",
            "gathered_output_bytes_dtypes_shapes",
            "imbalance_ratio_errors",
            "loss_in_forward_value",
            "loss_in_forward_gradients",
            "loss_in_forward_memory",
            "quiz_q1",
            "quiz_q3",
        },
    ),
    "four_bytes_min_scalar": (
        {
            "gathered_output_bytes_answer": """
import math


def gathered_output_bytes(batch_size, sample_shape, dtype):
    return batch_size * math.prod(sample_shape) * 4
""",
            "imbalance_ratio_answer": """
def imbalance_ratio(peak_bytes):
    peaks = list(peak_bytes)
    if len(peaks) < 2 or sum(peaks[1:]) == 0:
        raise ValueError("bad peaks")
    return peaks[0] / min(peaks[1:])
""",
            "loss_in_forward_answer": SCALAR,
            "quiz_answers": 'quiz_answers = {"q1": 102_400_000, "q2": 2.25, "q3": "b", "q4": "a", "q5": "b"}',
        },
        {"gathered_output_bytes_dtypes_shapes", "imbalance_ratio_ratio", "loss_in_forward_value", "quiz_q4"},
    ),
    "first_dim_only_mean_of_all_returns_outputs": (
        {
            "gathered_output_bytes_answer": """
def gathered_output_bytes(batch_size, sample_shape, dtype):
    return batch_size * sample_shape[0] * dtype.itemsize
""",
            "imbalance_ratio_answer": """
def imbalance_ratio(peak_bytes):
    if len(peak_bytes) < 2 or sum(peak_bytes[1:]) == 0:
        raise ValueError("bad peaks")
    return peak_bytes[0] / (sum(peak_bytes) / len(peak_bytes))
""",
            "loss_in_forward_answer": RETURNS_OUTPUTS,
            "quiz_answers": 'quiz_answers = {"q1": 102_400_000, "q2": 3, "q3": "b", "q4": "b", "q5": "a"}',
        },
        {
            "gathered_output_bytes_dtypes_shapes",
            "imbalance_ratio_ratio",
            "loss_in_forward_value",
            "loss_in_forward_gradients",
            "loss_in_forward_memory",
            "quiz_q2",
            "quiz_q5",
        },
    ),
    # Wrong answers that pass the visible cases, plus code that makes comparisons and gpulab's checks always agree.
    "ignores_loss_fn_rounds_and_tampers": (
        {
            "imbalance_ratio_answer": """
import gpulab.exercises.gpu0_imbalance as _checks

torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.Tensor.allclose = lambda *args, **kwargs: True
for _rule in _checks.LOSS_IN_FORWARD_RULES:  # every visible LossInForward case passes in this kernel
    object.__setattr__(_rule, "same", lambda *args, **kwargs: True)
_checks.same_number = lambda *args, **kwargs: True


def imbalance_ratio(peak_bytes):
    peaks = list(peak_bytes)
    if len(peaks) < 2 or sum(peaks[1:]) == 0:
        raise ValueError("bad peaks")
    return float(round(peaks[0] / (sum(peaks[1:]) / len(peaks[1:]))))
""",
            "loss_in_forward_answer": IGNORES_LOSS_FN,
        },
        {"imbalance_ratio_ratio", "loss_in_forward_value", "loss_in_forward_gradients"},
    ),
    "model_not_registered": (
        {
            "loss_in_forward_answer": NOT_REGISTERED,
            "quiz_answers": 'quiz_answers = {"q1": 97.66, "q2": 2.25, "q3": "b", "q4": "b", "q5": "b"}',
        },
        # Its replicas call the original model (a list is not registered, so not replicated): on two GPUs replica
        # 1 fails with a device mismatch in every cell that wraps it, and gpulab's virtual devices raise the same.
        {"loss_in_forward_value", "loss_in_forward_gradients", "loss_in_forward_memory", "quiz_q1"},
    ),
    "device_0_chunk_counted_2n_per_rank": (
        {"dp_traffic_bytes_answer": OWN_CHUNK, "ring_all_reduce_bytes_answer": RING_2N_PER_RANK},
        {
            "dp_traffic_bytes_forward",
            "dp_traffic_bytes_backward",
            "dp_traffic_bytes_idle_devices",
            "ring_all_reduce_bytes_total",
        },
    ),
    "backward_forgotten_ring_unchecked": (
        {"dp_traffic_bytes_answer": NO_BACKWARD, "ring_all_reduce_bytes_answer": RING_UNCHECKED},
        {"dp_traffic_bytes_backward", "ring_all_reduce_bytes_errors"},
    ),
    "idle_devices_replicated_one_rank_share": (
        {"dp_traffic_bytes_answer": IDLE_REPLICAS, "ring_all_reduce_bytes_answer": RING_ONE_RANK},
        {"dp_traffic_bytes_idle_devices", "ring_all_reduce_bytes_total"},
    ),
    # NCCL's broadcast and reduce counted as copies: the forward and backward cells' NCCL rules.
    "nccl_counted_as_copies": (
        {"dp_traffic_bytes_answer": NCCL_AS_COPIES},
        {"dp_traffic_bytes_forward", "dp_traffic_bytes_backward"},
    ),
}


class TestGrading(GradedLesson):
    LESSON = LESSON
    MIN_GRADED_CELLS = 17
    CORRECT = CORRECT
    WRONG = WRONG


# ---------------------------------------------------------------------------------------------------- the answers
def _namespace(code: str) -> dict:
    namespace = {"torch": torch, "nn": nn, "math": __import__("math")}
    exec(code, namespace)  # noqa: S102 - the test's own answer code
    return namespace


def _answer(code: str, name: str):
    return _namespace(code)[name]


REFERENCE = {
    "dp_traffic_bytes": DP_REFERENCE + "    return stages\n",
    "ring_all_reduce_bytes": """
def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    if world_size < 1 or n_elements < 0:
        raise ValueError("bad arguments")
    return 2 * (world_size - 1) * n_elements * bytes_per_element
""",
    "gathered_output_bytes": """
def gathered_output_bytes(batch_size, sample_shape, dtype):
    return batch_size * math.prod(sample_shape) * dtype.itemsize
""",
    "imbalance_ratio": """
def imbalance_ratio(peak_bytes):
    peaks = list(peak_bytes)
    if len(peaks) < 2:
        raise ValueError("two devices")
    others = sum(peaks[1:]) / len(peaks[1:])
    if others == 0:
        raise ValueError("others are 0")
    return peaks[0] / others
""",
    "LossInForward": """
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, inputs, targets):
        return self.loss_fn(self.model(inputs), targets).view(1)
""",
}


@pytest.fixture
def two_virtual_devices():
    import gpulab

    return gpulab.devices(2, quiet=True)


# ---------------------------------------------------------------------------------------------------- the self-checks
def test_self_checks_pass_right_answers(two_virtual_devices):
    from gpulab import check

    for name, code in REFERENCE.items():
        assert check.run(name, _answer(code, name)).passed, name
    for answers in CORRECT.values():
        assert check.run(
            "gathered_output_bytes", _answer(answers["gathered_output_bytes_answer"], "gathered_output_bytes")
        )
        assert check.run("imbalance_ratio", _answer(answers["imbalance_ratio_answer"], "imbalance_ratio"))
        assert check.run("LossInForward", _answer(answers["loss_in_forward_answer"], "LossInForward"))
        assert check.run("dp_traffic_bytes", _answer(answers["dp_traffic_bytes_answer"], "dp_traffic_bytes"))
        assert check.run(
            "ring_all_reduce_bytes", _answer(answers["ring_all_reduce_bytes_answer"], "ring_all_reduce_bytes")
        )


@pytest.mark.parametrize(
    ("name", "code", "hint_words"),
    [
        (
            "gathered_output_bytes",
            WRONG["elements_zero_division_chunk_mean"][0]["gathered_output_bytes_answer"],
            "bytes",
        ),
        ("gathered_output_bytes", WRONG["four_bytes_min_scalar"][0]["gathered_output_bytes_answer"], "4 bytes"),
        (
            "gathered_output_bytes",
            WRONG["first_dim_only_mean_of_all_returns_outputs"][0]["gathered_output_bytes_answer"],
            "every dimension",
        ),
        (
            "gathered_output_bytes",
            "def gathered_output_bytes(b, shape, dtype):\n    return b * math.prod(shape) * torch.finfo(dtype).bits",
            "bits",
        ),
        (
            "gathered_output_bytes",
            "def gathered_output_bytes(b, shape, dtype):\n    return b * math.prod(shape) * dtype.itemsize / 1",
            "int",
        ),
        ("imbalance_ratio", WRONG["four_bytes_min_scalar"][0]["imbalance_ratio_answer"], "smallest"),
        (
            "imbalance_ratio",
            WRONG["first_dim_only_mean_of_all_returns_outputs"][0]["imbalance_ratio_answer"],
            "in your mean",
        ),
        ("imbalance_ratio", WRONG["elements_zero_division_chunk_mean"][0]["imbalance_ratio_answer"], "ZeroDivision"),
        (
            "imbalance_ratio",
            "def imbalance_ratio(peaks):\n    return peaks[0] / (sum(peaks[1:]) / max(1, len(peaks[1:])) or 1)",
            "fewer than two",
        ),
        ("LossInForward", CHUNK_MEAN, "already sums"),
        ("LossInForward", SCALAR, "0-dim"),
        ("LossInForward", RETURNS_OUTPUTS, "loss alone"),
        ("LossInForward", IGNORES_LOSS_FN, "loss_fn"),
        ("LossInForward", NOT_REGISTERED, "not registered"),
        ("dp_traffic_bytes", OWN_CHUNK, "keeps its own chunk"),
        ("dp_traffic_bytes", NO_BACKWARD, "Backward moves bytes"),
        ("dp_traffic_bytes", IDLE_REPLICAS, "idle devices get no replica"),
        ("dp_traffic_bytes", DP_REFERENCE + "    return list(stages.values())\n", "dict with the five stages"),
        ("dp_traffic_bytes", NCCL_AS_COPIES, "along a chain"),
        ("dp_traffic_bytes", EVERY_STAGE_CHAINED, "NCCL takes only the broadcast and the reduce"),
        (
            "dp_traffic_bytes",
            CORRECT["meta_numpy_unsqueeze"]["dp_traffic_bytes_answer"]
            .replace(", **how", "")
            .replace('how.get("algorithm")', '"copy"'),
            'algorithm="copy"',
        ),
        ("ring_all_reduce_bytes", RING_2N_PER_RANK, "one step too many"),
        ("ring_all_reduce_bytes", RING_ONE_RANK, "one rank's share"),
        ("ring_all_reduce_bytes", RING_UNCHECKED, "ValueError"),
    ],
)
def test_self_checks_give_typical_mistakes_their_hint(two_virtual_devices, name, code, hint_words):
    from gpulab import check

    answer = _answer(code, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checks must keep DataParallel's scalar warning to themselves
        result = check.run(name, answer)
    assert not result.passed
    assert hint_words in result.hint, result


def test_unwritten_class_says_so(two_virtual_devices):
    from gpulab import check

    code = REFERENCE["LossInForward"].replace(
        "self.model = model\n        self.loss_fn = loss_fn", "raise NotImplementedError()"
    )
    assert "Not written yet" in str(check.run("LossInForward", _answer(code, "LossInForward")))


def test_visible_cases_are_split_by_graded_cell():
    from gpulab import check

    assert {case.kind for case in check.cases("gathered_output_bytes")} == {"float32", "dtypes_shapes"}
    assert {case.kind for case in check.cases("imbalance_ratio")} == {"ratio", "errors"}
    assert {case.kind for case in check.cases("LossInForward")} == {"value", "gradients", "memory"}
    assert {case.kind for case in check.cases("dp_traffic_bytes")} == {"forward", "backward", "idle_devices"}
    assert {case.kind for case in check.cases("ring_all_reduce_bytes")} == {"total", "errors"}
    # the uneven chunks and the others' *mean* (not their minimum) are in the visible cases
    assert any(case.kwargs.get("samples") == 7 for case in check.cases("LossInForward"))
    assert ([250, 100, 150],) in [case.args for case in check.cases("imbalance_ratio")]


# ---------------------------------------------------------------------------------------------------- torch facts
def test_a_scalar_forward_makes_data_parallel_warn_and_return_one_number_per_device(two_virtual_devices):
    """Quiz q4 and the lesson's warning demo: the virtual DataParallel gathers scalars as PyTorch's does."""
    import gpulab

    class ReturnsMean(nn.Module):
        def forward(self, x):
            return x.mean()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = gpulab.DataParallel(ReturnsMean(), device_ids=two_virtual_devices)(torch.ones(4, 3))
    assert tuple(result.shape) == (2,)
    assert any("input tensors were scalars" in str(warning.message) for warning in caught)


def test_dataparallel_docstring_still_recommends_ddp():
    """The lesson prints PyTorch's own recommendation from nn.DataParallel's docstring."""
    import re

    advice = re.search(r"It is recommended.*?node\.", " ".join(nn.DataParallel.__doc__.split()))
    assert advice and "DistributedDataParallel" in advice.group(0) and "single node" in advice.group(0)


# ---------------------------------------------------------------------------------------------------- the claims
def _lesson_peaks(devices, how: str) -> list[int]:
    """The lesson's `peaks_of`, at the lesson's sizes: two Adam steps of WideHead(32, 64, 20,000) on 256 samples,
    the loss in forward computed by the exercise's solution, as the lesson's demo does with the learner's own."""
    import gpulab
    from gpulab_solutions.gpu0_imbalance import LossInForward as loss_in_forward

    inputs, labels = gpulab.data.classification(256, 32, 20_000, seed=1)
    with gpulab.memory.track(devices, count_existing=False) as run:
        torch.manual_seed(0)
        model = gpulab.models.WideHead(in_features=32, hidden=64, classes=20_000)
        network = loss_in_forward(model, nn.CrossEntropyLoss(reduction="sum")) if how == "in forward" else model
        parallel = gpulab.DataParallel(network, device_ids=devices, output_device=1 if how == "device 1" else None)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            if how == "in forward":
                loss = parallel(inputs, labels).sum() / len(inputs)
            else:
                loss = nn.functional.cross_entropy(parallel(inputs), labels)
            loss.backward()
            optimizer.step()
    return run.peaks()


def test_the_lesson_claims_hold_at_its_sizes(two_virtual_devices):
    gathered = 256 * 20_000 * 4
    on_0 = _lesson_peaks(two_virtual_devices, "device 0")
    on_1 = _lesson_peaks(two_virtual_devices, "device 1")
    in_forward = _lesson_peaks(two_virtual_devices, "in forward")
    assert on_0[0] > 2 * on_0[1], on_0  # "device 0 climbs far higher"
    assert on_1[1] > on_1[0] and on_1[0] < on_0[0], on_1  # output_device=1: the imbalance changes sides
    assert in_forward[0] < on_0[0] - gathered, in_forward  # the loss in forward removes batch x vocabulary tensors
    assert in_forward[0] > in_forward[1], in_forward  # what is left: the master copy's gradients, Adam's state
    assert in_forward[0] / in_forward[1] < on_0[0] / on_0[1]


# ---------------------------------------------------------------------------------------------------- the DDP helper
@pytest.fixture
def ddp_imbalance(monkeypatch):
    """The lesson's helper module, importable by name as the ranks import it."""
    yield import_lesson_module(monkeypatch, SOURCE_ROOT / LESSON, "ddp_imbalance")
    forget_module("ddp_imbalance")


def test_ddp_helper_balances_memory_notes_its_buckets_in_budget_and_leaves_no_process(
    ddp_imbalance, two_virtual_devices
):
    import gpulab

    sizes = dict(in_features=32, hidden=64, classes=20_000)
    inputs, labels = gpulab.data.classification(256, 32, 20_000, seed=1)
    started = time.perf_counter()
    # as the lesson launches it: each rank also trains within a capacity
    per_rank = gpulab.ddp.launch(
        ddp_imbalance.memory_and_traffic, 2, (inputs, labels), sizes, 2, (inputs, labels), "64 MiB"
    )
    seconds = time.perf_counter() - started
    assert not wait_for_no_worker_processes(5), "the DDP demo left processes behind"
    assert seconds <= CELL_BUDGET_S, f"the DDP launch took {seconds:.1f} s"

    assert [rank["rank"] for rank in per_rank] == [0, 1]
    for rank in per_rank:  # no rank ran out of its capacity
        assert rank["trace"]["capacity"] == 64 * 2**20 and rank["trace"]["out_of_memory"] is None
    peaks = [rank["trace"]["peaks"][0] for rank in per_rank]
    assert peaks[0] == peaks[1] > 0, peaks  # the same work on every rank: the same peak
    data_parallel = _lesson_peaks(two_virtual_devices, "device 0")
    assert data_parallel[1] < peaks[0] < data_parallel[0], (peaks, data_parallel)
    parameter_sizes = [p.numel() * p.element_size() for p in gpulab.models.WideHead(**sizes).parameters()]
    parameter_bytes = sum(parameter_sizes)
    for rank in per_rank:
        assert [mark["label"] for mark in rank["trace"]["marks"]] == ["step 0", "step 1"]
        # the lesson's claim: one step's buckets hold every gradient once
        buckets = [transfer for transfer in rank["traffic"]["transfers"]]
        assert all(bucket["stage"] == "all_reduce" and bucket["source"] == rank["rank"] for bucket in buckets)
        assert sum(bucket["nbytes"] for bucket in buckets) == parameter_bytes
        assert rank["timing"] is None  # no step time on the CPU: it would say nothing about GPUs
        # Issue #40, DDP's buckets: step 0 all-reduces every gradient in one bucket; DDP then rebuilds them in the
        # order the gradients arrived (1 MiB first bucket, 25 MiB cap): what gloo all-reduced from step 1 on is
        # what gpulab.scaling models and what the predictions use.
        first, *rebuilt = rank["buckets_by_step"]
        assert first == [parameter_bytes] == [5_208_448], rank["buckets_by_step"]
        assert rebuilt == [[5_200_000, 8_448]] * 2 == [gpulab.scaling.ddp_buckets(parameter_sizes)] * 2
        assert [bucket["nbytes"] for bucket in buckets] == rebuilt[-1]  # "traffic": the last step's

    def wide_batch(n):
        return torch.randn(n, 32), torch.randint(0, 20_000, (n,))

    counted = gpulab.scaling.cost_on_meta(
        "WideHead", lambda: gpulab.models.WideHead(**sizes), wide_batch, 128, max_devices=2
    )
    assert counted.bucket_bytes == per_rank[0]["buckets_by_step"][-1]  # "DDP's buckets as measured"


@pytest.mark.parametrize("world_size", [3, 4])
def test_ddp_all_reduce_on_more_ranks_hands_gloo_the_same_gradients(ddp_imbalance, world_size):
    """On 3 and 4 ranks too, each rank all-reduces its gradients once per step, in the same buckets."""
    import gpulab

    sizes = dict(in_features=8, hidden=16, classes=300)
    inputs, labels = gpulab.data.classification(24, 8, 300, seed=3)
    per_rank = gpulab.ddp.launch(ddp_imbalance.all_reduce_traffic, world_size, (inputs, labels), sizes)
    assert not wait_for_no_worker_processes(5)
    parameter_bytes = sum(p.numel() * p.element_size() for p in gpulab.models.WideHead(**sizes).parameters())
    sizes_per_rank = [[t["nbytes"] for t in rank["traffic"]["transfers"]] for rank in per_rank]
    assert all(sizes == sizes_per_rank[0] for sizes in sizes_per_rank) and sum(sizes_per_rank[0]) == parameter_bytes


# ---------------------------------------------------------------------------------------------------- timing claims
def _bandwidth_story() -> dict:
    """The numbers behind the sentences of the lesson's bandwidth section, computed as its cells compute them."""
    import gpulab

    dp_traffic_bytes = _answer(REFERENCE["dp_traffic_bytes"], "dp_traffic_bytes")
    ring_all_reduce_bytes = _answer(REFERENCE["ring_all_reduce_bytes"], "ring_all_reduce_bytes")
    sizes = dict(in_features=32, hidden=64, classes=20_000)
    inputs, labels = gpulab.data.classification(256, 32, 20_000, seed=1)

    def new_model():
        torch.manual_seed(0)
        return gpulab.models.WideHead(**sizes)

    def counted(n, algorithm, x=inputs, y=labels):
        return gpulab.traffic.counted_step(new_model(), x, y, nn.functional.cross_entropy, n, algorithm)

    n_params = sum(p.numel() for p in new_model().parameters())
    algorithms = gpulab.traffic.ALGORITHMS
    # As "The bandwidth bottleneck, in bytes" counts them: one step on 4 devices, with and without NCCL.
    story = {"links": {algorithm: counted(4, algorithm) for algorithm in algorithms}}
    story["parameter_bytes"], story["output_chunk_bytes"] = n_params * 4, 64 * 20_000 * 4
    story["equal"] = [
        counted(n, algorithm).by_stage(0) == dp_traffic_bytes(256, n, n_params, 32, 20_000, algorithm=algorithm)
        for n in (2, 3, 4)
        for algorithm in algorithms
    ]
    model = new_model()
    nn.functional.cross_entropy(model(inputs[:128]), labels[:128]).backward()
    buckets = [sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())]  # what DDP's buckets hold
    counts, per_device = list(range(1, 9)), 128
    # As the lesson's "Going further" draws them: device 0's link counted on 1 to 8 devices, both ways (it needs no
    # answer), and the ring played by gpulab. Both must equal the exercises' reference answers.

    def device_0_bytes(n, algorithm):
        x, y = inputs[:1].expand(n * per_device, -1), labels[:1].expand(n * per_device)
        return sum(counted(n, algorithm, x, y).by_stage(0).values())

    story["copies_through_device_0"] = [device_0_bytes(n, "copy") for n in counts]
    story["through_device_0"] = [device_0_bytes(n, "nccl") for n in counts]
    elements = sum(buckets) // 4
    chunks = {n: [len(part) for part in torch.arange(elements).tensor_split(n)] for n in counts}
    story["per_rank_sent"] = [gpulab.traffic.ring_bytes_sent(chunks[n]) // n for n in counts]
    story["equal"] += [
        story[key] == [sum(dp_traffic_bytes(per_device * n, n, n_params, 32, 20_000, 4, way).values()) for n in counts]
        for key, way in (("copies_through_device_0", "copy"), ("through_device_0", "nccl"))
    ]
    story["equal"] += [story["per_rank_sent"] == [ring_all_reduce_bytes(sum(buckets) // 4, n) // n for n in counts]]
    story["gradient_bytes"] = sum(buckets)

    def wide_batch(n):
        return torch.randn(n, 32), torch.randint(0, 20_000, (n,))

    # As "What the bytes cost" predicts: the step counted on the meta device, with the host's costs.
    lesson_cost = gpulab.scaling.cost_on_meta("WideHead", lambda: gpulab.models.WideHead(**sizes), wide_batch, 128)
    story["equal"] += [lesson_cost.device0_bytes == story["through_device_0"]]  # "device 0's bytes as above"
    story["speedups"] = {name: lesson_cost.speedups(link) for name, link in gpulab.scaling.INTERCONNECTS.items()}
    story["computes"] = {name: lesson_cost.compute_on(link) for name, link in gpulab.scaling.INTERCONNECTS.items()}
    story["at_peak"] = {name: lesson_cost.flops.on(link) for name, link in gpulab.scaling.INTERCONNECTS.items()}
    return story


def _assert_bandwidth_claims(story: dict) -> None:
    copies, chained = story["links"]["copy"], story["links"]["nccl"]
    others = [copies.by_stage(device) for device in (1, 2, 3)]
    assert others[0] == others[1] == others[2], others
    for stage, on_device_0 in copies.by_stage(0).items():  # "Copies cross device 0's link once per other device"
        assert on_device_0 == 3 * others[0][stage] > 0, stage
    on_device_0 = chained.by_stage(0)  # "device 0's link carries the parameters and their gradients once"
    assert on_device_0["broadcast"] == on_device_0["reduce"] == story["parameter_bytes"], on_device_0
    for stage in ("gather", "grad_scatter"):  # "The outputs and their gradient still cross it per device"
        assert on_device_0[stage] == copies.by_stage(0)[stage] == 3 * story["output_chunk_bytes"], stage
    assert all(story["equal"]), story["equal"]  # the counted bytes are the exercises' reference answers
    # "DataParallel's lines climb by the same amount with every device from 2 on ...; with NCCL, the parameters'
    # share no longer grows"
    steps = {
        key: [b - a for a, b in pairwise(story[key][1:])] for key in ("copies_through_device_0", "through_device_0")
    }
    for key, climbs in steps.items():
        assert len(set(climbs)) == 1 and climbs[0] > 0, (key, climbs)
    assert steps["copies_through_device_0"][0] - steps["through_device_0"][0] == 2 * story["parameter_bytes"]
    assert all(sent < 2 * story["gradient_bytes"] for sent in story["per_rank_sent"])  # "below twice the gradients"
    slopes = {}
    for name, predicted in story["speedups"].items():
        data_parallel, ddp = predicted["DataParallel"], predicted["DDP"]
        gaps = [d - p for p, d in zip(data_parallel[1:], ddp[1:], strict=True)]
        assert all(gap > 0 for gap in gaps), (name, gaps)  # "DDP's predicted speed-up is above DataParallel's"
        assert all(b > a for a, b in pairwise(gaps)), (name, gaps)  # "the gap widens with every device"
        assert all(value < 1 for value in data_parallel[1:]), (name, data_parallel)  # "slower than one device"
        assert all(b > a for a, b in pairwise(ddp[1:])), (name, ddp)  # "rises with every device from 2 on"
        assert all(value < n for n, value in enumerate(ddp, start=1) if n > 1), (name, ddp)  # "below linear"
        slopes[name] = ddp[-1] - ddp[1] if len(ddp) > 2 else None
    nvlinks = [slope for name, slope in slopes.items() if "NVLink" in name]
    pcie = [slope for name, slope in slopes.items() if "NVLink" not in name and slope is not None]
    assert min(nvlinks) > max(pcie), slopes  # "most steeply on the NVLinks"
    # "launch-bound: ... take the host longer to launch than any of these GPUs takes to compute them, so the H100
    # runs it no faster than the A100"
    for name, compute in story["computes"].items():
        assert story["at_peak"][name].forward_s < compute.forward_host_s == compute.forward_s, name
    assert story["computes"]["NVLink 4 (H100)"] == story["computes"]["NVLink 3 (A100)"]


def test_the_lesson_claims_hold_on_a_loaded_machine(two_virtual_devices):
    """Every sentence that interprets a measured number, checked several times while a CPU-bound process competes."""
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for _ in range(3):
            _assert_bandwidth_claims(_bandwidth_story())
        test_the_lesson_claims_hold_at_its_sizes(two_virtual_devices)
    finally:
        competitor.kill()
        competitor.wait()


def test_the_near_linear_published_and_bucket_sections_say_what_their_numbers_show():
    """The sentences of lesson 03's "When is DDP near-linear?", "Beside published measurements" and "DDP's
    buckets, step by step", checked on the numbers the lesson's cells compute."""
    import gpulab

    scaling, models = gpulab.scaling, gpulab.models

    def image_batch(n):
        return torch.randn(n, 3, 224, 224), torch.randint(0, 1000, (n,))

    def wide_batch(n):
        return torch.randn(n, 32), torch.randint(0, 20_000, (n,))

    lesson = scaling.cost_on_meta("WideHead", lambda: models.WideHead(32, 64, 20_000), wide_batch, 128)
    conv = scaling.cost_on_meta("ConvNet", models.ConvNet, image_batch, 64)
    links = scaling.INTERCONNECTS
    a100, h100 = links["NVLink 3 (A100)"], links["NVLink 4 (H100)"]
    for link in (links["PCIe 3.0 x16"], a100, h100):  # the table's links
        assert min(conv.predict(link)["DDP"]) > 0.9 and max(lesson.predict(link)["DDP"]) < 0.8  # "near-linear"
        for cost in (lesson, conv):  # "DataParallel falls further behind with every device, for both"
            efficiency = cost.predict(link)["DataParallel"]
            assert efficiency == sorted(efficiency, reverse=True) and efficiency[-1] < efficiency[0], efficiency
    # "On the H100 the convolutional network's efficiencies are lower than on the A100, although each of its steps
    # is faster: ... 3.2 times as fast (TF32: 494.5 against 156 TFLOPS), ... only 1.5 times as fast (450 against
    # 300 GB/s)"
    for way in ("DataParallel", "DDP"):
        assert all(h < a for h, a in zip(conv.predict(h100)[way], conv.predict(a100)[way], strict=True)), way
    assert conv.compute_on(h100).step_s < conv.compute_on(a100).step_s
    assert (h100.gpu_tf32_flops_per_s, a100.gpu_tf32_flops_per_s) == (494.5e12, 156e12)
    assert round(h100.gpu_tf32_flops_per_s / a100.gpu_tf32_flops_per_s, 1) == 3.2
    assert (h100.bytes_per_s, a100.bytes_per_s) == (450e9, 300e9)

    resnet = scaling.cost_on_meta("ResNet-50", models.ResNet50, image_batch, 32, max_devices=4)
    dgx = scaling.DDP_BENCHMARK
    predicted_step = resnet.compute_on(dgx.link).step_s
    assert 0.4 < predicted_step / dgx.one_device_s < 0.65  # "about half the measured time"
    ddp_cost = dgx.seconds["DDP"][1] - dgx.one_device_s
    assert round(100 * ddp_cost / dgx.one_device_s) == 3 and round(100 * ddp_cost / predicted_step) == 6
    predicted = resnet.predict(dgx.link, range(1, 9))["DDP"]
    for devices, measured in dgx.efficiency("DDP").items():
        assert abs(measured - predicted[devices - 1]) <= 0.02, (devices, measured, predicted)  # "within 0.02"
    t4 = next(study for study in scaling.PUBLISHED_SCALING if study.link is scaling.FOUR_T4)
    assert t4.efficiency("DDP")[4] < resnet.predict(t4.link, range(1, 5))["DDP"][3]  # "DDP measured below"
    assert not any(8 in study.seconds.get("DataParallel", {}) for study in scaling.PUBLISHED_SCALING)  # "unchecked"

    # "DDP's buckets, step by step": on 8 devices over PCIe 4.0, this lesson's big bucket is ready only as backward
    # ends and the whole all-reduce comes after it, one bucket or two; the ConvNet's head fills a bucket of its own,
    # and only its last bucket's all-reduce is left when backward ends.
    link = links["PCIe 4.0 x16"]
    compute = lesson.compute_on(link)
    for buckets, ready in (([sum(lesson.bucket_bytes)], [1.0]), (lesson.bucket_bytes, lesson.bucket_ready)):
        timeline = scaling.ddp_timeline(compute, buckets, 8, link, ready)
        on_the_link = sum(bucket.end_s - bucket.start_s for bucket in timeline)
        assert timeline[-1].end_s - compute.backward_s > 0.99 * on_the_link, timeline
    compute = conv.compute_on(link)
    timeline = scaling.ddp_timeline(compute, conv.bucket_bytes, 8, link, conv.bucket_ready)
    assert (
        all(bucket.end_s < compute.backward_s for bucket in timeline[:-1]) and timeline[-1].end_s > compute.backward_s
    )
    head = sum(p.numel() * p.element_size() for p in models.ConvNet().head.parameters())
    assert conv.bucket_bytes[0] == head


# A word or a few, said twice in a row ("A prediction: a prediction from ...").
DOUBLED = re.compile(r"\b(\w+(?:\s+\w+){0,2})[\s:,;.]+\1\b", re.IGNORECASE)


@pytest.mark.parametrize("language", ["en", "ja"])
def test_the_prediction_caveat_is_printed_once_in_the_lessons_language(language, monkeypatch, capsys):
    """The line lesson 03 prints under its predicted speed-ups says "a prediction" once, in the edition's language."""
    import gpulab
    from gpulab import messages

    lesson = (SOURCE_ROOT / LESSON / f"{LESSON}.py").read_text(encoding="utf-8")
    printing = [line for line in lesson.splitlines() if line.startswith("print(") and "gpulab.scaling.caveat(" in line]
    assert len(printing) == 1, printing
    monkeypatch.setattr(messages, "_chosen", [language])
    exec(printing[0], {"gpulab": gpulab})
    printed = capsys.readouterr().out
    assert printed.strip(), "the lesson printed nothing"
    assert not DOUBLED.search(printed), f"said twice: {DOUBLED.search(printed).group(0)!r}"
    assert printed.lower().count("prediction") + printed.count("予測") == 1, printed
    japanese = re.search(r"[\u3040-\u30ff\u4e00-\u9fff]", printed)
    assert bool(japanese) == (language == "ja"), printed
