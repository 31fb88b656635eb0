"""The wheels the GPU check needs on a bare GPU server image, downloaded here into one folder (``make gpu-bundle``).

A bare GPU server image (a cluster node, a minimal CUDA container) has Python, a CUDA build of torch and a few
packages (``IMAGE_PACKAGES``), and no internet. The GPU check (``scripts/gpu_check.py --bundle DIR``) makes a
virtual environment that reuses that torch (``--system-site-packages``) and installs, offline and exactly, the
wheels of this folder into it. This script fills the folder on a machine with internet::

    make gpu-bundle                                   # GPU_BUNDLE=gpu-bundle, for Python 3.12 on x86_64
    python scripts/gpu_bundle.py DIR [--python-version 3.12] [--platform manylinux_2_28_x86_64 ...]

What goes in: what gpulab imports, the ``course`` and ``test`` extras of ``pyproject.toml`` and all they depend
on, minus what the image has (``IMAGE_PACKAGES`` and their own dependencies), minus what the check never imports
(``NOT_FOR_THE_CHECK``: JupyterLab and the notebook server with their assets, the browser driver, the linter;
``nbgrader`` grades through its Python API, which imports none of them). The folder must stay under
``MAX_BUNDLE_MIB`` so that it travels with the working tree to a GPU machine. ``tests/test_gpu_check.py`` makes a
bundle for this machine's Python and runs the check's dry run with it in a virtual environment that holds only
what the image holds.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
MAX_BUNDLE_MIB = 60
DEFAULT_PYTHON = "3.12"
DEFAULT_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

# What the bare GPU server image provides (with their own dependencies): torch with CUDA, and these.
IMAGE_PACKAGES = ("torch", "numpy", "matplotlib", "pytest", "nvidia-ml-py", "tqdm", "psutil")
# Declared by the course's extras or pulled in by them, never imported by the GPU check.
NOT_FOR_THE_CHECK = (
    "jupyterlab",
    "notebook",
    "jupyterlab-server",
    "jupyter-lsp",
    "notebook-shim",
    "jupyter-builder",
    "babel",
    "json5",
    "async-lru",
    "playwright",
    "ruff",
)


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares it (``Jupyter_Server`` -> ``jupyter-server``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: tuple[str, ...] | list[str]) -> set[str]:
    """The named installed distributions and, transitively, those they require here (markers evaluated, no
    extras): what an image with ``names`` installed holds. Needs them installed in the running environment."""
    environment = default_environment()
    found: set[str] = set()
    queue = [normalise(name) for name in names]
    while queue:
        name = queue.pop()
        if name in found:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found.add(name)
        for text in distribution.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({**environment, "extra": ""}):
                queue.append(normalise(requirement.name))
    return found


def requirements() -> list[str]:
    """gpulab's dependencies and the ``course`` and ``test`` extras, minus the image's and the unneeded."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["course"], *extras["test"]]
    skipped = {normalise(name) for name in (*IMAGE_PACKAGES, *NOT_FOR_THE_CHECK)}
    return [text for text in wanted if normalise(Requirement(text).name) not in skipped]


def wheel_name(path: Path) -> str:
    """The normalised distribution name of a wheel file."""
    return normalise(path.name.split("-")[0])


def download(folder: Path, python_version: str, platforms: tuple[str, ...] = DEFAULT_PLATFORMS) -> list[Path]:
    """Download the bundle's wheels for ``python_version`` into ``folder`` (emptied first); the wheels kept."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    version = python_version.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--dest", str(folder)]
    command += ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    command += [f"--platform={platform}" for platform in platforms]
    command += [f"--abi=cp{version}", "--abi=abi3", "--abi=none"]
    subprocess.run([*command, *requirements()], check=True)
    dropped = closure(IMAGE_PACKAGES) | {normalise(name) for name in NOT_FOR_THE_CHECK}
    kept = []
    for wheel in sorted(folder.glob("*.whl")):
        if wheel_name(wheel) in dropped:
            wheel.unlink()
        else:
            kept.append(wheel)
    return kept


def size_mib(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.glob("*.whl")) / (1024 * 1024)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where the wheels go (emptied first)")
    parser.add_argument("--python-version", default=DEFAULT_PYTHON, help=f"target Python (default {DEFAULT_PYTHON})")
    parser.add_argument("--platform", action="append", help="wheel platform tags (default: manylinux x86_64)")
    options = parser.parse_args(argv)
    wheels = download(options.folder, options.python_version, tuple(options.platform or DEFAULT_PLATFORMS))
    size = size_mib(options.folder)
    print(f"{len(wheels)} wheels, {size:.1f} MiB, for Python {options.python_version}, in {options.folder}")
    if size >= MAX_BUNDLE_MIB:
        print(f"error: the bundle must stay under {MAX_BUNDLE_MIB} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
