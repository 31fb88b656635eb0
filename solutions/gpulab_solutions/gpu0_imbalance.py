"""The references, hidden inputs and solutions of ``gpulab.exercises.gpu0_imbalance``'s exercises."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction

import torch
from gpulab.check import Call
from gpulab.exercises.gpu0_imbalance import (
    _BACKWARD_KEYS,
    _FORWARD_KEYS,
    DP_TRAFFIC_BYTES_RULES,
    DTYPES,
    GATHERED_OUTPUT_BYTES_RULES,
    IMBALANCE_RATIO_RULES,
    LOSS_FUNCTIONS,
    LOSS_IN_FORWARD_RULES,
    RING_ALL_REDUCE_BYTES_RULES,
    SCENARIO_DEVICES,
    STAGES,
    _loss_call,
    _traffic_call,
    loss_scenario,
    traffic_model,
)
from gpulab.traffic import counted_step, ring_bytes_sent
from gpulab.transfers import ROUTES, STAR
from torch import nn

from gpulab_solutions import Answers, for_rules


def reference_output_bytes(batch_size: int, sample_shape: tuple, dtype: torch.dtype) -> int:
    """Bytes of a ``(batch_size, *sample_shape)`` tensor of ``dtype``, from a tensor on the meta device."""
    tensor = torch.empty((batch_size, *sample_shape), dtype=dtype, device="meta")
    return tensor.numel() * tensor.element_size()


def _float32_hidden(rng) -> list[tuple]:
    pairs = [(1, 1), (1, 50_000), (3, 7), (64, 1000), (100, 3), (512, 50_000), (4096, 32_000)]
    pairs += [(rng.randint(1, 5000), rng.randint(1, 60_000)) for _ in range(4)]
    cases = [(batch, (classes,), torch.float32) for batch, classes in pairs]
    return [*cases, (9, torch.Size([11]), torch.float32), (33, (1000,), torch.float32)]


def _shapes_hidden(rng) -> list[tuple]:
    shapes = [(5, (7,)), (3, (4, 6)), (2, (2, 3, 5)), (8, ()), (6, torch.Size([3, 9])), (1, (1,))]
    cases = [(batch, shape, getattr(torch, name)) for name in DTYPES for batch, shape in shapes]
    cases += [(16, (128, 32_000), torch.float32), (10, (6, 300), torch.float16)]
    for _ in range(4):
        shape = tuple(rng.randint(1, 40) for _ in range(rng.randint(0, 3)))
        cases.append((rng.randint(1, 300), shape, getattr(torch, rng.choice(DTYPES))))
    return cases


def reference_ratio(peak_bytes) -> float:
    """Device 0's peak over the others' mean, in exact fractions."""

    others = [Fraction(p) for p in peak_bytes[1:]]
    return float(Fraction(peak_bytes[0]) / (sum(others) / len(others)))


def _ratio_hidden(rng) -> list[tuple]:
    hidden = [
        [300, 100],
        [100, 300],
        [7, 7],
        [250, 100, 150],
        [900, 100, 200, 600],
        [1000, 10, 20, 30, 40, 50, 60, 70],
        [0, 5, 5],
        [123_456_789_012, 98_765_432_109, 5_000_000_000],
        [2.5, 0.5, 1.5],
        (600, 100, 200, 300),
    ]
    for others in range(1, 7):
        hidden.append([rng.randint(0, 10**10)] + [rng.randint(1, 10**10) for _ in range(others)])
    return [(peaks,) for peaks in hidden]


def _ratio_errors_hidden(rng) -> list[tuple]:
    bad = [[], [0], [12345], (7,), [3, 0], [9, 0, 0, 0], [0, 0]]
    bad += [[rng.randint(0, 10**6)] + [0] * rng.randint(0, 6) for _ in range(3)]
    return [(peaks,) for peaks in bad]


def one_chunk_loss(**inputs) -> torch.Tensor:
    """Reference of the forward rule: ``loss_fn(model(inputs), targets)`` as a tensor of shape ``[1]``."""
    model, x, y, loss_fn = loss_scenario(**inputs)
    with torch.no_grad():
        return loss_fn(model(x), y).reshape(1)


def full_batch_mean_loss(**inputs) -> float:
    """Reference of the mean rule: the summed loss of the whole batch on one device, over its size."""
    return float(one_chunk_loss(**inputs)) / inputs["samples"]


def moved_parameters(shift: float, **inputs) -> list[torch.Tensor]:
    """Reference of the submodule rule: the model's parameters, each moved by ``shift``."""
    model = loss_scenario(**inputs)[0]
    return [(parameter.detach() + shift) for parameter in model.parameters()]


def full_batch_gradients(**inputs) -> list:
    """Reference of the gradients rule: ``[name, gradient]`` of the full-batch mean loss on one device."""
    model, x, y, loss_fn = loss_scenario(**inputs)
    names, parameters = zip(*model.named_parameters(), strict=True)
    with torch.enable_grad():  # whatever the process set
        gradients = torch.autograd.grad(loss_fn(model(x), y) / len(x), parameters)
    return [[name, gradient] for name, gradient in zip(names, gradients, strict=True)]


def chunk_losses(**inputs) -> torch.Tensor:
    """Reference of the device-0 rule: ``loss_fn`` on each chunk DataParallel's scatter makes (``Tensor.chunk``)."""
    model, x, y, loss_fn = loss_scenario(**inputs)
    devices = inputs.get("devices", SCENARIO_DEVICES)
    with torch.no_grad():
        return torch.stack([loss_fn(model(xc), yc) for xc, yc in zip(x.chunk(devices), y.chunk(devices), strict=True)])


def _drawn_loss(rng, **fixed) -> Call:
    inputs = {
        "seed": rng.randrange(2**31),
        "samples": rng.randint(1, 17),
        "loss": rng.choice(sorted(LOSS_FUNCTIONS)),
        "layers": [rng.randint(2, 8), rng.randint(2, 8), rng.randint(2, 6)],
        "activation": rng.choice(["relu", "tanh"]),
    }
    return Call((), kwargs={**inputs, **fixed})


def _value_hidden(rng) -> list[Call]:
    return [
        _loss_call(1, 10, "cross-entropy", [5, 7, 4], activation="tanh"),
        _loss_call(2, 7, "cross-entropy", [5, 7, 4], activation="tanh"),
        _loss_call(3, 9, "squared error", [5, 7, 3], activation="tanh"),
        _loss_call(4, 3, "absolute error", [5, 7, 3], activation="tanh"),
        _loss_call(5, 1, "cross-entropy", [5, 7, 4], activation="tanh"),
        _loss_call(6, 12, "squared error", [5, 7, 3], activation="tanh", devices=1),
        _loss_call(7, 13, "cross-entropy", [5, 7, 4], activation="tanh"),
        _drawn_loss(rng),
        _drawn_loss(rng),
    ]


def _submodule_hidden(rng) -> list[Call]:
    shift = rng.choice([0.25, -0.5, 0.125, 0.75])
    return [
        _loss_call(11, 9, "cross-entropy", [5, 6, 4], shift=shift),
        _loss_call(0, 4, "squared error", [3, 2], shift=shift),
        _drawn_loss(rng, shift=shift),
    ]


def _gradients_hidden(rng) -> list[Call]:
    return [
        _loss_call(11, 9, "cross-entropy", [5, 6, 4]),
        _loss_call(12, 7, "squared error", [5, 6, 3]),
        _loss_call(13, 3, "cross-entropy", [5, 6, 4]),
        _loss_call(14, 16, "cross-entropy", [5, 6, 4]),
        _loss_call(15, 5, "squared error", [5, 6, 3], devices=1),
        _loss_call(16, 8, "absolute error", [5, 6, 3]),
        _drawn_loss(rng, activation="tanh"),
        _drawn_loss(rng, activation="tanh"),
    ]


def _device_0_hidden(rng) -> list[Call]:
    return [
        _loss_call(rng.randrange(2**31), 96, "cross-entropy", [12, 16, 6_000]),
        _loss_call(rng.randrange(2**31), rng.randint(2, 99), "cross-entropy", [8, 16, 3_000]),
    ]


def chunk_sizes(batch_size: int, n_devices: int) -> list[int]:
    """``Tensor.chunk``'s sizes, by arithmetic: ``ceil(B / N)`` each, the last one shorter, as many as that takes."""
    size = -(-batch_size // n_devices)
    count = -(-batch_size // size)
    return [size] * (count - 1) + [batch_size - size * (count - 1)]


def reference_traffic(
    batch_size: int,
    n_devices: int,
    n_params: int,
    in_features: int,
    out_features: int,
    bytes_per_element: int = 4,
    algorithm: str = "copy",
) -> dict:
    """The bytes on device 0's link by stage of one DataParallel step, counted from the sizes: each device that
    receives a chunk, besides device 0, takes part in every stage with one tensor (its chunk, a copy of the
    parameters, its outputs, their gradient, its parameters' gradients), and each stage crosses device 0's link as
    ``algorithm`` routes it (``gpulab.transfers.ROUTES``): a star once per such device, a chain once. Held equal to
    what ``gpulab.traffic`` counts on virtual devices under both algorithms by ``tests/test_traffic.py``."""
    others = chunk_sizes(batch_size, n_devices)[1:]
    tensors = {
        "scatter": [chunk * in_features for chunk in others],
        "broadcast": [n_params] * len(others),
        "gather": [chunk * out_features for chunk in others],
        "grad_scatter": [chunk * out_features for chunk in others],
        "reduce": [n_params] * len(others),
    }
    routes = ROUTES[algorithm]
    return {
        stage: (sum(sizes) if routes[stage] == STAR else max(sizes, default=0)) * bytes_per_element
        for stage, sizes in tensors.items()
    }


def counted_traffic(
    batch_size: int, n_devices: int, sizes: tuple, bytes_per_element: int = 4, algorithm: str = "copy"
) -> dict:
    """The bytes on device 0's link by stage of one DataParallel step of ``traffic_model(*sizes)``, counted by
    ``gpulab.traffic`` (gpulab's DataParallel on virtual devices of the meta device, playing ``algorithm``), scaled
    from float32's 4 bytes per element to ``bytes_per_element``: the grader's second computation, for the drawn
    inputs small enough to run. A step is counted once per grading process: every notebook graded there has the
    exercise's fixed cases, and a count depends on nothing but its inputs."""
    float32_bytes = _float32_stages(batch_size, n_devices, tuple(sizes), algorithm)
    return {key: bytes_ // 4 * bytes_per_element for key, bytes_ in float32_bytes}


@functools.lru_cache(maxsize=1024)
def _float32_stages(batch_size: int, n_devices: int, sizes: tuple, algorithm: str) -> tuple:
    with torch.device("meta"):
        model = traffic_model(*sizes)
    inputs, targets = torch.empty(batch_size, sizes[0]), torch.empty(batch_size, sizes[2])
    stages = counted_step(model, inputs, targets, nn.functional.mse_loss, n_devices, algorithm).by_stage(0)
    return tuple((key, int(stages[key])) for key in STAGES)


def _stages_of(keys: tuple) -> Callable[..., dict]:
    def reference(*args, **kwargs) -> dict:
        stages = reference_traffic(*args, **kwargs)
        return {key: stages[key] for key in keys}

    return reference


def _counted(keys: tuple, batch_size: int, n_devices: int, sizes: tuple, **kwargs) -> Call:
    """A drawn input whose expected value ``gpulab.traffic`` counts on virtual devices (for ``keys``)."""
    stages = counted_traffic(batch_size, n_devices, sizes, **kwargs)
    call = _traffic_call(batch_size, n_devices, sizes, **kwargs)
    return Call(call.args, call.why, call.kwargs, expected={key: stages[key] for key in keys})


def _random_sizes(rng, devices: int) -> tuple:
    """A step on which every device gets samples. ``Tensor.chunk`` makes chunks of ``ceil(batch / n)`` samples, so
    it leaves devices idle when the batch is smaller than the device count and also when it is not (5 samples on 4
    devices: chunks of 2, 2 and 1). Idle devices are their own cell's concern: a draw for the forward and backward
    cells must not grade that mistake a second time."""
    while True:
        batch, n = rng.randint(1, 70), rng.randint(1, devices)
        if math.ceil(batch / math.ceil(batch / n)) == n:
            return (batch, n, (rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 12)))


def _trillion_parameters(rng, devices: int, batch_size: int, **kwargs) -> Call:
    """A model of one to ten trillion parameters: no answer can make it, even without memory (the meta device) the
    instrument's step is then the only way left."""
    in_features, out_features = rng.randint(500, 4000), rng.randint(500, 4000)
    hidden = rng.randint(10**12 // (in_features + out_features + 1) + 1, 10**13 // (in_features + out_features + 1))
    return _traffic_call(batch_size, devices, (in_features, hidden, out_features), **kwargs)


def _many_devices(rng, devices: int, batch_size: int, **kwargs) -> Call:
    """A small model on 100,000 devices or more: a step needs a replica and a thread per device that gets data,
    which no check's time (nor a kernel's task limit) allows, on any device, the meta device included; counting
    takes milliseconds (``Tensor.chunk`` of the batch, a second)."""
    return _traffic_call(batch_size, devices, (rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 12)), **kwargs)


def _too_large(rng, **kwargs) -> list[Call]:
    """Two steps far too large to run or count by running, on which every device gets samples (their expected values
    from ``reference_traffic``): a model of a trillion parameters or more on 2 to 8 devices, and a small model on
    100,000 to 150,000 devices."""
    devices, many = rng.randint(2, 8), rng.randint(10**5, 15 * 10**4)
    return [
        _trillion_parameters(rng, devices, devices * rng.randint(1, 64), **kwargs),
        _many_devices(rng, many, many * rng.randint(1, 3), **kwargs),
    ]


def _forward_hidden(rng, algorithm: str = "copy") -> list[Call]:
    cases = [(16, 2, (5, 7, 3)), (9, 2, (2, 3, 11)), (10, 3, (4, 4, 6)), (13, 4, (3, 8, 2)), (64, 4, (6, 2, 9))]
    cases += [_random_sizes(rng, 5) for _ in range(2)]
    extra = {"algorithm": algorithm} if algorithm != "copy" else {}
    return [*(_counted(_FORWARD_KEYS, *case, **extra) for case in cases), *_too_large(rng, **extra)]


def _backward_hidden(rng, algorithm: str = "copy") -> list[Call]:
    cases = [(16, 2, (5, 7, 3)), (11, 3, (2, 3, 11)), (10, 4, (4, 4, 6)), (32, 4, (3, 8, 2))]
    cases += [_random_sizes(rng, 5) for _ in range(2)]
    extra = {"algorithm": algorithm} if algorithm != "copy" else {}
    return [*(_counted(_BACKWARD_KEYS, *case, **extra) for case in cases), *_too_large(rng, **extra)]


def _idle_hidden(rng) -> list[Call]:
    cases = [(1, 2, (3, 4, 5)), (3, 4, (2, 5, 3)), (5, 4, (4, 3, 2)), (2, 3, (6, 2, 7)), (4, 1, (3, 3, 3))]
    n = rng.randint(3, 8)
    cases += [(rng.randint(1, n - 1), n, (2, 3, 4))]
    # Idle devices far too many to run: fewer samples than devices, a trillion parameters or 100,000 devices and more
    devices, many = rng.randint(3, 8), rng.randint(10**5, 15 * 10**4)
    too_large = [
        _trillion_parameters(rng, devices, rng.randint(1, devices - 1)),
        _many_devices(rng, many, rng.randint(many // 2, many - 1)),
    ]
    return [*(_counted(_FORWARD_KEYS, *case) for case in cases), *too_large]


def _invalid_hidden(rng) -> list[tuple]:
    bad = [(0, 2, 5, 3, 4), (4, 0, 5, 3, 4), (4, 2, 0, 3, 4), (4, 2, 5, 0, 4), (4, 2, 5, 3, 0), (4, 2, 5, 3, 4, 0)]
    zero_or_less = rng.randint(0, 4)
    bad += [tuple(-rng.randint(0, 9) if i == zero_or_less else rng.randint(1, 9) for i in range(5))]
    return bad


def ring_bytes_counted(n_elements: int, world_size: int, bytes_per_element: int = 4) -> int:
    """Bytes all ranks send in a ring all-reduce, counted: ``world_size - 1`` steps of reduce-scatter and as many of
    all-gather, each step every rank passing on one chunk, so that every step moves the whole tensor once. Held
    equal to a ring played step by step (``gpulab.traffic.ring_bytes_sent``) and to gloo's ring by
    ``tests/test_traffic.py``."""
    return 2 * (world_size - 1) * n_elements * bytes_per_element


def _random_cut(rng, elements: int, ranks: int) -> list[int]:
    """Any cut of the tensor into ``ranks`` chunks: the total does not depend on it."""
    edges = sorted(rng.randint(0, elements) for _ in range(ranks - 1))
    return [b - a for a, b in zip([0, *edges], [*edges, elements], strict=True)]


def _ring_hidden(rng) -> list[Call]:
    """Rings small enough to play, their expected values played on a random cut of the tensor
    (``gpulab.traffic.ring_bytes_sent``); then rings of 100,000 to a million ranks, far too large to play, their
    expected values counted (``ring_bytes_counted``)."""
    triples = [(1, 2, 4), (7, 3, 4), (1000, 5, 2), (12345, 8, 4), (64, 64, 8), (99, 1, 4), (0, 3, 4)]
    triples += [(rng.randint(0, 10**7), rng.randint(1, 64), rng.choice([1, 2, 4, 8]))]
    triples += [(rng.randint(0, 50), rng.randint(1, 12), 4) for _ in range(2)]
    calls = [Call(t, expected=ring_bytes_sent(_random_cut(rng, t[0], t[1]), t[2])) for t in triples]
    calls.append(Call((10, 3), "bytes_per_element defaults to 4", expected=ring_bytes_sent([4, 3, 3], 4)))
    for _ in range(2):
        ranks = rng.randint(10**5, 10**6)
        calls.append(Call((rng.randint(0, 10**12), ranks, rng.choice([1, 2, 4, 8]))))
    return calls


def _ring_errors_hidden(rng) -> list[tuple]:
    bad = [(10, 0), (10, -3), (-1, 1), (-100, 4), (5, 0, 2)]
    return bad + [(rng.randint(0, 1000), -rng.randint(0, 50)), (-rng.randint(1, 10**6), 3)]


class LossInForward(nn.Module):
    """A model and its loss in one module: ``forward(inputs, targets)`` returns the chunk's loss, shape ``[1]``
    (lesson 03).

    The solution of lesson 03's exercise 3, as a module, for the tests and the GPU check that measure it (the
    lesson's demos use the learner's own). ``loss_fn`` must sum over the samples
    (``reduction="sum"``): under DataParallel, ``wrapped(x, y).sum() / len(x)`` is then the full-batch mean loss
    for any chunking, and only one number per device is gathered on the output device.
    """

    def __init__(self, model: nn.Module, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model(inputs), targets).reshape(1)


ANSWERS = {
    "gathered_output_bytes": for_rules(
        GATHERED_OUTPUT_BYTES_RULES,
        Answers(reference=reference_output_bytes, hidden=_float32_hidden),
        Answers(reference=reference_output_bytes, hidden=_shapes_hidden),
    ),
    "imbalance_ratio": for_rules(
        IMBALANCE_RATIO_RULES,
        Answers(reference=reference_ratio, hidden=_ratio_hidden),
        Answers(reference=reference_ratio),
        Answers(hidden=_ratio_errors_hidden),
    ),
    "LossInForward": for_rules(
        LOSS_IN_FORWARD_RULES,
        Answers(reference=one_chunk_loss, hidden=_value_hidden),
        Answers(reference=full_batch_mean_loss, hidden=_value_hidden),
        Answers(reference=moved_parameters, hidden=_submodule_hidden),
        Answers(reference=full_batch_gradients, hidden=_gradients_hidden),
        Answers(reference=chunk_losses, hidden=_device_0_hidden),
    ),
    "dp_traffic_bytes": for_rules(
        DP_TRAFFIC_BYTES_RULES,
        Answers(reference=_stages_of(_FORWARD_KEYS), hidden=_forward_hidden),
        Answers(reference=_stages_of(_BACKWARD_KEYS), hidden=_backward_hidden),
        Answers(reference=_stages_of(_BACKWARD_KEYS)),
        Answers(reference=_stages_of(_FORWARD_KEYS), hidden=lambda rng: _forward_hidden(rng, "nccl")),
        Answers(reference=_stages_of(_BACKWARD_KEYS), hidden=lambda rng: _backward_hidden(rng, "nccl")),
        Answers(reference=_stages_of(_FORWARD_KEYS), hidden=_idle_hidden),
        Answers(hidden=_invalid_hidden),
    ),
    "ring_all_reduce_bytes": for_rules(
        RING_ALL_REDUCE_BYTES_RULES,
        Answers(reference=ring_bytes_counted, hidden=_ring_hidden),
        Answers(hidden=_ring_errors_hidden),
    ),
}

SOLUTIONS = {
    "gathered_output_bytes": """def gathered_output_bytes(batch_size, sample_shape, dtype):
    elements = batch_size * math.prod(sample_shape)       # math.prod(()) == 1
    return elements * dtype.itemsize                      # bytes per element: 4 for float32, 2 for float16""",
    "imbalance_ratio": """def imbalance_ratio(peak_bytes):
    peaks = list(peak_bytes)
    if len(peaks) < 2:
        raise ValueError("need device 0 and at least one other device")
    others = sum(peaks[1:]) / len(peaks[1:])
    if others == 0:
        raise ValueError("the other devices' mean peak is 0")
    return peaks[0] / others""",
    "LossInForward": """class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model                 # a submodule: DataParallel replicates its parameters
        self.loss_fn = loss_fn             # sums over the chunk's samples (reduction="sum")

    def forward(self, inputs, targets):
        return self.loss_fn(self.model(inputs), targets).view(1)     # shape [1]: no scalar-gather warning""",
    "dp_traffic_bytes": """def dp_traffic_bytes(
    batch_size, n_devices, n_params, in_features, out_features, bytes_per_element=4, algorithm="copy"
):
    counts = (batch_size, n_devices, n_params, in_features, out_features, bytes_per_element)
    if min(counts) < 1:
        raise ValueError("every count must be at least 1")
    chunks = [len(c) for c in torch.empty(batch_size).chunk(n_devices)]   # chunk semantics
    sent = sum(chunks[1:])                      # device 0 keeps chunk 0
    replicas = len(chunks) - 1                  # devices that receive data, besides device 0
    if algorithm == "nccl":                     # NCCL's chain crosses device 0's link once
        replicas = min(replicas, 1)
    return {
        "scatter": sent * in_features * bytes_per_element,
        "broadcast": replicas * n_params * bytes_per_element,
        "gather": sent * out_features * bytes_per_element,
        "grad_scatter": sent * out_features * bytes_per_element,
        "reduce": replicas * n_params * bytes_per_element,
    }""",
    "ring_all_reduce_bytes": """def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    if world_size < 1 or n_elements < 0:
        raise ValueError("world_size must be >= 1 and n_elements >= 0")
    return 2 * (world_size - 1) * n_elements * bytes_per_element""",
}
