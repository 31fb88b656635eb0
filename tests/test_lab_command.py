"""The README's first command: `make lab` opens JupyterLab on lessons/ (here its headless twin, on a free port)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_make_lab_headless_serves_the_lessons_with_the_course_kernel(tmp_path):
    port = _free_port()
    token = "lab-command-test"
    extra = f"--IdentityProvider.token={token} --LabApp.workspaces_dir={tmp_path}"
    server = subprocess.Popen(
        ["make", "--no-print-directory", "lab-headless", f"PORT={port}", f"LAB_ARGS={extra}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}", timeout=2) as reply:
                    contents = json.load(reply)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(server.stdout.read().decode()[-3000:]) from None
                time.sleep(0.5)
        names = {item["name"] for item in contents["content"]}
        assert "01_splitting" in names, names
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/kernelspecs?token={token}", timeout=5) as reply:
            kernelspecs = json.load(reply)
        assert "python3" in kernelspecs["kernelspecs"], kernelspecs
        assert (
            "widgets"
            in urllib.request.urlopen(f"http://127.0.0.1:{port}/lab/api/extensions?token={token}", timeout=5)
            .read()
            .decode()
        ), "ipywidgets' JupyterLab extension is installed"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
