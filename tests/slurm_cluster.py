"""A one-node Slurm cluster for the class's cluster test and benchmark (``tests/test_class_slurm.py``,
``benchmarks/bench_slurm_grading.py``), made from Debian's ``slurm-wlm`` (22.05) and ``munge`` and removed afterwards.

Everything lives in one folder: munge's key, socket, pid and log; ``slurm.conf`` and ``gres.conf``; the
controller's state and the node's spool; the daemons' pid files and logs; and the device nodes that stand in for
GPUs (``nvidia0`` ..., each with ``/dev/null``'s numbers: Slurm's GPU plugin takes only character or block
devices, numbers each by the digits of its name, and sets ``CUDA_VISIBLE_DEVICES`` from them). Nothing is written
to ``/etc`` and the daemons listen on free ports, so a cluster this machine already runs is left alone: every
command finds this one through ``SLURM_CONF`` (in ``Cluster.env``). The daemons run as root, ``munged`` as the
``munge`` account (what Debian's package makes), each started by this module and stopped by its pid; a job still
running when the cluster stops is cancelled first, and any ``slurmstepd`` of this cluster left is ended by its pid.

The node claims more CPUs and memory than a small test machine has (``SlurmdParameters=config_overrides``), so that
a class's servers and grading tasks are scheduled as on a real node; nothing is enforced here (``TaskPlugin=task/none``,
``ProctrackType=proctrack/linuxproc``: no cgroups). A real cluster's configuration is in docs/instructors.md,
"A class on a Slurm cluster".
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
PARTITION = "class"


def missing_programs() -> list[str]:
    return [program for program in PROGRAMS if shutil.which(program) is None]


def _free_ports(n: int) -> list[int]:
    probes = [socket.socket() for _ in range(n)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


@dataclass
class Cluster:
    root: Path
    node: str
    gpus: int
    partition: str = PARTITION
    daemons: list = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a command needs in its environment to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *command: str, check: bool = True, user: str | None = None) -> subprocess.CompletedProcess:
        prefix = ["runuser", "-u", user, "--"] if user else []
        return subprocess.run(
            [*prefix, *command], env={**os.environ, **self.env}, capture_output=True, text=True, check=check
        )

    def jobs(self) -> list[str]:
        listed = self.run("squeue", "-h", "-o", "%i", check=False)
        return listed.stdout.split()

    def own_processes(self) -> list[int]:
        """The pids of this cluster's processes that are not its starter's descendants: ``munged`` (it goes into the
        background) and the Slurm step daemons, under which every job runs."""
        pids = _stepds_of(self.conf)
        with contextlib.suppress(OSError, ValueError):
            pids.append(int((self.root / "munge" / "munged.pid").read_text()))
        return pids

    def job_gpus(self, job: str) -> str:
        """The GPU indices Slurm gave ``job`` on its node (``scontrol show job -d``'s ``GRES=gpu:2(IDX:0-1)``)."""
        shown = self.run("scontrol", "show", "job", "-d", job).stdout
        for word in shown.split():
            if word.startswith("GRES=") and "IDX:" in word:
                return word.split("IDX:", 1)[1].rstrip(")")
        raise AssertionError(f"no GPU index in scontrol's view of job {job}:\n{shown}")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    os.chmod(path, mode)


def _wait_for(what: str, ready, timeout: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {log}\n{log.read_text()[-2000:]}" for log in logs if log.is_file())
            raise RuntimeError(f"{what} did not come up in {timeout:.0f} s\n{tails}")
        time.sleep(0.2)


def _stepds_of(conf: Path) -> list[int]:
    """The ``slurmstepd`` processes of the cluster whose configuration is ``conf``: those working in its folder, where
    its ``slurmd`` runs (a step daemon starts with an empty environment, so it cannot be told by ``SLURM_CONF``)."""
    import psutil

    found = []
    for process in psutil.process_iter(["name", "cwd"]):
        with contextlib.suppress(psutil.Error):
            if process.info["name"] == "slurmstepd" and process.info["cwd"] == str(conf.parent):
                found.append(process.pid)
    return found


@contextlib.contextmanager
def one_node_cluster(root: Path, gpus: int = 8, cpus: int = 16, memory_mb: int = 32000):
    """Start munged, slurmctld and slurmd for one node (this host, by its own name) with ``gpus`` stand-in GPUs in
    partition ``class``; yield a ``Cluster``; stop and remove everything on the way out."""
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # every account's sbatch reads slurm.conf and reaches munge's socket
    node = socket.gethostname().split(".")[0]
    cluster = Cluster(root=root, node=node, gpus=gpus)
    munge = pwd.getpwnam("munge")
    munge_dir = root / "munge"
    munge_dir.mkdir(mode=0o755)
    os.chown(munge_dir, munge.pw_uid, munge.pw_gid)
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    os.chown(key, munge.pw_uid, munge.pw_gid)
    munge_socket = munge_dir / "munge.socket"
    devices = root / "dev"
    devices.mkdir()
    for index in range(gpus):  # /dev/null's numbers: Slurm wants a device node, and opening one reads nothing
        os.mknod(devices / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    for name in ("state", "spool"):
        (root / name).mkdir(mode=0o755)
    controller_port, node_port = _free_ports(2)
    _write(
        cluster.conf,
        f"""# a one-node cluster for the class's tests (tests/slurm_cluster.py)
ClusterName=gpulab
SlurmctldHost={node}
SlurmctldPort={controller_port}
SlurmdPort={node_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerParameters=sched_min_interval=100000
KillWait=5
MessageTimeout=20
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} Gres=gpu:{gpus} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
""",
    )
    _write(root / "gres.conf", f"AutoDetect=off\nName=gpu File={devices}/nvidia[0-{gpus - 1}]\n")
    _write(root / "cgroup.conf", "CgroupPlugin=autodetect\n")
    environment = {**os.environ, **cluster.env}
    try:
        started = subprocess.run(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                "munged",
                "--force",
                f"--key-file={key}",
                f"--socket={munge_socket}",
                f"--pid-file={munge_dir / 'munged.pid'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
                f"--log-file={munge_dir / 'munged.log'}",
            ],
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            raise RuntimeError(f"munged did not start: {started.stderr.strip()}")
        _wait_for("munged", munge_socket.exists, 10, [munge_dir / "munged.log"])
        for daemon in ("slurmctld", "slurmd"):
            log = open(root / f"{daemon}.out", "wb")  # noqa: SIM115 - closed with the daemon
            process = subprocess.Popen(
                [daemon, "-D", "-f", str(cluster.conf)],
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=root,
            )
            cluster.daemons.append((process, log))
            if daemon == "slurmctld":
                _wait_for(
                    "slurmctld",
                    lambda: cluster.run("scontrol", "ping", check=False).stdout.count("UP") > 0,
                    30,
                    [root / "slurmctld.log", root / "slurmctld.out"],
                )

        def node_idle() -> bool:
            shown = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            if shown.startswith(("down", "drain")):
                cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
            return shown == "idle"

        _wait_for("slurmd", node_idle, 30, [root / "slurmd.log", root / "slurmd.out", root / "slurmctld.log"])
        yield cluster
    finally:
        stop(cluster, munge_dir)


def stop(cluster: Cluster, munge_dir: Path) -> None:
    """Cancel every job, stop the daemons and munged by their pids, end any step daemon left, remove the folder."""
    if cluster.daemons:
        jobs = cluster.jobs()
        if jobs:
            cluster.run("scancel", *jobs, check=False)
            deadline = time.monotonic() + 20
            while cluster.jobs() and time.monotonic() < deadline:
                time.sleep(0.3)
    for process, log in reversed(cluster.daemons):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
    for pid in _stepds_of(cluster.conf):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    pid_file = munge_dir / "munged.pid"
    if pid_file.is_file():
        with contextlib.suppress(ProcessLookupError, ValueError):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.1)
    shutil.rmtree(cluster.root, ignore_errors=True)
