"""gpulab.plots: static and live pictures of memory and timings (lesson 03), headless and in a real kernel."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import nbformat
import pytest
import torch
from gpulab import bench, memory, plots
from gpulab.devices import Devices
from matplotlib.figure import Figure

REPO_ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def trace():
    devices = Devices([0, 1], virtual=True, primary=torch.device("cpu"), reason="two virtual devices (test)")
    with memory.track(devices, interval=0.005) as trace:
        for step in range(3):
            trace.mark(f"step {step}")
            with memory.virtual.placing_on(1):
                keep = torch.empty(200_000).clone()
            other = torch.empty(400_000).fill_(1)
            del keep, other
    return trace


def fake_timings():
    return [
        bench.StepTiming("1 device", 0.010, 6400.0, [0.010, 0.011, 0.009], batch_size=64, devices=1, method="1 GPU"),
        bench.StepTiming("DataParallel x2", 0.008, 8000.0, [0.008] * 3, batch_size=64, devices=2, method="DP"),
        {"label": "DDP x2", "median_s": 0.006, "samples_per_s": 10666.0, "times": [0.006], "devices": 2,
         "method": "DDP"},
    ]  # fmt: skip


def test_plot_trace_headless_returns_figure_and_leaks_nothing(trace, capsys):
    figure = plots.plot_trace(trace, display=False)
    assert isinstance(figure, Figure)
    timeline, bars = figure.axes
    assert len(timeline.lines) >= 4  # allocated and peak for each of the 2 devices
    heights = [patch.get_height() for patch in bars.patches]
    assert heights == pytest.approx([peak / MIB for peak in trace.peaks()])
    assert heights[1] >= 0.76  # 200,000 floats on device 1
    assert plt.get_fignums() == []  # nothing registered with pyplot
    plots.plot_trace(trace.to_dict(), display=True)  # not in IPython: shows nothing, prints nothing
    assert capsys.readouterr().out == ""
    assert plots.figure_png(figure).startswith(b"\x89PNG")


def test_nvml_used_is_drawn_as_its_rise_on_the_allocated_scale():
    """A real-GPU trace: NVML's "used" (600 MiB of context and cache before the block) is drawn as its rise since
    the first sample, so the tens-of-MiB allocated curves keep the axis."""
    data = {
        "devices": [0],
        "times": [0.0, 0.1, 0.2],
        "allocated": [[0, 20 * MIB, 10 * MIB]],
        "peak": [[0, 20 * MIB, 20 * MIB]],
        "highest": [[0, 20 * MIB, 20 * MIB]],
        "nvml_used": [[600 * MIB, 622 * MIB, 622 * MIB]],
        "marks": [],
    }
    timeline = plots.plot_trace(data, display=False).axes[0]
    dotted = [line for line in timeline.lines if line.get_linestyle() == ":"]
    assert len(dotted) == 1 and list(dotted[0].get_ydata()) == [0, 22, 22]
    assert timeline.get_ylim()[1] < 100


def test_plot_peaks(trace):
    figure = plots.plot_peaks({"run": trace, "by hand": [3 * MIB, 1 * MIB]}, display=False)
    assert len(figure.axes[0].patches) == 4
    assert plt.get_fignums() == []


def test_step_time_and_scaling_plots():
    results = fake_timings()
    figure = plots.plot_step_times(results, display=False)
    step_axes, throughput_axes = figure.axes
    assert [p.get_height() for p in step_axes.patches] == pytest.approx([10.0, 8.0, 6.0])
    assert [p.get_height() for p in throughput_axes.patches] == pytest.approx([6400.0, 8000.0, 10666.0])
    by_label = plots.plot_step_times({"a": results[0], "b": results[1]}, display=False)
    assert [t.get_text() for t in by_label.axes[0].get_xticklabels()] == ["1 device", "DataParallel x2"]
    scaling = plots.plot_scaling(results, display=False)
    assert len(scaling.axes[0].lines) == 6  # measured and linear lines for 3 methods
    assert plt.get_fignums() == []


def test_an_unwatched_live_plot_draws_its_last_frame_only(trace, monkeypatch):
    """Under ``GPULAB_UNWATCHED=1`` (the grader's kernels) no frame is drawn while the block runs, however long
    it runs; the last one is, with its picture kept as a watched plot keeps it."""
    monkeypatch.setenv(plots.UNWATCHED_VARIABLE, "1")
    live = plots.LivePlot([0, 1], fps=1000, display=False)
    for _ in range(3):
        time.sleep(0.002)  # past 1 / fps: a watched plot would draw each time
        live.maybe_update(trace)
    assert live.frames == 0 and live.png is None
    live.finish(trace)
    assert live.frames == 1 and live.png.startswith(b"\x89PNG")
    monkeypatch.setenv(plots.UNWATCHED_VARIABLE, "0")
    watched = plots.LivePlot([0, 1], fps=1000, display=False)
    time.sleep(0.002)
    watched.maybe_update(trace)
    assert watched.frames == 1


def test_live_plot_throttles_and_releases(trace):
    live = plots.LivePlot([0, 1], fps=1, display=False)
    live.update(trace)
    live.maybe_update(trace)  # within 1 s of the last frame: skipped
    assert live.frames == 1
    live.finish(trace)
    assert live.frames == 2 and live.png.startswith(b"\x89PNG")
    live.update(trace)  # after finish: the figure is gone, nothing happens
    assert live.frames == 2
    with pytest.raises(ValueError):
        plots.LivePlot([0], fps=0)


def test_widget_output_needs_no_ipywidgets_8_method():
    """ipywidgets 7 (Colab's) has no ``Widget._repr_mimebundle_``: the live plot's output must not rely on it."""

    class WidgetOf7:  # what LivePlot uses of an ipywidgets 7 widget
        model_id = "f00d"

    png = b"\x89PNG frame"
    bundle = plots._WidgetWithPng(WidgetOf7(), png)._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"] == {
        "version_major": 2,
        "version_minor": 0,
        "model_id": "f00d",
    }
    assert base64.b64decode(bundle["image/png"]) == png


def _cell_outputs(notebook, index):
    return notebook.cells[index].outputs


def test_live_plot_in_a_real_kernel(tmp_path):
    """A notebook run by nbclient: the live plot updates while the block runs and leaves one output per cell."""
    from nbclient import NotebookClient

    cells = [
        "import torch, gpulab\nfrom gpulab import memory, plots\ndevices = gpulab.devices(2, quiet=True)",
        # 1: the default live plot; the block lasts about half a second
        "import time\n"
        "with memory.track(live=True, interval=0.02) as trace:\n"
        "    for step in range(6):\n"
        "        trace.mark(f'step {step}')\n"
        "        with gpulab.virtual.placing_on(step % 2):\n"
        "            x = torch.ones(100_000).clone()\n"
        "        time.sleep(0.08)",
        # 2: an explicit LivePlot, to count its frames
        "live = plots.LivePlot(devices, fps=20)\n"
        "with memory.track(live=live, interval=0.01) as trace2:\n"
        "    time.sleep(0.5)",
        "print(live.frames, live.widget is not None)",
        # 4: a static plot as the cell's last expression: shown once, not twice
        "plots.plot_trace(trace)",
        # 5, 6: a figure kept with display=False shows nothing, then shows once when it is a cell's value
        "figure = plots.plot_step_times([gpulab.bench.time_step(lambda: None, 8, repeats=3)], display=False)",
        "figure",
        "import matplotlib\nimport matplotlib.pyplot as plt\n"
        "print(plt.get_fignums(), trace.peaks()[1] >= 400_000, matplotlib.get_backend())",
    ]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(
        notebook, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    # MPLBACKEND=Agg (as in a server started with it, which turns pyplot figures into text) must change nothing.
    client.execute(env={**os.environ, "MPLBACKEND": "Agg"})

    for index in (1, 2, 4, 6):
        outputs = _cell_outputs(notebook, index)
        assert len(outputs) == 1, (index, outputs)
        (output,) = outputs
        assert output["output_type"] == "display_data", output
        # A plain PNG (for the live plots: the last frame, which the saved notebook keeps beside the widget).
        assert base64.b64decode(output["data"]["image/png"]).startswith(b"\x89PNG")
    # The live plots are still widgets (JupyterLab keeps showing the widget): views of the widgets' own models.
    state = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    for index in (1, 2):
        view = _cell_outputs(notebook, index)[0]["data"]["application/vnd.jupyter.widget-view+json"]
        assert state[view["model_id"]]["model_name"] == "ImageModel", view
    # The widgets' last values reached the frontend through their comms: they are the last frames. (Frames set
    # from the sampler thread would have raised and printed a notice, a second output, had that failed.)
    widget_values = {
        buffer["data"] for model in state.values() if model["model_name"] == "ImageModel" for buffer in model["buffers"]
    }
    assert {_cell_outputs(notebook, index)[0]["data"]["image/png"] for index in (1, 2)} <= widget_values
    frames, widget_kept = _cell_outputs(notebook, 3)[0]["text"].split()
    assert int(frames) >= 3 and widget_kept == "True"  # it really updated while the block ran
    assert _cell_outputs(notebook, 5) == []
    assert _cell_outputs(notebook, 7)[0]["text"].lower() == "[] true agg\n"
    for cell in notebook.cells:
        for output in cell.outputs:
            assert output["output_type"] != "error" and output.get("name") != "stderr", output


def test_trace_marks_are_horizontal_numbers_with_a_key_and_a_rank_is_labelled_as_such():
    """Stage marks milliseconds apart stay readable: horizontal, full-size numbers that never share a spot, named
    in a key under the plot; a DDP rank's trace names its series after the rank (lesson 03)."""
    from gpulab.plots import SMALLEST_FONT_SIZE, plot_trace

    labels = ["start", "model", "forward", "loss", "backward", "optimizer step"]
    moments = [0.0, 0.001, 0.002, 0.003, 0.06, 0.2]
    trace = {
        "devices": [0],
        "times": moments,
        "allocated": [[0, 1, 2, 3, 2, 1]],
        "peak": [[0, 1, 2, 3, 3, 3]],
        "marks": list(zip(moments, labels, strict=True)),
    }
    figure = plot_trace(trace, display=False, device_labels=["rank 1"])
    timeline = figure.axes[0]
    texts = list(timeline.texts)
    numbers = [text for text in texts if text.get_text().isdigit()]
    assert [text.get_text() for text in numbers] == [str(n) for n in range(1, 7)]
    assert all(text.get_rotation() == 0 and text.get_fontsize() >= SMALLEST_FONT_SIZE for text in texts)
    figure.canvas.draw()
    boxes = [text.get_window_extent() for text in numbers]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]), "mark numbers overlap"
    key = next(text.get_text() for text in texts if not text.get_text().isdigit())
    assert all(f"{n} {label}" in key for n, label in enumerate(labels, start=1)), key
    assert [line.get_label() for line in timeline.get_lines() if not line.get_label().startswith("_")] == ["rank 1"]
    assert [tick.get_text() for tick in figure.axes[1].get_xticklabels()] == ["rank 1"]


SMALLEST_SHOWN_POINTS = 8.0  # the smallest text a learner should have to read, as the notebook shows it
CSS_PX_PER_POINT = 96 / 72  # a browser draws 96 px to the inch


def shown_text_sizes(figure, monkeypatch) -> list[tuple[str, float]]:
    """Each text drawn in ``figure``'s PNG with its size in points as a notebook shows it: the PNG is scaled down
    to ``NOTEBOOK_WIDTH_PX`` when it is wider, and a browser draws its pixels at 96 to the inch."""
    import matplotlib.text

    drawn = []
    text_draw = matplotlib.text.Text.draw

    def recording_draw(self, renderer):
        text_draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)

    monkeypatch.setattr(matplotlib.text.Text, "draw", recording_draw)
    png = plots.figure_png(figure)
    width_px = int.from_bytes(png[16:20], "big")  # the PNG's IHDR chunk: width, then height
    scale = min(1.0, plots.NOTEBOOK_WIDTH_PX / width_px)
    return [(text.get_text(), text.get_size() * figure.dpi / 72 * scale / CSS_PX_PER_POINT) for text in drawn]


def test_the_five_panel_speedup_figure_is_readable_at_the_notebooks_width(monkeypatch):
    """Lesson 03's predicted speed-ups, one panel per interconnect: every title, label, tick and legend entry is
    at least 8 pt as the notebook shows the picture."""
    from gpulab import scaling

    counts = [1, 2, 4, 8]
    predictions = {
        f"{name}, {link.gpu}": {"DataParallel": [1.0, 0.8, 0.7, 0.6], "DDP": [1.0, 1.8, 3.2, 5.5]}
        for name, link in scaling.INTERCONNECTS.items()
    }
    assert len(predictions) == 5
    figure = plots.plot_predicted_speedups(counts, predictions, display=False)
    sizes = shown_text_sizes(figure, monkeypatch)
    assert len(sizes) > 5 * len(counts), "tick labels, titles and the legend are all drawn"
    too_small = [(text[:30], round(points, 1)) for text, points in sizes if points < SMALLEST_SHOWN_POINTS]
    assert not too_small, f"texts under {SMALLEST_SHOWN_POINTS} pt as shown: {too_small[:8]}"


# --------------------------------------------------------------------------------------------------------------
# Every figure as the notebook shows it, in both editions: text readable, inside the picture, never on top of other
# text, and keys that cover no bar, line or label (issue: lesson 03's step labels overlapped the "time (s)" label,
# the memory key was tiny, the Japanese legend covered the device-1 bar).
# --------------------------------------------------------------------------------------------------------------

STAGES = ["start", "model", "forward", "loss", "backward", "optimizer step"]  # lesson 03's marks of one step


def memory_series(devices: int, marks: list[str], seconds: float, *, clustered: bool = False) -> dict:
    """A trace's data shaped like lesson 03's: device 0 climbing far above the others at every mark. With
    ``clustered``, the marks after the first fall in the last tenth of the time, as one step's stages do."""
    count = 80
    times = [seconds * index / (count - 1) for index in range(count)]
    allocated = [
        [int((5 + 15 * ((index * 7 + device) % 5) / 4 + (45 if device == 0 and index % 13 == 6 else 0)) * MIB)
         for index in range(count)]
        for device in range(devices)
    ]  # fmt: skip
    peak = [[max(series[: index + 1]) for index in range(count)] for series in allocated]
    if clustered:
        moments = [0.0] + [seconds * (0.9 + 0.02 * index) for index in range(len(marks) - 1)]
    else:
        moments = [seconds * index / len(marks) for index in range(len(marks))]
    return {
        "devices": list(range(devices)),
        "times": times,
        "allocated": allocated,
        "peak": peak,
        "highest": peak,
        "marks": list(zip(moments, marks, strict=True)),
        "virtual": True,
    }


def traffic_data(devices: int, algorithm: str = "copy") -> dict:
    """One DataParallel step's transfers on ``devices`` devices, as lesson 03 counts them: every stage through device
    0 with copies; with NCCL, the broadcast and the reduce along a chain of the devices."""
    stages = {"scatter": 0.1, "broadcast": 5.0, "gather": 5.0, "grad_scatter": 5.0, "reduce": 5.0}
    transfers = []
    for stage, mib in stages.items():
        for device in range(1, devices):
            source, destination = (device, 0) if stage in ("gather", "reduce") else (0, device)
            if algorithm == "nccl" and stage == "broadcast":
                source = device - 1
            elif algorithm == "nccl" and stage == "reduce":
                destination = (device + 1) % devices
            transfers.append({"stage": stage, "source": source, "destination": destination, "nbytes": int(mib * MIB)})
    return {"transfers": transfers}


def lesson_03_figures() -> dict:
    """Each figure lesson 03 draws (its titles and labels; the data shaped like a run's), by a name, and the other
    figures of gpulab.plots, each as a function returning the drawn figure."""
    from gpulab import scaling

    peaks = {"gathered on device 0": [64 * MIB, 20 * MIB], "output_device=1": [22 * MIB, 64 * MIB]}
    peaks["loss in forward"] = [32 * MIB, 18 * MIB]
    counts = [1, 2, 4, 8]
    predictions = {
        f"{name}, {link.gpu}": {"DataParallel": [1.0, 0.8, 0.7, 0.6], "DDP": [1.0, 1.8, 3.2, 5.5]}
        for name, link in scaling.INTERCONNECTS.items()
    }

    def live_frame():
        live = plots.LivePlot([0, 1], display=False)
        live.update(memory_series(2, [f"step {step}" for step in range(6)], 1.4))
        return live._figure

    return {
        "one step, stage by stage": lambda: plots.plot_trace(
            memory_series(2, STAGES, 2.5, clustered=True), title="One DataParallel step, stage by stage", display=False
        ),
        "live memory": live_frame,
        "peaks, three ways": lambda: plots.plot_peaks(peaks, title="Peak memory per device, three ways", display=False),
        "peaks and DDP": lambda: plots.plot_peaks(
            {**peaks, "DDP, one rank per device": [38 * MIB, 38 * MIB]},
            title="Peak memory per device: DataParallel three ways, and DDP",
            display=False,
        ),
        "a DDP rank": lambda: plots.plot_trace(
            memory_series(1, ["step 0", "step 1"], 0.8),
            title="DDP rank 1: its own device's memory",
            device_labels=["rank 1"],
            display=False,
        ),
        "traffic per link": lambda: plots.plot_traffic(
            {"copy": traffic_data(4), "nccl": traffic_data(4, "nccl")},
            title="One DataParallel step on 4 devices: bytes through each device's link",
            display=False,
        ),
        "bytes by devices": lambda: plots.plot_bytes_by_devices(
            list(range(1, 9)),
            {
                "DataParallel, copies: device 0's link": [(n - 1) * 20 * MIB for n in range(1, 9)],
                "DataParallel, NCCL: device 0's link": [
                    min(n - 1, 1) * 10 * MIB + (n - 1) * 10 * MIB for n in range(1, 9)
                ],
                "DDP: what each rank sends": [2 * (n - 1) / n * 30 * MIB for n in range(1, 9)],
            },
            title="Bytes per step, 128 samples per device",
            display=False,
        ),
        "predicted speed-ups": lambda: plots.plot_predicted_speedups(counts, predictions, display=False),
        "predicted speed-ups, a full grid": lambda: plots.plot_predicted_speedups(
            counts, dict(list(predictions.items())[:3]), display=False
        ),
        "step times": lambda: plots.plot_step_times(fake_timings(), display=False),
        "scaling": lambda: plots.plot_scaling(fake_timings(), display=False),
        "DDP's buckets on a time line": lambda: plots.plot_ddp_timeline(
            ddp_timelines(), title="8 devices over PCIe 4.0 x16: backward and each bucket's all-reduce", display=False
        ),
    }


def ddp_timelines() -> dict:
    """Lesson 03's three cases of DDP's buckets on a time line, shaped like its predictions (seconds)."""
    from gpulab.scaling import BucketTiming

    one = [BucketTiming(5_208_448, 130e-6, 130e-6, 1.5e-3)]
    two = [BucketTiming(5_200_000, 129e-6, 129e-6, 1.5e-3), BucketTiming(8_448, 130e-6, 1.5e-3, 1.51e-3)]
    conv = [BucketTiming(100_356_000, 4e-5, 4e-5, 5.6e-3), BucketTiming(28_315_648, 4.6e-3, 5.6e-3, 7.2e-3)]
    conv.append(BucketTiming(9_304_320, 18e-3, 18e-3, 18.5e-3))
    return {
        "this lesson's model, step 0: one bucket": (130e-6, one),
        "this lesson's model, from step 1 on": (130e-6, two),
        "ConvNet, from step 1 on": (18e-3, conv),
    }


def drawn(figure, monkeypatch):
    """Render ``figure`` to PNG as the notebook receives it; return the scale at which the notebook shows it (a
    wider picture is scaled down to ``NOTEBOOK_WIDTH_PX``) and every non-empty text drawn in it."""
    import matplotlib.text

    texts = []
    text_draw = matplotlib.text.Text.draw

    def recording_draw(self, renderer):
        text_draw(self, renderer)
        if self.get_visible() and self.get_text().strip() and self not in texts:
            texts.append(self)  # once, though the layout engine draws some texts twice

    with monkeypatch.context() as patch:
        patch.setattr(matplotlib.text.Text, "draw", recording_draw)
        png = plots.figure_png(figure)
    width_px = int.from_bytes(png[16:20], "big")  # the PNG's IHDR chunk: width, then height
    return min(1.0, plots.NOTEBOOK_WIDTH_PX / width_px), texts


def layout_problems(figure, monkeypatch) -> list[str]:
    """What a learner could not read in ``figure``: text under 8 pt as shown, text cut at the picture's edge, two
    texts on top of each other (a tick label on an axis label, a key on a label), a legend over a bar, a line or a
    text."""
    scale, texts = drawn(figure, monkeypatch)
    renderer = figure.canvas.get_renderer()
    problems = []
    boxes = [(text, text.get_window_extent(renderer)) for text in texts]
    for text, box in boxes:
        points = text.get_size() * figure.dpi / 72 * scale / CSS_PX_PER_POINT
        if points < SMALLEST_SHOWN_POINTS:
            problems.append(f"{text.get_text()[:30]!r} is {points:.1f} pt as shown")
        inside = figure.bbox.padded(1)
        if not (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1):
            problems.append(f"{text.get_text()[:30]!r} is cut at the picture's edge")
    for index, (text, box) in enumerate(boxes):
        for other, other_box in boxes[index + 1 :]:
            if box.overlaps(other_box):
                problems.append(f"{text.get_text()[:30]!r} overlaps {other.get_text()[:30]!r}")
    legends = [*figure.legends, *(axes.get_legend() for axes in figure.axes if axes.get_legend())]
    for legend in legends:
        area = legend.get_window_extent(renderer)
        own = set(legend.get_texts()) | {legend.get_title()}
        for axes in figure.axes:
            for patch in axes.patches:
                if patch.get_visible() and patch.get_window_extent(renderer).overlaps(area):
                    problems.append(f"the legend covers a bar at {patch.get_x():.2f}")
            for line in axes.lines:
                path = line.get_transform().transform_path(line.get_path())
                if line.get_visible() and path.intersects_bbox(area, filled=False):
                    problems.append(f"the legend covers the line {line.get_label()!r}")
        for text, box in boxes:
            if text not in own and box.overlaps(area):
                problems.append(f"the legend covers {text.get_text()[:30]!r}")
    return problems


@pytest.mark.parametrize("edition", ["en", "ja"])
@pytest.mark.parametrize("name", list(lesson_03_figures()))
def test_every_figure_reads_as_the_notebook_shows_it(name, edition, monkeypatch):
    import matplotlib
    from gpulab import messages

    monkeypatch.setattr(messages, "_chosen", [edition])
    with matplotlib.rc_context():  # the Japanese font stays with this test
        figure = lesson_03_figures()[name]()
        problems = layout_problems(figure, monkeypatch)
    assert not problems, f"{name} ({edition}): {problems[:6]}"


def test_the_layout_check_sees_what_the_learner_saw():
    """The check above fails on the figures as they were: a legend inside the axes over a bar, 7-pt keys, a key
    placed at a fixed distance under the axes that the axis label ran into."""
    from matplotlib.figure import Figure as PlainFigure

    figure = PlainFigure(figsize=(5, 3), dpi=100)
    FigureCanvasAgg = pytest.importorskip("matplotlib.backends.backend_agg").FigureCanvasAgg
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    axes.bar([0, 1], [64, 20], label="gathered on device 0")
    axes.bar([0.3, 1.3], [22, 64], label="output_device=1")
    axes.legend(fontsize=7, loc="upper center")
    axes.set_xlabel("time (s)")
    axes.annotate("1 step 0   2 step 1", (0, 0), xycoords="axes fraction", xytext=(0, -20), textcoords="offset points")
    with pytest.MonkeyPatch.context() as monkeypatch:
        problems = " | ".join(layout_problems(figure, monkeypatch))
    assert "the legend covers a bar" in problems, problems
    assert "pt as shown" in problems, problems
    assert "overlaps '1 step 0   2 step 1'" in problems, problems
