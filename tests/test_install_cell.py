"""The install cell every lesson ships (Colab, Kaggle): it installs gpulab where it is missing, from the repository
named in pyproject.toml, and does nothing where gpulab is installed.

The cell tested is the real one, read from the committed lesson 01 notebook. It runs, offline, in a new virtual
environment that sees this environment's packages (torch, matplotlib, ...) but not gpulab, as a Colab runtime
would: a ``.pth`` file in the new environment's site-packages lists this environment's site-packages. Python
adds such a line to ``sys.path`` without processing the ``.pth`` files found there, so gpulab's editable-install
hook (``__editable__.gpulab-*.pth``) stays out and ``import gpulab`` fails until the cell has run.

``GPULAB_SOURCE`` points the cell at a local git repository holding this repository's committed HEAD, and pip
runs offline: ``PIP_NO_INDEX=1``, and ``PIP_NO_BUILD_ISOLATION=0``, which (pip reads ``no-`` options from the
environment inverted) *disables* build isolation, so the build uses the setuptools already installed instead of
downloading one. The local repository is a fresh one-commit repository made from ``git archive HEAD``, not a
``git clone --depth 1``: pip clones with ``--filter=blob:none``, which a shallow source answers with one failed
fetch per object (minutes instead of a second).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import time
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LESSON = REPO / "lessons" / "01_splitting" / "01_splitting.ipynb"
DDP_LESSON = REPO / "lessons" / "02_gradient_averaging" / "02_gradient_averaging.ipynb"
UNREACHABLE = "gpulab @ git+https://127.0.0.1:9/nowhere.git"
INSTALL_LINE = re.compile(r"^Installing gpulab on (?P<where>.+) … \(once per session\)$")

pytestmark = pytest.mark.timeout(300)


def shipped_install_cell(notebook: Path = LESSON) -> str:
    """The source of the install cell in a committed lesson notebook (exactly one such cell); lesson 01's unless
    told otherwise."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = [
        "".join(cell["source"])
        for cell in cells
        if cell["cell_type"] == "code" and "GPULAB_SOURCE" in "".join(cell["source"])
    ]
    assert len(found) == 1, f"{notebook.name} must hold one install cell, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def cell_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cell") / "install_cell.py"
    path.write_text(shipped_install_cell(), encoding="utf-8")
    return path


def clean_environment(**variables: str) -> dict[str, str]:
    """This process's environment without pip settings, Python path overrides or a platform's markers, plus
    the offline pip settings and ``variables``."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", "GPULAB_SOURCE")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in dropped}
    environment.update(
        PIP_CONFIG_FILE=os.devnull,  # no pip.conf: no index, find-links or constraints from this machine
        PIP_NO_INDEX="1",
        PIP_NO_BUILD_ISOLATION="0",  # inverted: build with the installed setuptools (module docstring)
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONNOUSERSITE="1",
        GIT_TERMINAL_PROMPT="0",
    )
    environment.update(variables)
    return environment


def run(python: Path | str, *args: str, cwd: Path, **variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=clean_environment(**variables), capture_output=True, text=True, timeout=240
    )


def this_environments_site_packages() -> list[str]:
    return list(dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]))


def bare_environment(folder: Path) -> tuple[Path, Path]:
    """A new virtual environment that sees this environment's packages but not gpulab: (python, site-packages)."""
    venv.create(folder, with_pip=False, symlinks=True)
    python = folder / "bin" / "python"
    probe = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site_packages = Path(run(python, "-c", probe, cwd=folder).stdout.strip())
    assert site_packages.is_relative_to(folder), site_packages
    (site_packages / "course-environment.pth").write_text("\n".join(this_environments_site_packages()) + "\n")
    seen = run(python, "-c", "import importlib.util, torch; print(importlib.util.find_spec('gpulab'))", cwd=folder)
    assert seen.returncode == 0, seen.stderr  # torch (and the rest) is visible ...
    assert seen.stdout.strip() == "None", seen.stdout  # ... gpulab is not: the editable hook was not processed
    return python, site_packages


def committed_repository(folder: Path) -> Path:
    """A one-commit git repository holding the files of this repository's committed HEAD."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the install cell installs from a git repository made from HEAD")
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    identity = ["-c", "user.name=gpulab tests", "-c", "user.email=tests@localhost", "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-q", "-m", "HEAD of the course"]):
        subprocess.run(["git", "-C", str(folder), *command], check=True, capture_output=True)
    return folder


def listing(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}


# --------------------------------------------------------------------------------------------- static
def test_the_cell_installs_from_the_repository_pyproject_names():
    urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]
    source = shipped_install_cell()
    assert f'"gpulab @ git+{urls["Repository"]}"' in source
    assert source.startswith("# @title "), "Colab shows the first line, a # @title comment, as the form's title"
    assert not re.search(r"^\s*[%!]", source, re.MULTILINE), "no IPython magics: the cell is plain Python"
    owner_and_name = urls["Repository"].removeprefix("https://github.com/")
    lessons_url = f"https://raw.githubusercontent.com/{owner_and_name}/main/lessons"
    assert f'"GPULAB_LESSONS_URL", "{lessons_url}"' in shipped_install_cell(DDP_LESSON)


# --------------------------------------------------------------------------------------------- behaviour
def test_does_nothing_where_gpulab_is_installed(cell_file, tmp_path):
    """This environment has gpulab: the cell prints nothing and never calls pip (an unreachable source would fail)."""
    result = run(sys.executable, str(cell_file), cwd=tmp_path, GPULAB_SOURCE=UNREACHABLE)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.slow
def test_unreachable_source_fails_clearly_and_quickly(cell_file, tmp_path):
    python, site_packages = bare_environment(tmp_path / "venv")
    before = listing(site_packages)
    started = time.perf_counter()
    result = run(python, str(cell_file), cwd=tmp_path, GPULAB_SOURCE=UNREACHABLE, KAGGLE_KERNEL_RUN_TYPE="Interactive")
    seconds = time.perf_counter() - started
    assert result.returncode != 0
    assert INSTALL_LINE.match(result.stdout.strip()).group("where") == "Kaggle", result.stdout
    # The message (the error's first line, then the fix, then pip's last lines) ends the output.
    message = result.stderr[result.stderr.index("RuntimeError: ") :].splitlines()
    assert (
        message[0]
        == f"RuntimeError: Could not install gpulab from {UNREACHABLE}: no internet, or the repository is unreachable."
    )
    assert (
        message[1]
        == "To fix: turn Internet on (Settings → Internet → On), then run this cell again. The last lines from pip:"
    )
    pip_said = message[2:]
    assert 0 < len(pip_said) <= 5 and any("127.0.0.1" in line for line in pip_said), "pip's last lines say what failed"
    assert "pip/_internal" not in result.stderr, "a clear message, not pip's traceback"
    assert listing(site_packages) == before, "a failed install installs nothing"
    assert seconds < 30, f"failing took {seconds:.1f} s"


def test_a_python_older_than_gpulab_supports_is_named_as_the_reason(tmp_path):
    """The cell compares the runtime's Python with pyproject's requires-python before calling pip, and says so,
    instead of pip's refusal reading as "no internet". Shown with the floor raised past this Python."""
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    shipped = shipped_install_cell()
    assert f'floor = "{requires.removeprefix(">=")}"' in shipped
    cell = tmp_path / "install_cell.py"
    cell.write_text(re.sub(r'floor = "[\d.]+"', 'floor = "99.0"', shipped), encoding="utf-8")
    python, _ = bare_environment(tmp_path / "venv")
    result = run(python, str(cell), cwd=tmp_path, GPULAB_SOURCE=UNREACHABLE)
    assert result.returncode != 0 and result.stdout == ""  # pip was never started
    have = ".".join(map(str, sys.version_info[:3]))
    message = result.stderr[result.stderr.index("RuntimeError: ") :].splitlines()
    assert message[:2] == [
        f"RuntimeError: gpulab needs Python 99.0 or newer; this runtime has Python {have}.",
        "To fix: choose a runtime or image with a newer Python, then run this cell again.",
    ]


@pytest.fixture(scope="module")
def installed(cell_file, tmp_path_factory):
    """A bare environment after the install cell ran once with the repository's committed HEAD as the source."""
    folder = tmp_path_factory.mktemp("install")
    # file://localhost/...: the packaging library of older pips (23.x, what Python 3.11's venv brings) refuses a
    # file URL with an empty host (file:///...) in a requirement.
    source = f"gpulab @ git+file://localhost{committed_repository(folder / 'repository')}"
    python, site_packages = bare_environment(folder / "venv")
    before = listing(site_packages)
    course_environment = {path: listing(Path(path)) for path in this_environments_site_packages()}
    started = time.perf_counter()
    result = run(python, str(cell_file), cwd=folder, GPULAB_SOURCE=source)
    seconds = time.perf_counter() - started
    print(f"the install cell installed gpulab offline in {seconds:.1f} s")
    return {
        "python": python,
        "site_packages": site_packages,
        "before": before,
        "course_environment": course_environment,
        "result": result,
        "source": source,
        "folder": folder,
    }


@pytest.mark.slow
def test_installs_gpulab_from_the_repository(installed):
    result = installed["result"]
    assert result.returncode == 0, result.stdout + result.stderr
    first, last = result.stdout.strip().splitlines()
    assert INSTALL_LINE.match(first).group("where") == "this Jupyter", first
    assert last == f"gpulab installed: {installed['source']}"
    added = listing(installed["site_packages"]) - installed["before"]
    # gpulab, and self-study's solutions beside it (a class's environment has gpulab alone)
    wanted = {"gpulab", "gpulab-0.1.0.dist-info", "gpulab_solutions", "gpulab_solutions-0.1.0.dist-info"}
    assert added == wanted, f"pip installed other than gpulab and its solutions: {added}"
    for path, names in installed["course_environment"].items():
        assert listing(Path(path)) == names, f"the install touched {path}"

    probe = "import gpulab; print(gpulab.__file__); devices = gpulab.devices(2, quiet=True); print(len(devices))"
    probe += "; from gpulab import check; check.solution('chunk_sizes', confirm=True)"
    used = run(installed["python"], "-c", probe, cwd=installed["folder"])
    assert used.returncode == 0, used.stderr
    module_file, device_count = used.stdout.split()[:2]
    assert "def chunk_sizes" in used.stdout, used.stdout
    assert Path(module_file).resolve().is_relative_to(installed["site_packages"].resolve()), module_file
    assert device_count == "2"


@pytest.mark.slow
def test_running_it_again_does_nothing(installed, cell_file):
    """Once gpulab is installed the cell is silent and calls no pip: an unreachable source would make pip fail."""
    assert installed["result"].returncode == 0, installed["result"].stderr
    again = run(installed["python"], str(cell_file), cwd=installed["folder"], GPULAB_SOURCE=UNREACHABLE)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")


# --------------------------------------------------------------------------------------------- the lesson's files
@pytest.fixture()
def ddp_cell_file(tmp_path) -> Path:
    path = tmp_path / "install_cell.py"
    path.write_text(shipped_install_cell(DDP_LESSON), encoding="utf-8")
    return path


def test_fetches_the_lessons_module_where_it_is_missing(ddp_cell_file, tmp_path):
    """Colab opens the notebook alone: the cell puts lesson 02's DDP module next to it, once, byte for byte."""
    workdir = tmp_path / "content"
    workdir.mkdir()
    lessons_url = (REPO / "lessons").as_uri()
    first = run(sys.executable, str(ddp_cell_file), cwd=workdir, GPULAB_LESSONS_URL=lessons_url)
    assert (first.returncode, first.stdout, first.stderr) == (0, "downloaded ddp_averaging.py\n", "")
    shipped = REPO / "lessons" / "02_gradient_averaging" / "ddp_averaging.py"
    assert (workdir / "ddp_averaging.py").read_bytes() == shipped.read_bytes()
    again = run(sys.executable, str(ddp_cell_file), cwd=workdir, GPULAB_LESSONS_URL=(tmp_path / "nowhere").as_uri())
    assert (again.returncode, again.stdout, again.stderr) == (0, "", ""), "a file that is there is not fetched again"


def test_a_lesson_opened_from_its_folder_fetches_nothing(ddp_cell_file):
    folder = DDP_LESSON.parent
    result = run(sys.executable, str(ddp_cell_file), cwd=folder, GPULAB_LESSONS_URL=(folder / "nowhere").as_uri())
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_an_unreachable_lesson_file_fails_clearly_and_leaves_nothing(ddp_cell_file, tmp_path):
    missing = (tmp_path / "nowhere").as_uri()
    result = run(sys.executable, str(ddp_cell_file), cwd=tmp_path, GPULAB_LESSONS_URL=missing)
    assert result.returncode != 0
    message = result.stderr[result.stderr.index("RuntimeError: ") :].splitlines()
    assert message[0].startswith(f"RuntimeError: Could not download {missing}/02_gradient_averaging/ddp_averaging.py")
    assert message[1] == "To fix: check the internet connection, then run this cell again."
    assert not (tmp_path / "ddp_averaging.py").exists(), "no partial file is left to be mistaken for the module"


# --------------------------------------------------------------------------------------------- the Japanese edition
JA_DDP_LESSON = REPO / "lessons" / "ja" / "02_gradient_averaging" / "02_gradient_averaging.ipynb"


@pytest.fixture()
def ja_ddp_cell_file(tmp_path) -> Path:
    if not JA_DDP_LESSON.is_file():
        pytest.fail(f"{JA_DDP_LESSON.relative_to(REPO)} is missing: run `make lessons`")
    path = tmp_path / "install_cell.py"
    path.write_text(shipped_install_cell(JA_DDP_LESSON), encoding="utf-8")
    return path


def test_the_japanese_cell_sets_the_language_and_fetches_from_the_japanese_edition(ja_ddp_cell_file, tmp_path):
    source = ja_ddp_cell_file.read_text(encoding="utf-8")
    assert source.startswith("# @title gpulabとこのレッスンのファイルをインストール")
    assert 'os.environ["GPULAB_LANGUAGE"] = "ja"' in source
    assert "/main/lessons/ja" in source
    workdir = tmp_path / "content"
    workdir.mkdir()
    first = run(
        sys.executable, str(ja_ddp_cell_file), cwd=workdir, GPULAB_LESSONS_URL=(REPO / "lessons" / "ja").as_uri()
    )
    assert (first.returncode, first.stdout, first.stderr) == (0, "ddp_averaging.pyをダウンロードしました\n", "")
    shipped = REPO / "lessons" / "ja" / "02_gradient_averaging" / "ddp_averaging.py"
    assert (workdir / "ddp_averaging.py").read_bytes() == shipped.read_bytes()


def test_the_japanese_cell_says_what_failed_in_japanese(ja_ddp_cell_file, tmp_path):
    missing = (tmp_path / "nowhere").as_uri()
    result = run(sys.executable, str(ja_ddp_cell_file), cwd=tmp_path, GPULAB_LESSONS_URL=missing)
    assert result.returncode != 0
    message = result.stderr[result.stderr.index("RuntimeError: ") :].splitlines()
    assert message[0].startswith(
        f"RuntimeError: {missing}/02_gradient_averaging/ddp_averaging.pyをダウンロードできません"
    )
    assert message[1] == "対処法：インターネット接続を確認してください。そのあと、このセルをもう一度実行してください。"
    assert not (tmp_path / "ddp_averaging.py").exists()
