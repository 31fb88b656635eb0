"""Run every check the project has, in the order a failure is cheapest to read: lint, format, then pytest.

Called by `make test` (the README's test command, and CI's). Extra arguments go to pytest, e.g.
`.venv/bin/python scripts/run_tests.py -k splitting`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def main(argv: list[str]) -> int:
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
