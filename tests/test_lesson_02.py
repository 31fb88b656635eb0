"""Lesson 02 (gradient averaging): graded the way an instructor grades it, with reference, blank, correct-but-
different and wrong submissions. Each wrong submission must lose exactly the points of the cells it gets wrong.

Also: the lesson's DDP demo (``ddp_averaging.py``, shipped next to the notebook) runs on 2 gloo ranks within the
notebook's cell budget and leaves no process behind.
"""

from __future__ import annotations

import time

import pytest
import torch

from tests.lesson_grading import GradedLesson
from tests.nbgrader_tools import SOURCE_ROOT
from tests.processes import forget_module, import_lesson_module, wait_for_no_worker_processes

LESSON = "02_gradient_averaging"
CELL_BUDGET_S = 10

CORRECT_BUT_DIFFERENT = {
    # stacked tensors and a weight vector instead of a Python sum
    "average_gradients_answer": """
def average_gradients(grads_per_device, chunk_sizes):
    if len(chunk_sizes) != len(grads_per_device):
        raise ValueError("need one chunk size per device")
    weights = torch.tensor([float(n) for n in chunk_sizes])
    weights = weights / weights.sum()
    result = []
    for index in range(len(grads_per_device[0])):
        stacked = torch.stack([device[index] for device in grads_per_device])
        result.append((stacked * weights.view(-1, *[1] * (stacked.dim() - 1)).to(stacked)).sum(dim=0))
    return result
""",
    # DataParallel's own way: scale each chunk's loss by n/B and add the gradients; functional_call, no deepcopy
    "data_parallel_grads_answer": """
from torch.func import functional_call

def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    params = {name: p.detach().clone().requires_grad_(True) for name, p in model.named_parameters()}
    for xs, ys in zip(torch.chunk(inputs, n_devices), torch.chunk(targets, n_devices)):
        scaled = loss_fn(functional_call(model, params, (xs,)), ys) * (xs.shape[0] / inputs.shape[0])
        scaled.backward()
    return {name: p.grad for name, p in params.items()}
""",
    # zero_grad after the step, set_to_none=False, float(loss), optimizer on the bare model's parameters
    "train_with_data_parallel_answer": """
def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
    wrapped = gpulab.DataParallel(model, device_ids=device_ids)
    sgd = torch.optim.SGD(model.parameters(), lr=lr)
    device = next(model.parameters()).device
    history = []
    for inputs, targets in batches:
        loss = loss_fn(wrapped(inputs.to(device)), targets.to(device))
        loss.backward()
        sgd.step()
        sgd.zero_grad(set_to_none=False)
        history.append(float(loss))
    return history
""",
    "quiz_answers": 'quiz_answers = {"q1": "1/5", "q2": " B", "q3": "b ", "q4": "B"}',
}

# A second correct data_parallel_grads: replicas in threads, like DataParallel, and torch.autograd.grad.
CORRECT_WITH_THREADS = {
    "data_parallel_grads_answer": """
from concurrent.futures import ThreadPoolExecutor

def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    pieces = list(zip(inputs.chunk(n_devices), targets.chunk(n_devices)))

    def run(piece):
        replica = copy.deepcopy(model)
        loss = loss_fn(replica(piece[0]), piece[1])
        return list(torch.autograd.grad(loss, list(replica.parameters())))

    with ThreadPoolExecutor(len(pieces)) as pool:
        per_device = list(pool.map(run, pieces))
    combined = average_gradients(per_device, [len(x) for x, _ in pieces])
    return {name: grad for (name, _), grad in zip(model.named_parameters(), combined)}
""",
    "train_with_data_parallel_answer": """
def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
    parallel = gpulab.DataParallel(model, device_ids=device_ids)
    optimizer = torch.optim.SGD(parallel.module.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        parallel.zero_grad()
        loss = loss_fn(parallel(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
""",
}

PLAIN_MEAN = """
def average_gradients(grads_per_device, chunk_sizes):
    if len(grads_per_device) != len(chunk_sizes):
        raise ValueError("mismatch")
    return [sum(gradients) / len(gradients) for gradients in zip(*grads_per_device)]
"""

NO_ZERO_GRAD = """
def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
    parallel = gpulab.DataParallel(model, device_ids=device_ids)
    optimizer = torch.optim.SGD(parallel.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss = loss_fn(parallel(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
"""

# Each wrong submission: the answers it replaces, and the graded cells it must lose (all others: full marks).
WRONG = {
    "plain_average_of_chunk_means": (
        {
            "average_gradients_answer": PLAIN_MEAN,
            "data_parallel_grads_answer": """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    names = [name for name, _ in model.named_parameters()]
    per_device = []
    for xs, ys in zip(inputs.chunk(n_devices), targets.chunk(n_devices)):
        replica = copy.deepcopy(model)
        loss_fn(replica(xs), ys).backward()
        per_device.append([p.grad for p in replica.parameters()])
    return {name: sum(g) / len(g) for name, g in zip(names, zip(*per_device))}
""",
            "quiz_answers": 'quiz_answers = {"q1": 1 / 3, "q2": "a", "q3": "b", "q4": "b"}',
        },
        {"average_gradients_weights", "data_parallel_grads_full_batch", "quiz_q1", "quiz_q2"},
    ),
    "in_place_tensor_split_and_no_zero_grad": (
        {
            "average_gradients_answer": """
def average_gradients(grads_per_device, chunk_sizes):
    if len(grads_per_device) != len(chunk_sizes):
        raise ValueError("mismatch")
    total = sum(chunk_sizes)
    result = [g.mul_(chunk_sizes[0] / total) for g in grads_per_device[0]]
    for grads, n in zip(grads_per_device[1:], chunk_sizes[1:]):
        for r, g in zip(result, grads):
            r.add_(g * (n / total))
    return result
""",
            "data_parallel_grads_answer": """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    names = [name for name, _ in model.named_parameters()]
    per_device, sizes = [], []
    for xs, ys in zip(inputs.tensor_split(n_devices), targets.tensor_split(n_devices)):
        replica = copy.deepcopy(model)
        loss_fn(replica(xs), ys).backward()
        per_device.append([p.grad.clone() for p in replica.parameters()])
        sizes.append(len(xs))
    return dict(zip(names, average_gradients(per_device, sizes)))
""",
            "train_with_data_parallel_answer": NO_ZERO_GRAD,
            "quiz_answers": 'quiz_answers = {"q1": 0.2, "q2": "b", "q3": "a", "q4": "c"}',
        },
        {
            "average_gradients_checks",
            "data_parallel_grads_splits_like_scatter",
            "train_with_data_parallel_losses",
            "train_with_data_parallel_weights",
            "quiz_q3",
            "quiz_q4",
        },
    ),
    "caller_model_used_and_no_data_parallel": (
        {
            "average_gradients_answer": """
def average_gradients(grads_per_device, chunk_sizes):
    batch_size = sum(chunk_sizes)
    return [sum(n / batch_size * g for n, g in zip(chunk_sizes, grads)) for grads in zip(*grads_per_device)]
""",
            # right gradients, but computed in the caller's own .grad (zeroed first)
            "data_parallel_grads_answer": """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    model.zero_grad()
    for xs, ys in zip(inputs.chunk(n_devices), targets.chunk(n_devices)):
        (loss_fn(model(xs), ys) * len(xs) / len(inputs)).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}
""",
            # the one-device loop: right numbers, but no DataParallel
            "train_with_data_parallel_answer": """
def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
""",
        },
        {
            "average_gradients_checks",
            "data_parallel_grads_model_unchanged",
            "train_with_data_parallel_uses_data_parallel",
        },
    ),
    "trains_a_copy_of_the_model": (
        {
            "train_with_data_parallel_answer": """
def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
    parallel = gpulab.DataParallel(copy.deepcopy(model), device_ids=device_ids)
    optimizer = torch.optim.SGD(parallel.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(parallel(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
""",
        },
        {"train_with_data_parallel_weights"},
    ),
    # Wrong answers plus code that makes torch's comparison functions and gpulab's checks always agree.
    "tampering_with_comparisons": (
        {
            "average_gradients_answer": """
import gpulab.exercises.gradient_averaging as _checks

torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.isclose = lambda a, b, *args, **kwargs: torch.ones_like(a, dtype=torch.bool)
torch.Tensor.allclose = lambda *args, **kwargs: True
torch.Tensor.equal = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
_checks.same_gradients = lambda *args, **kwargs: True
_checks.close_numbers = lambda *args, **kwargs: True
"""
            + PLAIN_MEAN,
            "train_with_data_parallel_answer": NO_ZERO_GRAD,
        },
        {
            "average_gradients_weights",
            "data_parallel_grads_full_batch",  # the reference data_parallel_grads calls the plain mean
            "train_with_data_parallel_losses",
            "train_with_data_parallel_weights",
        },
    ),
}


class TestGrading(GradedLesson):
    LESSON = LESSON
    MIN_GRADED_CELLS = 12
    CORRECT = {"functional": CORRECT_BUT_DIFFERENT, "threads": CORRECT_WITH_THREADS}
    WRONG = WRONG


# --------------------------------------------------------------------------------------------- the DDP demo
@pytest.fixture
def ddp_averaging(monkeypatch):
    """The lesson's helper module, importable by name as the ranks import it."""
    yield import_lesson_module(monkeypatch, SOURCE_ROOT / LESSON, "ddp_averaging")
    forget_module("ddp_averaging")


def test_ddp_demo_gives_identical_full_batch_gradients_in_budget_and_leaves_no_process(ddp_averaging):
    import gpulab
    from torch import nn

    even = gpulab.data.classification(samples=8, features=4, classes=3, seed=1)
    uneven = gpulab.data.classification(samples=7, features=4, classes=3, seed=2)
    started = time.perf_counter()
    per_rank = gpulab.ddp.launch(ddp_averaging.both_demos, 2, [even, uneven], 0)
    seconds = time.perf_counter() - started
    assert not wait_for_no_worker_processes(5), "the DDP demo left processes behind"
    assert seconds <= CELL_BUDGET_S, f"the DDP launch took {seconds:.1f} s"

    torch.manual_seed(0)
    reference = gpulab.models.MLP(in_features=4, hidden=8, classes=3)
    for index, (batch, sizes) in enumerate([(even, [4, 4]), (uneven, [4, 3])]):
        rank0, rank1 = (rank["gradients"][index] for rank in per_rank)
        assert [rank0["samples"], rank1["samples"]] == sizes
        assert rank0["gradient"].tolist() == rank1["gradient"].tolist(), "the all-reduce gives every rank the same"
        loss = nn.functional.cross_entropy(reference(batch[0]), batch[1])
        full = torch.autograd.grad(loss, reference.layers[0].weight)[0]
        gap = (rank0["gradient"] - full).abs().max().item()
        if sizes[0] == sizes[1]:
            assert gap < 1e-6, "equal shards: DDP's average is the full-batch gradient"
        else:
            assert gap > 1e-3, "unequal shards: DDP's plain average over ranks is not the full-batch gradient"

    whole_mean = even[0].mean(dim=0).tolist()
    for rank, shard in zip(per_rank, even[0].chunk(2), strict=True):
        means = rank["batchnorm"]
        assert means["local"] == pytest.approx(shard.mean(dim=0).tolist(), abs=1e-5)
        assert means["all_reduced"] == pytest.approx(whole_mean, abs=1e-5)
        if "sync_batchnorm" in means:
            assert means["sync_batchnorm"] == pytest.approx(whole_mean, abs=1e-4)


# --------------------------------------------------------------------------------------------- the self-checks
def _average(grads_per_device, chunk_sizes):
    if len(grads_per_device) != len(chunk_sizes):
        raise ValueError("one chunk size per device")
    batch_size = sum(chunk_sizes)
    return [
        sum(n / batch_size * g for n, g in zip(chunk_sizes, grads, strict=False))
        for grads in zip(*grads_per_device, strict=False)
    ]


def _plain_mean(grads_per_device, chunk_sizes):
    if len(grads_per_device) != len(chunk_sizes):
        raise ValueError("one chunk size per device")
    return [sum(grads) / len(grads) for grads in zip(*grads_per_device, strict=False)]


def _in_place(grads_per_device, chunk_sizes):
    if len(grads_per_device) != len(chunk_sizes):
        raise ValueError("one chunk size per device")
    batch_size = sum(chunk_sizes)
    result = [g.mul_(chunk_sizes[0] / batch_size) for g in grads_per_device[0]]
    for grads, n in zip(grads_per_device[1:], chunk_sizes[1:], strict=False):
        for total, g in zip(result, grads, strict=False):
            total.add_(g * (n / batch_size))
    return result


def _no_value_error(grads_per_device, chunk_sizes):
    batch_size = sum(chunk_sizes)
    return [
        sum(n / batch_size * g for n, g in zip(chunk_sizes, grads, strict=False))
        for grads in zip(*grads_per_device, strict=False)
    ]


def _dp_grads(split="chunk", combine=_average, reuse=False, on_caller=False):
    import copy

    def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
        names = [name for name, _ in model.named_parameters()]
        pieces = zip(getattr(inputs, split)(n_devices), getattr(targets, split)(n_devices), strict=False)
        shared = copy.deepcopy(model)
        per_device, sizes = [], []
        for xs, ys in pieces:
            replica = model if on_caller else shared if reuse else copy.deepcopy(model)
            if on_caller:
                model.zero_grad()
            loss_fn(replica(xs), ys).backward()
            per_device.append([p.grad.clone() for p in replica.parameters()])
            sizes.append(len(xs))
        return dict(zip(names, combine(per_device, sizes), strict=False))

    return data_parallel_grads


def _train(wrap=True, zero_grad=True, copy_model=False, as_tensors=False):
    import copy

    import gpulab

    def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
        model = copy.deepcopy(model) if copy_model else model
        network = gpulab.DataParallel(model, device_ids=device_ids) if wrap else model
        optimizer = torch.optim.SGD(network.parameters(), lr=lr)
        losses = []
        for x, y in batches:
            if zero_grad:
                optimizer.zero_grad()
            loss = loss_fn(network(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach() if as_tensors else loss.item())
        return losses

    return train_with_data_parallel


def test_self_checks_pass_right_answers():
    from gpulab import check

    assert check.run("average_gradients", _average).passed
    assert check.run("data_parallel_grads", _dp_grads()).passed
    assert check.run("train_with_data_parallel", _train()).passed


@pytest.mark.parametrize(
    ("name", "wrong", "hint_words"),
    [
        ("average_gradients", _plain_mean, "plain average"),
        ("average_gradients", _in_place, "changed the gradients it was given"),
        ("average_gradients", _no_value_error, "ValueError"),
        ("data_parallel_grads", _dp_grads(combine=_plain_mean), "averaged the replicas' gradients plainly"),
        ("data_parallel_grads", _dp_grads(split="tensor_split"), "did not see DataParallel's chunks"),
        ("data_parallel_grads", _dp_grads(reuse=True), "accumulate"),
        ("data_parallel_grads", _dp_grads(on_caller=True), "caller's model changed"),
        ("train_with_data_parallel", _train(zero_grad=False), "cleared between steps"),
        ("train_with_data_parallel", _train(wrap=False), "DataParallel wrapper"),
        ("train_with_data_parallel", _train(copy_model=True), "not a copy"),
        ("train_with_data_parallel", _train(as_tensors=True), "Python floats"),
    ],
)
def test_self_checks_give_typical_mistakes_their_hint(name, wrong, hint_words):
    from gpulab import check

    result = check.run(name, wrong)
    assert not result.passed
    assert hint_words in result.hint, result


def test_visible_cases_are_uneven_where_it_matters():
    from gpulab import check

    weights = check.cases("average_gradients", kind="weights")
    assert [case.args[1] for case in weights] == [[6, 6], [4, 4, 2], [7], [1, 3]]
    assert [(len(case.args[1]), case.args[4]) for case in check.cases("data_parallel_grads", kind="full_batch")] == [
        (12, 2),
        (10, 3),
        (7, 2),
    ]
