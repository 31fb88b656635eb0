"""The course environment the class tests share (``tests/test_class_hub.py``, ``tests/test_class_slurm.py``): built
once per test session, as ``class_hub.py setup`` builds one, and handed to each test's ``setup --env``.

The clone is closed to other accounts while it is built (as the class tests close it), so the test environment's
own Python (``sys.prefix``, behind the closed clone, with gpulab installed from it in editable mode) cannot serve the
learners: ``class_hub.shared_env`` then builds a fresh one (``build_env``: a venv from a Python every account can run,
torch, a copy of gpulab with its course extra, JupyterHub, ipykernel and the course's kernel), which is what each
class test's ``setup`` built for itself before. Each test's ``setup`` then takes the given environment (the other
branch of ``shared_env``: checked to run as the class's instructor, JupyterHub added where missing, batchspawner for
a class on Slurm). The environment is in a folder every account can enter, and removed after the session.

``GPULAB_CLASS_TEST_ENV``: a course environment built before (a folder every account can enter), used as it is:
for running one class test again without building one.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def course_environment() -> Path:
    """A course environment every account can run (see the module's docstring)."""
    if os.geteuid() != 0:
        pytest.skip("the class tests make accounts: they need root")
    given = os.environ.get("GPULAB_CLASS_TEST_ENV")
    if given:
        yield Path(given)
        return
    sys.path.insert(0, str(REPO / "scripts"))
    import class_hub

    folder = Path(tempfile.mkdtemp(prefix="class-env-", dir="/tmp"))
    os.chmod(folder, 0o755)
    settings = {**class_hub.DEFAULTS, "instructor": "nobody"}  # any account stands for the class's here
    clone_mode = REPO.stat().st_mode & 0o7777
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PIP_CACHE_DIR", str(folder / "pip-cache"))  # removed with the folder
            os.chmod(REPO, 0o700)
            try:
                built = class_hub.shared_env(settings, folder, Path(sys.prefix))
            finally:
                os.chmod(REPO, clone_mode)
        shutil.rmtree(folder / "pip-cache", ignore_errors=True)
        assert built == folder / "env", f"the closed test environment was used as the course's: {built}"
        yield built
    finally:
        shutil.rmtree(folder, ignore_errors=True)
