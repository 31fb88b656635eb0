"""Create the course's virtual environment: torch first, then gpulab with its course and test extras and the package
of solutions (self-study's ``gpulab.check.solution``, the grader's references), then the kernel.

Called by `make env` (and so by `make lab` and `make test`). torch is installed on its own, before anything
that depends on it, so that the exact build asked for (`--torch`, default the pinned CPU/CUDA wheel) wins
over whatever a dependency resolver would pick.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the Makefile's TORCH_SPEC; a GPU box passes its CUDA build with --torch
# the kernel the lessons and nbgrader run on: the environment's python, named python3 as in the notebooks
KERNEL_INSTALL = (
    "-m",
    "ipykernel",
    "install",
    "--sys-prefix",
    "--name",
    "python3",
    "--display-name",
    "Python 3 (gpulab)",
)


def run(*command: str) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=REPO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--venv", default=".venv", help="where to create the environment")
    parser.add_argument("--torch", default=TORCH, help="the torch requirement to install first")
    args = parser.parse_args()

    env_dir = REPO / args.venv
    python = env_dir / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(env_dir)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    has_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0
    if not has_torch:
        run(*pip, args.torch)
    # gpulab itself needs only torch, NVML, matplotlib, ipywidgets and tqdm (what Colab and Kaggle install); the
    # course extra adds JupyterLab and nbgrader, the test extra pytest and the tools the tests drive.
    run(*pip, "-e", ".[course,test]")
    # self-study's solutions, references and the grader's hidden draws (never in a class's environment)
    run(*pip, "-e", "solutions")
    run(str(python), *KERNEL_INSTALL)
    print(f"Environment ready: {env_dir}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
