"""The references, hidden inputs and solutions of ``gpulab.exercises.gpu0_imbalance``'s exercises."""

from __future__ import annotations

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
from gpulab.traffic import ring_bytes_sent
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


def measured_traffic(batch_size: int, n_devices: int, in_features: int, hidden: int, out_features: int) -> dict:
    """``(n_params, bytes by stage)`` of one DataParallel step of ``traffic_model``, measured by gpulab.traffic."""
    from gpulab import traffic

    model = traffic_model(in_features, hidden, out_features)
    generator = torch.Generator().manual_seed(batch_size)
    inputs = torch.randn(batch_size, in_features, generator=generator)
    targets = torch.randn(batch_size, out_features, generator=generator)
    trace = traffic.data_parallel_step(model, inputs, targets, nn.functional.mse_loss, n_devices)
    return sum(p.numel() for p in model.parameters()), trace.by_stage(0)


def reference_traffic(
    batch_size: int, n_devices: int, n_params: int, in_features: int, out_features: int, bytes_per_element: int = 4
) -> dict:
    """The bytes by stage of one DataParallel step, measured by ``gpulab.traffic`` on the ``traffic_model`` with
    ``n_params`` parameter elements (its hidden size follows from them), scaled from float32's 4 bytes per element
    to ``bytes_per_element``."""
    hidden, rest = divmod(n_params - out_features, in_features + out_features + 1)
    if rest or hidden < 1:
        raise ValueError(f"no traffic_model({in_features}, ?, {out_features}) has {n_params} parameters")
    _, stages = measured_traffic(batch_size, n_devices, in_features, hidden, out_features)
    return {key: int(stages[key]) // 4 * bytes_per_element for key in STAGES}


def _stages_of(keys: tuple) -> Callable[..., dict]:
    def reference(*args, **kwargs) -> dict:
        stages = reference_traffic(*args, **kwargs)
        return {key: stages[key] for key in keys}

    return reference


def _random_sizes(rng, devices: int) -> tuple:
    """A step on which every device gets samples. ``Tensor.chunk`` makes chunks of ``ceil(batch / n)`` samples, so
    it leaves devices idle when the batch is smaller than the device count and also when it is not (5 samples on 4
    devices: chunks of 2, 2 and 1). Idle devices are their own cell's concern: a draw for the forward and backward
    cells must not grade that mistake a second time."""
    while True:
        batch, n = rng.randint(1, 70), rng.randint(1, devices)
        if math.ceil(batch / math.ceil(batch / n)) == n:
            return (batch, n, (rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 12)))


def _forward_hidden(rng) -> list[Call]:
    cases = [(16, 2, (5, 7, 3)), (9, 2, (2, 3, 11)), (10, 3, (4, 4, 6)), (13, 4, (3, 8, 2)), (64, 4, (6, 2, 9))]
    cases += [_random_sizes(rng, 5) for _ in range(2)]
    return [_traffic_call(*case) for case in cases]


def _backward_hidden(rng) -> list[Call]:
    cases = [(16, 2, (5, 7, 3)), (11, 3, (2, 3, 11)), (10, 4, (4, 4, 6)), (32, 4, (3, 8, 2))]
    cases += [_random_sizes(rng, 5) for _ in range(2)]
    return [_traffic_call(*case) for case in cases]


def _idle_hidden(rng) -> list[Call]:
    cases = [(1, 2, (3, 4, 5)), (3, 4, (2, 5, 3)), (5, 4, (4, 3, 2)), (2, 3, (6, 2, 7)), (4, 1, (3, 3, 3))]
    n = rng.randint(3, 8)
    cases += [(rng.randint(1, n - 1), n, (2, 3, 4))]
    return [_traffic_call(*case) for case in cases]


def _invalid_hidden(rng) -> list[tuple]:
    bad = [(0, 2, 5, 3, 4), (4, 0, 5, 3, 4), (4, 2, 0, 3, 4), (4, 2, 5, 0, 4), (4, 2, 5, 3, 0), (4, 2, 5, 3, 4, 0)]
    zero_or_less = rng.randint(0, 4)
    bad += [tuple(-rng.randint(0, 9) if i == zero_or_less else rng.randint(1, 9) for i in range(5))]
    return bad


def ring_bytes_by_simulation(n_elements: int, world_size: int, bytes_per_element: int = 4) -> int:
    """Bytes all ranks send in a ring all-reduce, counted by playing it: cut into ``world_size`` chunks, then
    ``world_size - 1`` steps of reduce-scatter and as many of all-gather, each rank passing one chunk on."""
    chunks = [len(range(n_elements)[rank::world_size]) for rank in range(world_size)]
    sent = 0
    for _phase in ("reduce-scatter", "all-gather"):
        for step in range(world_size - 1):
            for rank in range(world_size):
                sent += chunks[(rank - step) % world_size]
    return sent * bytes_per_element


def _random_cut(rng, elements: int, ranks: int) -> list[int]:
    """Any cut of the tensor into ``ranks`` chunks: the total does not depend on it."""
    edges = sorted(rng.randint(0, elements) for _ in range(ranks - 1))
    return [b - a for a, b in zip([0, *edges], [*edges, elements], strict=True)]


def _ring_hidden(rng) -> list[Call]:
    triples = [(1, 2, 4), (7, 3, 4), (1000, 5, 2), (12345, 8, 4), (64, 64, 8), (99, 1, 4), (0, 3, 4)]
    triples += [(rng.randint(0, 10**7), rng.randint(1, 64), rng.choice([1, 2, 4, 8]))]
    triples += [(rng.randint(0, 50), rng.randint(1, 12), 4) for _ in range(2)]
    calls = [Call(t, expected=ring_bytes_sent(_random_cut(rng, t[0], t[1]), t[2])) for t in triples]
    return [*calls, Call((10, 3), "bytes_per_element defaults to 4", expected=ring_bytes_sent([4, 3, 3], 4))]


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
        Answers(reference=_stages_of(_FORWARD_KEYS), hidden=_idle_hidden),
        Answers(hidden=_invalid_hidden),
    ),
    "ring_all_reduce_bytes": for_rules(
        RING_ALL_REDUCE_BYTES_RULES,
        Answers(reference=ring_bytes_by_simulation, hidden=_ring_hidden),
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
    batch_size, n_devices, n_params, in_features, out_features, bytes_per_element=4
):
    counts = (batch_size, n_devices, n_params, in_features, out_features, bytes_per_element)
    if min(counts) < 1:
        raise ValueError("every count must be at least 1")
    chunks = [len(c) for c in torch.empty(batch_size).chunk(n_devices)]   # chunk semantics
    sent = sum(chunks[1:])                      # device 0 keeps chunk 0
    replicas = len(chunks) - 1                  # devices that receive data, besides device 0
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
