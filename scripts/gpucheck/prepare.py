"""``--bundle``: a virtual environment that reuses this Python's torch and gets the bundle's wheels, offline.

Each part of the preparation is independent: a bundle that cannot be downloaded, a wheel that will not install,
an environment that cannot be made are recorded (``prepared["failures"]``) and the check runs all the same, in the
environment as far as it got, or with this Python when there is none; each step then measures what it can and
names what is missing. The report counts a failed preparation as a failure (exit code 1)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gpucheck.context import MIB, REPO, SCRIPT
from gpucheck.profiles import PREPARATION_BUDGET_S

ERROR_TAIL = 1500  # characters of a failing command's output kept in the report
INSTALL_TIMEOUT_S = 2 * PREPARATION_BUDGET_S  # all wheels in one pip call (11-24 s measured on 2 cores)
WHEEL_TIMEOUT_S = 30.0  # one wheel alone, when the call with all of them failed


def _tail(completed: subprocess.CompletedProcess) -> str:
    return ((completed.stdout or "") + (completed.stderr or "")).strip()[-ERROR_TAIL:]


def _install(python: Path, wheels: list[Path], timeout: float) -> subprocess.CompletedProcess:
    """pip from this Python (``pip --python``, pip 22.3 or later) into ``python``'s environment: offline, exactly
    these wheels, no dependency resolution; stopped after ``timeout`` seconds (returned as exit code -1)."""
    command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-deps"]
    command += ["--quiet", "--no-compile", "--disable-pip-version-check", *map(str, wheels)]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout.decode(errors="replace") if isinstance(expired.stdout, bytes) else expired.stdout or ""
        return subprocess.CompletedProcess(command, -1, output, f"pip did not finish in {timeout:.0f} s")


def prepare_environment(bundle: Path, venv: Path) -> dict[str, Any]:
    """A virtual environment that reuses this Python's packages (torch above all) and holds the bundle's wheels,
    installed offline; returns what was done, ``python`` (the environment's interpreter, or ``None`` when there is
    none to run in) and ``failures`` (one line per part that failed; empty when all went well). The bundle is
    downloaded first if it does not exist. All wheels are installed in one pip call; when that fails, each wheel
    alone, so that one wheel that will not install costs only what needs it.

    ``--system-site-packages`` shares the *base* interpreter's packages; when this Python is itself a virtual
    environment (CI's stand-in for the image), a ``.pth`` file adds its site folders too. pip runs from this
    Python, so the environment needs no pip of its own (no ``ensurepip``).
    """
    import site

    started = time.perf_counter()
    failures: list[str] = []
    record: dict[str, Any] = {"bundle": str(bundle), "downloaded": False, "venv": str(venv), "python": None}
    if not any(bundle.glob("*.whl")):
        try:
            sys.path.insert(0, str(REPO / "scripts"))
            import gpu_bundle

            gpu_bundle.download(bundle, f"{sys.version_info.major}.{sys.version_info.minor}")
            record["downloaded"] = True
        except Exception as error:  # noqa: BLE001 - no internet, no packaging module: recorded, the check goes on
            failures.append(f"downloading the bundle: {type(error).__name__}: {error}"[:ERROR_TAIL])
    wheels = sorted(bundle.glob("*.whl"))
    record.update(wheels=len(wheels), bundle_mib=round(sum(wheel.stat().st_size for wheel in wheels) / MIB, 1))
    python = venv / "bin" / "python"
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--clear", "--without-pip", "--system-site-packages", str(venv)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0 or not python.exists():
        failures.append(f"making the virtual environment {venv}: {_tail(made)}")
    else:
        record["python"] = str(python)
        if sys.prefix != sys.base_prefix:
            found = subprocess.run(
                [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True
            )
            # addsitedir, not a plain path: the .pth files of those folders must be processed too.
            lines = [f"import site; site.addsitedir({folder!r})" for folder in site.getsitepackages()]
            try:
                (Path(found.stdout.strip()) / "gpu_check_base.pth").write_text("\n".join(lines) + "\n")
            except OSError as error:
                failures.append(f"adding this environment's packages to {venv}: {error}")
        not_installed = []
        whole = _install(python, wheels, INSTALL_TIMEOUT_S) if wheels else None
        if whole is not None and whole.returncode == -1:  # pip hung: one by one would hang as long again
            not_installed = [wheel.name for wheel in wheels]
            failures.append(f"installing the bundle: {_tail(whole)}")
        elif whole is not None and whole.returncode != 0:
            for wheel in wheels:
                alone = _install(python, [wheel], WHEEL_TIMEOUT_S)
                if alone.returncode != 0:
                    not_installed.append(wheel.name)
                    failures.append(f"installing {wheel.name}: {_tail(alone)}")
        record["not_installed"] = not_installed
    probe = subprocess.run(
        [record["python"] or sys.executable, "-c", "import torch; print(torch.__version__, torch.__file__)"],
        capture_output=True,
        text=True,
    )
    record["torch"] = probe.stdout.strip() or probe.stderr.strip()[-300:]
    record["failures"] = failures
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record


def _run(command: list[str], stopped: list[int]) -> int:
    """Run ``command``, passing SIGTERM on to it (it then writes its report and ends) and waiting for it."""
    process = subprocess.Popen(command)

    def forward(signum: int, frame: object) -> None:
        stopped.append(signum)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    handled = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, forward) if handled else None
    try:
        return process.wait()
    finally:
        if handled:
            signal.signal(signal.SIGTERM, previous)


def run_in_prepared_environment(options: argparse.Namespace, argv: list[str]) -> int:
    """Prepare the environment from the bundle, then run this check again with its Python; with this Python when
    there is no environment, or when the environment's run ended without a report. The preparation's seconds are
    passed on (``--spent``): the deadline counts them."""
    prepared = prepare_environment(Path(options.bundle).resolve(), Path(options.venv).resolve())
    print(
        f"environment: {prepared['wheels']} wheels ({prepared['bundle_mib']} MiB) installed offline into "
        f"{prepared['venv']} in {prepared['seconds']} s; torch {prepared['torch']}",
        flush=True,
    )
    for failure in prepared["failures"]:
        print(f"environment: FAILED {failure.splitlines()[0] if failure else ''}", flush=True)
    rest = [argument for argument in argv if not argument.startswith(("--bundle", "--venv"))]
    for flag in ("--bundle", "--venv"):  # their values, when given as a separate argument
        if flag in argv:
            rest.remove(argv[argv.index(flag) + 1])
    started = getattr(options, "started", None)

    def spent() -> list[str]:
        return [] if started is None else ["--spent", f"{time.monotonic() - started:.1f}"]

    report = Path(options.out).resolve() / "report.json"
    stopped: list[int] = []
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as record:
        json.dump(prepared, record)
    try:
        if prepared["python"] is not None:
            report.unlink(missing_ok=True)  # one left by an earlier run must not pass for this run's
            code = _run([prepared["python"], str(SCRIPT), *rest, "--prepared", record.name, *spent()], stopped)
            if report.is_file() or stopped:
                return code
            prepared["failures"].append(
                f"the check in {prepared['venv']} ended (exit code {code}) without a report: run with {sys.executable}"
            )
            Path(record.name).write_text(json.dumps(prepared))
        return _run([sys.executable, str(SCRIPT), *rest, "--prepared", record.name, *spent()], stopped)
    finally:
        os.unlink(record.name)
