"""The class hub's spawner: each user's server sees its own GPUs (``gpu_pairs.py``), runs under limits it cannot
lift (``server_limits.py``) and gets the course's Jupyter configuration for its role (learner or instructor).

``GpuPairsMixin`` works on top of any spawner that passes ``get_env()`` to the server. ``GpuPairSpawner`` is it on
JupyterHub's ``LocalProcessSpawner`` (each server a process of the learner's own account), with the limits
``LocalProcessSpawner`` ignores made real: ``mem_limit``, ``cpu_limit``, ``tasks_limit`` and ``file_size_limit``
in a control group of the server's own, and the other learners' GPUs denied to it where the host has cgroup v1's
``devices`` controller. Where systemd runs, ``class Limited(GpuPairsMixin, SystemdSpawner)`` (systemdspawner) gets
the same from systemd units.
"""

from __future__ import annotations

import shutil
import subprocess

from gpu_pairs import Device, gpus_for, listed_devices
from jupyterhub.spawner import LocalProcessSpawner
from server_limits import Limits, mig_access, preexec, server_group
from traitlets import Integer, List, Unicode
from traitlets.config import Configurable


def box_devices() -> list[Device]:
    """The GPUs (or their MIG instances) on this box, as the NVIDIA driver lists them (none without
    ``nvidia-smi``, or when it fails: every GPU is then hidden and denied, never opened to all)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    return listed_devices(listed.stdout) if listed.returncode == 0 else []


class GpuPairsMixin(Configurable):
    order = List(Unicode(), help="users in class-list order: the n-th gets the n-th GPU group").tag(config=True)
    instructors = List(Unicode(), help="users who get the instructor's Jupyter configuration").tag(config=True)
    gpus_per_learner = Integer(2, help="GPUs each server sees").tag(config=True)
    gpu_count = Integer(-1, help="GPUs on the box (simulated); -1: ask nvidia-smi at each spawn").tag(config=True)
    learner_config = Unicode(help="JUPYTER_CONFIG_PATH of a learner's server").tag(config=True)
    instructor_config = Unicode(help="JUPYTER_CONFIG_PATH of an instructor's server").tag(config=True)

    def user_index(self) -> int:
        name = self.user.name
        if name not in self.order:
            raise ValueError(f"{name} is not in the class list: run `make hub` again after adding them")
        return self.order.index(name)

    def devices(self) -> list[Device]:
        if self.gpu_count >= 0:
            return [Device(str(gpu), gpu) for gpu in range(self.gpu_count)]
        return box_devices()

    def gpu_group(self, devices: list[Device]) -> list[Device]:
        """This user's devices: the class-list position's group among the box's GPUs or MIG instances."""
        return [devices[i] for i in gpus_for(self.user_index(), len(devices), self.gpus_per_learner)]

    def get_env(self):
        env = super().get_env()
        env["CUDA_VISIBLE_DEVICES"] = ",".join(device.name for device in self.gpu_group(self.devices()))
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's numbers are then the driver's (nvidia-smi, NVML)
        instructor = self.user.name in self.instructors
        env["JUPYTER_CONFIG_PATH"] = self.instructor_config if instructor else self.learner_config
        return env


class GpuPairSpawner(GpuPairsMixin, LocalProcessSpawner):
    """LocalProcessSpawner (each server a process of the user's own account) with a GPU group per user, under
    limits of its own (``server_limits.py``): ``mem_limit`` and ``cpu_limit`` are JupyterHub's own options."""

    tasks_limit = Integer(1024, help="processes and threads a server and everything it starts may hold").tag(
        config=True
    )
    file_size_limit = Integer(2 << 30, help="bytes one file written by a server may hold (RLIMIT_FSIZE)").tag(
        config=True
    )

    def limits(self) -> Limits:
        default = Limits()
        return Limits(
            memory=int(self.mem_limit or default.memory),
            cpus=float(self.cpu_limit or default.cpus),
            tasks=self.tasks_limit,
            file_size=self.file_size_limit,
        )

    async def start(self):
        name = f"gpulab-hub-{self.user.name}"
        devices = self.devices()
        mine = self.gpu_group(devices)
        gpus = sorted({device.gpu for device in mine})
        self.server_group = server_group(
            name, self.limits(), gpus, len({device.gpu for device in devices}), mig=mig_access(mine)
        )
        self.log.info(
            "%s's server: enforced %s; advice only: %s",
            self.user.name,
            ", ".join(self.server_group.enforced),
            "; ".join(self.server_group.advised) or "nothing",
        )
        return await super().start()

    def make_preexec_fn(self, name):
        return preexec(self.server_group, self.limits(), super().make_preexec_fn(name))

    async def stop(self, now=False):
        await super().stop(now=now)
        group = getattr(self, "server_group", None)
        if group is not None:
            group.remove()
