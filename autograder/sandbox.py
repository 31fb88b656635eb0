"""The sandbox every grading kernel runs in: bubblewrap (``bwrap``, Debian package ``bubblewrap``).

What a kernel started through :func:`command` gets (and nothing else):

* its own mount, PID, network, IPC and UTS namespaces: it sees no other process (``/proc`` is its own), no network
  but its own loopback, and only the files listed here;
* uid 65534 (``nobody``) inside, no capabilities, ``no_new_privs``, and no way to make a user namespace (bwrap's
  ``--disable-userns``: a kernel cannot rearrange its own sandbox or gain capabilities in a namespace of its own);
* as root, a host uid of its own (:func:`fresh_uid`): bwrap prepares the mounts as root, ``setpriv`` drops to a
  uid no account has and no kernel had since the machine started (a counter in ``/run``, one uid per kernel,
  concurrent or not), and, where an unprivileged user can make user namespaces here, a second bwrap run as that
  uid makes the kernel's user namespace with ``--disable-userns`` (``_nest``; where none can be made, no kernel can
  make one either). That bwrap, the kernel's parent, runs as the kernel's uid: a kernel that signals it ends only
  itself. The kernel's files (its working copy, home and sockets) are given to that uid and removed after the run.
  So what Linux counts per uid for the whole machine is the kernel's alone: epoll watches
  (``fs.epoll.max_user_watches``), inotify instances and watches, keys and the user keyring, processes
  (``RLIMIT_NPROC``), POSIX message queues, pipe buffers; a kernel that fills one harms only itself, and no kernel
  graded after it finds what it left (a key);
* as another user (no root), bwrap runs unprivileged and a user namespace maps the grading user to 65534 inside,
  ``--disable-userns`` included: every kernel runs as the grading user on the host. Kernels then share that uid's
  per-uid limits with each other and with the grader itself: a kernel that fills the epoll watches or inotify
  instances of the uid can make the kernels graded beside it (and the grader's own ZeroMQ sockets) fail until it
  ends, and can use up the uid's key quota; each kernel's user keyring is its own user namespace's, and nothing else
  of one kernel outlives it (its processes die with its sandbox). Grade as root for kernels that share nothing per
  uid, or as a dedicated account with one worker (``--workers 1``) so that no two kernels run at once;
* read-only views of the system (``/usr`` and the few ``/etc`` files programs need), the interpreter
  (``sys.prefix``, ``sys.base_prefix``) and its packages, and the ``gpulab`` package;
* writable: only the folders the grader passes (the kernel's working copy, a fresh copy of the notebook's folder
  made by :func:`working_copy` and removed after the run; the kernel's home; the folder of its connection sockets;
  files the lesson ships in the working copy stay read-only; as root, the grader mounts a filesystem of their own
  on them first, :func:`own_filesystem`), and a private ``/tmp`` and ``/dev/shm`` of bounded size (tmpfs: their
  pages are charged to the kernel's memory cgroup, ``cgroups.py``);
* no view of the course's ``source/``, the gradebook, ``submitted/``, other students' folders, the repository's
  work tree or the instructor's home; a cleared environment (only what :func:`kernel_environment` passes: with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, the grader's NVML order, and the grader's ``LD_LIBRARY_PATH`` folders under
  system roots, shown read-only, where a GPU image keeps the driver's libraries);
* with GPUs (``gpus=True``), the NVIDIA device nodes and ``/sys`` (read-only) as well; never otherwise. The grader
  makes ``/dev/nvidia-uvm`` exist before the first kernel and checks that a sandboxed kernel sees its GPUs
  (:func:`gpu_nodes_reason`, :func:`kernels_gpus_reason`), or stops saying why.

The kernel talks to the grader over Unix-domain sockets (jupyter_client's ``transport="ipc"``) in a folder bound
into the sandbox: path sockets cross the network namespace, TCP on loopback does not. The folder is a fresh one in
the temporary folder (``socket_folder``; ``grade.py`` makes one per run for all its kernels and removes it at the
end, even after a killed worker), whose path is short enough for a socket's, whatever the depth of the grading
folder.

Where the sandbox cannot be created (no ``bwrap``, user namespaces disabled for a non-root grader, ...),
:func:`require` raises :class:`SandboxUnavailable` naming what is missing; grading then stops (``grade.py
--unsafe-no-sandbox`` is the only way round it, and every report says so).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import grp
import importlib.util
import itertools
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
SANDBOX_UID = SANDBOX_GID = 65534  # the kernel's uid and gid inside its sandbox
KERNEL_UIDS = range(1_900_000_000, 2_000_000_000)  # as root: each kernel's own host uid, taken in turn from here
UID_COUNTERS = (Path("/run"), Path(tempfile.gettempdir()))  # where the last uid given is kept (the first that works)
TMP_SIZE = 1 << 30  # bytes of the kernel's private /tmp (a tmpfs: charged to the kernel's memory cgroup)
SHM_SIZE = 1 << 30  # bytes of its private /dev/shm (a tmpfs too, charged the same way)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_ENTRIES = (
    "alternatives",
    "fonts",
    "group",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "passwd",
    "ssl",
)
PASSED_VARIABLES = ("LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
# where an LD_LIBRARY_PATH entry may lead for a kernel to get it (GPU images find libcuda.so.1 and
# libnvidia-ml.so.1 only through it, e.g. /usr/local/nvidia/lib64): system folders, shown read-only
LIBRARY_ROOTS = (Path("/usr"), Path("/opt"), Path("/lib"), Path("/lib64"), Path("/lib32"))
# one GPU order everywhere: the grader's indices come from NVML, which numbers GPUs by PCI bus id, while CUDA
# numbers them fastest first unless told (the hub's servers get the same)
CUDA_DEVICE_ORDER = "PCI_BUS_ID"
PASSED_PREFIXES = ("GPULAB_", "NCCL_")
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be created on this machine; the message says what is missing."""


def as_root() -> bool:
    return os.geteuid() == 0


def _package_dirs(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(p).resolve() for p in spec.submodule_search_locations]
    return [Path(spec.origin).resolve().parent] if spec.origin else []


def readonly_paths() -> list[Path]:
    """What the kernel may read: the interpreter, its packages and gpulab (besides the system, see module doc).

    The packages are every folder on this interpreter's ``sys.path`` (site-packages, and folders a ``.pth`` file
    adds, as a ``--system-site-packages`` environment on top of another has), except the course repository, the
    folder the grading command runs in (``nbgrader`` puts its working folder, the grading course with its
    gradebook, ``source/`` and ``submitted/``, on ``sys.path``), and the folders above either: of the repository
    only gpulab is shown."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent}
    never = [REPOSITORY, Path.cwd().resolve()]
    for entry in sys.path:
        folder = Path(entry or ".").resolve()
        if folder.is_dir() and not _inside(folder, never) and not any(_inside(root, [folder]) for root in never):
            paths.add(folder)
    paths.update(_package_dirs("gpulab"))
    paths.update(_link_targets(paths))
    found = sorted({p.resolve() for p in paths if p.exists()}, key=lambda p: len(p.parts))
    return [p for i, p in enumerate(found) if not _inside(p, found[:i])]  # a folder inside another: bound with it


# The package of solutions, references and hidden draws (solutions/): the grader imports it, a kernel never does.
SOLUTIONS_PACKAGE = "gpulab_solutions"


def solutions_paths() -> list[Path]:
    """Every folder of the package of solutions this interpreter could import (the one it imports, and one of that
    name in any folder on ``sys.path``): the sandbox lays an empty read-only folder over each that it would show."""
    found = set(_package_dirs(SOLUTIONS_PACKAGE))
    for entry in sys.path:
        candidate = Path(entry or ".") / SOLUTIONS_PACKAGE
        if candidate.is_dir():
            found.add(candidate.resolve())
    return sorted(found)


def _link_targets(folders) -> set[Path]:
    """Where the symbolic links at the top of ``folders`` lead (a package folder made of links to another
    environment's packages), where the sandbox may show that: outside the repository, or in an environment in it."""
    targets = set()
    for folder in folders:
        try:
            entries = list(Path(folder).iterdir())
        except OSError:
            continue
        for entry in entries:
            if not entry.is_symlink():
                continue
            target = entry.resolve()
            if not target.exists() or target in REPOSITORY.parents or target == Path("/"):
                continue
            if _inside(target, [REPOSITORY]):
                inner = [p for p in target.parents if _inside(p, [REPOSITORY]) and p != REPOSITORY]
                if not any((p / "pyvenv.cfg").is_file() for p in inner):
                    continue  # the course's own files: never shown
            targets.add(target)
    return targets


def _inside(path: Path, roots) -> bool:
    return any(path == root or root in path.parents for root in roots)


def library_path() -> list[Path]:
    """The grader's ``LD_LIBRARY_PATH`` folders a kernel gets (and sees, read-only): existing folders under
    ``LIBRARY_ROOTS``, none inside the repository. Without them a GPU image whose driver libraries are found only
    through ``LD_LIBRARY_PATH`` gives kernels no GPU, and they fall back to virtual devices in silence."""
    kept = []
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if not entry or not os.path.isabs(entry) or not os.path.isdir(entry):
            continue
        folder = Path(entry).resolve()
        if _inside(folder, [root.resolve() for root in LIBRARY_ROOTS]) and not _inside(folder, [REPOSITORY]):
            kept.append(folder)
    return list(dict.fromkeys(kept))


def kernel_environment(extra: dict[str, str], home: Path) -> dict[str, str]:
    """The kernel's whole environment: a few locale and thread settings, ``GPULAB_*``/``NCCL_*``, the driver's
    libraries' folders (``library_path``), the GPU order (``CUDA_DEVICE_ORDER``), ``extra``."""
    environment = {
        "CUDA_DEVICE_ORDER": CUDA_DEVICE_ORDER,
        "PATH": os.pathsep.join([str(Path(sys.prefix) / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(home),
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLCONFIGDIR": str(home / ".matplotlib"),
    }
    for key, value in os.environ.items():
        if key in PASSED_VARIABLES or key.startswith(PASSED_PREFIXES):
            environment[key] = value
    # PYTHONPATH entries the kernel can see: folders shown read-only, and the folder holding gpulab
    shown, holders = readonly_paths(), {p.parent for p in _package_dirs("gpulab")}
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    kept = [e for e in entries if Path(e).resolve() in holders or _inside(Path(e).resolve(), shown)]
    if kept:
        environment["PYTHONPATH"] = os.pathsep.join(kept)
    libraries = library_path()
    if libraries:
        environment["LD_LIBRARY_PATH"] = os.pathsep.join(map(str, libraries))
    environment.update(extra)
    return environment


MAX_SOCKET_PATH = 107  # a Unix socket's path: sun_path holds 108 bytes with the terminating NUL (Linux)


def socket_folder(parent: str | Path | None = None) -> Path:
    """A new folder for Unix sockets with a path short enough for them (``kernel-ipc-N`` inside), whatever the
    grading folder's depth: in ``parent`` (``grade.py`` makes one per run, with this function, and removes it
    even when a worker was killed), else in the system's temporary folder, or in ``/tmp`` where that one is deep."""
    for place in [parent] if parent else [tempfile.gettempdir(), "/tmp"]:
        folder = Path(tempfile.mkdtemp(prefix="kernel-ipc-", dir=place))
        if len(str(folder / "kernel-ipc-99")) <= MAX_SOCKET_PATH:
            return folder
        folder.rmdir()
    raise RuntimeError("no folder with a path short enough for the kernel's Unix sockets")


def fresh_uid() -> int:
    """A host uid for one kernel (as root): the next of ``KERNEL_UIDS`` after the last one given on this machine, none
    that an account or a group has. The last one given is kept in a root-owned file (``UID_COUNTERS``: ``/run`` is
    emptied at boot, as is the per-uid state of the Linux kernel), locked while it is read and written, so that
    concurrent workers and gradings never share one."""
    for folder in UID_COUNTERS:
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            handle = os.open(folder / "gpulab-kernel-uids", flags, 0o600)
        except OSError:
            continue
        try:
            info = os.fstat(handle)
            if info.st_uid != os.geteuid() or not stat.S_ISREG(info.st_mode) or info.st_mode & 0o022:
                continue  # another user's file: never trusted with the uids
            fcntl.flock(handle, fcntl.LOCK_EX)
            text = os.read(handle, 64).decode("ascii", "replace").strip()
            uid = int(text) if text.isdigit() else KERNEL_UIDS.start - 1
            while True:
                uid = uid + 1 if KERNEL_UIDS.start <= uid + 1 < KERNEL_UIDS.stop else KERNEL_UIDS.start
                if not _an_account(uid):
                    break
            os.lseek(handle, 0, os.SEEK_SET)
            os.ftruncate(handle, 0)
            os.write(handle, str(uid).encode())
            return uid
        finally:
            os.close(handle)
    raise RuntimeError(f"no folder of {', '.join(map(str, UID_COUNTERS))} can keep the kernels' uids")


def kernel_uid() -> int:
    """The host uid the next kernel runs as: as root, a :func:`fresh_uid` of its own; else the grading user's (the
    sandbox maps it to ``SANDBOX_UID`` inside; :func:`command`'s ``uid`` is then unused)."""
    return fresh_uid() if as_root() else SANDBOX_UID


def _an_account(uid: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return False


@functools.cache
def _nest() -> bool:
    """As root: whether an unprivileged user can make a user namespace here (``unshare --user`` as a fresh uid). Then
    the kernel's sandbox nests a second bwrap, run as the kernel's uid, that makes its user namespace with
    ``--disable-userns``; where none can be made, there is nothing to disable."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if not as_root() or unshare is None or setpriv is None:
        return as_root()
    uid = str(fresh_uid())
    probe = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", unshare, "--user", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30, cwd="/").returncode == 0
    except (OSError, subprocess.SubprocessError):
        return True  # assume it can: the sandbox's probe (``unavailable_reason``) then says what fails


def command(
    kernel_command: list[str],
    *,
    workdir: Path,
    writable: list[Path],
    environment: dict[str, str],
    readonly_inside: list[Path] = (),
    gpus: bool = False,
    bwrap: str | None = None,
    uid: int = SANDBOX_UID,
) -> list[str]:
    """``bwrap ... -- kernel_command``: the kernel in its sandbox (module docstring), working in ``workdir``; as root,
    running as host uid ``uid`` (a :func:`fresh_uid` for each kernel; the paths it writes given to it with
    :func:`give_to_kernel`)."""
    bwrap = bwrap or shutil.which("bwrap") or "bwrap"
    argv = [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--hostname", "grading"]
    unprivileged = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--disable-userns"]
    if not as_root():
        argv += unprivileged
    readonly: list[Path] = []
    for name in SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            argv += ["--ro-bind", name, name]
            readonly.append(path)
    for entry in ETC_ENTRIES:
        path = Path("/etc") / entry
        if path.exists():
            argv += ["--ro-bind", str(path), str(path)]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if gpus:
        for node in sorted(Path("/dev").glob("nvidia*")):
            argv += ["--dev-bind", str(node), str(node)]
        argv += ["--ro-bind", "/sys", "/sys"]
    argv += ["--perms", "1777", "--size", str(TMP_SIZE), "--tmpfs", "/tmp"]
    # its own shared memory (torch.multiprocessing, NCCL's shared-memory transport): bubblewrap's /dev leaves
    # /dev/shm root-owned 0755, where the kernel's user cannot write
    argv += ["--perms", "1777", "--size", str(SHM_SIZE), "--tmpfs", "/dev/shm"]
    mounts = [(p, "--ro-bind") for p in readonly_paths() if not _inside(p, readonly)]
    mounts += [(p, "--ro-bind") for p in library_path() if not _inside(p, readonly)]
    mounts += [(Path(p).resolve(), "--bind") for p in writable]
    created: set[Path] = {Path("/"), Path("/tmp"), Path("/proc"), Path("/dev"), Path("/etc"), *readonly}
    for path, _ in sorted(mounts, key=lambda m: len(m[0].parts)):
        for parent in reversed(path.parents):
            if parent not in created and not _inside(parent, readonly):
                argv += ["--perms", "0755", "--dir", str(parent)]
                created.add(parent)
    for path, how in sorted(mounts, key=lambda m: len(m[0].parts)):
        argv += [how, str(path), str(path)]
        created.add(path)
    for path in readonly_inside:  # files inside a writable folder that the kernel may read but not change
        argv += ["--ro-bind", str(Path(path).resolve()), str(Path(path).resolve())]
    shown = [*readonly, *(path for path, _ in mounts)]
    for path in solutions_paths():  # installed where the kernel sees packages: an empty folder over it
        if _inside(path, shown):
            argv += ["--perms", "0555", "--tmpfs", str(path), "--remount-ro", str(path)]
    argv += ["--chdir", str(Path(workdir).resolve()), "--clearenv"]
    for key, value in sorted(environment.items()):
        argv += ["--setenv", key, value]
    argv.append("--")
    if as_root():
        setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
        argv += [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        argv += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        if _nest():  # the kernel's own user namespace, from which it can make no other
            argv += [bwrap, *unprivileged, "--dev-bind", "/", "/", "--die-with-parent"]  # devices: the outer /dev
            argv += ["--chdir", str(Path(workdir).resolve()), "--"]
    return argv + list(kernel_command)


MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2  # mount(2) and umount2(2) flags (Linux)


def own_filesystem(path: Path, size: int, entries: int) -> str | None:
    """As root: mount a filesystem of its own (tmpfs) of ``size`` bytes and ``entries`` files on the empty folder
    ``path``; ``None`` once mounted, else why not (not root, or mounting is refused here).

    Linux then holds everything kept under ``path`` to these limits, however it is kept: files a kernel deleted but
    holds open (or mapped, or sent over a socket), which no walk of its folders finds, included; a write past them
    fails (``ENOSPC``). Its pages are charged to the memory cgroup of the process that writes them (the kernel's,
    ``cgroups.py``). :func:`release_folder` unmounts it."""
    if not as_root():
        return "not graded as root: no filesystem can be mounted"
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"size={max(size, 1 << 20)},nr_inodes={max(entries, 64)},mode=0700".encode()
    flags = MS_NOSUID | MS_NODEV
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", flags, options) != 0:
        return f"mounting a tmpfs was refused ({os.strerror(ctypes.get_errno())})"
    return None


def mounts_below(path: Path | str) -> list[str]:
    """The mount points at or below ``path`` in this process's mount namespace, deepest first."""
    root = os.path.realpath(path)
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
            for line in handle:
                fields = line.split(" ")
                if len(fields) > 4:
                    point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                    if point == root or point.startswith(root.rstrip("/") + "/"):
                        found.append(point)
    except OSError:
        return []
    return sorted(set(found), key=lambda point: point.count("/"), reverse=True)


def release_folder(path: Path | str) -> None:
    """Unmount whatever is mounted at or below ``path`` (:func:`own_filesystem`; lazily, so that a process still
    holding a file there cannot keep it), then remove the folder and what is left in it (:func:`remove_tree`)."""
    if os.path.lexists(path):
        libc = ctypes.CDLL(None, use_errno=True)
        for point in mounts_below(path):
            libc.umount2(os.fsencode(point), MNT_DETACH)
    remove_tree(path)


def remove_tree(path: Path | str) -> None:
    """Remove ``path`` and everything under it, whatever a kernel left there: never following a link, without
    recursion (Python 3.11's ``shutil.rmtree`` and ``os.walk`` recurse once per level, and a folder a thousand
    levels deep raises ``RecursionError``) and without long paths (every step is relative to an open folder).

    The folder is emptied from the top: each sub-folder's entries are moved up into the top folder, then the emptied
    sub-folder is removed, so every entry is moved at most once and no path is longer than two names. What cannot
    be removed is left (nothing is read from it)."""
    path = Path(path)
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
            return
        top = os.open(path, _FOLDER_FLAGS)
    except OSError:
        return
    fresh = itertools.count()
    try:
        while True:
            names = os.listdir(top)
            if not names or not any(_remove_entry(top, name, fresh) for name in names):
                break
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(path)


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_entry(top: int, name: str, fresh) -> bool:
    """Remove ``name`` in the open folder ``top``, or move its entries up into ``top``; whether anything changed."""
    try:
        if not stat.S_ISDIR(os.stat(name, dir_fd=top, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=top)
            return True
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=top)
            return True
        with contextlib.suppress(OSError):  # a kernel may have made its folder unreadable to its owner
            os.chmod(name, 0o700, dir_fd=top)
        inner = os.open(name, _FOLDER_FLAGS, dir_fd=top)
    except OSError:
        return False
    moved = False
    try:
        for child in os.listdir(inner):
            for _ in range(100):  # a name taken by an entry that cannot be replaced: try the next one
                try:
                    os.rename(child, f".removed-{next(fresh)}", src_dir_fd=inner, dst_dir_fd=top)
                    moved = True
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    continue
    except OSError:
        pass
    finally:
        os.close(inner)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=top)
        moved = True
    return moved


def give_to_kernel(*paths: Path, uid: int = SANDBOX_UID) -> None:
    """Make ``paths`` (and what is in them) host uid ``uid``'s (the kernel's: :func:`command`), so the kernel can
    write there (as root only)."""
    if not as_root():
        return
    for path in paths:
        chown_tree(Path(path), uid, uid)


def working_copy(release: Path, target: Path) -> Path:
    """A fresh folder ``target`` holding a copy of the regular files (and folders) under ``release``, for a kernel to
    work in; returns it.

    The kernel never works in a folder the grader keeps: whatever it leaves (symbolic or hard links to the
    grader's files, FIFOs, pages named like feedback, huge files, folders thousands of levels deep) dies with
    ``target``, which the grader removes with :func:`remove_tree` (it never follows a link). Nothing under
    ``release`` is followed either: links and special files there are not copied."""
    target.mkdir(mode=0o755)
    around = {target.resolve(), *target.resolve().parents}  # a scratch folder inside ``release`` is never copied
    for folder, dirs, files in os.walk(release, followlinks=False):
        here = Path(folder)
        inside = target / here.relative_to(release)
        for name in list(dirs):
            if not stat.S_ISDIR(os.lstat(here / name).st_mode) or (here / name).resolve() in around:
                dirs.remove(name)
                continue
            (inside / name).mkdir(mode=0o755)
        for name in files:
            if stat.S_ISREG(os.lstat(here / name).st_mode):
                shutil.copyfile(here / name, inside / name, follow_symlinks=False)
    return target


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Give ``path`` and everything below it to ``uid``:``gid``, never following a link (a link at ``path`` itself
    is left alone)."""
    if not path.exists() or path.is_symlink():
        return
    os.chown(path, uid, gid, follow_symlinks=False)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)
            except OSError:
                pass


@functools.cache
def unavailable_reason() -> str | None:
    """Why no sandbox can be created here (``None`` when one can): tried once per process."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"the `bwrap` command was not found: {INSTALL_HINT}"
    if as_root() and shutil.which("setpriv") is None:
        return "the `setpriv` command (util-linux) was not found: it drops the kernel to an unprivileged user"
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as folder:
        workdir = Path(folder) / "work"
        workdir.mkdir()
        uid = kernel_uid()
        give_to_kernel(workdir, uid=uid)
        probe = "import os, sys; open('probe', 'w').write(str(os.getuid())); assert not os.path.exists('/etc/shadow')"
        argv = command(
            [sys.executable, "-I", "-c", probe],
            workdir=workdir,
            writable=[workdir],
            environment=kernel_environment({}, workdir),
            bwrap=bwrap,
            uid=uid,
        )
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as error:
            return f"bubblewrap could not start: {error}"
        if result.returncode != 0 or not (workdir / "probe").is_file():
            detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            hint = "" if as_root() else " (user namespaces must be enabled: sysctl user.max_user_namespaces)"
            return f"bubblewrap could not create a sandbox here: {detail[0]}{hint}"
    return None


UVM_NODE = "nvidia-uvm"  # made by the driver's nvidia-modprobe at the first CUDA initialisation after boot
GPU_PROBE = "import torch; print(torch.cuda.device_count())"


def gpu_nodes_reason(gpus: int, dev: Path = Path("/dev"), run=subprocess.run) -> str | None:
    """Before the first kernel where the grader sees ``gpus`` GPUs: make sure the device nodes a kernel's CUDA
    needs exist, since the sandbox binds only the ``/dev/nvidia*`` nodes there when it starts (``/dev/nvidia-uvm``
    appears only at the first CUDA initialisation after boot, and NVML, which counted the GPUs, does not make
    it). ``nvidia-modprobe -u -c=0`` makes it (setuid root, shipped with the driver); without that tool, CUDA is
    initialised once in a subprocess, which runs it. Returns why kernels cannot have their GPUs, or None."""
    if gpus <= 0 or (dev / UVM_NODE).exists():
        return None
    modprobe = shutil.which("nvidia-modprobe")
    command_line = [modprobe, "-u", "-c=0"] if modprobe else [sys.executable, "-c", "import torch; torch.cuda.init()"]
    try:
        run(command_line, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        pass
    if (dev / UVM_NODE).exists():
        return None
    return (
        f"the grader sees {gpus} GPU(s) but {dev / UVM_NODE} does not exist, and `{' '.join(map(str, command_line))}` "
        "did not make it: a sandboxed kernel could not use CUDA (load the driver's nvidia-uvm module, e.g. "
        "`nvidia-modprobe -u -c=0` as root)"
    )


def kernels_gpus_reason(gpus: list[str], run=subprocess.run) -> str | None:
    """Whether a sandboxed kernel sees the GPUs the grader sees (``CUDA_VISIBLE_DEVICES`` the grader's list): a
    kernel that cannot (a node or a library missing inside the sandbox) would fall back to virtual devices in
    silence and the grader's GPU cases would be skipped. Returns why not, or None."""
    if not gpus:
        return None
    with tempfile.TemporaryDirectory(prefix="sandbox-gpu-probe-") as folder:
        workdir = Path(folder) / "work"
        workdir.mkdir()
        uid = kernel_uid()
        give_to_kernel(workdir, uid=uid)
        environment = kernel_environment({"CUDA_VISIBLE_DEVICES": ",".join(gpus)}, workdir)
        argv = command(
            [sys.executable, "-I", "-c", GPU_PROBE],
            workdir=workdir,
            writable=[workdir],
            environment=environment,
            gpus=True,
            uid=uid,
        )
        try:
            result = run(argv, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as error:
            return f"a sandboxed kernel could not be started to count its GPUs: {error}"
        lines = (result.stdout or "").strip().splitlines()
        seen = int(lines[-1]) if lines and lines[-1].strip().isdigit() else None
    if seen == len(gpus):
        return None
    detail = ((result.stderr or "").strip().splitlines() or [""])[-1]
    return (
        f"the grader sees {len(gpus)} GPU(s) but a sandboxed kernel sees {seen if seen is not None else 'none'}"
        + (f" ({detail})" if detail else "")
        + ": its GPU cases would be skipped; is a driver library found only outside the folders kernels see?"
    )


def require() -> None:
    """Raise :class:`SandboxUnavailable` when no sandbox can be created here."""
    reason = unavailable_reason()
    if reason:
        raise SandboxUnavailable(
            f"grading kernels must run in a sandbox, and {reason}. "
            "(`grade.py --unsafe-no-sandbox` grades without one; every report then says so.)"
        )
