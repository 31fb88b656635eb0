"""The parent's run: the profile's steps, each within its budget and the deadline, with ``report.json``,
``summary.txt`` and the archive written after every step."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpucheck import processes, profiles, steps
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
        f"GPU check ({kind}, profile {report['profile']}) on {machine.get('hardware', '?')}",
        f"  {machine.get('summary', '')}",
    ]
    if not report.get("complete", True):
        lines.append("  INCOMPLETE: the run had not ended when this was written (the steps below are those done)")
    lines += ["", f"  {'step':<17} {'status':<13} {'wall':>8} {'budget':>7}  note"]
    for step in report["steps"]:
        note = step.get("reason") or step.get("error") or ""
        if not note and step.get("warnings"):
            note = "warning: " + step["warnings"][0]
        note = note.strip().splitlines()[0][:110] if note.strip() else ""
        wall = f"{step['wall_s']:.1f} s" if step.get("wall_s") is not None else "-"
        budget = f"{step['budget_s']:.0f} s" if step.get("budget_s") is not None else "-"
        lines.append(f"  {step['name']:<17} {step['status']:<13} {wall:>8} {budget:>7}  {note}")
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
        f"Report: {report['folder']}/report.json ({report['duration_s']:.0f} s of the {report['deadline_s']:.0f} s "
        f"deadline, preparation included; exit code {report['exit_code']})",
    ]
    return "\n".join(lines)


class Stopped(BaseException):
    """The check received SIGTERM (a time limit around the whole command): the running step and what it started
    are ended, and the report is written with every result so far."""


def _on_sigterm(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the report must still be written
    raise Stopped(signal.Signals(signum).name)


def _replace(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a run stopped while writing leaves the previous version)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def archive(out: Path) -> Path:
    """``OUT.tar.gz`` next to ``OUT``, made anew and put in place whole."""
    partial = shutil.make_archive(
        str(out.parent / f".{out.name}.partial"), "gztar", root_dir=out.parent, base_dir=out.name
    )
    final = out.parent / f"{out.name}.tar.gz"
    os.replace(partial, final)
    return final


def budgets_of(options: argparse.Namespace) -> dict[str, float]:
    """Each step's seconds: its profile's, or ``--budget STEP=SECONDS``."""
    return {**dict(profiles.PROFILES[options.profile].steps), **dict(options.budget or {})}


def run_all(options: argparse.Namespace) -> int:
    """Every selected step of the profile, in its order, each within its budget and the deadline. After each step
    the report, the summary and the archive are written again with every result so far, so that whatever stops
    the run later (a step that hangs, a crash of this process, SIGTERM) leaves them in the archive."""
    out = Path(options.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    options.out = str(out)
    processes.become_subreaper()
    started_at = dt.datetime.now(dt.timezone.utc)  # noqa: UP017 - dt.UTC is Python 3.11's; the course runs on 3.10
    started = time.monotonic()
    spent = float(options.spent or 0.0)  # the preparation's seconds (--bundle), counted in the deadline
    deadline = started + options.deadline - spent
    profile = profiles.PROFILES[options.profile]
    budgets = budgets_of(options)
    selected = [
        name for name in profile.names if (not options.only or name in options.only) and name not in options.skip
    ]
    selected = ["environment", *[name for name in selected if name != "environment"]]
    machine: dict[str, Any] = {"cpu_count": os.cpu_count(), "python": platform.python_version()}
    prepared = json.loads(Path(options.prepared).read_text()) if options.prepared else None
    gpu_count: int | None = None  # known once the environment step has run
    records: list[dict[str, Any]] = []

    def write(complete: bool) -> int:
        figures = [figure for record in records for figure in record.get("figures", [])]
        not_measured = [entry for record in records for entry in record.get("not_measured", [])]
        plots = [plot for record in records for plot in record.get("plots", [])]
        exit_code = _exit_code(records, prepared)
        if complete and hasattr(os, "getloadavg"):
            machine["load_average_at_end"] = [round(load, 2) for load in os.getloadavg()]
        report = {
            "what": "gpu check: GPU tests, lessons, autograding and benchmarks of the course on this machine",
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "profile": profile.name,
            "cpu": options.cpu,
            "quick": profile.small,
            "deadline_s": options.deadline,
            "preparation_s": spent,
            "budgets_s": {name: budgets[name] for name in selected},
            "selected_steps": selected,
            "complete": complete,
            "started_at": started_at.isoformat(timespec="seconds"),
            "duration_s": round(time.monotonic() - started + spent, 1),
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
        _replace(out / "report.json", json.dumps(jsonable(report), indent=1) + "\n")
        text = summary({**report, "folder": str(out)})
        _replace(out / "summary.txt", text + "\n")
        written = archive(out)
        if complete:
            print("\n" + text + f"\nArchive: {written} (everything above, to send back)", flush=True)
        return exit_code

    handled = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if handled else None
    stopped = None
    try:
        for name in selected:
            step = steps.by_name(name)
            record: dict[str, Any] = {"name": name, "title": step.title, "budget_s": budgets[name]}
            if stopped:
                record.update(status=SKIPPED, wall_s=None, reason=f"the check was stopped ({stopped}) before it")
                records.append(record)
                continue
            left = deadline - time.monotonic()
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
                timeout = min(budgets[name], left)
                print(
                    f"[{time.monotonic() - started + spent:6.1f} s] {name}: {step.title} (at most {timeout:.0f} s) ...",
                    flush=True,
                )
                began = time.monotonic()
                try:
                    record.update(processes.run_step_process(options, step, gpu_count or 0, timeout=timeout))
                except Stopped as signal_name:
                    stopped = str(signal_name)
                    record.update(status=FAILED, error=f"the check was stopped ({stopped}) while this step ran")
                    record["wall_s"] = round(time.monotonic() - began, 2)
                except Exception as error:  # noqa: BLE001 - one step's trouble must not cost the others' results
                    record.update(status=FAILED, error=f"running the step failed: {type(error).__name__}: {error}")
                    record["wall_s"] = round(time.monotonic() - began, 2)
            records.append(record)
            print(f"[{time.monotonic() - started + spent:6.1f} s] {name}: {record['status']}", flush=True)
            if name == "environment" and record["status"] == OK:
                machine = record["details"]
                gpu_count = int(machine.get("gpu_count", 0))
            try:
                write(complete=False)
            except Stopped as signal_name:
                stopped = str(signal_name)
    finally:
        if handled:
            signal.signal(signal.SIGTERM, previous)
    return write(complete=True)
