"""Lesson 03 (GPU-0 imbalance): the specifications of ``gathered_output_bytes``, ``imbalance_ratio``,
``LossInForward``, ``dp_traffic_bytes`` and ``ring_all_reduce_bytes``, as rules (``gpulab.check.Rule``).

Expected values come from PyTorch itself or from computations made here: the bytes of a tensor of the gathered
output's shape and dtype (made on the ``meta`` device, so nothing is allocated), exact ratios, the full-batch loss,
its gradients and each chunk's loss on one device (``LossInForward``'s scenarios, built from a seed), the bytes of a
DataParallel step measured by ``gpulab.traffic`` on virtual devices, and a ring all-reduce played step by step.
Every case builds its models and data fresh, so an answer that modifies them cannot spoil the next case.

Every rule has a ``kind`` naming the graded test cell of the lesson whose visible part asserts it::

    for case in gpulab.check.cases("imbalance_ratio", kind="ratio"):
        case.verify(imbalance_ratio)
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gpulab.check import Call, Case, Exercise, Hint, Raises, Rule, Tolerance
from gpulab.data_parallel import DataParallel

# imbalance_ratio's comparison and its messages: a relative 1e-9 (a float64 division is far closer).
TOLERANCE = Tolerance(relative=1e-9, floor=1.0)
LOSS_TOLERANCE = 1e-5


# --------------------------------------------------------------------------------------------- gathered_output_bytes


DTYPES = ["float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool"]


def _bytes_same(got: Any, expected: int) -> bool:
    """An integer (not a bool) equal to ``expected``."""
    return isinstance(got, numbers.Integral) and not isinstance(got, bool) and int(got) == expected


SHAPE_CASES = (
    "each dtype has its own size per element (float16: 2 bytes, bool: 1)",
    "an empty sample_shape: one number per sample",
    "every dimension of sample_shape counts",
    "the bytes of a float32 output for other batch sizes and class counts",
)


def _shape_case(batch_size: int, sample_shape: tuple, dtype: torch.dtype) -> str:
    """Which case of the shapes-and-dtypes rule an input is (named by the grader's feedback)."""
    if dtype != torch.float32:
        return SHAPE_CASES[0]
    if len(sample_shape) == 0:
        return SHAPE_CASES[1]
    return SHAPE_CASES[2] if len(sample_shape) > 1 else SHAPE_CASES[3]


GATHERED_OUTPUT_BYTES_RULES = (
    Rule(
        "the bytes of the output DataParallel gathers on the output device for a batch",
        "float32",
        same=_bytes_same,
        visible=lambda: [
            Call(
                (256, (20_000,), torch.float32),
                "256 samples x 20,000 classes x 4 bytes: the whole batch's output, gathered on the output device",
            ),
            Call((7, (10,), torch.float32), "7 samples x 10 numbers x 4 bytes (float32)"),
            Call((2, (3,), torch.float32), "2 samples x 3 numbers x 4 bytes"),
        ],
        extra=lambda: [Call((1, (50_000,), torch.float32), "a batch of one sample")],
    ),
    Rule(
        "`sample_shape` is the shape of one sample's output",
        "dtypes_shapes",
        same=_bytes_same,
        visible=lambda: [
            Call((64, (32_000,), torch.float16), "float16 takes 2 bytes per number"),
            Call(
                (8, (128, 1_000), torch.bfloat16),
                "a sequence model: each sample's output is 128 positions x 1,000 classes, 2 bytes each",
            ),
        ],
        extra=lambda: [
            Call((10, (3,), torch.float64), "float64 takes 8 bytes per number"),
            Call((5, (2, 3, 4), torch.int64), "every dimension of sample_shape counts"),
            Call((12, (), torch.float32), "an empty sample_shape: one number per sample"),
            Call((4, (3, 5), torch.float32), "every dimension of sample_shape counts: 3 x 5 numbers per sample"),
            Call((9, (11,), torch.float32), "9 samples x 11 numbers x 4 bytes (float32)"),
            Call((3, torch.Size([5, 7]), torch.uint8), "a torch.Size works like a tuple"),
        ],
        case_names=SHAPE_CASES,
        case_name=_shape_case,
    ),
)


def _elements(case: Case) -> int:
    batch_size, sample_shape, _ = case.args
    return batch_size * math.prod(sample_shape)


def _itemsize(case: Case) -> int:
    return torch.empty((), dtype=case.args[2]).element_size()


def _numeric(got: Any) -> bool:
    return isinstance(got, numbers.Real) and not isinstance(got, bool)


GATHERED_OUTPUT_BYTES = Exercise(
    name="gathered_output_bytes",
    rules=GATHERED_OUTPUT_BYTES_RULES,
    hints=[
        Hint(
            lambda case, got: _numeric(got) and got == _elements(case) and _itemsize(case) > 1,
            "That is the number of elements. Memory is counted in bytes, and each dtype has its own size per element.",
        ),
        Hint(
            lambda case, got: _numeric(got) and got == _elements(case) * 4 != case.expected,
            "Not every dtype takes 4 bytes: float16 and bfloat16 take 2, float64 and int64 take 8. A dtype knows its "
            "own size.",
        ),
        Hint(
            lambda case, got: _numeric(got) and got == case.expected * 8,
            "That looks like bits, not bytes: a byte has 8 of them.",
        ),
        Hint(
            lambda case, got: _numeric(got) and got < case.expected and case.expected % got == 0 and got > 0,
            "Too small by a whole factor. The gathered output is the *whole* batch (not one device's chunk), and "
            "every dimension of sample_shape counts.",
        ),
        Hint(
            lambda case, got: not (isinstance(got, numbers.Integral) and not isinstance(got, bool)),
            "The contract asks for a plain int: a number of bytes.",
        ),
    ],
    general_hint=(
        "The gathered output is one tensor of shape (batch_size, *sample_shape): count its elements, then the bytes "
        "each one takes in dtype."
    ),
)


# --------------------------------------------------------------------------------------------- imbalance_ratio


def same_ratio(got: Any, expected: float) -> bool:
    """A number (not a bool) equal to ``expected`` within ``TOLERANCE`` (a relative 1e-9)."""
    return _numeric(got) and TOLERANCE.close(float(got), expected)


RATIO_ERRORS = (
    "fewer than two devices must raise ValueError",
    "the other devices' mean peak of 0 must raise ValueError",
)

IMBALANCE_RATIO_RULES = (
    Rule(
        "device 0's peak divided by the **mean** peak of the *other* devices",
        "ratio",
        same=same_ratio,
        visible=lambda: [
            Call(([300, 100],), "device 0 peaked at 300, device 1 at 100: 300 / 100"),
            Call(
                ([250, 100, 150],),
                "the others' mean is (100 + 150) / 2 = 125, and 250 / 125 = 2 (not their minimum, not everyone's mean)",
            ),
            Call(([512, 512],), "balanced devices: 1.0"),
            Call(([400, 100, 300],), "the others' mean is (100 + 300) / 2 = 200"),
        ],
        extra=lambda: [
            Call(((600, 100, 200, 300),), "a tuple works too; the others' mean is 200"),
            Call(([100, 400],), "device 0 below the others gives a ratio below 1"),
            Call(([10, 3],), "10 / 3: a float to full precision, not rounded"),
            Call(([123_456_789_012, 98_765_432_109, 5_000_000_000],), "large peaks: a float to full precision"),
        ],
    ),
    Rule(
        "Leave `peak_bytes` unchanged",
        "ratio",
        same=lambda got, expected: True,  # the value is the rule above's concern
        visible=lambda: [Call(([500, 100, 300],), "the list of peaks is the caller's")],
        unchanged=True,
    ),
    Rule(
        "Raise `ValueError` for fewer than two devices, or when the others' mean is 0",
        "errors",
        raises=ValueError,
        visible=lambda: [
            Call(([1000],), "one device has no others to compare with"),
            Call(([5, 0, 0],), "the others' mean is 0: no ratio"),
        ],
        extra=lambda: [Call(([],), "no devices at all")],
        case_names=RATIO_ERRORS,
        case_name=lambda peak_bytes: RATIO_ERRORS[0] if len(peak_bytes) < 2 else RATIO_ERRORS[1],
    ),
)


def _others(case: Case) -> list[float]:
    return [float(value) for value in case.args[0][1:]]


def _close_to(got: Any, value: float) -> bool:
    return _numeric(got) and abs(float(got) - value) <= 1e-6 * max(1.0, abs(value))


IMBALANCE_RATIO = Exercise(
    name="imbalance_ratio",
    rules=IMBALANCE_RATIO_RULES,
    tolerance=TOLERANCE,
    hints=[
        Hint(
            lambda case, got: isinstance(case.expected, Raises) and len(case.args[0]) < 2,
            "With fewer than two devices there are no others to compare with: the contract asks for a ValueError.",
        ),
        Hint(
            lambda case, got: isinstance(case.expected, Raises),
            "When the other devices' mean peak is 0 the ratio is undefined: the contract asks for a ValueError, not a "
            "ZeroDivisionError.",
        ),
        Hint(
            lambda case, got: _close_to(got, case.args[0][0] / min(_others(case))) and len(_others(case)) > 1,
            "You divided by the *smallest* of the other devices. The contract compares device 0 with a typical other "
            "device: their mean.",
        ),
        Hint(
            lambda case, got: _close_to(got, case.args[0][0] / max(_others(case))) and len(_others(case)) > 1,
            "You divided by the *largest* of the other devices; the contract compares with their mean.",
        ),
        Hint(
            lambda case, got: _close_to(got, case.args[0][0] * len(case.args[0]) / sum(case.args[0])),
            "Device 0 is in your mean: the ratio compares device 0 with the *other* devices only.",
        ),
        Hint(
            lambda case, got: not _numeric(got),
            "The contract asks for a plain float: how many times device 0's peak is the others' mean peak.",
        ),
    ],
    general_hint=(
        "How many times device 0's peak is the mean peak of the other devices; invalid when there are no others, or "
        "when they used nothing."
    ),
)


# --------------------------------------------------------------------------------------------- LossInForward
# LossInForward is a class, judged in scenarios: a model, a batch and a loss function that sums, built from a seed
# (``loss_scenario``), and the module called directly, wrapped in DataParallel, or run backward. Each rule's inputs
# are plain keyword arguments, so that the grader sends them to its kernel; the rule's adapter builds the scenario
# around the answer wherever the answer lives (the learner's kernel, the grader's) and returns plain values, and
# the reference builds the same scenario where the check runs and computes the expected values on one device.
class _Head(nn.Sequential):
    """``Linear -> ReLU (or Tanh) -> Linear``: a small classifier or regressor, shown briefly in feedback."""

    def __repr__(self) -> str:
        return f"<model {self[0].in_features}-{self[0].out_features}-{self[2].out_features}>"


def summed_absolute_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A loss that is a plain function, not a module: the absolute error summed over the samples."""
    return nn.functional.l1_loss(outputs, targets, reduction="sum")


# The loss functions of the scenarios: each sums over the samples, as the lesson's contract says.
LOSS_FUNCTIONS: dict[str, Callable[[], Callable]] = {
    "cross-entropy": lambda: nn.CrossEntropyLoss(reduction="sum"),
    "squared error": lambda: nn.MSELoss(reduction="sum"),
    "absolute error": lambda: summed_absolute_error,
}


# How many devices a scenario wraps the module on, unless its input says otherwise (the lesson's two).
SCENARIO_DEVICES = 2


def loss_scenario(
    seed: int, samples: int, loss: str, layers: list, activation: str = "relu", devices: int = SCENARIO_DEVICES
):
    """The model (``nn.Linear`` for two layer sizes, else ``_Head``), batch and summed loss function of a rule's
    input, built on the CPU from ``seed`` alone, leaving the caller's random state as it was: the same scenario in
    every process. ``devices`` is how many devices the adapters wrap the module on (the reference needs none)."""
    on_cpu = {"dtype": torch.float32, "device": "cpu"}  # whatever default dtype or device the process has set
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if len(layers) == 2:
            model = nn.Linear(*layers, **on_cpu)
        else:
            activation_layer = nn.Tanh() if activation == "tanh" else nn.ReLU()
            first, second = nn.Linear(layers[0], layers[1], **on_cpu), nn.Linear(layers[1], layers[2], **on_cpu)
            model = _Head(first, activation_layer, second)
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, layers[0], generator=generator, **on_cpu)
    if loss == "cross-entropy":
        targets = torch.randint(0, layers[-1], (samples,), generator=generator, device="cpu")
    else:
        targets = torch.randn(samples, layers[-1], generator=generator, **on_cpu)
    return model, inputs, targets, LOSS_FUNCTIONS[loss]()


def _placed(cls: Callable, inputs: dict):
    """The answer's module around the scenario's model, on the first of ``inputs["devices"]`` devices (real GPUs
    when there are that many, else virtual ones, as ``gpulab.devices`` chooses; the lesson's choice is left as
    it is): ``(module, model, inputs, targets, devices)``."""
    from gpulab.devices import devices as choose_devices

    model, x, y, loss_fn = loss_scenario(**inputs)
    chosen = choose_devices(inputs.get("devices", SCENARIO_DEVICES), quiet=True, remember=False)
    model = model.to(chosen.primary)
    return cls(model, loss_fn), model, x.to(chosen.primary), y.to(chosen.primary), chosen


def _wrapped_call(module: nn.Module, chosen, x: torch.Tensor, y: torch.Tensor):
    """``gpulab.DataParallel(module)(x, y)`` on ``chosen`` (``nn.DataParallel`` itself on real GPUs); its warnings
    (a scalar gathered) are left out, as a graded cell must print nothing to stderr. Autograd is on, whatever the
    process set, so that a replica computing with the caller's model fails on virtual devices as on GPUs
    (``gpulab.data_parallel.refuse_tensors_of_other_devices``)."""
    with warnings.catch_warnings(), torch.enable_grad():  # autograd on: the graph shows a replica's parameters
        warnings.simplefilter("ignore")
        return DataParallel(module, device_ids=chosen)(x, y)


def forward_on_a_chunk(cls: Callable, **inputs) -> Any:
    """Adapter: what ``LossInForward(model, loss_fn)(x, y)`` returns, called directly."""
    module, _, x, y, _ = _placed(cls, inputs)
    return module(x, y)


def wrapped_mean_loss(cls: Callable, **inputs) -> Any:
    """Adapter: ``wrapped(x, y).sum() / len(x)``, the module wrapped in DataParallel."""
    module, _, x, y, chosen = _placed(cls, inputs)
    return _wrapped_call(module, chosen, x, y).sum() / len(x)


def parameters_after_moving_the_model(cls: Callable, shift: float, **inputs) -> list:
    """Adapter: the values of the module's ``parameters()`` after each of the model's own parameters was moved by
    ``shift``, in place: they hold the moved values only where the model is a submodule, not a copy."""
    module, model, _, _, _ = _placed(cls, inputs)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(shift)
    return [parameter.detach().clone().as_subclass(torch.Tensor) for parameter in module.parameters()]


def gradients_after_backward(cls: Callable, **inputs) -> list:
    """Adapter: the model's ``[name, .grad]`` after ``(wrapped(x, y).sum() / len(x)).backward()``."""
    module, model, x, y, chosen = _placed(cls, inputs)
    with torch.enable_grad():  # whatever the process set
        (_wrapped_call(module, chosen, x, y).sum() / len(x)).backward()
    return [[name, parameter.grad] for name, parameter in model.named_parameters()]


def gathered_on_device_0(cls: Callable, **inputs) -> Any:
    """Adapter: what the module wrapped in DataParallel returns: what DataParallel gathers on device 0."""
    module, _, x, y, chosen = _placed(cls, inputs)
    return _wrapped_call(module, chosen, x, y)


def _close_values(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """The same number of values, each within the lesson's loss tolerance (NaN never is)."""
    got, expected = got.detach().double().cpu().reshape(-1), expected.detach().double().cpu().reshape(-1)
    return len(got) == len(expected) and _close_lists(got.tolist(), expected.tolist())


def _close_lists(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(
        abs(g - w) <= LOSS_TOLERANCE + 1e-4 * abs(w) for g, w in zip(got, want, strict=True)
    )


def same_chunk_values(got: Any, expected: torch.Tensor) -> bool:
    """A plain floating tensor of ``expected``'s shape, with its values within the lesson's loss tolerance."""
    return (
        type(got) is torch.Tensor
        and got.is_floating_point()
        and tuple(got.shape) == tuple(expected.shape)
        and _close_values(got, expected)
    )


def same_mean(got: Any, expected: float) -> bool:
    """A floating tensor of one value within the lesson's loss tolerance of ``expected``."""
    return (
        type(got) is torch.Tensor
        and got.is_floating_point()
        and got.numel() == 1
        and _close_values(got, torch.tensor([expected]))
    )


def holds_each(got: Any, expected: list[torch.Tensor]) -> bool:
    """``got`` (a list of plain tensors) holds each of ``expected``'s tensors exactly (shape and values)."""
    return type(got) is list and all(
        any(type(held) is torch.Tensor and held.shape == want.shape and torch.equal(held.cpu(), want) for held in got)
        for want in expected
    )


def same_gradients(got: Any, expected: list) -> bool:
    """``[name, gradient]`` per parameter in ``expected``'s order, each gradient within the loss tolerance."""
    return (
        type(got) is list
        and len(got) == len(expected)
        and all(
            type(entry) is list
            and len(entry) == 2
            and entry[0] == name
            and type(entry[1]) is torch.Tensor
            and entry[1].is_floating_point()
            and tuple(entry[1].shape) == tuple(gradient.shape)
            and _close_values(entry[1], gradient)
            for entry, (name, gradient) in zip(got, expected, strict=True)
        )
    )


def _loss_call(seed: int, samples: int, loss: str, layers: list, why: str = "", **options) -> Call:
    return Call((), why, {"seed": seed, "samples": samples, "loss": loss, "layers": list(layers), **options})


FORWARD_RETURNS = (
    "`forward(inputs, targets)` returns a plain tensor of shape `[1]` holding `loss_fn(model(inputs), targets)`"
)
MEAN_OF_GATHERED = "wrapped in DataParallel, `wrapped(x, y).sum() / len(x)` is the full-batch mean loss"
MODEL_IS_A_SUBMODULE = "`model` is a submodule: its parameters are `LossInForward`'s"
FULL_BATCH_GRADIENTS = "backward of that mean leaves the full-batch gradients in `model`"
ONE_NUMBER_PER_REPLICA = "device 0 receives one number per replica: `loss_fn` on that replica's chunk"

LOSS_IN_FORWARD_RULES = (
    Rule(
        FORWARD_RETURNS,
        "value",
        same=same_chunk_values,
        adapter=forward_on_a_chunk,
        visible=lambda: [
            _loss_call(1, 10, "cross-entropy", [6, 8, 5], "10 samples, cross-entropy summed"),
            _loss_call(8, 4, "cross-entropy", [3, 2], "an nn.Linear(3, 2) on 4 samples: a tensor of shape [1]"),
        ],
        extra=lambda: [
            _loss_call(4, 1, "squared error", [6, 8, 3], "one sample, squared error summed"),
            _loss_call(9, 5, "absolute error", [6, 8, 3], "a loss_fn that is a plain function, not a module"),
        ],
    ),
    Rule(
        MEAN_OF_GATHERED,
        "value",
        same=same_mean,
        adapter=wrapped_mean_loss,
        visible=lambda: [
            _loss_call(1, 10, "cross-entropy", [6, 8, 5], "10 samples on 2 devices: chunks of 5 and 5"),
            _loss_call(2, 7, "squared error", [6, 8, 3], "uneven chunks (4 and 3): sums add up, means would not"),
        ],
        extra=lambda: [
            _loss_call(4, 1, "cross-entropy", [6, 8, 5], "one sample: a single chunk"),
            _loss_call(10, 6, "absolute error", [6, 8, 3], "a loss_fn that is a plain function, not a module"),
        ],
    ),
    Rule(
        MODEL_IS_A_SUBMODULE,
        "gradients",
        same=holds_each,
        adapter=parameters_after_moving_the_model,
        visible=lambda: [
            _loss_call(3, 9, "cross-entropy", [6, 8, 5], "the module's parameters are the model's, moved", shift=0.5)
        ],
    ),
    Rule(
        FULL_BATCH_GRADIENTS,
        "gradients",
        same=same_gradients,
        adapter=gradients_after_backward,
        visible=lambda: [
            _loss_call(3, 9, "cross-entropy", [6, 8, 5], "9 samples (chunks of 5 and 4): the full-batch gradients")
        ],
        extra=lambda: [
            _loss_call(6, 5, "squared error", [6, 8, 3], "uneven chunks with a regression loss"),
            _loss_call(12, 7, "absolute error", [6, 8, 3], "a loss_fn that is a plain function, not a module"),
        ],
    ),
    Rule(
        ONE_NUMBER_PER_REPLICA,
        "memory",
        same=same_chunk_values,
        adapter=gathered_on_device_0,
        visible=lambda: [
            _loss_call(5, 64, "cross-entropy", [12, 16, 4_000], "64 samples x 4,000 classes: 2 numbers, not 256,000")
        ],
    ),
)


def _rule_is(case: Case, *statements: str) -> bool:
    return case.rule is not None and case.rule.statement in statements


def _not_one_number(case: Case, got: Any) -> bool:
    return _rule_is(case, FORWARD_RETURNS) and isinstance(got, torch.Tensor) and got.numel() != 1


def _wrong_numbers(case: Case, got: Any) -> bool:
    """An ordinary tensor of the expected shape whose numbers are not the losses the rule asks for."""
    if not _rule_is(case, FORWARD_RETURNS, MEAN_OF_GATHERED, ONE_NUMBER_PER_REPLICA):
        return False
    if not isinstance(got, torch.Tensor) or got.layout != torch.strided or got.device.type == "meta":
        return False
    return not isinstance(case.expected, torch.Tensor) or got.shape == case.expected.shape


LOSS_IN_FORWARD = Exercise(
    name="LossInForward",
    rules=LOSS_IN_FORWARD_RULES,
    hints=[
        Hint(
            lambda case, got: isinstance(got, RuntimeError) and "the same device" in str(got),
            "A replica computed with the original model instead of its own copy: DataParallel copies only what your "
            "module registers, and a closure or a list is not registered. Keep the model as self.model and call "
            "self.model in forward.",
        ),
        Hint(
            lambda case, got: (
                _rule_is(case, FORWARD_RETURNS, ONE_NUMBER_PER_REPLICA) and not isinstance(got, torch.Tensor)
            ),
            "forward must return the loss alone, a tensor of shape [1]. Returning the outputs as well makes "
            "DataParallel gather them on device 0 again, which is what the exercise removes.",
        ),
        Hint(
            lambda case, got: _rule_is(case, FORWARD_RETURNS) and isinstance(got, torch.Tensor) and got.dim() == 0,
            "Your forward returns a 0-dim scalar, and DataParallel warns about gathering scalars: gathering "
            "concatenates along dimension 0, which a 0-dim tensor lacks. See 'One number per device: the scalar "
            "warning'.",
        ),
        Hint(_not_one_number, "forward must return shape [1]: one number per chunk, not one per sample."),
        Hint(
            _wrong_numbers,
            "The gathered sum / batch size is not the mean loss: loss_fn already sums over the chunk's samples, and "
            "uneven chunks need sums, not means ('One number per device: the scalar warning').",
        ),
        Hint(
            lambda case, got: _rule_is(case, MODEL_IS_A_SUBMODULE),
            "The model's parameters are not registered in your module, so DataParallel cannot replicate them. An "
            "nn.Module registers the modules it holds as attributes once its own initialisation has run.",
        ),
        Hint(
            lambda case, got: _rule_is(case, FULL_BATCH_GRADIENTS),
            "The gradients differ from the full batch's: the loss must come from the model you were given, on the "
            "chunk, with nothing detached.",
        ),
    ],
    general_hint=(
        "Move the loss into the replicas, so that each one gathers a number instead of a batch of outputs; "
        "'One number per device: the scalar warning' shows what shape DataParallel can gather."
    ),
)


# --------------------------------------------------------------------------------------------- dp_traffic_bytes
STAGES = ("scatter", "broadcast", "gather", "grad_scatter", "reduce")
_FORWARD_KEYS = ("scatter", "broadcast", "gather")
_BACKWARD_KEYS = ("grad_scatter", "reduce")

# Inputs no step can be run or played at in a check's time (a trillion parameters, 100,000 devices and more,
# rings of a hundred thousand ranks): only an answer that counts from the sizes finishes. The self-check stops an
# answer after COUNTING_SECONDS on one input (gpulab.check.time_limit); the grader, after its cell's time.
COUNTING_SECONDS = 10
PARAMETERS_TOO_MANY_TO_RUN = 10**12
DEVICES_TOO_MANY_TO_RUN = 10**4
RANKS_TOO_MANY_TO_PLAY = 10**5


def traffic_model(in_features: int, hidden: int, out_features: int, seed: int = 0) -> nn.Module:
    """``Linear -> ReLU -> Linear``, no buffers: the model whose DataParallel step the traffic cases measure."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))


def n_params_of(in_features: int, hidden: int, out_features: int) -> int:
    """The parameter elements of ``traffic_model(in_features, hidden, out_features)``."""
    return in_features * hidden + hidden + hidden * out_features + out_features


def _traffic_call(batch_size: int, n_devices: int, sizes: tuple, why: str = "", **kwargs) -> Call:
    in_features, hidden, out_features = sizes
    return Call((batch_size, n_devices, n_params_of(*sizes), in_features, out_features), why, kwargs)


def too_large_to_run(batch_size, n_devices, n_params, *rest, **kwargs) -> bool:
    """Whether a step of these sizes is far too large to run, even on the meta device (shapes only): a model of a
    trillion parameters or more, or ten thousand devices or more (one replica and one thread each)."""
    return n_params >= PARAMETERS_TOO_MANY_TO_RUN or n_devices >= DEVICES_TOO_MANY_TO_RUN


FORWARD_CASE = "the forward stages (scatter, broadcast, gather) for other batch sizes, device counts and layer sizes"
BACKWARD_CASE = "the backward stages (grad_scatter, reduce) for other batch sizes, device counts and layer sizes"
IDLE_CASE = "more devices than chunks: an idle device receives no data and no replica"
ONE_DEVICE_CASE = "one device: nothing moves"
NCCL_CASE = "NCCL's broadcast and reduce for other batch sizes, device counts and layer sizes"
TOO_LARGE_CASE = "sizes far too large to run a step (a trillion parameters, 10,000 devices): count, do not measure"
_TRAFFIC_ARGUMENTS = ("batch_size", "n_devices", "n_params", "in_features", "out_features", "bytes_per_element")
INVALID_TRAFFIC = tuple(f"{name} < 1 must raise ValueError" for name in _TRAFFIC_ARGUMENTS)
NCCL_RULE = 'With `algorithm="nccl"`, the broadcast and the reduce cross device 0\'s link once each'


def _forward_case(batch_size, n_devices, *counts, **kwargs) -> str:
    """Which case of a forward rule an input is (named by the grader's feedback): too large to run, one device, idle
    devices or not."""
    if too_large_to_run(batch_size, n_devices, *counts):
        return TOO_LARGE_CASE
    if n_devices == 1:
        return ONE_DEVICE_CASE
    return IDLE_CASE if len(torch.empty(batch_size).chunk(n_devices)) < n_devices else FORWARD_CASE


def _backward_case(batch_size, n_devices, *counts, **kwargs) -> str:
    if too_large_to_run(batch_size, n_devices, *counts):
        return TOO_LARGE_CASE
    return ONE_DEVICE_CASE if n_devices == 1 else BACKWARD_CASE


def _nccl_case(batch_size, n_devices, *counts, **kwargs) -> str:
    if too_large_to_run(batch_size, n_devices, *counts):
        return TOO_LARGE_CASE
    return ONE_DEVICE_CASE if n_devices == 1 else NCCL_CASE


def _invalid_traffic_case(*args, **kwargs) -> str:
    """The rule a call with a count below 1 breaks: the first such argument's."""
    values = dict(zip(_TRAFFIC_ARGUMENTS, args, strict=False)) | kwargs
    name = next((name for name in _TRAFFIC_ARGUMENTS if values.get(name, 1) < 1), "bytes_per_element")
    return f"{name} < 1 must raise ValueError"


def _too_large_calls(many_devices: bool = False, **kwargs) -> list[Call]:
    """The self-check's inputs far too large to run: a model of about four trillion parameters on 4 devices and, with
    ``many_devices``, a small model on 100,000 devices that each get 2 samples (one replica and one thread each)."""
    calls = [_traffic_call(64, 4, (1000, 2 * 10**9, 1000), "4 x 10^12 parameters: far too large to run", **kwargs)]
    if many_devices:
        calls.append(_traffic_call(200_000, 100_000, (3, 4, 5), "100,000 devices: far too many to run", **kwargs))
    return calls


DP_TRAFFIC_BYTES_RULES = (
    Rule(
        "return the bytes that leave or enter device 0 by stage, as a dict with the keys",
        "forward",
        same=lambda got, expected: same_stages(got, expected),
        visible=lambda: [
            _traffic_call(
                8,
                2,
                (3, 4, 5),
                "8 samples on 2 devices: device 1 receives 4 samples x 3 features, one copy of the parameters, and "
                "sends back 4 x 5 outputs (4 bytes each); device 0's own chunk never moves",
            ),
            _traffic_call(10, 3, (6, 2, 7), "10 over 3 devices: chunks of 4, 4, 2; devices 1 and 2 receive data"),
        ],
        extra=lambda: [
            _traffic_call(7, 2, (4, 3, 6), "7 over 2 devices: chunks of 4 and 3"),
            _traffic_call(5, 1, (3, 2, 4), "one device: nothing moves"),
            *_too_large_calls(many_devices=True),
        ],
        case_names=(FORWARD_CASE, ONE_DEVICE_CASE, TOO_LARGE_CASE),
        case_name=_forward_case,
        seconds=COUNTING_SECONDS,
    ),
    Rule(
        "return the bytes that leave or enter device 0 by stage, as a dict with the keys",
        "backward",
        same=lambda got, expected: same_stages(got, expected),
        visible=lambda: [
            _traffic_call(
                8,
                2,
                (3, 4, 5),
                "backward sends each replica the gradient of its outputs (grad_scatter) and brings each replica's "
                "parameter gradients back to device 0 (reduce)",
            ),
            _traffic_call(10, 4, (2, 3, 4), "10 over 4 devices: chunks of 3, 3, 3, 1"),
        ],
        extra=lambda: [
            _traffic_call(7, 2, (4, 3, 6), "7 over 2 devices: chunks of 4 and 3"),
            _traffic_call(4, 1, (2, 3, 2), "one device: nothing moves"),
            *_too_large_calls(),
        ],
        case_names=(BACKWARD_CASE, ONE_DEVICE_CASE, TOO_LARGE_CASE),
        case_name=_backward_case,
        seconds=COUNTING_SECONDS,
    ),
    Rule(
        "Each element takes `bytes_per_element` bytes",
        "backward",
        same=lambda got, expected: same_stages(got, expected),
        visible=lambda: [
            _traffic_call(6, 2, (3, 12, 4), "2 bytes per element (float16): half the bytes", bytes_per_element=2)
        ],
        extra=lambda: [
            _traffic_call(9, 3, (2, 5, 3), "8 bytes per element (float64): twice the bytes", bytes_per_element=8)
        ],
    ),
    Rule(
        NCCL_RULE,
        "forward",
        same=lambda got, expected: same_stages(got, expected),
        visible=lambda: [
            _traffic_call(
                10,
                3,
                (6, 2, 7),
                "10 over 3 devices with NCCL: the parameters pass 0 -> 1 -> 2, crossing device 0's link once; "
                "the chunks and the outputs are still copies",
                algorithm="nccl",
            ),
        ],
        extra=lambda: [
            _traffic_call(8, 2, (3, 4, 5), "2 devices: a chain of one hop, the same as a copy", algorithm="nccl"),
            _traffic_call(5, 1, (3, 2, 4), "one device: nothing moves", algorithm="nccl"),
            *_too_large_calls(algorithm="nccl"),
        ],
        case_names=(NCCL_CASE, ONE_DEVICE_CASE, TOO_LARGE_CASE),
        case_name=_nccl_case,
        seconds=COUNTING_SECONDS,
    ),
    Rule(
        NCCL_RULE,
        "backward",
        same=lambda got, expected: same_stages(got, expected),
        visible=lambda: [
            _traffic_call(
                10,
                4,
                (2, 3, 4),
                "10 over 4 devices with NCCL: the gradients' sum passes 1 -> 2 -> 3 -> 0, crossing device 0's link "
                "once; the output's gradient is still copied to each replica",
                algorithm="nccl",
            ),
        ],
        extra=lambda: [
            _traffic_call(12, 3, (4, 3, 6), "3 devices: the sum crosses device 0's link once", algorithm="nccl"),
            _traffic_call(4, 1, (2, 3, 2), "one device: nothing moves", algorithm="nccl"),
            *_too_large_calls(algorithm="nccl"),
        ],
        case_names=(NCCL_CASE, ONE_DEVICE_CASE, TOO_LARGE_CASE),
        case_name=_nccl_case,
        seconds=COUNTING_SECONDS,
    ),
    Rule(
        "device 0 keeps its own chunk, and only devices that receive data get a replica",
        "idle_devices",
        same=lambda got, expected: same_stages(got, expected),
        visible=lambda: [
            _traffic_call(
                2,
                4,
                (3, 4, 5),
                "2 samples on 4 devices: only 2 chunks, so only device 1 gets a replica; devices 2 and 3 stay idle",
            )
        ],
        extra=lambda: [
            _traffic_call(5, 4, (2, 2, 3), "5 over 4 devices: chunks of 2, 2, 1; device 3 idle"),
            _traffic_call(6, 1, (2, 3, 4), "one device: nothing moves"),
            _traffic_call(
                3, 8, (1000, 2 * 10**9, 1000), "3 samples on 8 devices, 4 x 10^12 parameters: far too large to run"
            ),
        ],
        case_names=(IDLE_CASE, ONE_DEVICE_CASE, TOO_LARGE_CASE),
        case_name=_forward_case,
        seconds=COUNTING_SECONDS,
    ),
    Rule(
        "Raise `ValueError` if any argument is below 1, `bytes_per_element` included",
        "idle_devices",
        raises=ValueError,
        visible=lambda: [
            Call((0, 2, 10, 3, 4), "a batch of 0 samples"),
            Call((4, 0, 10, 3, 4), "no devices"),
            Call((4, 2, 10, 0, 4), "in_features < 1"),
            Call((4, 2, 10, 3, 4), "no element takes 0 bytes", {"bytes_per_element": 0}),
        ],
        extra=lambda: [
            Call((4, 2, 0, 3, 4), "a model with no parameters"),
            Call((4, 2, 10, 3, 0), "out_features < 1"),
        ],
        case_names=INVALID_TRAFFIC,
        case_name=_invalid_traffic_case,
    ),
)


def same_stages(got: Any, expected: dict) -> bool:
    """``got`` is a dict (not a subclass) whose values for ``expected``'s keys are integers (not bools) equal to
    them (the rules of lesson 03's traffic cells)."""
    if type(got) is not dict:
        return False
    return all(
        isinstance(got.get(key), numbers.Integral) and not isinstance(got.get(key), bool) and got[key] == value
        for key, value in expected.items()
    )


def _chunks(case: Case) -> list[int]:
    batch_size, n_devices = case.args[:2]
    return [len(chunk) for chunk in torch.empty(batch_size).chunk(n_devices)]


def _stage_is(got: Any, key: str, value: int) -> bool:
    return isinstance(got, dict) and got.get(key) == value


def _wrong_stage(case: Case, got: Any, key: str) -> bool:
    return isinstance(case.expected, dict) and key in case.expected and not _stage_is(got, key, case.expected[key])


def _with_own_chunk(case: Case, got: Any) -> bool:
    batch_size, _, _, in_features, out_features = case.args
    own = _chunks(case)[0]
    return _stage_is(got, "scatter", batch_size * in_features * 4) or (
        _wrong_stage(case, got, "gather") and _stage_is(got, "gather", case.expected["gather"] + own * out_features * 4)
    )


def _replicas_for_all(case: Case, got: Any) -> bool:
    _, n_devices, n_params = case.args[:3]
    return len(_chunks(case)) < n_devices and (
        _stage_is(got, "broadcast", (n_devices - 1) * n_params * 4)
        or _stage_is(got, "reduce", (n_devices - 1) * n_params * 4)
    )


def _in_elements(case: Case, got: Any) -> bool:
    return isinstance(case.expected, dict) and any(
        _stage_is(got, key, value // 4) for key, value in case.expected.items() if value
    )


def _nccl(case: Case) -> bool:
    return case.kwargs.get("algorithm") == "nccl"


def _too_large(case: Case) -> bool:
    return len(case.args) >= 3 and too_large_to_run(*case.args[:3])


def _copies_under_nccl(case: Case, got: Any) -> bool:
    """Under NCCL, the broadcast or the reduce counted once per device that gets a replica, as plain copies."""
    replicas = len(_chunks(case)) - 1 if not _too_large(case) else None
    return (
        _nccl(case)
        and replicas is not None
        and replicas > 1
        and any(_stage_is(got, key, replicas * case.args[2] * 4) for key in ("broadcast", "reduce"))
    )


def _chained_batch(case: Case, got: Any) -> bool:
    """Under NCCL, a batch-sized stage counted once, as if it went along the chain too."""
    return _nccl(case) and any(_wrong_stage(case, got, key) for key in ("scatter", "gather", "grad_scatter"))


DP_TRAFFIC_BYTES = Exercise(
    name="dp_traffic_bytes",
    rules=DP_TRAFFIC_BYTES_RULES,
    hints=[
        Hint(
            lambda case, got: isinstance(case.expected, Raises),
            "Raise ValueError when any of the counts (batch_size, n_devices, n_params, in_features, out_features, "
            "bytes_per_element) is below 1.",
        ),
        Hint(
            lambda case, got: isinstance(got, TypeError) and "algorithm" in str(got),
            'Add the argument algorithm="copy": the exercise asks for NCCL\'s counts too.',
        ),
        Hint(
            lambda case, got: _too_large(case) and isinstance(got, BaseException),
            "These sizes are far too large to run a step, even with nothing computed: count each stage's bytes from "
            "the sizes, as the table of 'The bandwidth bottleneck, in bytes' sets them out.",
        ),
        Hint(
            lambda case, got: not isinstance(got, dict) or not set(STAGES) <= set(got),
            'Return a dict with the five stages as keys: "scatter", "broadcast", "gather", "grad_scatter", "reduce".',
        ),
        Hint(
            _copies_under_nccl,
            "With NCCL the parameters (and their gradients) pass from device to device along a chain: device 0's "
            "link carries them once, however many replicas ('The bandwidth bottleneck, in bytes').",
        ),
        Hint(
            _chained_batch,
            "NCCL takes only the broadcast and the reduce: the chunks, the outputs and their gradient are still "
            "copied between device 0 and each device.",
        ),
        Hint(
            _with_own_chunk,
            "Device 0 keeps its own chunk: the batch is already there, and so are replica 0's outputs. Only what "
            "crosses device 0's link counts ('The bandwidth bottleneck, in bytes').",
        ),
        Hint(
            lambda case, got: (
                any(_stage_is(got, key, 0) for key in _BACKWARD_KEYS)
                and any(case.expected.get(key) for key in _BACKWARD_KEYS if isinstance(case.expected, dict))
            ),
            "Backward moves bytes too: the gathered output's gradient goes back to the replicas, and their "
            "parameter gradients come back to device 0 to be summed. The stages are in the traffic table of 'The "
            "bandwidth bottleneck, in bytes'.",
        ),
        Hint(
            _replicas_for_all,
            "With fewer chunks than devices, DataParallel replicates only to the devices that receive data "
            "(lesson 01's tiny batches): the idle devices get no replica and send no gradients.",
        ),
        Hint(_in_elements, "That counts elements; multiply by bytes_per_element to get bytes."),
    ],
    general_hint="Each stage moves one kind of tensor across device 0's link: parts of the batch, the parameters, "
    "the outputs, or their gradients; only the devices that receive a chunk (lesson 01's chunk semantics) take "
    "part. 'The bandwidth bottleneck, in bytes' measures every stage.",
)


# --------------------------------------------------------------------------------------------- ring_all_reduce_bytes
def _ring_call(n_elements: int, world_size: int, why: str, bytes_per_element: int = 4) -> Call:
    return Call((n_elements, world_size, bytes_per_element), why)


RING_ERRORS = ("world_size < 1 must raise ValueError", "a negative number of elements must raise ValueError")

RING_ALL_REDUCE_BYTES_RULES = (
    Rule(
        "the bytes all ranks together send in a ring all-reduce of `n_elements` elements (reduce-scatter, then "
        "all-gather), an int; 0 for one rank",
        "total",
        same=lambda got, expected: type(got) is int and got == expected,
        visible=lambda: [
            _ring_call(
                1000,
                2,
                "2 ranks, each sending its half (500 elements of 4 bytes) in reduce-scatter and again in all-gather",
            ),
            _ring_call(1200, 4, "4 ranks: 3 steps of reduce-scatter and 3 of all-gather, every rank sending a quarter"),
            _ring_call(1000, 1, "one rank has nobody to talk to: 0 bytes"),
        ],
        extra=lambda: [
            _ring_call(1001, 3, "3 ranks, 1001 elements: uneven chunks, the same total"),
            _ring_call(0, 4, "nothing to reduce: 0 bytes"),
            _ring_call(5000, 8, "float16: 2 bytes per element", bytes_per_element=2),
            Call((10, 3), "bytes_per_element defaults to 4"),
            _ring_call(10**12, 100_003, "100,003 ranks: a ring far too large to play step by step"),
        ],
        seconds=COUNTING_SECONDS,
    ),
    Rule(
        "Raise `ValueError` if `world_size` < 1 or `n_elements` < 0",
        "errors",
        raises=ValueError,
        visible=lambda: [
            Call((10, 0, 4), "world_size < 1"),
            Call((-1, 2, 4), "a negative number of elements"),
        ],
        case_names=RING_ERRORS,
        case_name=lambda n_elements, world_size, bytes_per_element=4: RING_ERRORS[0 if world_size < 1 else 1],
    ),
)


RING_ALL_REDUCE_BYTES = Exercise(
    name="ring_all_reduce_bytes",
    rules=RING_ALL_REDUCE_BYTES_RULES,
    hints=[
        Hint(
            lambda case, got: isinstance(case.expected, Raises),
            "Raise ValueError when world_size < 1 or n_elements < 0 (before computing anything).",
        ),
        Hint(
            lambda case, got: case.args[1] >= RANKS_TOO_MANY_TO_PLAY and isinstance(got, BaseException),
            "A ring of that many ranks is far too large to play step by step: count the bytes from n_elements and "
            "world_size ('DDP: the all-reduce, over every link at once').",
        ),
        Hint(
            lambda case, got: _numeric(got) and got == 2 * case.args[1] * case.args[0] * case.args[2] != 0,
            "That is one step too many per phase: in a ring, how many hops does a piece need to reach every other "
            "rank? See 'DDP: the all-reduce, over every link at once'.",
        ),
        Hint(
            lambda case, got: (
                _numeric(got)
                and case.args[1] > 1
                and abs(got * case.args[1] - case.expected) < 1e-6 * max(1, case.expected)
            ),
            "That is one rank's share. The contract is what all ranks send together: world_size times more.",
        ),
        Hint(
            lambda case, got: _numeric(got) and case.expected and got * 2 == case.expected,
            "Only half: a ring all-reduce has two phases, a reduce-scatter *and* an all-gather ('DDP: the "
            "all-reduce, over every link at once').",
        ),
        Hint(
            lambda case, got: _numeric(got) and case.expected and got * case.args[2] == case.expected,
            "That counts elements; multiply by bytes_per_element.",
        ),
        Hint(
            lambda case, got: not (isinstance(got, numbers.Integral) and not isinstance(got, bool)),
            "Return a plain int (a number of bytes).",
        ),
    ],
    general_hint="Follow one piece of the tensor round the ring, phase by phase, as 'DDP: the all-reduce, over "
    "every link at once' describes it: how many hops does it make, and how many pieces are there?",
)


EXERCISES = [GATHERED_OUTPUT_BYTES, IMBALANCE_RATIO, LOSS_IN_FORWARD, DP_TRAFFIC_BYTES, RING_ALL_REDUCE_BYTES]

# The texts above in Japanese, for the Japanese edition (gpulab.messages.text looks them up by their English).
TRANSLATIONS: dict[str, dict[str, str]] = {
    "ja": {
        "9 samples x 11 numbers x 4 bytes (float32)": "9サンプル × 11個の数 × 4バイト（float32）",
        "every dimension of sample_shape counts: 3 x 5 numbers per sample": (
            "sample_shapeのすべての次元を数えます：1サンプルあたり3 × 5個の数です"
        ),
        "out_features < 1": "out_featuresが1未満",
        # The cases of the rules the grader's feedback names (case_name above).
        "the bytes of a float32 output for other batch sizes and class counts": (
            "ほかのバッチサイズとクラス数でのfloat32の出力のバイト数"
        ),
        "each dtype has its own size per element (float16: 2 bytes, bool: 1)": (
            "dtypeごとに要素1つあたりのサイズが異なります（float16は2バイト、boolは1バイト）"
        ),
        "fewer than two devices must raise ValueError": "デバイスが2台未満ならValueErrorを送出します",
        "the other devices' mean peak of 0 must raise ValueError": (
            "ほかのデバイスのピークの平均が0ならValueErrorを送出します"
        ),
        FORWARD_CASE: "ほかのバッチサイズ、デバイス数、層のサイズでのフォワードの段階（scatter、broadcast、gather）",
        BACKWARD_CASE: "ほかのバッチサイズ、デバイス数、層のサイズでのバックワードの段階（grad_scatter、reduce）",
        IDLE_CASE: "チャンクよりデバイスが多い場合：待機するデバイスはデータもレプリカも受け取りません",
        "batch_size < 1 must raise ValueError": "batch_sizeが1未満ならValueErrorを送出します",
        "n_devices < 1 must raise ValueError": "n_devicesが1未満ならValueErrorを送出します",
        "n_params < 1 must raise ValueError": "n_paramsが1未満ならValueErrorを送出します",
        "in_features < 1 must raise ValueError": "in_featuresが1未満ならValueErrorを送出します",
        "out_features < 1 must raise ValueError": "out_featuresが1未満ならValueErrorを送出します",
        "bytes_per_element < 1 must raise ValueError": "bytes_per_elementが1未満ならValueErrorを送出します",
        "world_size < 1 must raise ValueError": "world_sizeが1未満ならValueErrorを送出します",
        "a negative number of elements must raise ValueError": "要素数が負ならValueErrorを送出します",
        # The rules' statements, as the Japanese edition of lesson 03 states them.
        "the bytes of the output DataParallel gathers on the output device for a batch": (
            "1バッチについて、DataParallelが出力デバイスに集約する出力のバイト数を返す関数です"
        ),
        "`sample_shape` is the shape of one sample's output": "`sample_shape`は1サンプル分の出力の形状です",
        "2 samples x 3 numbers x 4 bytes": "2サンプル × 3個の数値 × 4バイト",
        "device 0's peak divided by the **mean** peak of the *other* devices": (
            "デバイス0のピークを、*ほかの*デバイスのピークの**平均**で割った値です"
        ),
        "Leave `peak_bytes` unchanged": "`peak_bytes`は変更しないでください",
        "10 / 3: a float to full precision, not rounded": "10 / 3：丸めずに、完全な精度のfloatで",
        "large peaks: a float to full precision": "大きなピーク：完全な精度のfloatで",
        "Raise `ValueError` for fewer than two devices, or when the others' mean is 0": (
            "デバイスが2つ未満のとき、またはほかのデバイスの平均が0のときは`ValueError`を送出してください"
        ),
        "the others' mean is (100 + 300) / 2 = 200": "ほかのデバイスの平均は(100 + 300) / 2 = 200です",
        "the list of peaks is the caller's": "ピークのリストは呼び出し側のものです",
        (
            "the bytes all ranks together send in a ring all-reduce of `n_elements` elements (reduce-scatter, then "
            "all-gather), an int; 0 for one rank"
        ): (
            "`n_elements`個の要素をリングでオールリデュース（リデューススキャッターの後にオールギャザー）するときに、"
            "全ランクが合計で送信するバイト数をintで返します。ランクが1つなら0です"
        ),
        "Raise `ValueError` if `world_size` < 1 or `n_elements` < 0": (
            "`world_size` < 1または`n_elements` < 0なら`ValueError`を送出してください"
        ),
        "bytes_per_element defaults to 4": "bytes_per_elementの既定値は4です",
        "return the bytes that leave or enter device 0 by stage, as a dict with the keys": (
            "デバイス0から出る、またはデバイス0に入るバイト数を段階別に返してください"
        ),
        "Each element takes `bytes_per_element` bytes": "1要素は`bytes_per_element`バイトです",
        "device 0 keeps its own chunk, and only devices that receive data get a replica": (
            "デバイス0は自分のチャンクを手元に残し、データを受け取るデバイスだけがレプリカを持ちます"
        ),
        "Raise `ValueError` if any argument is below 1, `bytes_per_element` included": (
            "`bytes_per_element`を含め、いずれかの引数が1未満なら`ValueError`を送出してください"
        ),
        "2 bytes per element (float16): half the bytes": "1要素2バイト（float16）：バイト数は半分です",
        "8 bytes per element (float64): twice the bytes": "1要素8バイト（float64）：バイト数は2倍です",
        "no element takes 0 bytes": "0バイトの要素はありません",
        "a model with no parameters": "パラメータのないモデル",
        (
            "The gathered output is one tensor of shape (batch_size, *sample_shape): count its elements, then the "
            "bytes each one takes in dtype."
        ): (
            "集約された出力は、形状が(batch_size, *sample_shape)の1つのテンソルです。要素数を数え、"
            "次にdtypeで1要素が何バイトになるかを考えましょう。"
        ),
        "That is the number of elements. Memory is counted in bytes, and each dtype has its own size per element.": (
            "それは要素数です。メモリはバイト数で数え、1要素のサイズはdtypeごとに異なります。"
        ),
        (
            "Not every dtype takes 4 bytes: float16 and bfloat16 take 2, float64 and int64 take 8. A dtype knows its "
            "own size."
        ): (
            "すべてのdtypeが4バイトとは限りません。float16とbfloat16は2バイト、float64とint64は8バイトです。"
            "dtype自身が自分のサイズを知っています。"
        ),
        "That looks like bits, not bytes: a byte has 8 of them.": (
            "それはバイトではなくビットのようです。1バイトは8ビットです。"
        ),
        (
            "Too small by a whole factor. The gathered output is the *whole* batch (not one device's chunk), and "
            "every dimension of sample_shape counts."
        ): (
            "整数倍だけ小さすぎます。集約された出力は（1台のデバイスのチャンクではなく）バッチ*全体*で、"
            "sample_shapeのすべての次元を数に入れます。"
        ),
        "The contract asks for a plain int: a number of bytes.": (
            "仕様では、通常のint（バイト数）を返すことになっています。"
        ),
        "256 samples x 20,000 classes x 4 bytes: the whole batch's output, gathered on the output device": (
            "256サンプル × 20,000クラス × 4バイト：出力デバイスに集約される、バッチ全体の出力"
        ),
        "7 samples x 10 numbers x 4 bytes (float32)": "7サンプル × 10個の数値 × 4バイト（float32）",
        "float16 takes 2 bytes per number": "float16は数値1つあたり2バイトです",
        "a sequence model: each sample's output is 128 positions x 1,000 classes, 2 bytes each": (
            "系列モデル：各サンプルの出力は128位置 × 1,000クラスで、それぞれ2バイト"
        ),
        "float64 takes 8 bytes per number": "float64は数値1つあたり8バイトです",
        "every dimension of sample_shape counts": "sample_shapeのすべての次元を数に入れます",
        "an empty sample_shape: one number per sample": "空のsample_shape：サンプルごとに数値が1つ",
        "a torch.Size works like a tuple": "torch.Sizeはタプルと同じように使えます",
        "a batch of one sample": "1サンプルだけのバッチ",
        (
            "How many times device 0's peak is the mean peak of the other devices; invalid when there are no others, "
            "or when they used nothing."
        ): (
            "デバイス0のピークが、ほかのデバイスのピークの平均の何倍かを求めます。ほかのデバイスがない場合や、"
            "ほかのデバイスが何も使っていない場合は無効です。"
        ),
        "With fewer than two devices there are no others to compare with: the contract asks for a ValueError.": (
            "デバイスが2台未満だと、比較するほかのデバイスがありません。仕様ではValueErrorを送出することになっていま"
            "す。"
        ),
        (
            "When the other devices' mean peak is 0 the ratio is undefined: the contract asks for a ValueError, not "
            "a ZeroDivisionError."
        ): (
            "ほかのデバイスのピークの平均が0だと、比は定義できません。仕様ではZeroDivisionErrorではなくValueErrorを送"
            "出することになっています。"
        ),
        (
            "You divided by the *smallest* of the other devices. The contract compares device 0 with a typical other "
            "device: their mean."
        ): (
            "ほかのデバイスの*最小値*で割っています。仕様では、デバイス0を典型的なほかのデバイス、"
            "つまりその平均と比べます。"
        ),
        "You divided by the *largest* of the other devices; the contract compares with their mean.": (
            "ほかのデバイスの*最大値*で割っています。仕様ではその平均と比べます。"
        ),
        "Device 0 is in your mean: the ratio compares device 0 with the *other* devices only.": (
            "平均にデバイス0が含まれています。この比は、デバイス0を*ほかの*デバイスだけと比べるものです。"
        ),
        "The contract asks for a plain float: how many times device 0's peak is the others' mean peak.": (
            "仕様では、デバイス0のピークがほかのデバイスのピークの平均の何倍かを、通常のfloatで返すことになっています。"
        ),
        "device 0 peaked at 300, device 1 at 100: 300 / 100": "デバイス0のピークは300、デバイス1は100：300 / 100",
        "the others' mean is (100 + 150) / 2 = 125, and 250 / 125 = 2 (not their minimum, not everyone's mean)": (
            "ほかのデバイスの平均は(100 + 150) / 2 = 125で、250 / 125 = 2（最小値でも、全デバイスの平均でもありません）"
        ),
        "balanced devices: 1.0": "均等なデバイス：1.0",
        "one device has no others to compare with": "デバイスが1台だと、比較する相手がありません",
        "the others' mean is 0: no ratio": "ほかのデバイスの平均が0：比は求められません",
        "a tuple works too; the others' mean is 200": "タプルでも使えます。ほかのデバイスの平均は200",
        "device 0 below the others gives a ratio below 1": "デバイス0がほかより小さいと、比は1未満になります",
        "no devices at all": "デバイスが1台もない",
        (
            "Move the loss into the replicas, so that each one gathers a number instead of a batch of outputs; 'One "
            "number per device: the scalar warning' shows what shape DataParallel can gather."
        ): (
            "損失の計算をレプリカの中に移し、出力のバッチの代わりに数値を1つだけ集約するようにしましょう。"
            "DataParallelがどんな形状を集約できるかは「デバイスごとに1つの数値：スカラーの警告」で確認できます。"
        ),
        (
            "forward must return the loss alone, a tensor of shape [1]. Returning the outputs as well makes "
            "DataParallel gather them on device 0 again, which is what the exercise removes."
        ): (
            "forwardは損失だけを、形状[1]のテンソルとして返す必要があります。出力も一緒に返すと、"
            "DataParallelがそれをまたデバイス0に集約してしまいます。この演習でなくしたいのはまさにそれです。"
        ),
        (
            "Your forward returns a 0-dim scalar, and DataParallel warns about gathering scalars: gathering "
            "concatenates along dimension 0, which a 0-dim tensor lacks. See 'One number per device: the scalar "
            "warning'."
        ): (
            "forwardが0次元のスカラーを返しているため、DataParallelがスカラーの集約について警告します。"
            "集約は次元0に沿った連結ですが、0次元のテンソルには次元0がありません。「デバイスごとに1つの数値："
            "スカラーの警告」を見てみましょう。"
        ),
        "forward must return shape [1]: one number per chunk, not one per sample.": (
            "forwardは形状[1]を返す必要があります。サンプルごとではなく、チャンクごとに1つの数値です。"
        ),
        (
            "The gathered sum / batch size is not the mean loss: loss_fn already sums over the chunk's samples, and "
            "uneven chunks need sums, not means ('One number per device: the scalar warning')."
        ): (
            "集約した和をバッチサイズで割っても平均損失になりません。loss_fnはすでにチャンク内のサンプルについて和を"
            "取っています。不均等なチャンクでは、平均ではなく和が必要です（「デバイスごとに1つの数値："
            "スカラーの警告」）。"
        ),
        (
            "The model's parameters are not registered in your module, so DataParallel cannot replicate them. An "
            "nn.Module registers the modules it holds as attributes once its own initialisation has run."
        ): (
            "モデルのパラメータがあなたのモジュールに登録されていないため、DataParallelが複製できません。"
            "nn.Moduleは、自身の初期化が済んだあとに属性として持ったモジュールを登録します。"
        ),
        (
            "The gradients differ from the full batch's: the loss must come from the model you were given, on the "
            "chunk, with nothing detached."
        ): (
            "勾配がバッチ全体の勾配と異なります。損失は、渡されたモデルでチャンクから計算し、"
            "何もdetachしないでください。"
        ),
        FORWARD_RETURNS: (
            "`forward(inputs, targets)`は、`loss_fn(model(inputs), targets)`を格納した"
            "形状`[1]`の通常のテンソルを返します"
        ),
        MEAN_OF_GATHERED: "DataParallelでラップすると、`wrapped(x, y).sum() / len(x)`がバッチ全体の平均損失になります",
        MODEL_IS_A_SUBMODULE: "`model`はサブモジュールです。そのパラメータが`LossInForward`のパラメータです",
        FULL_BATCH_GRADIENTS: "その平均のbackwardは、バッチ全体の勾配を`model`に残します",
        ONE_NUMBER_PER_REPLICA: (
            "デバイス0は、レプリカごとに数を1つ受け取ります。そのレプリカのチャンクでの`loss_fn`の値です"
        ),
        "10 samples, cross-entropy summed": "10サンプル、和を取る交差エントロピー",
        (
            "A replica computed with the original model instead of its own copy: DataParallel copies only what your "
            "module registers, and a closure or a list is not registered. Keep the model as self.model and call "
            "self.model in forward."
        ): (
            "レプリカが自分のコピーではなく元のモデルで計算しました。DataParallelがコピーするのは、モジュールが登録した"
            "ものだけです。クロージャやリストは登録されません。モデルはself.modelとして持ち、forwardでは"
            "self.modelを呼び出してください。"
        ),
        "an nn.Linear(3, 2) on 4 samples: a tensor of shape [1]": "4サンプルでのnn.Linear(3, 2)：形状[1]のテンソル",
        "one sample, squared error summed": "1サンプル、和を取る二乗誤差",
        "10 samples on 2 devices: chunks of 5 and 5": "2台のデバイスに10サンプル：5と5のチャンク",
        "uneven chunks (4 and 3): sums add up, means would not": (
            "不均等なチャンク（4と3）：和なら足し合わせられますが、平均ではそうなりません"
        ),
        "the module's parameters are the model's, moved": "モジュールのパラメータは、動かしたモデルのパラメータです",
        "9 samples (chunks of 5 and 4): the full-batch gradients": "9サンプル（5と4のチャンク）：バッチ全体の勾配",
        "64 samples x 4,000 classes: 2 numbers, not 256,000": "64サンプル×4,000クラス：256,000個ではなく2個の数",
        "one sample: a single chunk": "1サンプル：チャンクは1つ",
        "a loss_fn that is a plain function, not a module": "モジュールではなく、ふつうの関数であるloss_fn",
        "uneven chunks with a regression loss": "回帰の損失で不均等なチャンク",
        (
            "Each stage moves one kind of tensor across device 0's link: parts of the batch, the parameters, the "
            "outputs, or their gradients; only the devices that receive a chunk (lesson 01's chunk semantics) take "
            "part. 'The bandwidth bottleneck, in bytes' measures every stage."
        ): (
            "各段階では、1種類のテンソル（バッチの一部、パラメータ、出力、"
            "またはそれらの勾配）がデバイス0のリンクを通ります。参加するのはチャンクを受け取るデバイスだけです（レッ"
            "スン01のchunkの仕様）。「帯域幅のボトルネックをバイト数で見る」で全段階を計測しています。"
        ),
        (
            "Raise ValueError when any of the counts (batch_size, n_devices, n_params, in_features, out_features, "
            "bytes_per_element) is below 1."
        ): (
            "数（batch_size、n_devices、n_params、in_features、out_features、bytes_per_element）のどれかが1未満なら、"
            "ValueErrorを送出してください。"
        ),
        'Return a dict with the five stages as keys: "scatter", "broadcast", "gather", "grad_scatter", "reduce".': (
            '5つの段階"scatter"、"broadcast"、"gather"、"grad_scatter"、"reduce"をキーとする辞書を返してください。'
        ),
        (
            "Device 0 keeps its own chunk: the batch is already there, and so are replica 0's outputs. Only what "
            "crosses device 0's link counts ('The bandwidth bottleneck, in bytes')."
        ): (
            "デバイス0は自分のチャンクを手元に持っています。バッチはすでにそこにあり、"
            "レプリカ0の出力もそこにあります。数えるのは、デバイス0のリンクを通るものだけです（「帯域幅のボトルネック"
            "をバイト数で見る」）。"
        ),
        (
            "Backward moves bytes too: the gathered output's gradient goes back to the replicas, and their parameter "
            "gradients come back to device 0 to be summed. The stages are in the traffic table of 'The bandwidth "
            "bottleneck, in bytes'."
        ): (
            "バックワードでもデータが移動します。集約された出力の勾配がレプリカに戻され、"
            "レプリカのパラメータの勾配は合計のためにデバイス0へ戻ってきます。"
            "各段階は「帯域幅のボトルネックをバイト数で見る」の通信量の表にあります。"
        ),
        (
            "With fewer chunks than devices, DataParallel replicates only to the devices that receive data (lesson "
            "01's tiny batches): the idle devices get no replica and send no gradients."
        ): (
            "チャンクがデバイスより少ないとき、DataParallelはデータを受け取るデバイスにだけモデルを複製します（レッス"
            "ン01の小さすぎるバッチ）。待機しているデバイスにはレプリカがなく、勾配も送りません。"
        ),
        "That counts elements; multiply by bytes_per_element to get bytes.": (
            "それは要素数です。bytes_per_elementを掛けるとバイト数になります。"
        ),
        (
            "8 samples on 2 devices: device 1 receives 4 samples x 3 features, one copy of the parameters, and sends "
            "back 4 x 5 outputs (4 bytes each); device 0's own chunk never moves"
        ): (
            "2台のデバイスに8サンプル：デバイス1は4サンプル × 3特徴量とパラメータのコピー1つを受け取り、4 × "
            "5個の出力（各4バイト）を送り返します。デバイス0自身のチャンクは移動しません"
        ),
        "10 over 3 devices: chunks of 4, 4, 2; devices 1 and 2 receive data": (
            "3台のデバイスに10サンプル：チャンクは4、4、2で、デバイス1と2がデータを受け取ります"
        ),
        (
            "backward sends each replica the gradient of its outputs (grad_scatter) and brings each replica's "
            "parameter gradients back to device 0 (reduce)"
        ): (
            "バックワードでは、各レプリカに出力の勾配を送り（grad_scatter）、"
            "各レプリカのパラメータの勾配をデバイス0に戻します（reduce）"
        ),
        "10 over 4 devices: chunks of 3, 3, 3, 1": "4台のデバイスに10サンプル：チャンクは3、3、3、1",
        "2 samples on 4 devices: only 2 chunks, so only device 1 gets a replica; devices 2 and 3 stay idle": (
            "4台のデバイスに2サンプル：チャンクは2つだけなので、レプリカを受け取るのはデバイス1だけで、"
            "デバイス2と3は待機します"
        ),
        "a batch of 0 samples": "0サンプルのバッチ",
        "in_features < 1": "in_features < 1",
        "7 over 2 devices: chunks of 4 and 3": "2台のデバイスに7サンプル：チャンクは4と3",
        "5 over 4 devices: chunks of 2, 2, 1; device 3 idle": (
            "4台のデバイスに5サンプル：チャンクは2、2、1で、デバイス3は待機"
        ),
        "one device: nothing moves": "デバイスが1台：何も移動しません",
        "no devices": "デバイスがない",
        (
            "Follow one piece of the tensor round the ring, phase by phase, as 'DDP: the all-reduce, over every link "
            "at once' describes it: how many hops does it make, and how many pieces are there?"
        ): (
            "「DDP：すべてのリンクを同時に使うオールリデュース」の説明に沿って、"
            "テンソルの断片の1つがリングを一周する様子をフェーズごとに追ってみましょう。何回ホップし、"
            "断片はいくつあるでしょうか？"
        ),
        "Raise ValueError when world_size < 1 or n_elements < 0 (before computing anything).": (
            "world_size < 1またはn_elements < 0のときは、（何かを計算する前に）ValueErrorを送出してください。"
        ),
        (
            "That is one step too many per phase: in a ring, how many hops does a piece need to reach every other "
            "rank? See 'DDP: the all-reduce, over every link at once'."
        ): (
            "フェーズごとに1ステップ多すぎます。リングでは、断片がほかのすべてのランクに届くまでに何回ホップが必要で"
            "しょうか？「DDP：すべてのリンクを同時に使うオールリデュース」を見てみましょう。"
        ),
        "That is one rank's share. The contract is what all ranks send together: world_size times more.": (
            "それは1つのランクの分です。仕様で求めるのは全ランクが送る量の合計で、そのworld_size倍です。"
        ),
        (
            "Only half: a ring all-reduce has two phases, a reduce-scatter *and* an all-gather ('DDP: the "
            "all-reduce, over every link at once')."
        ): (
            "半分だけです。リングオールリデュースには、reduce-scatter*と*all-gatherの2つのフェーズがあります（「DDP："
            "すべてのリンクを同時に使うオールリデュース」）。"
        ),
        "That counts elements; multiply by bytes_per_element.": (
            "それは要素数です。bytes_per_elementを掛けてください。"
        ),
        "Return a plain int (a number of bytes).": "通常のint（バイト数）を返してください。",
        "2 ranks, each sending its half (500 elements of 4 bytes) in reduce-scatter and again in all-gather": (
            "2ランク：各ランクが自分の半分（4バイトの要素500個）を、reduce-scatterとall-gatherでそれぞれ送ります"
        ),
        "4 ranks: 3 steps of reduce-scatter and 3 of all-gather, every rank sending a quarter": (
            "4ランク：reduce-scatterが3ステップ、all-gatherが3ステップで、各ランクが4分の1ずつ送ります"
        ),
        "one rank has nobody to talk to: 0 bytes": "ランクが1つだと通信相手がいません：0バイト",
        "world_size < 1": "world_size < 1",
        "a negative number of elements": "要素数が負",
        "3 ranks, 1001 elements: uneven chunks, the same total": "3ランク、1001要素：チャンクは不均等でも合計は同じ",
        "nothing to reduce: 0 bytes": "リデュースするものがない：0バイト",
        "float16: 2 bytes per element": "float16：1要素あたり2バイト",
        # NCCL's broadcast and reduce, and inputs far too large to run or play
        NCCL_RULE: ('`algorithm="nccl"`では、ブロードキャストとリデュースはデバイス0のリンクをそれぞれ1回だけ通ります'),
        NCCL_CASE: "ほかのバッチサイズ、デバイス数、層の大きさでのNCCLのブロードキャストとリデュース",
        TOO_LARGE_CASE: (
            "ステップを実行するには大きすぎる大きさ（1兆個のパラメータ、10,000台のデバイス）：測らずに数えます"
        ),
        "4 x 10^12 parameters: far too large to run": "4 × 10^12個のパラメータ：実行するには大きすぎます",
        "100,000 devices: far too many to run": "100,000台のデバイス：実行するには多すぎます",
        "3 samples on 8 devices, 4 x 10^12 parameters: far too large to run": (
            "8台のデバイスに3サンプル、4 × 10^12個のパラメータ：実行するには大きすぎます"
        ),
        (
            "10 over 3 devices with NCCL: the parameters pass 0 -> 1 -> 2, crossing device 0's link once; the chunks "
            "and the outputs are still copies"
        ): (
            "NCCLで3台のデバイスに10サンプル：パラメータは0 -> 1 -> 2と渡り、デバイス0のリンクを1回だけ通ります。"
            "チャンクと出力は今までどおりコピーです"
        ),
        "2 devices: a chain of one hop, the same as a copy": "デバイスが2台：鎖は1ホップで、コピーと同じです",
        (
            "10 over 4 devices with NCCL: the gradients' sum passes 1 -> 2 -> 3 -> 0, crossing device 0's link once; "
            "the output's gradient is still copied to each replica"
        ): (
            "NCCLで4台のデバイスに10サンプル：勾配の和は1 -> 2 -> 3 -> 0と渡り、デバイス0のリンクを1回だけ通ります。"
            "出力の勾配は今までどおり各レプリカにコピーされます"
        ),
        "3 devices: the sum crosses device 0's link once": "デバイスが3台：和はデバイス0のリンクを1回だけ通ります",
        "100,003 ranks: a ring far too large to play step by step": (
            "100,003ランク：1ステップずつ再現するには大きすぎるリング"
        ),
        'Add the argument algorithm="copy": the exercise asks for NCCL\'s counts too.': (
            '引数algorithm="copy"を加えてください。この演習ではNCCLの場合の数も求めます。'
        ),
        (
            "These sizes are far too large to run a step, even with nothing computed: count each stage's bytes from "
            "the sizes, as the table of 'The bandwidth bottleneck, in bytes' sets them out."
        ): (
            "この大きさでは、何も計算しなくてもステップを実行できません。「帯域幅のボトルネックをバイト数で見る」の表の"
            "ように、各段階のバイト数を大きさから数えてください。"
        ),
        (
            "With NCCL the parameters (and their gradients) pass from device to device along a chain: device 0's "
            "link carries them once, however many replicas ('The bandwidth bottleneck, in bytes')."
        ): (
            "NCCLでは、パラメータ（とその勾配）はデバイスからデバイスへ鎖に沿って渡ります。レプリカがいくつあっても、"
            "デバイス0のリンクを通るのは1回です（「帯域幅のボトルネックをバイト数で見る」）。"
        ),
        (
            "NCCL takes only the broadcast and the reduce: the chunks, the outputs and their gradient are still "
            "copied between device 0 and each device."
        ): (
            "NCCLが受け持つのはブロードキャストとリデュースだけです。チャンク、出力、出力の勾配は今までどおり"
            "デバイス0と各デバイスとの間でコピーされます。"
        ),
        (
            "A ring of that many ranks is far too large to play step by step: count the bytes from n_elements and "
            "world_size ('DDP: the all-reduce, over every link at once')."
        ): (
            "それほど多くのランクのリングは、1ステップずつ再現するには大きすぎます。n_elementsとworld_sizeから"
            "バイト数を数えてください（「DDP：すべてのリンクを同時に使うオールリデュース」）。"
        ),
    },
}
