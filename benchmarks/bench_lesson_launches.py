"""What a learner sees while lesson 03's DDP cell runs: how long it takes and how long nothing on the screen moves.

Runs the lesson's own launch cell (the code cell of ``lessons/03_gpu0_imbalance`` that calls ``gpulab.ddp.launch``)
in a fresh Jupyter kernel, next to the lesson's files, twice: the first launch in a kernel (it starts the fork server,
which imports torch) and a second one (what a later launch costs), then the GIL section's cell, whose own launch is
timed. Every message the kernel sends to the notebook is timed as it arrives: the cell's time to idle, how long the
launch line said the ranks were starting and running, and the longest stretch with no change on the screen. Each
repeat is a new kernel; the runs are made at the machine's load as it is, then with a busy loop on every core (other
notebooks, a class on one server).

    .venv/bin/python benchmarks/bench_lesson_launches.py [results.json] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import torch
from jupyter_client.manager import start_new_kernel

REPO = Path(__file__).resolve().parents[1]
LESSON = REPO / "lessons" / "03_gpu0_imbalance"
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "lesson_launches_cpu.json"
# What the launch cell uses from the cells before it, as the lesson defines it.
SET_UP = """
import time
import gpulab, torch
import ddp_imbalance
devices = gpulab.devices(2, quiet=True)
sizes = dict(in_features=32, hidden=64, classes=20_000)
inputs, labels = (t.to(devices.primary) for t in gpulab.data.classification(256, 32, 20_000, seed=1))
launch_seconds = []  # every launch's own time, the GIL section's included (it launches from inside gpulab.gil)
untimed_launch = gpulab.ddp.launch


def timed_launch(*args, **kwargs):
    started = time.perf_counter()
    try:
        return untimed_launch(*args, **kwargs)
    finally:
        launch_seconds.append(time.perf_counter() - started)


gpulab.ddp.launch = timed_launch
"""
BUSY_LOOP = "while True: pass"


def lesson_cell(call: str) -> str:
    """The lesson's one code cell that makes ``call``, as the release holds it."""
    notebook = jupytext.read(LESSON / "03_gpu0_imbalance.ipynb")
    cells = [cell.source for cell in notebook.cells if cell.cell_type == "code" and call in cell.source]
    if len(cells) != 1:
        raise RuntimeError(f"expected one cell of lesson 03 calling {call}, found {len(cells)}")
    return cells[0]


def run_cell(client, code: str) -> list[tuple[float, str, str]]:
    """Execute ``code``; every output message as ``(seconds since the request, kind, text)``, the last one the
    kernel turning idle."""
    request = client.execute(code)
    started = time.monotonic()
    seen = []
    while True:
        message = client.get_iopub_msg(timeout=600)
        if message["parent_header"].get("msg_id") != request:
            continue
        kind, content = message["msg_type"], message["content"]
        at = time.monotonic() - started
        if kind in ("display_data", "update_display_data"):
            seen.append((at, "line", content["data"].get("text/plain", "")))
        elif kind == "stream":
            seen.append((at, content["name"], content["text"]))
        elif kind == "error":
            raise RuntimeError(f"the launch cell raised {content['ename']}: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            seen.append((at, "idle", ""))
            return seen


def summarise(events: list[tuple[float, str, str]]) -> dict:
    """The cell's time, how long the line said the ranks start and run, and the longest time nothing changed."""
    moments = [0.0, *(at for at, _, _ in events)]
    silences = [later - earlier for earlier, later in zip(moments, moments[1:], strict=False)]
    starting = [at for at, kind, text in events if kind == "line" and text.startswith("starting")]
    running = [at for at, kind, text in events if kind == "line" and " running " in text]
    return {
        "cell_s": round(events[-1][0], 2),
        "line_says_starting_until_s": round(max(starting), 2) if starting else None,
        "line_says_running_until_s": round(max(running), 2) if running else None,
        "longest_silence_s": round(max(silences), 2),
    }


def measure(repeats: int) -> list[dict]:
    cell, gil_cell = lesson_cell("gpulab.ddp.launch("), lesson_cell("gpulab.gil.measure(")
    runs = []
    for _ in range(repeats):
        manager, client = start_new_kernel(kernel_name="python3", cwd=str(LESSON))
        try:
            run_cell(client, SET_UP)
            load = [round(value, 1) for value in os.getloadavg()]
            first, second = run_cell(client, cell), run_cell(client, cell)
            run_cell(client, gil_cell)
            said = run_cell(client, "print(launch_seconds[-1])")
            after = [round(value, 1) for value in os.getloadavg()]
            runs.append(
                {
                    "load_average_1_5_15_min": load,
                    "load_average_after": after,
                    "first": summarise(first),
                    "second": summarise(second),
                    "gil_launch_s": round(float(next(text for _, kind, text in said if kind == "stdout")), 2),
                }
            )
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    return runs


def ranges(runs: list[dict]) -> dict:
    found = {}
    for launch in ("first", "second"):
        for figure in ("cell_s", "longest_silence_s"):
            values = [run[launch][figure] for run in runs]
            found[f"{launch}_{figure}"] = [min(values), round(statistics.median(values), 2), max(values)]
    values = [run["gil_launch_s"] for run in runs]
    found["gil_launch_s"] = [min(values), round(statistics.median(values), 2), max(values)]
    loads = [run[when][0] for run in runs for when in ("load_average_1_5_15_min", "load_average_after")]
    found["load_average_1_min"] = [min(loads), max(loads)]
    return found


def main(output_path: Path, repeats: int) -> dict:
    report = {
        "benchmark": "lesson 03's DDP launch cell in a fresh kernel: time to idle and the longest time nothing "
        "on the screen changed (min, median, max)",
        "cell": lesson_cell("gpulab.ddp.launch("),
        "repeats": repeats,
        "machine": {
            "accelerator": "CPU, no GPU" if not torch.cuda.is_available() else torch.cuda.get_device_name(0),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "conditions": {},
    }
    for condition in ("as it is", "every core busy"):
        loops = []
        if condition == "every core busy":
            loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(os.cpu_count() or 1)]
            time.sleep(5)
        try:
            runs = measure(repeats)
        finally:
            for loop in loops:
                loop.terminate()
                loop.wait()
        report["conditions"][condition] = {"ranges": ranges(runs), "runs": runs}
        print(condition, json.dumps(report["conditions"][condition]["ranges"]), flush=True)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    output_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", nargs="?", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    main(arguments.output, arguments.repeats)
