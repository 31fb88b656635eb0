"""Lesson 03 (GPU-0 imbalance): the self-checks of ``gathered_output_bytes``, ``imbalance_ratio`` and
``LossInForward``.

Expected values come from PyTorch itself or from measurements: the bytes of a tensor of the gathered output's
shape and dtype (made on the ``meta`` device, so nothing is allocated), the full-batch mean loss and its
gradients (one backward on a copy of the model), and device 0's peak memory measured with ``gpulab.memory.track``
while DataParallel gathers the outputs. Every case builds its models and data fresh, so an answer that modifies
them cannot spoil the next case.

Every case has a ``kind`` naming the graded test cell of the lesson whose visible part asserts it::

    for case in gpulab.check.cases("imbalance_ratio", kind="ratio"):
        got = case.call(imbalance_ratio)
        assert same_number(got, case.expected), case.message("imbalance_ratio", got)
"""

from __future__ import annotations

import copy
import math
import numbers
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gpulab.check import Case, Exercise, Hint, Raises, Scenario
from gpulab.data_parallel import DataParallel
from gpulab.devices import current_devices

RELATIVE_TOLERANCE = 1e-6
LOSS_TOLERANCE = 1e-5
SCALAR_WARNING = "input tensors were scalars"


def same_number(got: Any, expected: Any) -> bool:
    """``got`` is a plain number (not a bool) equal to ``expected`` within a relative 1e-6 (lesson 03's tests)."""
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        return False
    return abs(float(got) - expected) <= RELATIVE_TOLERANCE * max(1.0, abs(expected))


# --------------------------------------------------------------------------------------------- gathered_output_bytes
def reference_output_bytes(batch_size: int, sample_shape: tuple, dtype: torch.dtype) -> int:
    """Bytes of a ``(batch_size, *sample_shape)`` tensor of ``dtype``, from a tensor on the meta device."""
    tensor = torch.empty((batch_size, *sample_shape), dtype=dtype, device="meta")
    return tensor.numel() * tensor.element_size()


def _bytes_case(kind: str, batch_size: int, sample_shape: tuple, dtype: torch.dtype, why: str) -> Case:
    return Case(
        (batch_size, sample_shape, dtype), reference_output_bytes(batch_size, sample_shape, dtype), why, kind=kind
    )


def _bytes_cases() -> list[Case]:
    return [
        _bytes_case(
            "float32",
            256,
            (20_000,),
            torch.float32,
            "256 samples x 20,000 classes x 4 bytes: the whole batch's output, gathered on the output device",
        ),
        _bytes_case("float32", 7, (10,), torch.float32, "7 samples x 10 numbers x 4 bytes (float32)"),
        _bytes_case("dtypes_shapes", 64, (32_000,), torch.float16, "float16 takes 2 bytes per number"),
        _bytes_case(
            "dtypes_shapes",
            8,
            (128, 1_000),
            torch.bfloat16,
            "a sequence model: each sample's output is 128 positions x 1,000 classes, 2 bytes each",
        ),
    ]


def _bytes_extra() -> list[Case]:
    return [
        _bytes_case("dtypes_shapes", 10, (3,), torch.float64, "float64 takes 8 bytes per number"),
        _bytes_case("dtypes_shapes", 5, (2, 3, 4), torch.int64, "every dimension of sample_shape counts"),
        _bytes_case("dtypes_shapes", 12, (), torch.float32, "an empty sample_shape: one number per sample"),
        _bytes_case("dtypes_shapes", 3, torch.Size([5, 7]), torch.uint8, "a torch.Size works like a tuple"),
        _bytes_case("float32", 1, (50_000,), torch.float32, "a batch of one sample"),
    ]


def _bytes_same(got: Any, expected: int) -> bool:
    return isinstance(got, numbers.Integral) and not isinstance(got, bool) and int(got) == expected


def _elements(case: Case) -> int:
    batch_size, sample_shape, _ = case.args
    return batch_size * math.prod(sample_shape)


def _itemsize(case: Case) -> int:
    return torch.empty((), dtype=case.args[2]).element_size()


def _numeric(got: Any) -> bool:
    return isinstance(got, numbers.Real) and not isinstance(got, bool)


GATHERED_OUTPUT_BYTES = Exercise(
    name="gathered_output_bytes",
    visible_cases=_bytes_cases,
    extra_cases=_bytes_extra,
    same=_bytes_same,
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
    solution="""def gathered_output_bytes(batch_size, sample_shape, dtype):
    elements = batch_size * math.prod(sample_shape)       # math.prod(()) == 1
    return elements * dtype.itemsize                      # bytes per element: 4 for float32, 2 for float16""",
)


# --------------------------------------------------------------------------------------------- imbalance_ratio
def _ratio_cases() -> list[Case]:
    return [
        Case(([300, 100],), 3.0, "device 0 peaked at 300, device 1 at 100: 300 / 100", kind="ratio"),
        Case(
            ([250, 100, 150],),
            2.0,
            "the others' mean is (100 + 150) / 2 = 125, and 250 / 125 = 2 (not their minimum, not everyone's mean)",
            kind="ratio",
        ),
        Case(([512, 512],), 1.0, "balanced devices: 1.0", kind="ratio"),
        Case(([1000],), Raises(ValueError), "one device has no others to compare with", kind="errors"),
        Case(([5, 0, 0],), Raises(ValueError), "the others' mean is 0: no ratio", kind="errors"),
    ]


def _ratio_extra() -> list[Case]:
    return [
        Case(((600, 100, 200, 300),), 3.0, "a tuple works too; the others' mean is 200", kind="ratio"),
        Case(([100, 400],), 0.25, "device 0 below the others gives a ratio below 1", kind="ratio"),
        Case(([],), Raises(ValueError), "no devices at all", kind="errors"),
    ]


def _others(case: Case) -> list[float]:
    return [float(value) for value in case.args[0][1:]]


def _close_to(got: Any, value: float) -> bool:
    return _numeric(got) and abs(float(got) - value) <= 1e-6 * max(1.0, abs(value))


IMBALANCE_RATIO = Exercise(
    name="imbalance_ratio",
    visible_cases=_ratio_cases,
    extra_cases=_ratio_extra,
    same=lambda got, expected: same_number(got, expected),
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
    solution="""def imbalance_ratio(peak_bytes):
    peaks = list(peak_bytes)
    if len(peaks) < 2:
        raise ValueError("need device 0 and at least one other device")
    others = sum(peaks[1:]) / len(peaks[1:])
    if others == 0:
        raise ValueError("the other devices' mean peak is 0")
    return peaks[0] / others""",
)


# --------------------------------------------------------------------------------------------- LossInForward
class _Head(nn.Sequential):
    """``Linear -> ReLU -> Linear``: a small classifier or regressor, shown briefly in feedback."""

    def __repr__(self) -> str:
        return f"<model {self[0].in_features}-{self[0].out_features}-{self[2].out_features}>"


def _model(seed: int, features: int = 6, hidden: int = 8, outputs: int = 5) -> nn.Module:
    torch.manual_seed(seed)
    model = _Head(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, outputs))
    return model.to(current_devices().primary)


def _batch(seed: int, batch_size: int, features: int = 6, outputs: int = 5, regression: bool = False):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(batch_size, features, generator=generator)
    if regression:
        targets = torch.randn(batch_size, outputs, generator=generator)
    else:
        targets = torch.randint(0, outputs, (batch_size,), generator=generator)
    primary = current_devices().primary
    return inputs.to(primary), targets.to(primary)


def _summed_loss(regression: bool) -> nn.Module:
    """The loss function the lesson's contract gives ``LossInForward``: it sums over the samples."""
    return nn.MSELoss(reduction="sum") if regression else nn.CrossEntropyLoss(reduction="sum")


def _values(tensor: torch.Tensor) -> list[float]:
    return [float(value) for value in tensor.detach().reshape(-1).cpu().tolist()]


def _close_lists(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(
        abs(g - w) <= LOSS_TOLERANCE + 1e-4 * abs(w) for g, w in zip(got, want, strict=True)
    )


def _wrapped(module: nn.Module) -> nn.Module:
    """``module`` in ``gpulab.DataParallel`` on the lesson's devices (nn.DataParallel itself on real GPUs)."""
    return DataParallel(module, device_ids=current_devices())


def _scalar_warnings(caught) -> bool:
    return any(SCALAR_WARNING in str(warning.message) for warning in caught)


def _observe_value(seed: int, batch_size: int, regression: bool = False):
    def observe(cls: Callable) -> dict:
        model = _model(seed, outputs=3 if regression else 5)
        inputs, targets = _batch(seed, batch_size, outputs=3 if regression else 5, regression=regression)
        summed = _summed_loss(regression)
        want = summed(copy.deepcopy(model)(inputs), targets).item() / batch_size  # the full batch, on one device
        module = cls(model, summed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            direct = module(inputs, targets)
            gathered = _wrapped(module)(inputs, targets)
        observed = {"forward returns": type(direct).__name__, "scalar warning": _scalar_warnings(caught)}
        if isinstance(direct, torch.Tensor):
            observed["shape of forward's result"] = list(direct.shape)
        if isinstance(gathered, torch.Tensor):
            got = gathered.sum().item() / batch_size
            observed["sum / len(x) is the full-batch mean loss"] = _close_lists([got], [want])
        return observed

    return observe


def _value_expected() -> dict:
    return {
        "forward returns": "Tensor",
        "scalar warning": False,
        "shape of forward's result": [1],
        "sum / len(x) is the full-batch mean loss": True,
    }


def _observe_gradients(seed: int, batch_size: int, regression: bool = False):
    def observe(cls: Callable) -> dict:
        outputs = 3 if regression else 5
        model = _model(seed, outputs=outputs)
        inputs, targets = _batch(seed, batch_size, outputs=outputs, regression=regression)
        summed = _summed_loss(regression)
        reference = copy.deepcopy(model)
        names, parameters = zip(*reference.named_parameters(), strict=True)
        full_batch_mean = summed(reference(inputs), targets) / batch_size
        want = [_values(g) for g in torch.autograd.grad(full_batch_mean, parameters)]
        module = cls(model, summed)
        registered = {id(p) for p in module.parameters()} >= {id(p) for p in model.parameters()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (_wrapped(module)(inputs, targets).sum() / batch_size).backward()
        got = dict(model.named_parameters())
        equal = all(
            got[name].grad is not None and _close_lists(_values(got[name].grad), values)
            for name, values in zip(names, want, strict=True)
        )
        return {"model's parameters registered": registered, "gradients equal the full-batch gradients": equal}

    return observe


def _gradients_expected() -> dict:
    return {"model's parameters registered": True, "gradients equal the full-batch gradients": True}


MEMORY_BATCH, MEMORY_CLASSES = 64, 4_000


def device0_peaks(cls: Callable, batch_size: int = MEMORY_BATCH, classes: int = MEMORY_CLASSES) -> dict:
    """Device 0's peak bytes for one forward and backward, gathering the outputs vs ``cls`` (lesson 03).

    Measured with ``gpulab.memory.track`` on the lesson's devices, counting only what the step allocates.
    """
    from gpulab import memory

    devices = current_devices()
    model = _model(5, hidden=16, outputs=classes)
    inputs, targets = _batch(5, batch_size, outputs=classes)
    peaks = {}
    for label in ("gather", "loss in forward"):
        model.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with memory.track(devices, count_existing=False) as trace:
                if label == "gather":
                    loss = nn.functional.cross_entropy(_wrapped(model)(inputs), targets)
                else:
                    loss = _wrapped(cls(model, nn.CrossEntropyLoss(reduction="sum")))(inputs, targets).sum()
                loss.backward()
                del loss
        peaks[label] = trace.peaks()[0]
    model.zero_grad(set_to_none=True)
    return peaks


def _observe_memory(cls: Callable) -> dict:
    peaks = device0_peaks(cls)
    gathered = reference_output_bytes(MEMORY_BATCH, (MEMORY_CLASSES,), torch.float32)
    return {
        "device 0's peak drops by at least half the gathered output": peaks["loss in forward"]
        <= peaks["gather"] - gathered // 2,
        "device 0 peak MiB (gather, loss in forward)": [
            round(peaks["gather"] / 2**20, 2),
            round(peaks["loss in forward"] / 2**20, 2),
        ],
    }


def _loss_cases() -> list[Case]:
    return [
        Scenario(
            (),
            _value_expected(),
            "forward returns loss_fn(model(inputs), targets) as a tensor of shape [1]; loss_fn sums over the "
            "chunk, so the gathered sum divided by the batch size is the mean loss",
            kind="value",
            title="on 10 samples (chunks of 5 and 5), cross-entropy",
            observe=_observe_value(1, 10),
        ),
        Scenario(
            (),
            _value_expected(),
            "uneven chunks: summing each chunk's *sum* and dividing by the whole batch is right for any chunking",
            kind="value",
            title="on 7 samples (chunks of 4 and 3), mean squared error",
            observe=_observe_value(2, 7, regression=True),
        ),
        Scenario(
            (),
            _gradients_expected(),
            "DataParallel replicates the model inside your module; backward sums the replicas' gradients into it",
            kind="gradients",
            title="backward on 9 samples (chunks of 5 and 4)",
            observe=_observe_gradients(3, 9),
        ),
        Scenario(
            (),
            {"device 0's peak drops by at least half the gathered output": True},
            "with the loss computed in each replica, only one number per device is gathered on device 0",
            kind="memory",
            title=f"(device 0's peak memory, {MEMORY_BATCH} samples x {MEMORY_CLASSES:,} classes)",
            observe=_observe_memory,
        ),
    ]


def _loss_extra() -> list[Case]:
    return [
        Scenario(
            (),
            _value_expected(),
            "one sample: a single chunk",
            kind="value",
            title="on 1 sample",
            observe=_observe_value(4, 1),
        ),
        Scenario(
            (),
            _gradients_expected(),
            "uneven chunks with a regression loss",
            kind="gradients",
            title="backward on 5 samples (chunks of 3 and 2), mean squared error",
            observe=_observe_gradients(6, 5, regression=True),
        ),
    ]


def matches(got: Any, expected: dict) -> bool:
    """Every observation in ``expected`` was made, with that value (lesson 03's visible ``LossInForward`` tests).

    ``got`` may hold more (measured peaks, for the message); only the expected keys are compared.
    """
    return isinstance(got, dict) and all(key in got and got[key] == value for key, value in expected.items())


def _observed(got: Any, key: str, value: Any) -> bool:
    return isinstance(got, dict) and key in got and got[key] == value


LOSS_IN_FORWARD = Exercise(
    name="LossInForward",
    visible_cases=_loss_cases,
    extra_cases=_loss_extra,
    same=matches,
    hints=[
        Hint(
            lambda case, got: isinstance(got, dict) and got.get("forward returns") not in (None, "Tensor"),
            "forward must return the loss alone, a tensor of shape [1]. Returning the outputs as well makes "
            "DataParallel gather them on device 0 again, which is what the exercise removes.",
        ),
        Hint(
            lambda case, got: _observed(got, "scalar warning", True) or _observed(got, "shape of forward's result", []),
            "Your forward returns a 0-dim scalar: DataParallel then warns (on stderr) that it 'was asked to gather "
            "along dimension 0, but all input tensors were scalars'. Gather concatenates along dim 0, so each chunk's "
            "loss needs one dimension of size 1.",
        ),
        Hint(
            lambda case, got: (
                isinstance(got, dict)
                and isinstance(got.get("shape of forward's result"), list)
                and got["shape of forward's result"] != [1]
            ),
            "forward must return shape [1]: one number per chunk, not one per sample.",
        ),
        Hint(
            lambda case, got: _observed(got, "sum / len(x) is the full-batch mean loss", False),
            "The gathered sum / batch size is not the mean loss. loss_fn already sums over the chunk's samples: "
            "dividing again, or using another loss, breaks the full-batch mean.",
        ),
        Hint(
            lambda case, got: _observed(got, "model's parameters registered", False),
            "The model's parameters are not registered in your module, so DataParallel cannot replicate them. An "
            "nn.Module registers the modules it holds as attributes once its own initialisation has run.",
        ),
        Hint(
            lambda case, got: _observed(got, "gradients equal the full-batch gradients", False),
            "The gradients differ from the full batch's: the loss must come from the model you were given, on the "
            "chunk, with nothing detached.",
        ),
        Hint(
            lambda case, got: _observed(got, "device 0's peak drops by at least half the gathered output", False),
            "Device 0's peak did not drop: the model's outputs still reach device 0. Only each chunk's loss should "
            "travel.",
        ),
    ],
    general_hint=(
        "Move the loss into the replicas: an nn.Module that holds the model and the loss function, whose forward "
        "returns only its chunk's loss, shaped so that DataParallel can gather it."
    ),
    solution="""class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model                 # a submodule: DataParallel replicates its parameters
        self.loss_fn = loss_fn             # sums over the chunk's samples (reduction="sum")

    def forward(self, inputs, targets):
        return self.loss_fn(self.model(inputs), targets).view(1)     # shape [1]: no scalar-gather warning""",
)


EXERCISES = [GATHERED_OUTPUT_BYTES, IMBALANCE_RATIO, LOSS_IN_FORWARD]
