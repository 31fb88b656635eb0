"""What a sandboxed grading kernel needs to use the GPUs the grader sees (``autograder/sandbox.py``), checked on a
machine without any: the driver's libraries where an image finds them only through ``LD_LIBRARY_PATH``, one GPU
order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML's), the ``/dev/nvidia-uvm`` node that appears only at the first CUDA
initialisation after boot, and a grader that stops, saying why, when a sandboxed kernel sees fewer GPUs than it.
Device nodes, the driver's tool and GPU counts are simulated; nothing here ran on a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autograder import grade, sandbox  # noqa: E402

PRINT_ENVIRONMENT = """
import json, os, sys
folder = sys.argv[1]
print(json.dumps({
    "library_path": os.environ.get("LD_LIBRARY_PATH"),
    "order": os.environ.get("CUDA_DEVICE_ORDER"),
    "listing": sorted(os.listdir(folder)) if os.path.isdir(folder) else None,
}))
"""


def _needs_a_sandbox():
    reason = sandbox.unavailable_reason()
    if reason:
        pytest.skip(reason)


def test_a_kernel_gets_the_driver_library_folders_and_the_drivers_gpu_order(tmp_path, monkeypatch):
    _needs_a_sandbox()
    libraries = tmp_path / "nvidia" / "lib64"
    libraries.mkdir(parents=True)
    (libraries / "libcuda.so.1").write_text("a stand-in for the driver's library")
    inside_repository = REPO / "utils"
    monkeypatch.setattr(sandbox, "LIBRARY_ROOTS", (*sandbox.LIBRARY_ROOTS, tmp_path, REPO))
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{libraries}:relative/lib:/nonexistent:{inside_repository}")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")  # the grader's own setting never reaches a kernel
    workdir = tmp_path / "work"
    workdir.mkdir()
    uid = sandbox.kernel_uid()
    sandbox.give_to_kernel(workdir, uid=uid)
    argv = sandbox.command(
        [sys.executable, "-I", "-c", PRINT_ENVIRONMENT, str(libraries)],
        workdir=workdir,
        writable=[workdir],
        environment=sandbox.kernel_environment({}, workdir),
        uid=uid,
    )
    import subprocess

    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # only an existing absolute folder under a library root, never one inside the repository
    assert seen == {"library_path": str(libraries), "order": "PCI_BUS_ID", "listing": ["libcuda.so.1"]}


def test_the_uvm_node_is_made_before_the_first_kernel_or_the_grader_says_why(tmp_path, monkeypatch):
    dev = tmp_path / "dev"
    dev.mkdir()
    calls = []

    def driver_tool_that_works(command, **options):
        calls.append(command)
        (dev / "nvidia-uvm").touch()

    def driver_tool_that_fails(command, **options):
        calls.append(command)

    assert sandbox.gpu_nodes_reason(0, dev, driver_tool_that_works) is None and calls == []
    assert sandbox.gpu_nodes_reason(2, dev, driver_tool_that_works) is None
    assert len(calls) == 1 and (dev / "nvidia-uvm").exists()
    assert sandbox.gpu_nodes_reason(2, dev, driver_tool_that_works) is None and len(calls) == 1  # there already
    (dev / "nvidia-uvm").unlink()
    monkeypatch.setattr(
        sandbox.shutil, "which", lambda name: "/usr/bin/nvidia-modprobe" if "modprobe" in name else None
    )
    reason = sandbox.gpu_nodes_reason(2, dev, driver_tool_that_fails)
    assert calls[-1] == ["/usr/bin/nvidia-modprobe", "-u", "-c=0"]
    assert reason is not None and "nvidia-uvm" in reason and "2 GPU" in reason


@pytest.mark.slow
def test_the_grader_stops_when_a_sandboxed_kernel_sees_fewer_gpus_than_it(tmp_path, monkeypatch, capsys):
    """Here the grader is told of two GPUs the kernels cannot have (this machine has none): a real sandboxed
    kernel counts them with torch and sees none, and grading stops before any submission, saying so."""
    _needs_a_sandbox()
    assert "sees 0" in sandbox.kernels_gpus_reason(["0", "1"])
    monkeypatch.setattr(grade.limits_module, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(sandbox, "gpu_nodes_reason", lambda gpus: None)
    submissions = tmp_path / "submissions"
    (submissions / "alice" / "01_splitting").mkdir(parents=True)
    assert grade.main([str(submissions), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "cannot grade on the GPUs" in error and "sees 0" in error
    assert not (tmp_path / "out").exists()
