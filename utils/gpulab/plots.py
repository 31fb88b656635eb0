"""Pictures drawn from real runs: per-device memory (live and after the fact), step times, scaling.

Lesson 03 (GPU-0 imbalance) is the main user: ``LivePlot`` shows each device's memory while training runs
(``gpulab.memory.track(live=True)`` drives it), ``plot_trace`` and ``plot_peaks`` show a finished trace, and
``plot_step_times`` / ``plot_scaling`` show what ``gpulab.bench`` measured.

Every function takes ``display=``: ``True`` shows the picture in the notebook (one output per picture), ``False``
draws it without showing anything (scripts, tests, CI). Every function returns its matplotlib ``Figure`` so it
can be saved or inspected. The figures are made without ``pyplot``: nothing is registered in pyplot's global
list of figures, so nothing leaks and nothing is shown twice, whatever the backend (``MPLBACKEND=Agg`` included).
A returned figure left as the last expression of a cell is not shown a second time.
"""

from __future__ import annotations

import base64
import io
import os
import threading
import time
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gpulab.messages import message, text, use_font

__all__ = ["CourseFigure", "LivePlot", "figure_png", "plot_peaks", "plot_scaling", "plot_step_times", "plot_trace"]

MIB = 1024 * 1024
# The width at which JupyterLab shows an output picture (a wider one is scaled down to it): its output area in a
# 1400-px-wide window with the file browser open (the browser test's window; the code cell there is 967 px wide).
NOTEBOOK_WIDTH_PX = 960
PANELS_PER_ROW = 3
# The smallest text a figure draws (keys, legends, bar values, mark numbers): at least 8 pt as the notebook shows
# it, at 90 or 100 dots per inch and no wider than the notebook (tests/test_plots.py measures every figure).
SMALLEST_FONT_SIZE = 9
# Set to 1 where no one watches a notebook run (the grader's kernels): a live plot draws its last frame only.
UNWATCHED_VARIABLE = "GPULAB_UNWATCHED"
_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def _colour(index: int) -> str:
    return _COLOURS[index % len(_COLOURS)]


# --------------------------------------------------------------------------------------------------------------
# Figures and display
# --------------------------------------------------------------------------------------------------------------


def _ipython():
    """The running IPython shell, or ``None`` (plain Python, pytest)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _in_kernel() -> bool:
    """True in a Jupyter kernel (where widgets and images can be shown), False in scripts and terminals."""
    shell = _ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class CourseFigure(Figure):
    """A matplotlib ``Figure`` that knows whether it has already been shown in the current cell (lesson 03).

    ``plot_*(..., display=True)`` shows the figure and returns it; if the call is also the cell's last
    expression, IPython would show it a second time. ``_ipython_display_`` skips that second copy (same cell
    only: displaying the figure in a later cell shows it again).
    """

    _gpulab_shown_in: int | None = None

    def _ipython_display_(self) -> None:
        shell = _ipython()
        if shell is not None and self._gpulab_shown_in == shell.execution_count:
            return
        _show_png(self)


def new_figure(width: float, height: float, dpi: int = 100) -> CourseFigure:
    """A figure drawn without pyplot that is shown once per cell (lesson 01's diagrams use it too)."""
    use_font()  # the Japanese edition's font, before any text is laid out
    figure = CourseFigure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def figure_png(figure: Figure) -> bytes:
    """The figure rendered as PNG bytes: what every lesson-03 picture here sends to the notebook."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _show_png(figure: Figure) -> None:
    if not _in_kernel():
        return
    shell = _ipython()
    from IPython.display import Image
    from IPython.display import display as ipython_display

    ipython_display(Image(data=figure_png(figure), format="png"))
    if isinstance(figure, CourseFigure):
        figure._gpulab_shown_in = shell.execution_count


def finish(figure: CourseFigure, display: bool) -> CourseFigure:
    """Show ``figure`` in the notebook when ``display`` is true, and return it (lesson 01's diagrams too)."""
    if display:
        _show_png(figure)
    return figure


# --------------------------------------------------------------------------------------------------------------
# Memory traces
# --------------------------------------------------------------------------------------------------------------


def _trace_data(trace: Any) -> dict[str, Any]:
    """A ``gpulab.memory.Trace`` or its ``to_dict()`` as a dict of plain lists."""
    if isinstance(trace, Mapping):
        data = dict(trace)
    else:
        data = trace.snapshot()
        data["peaks"] = trace.peaks()
        data["notice"] = trace.notice
        data["virtual"] = trace.virtual
    marks = data.get("marks") or []
    data["marks"] = [(m["time"], m["label"]) if isinstance(m, Mapping) else tuple(m) for m in marks]
    data.setdefault("nvml_used", [[] for _ in data["devices"]])
    data.setdefault("peaks", [max(series, default=0) for series in data["peak"]])
    return data


def _device_labels(data: Mapping[str, Any]) -> list[str]:
    """What each series is called: ``data["device_labels"]`` when given (a DDP rank's trace is "rank 1", not the
    "device 0" its own process sees), else "device N"."""
    given = data.get("device_labels")
    return (
        [text(label) for label in given]
        if given
        else [message("plots.device", device=device) for device in data["devices"]]
    )


def _draw_marks(axes, marks: Sequence[tuple[float, str]], times: Sequence[float]) -> None:
    """A vertical line at each mark, numbered at the top of the axes, and a key under the axis label naming each
    number.

    Stage marks can be milliseconds apart (one DataParallel step's stages), so their names are never written at
    the lines themselves, where they would overlap or have to be rotated: the lines carry short horizontal numbers,
    moved down one row when they would touch the previous number, and the key spells the names out, horizontally.
    The key hangs from the axis label itself ("time (s)"), so that however tall the tick labels and the label are
    (Japanese glyphs are taller), the key starts below them and never overlaps them.
    """
    moments = [moment for moment, _ in marks]
    start, end = min([*times, *moments]), max([*times, *moments])
    too_close = 0.035 * ((end - start) or 1.0)
    row_ends: list[float] = []
    for number, moment in enumerate(moments, start=1):
        axes.axvline(moment, color="0.6", lw=0.8, zorder=0)
        row = next((r for r, last in enumerate(row_ends) if moment - last > too_close), len(row_ends))
        row_ends[row:row + 1] = [moment]  # fmt: skip
        axes.annotate(
            str(number), (moment, 1.0), xycoords=("data", "axes fraction"), xytext=(0, -2 - 12 * row),
            textcoords="offset points", fontsize=SMALLEST_FONT_SIZE, ha="center", va="top", color="0.25",
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "0.7", "lw": 0.5},
        )  # fmt: skip
    entries = [f"{number} {text(label)}" for number, (_, label) in enumerate(marks, start=1)]
    axes_width_in = axes.get_position().width * axes.figure.get_figwidth()
    axes.annotate(
        _fill(entries, axes_width_in * 72), (0.0, 0.0), xycoords=("axes fraction", axes.xaxis.label),
        xytext=(0, -3), textcoords="offset points", fontsize=SMALLEST_FONT_SIZE, ha="left", va="top", color="0.25",
    )  # fmt: skip


def _fill(entries: Sequence[str], width_pt: float, font_size: float = SMALLEST_FONT_SIZE) -> str:
    """``entries`` joined by wide spaces into lines of at most about ``width_pt`` points: a Japanese (wide)
    character counts as a full em, any other as about half of one."""
    lines: list[str] = []
    for entry in entries:
        line = f"{lines[-1]}   {entry}" if lines else entry
        if lines and _width_pt(line, font_size) <= width_pt:
            lines[-1] = line
        else:
            lines.append(entry)
    return "\n".join(lines)


def _width_pt(line: str, font_size: float) -> float:
    return sum(font_size if unicodedata.east_asian_width(char) in "WF" else 0.6 * font_size for char in line)


def _key_beside(axes, **options: Any) -> None:
    """The axes' legend outside it, to the right, at a readable size: it covers no bar, line or label."""
    options.setdefault("fontsize", SMALLEST_FONT_SIZE)
    options.setdefault("title_fontsize", SMALLEST_FONT_SIZE)
    axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, **options)


def _draw_memory(axes, data: Mapping[str, Any], *, marks: bool = True) -> None:
    """Per device against time: allocated (solid), the highest value between samples (shaded up to it), the
    peak so far (dashed) and the rise of NVML's used memory since the first sample (dotted, real GPUs)."""
    times = data["times"]
    highest_all = data.get("highest") or []
    for i in range(len(data["devices"])):
        colour = _colour(i)
        allocated = [value / MIB for value in data["allocated"][i]]
        axes.plot(times, allocated, color=colour, lw=2, label=_device_labels(data)[i])
        highest = highest_all[i] if i < len(highest_all) else []
        if len(highest) == len(times) and times:
            # Short spikes between two samples: shade from the sampled value up to the highest one.
            axes.fill_between(
                times, allocated, [value / MIB for value in highest], step="pre", color=colour, alpha=0.25, lw=0
            )
        peaks = data["peak"][i]
        if peaks:
            axes.plot(times, [value / MIB for value in peaks], color=colour, lw=1, ls="--", alpha=0.7)
        used = data["nvml_used"][i] if i < len(data["nvml_used"]) else []
        if used and len(used) == len(times):
            # NVML's "used" includes the CUDA context and PyTorch's cache (hundreds of MiB) that the allocated
            # axis does not: drawn as is, it would flatten the tens-of-MiB curves the lessons are about. Its rise
            # since the first sample is what the block added, on the same scale as the allocated bytes.
            axes.plot(times, [(value - used[0]) / MIB for value in used], color=colour, lw=1, ls=":", alpha=0.8)
    if marks and data["marks"]:
        _draw_marks(axes, data["marks"], times)
    axes.set_xlabel(message("plots.time_s"))
    axes.set_ylabel(message("plots.mib"))
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    if data["devices"]:
        nvml = message("plots.memory_key_nvml") if any(data["nvml_used"]) else ""
        _key_beside(axes, title=message("plots.memory_key") + nvml, alignment="left")


def plot_trace(
    trace: Any, display: bool = True, title: str | None = None, device_labels: Sequence[str] | None = None
) -> CourseFigure:
    """Memory per device over time, and each device's peak, from a finished ``gpulab.memory`` trace (lesson 03).

    ``trace`` is a ``Trace`` or its ``to_dict()``. Left: allocated MiB per device (solid), shaded up to the
    highest value between two samples, the peak so far (dashed), the rise of NVML's used memory since the first
    sample on real GPUs (dotted), and
    marks as numbered vertical lines named in a key under the plot. Right: the peak of each device.
    ``device_labels`` names the series (``["rank 1"]`` for a DDP rank's trace); by default "device N".
    """
    data = _trace_data(trace)
    if device_labels is not None:
        data["device_labels"] = list(device_labels)
    figure = new_figure(NOTEBOOK_WIDTH_PX / 100, 3.6)
    timeline, bars = figure.subplots(1, 2, width_ratios=[3, 1])
    _draw_memory(timeline, data)
    kind = message("plots.virtual_devices" if data.get("virtual") else "plots.gpus")
    timeline.set_title(text(title) or message("plots.memory_per_device", kind=kind), wrap=True)
    peaks = [value / MIB for value in data["peaks"]]
    labels = _device_labels(data)
    drawn = bars.bar(labels, peaks, color=[_colour(i) for i in range(len(peaks))])
    bars.bar_label(drawn, fmt="%.1f", fontsize=SMALLEST_FONT_SIZE)
    bars.set_ylabel(message("plots.peak_mib"))
    bars.set_title(message("plots.peak"), wrap=True)
    bars.margins(y=0.15)
    return finish(figure, display)


def plot_peaks(traces: Mapping[str, Any], display: bool = True, title: str | None = None) -> CourseFigure:
    """Peak MiB per device for several runs side by side, e.g. gathered outputs vs loss in forward (lesson 03).

    ``traces`` maps a label to a ``Trace``, its ``to_dict()``, or a plain list of peak bytes per device.
    """
    runs = {}
    for label, trace in traces.items():
        if isinstance(trace, Sequence) and not isinstance(trace, (str, bytes)):
            runs[label] = [int(value) for value in trace]
        else:
            runs[label] = _trace_data(trace)["peaks"]
    device_count = max((len(peaks) for peaks in runs.values()), default=0)
    # the bars, and beside them the key of the runs (outside the axes: it covers no bar)
    figure = new_figure(min(NOTEBOOK_WIDTH_PX / 100, 4.4 + 0.6 * device_count * max(1, len(runs))), 3.2)
    axes = figure.subplots()
    width = 0.8 / max(1, len(runs))
    for k, (label, peaks) in enumerate(runs.items()):
        positions = [device + (k - (len(runs) - 1) / 2) * width for device in range(len(peaks))]
        drawn = axes.bar(positions, [value / MIB for value in peaks], width=width, label=text(label), color=_colour(k))
        axes.bar_label(drawn, fmt="%.0f", fontsize=SMALLEST_FONT_SIZE)
    axes.set_xticks(range(device_count), [message("plots.device", device=device) for device in range(device_count)])
    axes.set_ylabel(message("plots.peak_mib"))
    axes.set_title(text(title) or message("plots.peak_memory_per_device"), wrap=True)
    axes.margins(y=0.15)
    _key_beside(axes)
    return finish(figure, display)


class LivePlot:
    """A per-device memory plot that redraws in place while the code runs (lesson 03).

    ``gpulab.memory.track(live=True)`` creates one and feeds it from its sampler thread; pass your own
    ``LivePlot(...)`` as ``live=`` to change its look or rate. The figure is rendered to PNG into one
    ``ipywidgets.Image`` at most ``fps`` times a second: one output in the cell, no flicker, nothing that grows.
    When the block ends the last frame is drawn and, with ``keep_png=True`` (the default), the output also
    gets that frame as a plain ``image/png``: JupyterLab keeps showing the widget, while the saved notebook
    keeps a picture for every viewer without the widget (nbconvert, GitHub; JupyterLab does not save widget
    state by default). With ``display=False`` (or outside a notebook) frames are still rendered and kept in
    ``png``; ``frames`` counts them. Where no one watches the notebook run (``GPULAB_UNWATCHED=1``: the grader
    sets it for the kernels it runs; ``jupyter nbconvert --execute`` may too) only the empty plot and the last
    frame are drawn: the frames in between are seen by no one, and each costs a rendering.
    """

    def __init__(
        self,
        devices: Sequence[int],
        *,
        title: str | None = None,
        fps: float = 4.0,
        display: bool = True,
        keep_png: bool = True,
        width: float = 8.5,
        height: float = 3.2,
        dpi: int = 90,
    ):
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.devices = list(devices)
        self.title = text(title) if title is not None else message("plots.live_memory")
        self.period = 1.0 / fps
        self.display = display
        self.keep_png = keep_png
        self.png: bytes | None = None
        self.frames = 0
        self.widget = None
        self._handle = None
        self._figure: CourseFigure | None = new_figure(width, height, dpi)
        self._axes = self._figure.subplots()
        self._lock = threading.Lock()
        self._last = 0.0
        self.watched = os.environ.get(UNWATCHED_VARIABLE) != "1"

    def show(self) -> None:
        """Put the (empty) plot in the notebook; later frames replace its image in place (lesson 03)."""
        if not self.display or self._handle is not None or not _in_kernel():
            return
        import ipywidgets
        from IPython.display import display as ipython_display

        blank = {"devices": self.devices, "times": [], "allocated": [[] for _ in self.devices]}
        blank.update(peak=[[] for _ in self.devices], nvml_used=[[] for _ in self.devices], marks=[], highest=[])
        self.widget = ipywidgets.Image(value=self._render(blank), format="png")
        self._handle = ipython_display(_widget_view(self.widget), raw=True, display_id=True)

    def maybe_update(self, trace: Any) -> None:
        """Redraw from ``trace`` unless the last frame is younger than ``1 / fps`` seconds or no one watches
        (lesson 03)."""
        if self.watched and time.perf_counter() - self._last >= self.period:
            self.update(trace)

    def update(self, trace: Any) -> None:
        """Redraw now from ``trace`` (a ``Trace`` or a dict of series) (lesson 03)."""
        data = trace.snapshot() if hasattr(trace, "snapshot") else trace
        png = self._render(data)
        if png is None:
            return
        self._last = time.perf_counter()
        if self.widget is not None:
            self.widget.value = png

    def _render(self, data: Mapping[str, Any]) -> bytes | None:
        with self._lock:
            if self._figure is None:
                return None
            self._axes.clear()
            data = dict(data)
            data.setdefault("nvml_used", [[] for _ in self.devices])
            data["marks"] = [tuple(mark) for mark in data.get("marks", [])]
            _draw_memory(self._axes, data)
            self._axes.set_title(self.title, wrap=True)
            if data["times"]:
                self._axes.set_xlim(0, max(data["times"][-1], 1e-3))
            png = figure_png(self._figure)
            self.png = png
            self.frames += 1
            return png

    def finish(self, trace: Any) -> None:
        """Draw the last frame, add it to the output as a plain PNG if asked, release the figure (lesson 03)."""
        try:
            self.update(trace)
        finally:
            with self._lock:
                figure, self._figure = self._figure, None
                if figure is not None:
                    figure.clear()
            if self._handle is not None and self.keep_png and self.png is not None and self.widget is not None:
                self._handle.update(_WidgetWithPng(self.widget, self.png))


def _widget_view(widget: Any) -> dict[str, Any]:
    """The output that shows ``widget``, as a raw MIME bundle, with ipywidgets 7 (Colab) and 8 alike.

    ipywidgets 8 builds this bundle in ``Widget._repr_mimebundle_``; ipywidgets 7 has no such method and
    publishes it from ``_ipython_display_`` without the display id that ``LivePlot`` needs to replace it later.
    Both versions put the same view reference (protocol 2.0, the widget's model id) in the bundle.
    """
    view = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
    return {"text/plain": f"<{type(widget).__name__} widget>", "application/vnd.jupyter.widget-view+json": view}


class _WidgetWithPng:
    """One output holding both the live widget's view and a plain PNG of its last frame.

    Frontends with the widget manager (JupyterLab, Notebook 7) render the widget, which ranks first; every
    other reader of the saved notebook finds the ``image/png``.
    """

    def __init__(self, widget: Any, png: bytes):
        self.widget = widget
        self.png = png

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, Any]:
        bundle = _widget_view(self.widget)
        bundle["image/png"] = base64.b64encode(self.png).decode("ascii")
        bundle["text/plain"] = message("plots.live_last_frame")
        return bundle


# --------------------------------------------------------------------------------------------------------------
# Timing results (gpulab.bench)
# --------------------------------------------------------------------------------------------------------------


def _timing(result: Any) -> dict[str, Any]:
    """A ``gpulab.bench.StepTiming`` or a dict with the same keys, as a dict."""
    if isinstance(result, Mapping):
        return dict(result)
    return result.to_dict()


def _results(results: Any) -> list[dict[str, Any]]:
    if isinstance(results, Mapping):
        items = []
        for label, result in results.items():
            item = _timing(result)
            item.setdefault("label", label)
            if not item.get("label"):
                item["label"] = label
            items.append(item)
        return items
    return [_timing(result) for result in results]


def plot_step_times(results: Any, display: bool = True, title: str | None = None) -> CourseFigure:
    """Median step time (each repeat as a dot) and throughput per setup, from ``gpulab.bench`` (lesson 03).

    ``results`` is what ``gpulab.bench.compare`` returns: a list of ``StepTiming`` (or dicts with ``label``,
    ``median_s``, ``samples_per_s``, ``times``), or a dict label -> result.
    """
    items = _results(results)
    labels = [text(item["label"]) for item in items]
    figure = new_figure(max(6.0, 2.0 + 1.6 * len(items)), 3.2)
    step_axes, throughput_axes = figure.subplots(1, 2)
    positions = range(len(items))
    medians = [item["median_s"] * 1e3 for item in items]
    drawn = step_axes.bar(positions, medians, color=[_colour(i) for i in positions], alpha=0.8)
    step_axes.bar_label(drawn, fmt="%.1f", fontsize=SMALLEST_FONT_SIZE)
    for position, item in zip(positions, items, strict=True):
        times = [value * 1e3 for value in item.get("times", [])]
        step_axes.plot([position] * len(times), times, "k.", ms=3, alpha=0.6)
    step_axes.set_xticks(list(positions), labels, rotation=15)
    step_axes.set_ylabel(message("plots.step_time"))
    step_axes.set_ylim(bottom=0)
    step_axes.margins(y=0.15)
    throughput = [item["samples_per_s"] for item in items]
    drawn = throughput_axes.bar(positions, throughput, color=[_colour(i) for i in positions], alpha=0.8)
    throughput_axes.bar_label(drawn, fmt="%.0f", fontsize=SMALLEST_FONT_SIZE)
    throughput_axes.set_xticks(list(positions), labels, rotation=15)
    throughput_axes.set_ylabel(message("plots.samples_per_s"))
    throughput_axes.margins(y=0.15)
    figure.suptitle(text(title) or message("plots.step_time_and_throughput"), wrap=True)
    return finish(figure, display)


def plot_scaling(results: Any, display: bool = True, title: str | None = None) -> CourseFigure:
    """Throughput against the number of devices, one line per method, with ideal linear scaling (lesson 03).

    Each result needs ``devices`` (how many devices the step used) and ``samples_per_s``; results are grouped
    into lines by ``method`` (e.g. ``"DataParallel"``, ``"DDP"``), or by ``label`` when there is no method.
    The dotted line of each method is its one-device throughput times the device count.
    """
    items = _results(results)
    groups: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        groups.setdefault(item.get("method") or item["label"], []).append(item)
    figure = new_figure(7.5, 3.4)
    axes = figure.subplots()
    for k, (method, members) in enumerate(groups.items()):
        members = sorted(members, key=lambda item: item["devices"])
        counts = [item["devices"] for item in members]
        throughput = [item["samples_per_s"] for item in members]
        axes.plot(counts, throughput, "o-", color=_colour(k), label=method)
        base = members[0]
        per_device = base["samples_per_s"] / base["devices"]
        axes.plot(counts, [per_device * count for count in counts], ":", color=_colour(k), alpha=0.7)
    all_counts = sorted({item["devices"] for item in items})
    axes.set_xticks(all_counts)
    axes.set_xlabel(message("plots.devices"))
    axes.set_ylabel(message("plots.samples_per_s"))
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    _key_beside(axes, title=message("plots.linear_scaling"))
    axes.set_title(text(title) or message("plots.scaling"), wrap=True)
    return finish(figure, display)


# --------------------------------------------------------------------------------------------------------------
# Traffic between devices (gpulab.traffic) and predicted scaling (gpulab.scaling)
# --------------------------------------------------------------------------------------------------------------


def plot_traffic(trace: Any, display: bool = True, title: str | None = None) -> CourseFigure:
    """Bytes through each device's link, stacked by stage: device 0's link against the others' (lesson 03).

    ``trace`` is a ``gpulab.traffic.TrafficTrace`` (or its ``to_dict()``): each transfer counts on the link of
    its source and of its destination. A mapping of such traces (``{"copy": ..., "nccl": ...}``: one step under
    each algorithm) draws one panel per trace, titled by its key, on the same scale.
    """
    panels = {None: trace} if _is_one_trace(trace) else dict(trace)
    per_panel = {label: _transfers(each) for label, each in panels.items()}
    stages = list(dict.fromkeys(t["stage"] for transfers in per_panel.values() for t in transfers))
    widest = max(len(_links(transfers)) for transfers in per_panel.values())
    # Each panel as wide as its links need, the key beside the last one, no wider than the notebook shows it.
    figure = new_figure(min(NOTEBOOK_WIDTH_PX / 100, 1.8 + len(panels) * (0.8 + 0.75 * widest)), 3.2)
    axes_list = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for axes, (label, transfers) in zip(axes_list, per_panel.items(), strict=True):
        links = _links(transfers)
        bottoms = [0.0] * len(links)
        for k, stage in enumerate(stages):
            heights = [
                sum(t["nbytes"] for t in transfers if t["stage"] == stage and link in (t["source"], t["destination"]))
                / 2**20
                for link in links
            ]
            axes.bar(range(len(links)), heights, bottom=bottoms, color=_colour(k), label=stage)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        axes.set_xticks(
            range(len(links)),
            [message("plots.device", device=link) if isinstance(link, int) else str(link) for link in links],
        )
        if label is not None:
            axes.set_title(text(label), fontsize=10)
    axes_list[0].set_ylabel(message("plots.link_mib"))
    _key_beside(axes_list[-1])
    if len(panels) == 1:
        axes_list[0].set_title(text(title) or message("plots.traffic_per_link"), wrap=True)
    else:
        figure.suptitle(text(title) or message("plots.traffic_per_link"), wrap=True)
    return finish(figure, display)


def _is_one_trace(trace: Any) -> bool:
    """A trace or its ``to_dict()``, rather than a mapping of traces."""
    return not isinstance(trace, Mapping) or "transfers" in trace


def _transfers(trace: Any) -> list[dict]:
    return list(trace["transfers"]) if isinstance(trace, Mapping) else [vars(t) for t in trace.transfers]


def _links(transfers: list[dict]) -> list:
    ends = {end for t in transfers for end in (t["source"], t["destination"])}
    return sorted(ends, key=lambda end: (isinstance(end, str), str(end).zfill(8)))


def plot_bytes_by_devices(
    counts: Sequence[int], series: Mapping[str, Sequence[float]], display: bool = True, title: str | None = None
) -> CourseFigure:
    """Bytes per step against the number of devices, one line per series (lesson 03)."""
    figure = new_figure(8.0, 3.4)
    axes = figure.subplots()
    for k, (label, values) in enumerate(series.items()):
        axes.plot(list(counts), [value / 2**20 for value in values], "o-", color=_colour(k), label=text(label))
    axes.set_xticks(list(counts))
    axes.set_xlabel(message("plots.devices"))
    axes.set_ylabel(message("plots.mib_per_step"))
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    _key_beside(axes)
    axes.set_title(text(title) or message("plots.bytes_per_step"), wrap=True)
    return finish(figure, display)


def plot_predicted_speedups(
    counts: Sequence[int],
    predictions: Mapping[str, Mapping[str, Sequence[float]]],
    measured: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    display: bool = True,
    title: str | None = None,
) -> CourseFigure:
    """Predicted speed-up curves, one panel per interconnect, one line per method (lesson 03).

    ``predictions``: interconnect -> method -> speed-up for ``counts[0]``, ``counts[1]``, ... (a shorter list for
    a machine with fewer devices). ``measured``: method -> ``(devices,
    speed-up)`` points measured on this machine's GPUs, drawn as crosses on every panel next to the predictions.
    The dotted diagonal is linear scaling.

    The panels fill rows of at most three, as wide as a notebook shows a picture (``NOTEBOOK_WIDTH_PX``) so that
    it is not scaled down: five panels in one row were shown at two thirds of their size, the tick labels at 7 pt.
    The legend takes the first free place of the grid, else goes under the panels.
    """
    columns = min(PANELS_PER_ROW, len(predictions))
    rows = -(-len(predictions) // columns)
    figure = new_figure(NOTEBOOK_WIDTH_PX / 100, 2.7 * rows + 0.5)
    grid = figure.subplots(rows, columns, sharey=True, squeeze=False)
    cells = [axes for row in grid for axes in row]
    panels, spare = cells[: len(predictions)], cells[len(predictions) :]
    for axes, (link, methods) in zip(panels, predictions.items(), strict=True):
        axes.plot(list(counts), list(counts), "k:", alpha=0.5)
        for k, (method, values) in enumerate(methods.items()):
            shown = list(counts)[: len(values)]
            axes.plot(
                shown, list(values), "o-", ms=3, color=_colour(k), label=message("plots.predicted", method=method)
            )
            for devices, value in (measured or {}).get(method, []):
                axes.plot(
                    [devices], [value], "x", ms=9, color=_colour(k), label=message("plots.measured", method=method)
                )
        axes.set_title(link, fontsize=10, wrap=True)
        axes.set_xlabel(message("plots.devices"))
        axes.set_xticks(list(counts))
        axes.grid(alpha=0.3)
    for row in grid:
        row[0].set_ylabel(message("plots.speedup"))
    for axes in spare:
        axes.axis("off")
    handles, labels = panels[0].get_legend_handles_labels()
    if spare:
        spare[0].legend(handles, labels, fontsize=SMALLEST_FONT_SIZE, loc="center")
    else:  # no free place in the grid: under the panels, where it covers no curve
        figure.legend(handles, labels, fontsize=SMALLEST_FONT_SIZE, loc="outside lower center", ncols=2)
    figure.suptitle(text(title) or message("plots.predicted_speedup"), wrap=True)
    return finish(figure, display)


def plot_ddp_timeline(
    timelines: Mapping[str, tuple[float, Sequence[Any]]], display: bool = True, title: str | None = None
) -> CourseFigure:
    """Backward and the all-reduce of each DDP bucket on a time line, one panel per case (lesson 03).

    ``timelines``: a case's name -> ``(backward_s, buckets)``, ``buckets`` being ``gpulab.scaling.ddp_timeline``'s
    ``BucketTiming`` list (seconds from the start of backward). The upper lane is backward, a tick where each
    bucket's gradients are ready; the lower lane the link, each bucket's all-reduce from its start to its end. What
    sticks out past backward's end is what the step waits for.
    """
    figure = new_figure(NOTEBOOK_WIDTH_PX / 100, 1.45 * len(timelines) + 0.9)
    panels = figure.subplots(len(timelines), 1, squeeze=False)[:, 0]
    for axes, (name, (backward_s, buckets)) in zip(panels, timelines.items(), strict=True):
        axes.broken_barh([(0.0, backward_s * 1e3)], (1.1, 0.8), color="0.75")
        for k, bucket in enumerate(buckets):
            axes.plot([bucket.ready_s * 1e3] * 2, [1.0, 2.0], color=_colour(k), lw=1.5)
            axes.broken_barh(
                [(bucket.start_s * 1e3, (bucket.end_s - bucket.start_s) * 1e3)],
                (0.1, 0.8),
                facecolor=_colour(k),
                edgecolor="white",
            )
        end_ms = max([backward_s, *(bucket.end_s for bucket in buckets)]) * 1e3
        axes.axvline(end_ms, color="k", ls=":", lw=1)
        axes.set_xlim(0, end_ms * 1.03)
        axes.set_ylim(0, 2.1)
        axes.set_yticks([0.5, 1.5], [message("plots.all_reduce_lane"), message("plots.backward_lane")])
        axes.set_title(text(name), fontsize=10, wrap=True)
        axes.grid(axis="x", alpha=0.3)
    panels[-1].set_xlabel(message("plots.ms_from_backward"))
    figure.suptitle(text(title) or message("plots.ddp_timeline"), wrap=True)
    return finish(figure, display)
