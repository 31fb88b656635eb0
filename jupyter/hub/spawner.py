"""The class hub's spawner: each user's server sees its own GPUs (``gpu_pairs.py``) and the course's Jupyter
configuration for its role (learner or instructor).

``GpuPairsMixin`` works on top of any spawner that passes ``get_env()`` to the server: ``GpuPairSpawner`` is it on
JupyterHub's ``LocalProcessSpawner`` (no memory or CPU limits: it cannot set them). For limits, put the mixin in
front of a spawner that can, e.g. ``class Limited(GpuPairsMixin, SystemdSpawner)`` with ``mem_limit`` and
``cpu_limit`` (systemdspawner), or DockerSpawner (which also needs the NVIDIA container runtime for GPUs).
"""

from __future__ import annotations

import shutil
import subprocess

from gpu_pairs import visible_devices
from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Integer, List, Unicode
from traitlets.config import Configurable


def count_gpus() -> int:
    """GPUs on this box, as the NVIDIA driver lists them (0 without ``nvidia-smi``)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else 0


class GpuPairsMixin(Configurable):
    order = List(Unicode(), help="users in class-list order: the n-th gets the n-th GPU group").tag(config=True)
    instructors = List(Unicode(), help="users who get the instructor's Jupyter configuration").tag(config=True)
    gpus_per_learner = Integer(2, help="GPUs each server sees").tag(config=True)
    gpu_count = Integer(-1, help="GPUs on the box; -1: ask nvidia-smi at each spawn").tag(config=True)
    learner_config = Unicode(help="JUPYTER_CONFIG_PATH of a learner's server").tag(config=True)
    instructor_config = Unicode(help="JUPYTER_CONFIG_PATH of an instructor's server").tag(config=True)

    def user_index(self) -> int:
        name = self.user.name
        if name not in self.order:
            raise ValueError(f"{name} is not in the class list: run `make hub` again after adding them")
        return self.order.index(name)

    def get_env(self):
        env = super().get_env()
        gpus = self.gpu_count if self.gpu_count >= 0 else count_gpus()
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(self.user_index(), gpus, self.gpus_per_learner)
        instructor = self.user.name in self.instructors
        env["JUPYTER_CONFIG_PATH"] = self.instructor_config if instructor else self.learner_config
        return env


class GpuPairSpawner(GpuPairsMixin, LocalProcessSpawner):
    """LocalProcessSpawner (each server a process of the user's own account) with a GPU group per user."""
