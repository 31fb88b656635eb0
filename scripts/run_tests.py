"""Run every check the project has, in the order a failure is cheapest to read: lint, format, then pytest.

Called by `make test` (the README's test command, and CI's). Extra arguments go to pytest, e.g.
`.venv/bin/python scripts/run_tests.py -k splitting`.

pytest runs twice: every test not marked ``alone`` on all the machine's cores (pytest-xdist; ``tests/conftest.py``
says how the files are grouped), then the ``alone`` ones (a class on a hub and on Slurm, claims timed by the clock)
one at a time, with the machine to themselves. ``GPULAB_TEST_WORKERS`` sets the first run's workers (default: the
cores, at most 4; 0 runs it in this process).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


NOTO_CJK = "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"
SYSTEM_PACKAGES = {
    # program the tests need -> (Debian packages, what happens without it)
    "/usr/bin/chromium": (("chromium", "chromium-driver"), "the browser test will be skipped"),
    # node and npm: the class hub test installs JupyterHub's proxy (configurable-http-proxy) with npm
    "/usr/bin/npm": (("npm",), "the class hub test will be skipped"),
    "/usr/bin/bwrap": (("bubblewrap",), "every grading test will fail: grading kernels run in a bubblewrap sandbox"),
    # a Japanese font for the browser: without one, Chromium draws the Japanese lessons' text as boxes
    NOTO_CJK: (("fonts-noto-cjk",), "the Japanese browser test will fail (Japanese text drawn as boxes)"),
    # a one-node Slurm cluster (tests/slurm_cluster.py): the class on Slurm's test (tests/test_class_slurm.py)
    "/usr/sbin/slurmctld": (("slurm-wlm", "munge"), "the Slurm class test will be skipped"),
}


def ensure_system_packages() -> None:
    """Install the Debian packages the tests need when missing and this user may (root, as in CI): Chromium and a
    Japanese font (Noto Sans CJK) for the browser tests, npm for the class hub test's proxy, bubblewrap for the grading
    kernels' sandbox (``autograder/sandbox.py``), Slurm and munge for the class on a one-node cluster."""
    missing = {program: spec for program, spec in SYSTEM_PACKAGES.items() if not Path(program).exists()}
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        for program, (packages, consequence) in missing.items():
            print(f"note: {program} is missing; {consequence} (apt-get install {' '.join(packages)})")
        return
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    packages = [package for spec in missing.values() for package in spec[0]]
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=environment)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=environment)


INTERRUPTED = 2  # pytest's exit code when it was stopped
NO_TESTS_COLLECTED = 5  # pytest's exit code when the arguments select no test of a step (e.g. `-k splitting`)


def workers() -> int:
    return int(os.environ.get("GPULAB_TEST_WORKERS", min(4, os.cpu_count() or 1)))


def main(argv: list[str]) -> int:
    ensure_system_packages()
    pytest = [sys.executable, "-m", "pytest", "-ra", "--durations=30"]
    lint = [[str(BIN / "ruff"), "check", "."], [str(BIN / "ruff"), "format", "--check", "."]]
    tests = [
        [*pytest, "-n", str(workers()), "--dist", "loadfile", "-m", "not alone", *argv],
        [*pytest, "-m", "alone", *argv],
    ]
    for step in lint:
        print("+", " ".join(step), flush=True)
        code = subprocess.run(step, cwd=REPO).returncode
        if code != 0:
            return code
    failed = 0
    for step in tests:  # both run: the second's failures are worth reading even when the first had some
        print("+", " ".join(step), flush=True)
        code = subprocess.run(step, cwd=REPO).returncode
        if code == INTERRUPTED or code < 0:  # stopped (Ctrl-C, a signal): the next step does not start
            return code if code > 0 else 128 - code
        if code not in (0, NO_TESTS_COLLECTED):
            failed = code
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
