"""The parent's run: every selected step under the deadline, then ``report.json``, ``summary.txt`` and the archive."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from gpucheck import processes, steps
from gpucheck.context import FAILED, MIN_START_S, NOT_MEASURED, OK, SKIPPED, TIMED_OUT, jsonable


def _exit_code(steps: list[dict[str, Any]], prepared: dict[str, Any] | None = None) -> int:
    statuses = {step["status"] for step in steps}
    if statuses & {FAILED, TIMED_OUT} or (prepared or {}).get("failures"):
        return 1
    if SKIPPED in statuses:
        return 2
    return 0


def _format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def summary(report: dict[str, Any]) -> str:
    """The printed summary: machine, one line per step, the figures, what was not measured, plots, exit code."""
    machine = report["machine"]
    kind = "CPU dry run (--cpu)" if report["cpu"] else (f"{machine.get('gpu_count', 0)} GPU(s)")
    lines = [
        f"GPU check ({kind}{', quick' if report['quick'] else ''}) on {machine.get('hardware', '?')}",
        f"  {machine.get('summary', '')}",
        "",
        f"  {'step':<17} {'status':<13} {'wall':>8}  note",
    ]
    for step in report["steps"]:
        note = step.get("reason") or step.get("error") or ""
        if not note and step.get("warnings"):
            note = "warning: " + step["warnings"][0]
        note = note.strip().splitlines()[0][:110] if note.strip() else ""
        wall = f"{step['wall_s']:.1f} s" if step.get("wall_s") is not None else "-"
        lines.append(f"  {step['name']:<17} {step['status']:<13} {wall:>8}  {note}")
    prepared = report.get("prepared")
    if prepared:
        lines += [
            "",
            f"Environment: {prepared['wheels']} wheels ({prepared['bundle_mib']} MiB) from {prepared['bundle']}, "
            f"installed offline in {prepared['seconds']} s; torch {prepared['torch']}",
        ]
        for failure in prepared.get("failures", []):
            lines.append(f"  FAILED: {failure.strip().splitlines()[0][:150] if failure.strip() else ''}")
    if report["figures"]:
        lines += ["", "Figures:"]
        for record in report["figures"]:
            lines.append(f"  [{record['step']}] {record['what']}: {_format_value(record['value'])} {record['unit']}")
    if report["not_measured"]:
        lines += ["", "Not measured:"]
        for entry in report["not_measured"]:
            lines.append(f"  [{entry['step']}] {entry['reason']}:")
            lines += [f"      - {figure}" for figure in entry["figures"]]
    if report["plots"]:
        lines += ["", "Plots: " + ", ".join(report["plots"])]
    lines += [
        "",
        f"Report: {report['folder']}/report.json ({report['duration_s']:.0f} s, exit code {report['exit_code']})",
    ]
    return "\n".join(lines)


def run_all(options: argparse.Namespace) -> int:
    out = Path(options.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    options.out = str(out)
    processes.become_subreaper()
    started_at = dt.datetime.now(dt.timezone.utc)  # noqa: UP017 - dt.UTC is Python 3.11's; the course runs on 3.10
    started = time.monotonic()
    deadline = started + options.deadline
    selected = [
        name for name in steps.STEP_NAMES if (not options.only or name in options.only) and name not in options.skip
    ]
    selected = ["environment", *[name for name in selected if name != "environment"]]
    machine: dict[str, Any] = {"cpu_count": os.cpu_count(), "python": platform.python_version()}
    gpu_count: int | None = None  # known once the environment step has run
    records: list[dict[str, Any]] = []
    for name in selected:
        step = steps.STEPS[steps.STEP_NAMES.index(name)]
        left = deadline - time.monotonic()
        record: dict[str, Any] = {"name": name, "title": step.title}
        if step.min_gpus > (gpu_count or 0):
            if gpu_count is None:
                reason = "not measured: the number of GPUs is unknown (the environment step did not succeed)"
            else:
                reason = f"not measured: only {gpu_count} GPU(s)" + (" (--cpu)" if options.cpu else "")
            record.update(status=NOT_MEASURED, reason=reason, wall_s=None)
            record["not_measured"] = [{"step": name, "figures": list(step.figures_without_gpus), "reason": reason}]
        elif left < MIN_START_S:
            record.update(
                status=SKIPPED,
                wall_s=None,
                reason=f"deadline: {max(left, 0):.0f} s of the {options.deadline:.0f} s left when it was due",
            )
        else:
            print(f"[{time.monotonic() - started:6.1f} s] {name}: {step.title} ...", flush=True)
            record.update(processes.run_step_process(options, step, gpu_count or 0, timeout=left))
        records.append(record)
        print(f"[{time.monotonic() - started:6.1f} s] {name}: {record['status']}", flush=True)
        if name == "environment" and record["status"] == OK:
            machine = record["details"]
            gpu_count = int(machine.get("gpu_count", 0))
    figures = [figure for record in records for figure in record.get("figures", [])]
    not_measured = [entry for record in records for entry in record.get("not_measured", [])]
    plots = [plot for record in records for plot in record.get("plots", [])]
    prepared = json.loads(Path(options.prepared).read_text()) if options.prepared else None
    exit_code = _exit_code(records, prepared)
    if hasattr(os, "getloadavg"):
        machine["load_average_at_end"] = [round(load, 2) for load in os.getloadavg()]
    report = {
        "what": "gpu check: GPU tests, lessons, autograding and benchmarks of the course on this machine",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "cpu": options.cpu,
        "quick": options.quick,
        "deadline_s": options.deadline,
        "selected_steps": selected,
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - started, 1),
        "machine": machine,
        "measured_on": machine.get("hardware"),
        "steps": records,
        "figures": figures,
        "not_measured": not_measured,
        "plots": plots,
        "exit_code": exit_code,
    }
    if prepared is not None:
        report["prepared"] = prepared
    (out / "report.json").write_text(json.dumps(jsonable(report), indent=1) + "\n")
    text = summary({**report, "folder": str(out)})
    (out / "summary.txt").write_text(text + "\n")
    archive = shutil.make_archive(str(out), "gztar", root_dir=out.parent, base_dir=out.name)
    print("\n" + text + f"\nArchive: {archive} (everything above, to send back)", flush=True)
    return exit_code
