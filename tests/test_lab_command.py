"""The README's first command: `make lab` opens JupyterLab on lessons/ (here its headless twin, on a free port),
without nbgrader's instructor tools; `make lab-instructor` opens the course root with them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOKEN = "lab-command-test"
NBGRADER_LAB_EXTENSION = "jupyter-nbgrader"

pytestmark = pytest.mark.timeout(240)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def _make_lab(target: str, workspaces: Path, *extra: str):
    """Run ``make <target>`` on a free port; yield a function that GETs a path of the server as (status, text)."""
    port = _free_port()
    arguments = " ".join([f"--IdentityProvider.token={TOKEN}", f"--LabApp.workspaces_dir={workspaces}", *extra])
    server = subprocess.Popen(
        ["make", "--no-print-directory", target, f"PORT={port}", f"LAB_ARGS={arguments}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def get(path: str) -> tuple[int, str]:
        separator = "&" if "?" in path else "?"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}{separator}token={TOKEN}", timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, ""

    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                get("/api/status")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(server.stdout.read().decode()[-3000:]) from None
                time.sleep(0.5)
        yield get
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _lab_extensions(get) -> dict[str, bool]:
    status, text = get("/lab/api/extensions")
    assert status == 200, status
    return {extension["name"]: extension["enabled"] for extension in json.loads(text)}


def test_make_lab_headless_serves_the_lessons_with_the_course_kernel_and_no_instructor_tools(tmp_path):
    with _make_lab("lab-headless", tmp_path) as get:
        names = {item["name"] for item in json.loads(get("/api/contents")[1])["content"]}
        assert "01_splitting" in names, names
        assert "python3" in json.loads(get("/api/kernelspecs")[1])["kernelspecs"]
        extensions = _lab_extensions(get)
        assert extensions.get("jupyter-widgets-jupyterlab-manager") is True, "ipywidgets' extension is installed"
        assert extensions.get(NBGRADER_LAB_EXTENSION) is False, "no nbgrader menu, Validate or Create Assignment"
        assert get("/formgrader")[0] == 404, "no Formgrader in the learner's JupyterLab"


def test_make_lab_instructor_opens_the_course_root_with_nbgrader(tmp_path):
    with _make_lab("lab-instructor", tmp_path, "--no-browser", "--ip=127.0.0.1") as get:
        names = {item["name"] for item in json.loads(get("/api/contents")[1])["content"]}
        assert {"source", "lessons", "autograder"} <= names, names
        assert _lab_extensions(get).get(NBGRADER_LAB_EXTENSION) is True
        status, page = get("/formgrader")
        assert status == 200 and "formgrader" in page.lower(), "Formgrader is served"
