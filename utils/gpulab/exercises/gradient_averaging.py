"""Lesson 02 (gradient averaging): the self-checks of ``average_gradients``, ``data_parallel_grads`` and
``train_with_data_parallel``.

Every expected value comes from PyTorch itself: the gradient of the mean loss over the *whole* batch (one
``torch.autograd.grad`` on a copy of the model) and, for training, a plain one-device SGD loop on a copy of the
model. Cases are built fresh on every call, so an answer that modifies its arguments cannot spoil the next case.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gpulab.check import Call, Case, Exercise, Hint, Raises, Rule, Tolerance
from gpulab.devices import current_devices
from gpulab.messages import text

ABSOLUTE_TOLERANCE = 1e-5
RELATIVE_TOLERANCE = 1e-4
TOLERANCE = Tolerance(absolute=ABSOLUTE_TOLERANCE, relative=RELATIVE_TOLERANCE)  # the comparisons' and messages'


# --------------------------------------------------------------------------------------------- comparing
def _values(tensor: torch.Tensor) -> list[float]:
    """The tensor's numbers as a flat list of Python floats."""
    return [float(value) for value in tensor.detach().reshape(-1).cpu().tolist()]


def close_numbers(got: Sequence[float], expected: Sequence[float]) -> bool:
    """Plain-Python comparison of two lists of numbers with the lesson's tolerance (NaN never matches)."""
    if len(got) != len(expected):
        return False
    return all(TOLERANCE.close(g, e) for g, e in zip(got, expected, strict=True))


def same_tensor(got: Any, expected: torch.Tensor) -> bool:
    """``got`` is a tensor of ``expected``'s shape with the same values (within the lesson's tolerance)."""
    return (
        isinstance(got, torch.Tensor)
        and tuple(got.shape) == tuple(expected.shape)
        and close_numbers(_values(got), _values(expected))
    )


def same_gradients(got: Any, expected: Any) -> bool:
    """A list of tensors (or a ``{name: tensor}`` dict) equal, within tolerance, to ``expected``.

    The visible tests of lesson 02 use it: ``assert same_gradients(average_gradients(...), expected)``.
    """
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and sorted(got) == sorted(expected)
            and all(same_tensor(got[name], expected[name]) for name in expected)
        )
    return (
        type(got) is list
        and len(got) == len(expected)
        and all(same_tensor(g, e) for g, e in zip(got, expected, strict=True))
    )


class _ShownDict(dict):
    """A dict of gradients shown in feedback by what it is, ``label`` (a template with ``{placeholders}`` filled
    from ``fields``), in the learner's language (``gpulab.text``)."""

    def __init__(self, items, label: str, **fields: object):
        super().__init__(items)
        self.label = label
        self.fields = fields

    def __repr__(self) -> str:
        return text(self.label).format(**self.fields)


# How feedback names the expected gradients and the hidden inputs' mixing model (translated in TRANSLATIONS).
CHUNKS_LABEL = "<the gradients of DataParallel's chunks {chunks}>"
FULL_BATCH_LABEL = "<the full-batch gradients of {names}>"
MIXER_LABEL = "model that mixes each chunk"


# --------------------------------------------------------------------------------------------- references
class _SmallMLP(nn.Sequential):
    """``Linear -> Tanh -> Linear``, shown briefly in feedback messages."""

    def __repr__(self) -> str:
        return f"<MLP {self[0].in_features}-{self[0].out_features}-{self[2].out_features}>"


def _model(seed: int, in_features: int = 4, hidden: int = 6, out_features: int = 3) -> nn.Module:
    return _seeded(seed, lambda: _SmallMLP(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, out_features)))


def _classification_batch(seed: int, batch_size: int, features: int = 4, classes: int = 3):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, features, generator=generator), torch.randint(
        0, classes, (batch_size,), generator=generator
    )


def _regression_batch(seed: int, batch_size: int, features: int = 4, outputs: int = 3):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, features, generator=generator), torch.randn(batch_size, outputs, generator=generator)


def full_batch_gradients(model: nn.Module, inputs, targets, loss_fn) -> dict[str, torch.Tensor]:
    """``{name: gradient}`` of ``loss_fn(model(inputs), targets)``, by one backward on a copy of ``model``."""
    reference = copy.deepcopy(model)
    names, parameters = zip(*reference.named_parameters(), strict=True)
    gradients = torch.autograd.grad(loss_fn(reference(inputs), targets), parameters)
    return {name: gradient.detach() for name, gradient in zip(names, gradients, strict=True)}


# --------------------------------------------------------------------------------------------- average_gradients
def _average_call(seed: int, batch_size: int, n_devices: int, why: str) -> Call:
    """A model's chunk gradients and chunk sizes, with its full-batch gradient as the expected value."""
    model = _model(seed)
    inputs, labels = _classification_batch(seed, batch_size)
    parameters = list(model.parameters())
    per_device = [
        [g.detach() for g in torch.autograd.grad(nn.functional.cross_entropy(model(x), y), parameters)]
        for x, y in zip(inputs.chunk(n_devices), labels.chunk(n_devices), strict=True)
    ]
    sizes = [len(x) for x in inputs.chunk(n_devices)]
    expected = list(full_batch_gradients(model, inputs, labels, nn.functional.cross_entropy).values())
    return Call((per_device, sizes), why, expected=expected)


def _one_and_three() -> Call:
    return Call(([[torch.ones(3)], [torch.full((3,), 3.0)]], [1, 3]), "(1 * 1 + 3 * 3) / 4 = 2.5")


def _average_visible() -> list[Call]:
    return [
        _average_call(1, 12, 2, "even chunks (6 + 6): the average of the two chunk gradients is the full-batch one"),
        _average_call(2, 10, 3, "uneven chunks (4 + 4 + 2): the last chunk's mean is over 2 samples, not 4"),
        _average_call(3, 7, 1, "one device: its chunk is the whole batch"),
        _one_and_three(),
    ]


def _average_extra() -> list[Call]:
    return [
        _average_call(4, 5, 4, "5 samples on 4 devices: chunks of 2, 2 and 1"),
        _average_call(5, 13, 4, "13 samples on 4 devices: chunks of 4, 4, 4 and 1"),
    ]


def same_gradient_list(got: Any, expected: list) -> bool:
    """A plain list of tensors (exactly ``torch.Tensor``: what the grader receives as a tensor) of ``expected``'s
    shapes and values, within the lesson's tolerance."""
    return (
        type(got) is list
        and len(got) == len(expected)
        and all(type(g) is torch.Tensor and same_tensor(g, e) for g, e in zip(got, expected, strict=True))
    )


AVERAGE_GRADIENTS_RULES = (
    Rule(
        "Return a list with one tensor per parameter: the gradient of the mean loss over the whole batch",
        "weights",
        same=same_gradient_list,
        visible=_average_visible,
        extra=_average_extra,
    ),
    Rule(
        "do not modify the tensors you are given",
        "checks",
        same=lambda got, expected: True,  # the values are the weights cell's concern
        visible=lambda: [Call(_one_and_three().args, "do not modify the gradients given")],
        extra=lambda: [Call(_average_call(4, 5, 4, "").args, "do not modify the gradients given")],
        unchanged=True,
    ),
    Rule(
        "Raise `ValueError` if the two arguments have different lengths",
        "checks",
        raises=ValueError,
        visible=lambda: [
            Call(([[torch.ones(3)], [torch.full((3,), 3.0)]], [4]), "2 devices' gradients but 1 chunk size")
        ],
        extra=lambda: [Call(([[torch.ones(2)], [torch.ones(2)]], [2]), "2 devices' gradients but 1 chunk size")],
    ),
)


# The hints' mistake models compute a wrong answer and say only whether ``got`` is it: no function here returns
# gradients an answer could weigh into the right one.
def _is_plain_mean(case: Case, got: Any) -> bool:
    per_device = case.args[0]
    return same_gradients(got, [sum(column) / len(per_device) for column in zip(*per_device, strict=True)])


def _is_plain_sum(case: Case, got: Any) -> bool:
    return same_gradients(got, [sum(column) for column in zip(*case.args[0], strict=True)])


def _is_unnormalised(case: Case, got: Any) -> bool:
    """The sizes applied without dividing by the batch: the expected average times the batch size."""
    if not isinstance(case.expected, list):
        return False
    return same_gradients(got, [torch.as_tensor(e) * sum(case.args[1]) for e in case.expected])


def _changed_inputs(case: Case, got: Any) -> bool:
    """The case of the rule that asks to leave the arguments unchanged failed without raising: they changed."""
    return case.rule is not None and case.rule.unchanged and not isinstance(got, BaseException)


AVERAGE_GRADIENTS = Exercise(
    name="average_gradients",
    rules=AVERAGE_GRADIENTS_RULES,
    tolerance=TOLERANCE,
    hints=[
        Hint(
            lambda case, got: isinstance(case.expected, Raises),
            "One chunk size per device: when the two lists have different lengths the gradients cannot be weighted, "
            "and the contract asks for a ValueError.",
        ),
        Hint(
            _changed_inputs,
            "Your answer changed the gradients it was given: an in-place operation (+=, add_, mul_) writes into the "
            "caller's tensors. Combine them into new tensors instead.",
        ),
        Hint(
            lambda case, got: type(got) is not list,
            "Return a plain list with one tensor per parameter, in the same order as each device's list.",
        ),
        Hint(
            lambda case, got: len(got) == len(case.args[0]) != len(case.args[0][0]),
            "Return one tensor per *parameter* (the length of each device's list), not one per device.",
        ),
        Hint(
            _is_plain_mean,
            "That is the plain average of the devices' gradients, right only when every chunk has the same size. Each "
            "device's gradient is a mean over its own chunk, so a short chunk's samples count too much: see 'When a "
            "plain average is wrong'.",
        ),
        Hint(
            _is_plain_sum,
            "You added the devices' gradients, but each one is already a mean over its chunk. Think of the weight "
            "each sample should get in the full-batch mean (1/B), as in 'When a plain average is wrong'.",
        ),
        Hint(
            _is_unnormalised,
            "Weighting by chunk size is right; the weights of a mean over the whole batch add up to 1.",
        ),
    ],
    general_hint=(
        "The full-batch mean loss is a weighted sum of the chunks' mean losses, each weighted by its share of the "
        "batch; the gradient inherits those weights. The formula in 'Why it equals the full-batch gradient' shows it."
    ),
)


# --------------------------------------------------------------------------------------------- data_parallel_grads
class Chain(nn.Module):
    """Named children applied one after the other: the hidden inputs' models, which the grader describes to the
    kernel by their children (``autograder/checks/gradient_averaging.py``)."""

    def __init__(self, label: str, **children: nn.Module):
        super().__init__()
        self.label = label
        for name, child in children.items():
            self.add_module(name, child)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        for child in self.children():
            inputs = child(inputs)
        return inputs

    def __repr__(self) -> str:
        return f"<{text(self.label)}>"


class BatchMix(nn.Module):
    """Each sample plus the mean of the batch it arrives in: under DataParallel, the mean of its replica's chunk
    (as BatchNorm's training statistics are), so only DataParallel's split gives DataParallel's gradients."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs + inputs.mean(0, keepdim=True)


def _seeded(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` right after ``torch.manual_seed(seed)``, leaving the caller's random state as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _mixer(seed: int, in_features: int = 4, hidden: int = 6, classes: int = 3) -> nn.Module:
    """A classifier whose output for a sample depends on the other samples of the chunk it is forwarded in."""

    def build() -> nn.Module:
        return Chain(
            MIXER_LABEL,
            encoder=nn.Linear(in_features, hidden),
            mix=BatchMix(),
            act=nn.Tanh(),
            head=nn.Linear(hidden, classes),
        )

    return _seeded(seed, build)


def _grads_call(seed: int, batch_size: int, n_devices: int, why: str, regression: bool = False) -> Call:
    if regression:
        model, loss_fn = _model(seed, out_features=2), nn.MSELoss()
        inputs, targets = _regression_batch(seed, batch_size, outputs=2)
    else:
        model, loss_fn = _model(seed), nn.functional.cross_entropy
        inputs, targets = _classification_batch(seed, batch_size)
    return Call((model, inputs, targets, loss_fn, n_devices), why)


def _full_batch_visible() -> list[Call]:
    return [
        _grads_call(11, 12, 2, "12 samples on 2 devices: chunks of 6 and 6"),
        _grads_call(12, 10, 3, "10 samples on 3 devices: chunks of 4, 4 and 2, so weight them by size"),
        _grads_call(13, 7, 2, "a mean-squared-error loss, 7 samples on 2 devices: 4 and 3", regression=True),
    ]


def _full_batch_extra() -> list[Call]:
    return [
        _grads_call(14, 2, 4, "2 samples on 4 devices: only 2 chunks; the others get nothing"),
        _grads_call(17, 5, 1, "one device: the whole batch"),
    ]


def _mixer_call(seed: int, batch_size: int, n_devices: int, why: str, small: bool = False) -> Call:
    model = _mixer(seed, 3, 4, 2) if small else _mixer(seed)
    inputs, targets = _classification_batch(seed, batch_size, 3 if small else 4, 2 if small else 3)
    return Call((model, inputs, targets, nn.functional.cross_entropy, n_devices), why)


class _Chunked(_ShownDict):
    """DataParallel's gradients (each chunk forwarded on its own, the chunks' losses weighted by size), with
    ``averaged``: the same chunks' gradients averaged plainly, a weighting mistake that the full-batch rule judges."""

    def __init__(self, weighted: dict, averaged: dict, chunks: list[int]):
        super().__init__(weighted, CHUNKS_LABEL, chunks=chunks)
        self.averaged = averaged


def same_chunked(got: Any, expected: _Chunked) -> bool:
    return same_gradients(got, expected) or same_gradients(got, expected.averaged)


def _with_stale_gradients(seed: int, batch_size: int, n_devices: int, why: str, leftover: bool = True) -> Call:
    """A model holding ``.grad`` of an earlier step (or none), on even chunks: only leaving it alone is judged."""
    model = _model(seed, hidden=5)
    inputs, targets = _classification_batch(seed, batch_size)
    if leftover:
        nn.functional.cross_entropy(model(inputs[:1] * 3), targets[:1]).backward()
    return Call((model, inputs, targets, nn.functional.cross_entropy, n_devices), why)


def _unchanged_visible() -> list[Call]:
    return [_with_stale_gradients(1, 6, 2, "the model holds gradients from an earlier step; leave it as it was")]


def _unchanged_extra() -> list[Call]:
    return [
        _with_stale_gradients(15, 8, 2, "the model already holds gradients from an earlier step"),
        _with_stale_gradients(16, 8, 2, "the caller's model must not change", leftover=False),
    ]


FULL_BATCH = (
    "return `{parameter name: gradient}`, equal to the gradient of the mean loss `loss_fn(model(inputs), targets)` "
    "over the whole batch"
)
SPLIT_LIKE_SCATTER = "split the batch as DataParallel's scatter splits it, and forward each chunk through a replica"
LEFT_UNCHANGED = (
    "leave the arguments as they were (`model`, its weights and `.grad`, `inputs`, `targets`), and let no old "
    "`.grad` leak into the result"
)

DATA_PARALLEL_GRADS_RULES = (
    Rule(
        FULL_BATCH,
        "full_batch",
        same=same_gradients,
        visible=_full_batch_visible,
        extra=_full_batch_extra,
    ),
    Rule(
        SPLIT_LIKE_SCATTER,
        "splits_like_scatter",
        same=same_chunked,
        visible=lambda: [
            _mixer_call(18, 10, 3, "10 samples on 3 devices: chunks of 4, 4 and 2"),
            _mixer_call(19, 2, 4, "2 samples on 4 devices: only 2 chunks; the others get nothing"),
        ],
        extra=lambda: [
            _mixer_call(20, 10, 4, "10 samples on 4 devices: DataParallel's chunks are 3, 3, 3 and 1"),
            _mixer_call(21, 3, 5, "3 samples on 5 devices: three chunks of 1"),
        ],
    ),
    Rule(
        LEFT_UNCHANGED,
        "model_unchanged",
        same=same_gradients,
        visible=_unchanged_visible,
        extra=_unchanged_extra,
        unchanged=True,
    ),
)


def _data_parallel_mistake(case: Case, got: Any) -> str:
    """Which typical mistake ``got`` is, for data_parallel_grads' hints: ``"naive"`` (the chunks' gradients
    averaged with equal weights), ``"accumulated"`` (one replica reused for every chunk, its .grad holding the
    chunks before), or ``""``. It says which, never the gradients it compared with."""
    model, inputs, targets, loss_fn, n_devices = case.args
    copied = copy.deepcopy(model)
    parameters = list(copied.parameters())
    chunks = list(zip(inputs.chunk(n_devices), targets.chunk(n_devices), strict=True))
    per_device = [[g.detach() for g in torch.autograd.grad(loss_fn(copied(x), y), parameters)] for x, y in chunks]
    names = [name for name, _ in model.named_parameters()]

    def named(columns) -> dict:
        return dict(zip(names, columns, strict=True))

    if same_gradients(got, named([sum(column) / len(per_device) for column in zip(*per_device, strict=True)])):
        return "naive"
    if len(per_device) < 2:
        return ""
    running = [list(per_device[0])]
    for grads in per_device[1:]:
        running.append([r + g for r, g in zip(running[-1], grads, strict=True)])
    batch_size = len(inputs)
    cloned = [
        sum(len(x) / batch_size * g for (x, _), g in zip(chunks, column, strict=True))
        for column in zip(*running, strict=True)
    ]
    return "accumulated" if any(same_gradients(got, named(grads)) for grads in (cloned, running[-1])) else ""


def _is_naive_average(case: Case, got: Any) -> bool:
    return _data_parallel_mistake(case, got) == "naive"


def _accumulated_across_chunks(case: Case, got: Any) -> bool:
    """One replica reused for every chunk: each chunk's .grad also holds the chunks before it."""
    return _data_parallel_mistake(case, got) == "accumulated"


def _has_nan(case: Case, got: Any) -> bool:
    return isinstance(got, dict) and any(
        isinstance(value, torch.Tensor) and any(math.isnan(v) for v in _values(value)) for value in got.values()
    )


def _of_rule(kind: str) -> Callable[[Case], bool]:
    return lambda case: case.rule is not None and case.rule.kind == kind


def _changed_arguments(case: Case, got: Any) -> bool:
    """A case of the rule that asks to leave the arguments alone, failed with the right gradients: they changed."""
    return _of_rule("model_unchanged")(case) and same_gradients(got, case.expected)


def _wrong_keys(case: Case, got: Any) -> bool:
    return not isinstance(got, dict) or sorted(got) != sorted(case.expected)


DATA_PARALLEL_GRADS = Exercise(
    name="data_parallel_grads",
    shown_words=(CHUNKS_LABEL, FULL_BATCH_LABEL, MIXER_LABEL),
    rules=DATA_PARALLEL_GRADS_RULES,
    tolerance=TOLERANCE,
    hints=[
        Hint(
            _changed_arguments,
            "The caller's model changed (its weights or its .grad), or its batch did. DataParallel's replicas are "
            "copies; what you were given must come back as it was, since the caller may still need it.",
        ),
        Hint(
            _accumulated_across_chunks,
            "Gradients accumulate in .grad: a replica reused for a second chunk adds that chunk's gradient to the "
            "first one's. Each chunk needs a replica whose gradients hold only that chunk.",
        ),
        Hint(
            _wrong_keys,
            "The contract asks for a dict keyed by the model's own parameter names (as named_parameters gives them), "
            "each holding that parameter's gradient.",
        ),
        Hint(
            _has_nan,
            "NaN: a chunk with no samples has a mean loss of 0/0. DataParallel's scatter makes fewer chunks when "
            "there are more devices than samples (lesson 01's tiny batches).",
        ),
        Hint(
            lambda case, got: _of_rule("splits_like_scatter")(case),
            "The model did not see DataParallel's chunks: its output for a sample depends on the other samples of "
            "its chunk (as BatchNorm's does), so only the chunks DataParallel's scatter makes (chunk semantics, "
            "lesson 01), each forwarded on its own, give these gradients.",
        ),
        Hint(
            _is_naive_average,
            "You averaged the replicas' gradients plainly. Chunks can be uneven: this is exercise 1's question again.",
        ),
    ],
    general_hint=(
        "Follow 'One DataParallel step, taken apart': split with chunk semantics, one replica per chunk, forward, "
        "loss and backward on each, then combine the replicas' gradients as in exercise 1."
    ),
)


# --------------------------------------------------------------------------------------------- train_with_data_parallel


def same_losses(got: Any, expected: list[float]) -> bool:
    """A list of Python floats, one per batch, each within the lesson's tolerance of ``expected``'s."""
    return type(got) is list and all(isinstance(loss, float) for loss in got) and close_numbers(got, expected)


def same_first_loss(got: Any, expected: list[float]) -> bool:
    """The first step's loss, a Python float, within tolerance (the later steps are the losses rule's concern)."""
    return type(got) is list and len(got) >= 1 and isinstance(got[0], float) and close_numbers(got[:1], expected[:1])


def holds_trained_weights(got: Any, expected: list) -> bool:
    """The model argument afterwards (``plain_state``: its ``parameters`` as ``[name, weight, .grad,
    requires_grad]``) holds the expected weights, in the same order, within tolerance; its ``.grad`` and modes are
    not judged."""
    held, trained = got[0], expected[0]["parameters"]
    held = held.get("parameters") if type(held) is dict else None
    return (
        type(held) is list
        and len(held) == len(trained)
        and all(
            type(entry) is list and len(entry) == 4 and entry[0] == name and same_tensor(entry[1], weight)
            for entry, (name, weight, *_) in zip(held, trained, strict=True)
        )
    )


def _training_call(seed: int, samples: int, batch_size: int, lr: float, n_devices: int, why: str = "", **options):
    """Classification batches of ``batch_size`` (the last one shorter) and a model, on the lesson's primary device;
    ``device_ids`` the first ``n_devices`` ids. ``mixer``: a model that mixes each chunk; ``loss_fn``: another loss."""
    primary = current_devices().primary
    model = (_mixer(seed) if options.get("mixer") else _model(seed)).to(primary)
    inputs, labels = _classification_batch(seed, samples)
    batches = [
        (inputs[start : start + batch_size].to(primary), labels[start : start + batch_size].to(primary))
        for start in range(0, samples, batch_size)
    ]
    loss_fn = options.get("loss_fn", nn.functional.cross_entropy)
    return Call((model, batches, loss_fn, lr, list(range(n_devices))), why)


ONE_LOSS_PER_BATCH = "return one loss per batch, a Python float: the same as on one device"
TRAINS_THE_MODEL = "train the `model` you are given: afterwards it holds the trained weights"
THROUGH_DATA_PARALLEL = "forward each batch through `gpulab.DataParallel(model, device_ids=device_ids)`"

TRAIN_WITH_DATA_PARALLEL_RULES = (
    Rule(
        ONE_LOSS_PER_BATCH,
        "losses",
        same=same_losses,
        visible=lambda: [
            _training_call(21, 24, 8, 0.5, 2, "3 steps of SGD on batches of 8: the same losses as on one device"),
            _training_call(22, 20, 6, 0.3, 2, "batches of 6, 6, 6 and 2: the last one gives each device 1 sample"),
        ],
        extra=lambda: [_training_call(24, 12, 12, 0.5, 1, "one device in device_ids: whole batches")],
    ),
    Rule(
        TRAINS_THE_MODEL,
        "weights",
        same=lambda got, expected: True,  # the losses are the losses rule's concern
        visible=lambda: [_training_call(23, 30, 7, 0.4, 2, "the model must end up holding the trained weights")],
        extra=lambda: [_training_call(25, 10, 4, 0.6, 1, "the model must end up holding the trained weights")],
        leaves=True,
        left_right=holds_trained_weights,
    ),
    Rule(
        THROUGH_DATA_PARALLEL,
        "uses_data_parallel",
        same=same_first_loss,
        visible=lambda: [
            _training_call(26, 20, 8, 0.1, 2, "batches of 8 on 2 devices: chunks of 4", mixer=True),
            _training_call(27, 7, 7, 0.1, 2, "a batch of 7 on 2 devices: chunks of 4 and 3", mixer=True),
        ],
        extra=lambda: [_training_call(28, 9, 3, 0.1, 2, "batches of 3 on 2 devices: chunks of 2 and 1", mixer=True)],
    ),
)


def _forgot_zero_grad(case: Case, got: Any) -> bool:
    expected = case.expected
    return (
        type(got) is list
        and len(got) == len(expected) > 1
        and close_numbers(got[:1], expected[:1])
        and not close_numbers(got[1:], expected[1:])
    )


def _not_data_parallel(case: Case, got: Any) -> bool:
    return case.kind == "uses_data_parallel" and type(got) is list and all(isinstance(loss, float) for loss in got)


TRAIN_WITH_DATA_PARALLEL = Exercise(
    name="train_with_data_parallel",
    rules=TRAIN_WITH_DATA_PARALLEL_RULES,
    tolerance=TOLERANCE,
    hints=[
        Hint(
            lambda case, got: type(got) is not list or not all(isinstance(loss, float) for loss in got),
            "The contract asks for a plain list of Python floats, one per batch, not tensors.",
        ),
        Hint(
            lambda case, got: len(got) != len(case.args[1]),
            "One SGD step, and one loss, per (x, y) in batches.",
        ),
        Hint(
            lambda case, got: case.kind == "weights" and not case.left_right(),
            "The model you were given does not hold the trained weights: train that very model (a wrapper's .module "
            "is that very model), not a copy.",
        ),
        Hint(
            _not_data_parallel,
            "The model's forward did not receive DataParallel's chunks: its output for a sample depends on the other "
            "samples of its chunk. Train through the course's DataParallel wrapper (torch's own nn.DataParallel just "
            "calls the model without GPUs, as lesson 01 showed).",
        ),
        Hint(
            _forgot_zero_grad,
            "The first step matches, the later ones do not: .grad accumulates across backward calls unless it is "
            "cleared between steps.",
        ),
    ],
    general_hint=(
        "The loop of 'The training loop does not change', with an SGD optimizer of the given learning rate and one "
        "step per batch; keep each step's loss."
    ),
)

EXERCISES = [AVERAGE_GRADIENTS, DATA_PARALLEL_GRADS, TRAIN_WITH_DATA_PARALLEL]

# The texts above in Japanese, for the Japanese edition (gpulab.messages.text looks them up by their English).
TRANSLATIONS: dict[str, dict[str, str]] = {
    "ja": {
        CHUNKS_LABEL: "<DataParallelのチャンク{chunks}の勾配>",
        FULL_BATCH_LABEL: "<{names}の全バッチの勾配>",
        MIXER_LABEL: "チャンクごとにサンプルを混ぜるモデル",
        # The rules' statements, as the Japanese edition of lesson 02 states them.
        "Return a list with one tensor per parameter: the gradient of the mean loss over the whole batch": (
            "パラメータごとに1つのテンソルを持つリストを返してください。各テンソルは、バッチ全体での平均損失の勾配です"
        ),
        "do not modify the tensors you are given": "渡されたテンソルは変更しないでください",
        "Raise `ValueError` if the two arguments have different lengths": (
            "2つの引数の長さが異なる場合は`ValueError`を送出してください"
        ),
        "(1 * 1 + 3 * 3) / 4 = 2.5": "(1 * 1 + 3 * 3) / 4 = 2.5",
        (
            "The full-batch mean loss is a weighted sum of the chunks' mean losses, each weighted by its share of "
            "the batch; the gradient inherits those weights. The formula in 'Why it equals the full-batch gradient' "
            "shows it."
        ): (
            "バッチ全体の平均損失は、各チャンクの平均損失を、そのチャンクがバッチに占める割合で重み付けした和です。"
            "勾配も同じ重みを引き継ぎます。「なぜバッチ全体の勾配と等しくなるのか」の式で確認できます。"
        ),
        (
            "One chunk size per device: when the two lists have different lengths the gradients cannot be weighted, "
            "and the contract asks for a ValueError."
        ): (
            "チャンクサイズはデバイスごとに1つです。2つのリストの長さが異なると勾配を重み付けできないため、"
            "仕様ではValueErrorを送出することになっています。"
        ),
        (
            "Your answer changed the gradients it was given: an in-place operation (+=, add_, mul_) writes into the "
            "caller's tensors. Combine them into new tensors instead."
        ): (
            "渡された勾配を書き換えています。インプレース演算（+=、add_、mul_）は呼び出し元のテンソルに書き込みます。"
            "代わりに新しいテンソルとして組み合わせてください。"
        ),
        "Return a plain list with one tensor per parameter, in the same order as each device's list.": (
            "パラメータごとに1つのテンソルを、各デバイスのリストと同じ順番で並べた通常のリストを返してください。"
        ),
        "Return one tensor per *parameter* (the length of each device's list), not one per device.": (
            "デバイスごとではなく、*パラメータ*ごとに1つのテンソル（各デバイスのリストの長さ分）を返してください。"
        ),
        (
            "That is the plain average of the devices' gradients, right only when every chunk has the same size. "
            "Each device's gradient is a mean over its own chunk, so a short chunk's samples count too much: see "
            "'When a plain average is wrong'."
        ): (
            "それは各デバイスの勾配の単純平均で、すべてのチャンクが同じサイズのときにしか正しくありません。"
            "各デバイスの勾配は自分のチャンクでの平均なので、短いチャンクのサンプルが過大に数えられます。"
            "「単純平均が誤りになるとき」を見てみましょう。"
        ),
        (
            "You added the devices' gradients, but each one is already a mean over its chunk. Think of the weight "
            "each sample should get in the full-batch mean (1/B), as in 'When a plain average is wrong'."
        ): (
            "各デバイスの勾配を足し合わせていますが、それぞれはすでにチャンク内の平均です。"
            "「単純平均が誤りになるとき」のように、バッチ全体の平均で各サンプルが持つべき重み（1/B）を考えてみましょ"
            "う。"
        ),
        "Weighting by chunk size is right; the weights of a mean over the whole batch add up to 1.": (
            "チャンクサイズで重み付けするのは正しい考え方です。バッチ全体の平均では、重みの合計が1になります。"
        ),
        "even chunks (6 + 6): the average of the two chunk gradients is the full-batch one": (
            "均等なチャンク（6 + 6）：2つのチャンクの勾配の平均がバッチ全体の勾配になります"
        ),
        "uneven chunks (4 + 4 + 2): the last chunk's mean is over 2 samples, not 4": (
            "不均等なチャンク（4 + 4 + 2）：最後のチャンクの平均は4サンプルではなく2サンプルでの平均です"
        ),
        "one device: its chunk is the whole batch": "デバイスが1台：そのチャンクがバッチ全体です",
        "5 samples on 4 devices: chunks of 2, 2 and 1": "4台のデバイスに5サンプル：チャンクは2、2、1",
        "do not modify the gradients given": "渡された勾配を書き換えないこと",
        "13 samples on 4 devices: chunks of 4, 4, 4 and 1": "4台のデバイスに13サンプル：チャンクは4、4、4、1",
        "2 devices' gradients but 1 chunk size": "勾配は2台分あるのに、チャンクサイズは1つだけ",
        (
            "Follow 'One DataParallel step, taken apart': split with chunk semantics, one replica per chunk, "
            "forward, loss and backward on each, then combine the replicas' gradients as in exercise 1."
        ): (
            "「DataParallelの1ステップを分解する」の流れに従いましょう。chunkの仕様で分割し、"
            "チャンクごとに1つのレプリカでフォワード、損失、バックワードを行い、"
            "演習1と同じようにレプリカの勾配を組み合わせます。"
        ),
        (
            "The caller's model changed (its weights or its .grad), or its batch did. DataParallel's replicas are "
            "copies; what you were given must come back as it was, since the caller may still need it."
        ): (
            "呼び出し元のモデル（重みまたは.grad）か、そのバッチが変わっています。DataParallelのレプリカはコピーです。"
            "呼び出し元がまだ使うかもしれないので、渡されたものは元のままで返す必要があります。"
        ),
        (
            "Gradients accumulate in .grad: a replica reused for a second chunk adds that chunk's gradient to the "
            "first one's. Each chunk needs a replica whose gradients hold only that chunk."
        ): (
            "勾配は.gradに累積されます。1つのレプリカを2つ目のチャンクにも使うと、"
            "そのチャンクの勾配が1つ目の勾配に加算されます。チャンクごとに、"
            "そのチャンクの勾配だけを持つレプリカが必要です。"
        ),
        (
            "The contract asks for a dict keyed by the model's own parameter names (as named_parameters gives them), "
            "each holding that parameter's gradient."
        ): (
            "仕様では、モデル自身のパラメータ名（named_parametersが返す名前）をキーとし、"
            "各パラメータの勾配を値とする辞書を返すことになっています。"
        ),
        (
            "The model did not see DataParallel's chunks: its output for a sample depends on the other samples of "
            "its chunk (as BatchNorm's does), so only the chunks DataParallel's scatter makes (chunk semantics, "
            "lesson 01), each forwarded on its own, give these gradients."
        ): (
            "モデルがDataParallelのチャンクを受け取っていません。このモデルのあるサンプルに対する出力は、"
            "同じチャンクのほかのサンプルに左右されます（BatchNormと同じです）。そのため、DataParallelのscatterが作る"
            "チャンク（chunkの仕様、レッスン01）をそれぞれ別々にフォワードしたときだけ、この勾配になります。"
        ),
        (
            "NaN: a chunk with no samples has a mean loss of 0/0. DataParallel's scatter makes fewer chunks when "
            "there are more devices than samples (lesson 01's tiny batches)."
        ): (
            "NaNです。サンプルのないチャンクの平均損失は0/0になります。デバイスがサンプルより多いとき、"
            "DataParallelのscatterが作るチャンクは少なくなります（レッスン01の小さすぎるバッチ）。"
        ),
        "You averaged the replicas' gradients plainly. Chunks can be uneven: this is exercise 1's question again.": (
            "レプリカの勾配を単純に平均しています。チャンクは不均等になることがあります。演習1と同じ問題です。"
        ),
        # data_parallel_grads's rules, as the Japanese edition of lesson 02 states them.
        (
            "return `{parameter name: gradient}`, equal to the gradient of the mean loss "
            "`loss_fn(model(inputs), targets)` over the whole batch"
        ): (
            "`{parameter name: gradient}`を返してください。これはバッチ全体での平均損失"
            "`loss_fn(model(inputs), targets)`の勾配と等しくなります"
        ),
        "split the batch as DataParallel's scatter splits it, and forward each chunk through a replica": (
            "バッチはDataParallelのscatterと同じように分割し、各チャンクをレプリカに通してフォワードしてください"
        ),
        (
            "leave the arguments as they were (`model`, its weights and `.grad`, `inputs`, `targets`), and let no old "
            "`.grad` leak into the result"
        ): (
            "引数（`model`の重みと`.grad`、`inputs`、`targets`）は元のままにし、"
            "古い`.grad`が結果に混ざらないようにしてください"
        ),
        "the model holds gradients from an earlier step; leave it as it was": (
            "モデルは前のステップの勾配を持っています。元のままにしてください"
        ),
        "10 samples on 3 devices: chunks of 4, 4 and 2": "3台のデバイスに10サンプル：チャンクは4、4、2",
        "12 samples on 2 devices: chunks of 6 and 6": "2台のデバイスに12サンプル：チャンクは6と6",
        "10 samples on 3 devices: chunks of 4, 4 and 2, so weight them by size": (
            "3台のデバイスに10サンプル：チャンクは4、4、2なので、サイズで重み付けします"
        ),
        "a mean-squared-error loss, 7 samples on 2 devices: 4 and 3": (
            "平均二乗誤差の損失、2台のデバイスに7サンプル：4と3"
        ),
        "2 samples on 4 devices: only 2 chunks; the others get nothing": (
            "4台のデバイスに2サンプル：チャンクは2つだけで、ほかのデバイスには何も送られません"
        ),
        "the model already holds gradients from an earlier step": "モデルは前のステップの勾配をすでに持っています",
        "the caller's model must not change": "呼び出し元のモデルは変わってはいけません",
        "one device: the whole batch": "デバイスが1台：バッチ全体",
        "10 samples on 4 devices: DataParallel's chunks are 3, 3, 3 and 1": (
            "4台のデバイスに10サンプル：DataParallelのチャンクは3、3、3、1"
        ),
        "3 samples on 5 devices: three chunks of 1": "5台のデバイスに3サンプル：サイズ1のチャンクが3つ",
        (
            "The loop of 'The training loop does not change', with an SGD optimizer of the given learning rate and "
            "one step per batch; keep each step's loss."
        ): (
            "「学習ループは変わらない」のループを、指定された学習率のSGDオプティマイザで、"
            "バッチごとに1ステップずつ実行し、各ステップの損失を記録してください。"
        ),
        "The contract asks for a plain list of Python floats, one per batch, not tensors.": (
            "仕様では、テンソルではなく、バッチごとに1つのPythonのfloatを並べた通常のリストを返すことになっています。"
        ),
        "One SGD step, and one loss, per (x, y) in batches.": (
            "batchesの(x, y)ごとに、SGDのステップを1回、損失を1つ。"
        ),
        (
            "The first step matches, the later ones do not: .grad accumulates across backward calls unless it is "
            "cleared between steps."
        ): (
            "最初のステップは一致しますが、それ以降は一致しません。ステップの間でクリアしないと、"
            ".gradはbackwardの呼び出しをまたいで累積されます。"
        ),
        (
            "The model's forward did not receive DataParallel's chunks: its output for a sample depends on the other "
            "samples of its chunk. Train through the course's DataParallel wrapper (torch's own nn.DataParallel just "
            "calls the model without GPUs, as lesson 01 showed)."
        ): (
            "モデルのフォワードがDataParallelのチャンクを受け取っていません。このモデルでは、あるサンプルの出力が同じ"
            "チャンクのほかのサンプルで決まります。このコースのDataParallelラッパーを通して学習してください（レッスン01"
            "で見たように、PyTorch本来のnn.DataParallelはGPUがないとモデルをそのまま呼び出すだけです）。"
        ),
        (
            "The model you were given does not hold the trained weights: train that very model (a wrapper's .module "
            "is that very model), not a copy."
        ): (
            "渡されたモデルが学習後の重みを持っていません。コピーではなく、そのモデル自体を学習させてください"
            "（ラッパーの.moduleがまさにそのモデルです）。"
        ),
        ONE_LOSS_PER_BATCH: "バッチごとに損失を1つ、Pythonのfloatで返してください。1台のデバイスと同じ値です",
        TRAINS_THE_MODEL: "渡された`model`を学習させてください。実行後、そのモデルが学習済みの重みを保持します",
        THROUGH_DATA_PARALLEL: (
            "各バッチを`gpulab.DataParallel(model, device_ids=device_ids)`に通してフォワードしてください"
        ),
        "batches of 8 on 2 devices: chunks of 4": "サイズ8のバッチを2台のデバイスに：チャンクは4ずつ",
        "a batch of 7 on 2 devices: chunks of 4 and 3": "サイズ7のバッチを2台のデバイスに：チャンクは4と3",
        "batches of 3 on 2 devices: chunks of 2 and 1": "サイズ3のバッチを2台のデバイスに：チャンクは2と1",
        "3 steps of SGD on batches of 8: the same losses as on one device": (
            "サイズ8のバッチでSGDを3ステップ：1台のデバイスと同じ損失になります"
        ),
        "batches of 6, 6, 6 and 2: the last one gives each device 1 sample": (
            "サイズ6、6、6、2のバッチ：最後のバッチでは各デバイスに1サンプルずつ"
        ),
        "the model must end up holding the trained weights": "最後にモデルが学習後の重みを持っている必要があります",
        "one device in device_ids: whole batches": "device_idsにデバイスが1台：バッチ全体",
    },
}
