"""Pictures of data parallelism, drawn with matplotlib from real runs (lesson 01).

``data_parallel_overview`` draws the idea (a batch cut into chunks, one replica per device, outputs gathered,
gradients combined); ``sample_grid`` draws which sample each device really received in a DataParallel run.
Both accept ``display=False`` (headless use, tests) and return the figure.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from gpulab.messages import message
from gpulab.plots import finish, new_figure

DEVICE_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def colour_of(device: int) -> str:
    """The colour the course uses for device ``device`` in every picture."""
    return DEVICE_COLOURS[device % len(DEVICE_COLOURS)]


def data_parallel_overview(chunk_sizes: Sequence[int], display: bool = True) -> Figure:
    """Batch → chunks → one replica per device → outputs gathered on device 0 (lesson 01's picture).

    ``chunk_sizes`` are the sizes a real scatter produced (e.g. ``[len(c) for c in batch.chunk(n)]``).
    """
    batch_size = sum(chunk_sizes)
    figure = new_figure(9, 1.2 + 0.9 * len(chunk_sizes))
    axes = figure.subplots()
    rows = len(chunk_sizes)
    axes.set_xlim(0, 10)
    axes.set_ylim(-0.5, rows + 0.2)
    axes.axis("off")
    start = 0
    for device, size in enumerate(chunk_sizes):
        y = rows - 1 - device
        colour = colour_of(device)
        axes.add_patch(Rectangle((0.2, y), 1.8, 0.7, color=colour, alpha=0.35))
        axes.text(
            1.1,
            y + 0.35,
            message("diagrams.samples", first=start, last=start + size - 1),
            ha="center",
            va="center",
            fontsize=9,
        )
        axes.add_patch(Rectangle((3.6, y), 2.2, 0.7, color=colour, alpha=0.8))
        axes.text(
            4.7,
            y + 0.35,
            message("diagrams.replica", device=device),
            ha="center",
            va="center",
            color="white",
            fontsize=9,
        )
        axes.add_patch(FancyArrowPatch((2.05, y + 0.35), (3.55, y + 0.35), arrowstyle="->", mutation_scale=12))
        axes.add_patch(
            FancyArrowPatch((5.85, y + 0.35), (7.4, rows / 2 - 0.15), arrowstyle="->", mutation_scale=12, color="grey")
        )
        start += size
    axes.add_patch(Rectangle((7.45, rows / 2 - 0.5), 2.3, 0.7, color=colour_of(0), alpha=0.35))
    axes.text(8.6, rows / 2 - 0.15, message("diagrams.outputs", count=batch_size), ha="center", va="center", fontsize=9)
    axes.set_title(message("diagrams.pipeline"), fontsize=10, wrap=True)
    return finish(figure, display)


def sample_grid(samples_per_device: Sequence[Sequence[int]], batch_size: int, display: bool = True) -> Figure:
    """A grid of sample index × device, coloured where that device received that sample (lesson 01).

    ``samples_per_device[d]`` lists the sample indices device ``d`` received in a real run; devices that got
    nothing show an empty row.
    """
    devices = len(samples_per_device)
    figure = new_figure(min(12, max(5.5, 2 + batch_size * 0.18)), 0.8 + 0.45 * devices)
    axes = figure.subplots()
    for device, samples in enumerate(samples_per_device):
        for sample in samples:
            axes.add_patch(Rectangle((sample, device), 1, 1, color=colour_of(device)))
    axes.set_xlim(0, batch_size)
    axes.set_ylim(devices, 0)
    axes.set_yticks([d + 0.5 for d in range(devices)], [message("plots.device", device=d) for d in range(devices)])
    axes.set_xlabel(message("diagrams.sample_index"))
    axes.set_title(message("diagrams.which_device", batch_size=batch_size), fontsize=10, wrap=True)
    axes.grid(False)
    return finish(figure, display)
