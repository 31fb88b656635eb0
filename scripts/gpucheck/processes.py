"""Each step in its own process: the step's side (``run_step_here``) and the parent's (``run_step_process``: a
fresh process per step under the deadline, stopped with everything it started when its time is up)."""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from gpucheck import steps
from gpucheck.context import (
    FAILED,
    KILL_GRACE_S,
    LEFTOVER_GRACE_S,
    LOG_TAIL_LINES,
    PR_SET_CHILD_SUBREAPER,
    REPO,
    SCRIPT,
    TIMED_OUT,
    UTILS,
    StepContext,
    setup_paths,
)


def run_step_here(name: str, options: argparse.Namespace) -> int:
    """The step's own process: run it, write its result to ``options.result`` (also as it goes: a step stopped at
    its time keeps what it measured); always exit 0 (the parent reads the result)."""
    setup_paths()
    step = steps.by_name(name)
    out = Path(options.out).resolve()
    ctx = StepContext(
        name=name, out=out, quick=options.quick, cpu=options.cpu, jobs=options.jobs, profile=options.profile
    )
    ctx.result_path = Path(options.result)
    error = None
    try:
        step.run(ctx)
    except BaseException as failure:  # noqa: BLE001 - recorded, never lost
        traceback.print_exc()
        error = f"{type(failure).__name__}: {failure}\n{traceback.format_exc()[-4000:]}"
    ctx.write_result(error)
    return 0


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first seen via /proc), including those in other sessions."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _stop(process: subprocess.Popen) -> None:
    """End a step process and everything it started (kernels and ranks run in sessions of their own)."""
    pids = [process.pid, *_descendants(process.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            process.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        pids = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        if not pids:
            break
    if process.poll() is None:
        process.wait()


_subreaper = False


def become_subreaper() -> bool:
    """Make this process the child subreaper of everything it starts (Linux).

    A step's kernels and ranks run in sessions of their own; if the step's process dies, they are re-parented to
    this process instead of init, so ``_end_leftovers`` can find and end them after the step.
    """
    global _subreaper
    if sys.platform.startswith("linux"):
        try:
            _subreaper = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            _subreaper = False
    return _subreaper


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"  # a zombie has exited, only waiting to be reaped
    except (OSError, ValueError, IndexError):
        return False


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return  # nothing left to reap


def _end_leftovers() -> list[str]:
    """End processes a finished step left running, and reap the exited ones re-parented to us (as subreaper).

    Helpers that end when their parent does (multiprocessing's resource tracker and fork server) get
    ``LEFTOVER_GRACE_S`` to notice first: only what still runs then is ended, and named in a warning."""
    if not _subreaper:
        return []
    waited_until = time.monotonic() + LEFTOVER_GRACE_S
    while any(_alive(pid) for pid in _descendants(os.getpid())) and time.monotonic() < waited_until:
        _reap()
        time.sleep(0.05)
    running = []
    for pid in _descendants(os.getpid()):
        try:
            if not _alive(pid):
                continue
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue
        running.append(f"{pid}: {command.strip()[:200]}")
    waited_until = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < waited_until:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # nothing left to reap
        if pid == 0:
            if not running:
                break
            time.sleep(0.05)
    return running


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _step_environment(options: argparse.Namespace, step: steps.Step, gpu_count: int) -> dict[str, str]:
    environment = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    if importlib.util.find_spec("gpulab") is None:  # kernels and pytest need gpulab too
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(UTILS), environment.get("PYTHONPATH")]))
    if options.cpu:
        environment["CUDA_VISIBLE_DEVICES"] = ""
    elif step.one_gpu and gpu_count > 1:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        environment["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0] if visible else "0"
    return environment


def result_of(
    written: dict[str, Any] | None, timed_out: bool, wall: float, timeout: float, exit_code: int | None
) -> dict[str, Any]:
    """A step's result from what its process wrote last: its whole result, or, when it was stopped at its time or
    died, what it had measured by then (``partial``), as timed out or failed."""
    if not timed_out and written is not None and written["status"] != "partial":
        return written
    result = {**(written or {}), "partial": written is not None}
    if timed_out:
        result["status"] = TIMED_OUT
        result["error"] = (
            f"stopped after {wall:.0f} s: its time ({timeout:.0f} s, its budget or what was left before the deadline) "
            "was up; it and everything it started were ended" + ("; what it had measured is kept" if written else "")
        )
    else:
        result["status"] = FAILED
        result["error"] = f"the step's process exited with code {exit_code} before its end"
    return result


def run_step_process(options: argparse.Namespace, step: steps.Step, gpu_count: int, timeout: float) -> dict[str, Any]:
    """Run one step in a fresh process with ``timeout`` seconds (its budget, or what is left before the deadline);
    its result, or a failure saying what happened."""
    out = Path(options.out)
    log = out / "logs" / f"{step.name}.log"
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        result_path = Path(tmp) / "result.json"
        command = [sys.executable, str(SCRIPT), str(out), "--run-step", step.name]
        command += ["--result", str(result_path), "--jobs", str(options.jobs)]
        command += ["--profile", options.profile] + ["--cpu"] * options.cpu
        started = time.perf_counter()
        with open(log, "w") as log_file:
            process = subprocess.Popen(
                command,
                cwd=REPO,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=_step_environment(options, step, gpu_count),
                start_new_session=True,
            )
            timed_out = False
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BaseException:  # Ctrl-C: end the step and what it started, then stop
                _stop(process)
                raise
            finally:
                if timed_out or process.poll() is None:
                    _stop(process)
                leftovers = _end_leftovers()
        wall = time.perf_counter() - started
        written = json.loads(result_path.read_text()) if result_path.is_file() else None
        result = result_of(written, timed_out, wall, timeout, process.returncode)
    result["wall_s"] = round(wall, 2)
    result["log"] = str(log.relative_to(out))
    if leftovers:
        result.setdefault("warnings", []).append(
            f"{len(leftovers)} process(es) the step left running were ended: " + "; ".join(leftovers)[:1000]
        )
    if result["status"] in (FAILED, TIMED_OUT):
        result["log_tail"] = _log_tail(log)
    return result
