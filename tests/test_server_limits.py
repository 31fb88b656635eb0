"""A learner's server runs under limits it cannot lift (``jupyter/hub/server_limits.py``): its memory, CPU and
process limits are in a control group it enters before dropping to the learner's account, one file is at most the
file-size limit, and the NVIDIA device nodes of other learners' GPUs cannot be opened, whatever
``CUDA_VISIBLE_DEVICES`` says. The GPUs are fake device nodes (``mknod``, the NVIDIA driver's major number 195):
without a driver, opening an allowed node fails with ENXIO, a denied one with EPERM."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "jupyter" / "hub"))

from server_limits import NVIDIA_MAJOR, Limits, preexec, server_group  # noqa: E402

from tests.class_entries import LEARNERS_PYTHON  # noqa: E402

PROBE = """
import errno, json, os, sys
opened = {}
for node in sys.argv[1:]:
    try:
        os.close(os.open(node, os.O_RDONLY))
        opened[node] = "opened"
    except OSError as error:
        opened[node] = errno.errorcode[error.errno]
try:
    with open(os.path.join(os.environ["SCRATCH"], "big"), "wb") as handle:
        handle.write(b"x" * (2 << 20))
    big = "written"
except OSError as error:
    big = errno.errorcode[error.errno]
print(json.dumps({"opened": opened, "big": big, "uid": os.getuid(), "cgroup": open("/proc/self/cgroup").read()}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="control groups and device nodes need root")
def test_a_server_gets_its_limits_and_only_its_own_gpus():
    folder = Path(tempfile.mkdtemp(prefix="gpulab-nodes-", dir="/tmp"))  # one the probe's account can enter
    os.chmod(folder, 0o755)
    nodes = []
    for minor in range(4):
        node = folder / f"nvidia{minor}"
        os.mknod(node, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, minor))
        nodes.append(str(node))
    scratch = folder / "scratch"
    scratch.mkdir(mode=0o777)
    os.chmod(scratch, 0o777)
    limits = Limits(memory=300 << 20, cpus=0.5, tasks=64, file_size=1 << 20)
    name = f"gpulab-test-{secrets.token_hex(3)}"
    group = server_group(name, limits, allowed_gpus=[2, 3], gpu_count=4, minors=[0, 1, 2, 3])
    try:
        assert {"memory", "processes", "file size", "gpus"} <= set(group.enforced), group.advised

        def as_nobody():
            os.setgid(65534)
            os.setuid(65534)

        done = subprocess.run(
            [LEARNERS_PYTHON, "-c", PROBE, *nodes],
            preexec_fn=preexec(group, limits, as_nobody),
            env={"SCRATCH": str(scratch), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["uid"] == 65534
        # another learner's GPUs: refused by the kernel; the learner's own: only the missing driver answers
        assert [seen["opened"][node] for node in nodes] == ["EPERM", "EPERM", "ENXIO", "ENXIO"]
        assert seen["big"] == "EFBIG"
        assert f"/{name}" in seen["cgroup"]
        memory = group.group.folders["unified" if group.group.version == 2 else "memory"]
        limit_file = "memory.max" if group.group.version == 2 else "memory.limit_in_bytes"
        assert int((memory / limit_file).read_text()) == limits.memory
        tasks = group.group.folders["unified" if group.group.version == 2 else "pids"]
        assert int((tasks / "pids.max").read_text()) == limits.tasks
        if "cpu" in group.enforced and group.group.version == 1:
            assert int((group.group.folders["cpu"] / "cpu.cfs_quota_us").read_text()) == 50_000
    finally:
        group.remove()
        shutil.rmtree(folder)
    assert group.devices is None or not group.devices.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="control groups need root")
def test_a_group_left_by_an_earlier_server_is_replaced():
    name = f"gpulab-test-{secrets.token_hex(3)}"
    limits = Limits(memory=200 << 20, cpus=1, tasks=32, file_size=1 << 20)
    first = server_group(name, limits, [0], 2, minors=[0, 1])
    second = server_group(name, limits, [1], 2, minors=[0, 1])  # the hub restarted: the old group is gone first
    try:
        assert second.devices is None or second.devices.is_dir()
    finally:
        second.remove()
        first.remove()
