"""Run every check the project has, in the order a failure is cheapest to read: lint, format, then pytest.

Called by `make test` (the README's test command, and CI's). Extra arguments go to pytest, e.g.
`.venv/bin/python scripts/run_tests.py -k splitting`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def ensure_browser() -> None:
    """The browser test drives Debian's Chromium: install it when missing and this user may (root, as in CI)."""
    if Path("/usr/bin/chromium").exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print("note: /usr/bin/chromium is missing; the browser test will be skipped (apt-get install chromium)")
        return
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=environment)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"], check=True, env=environment)


def main(argv: list[str]) -> int:
    ensure_browser()
    steps = [
        [str(BIN / "ruff"), "check", "."],
        [str(BIN / "ruff"), "format", "--check", "."],
        [sys.executable, "-m", "pytest", "-ra", "--durations=15", *argv],
    ]
    for step in steps:
        print("+", " ".join(step), flush=True)
        code = subprocess.run(step, cwd=REPO).returncode
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
