"""Lesson 01 (splitting the batch): the references, hidden inputs and solutions of ``chunk_sizes``,
``device_of_sample`` and ``split_batch`` (``gpulab.exercises.splitting`` declares their rules).

The expected values come from PyTorch itself (``Tensor.chunk``, the function DataParallel's scatter uses), so a
case can never disagree with what DataParallel really does.
"""

from __future__ import annotations

from typing import Any

import torch
from gpulab.exercises.splitting import CHUNK_SIZES_RULES, DEVICE_OF_SAMPLE_RULES, SPLIT_BATCH_RULES

from gpulab_solutions import Answers, for_rules


def torch_chunk_sizes(batch_size: int, n_devices: int) -> list[int]:
    """What ``Tensor.chunk`` (and so DataParallel's scatter) makes of ``batch_size`` samples on ``n_devices``."""
    return [len(piece) for piece in torch.arange(batch_size).chunk(n_devices)]


def _sizes_hidden(rng) -> list[tuple]:
    pairs = [(b, n) for b in [1, 2, 3, 5, 7, 10, 11, 13, 16, 17, 31, 64, 97, 100] for n in [1, 2, 3, 4, 5, 7, 8]]
    pairs = [(b, n) for b, n in pairs if b >= n]
    for _ in range(20):
        n = rng.randint(1, 16)
        pairs.append((rng.randint(n, 600), n))
    return pairs


def _tiny_hidden(rng) -> list[tuple]:
    pairs = [(b, n) for b in [1, 2, 3, 5, 6] for n in [4, 6, 7, 8, 16]]
    for _ in range(10):
        n = rng.randint(2, 64)
        pairs.append((rng.randint(1, n - 1), n))
    return pairs


def _invalid_hidden(rng) -> list[tuple]:
    bad = [(0, 1), (-3, 2), (5, -1), (0, 0)]
    return bad + [(-rng.randint(1, 1000), rng.randint(1, 8)), (rng.randint(1, 50), 0)]


def torch_device_of_sample(index: int, batch_size: int, n_devices: int) -> int:
    """The device whose chunk contains sample ``index``, by ``Tensor.chunk``."""
    for device, piece in enumerate(torch.arange(batch_size).chunk(n_devices)):
        if index in piece.tolist():
            return device
    raise IndexError(index)


def _device_hidden(rng) -> list[tuple]:
    sizes = [(b, n) for b in [1, 2, 5, 7, 10, 13, 64, 99] for n in [1, 2, 3, 4, 8]]
    sizes += [(rng.randint(1, 300), rng.randint(1, 12)) for _ in range(4)]
    return [(i, b, n) for b, n in sizes for i in range(b)]


def _out_of_range_hidden(rng) -> list[tuple]:
    bad = [(10, 10, 3), (11, 10, 3), (-5, 10, 3), (1, 1, 4), (-1, 1, 1)]
    for _ in range(4):
        b = rng.randint(1, 200)
        bad += [(b + rng.randint(0, 50), b, rng.randint(1, 8))]
        bad += [(-rng.randint(1, 50), b, rng.randint(1, 8))]
    return bad


def reference_split(batch: Any, n_devices: int) -> list:
    """How ``torch.nn.parallel.scatter`` splits ``batch`` over ``n_devices``, without moving data."""
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(n_devices))
    if isinstance(batch, tuple) and batch:
        return [tuple(parts) for parts in zip(*(reference_split(item, n_devices) for item in batch), strict=False)]
    if isinstance(batch, list) and batch:
        return [list(parts) for parts in zip(*(reference_split(item, n_devices) for item in batch), strict=False)]
    if isinstance(batch, dict) and batch:
        keys = list(batch)
        columns = [reference_split(batch[key], n_devices) for key in keys]
        return [dict(zip(keys, parts, strict=True)) for parts in zip(*columns, strict=False)]
    return [batch for _ in range(n_devices)]


def _tensors_hidden(rng) -> list[tuple]:
    generator = torch.Generator().manual_seed(1)
    sizes = [(1, 1), (7, 2), (12, 3), (13, 4), (3, 8), (2, 4), (64, 2)]
    sizes += [(rng.randint(1, 100), rng.randint(1, 9)) for _ in range(4)]
    return [(torch.randint(0, 1000, (b, 3), generator=generator), n) for b, n in sizes]


def _random_nested(rng, b: int, depth: int = 0):
    """A random batch of ``b`` samples: tensors in tuples, lists and dicts, nested."""
    kind = rng.choice(["tensor", "tuple", "list", "dict"] if depth < 2 else ["tensor"])
    if kind == "tensor":
        return torch.randint(0, 100, (b, rng.randint(1, 3)))
    items = [_random_nested(rng, b, depth + 1) for _ in range(rng.randint(1, 3))]
    if kind == "dict":
        return {f"k{rng.randint(0, 99)}_{i}": item for i, item in enumerate(items)}
    return tuple(items) if kind == "tuple" else items


def _containers_hidden(rng) -> list[tuple]:
    x, y = torch.arange(20).reshape(10, 2), torch.arange(10)
    a, b = torch.arange(30).reshape(10, 3), torch.arange(10) * 7
    cases = [
        ((a, b), 3),
        ([a, b], 4),
        ({"z": a, "a": b}, 3),
        ((a, [b, {"k": a}]), 2),
        ({"pair": (a, b), "list": [b]}, 4),
        ((a[:3].clone(), b[:3].clone()), 5),
        ((x, y), 3),
    ]
    return cases + [(_random_nested(rng, rng.randint(1, 12)), rng.randint(1, 6)) for _ in range(4)]


def _others_hidden(rng) -> list[tuple]:
    return [("mean", 3), (None, 2), (3.5, 4), ("sum", rng.randint(2, 9)), ((torch.arange(3), "sum", 2), 8)]


ANSWERS = {
    "chunk_sizes": for_rules(
        CHUNK_SIZES_RULES,
        Answers(reference=torch_chunk_sizes, hidden=_sizes_hidden),
        Answers(reference=torch_chunk_sizes, hidden=_tiny_hidden),
        Answers(hidden=_invalid_hidden),
    ),
    "device_of_sample": for_rules(
        DEVICE_OF_SAMPLE_RULES,
        Answers(reference=torch_device_of_sample, hidden=_device_hidden),
        Answers(hidden=_out_of_range_hidden),
    ),
    "split_batch": for_rules(
        SPLIT_BATCH_RULES,
        Answers(reference=reference_split, hidden=_tensors_hidden),
        Answers(reference=reference_split, hidden=_tensors_hidden),
        Answers(reference=reference_split, hidden=_containers_hidden),
        Answers(reference=reference_split, hidden=_others_hidden),
        Answers(
            reference=reference_split,
            hidden=lambda rng: [(torch.arange(1), 4), (torch.arange(3).reshape(3, 1), rng.randint(4, 9))],
        ),
    ),
}

SOLUTIONS = {
    "chunk_sizes": """def chunk_sizes(batch_size, n_devices):
    if batch_size < 1 or n_devices < 1:
        raise ValueError("batch_size and n_devices must be >= 1")
    per_chunk = -(-batch_size // n_devices)          # ceil division
    sizes = []
    remaining = batch_size
    while remaining > 0:
        sizes.append(min(per_chunk, remaining))
        remaining -= per_chunk
    return sizes""",
    "device_of_sample": """def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError(f"sample {index} is not in a batch of {batch_size}")
    per_chunk = -(-batch_size // n_devices)
    return index // per_chunk""",
    "split_batch": """def split_batch(batch, n_devices):
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(n_devices))
    if isinstance(batch, (tuple, list)) and batch:
        pieces = zip(*(split_batch(item, n_devices) for item in batch))
        return [type(batch)(piece) for piece in pieces]
    if isinstance(batch, dict) and batch:
        pieces = zip(*(split_batch(value, n_devices) for value in batch.values()))
        return [dict(zip(batch.keys(), piece)) for piece in pieces]
    return [batch for _ in range(n_devices)]""",
}
