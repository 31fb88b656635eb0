"""``--bundle``: a virtual environment that reuses this Python's torch and gets the bundle's wheels, offline."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpucheck.context import MIB, REPO, SCRIPT


def prepare_environment(bundle: Path, venv: Path) -> dict[str, Any]:
    """A virtual environment that reuses this Python's packages (torch above all) and holds exactly the bundle's
    wheels, installed offline; returns what was done. The bundle is downloaded first if it does not exist.

    ``--system-site-packages`` shares the *base* interpreter's packages; when this Python is itself a virtual
    environment (CI's stand-in for the image), a ``.pth`` file adds its site folders too. pip runs from this
    Python (``pip --python``, pip 22.3 or later), so the environment needs no pip of its own (no ``ensurepip``).
    """
    import site

    started = time.perf_counter()
    downloaded = False
    if not any(bundle.glob("*.whl")):
        sys.path.insert(0, str(REPO / "scripts"))
        import gpu_bundle

        gpu_bundle.download(bundle, f"{sys.version_info.major}.{sys.version_info.minor}")
        downloaded = True
    wheels = sorted(bundle.glob("*.whl"))
    subprocess.run(
        [sys.executable, "-m", "venv", "--clear", "--without-pip", "--system-site-packages", str(venv)], check=True
    )
    python = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        found = subprocess.run(
            [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True
        )
        target = Path(found.stdout.decode().strip())
        # addsitedir, not a plain path: the .pth files of those folders must be processed too.
        lines = [f"import site; site.addsitedir({folder!r})" for folder in site.getsitepackages()]
        (target / "gpu_check_base.pth").write_text("\n".join(lines) + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-deps"]
    install += ["--quiet", "--no-compile", "--disable-pip-version-check", *map(str, wheels)]
    subprocess.run(install, check=True)
    torch = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__, torch.__file__)"], capture_output=True, text=True
    )
    return {
        "bundle": str(bundle),
        "downloaded": downloaded,
        "wheels": len(wheels),
        "bundle_mib": round(sum(wheel.stat().st_size for wheel in wheels) / MIB, 1),
        "venv": str(venv),
        "torch": torch.stdout.strip() or torch.stderr.strip()[-300:],
        "seconds": round(time.perf_counter() - started, 1),
    }


def run_in_prepared_environment(options: argparse.Namespace, argv: list[str]) -> int:
    """Prepare the environment from the bundle, then run this check again with its Python."""
    prepared = prepare_environment(Path(options.bundle).resolve(), Path(options.venv).resolve())
    print(
        f"environment: {prepared['wheels']} wheels ({prepared['bundle_mib']} MiB) installed offline into "
        f"{prepared['venv']} in {prepared['seconds']} s; torch {prepared['torch']}",
        flush=True,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as record:
        json.dump(prepared, record)
    rest = [argument for argument in argv if not argument.startswith(("--bundle", "--venv"))]
    for flag in ("--bundle", "--venv"):  # their values, when given as a separate argument
        if flag in argv:
            rest.remove(argv[argv.index(flag) + 1])
    command = [str(Path(options.venv).resolve() / "bin" / "python"), str(SCRIPT), *rest]
    try:
        return subprocess.run([*command, "--prepared", record.name]).returncode
    finally:
        os.unlink(record.name)
