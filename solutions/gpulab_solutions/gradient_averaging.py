"""The references, hidden inputs and solutions of ``gpulab.exercises.gradient_averaging``'s exercises."""

from __future__ import annotations

import copy
from typing import Any

import torch
from gpulab.check import Call, plain_state
from gpulab.exercises.gradient_averaging import (
    AVERAGE_GRADIENTS_RULES,
    DATA_PARALLEL_GRADS_RULES,
    FULL_BATCH_LABEL,
    TRAIN_WITH_DATA_PARALLEL_RULES,
    Chain,
    _Chunked,
    _mixer_call,
    _seeded,
    _ShownDict,
    _SmallMLP,
    _training_call,
    _with_stale_gradients,
    full_batch_gradients,
)
from torch import nn

from gpulab_solutions import Answers, for_rules


def _chunk_mean_gradients(model: nn.Module, inputs, targets, loss_fn, n_devices: int):
    """Each chunk's gradients of its own mean loss (what each replica computes), and the chunk sizes."""
    reference = copy.deepcopy(model)
    parameters = list(reference.parameters())
    per_device, sizes = [], []
    for chunk_inputs, chunk_targets in zip(inputs.chunk(n_devices), targets.chunk(n_devices), strict=True):
        gradients = torch.autograd.grad(loss_fn(reference(chunk_inputs), chunk_targets), parameters)
        per_device.append([gradient.detach() for gradient in gradients])
        sizes.append(len(chunk_inputs))
    return per_device, sizes


def _weighted(per_device, weights) -> list[torch.Tensor]:
    return [sum(w * g for w, g in zip(weights, column, strict=True)) for column in zip(*per_device, strict=True)]


def weighted_mean(grads_per_device: list, chunk_sizes: list) -> list[torch.Tensor]:
    """Exact weights (fractions of the batch) applied in float64: the expected average of plain numbers."""
    total = sum(chunk_sizes)
    return [
        sum(torch.as_tensor(g, dtype=torch.float64) * n / total for n, g in zip(chunk_sizes, column, strict=True))
        for column in zip(*grads_per_device, strict=True)
    ]


def _chunk_gradients(b: int, n: int, generator: torch.Generator) -> Call:
    """The grader's real-model case: each chunk's mean-loss gradients and the sizes; the full-batch gradient."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(b * 31 + n)
        net = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))
    params = list(net.parameters())
    x = torch.randn(b, 5, generator=generator)
    y = torch.randint(0, 3, (b,), generator=generator)
    per_device = [
        [g.detach() for g in torch.autograd.grad(nn.functional.cross_entropy(net(xc), yc), params)]
        for xc, yc in zip(x.chunk(n), y.chunk(n), strict=True)
    ]
    full = [g.detach() for g in torch.autograd.grad(nn.functional.cross_entropy(net(x), y), params)]
    return Call((per_device, [len(xc) for xc in x.chunk(n)]), f"{b} samples on {n} devices", expected=full)


def _weighted_values(sizes: list[int]) -> Call:
    """The grader's plain-numbers case: device k's gradients hold 10k+1.. and -k."""
    values = [[[float(10 * k + j + 1) for j in range(3)], [float(-k)]] for k in range(len(sizes))]
    return Call(([[torch.tensor(v) for v in device] for device in values], sizes), f"chunk sizes {sizes}")


def _average_hidden(rng) -> list[Call]:
    generator = torch.Generator().manual_seed(7)
    pairs = [(12, 2), (10, 3), (7, 2), (5, 4), (13, 4), (17, 5), (100, 7), (9, 1)]
    pairs += [(rng.randint(1, 60), rng.randint(1, 8)) for _ in range(2)]
    calls = [_chunk_gradients(b, n, generator) for b, n in pairs]
    chunkings = [[3, 1], [1, 7, 2], [5], [2, 2, 2, 2], [6, 1, 1]]
    chunkings += [[rng.randint(1, 9) for _ in range(rng.randint(1, 5))]]
    return calls + [_weighted_values(sizes) for sizes in chunkings]


def _given(k: int = 3) -> list:
    return [[torch.full((2, 2), float(j + 1)), torch.full((3,), -float(j))] for j in range(k)]


def _kept_hidden(rng) -> list[tuple]:
    kept = [(_given(), [4, 4, 2]), (_given(1), [5])]
    k = rng.randint(1, 3)
    return [*kept, (_given(k), [rng.randint(1, 9) for _ in range(k)])]


def _mismatched_hidden(rng) -> list[tuple]:
    bad = [(_given(), [4, 4]), (_given(1), [3, 3]), (_given(), [1, 2, 3, 4]), (_given(2), [])]
    k = rng.randint(1, 3)
    return [*bad, (_given(k), [rng.randint(1, 9) for _ in range(k + rng.randint(1, 3))])]


def _relu_mlp(seed: int) -> nn.Module:
    return _seeded(seed, lambda: _SmallMLP(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)))


def _encoder(seed: int) -> nn.Module:
    """A Linear and GELU ``encoder``, then a bias-free ``head``: parameter names of another shape."""

    def build() -> nn.Module:
        return Chain(
            "encoder-head model", encoder=nn.Sequential(nn.Linear(5, 7), nn.GELU()), head=nn.Linear(7, 3, False)
        )

    return _seeded(seed, build)


def _full_batch_hidden(rng) -> list[Call]:
    generator = torch.Generator().manual_seed(3)
    drawn = [(12, 2, "ce"), (10, 3, "ce"), (7, 2, "mse"), (13, 4, "ce"), (16, 3, "module"), (9, 1, "mse")]
    drawn += [(25, 4, "encoder"), (rng.randint(1, 40), rng.randint(1, 6), rng.choice(["ce", "mse"]))]
    calls = []
    for batch_size, n_devices, kind in drawn:
        seed = batch_size + 100 * n_devices
        inputs = torch.randn(batch_size, 5, generator=generator)
        if kind == "mse":
            model = _seeded(seed, lambda: _SmallMLP(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2)))
            loss_fn, targets = nn.functional.mse_loss, torch.randn(batch_size, 2, generator=generator)
        else:
            model = _encoder(seed) if kind == "encoder" else _relu_mlp(seed)
            loss_fn = nn.CrossEntropyLoss() if kind == "module" else nn.functional.cross_entropy
            targets = torch.randint(0, 3, (batch_size,), generator=generator)
        calls.append(Call((model, inputs, targets, loss_fn, n_devices), f"{batch_size} samples on {n_devices} devices"))
    return calls


def _splits_hidden(rng) -> list[Call]:
    pairs = [(10, 3), (10, 4), (2, 4), (1, 3), (3, 8), (5, 4), (6, 6), (4, 1)]
    n = rng.randint(1, 6)
    pairs += [(n * rng.randint(1, 5), n), (rng.randint(1, 30), rng.randint(1, 8))]
    return [_mixer_call(b * 7 + n, b, n, f"{b} samples on {n} devices", small=True) for b, n in pairs]


def chunked_gradients(model: nn.Module, inputs, targets, loss_fn, n_devices: int) -> _Chunked:
    """Reference of the split rule: each ``Tensor.chunk`` of the batch forwarded on its own replica."""
    per_device, sizes = _chunk_mean_gradients(model, inputs, targets, loss_fn, n_devices)
    names = [name for name, _ in model.named_parameters()]
    weighted = _weighted(per_device, [size / sum(sizes) for size in sizes])
    averaged = _weighted(per_device, [1 / len(sizes)] * len(sizes))
    return _Chunked(dict(zip(names, weighted, strict=True)), dict(zip(names, averaged, strict=True)), sizes)


def _full_batch(model: nn.Module, inputs, targets, loss_fn, n_devices: int) -> dict:
    """Reference of the full-batch rule (``n_devices`` changes nothing in it)."""
    expected = full_batch_gradients(model, inputs, targets, loss_fn)
    return _ShownDict(expected, FULL_BATCH_LABEL, names=sorted(expected))


def _unchanged_hidden(rng) -> list[Call]:
    drawn = [(8, 2, True), (9, 3, True), (12, 4, False), (6, 2, False), (3, 5, True)]
    n = rng.randint(1, 5)
    drawn += [(n * rng.randint(1, 6), n, rng.random() < 0.5)]
    return [_with_stale_gradients(b * 13 + n, b, n, f"{b} samples on {n} devices", left) for b, n, left in drawn]


def sgd_loop(model: nn.Module, batches, loss_fn, lr: float, chunks: int = 1) -> list[float]:
    """The plain SGD loop, training ``model`` itself: each step's loss. With ``chunks`` > 1, each batch's forward is
    DataParallel's done by hand: its ``Tensor.chunk`` pieces forwarded one by one, the outputs concatenated. The
    grader runs it on ``nn.DataParallel`` itself where it has two GPUs (``autograder/checks/gradient_averaging.py``)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for inputs, targets in batches:
        optimizer.zero_grad()
        outputs = torch.cat([model(piece) for piece in inputs.chunk(chunks)]) if chunks > 1 else model(inputs)
        loss = loss_fn(outputs, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _trained_copy(model: nn.Module, batches, loss_fn, lr: float, chunks: int = 1) -> tuple[list[float], nn.Module]:
    """``sgd_loop`` on a copy of ``model``: each step's loss, and the trained copy."""
    reference = copy.deepcopy(model)
    return sgd_loop(reference, batches, loss_fn, lr, chunks), reference


def one_device_training(model: nn.Module, batches, loss_fn, lr: float):
    """The plain one-device SGD loop on a copy of ``model``: ``(losses, {name: trained weight})``."""
    losses, trained = _trained_copy(model, batches, loss_fn, lr)
    return losses, {name: parameter.detach().clone() for name, parameter in trained.named_parameters()}


def one_device_losses(model: nn.Module, batches, loss_fn, lr: float, device_ids) -> list[float]:
    """Reference of the losses rule: each step's loss of the one-device loop."""
    return _trained_copy(model, batches, loss_fn, lr)[0]


def trained_arguments(model: nn.Module, batches, loss_fn, lr: float, device_ids) -> list:
    """What the weights rule asks the call to leave: ``model`` trained by the one-device loop (``plain_state``)."""
    return plain_state([_trained_copy(model, batches, loss_fn, lr)[1], batches, loss_fn, lr, device_ids])


def chunked_losses(model: nn.Module, batches, loss_fn, lr: float, device_ids) -> list[float]:
    """Reference of the DataParallel rule: each step's loss with each batch chunked over ``device_ids``."""
    return _trained_copy(model, batches, loss_fn, lr, chunks=len(device_ids))[0]


def _not_judged(*args: Any) -> None:
    """The weights rule judges the model afterwards, not the value returned (the losses rule's concern)."""


def _drawn_training(rng, **options) -> Call:
    samples, batch_size = rng.randint(2, 30), rng.randint(1, 9)
    return _training_call(rng.randrange(2**31), samples, batch_size, 0.5, rng.choice([1, 2]), **options)


def _losses_hidden(rng) -> list[Call]:
    return [
        _training_call(1, 40, 8, 0.5, 2),
        _training_call(2, 31, 7, 0.8, 2, loss_fn=nn.CrossEntropyLoss()),
        _training_call(3, 25, 12, 0.3, 1),
        _training_call(4, 9, 3, 1.0, 2, loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1)),
        _drawn_training(rng),
    ]


def _weights_hidden(rng) -> list[Call]:
    return [
        _training_call(6, 30, 8, 0.5, 2),
        _training_call(7, 21, 5, 0.9, 2),
        _training_call(8, 16, 16, 0.4, 1),
        _drawn_training(rng),
    ]


def _through_hidden(rng) -> list[Call]:
    chosen = [(31, 20, 8, 2), (32, 9, 9, 2), (33, 7, 3, 2), (34, 12, 5, 1)]
    return [
        *(_training_call(seed, n, size, 0.1, ids, mixer=True) for seed, n, size, ids in chosen),
        _drawn_training(rng, mixer=True),
    ]


ANSWERS = {
    "average_gradients": for_rules(
        AVERAGE_GRADIENTS_RULES,
        Answers(reference=weighted_mean, hidden=_average_hidden),
        Answers(reference=weighted_mean, hidden=_kept_hidden),
        Answers(hidden=_mismatched_hidden),
    ),
    "data_parallel_grads": for_rules(
        DATA_PARALLEL_GRADS_RULES,
        Answers(reference=_full_batch, hidden=_full_batch_hidden),
        Answers(reference=chunked_gradients, hidden=_splits_hidden),
        Answers(reference=_full_batch, hidden=_unchanged_hidden),
    ),
    "train_with_data_parallel": for_rules(
        TRAIN_WITH_DATA_PARALLEL_RULES,
        Answers(reference=one_device_losses, hidden=_losses_hidden),
        Answers(reference=_not_judged, hidden=_weights_hidden, leaves=trained_arguments),
        Answers(reference=chunked_losses, hidden=_through_hidden),
    ),
}

SOLUTIONS = {
    "average_gradients": """def average_gradients(grads_per_device, chunk_sizes):
    if len(grads_per_device) != len(chunk_sizes):
        raise ValueError("one chunk size per device, please")
    batch_size = sum(chunk_sizes)
    averaged = []
    for gradients in zip(*grads_per_device):          # the same parameter on every device
        averaged.append(sum(n / batch_size * g for n, g in zip(chunk_sizes, gradients)))
    return averaged""",
    "data_parallel_grads": """def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    names = [name for name, _ in model.named_parameters()]
    grads_per_device, chunk_sizes = [], []
    for chunk_inputs, chunk_targets in zip(inputs.chunk(n_devices), targets.chunk(n_devices)):
        replica = copy.deepcopy(model)                  # a fresh replica per chunk; the model stays untouched
        loss_fn(replica(chunk_inputs), chunk_targets).backward()
        grads_per_device.append([p.grad for p in replica.parameters()])
        chunk_sizes.append(len(chunk_inputs))
    return dict(zip(names, average_gradients(grads_per_device, chunk_sizes)))""",
    "train_with_data_parallel": """def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
    parallel = gpulab.DataParallel(model, device_ids=device_ids)
    optimizer = torch.optim.SGD(parallel.parameters(), lr=lr)
    device = next(model.parameters()).device
    losses = []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = loss_fn(parallel(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses""",
}
