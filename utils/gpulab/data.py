"""Data the lessons train on, generated locally and seeded (no downloads at run time).

Used by lessons 01-04: a classification problem made of Gaussian clusters, cut into batches.
"""

from __future__ import annotations

import torch


def classification(
    samples: int = 256, features: int = 16, classes: int = 4, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)``: ``samples`` points around ``classes`` random centres in ``features`` dimensions.

    Deterministic for a given ``seed``; learnable by ``gpulab.models.MLP`` within a few dozen steps.
    """
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=generator) * 2.0
    labels = torch.randint(0, classes, (samples,), generator=generator)
    inputs = centres[labels] + torch.randn(samples, features, generator=generator)
    return inputs, labels


def batches(inputs: torch.Tensor, labels: torch.Tensor, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive ``(x, y)`` batches of ``batch_size`` (the last one may be shorter), in order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [
        (inputs[start : start + batch_size], labels[start : start + batch_size])
        for start in range(0, len(inputs), batch_size)
    ]
