"""The class hub's spawner on a Slurm cluster: each user's JupyterLab is a Slurm job (batchspawner's
``SlurmSpawner``), with the course's Jupyter configuration for its role.

What the one-box spawner (``spawner.py``) does itself, Slurm does here: the job asks for ``--gres=gpu:N``,
``--mem``, ``--cpus-per-task`` and ``--time`` in the instructor's partition (``scripts/class_slurm.py`` writes the
values into the hub's configuration), and Slurm picks the GPUs, sets ``CUDA_VISIBLE_DEVICES`` in the job to them
and, with ``ConstrainDevices=yes`` in the cluster's ``cgroup.conf``, denies the job every other GPU's device node;
``ConstrainRAMSpace`` and ``ConstrainCores`` enforce memory and CPUs. The batch script adds what a job does not
limit by itself: ``umask 077`` and ``RLIMIT_FSIZE`` (one file at most ``file_size_limit`` bytes), as on one box.

The hub runs as root (PAM accounts, as on one box) and submits, queries and cancels each job as the user
(``runuser``), so every job is the learner's own; the environment batchspawner hands to ``sbatch`` is the hub's
API token for that server and the course's variables, exported into the job by name (``--export``).
"""

from __future__ import annotations

import os

from batchspawner import SlurmSpawner
from traitlets import Integer, List, Unicode

BATCH_SCRIPT = """#!/bin/bash
#SBATCH --output={{homedir}}/.gpulab-server-%j.log
#SBATCH --job-name=gpulab-server
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if gres %}#SBATCH --gres={{gres}}
{% endif %}{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if account %}#SBATCH --account={{account}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}
set -euo pipefail
umask 077
ulimit -f {{file_size_kib}}
export PATH={{environment_bin}}:/usr/local/bin:/usr/bin:/bin
trap 'echo SIGTERM received' TERM
{{prologue}}
{% if srun %}{{srun}} {% endif %}{{cmd}}
{{epilogue}}
"""


class ClassSlurmSpawner(SlurmSpawner):
    """batchspawner's SlurmSpawner with the class's roles (learner or instructor Jupyter configuration), its batch
    script, and jobs submitted as the user with ``runuser`` (the hub runs as root)."""

    batch_script = Unicode(BATCH_SCRIPT).tag(config=True)
    exec_prefix = Unicode("runuser -u {username} --").tag(config=True)
    instructors = List(Unicode(), help="users who get the instructor's Jupyter configuration").tag(config=True)
    learner_config = Unicode(help="JUPYTER_CONFIG_PATH of a learner's server").tag(config=True)
    instructor_config = Unicode(help="JUPYTER_CONFIG_PATH of an instructor's server").tag(config=True)
    environment_bin = Unicode(help="the course environment's bin folder, first on the job's PATH").tag(config=True)
    file_size_limit = Integer(2 << 30, help="bytes one file written by a server may hold (RLIMIT_FSIZE)").tag(
        config=True
    )

    def get_req_subvars(self):
        subvars = super().get_req_subvars()
        subvars["file_size_kib"] = max(1, self.file_size_limit // 1024)
        subvars["environment_bin"] = self.environment_bin
        return subvars

    def get_env(self):
        env = super().get_env()
        instructor = self.user.name in self.instructors
        env["JUPYTER_CONFIG_PATH"] = self.instructor_config if instructor else self.learner_config
        # the cluster the hub was started for (a test's one-node cluster; a real one reads /etc/slurm/slurm.conf)
        if "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        return env
