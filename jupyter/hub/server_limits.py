"""Limits a learner's server cannot lift: memory, CPU, processes, file size, and which GPUs it may open.

Each server (and everything it starts: kernels, DDP ranks, shells) runs in a control group of its own, made by
the hub as root before the server starts and entered by the server's process before it drops to the learner's
account (``preexec``), with the cgroup code the grader already uses (``autograder/cgroups.py``):

* **memory**: a hard limit, swap included where the host accounts for it (the kernel's OOM killer ends what
  exceeds it, inside that server only);
* **CPU**: a quota of ``cpus`` cores (cgroup v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``) where the ``cpu``
  controller is there to use; otherwise an equal share only (named by ``ServerGroup.enforced``);
* **processes**: ``pids.max`` (processes and threads);
* **file size**: ``RLIMIT_FSIZE``, so one file (in the home, ``/tmp``, the exchange) is at most ``file_size``
  bytes; the total a learner keeps on disk needs file-system quotas (``setquota``), which only the admin can set;
* **shared memory that outlives the server**: a file in ``/dev/shm`` (or a System V segment) is memory charged to
  the group while the server runs, but it would outlive the server and, once the group is removed, be charged to
  its parent, which has no limit: each restart could pin one more memory limit. So each server gets a mount and an
  IPC namespace of its own, with a private ``/dev/shm`` (tmpfs, at most the memory limit) that ends with it;
* **GPUs**: on cgroup v1 (the ``devices`` controller), the group's device rules deny every device and then allow
  all but the NVIDIA GPUs' major number (195) and the driver's MIG capabilities' (``nvidia-caps``), and of those
  only the learner's GPUs, the driver's control nodes (``nvidiactl``, ``nvidia-modeset``) and the capabilities of
  the learner's own MIG instances (two learners on instances of one GPU share its node, not their instances):
  setting ``CUDA_VISIBLE_DEVICES`` to every GPU opens none of the others, and a
  GPU count that came out too low hides GPUs rather than opening them. cgroup v2 has no device files (its device
  rules are BPF programs, which systemd writes for a unit's ``DeviceAllow=``): there ``CUDA_VISIBLE_DEVICES`` stays
  advice, ``ServerGroup.enforced`` says so, and ``docs/instructors.md`` names the spawners that enforce it
  (systemdspawner, Slurm's ``ConstrainDevices``).

Tested with fake device nodes (``tests/test_server_limits.py``): no GPU ran it.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gpu_pairs import Device  # noqa: E402

from autograder import cgroups  # noqa: E402

NVIDIA_MAJOR = 195  # /dev/nvidia<minor> (the driver's fixed major; nvidiactl is 195:255, nvidia-modeset 195:254)
NVIDIA_CONTROL = (254, 255)  # nvidia-modeset, nvidiactl: every CUDA process opens them
CHAR_MAJORS = 4096  # Linux's character device majors (12 bits), each allowed but the GPUs'
CPU_PERIOD_US = 100_000
GiB = 1 << 30


@dataclass
class Limits:
    memory: int = 8 * GiB
    cpus: float = 2.0
    tasks: int = 1024
    file_size: int = 2 * GiB


@dataclass
class ServerGroup:
    """The group a learner's server runs in, and what of ``Limits`` it enforces on this host."""

    group: cgroups.Group | None
    devices: Path | None = None  # the v1 ``devices`` folder, where GPU nodes are denied
    enforced: list[str] = field(default_factory=list)
    advised: list[str] = field(default_factory=list)

    def procs_files(self) -> list[str]:
        files = self.group.procs_files() if self.group is not None else []
        return files + ([str(self.devices / "cgroup.procs")] if self.devices is not None else [])

    def remove(self) -> None:
        if self.group is not None:
            self.group.remove()
        if self.devices is not None:
            try:
                self.devices.rmdir()
            except OSError:
                pass


def _devices_mount(mounts: Path = cgroups.MOUNTS) -> Path | None:
    for line in Path(mounts).read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and "devices" in fields[3].split(","):
            return Path(fields[1])
    return None


def gpu_minors(gpu_count: int) -> list[int]:
    """The device minor number of each GPU, in the order the hub numbers them (NVML's, by PCI bus id: the order
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` gives CUDA too); without NVML, GPU ``i`` is ``/dev/nvidia<i>``."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(gpu_count)]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML (no driver, no nvidia-ml-py): the driver's default numbering
        return list(range(gpu_count))


@dataclass(frozen=True)
class MigAccess:
    """The driver's capability nodes (``/dev/nvidia-caps/nvidia-cap<minor>``, a major of their own) through which
    CUDA is let into a GPU instance and a compute instance of a GPU in MIG mode: the major, and the minors of the
    instances a learner was given (``mig_cap_minors``)."""

    major: int
    minors: tuple[int, ...] = ()


def nvidia_caps_major(devices: Path = Path("/proc/devices")) -> int | None:
    """The character major of the driver's ``nvidia-caps`` nodes (``/proc/devices``), None without the driver."""
    try:
        for line in devices.read_text().splitlines():
            fields = line.split()
            if len(fields) == 2 and fields[1] == "nvidia-caps" and fields[0].isdigit():
                return int(fields[0])
    except OSError:
        pass
    return None


def mig_cap_minors(instances: list[tuple[int, int, int]], listing: str) -> tuple[int, ...]:
    """The capability minors that open ``instances`` (GPU index, GPU instance id, compute instance id), from the
    driver's ``/proc/driver/nvidia-caps/mig-minors`` (lines ``gpu0/gi1/access 12``, ``gpu0/gi1/ci0/access 13``):
    each instance needs its GPU instance's and its compute instance's ``access``."""
    wanted = set()
    for gpu, gpu_instance, compute_instance in instances:
        wanted.add(f"gpu{gpu}/gi{gpu_instance}/access")
        wanted.add(f"gpu{gpu}/gi{gpu_instance}/ci{compute_instance}/access")
    minors = []
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] in wanted and fields[1].isdigit():
            minors.append(int(fields[1]))
    return tuple(sorted(minors))


MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")


def mig_instance(device: Device) -> tuple[int, int, int]:
    """A MIG device's (GPU index, GPU instance id, compute instance id), from NVML (not run on a GPU)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(device.name)
        return device.gpu, pynvml.nvmlDeviceGetGpuInstanceId(handle), pynvml.nvmlDeviceGetComputeInstanceId(handle)
    finally:
        pynvml.nvmlShutdown()


def mig_access(devices: list[Device], resolve=mig_instance, listing: Path = MIG_MINORS) -> MigAccess | None:
    """What of the driver's MIG capabilities ``devices`` (a learner's) may open: their instances' access minors;
    none where the driver has no ``nvidia-caps`` (None: no MIG on this box)."""
    major = nvidia_caps_major()
    if major is None:
        return None
    instances = [resolve(device) for device in devices if device.name.startswith("MIG-")]
    text = listing.read_text() if instances and listing.is_file() else ""
    return MigAccess(major, mig_cap_minors(instances, text))


def server_group(
    name: str,
    limits: Limits,
    allowed_gpus: list[int],
    gpu_count: int,
    minors: list[int] | None = None,
    mig: MigAccess | None = None,
) -> ServerGroup:
    """Make ``name``'s group (removing one an earlier server left) with ``limits``, denying every GPU of the box
    but ``allowed_gpus`` and every MIG capability but ``mig``'s (all of them where ``mig`` is None: the driver's
    ``nvidia-caps`` major, where it has one, is the administrator's otherwise)."""
    found = ServerGroup(None)
    try:
        hierarchy = cgroups.Hierarchy.find()
    except cgroups.Unavailable as error:
        found.advised += [f"memory, CPU and processes: {error}"]
    else:
        stale = cgroups.Group(hierarchy.version, {c: p / name for c, p in hierarchy.parents.items()}, name)
        if all(folder.is_dir() for folder in stale.folders.values()):
            stale.remove()
        group = hierarchy.child(name)
        group.limit(limits.memory, limits.tasks)
        found.group = group
        found.enforced += ["memory", "processes"]
        cpu = "unified" if group.version == 2 else "cpu"
        quota = int(limits.cpus * CPU_PERIOD_US)
        try:
            if group.version == 2:
                (group.folders[cpu] / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            else:
                (group.folders[cpu] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                (group.folders[cpu] / "cpu.cfs_quota_us").write_text(str(quota))
            found.enforced.append("cpu")
        except (KeyError, OSError) as error:
            found.advised.append(f"cpu: no cpu controller to set a quota in ({error})")
    found.enforced.append("file size")
    numbers = minors if minors is not None else gpu_minors(gpu_count)
    own = [minor for gpu, minor in enumerate(numbers) if gpu in allowed_gpus]
    mount = _devices_mount()
    if mount is None:
        found.advised.append("GPUs: no cgroup v1 devices controller (CUDA_VISIBLE_DEVICES only)")
        return found
    folder = mount / name
    if folder.is_dir():
        _empty(folder)
        folder.rmdir()
    folder.mkdir()
    if mig is None:
        caps = nvidia_caps_major()
        mig = MigAccess(caps) if caps is not None else None
    allow_only(folder, own, mig)
    found.devices = folder
    found.enforced.append("gpus")
    return found


def allow_only(folder: Path, minors: list[int], mig: MigAccess | None = None) -> None:
    """A v1 ``devices`` group that may open every device but the NVIDIA GPUs, and of those only ``minors`` and the
    driver's control nodes, and of the MIG capability nodes only ``mig``'s: deny all, then allow block devices,
    every character major but 195 (and the capabilities' major), and their few."""
    (folder / "devices.deny").write_text("a")
    allow = folder / "devices.allow"
    allow.write_text("b *:* rwm")
    closed = {NVIDIA_MAJOR} | ({mig.major} if mig is not None else set())
    for major in range(CHAR_MAJORS):
        if major not in closed:
            allow.write_text(f"c {major}:* rwm")
    for minor in [*minors, *NVIDIA_CONTROL]:
        allow.write_text(f"c {NVIDIA_MAJOR}:{minor} rwm")
    for minor in mig.minors if mig is not None else ():
        allow.write_text(f"c {mig.major}:{minor} rwm")


def _empty(folder: Path) -> None:
    """Kill what a stale group still holds, so that it can be removed."""
    import signal

    for pid in (folder / "cgroup.procs").read_text().split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000


def private_shared_memory(size: int) -> None:
    """Give this process a mount and an IPC namespace of its own, with a private ``/dev/shm`` of at most ``size``
    bytes: what the server leaves there (and its System V segments) ends with it (as root, before the drop)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def call(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    call(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare")
    call(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    options = f"size={size},mode=1777".encode()
    call(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, options), "mount /dev/shm")


def preexec(group: ServerGroup, limits: Limits, then):
    """A ``preexec_fn``: enter ``group``, give the server its own ``/dev/shm``, limit the file size, keep the
    learner's new files to the learner (umask 077), then ``then()`` (JupyterHub's drop to the learner's account)."""
    files = group.procs_files()

    def enter_and_drop() -> None:
        cgroups.enter(files)
        private_shared_memory(limits.memory)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size, limits.file_size))
        os.umask(0o077)
        then()

    return enter_and_drop
