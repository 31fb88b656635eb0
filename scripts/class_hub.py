"""A class on one GPU box: JupyterHub, nbgrader's exchange, a GPU group per learner, and grading in the same loop.

    python scripts/class_hub.py setup class.txt   # as root; `make hub CLASS=class.txt`; idempotent
    python scripts/class_hub.py start             # run the hub (foreground; a systemd unit in production)
    python scripts/class_hub.py release 01_splitting [--due 2027-01-15T17:00]
    python scripts/class_hub.py grade 01_splitting [--due ...]

``setup`` makes a system account for every learner in the class file (one name a line, ``#`` comments) and for the
instructor, installs JupyterHub into the course's one shared environment (``--env``, the repository's ``.venv`` by
default: every learner's server and kernel run from it) and ``configurable-http-proxy`` with npm under
``--prefix``, creates nbgrader's exchange (``--exchange``) and writes the hub's configuration and both roles'
Jupyter configuration under ``--prefix``. Running it again after adding a learner adds only that learner. Its
settings are kept in ``PREFIX/class.json`` and read by the other commands.

``release`` hands a lesson out through the exchange twice: the English edition as ``LESSON`` and the Japanese as
``LESSON_ja``. ``grade`` collects both, grades each learner's latest submission (either edition) on the lesson's one
gradebook assignment with the course's sandboxed ``autograder/grade.py``, and releases each learner's feedback page
under the assignment they submitted. See docs/instructors.md, "A class on one GPU box".
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "jupyter" / "hub"))

from gpu_pairs import plan  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(1, str(REPO))  # autograder's modules (cgroups, export), after the scripts
import class_collect  # noqa: E402 - imported here, as root: the collect runs as the instructor, who cannot read the clone
import class_slurm  # noqa: E402 - a class on a Slurm cluster: its servers as jobs, its grading as a job array
from setup_env import KERNEL_INSTALL, TORCH  # noqa: E402

NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")  # what useradd accepts everywhere (Debian, RHEL)
EDITIONS = {"en": "", "ja": "_ja"}  # edition -> suffix of its exchange assignment name
JUPYTERHUB = "jupyterhub>=5,<6"
# a Python every account can run, to build the shared environment from when --env is closed to the learners
BASE_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
# what a non-editable install of gpulab needs from the repository (no other file of it is read)
PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "utils")
PROXY = "configurable-http-proxy@^4"
DEFAULTS = {
    "prefix": "/opt/gpulab-hub",
    "env": str(REPO / ".venv"),
    "exchange": "/srv/nbgrader/exchange",
    "course_id": "gpulab",
    "instructor": "instructor",
    "course_dir": "",  # default: ~instructor/<course_id>
    "home_base": "/home",
    "ip": "",
    "port": 8000,
    "hub_port": 8081,
    "proxy_api_port": 8001,
    "gpus_per_learner": 2,
    "gpu_count": -1,
    "server_memory": 8.0,  # GiB a learner's server and everything it starts may hold (jupyter/hub/server_limits.py)
    "server_cpus": 2.0,  # cores of CPU time it may use
    "torch": TORCH,
    "base_python": "",  # default: the first of BASE_PYTHONS that every account can run
}


def read_class(path: Path) -> list[str]:
    """The learners of a class file, in order, each once (one name a line; ``#`` starts a comment)."""
    learners = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if not NAME.match(name):
            raise SystemExit(f"{path}:{number}: {name!r} is not a valid account name (a-z, 0-9, _ and -)")
        if name not in learners:
            learners.append(name)
    return learners


def run(*command, user: str | None = None, cwd=None, env=None, check=True) -> subprocess.CompletedProcess:
    if user is not None:
        command = ("runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in (env or {}).items()], *command)
        env = None
    print("+", " ".join(map(str, command)), flush=True)
    # from / unless told: a Python started here imports nothing from the folder the command was typed in
    return subprocess.run([str(part) for part in command], cwd=cwd or "/", env=env, check=check)


def exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def ensure_user(name: str, home_base: str) -> bool:
    """A system account with a private home (mode 700); True when it was created now."""
    if exists(name):
        return False
    run("useradd", "--create-home", "--home-dir", f"{home_base}/{name}", "--shell", "/bin/bash", "--user-group", name)
    os.chmod(pwd.getpwnam(name).pw_dir, 0o700)
    return True


# ------------------------------------------------------------------------------------------------ configuration
def hub_config(settings: dict, learners: list[str]) -> str:
    prefix = Path(settings["prefix"])
    env = Path(settings["env"])
    users = [*learners, settings["instructor"]]
    return f"""# Written by scripts/class_hub.py setup: edit its options (or PREFIX/class.json) rather than this file.
import sys

sys.path.insert(0, {str(REPO / "jupyter" / "hub")!r})
from spawner import GpuPairSpawner  # noqa: E402

c = get_config()  # noqa: F821
c.JupyterHub.bind_url = "http://{settings["ip"]}:{settings["port"]}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {settings["hub_port"]}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{settings["proxy_api_port"]}"
c.ConfigurableHTTPProxy.command = [{str(prefix / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy")!r}]
c.ConfigurableHTTPProxy.pid_file = {str(prefix / "proxy.pid")!r}
c.JupyterHub.db_url = {"sqlite:///" + str(prefix / "jupyterhub.sqlite")!r}
c.JupyterHub.cookie_secret_file = {str(prefix / "jupyterhub_cookie_secret")!r}
c.JupyterHub.pid_file = {str(prefix / "jupyterhub.pid")!r}
# PAM: each learner logs in with their system account's password (see docs/instructors.md for an OAuth login)
c.Authenticator.allowed_users = {set(users)!r}
c.Authenticator.admin_users = {{{settings["instructor"]!r}}}
c.JupyterHub.spawner_class = GpuPairSpawner
c.Spawner.cmd = [{str(env / "bin" / "jupyterhub-singleuser")!r}]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.GpuPairSpawner.order = {users!r}
c.GpuPairSpawner.instructors = [{settings["instructor"]!r}]
c.GpuPairSpawner.gpus_per_learner = {settings["gpus_per_learner"]}
c.GpuPairSpawner.gpu_count = {settings["gpu_count"]}
# each server in a control group of its own (jupyter/hub/server_limits.py): memory, CPU, processes, file size, GPUs
c.Spawner.mem_limit = {int(settings["server_memory"] * (1 << 30))}
c.Spawner.cpu_limit = {float(settings["server_cpus"])}
c.GpuPairSpawner.learner_config = {str(prefix / "jupyter" / "learner")!r}
c.GpuPairSpawner.instructor_config = {str(prefix / "jupyter" / "instructor")!r}
""" + class_slurm.hub_config(settings)


def nbgrader_config(settings: dict, course_root: str | None = None) -> str:
    text = "c = get_config()  # noqa: F821\n"
    text += f"c.CourseDirectory.course_id = {settings['course_id']!r}\n"
    text += f"c.Exchange.root = {settings['exchange']!r}\n"
    if course_root:
        text += f"c.CourseDirectory.root = {course_root!r}\n"
    return text


# The learner's JupyterLab: the Assignments tab (fetch, submit, feedback) without nbgrader's instructor tools
LEARNER_SERVER = {
    "ServerApp": {
        "jpserver_extensions": {
            "nbgrader.server_extensions.assignment_list": True,
            "nbgrader.server_extensions.course_list": True,
            "nbgrader.server_extensions.formgrader": False,
            "nbgrader.server_extensions.validate_assignment": False,
        }
    }
}
LEARNER_LAB = {
    "disabledExtensions": {
        "@jupyter/nbgrader:formgrader": True,
        "@jupyter/nbgrader:create-assignment": True,
        "@jupyter/nbgrader:validate-assignment": True,
        # JupyterLab's "official Jupyter news?" pop-up, which covers the notebook's outputs
        "@jupyterlab/apputils-extension:announcements": True,
    }
}


def write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` unless the file already holds it (so a second setup changes nothing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
        print(f"wrote {path}", flush=True)
    os.chmod(path, mode)


def course_dir(settings: dict) -> Path:
    if settings["course_dir"]:
        return Path(settings["course_dir"])
    return Path(pwd.getpwnam(settings["instructor"]).pw_dir) / settings["course_id"]


def settings_of(args) -> dict:
    saved = Path(args.prefix or DEFAULTS["prefix"]) / "class.json"
    settings = dict(DEFAULTS)
    if saved.is_file():
        settings.update(json.loads(saved.read_text()))
    for key in DEFAULTS:
        value = getattr(args, key, None)
        if value is not None:
            settings[key] = value
    return settings


def unreachable(path: Path) -> Path | None:
    """The first folder on the way to ``path`` that other users cannot enter, or None."""
    for folder in [*reversed(Path(path).resolve().parents), Path(path).resolve()]:
        if folder.is_dir() and not os.stat(folder).st_mode & 0o001:
            return folder
    return None


# ------------------------------------------------------------------------------------------------ the environment
PROBE = "import torch, gpulab, nbgrader, jupyterlab, jupyterhub, ipykernel"


# where the standard library comes from: a venv's Python copied from a closed folder (`venv --copies` of a Python
# under /root/.pyenv) still starts as another account, on a system Python's standard library of another release
STDLIB = "import os, sys; print(os.__file__, sys.version)"


def runs_as(user: str, python: Path, code: str) -> bool:
    """Whether ``python -c code`` succeeds as ``user`` (from /, with a bare environment), on the same standard
    library as for root."""
    command = ["runuser", "-u", user, "--", "env", "-i", "PATH=/usr/bin:/bin", str(python), "-c"]
    if subprocess.run([*command, code], cwd="/", capture_output=True).returncode != 0:
        return False
    theirs = subprocess.run([*command, STDLIB], cwd="/", capture_output=True, text=True).stdout
    return theirs == subprocess.run([str(python), "-c", STDLIB], cwd="/", capture_output=True, text=True).stdout


def source_stamp(settings: dict, base: Path) -> str:
    """A digest of what the built environment is made from: gpulab's files, the pins, the base Python."""
    digest = hashlib.sha256()
    for spec in (settings["torch"], JUPYTERHUB, str(base)):
        digest.update(spec.encode() + b"\0")
    for name in PACKAGE_FILES:
        path = REPO / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if file.is_file() and "__pycache__" not in file.parts and ".egg-info" not in str(file):
                digest.update(str(file.relative_to(REPO)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def editable_from_repository(python: Path) -> bool:
    """Whether ``python``'s gpulab is this repository's own ``utils/`` (an editable install): every account that
    runs it would need to read the repository, ``source/`` and ``autograder/`` beside it."""
    code = "import gpulab, sys; sys.stdout.write(gpulab.__file__)"
    where = subprocess.run([str(python), "-c", code], cwd="/", capture_output=True, text=True)
    return where.returncode == 0 and Path(where.stdout).resolve().is_relative_to(REPO.resolve())


def readable_by(user: str, path: Path) -> bool:
    """Whether ``user`` can read ``path`` (a folder: enter it), asked of the system as that account."""
    flag = "-r" if not Path(path).is_dir() else "-x"
    return subprocess.run(["runuser", "-u", user, "--", "test", flag, str(path)], capture_output=True).returncode == 0


def exposed_to_learners(learners: list[str], root: Path = REPO) -> list[str]:
    """What of the clone at ``root`` a learner of the class can read (every learner has the same rights on it: the
    first one is asked). Learners need nothing of the clone (their environment is a copy of gpulab), while it
    holds every solution (``source/``), the grader's checks and answer keys (``autograder/``), full-mark
    submissions (``tests/``) and the history of all of them (``.git``): any of it readable is too much."""
    if not learners or not readable_by(learners[0], root):
        return []
    return sorted(name for name in os.listdir(root) if readable_by(learners[0], root / name))


def refuse_an_open_repository(learners: list[str], root: Path = REPO) -> None:
    exposed = exposed_to_learners(learners, root)
    if exposed:
        shown_names = ", ".join(exposed[:12]) + (", ..." if len(exposed) > 12 else "")
        raise SystemExit(
            f"a learner can read {shown_names} in {root}, which holds every solution, the grader's checks and "
            f"full-mark submissions: close the clone first (chmod 700 {root}), or keep it in a folder only root can "
            "enter; learners need nothing of it"
        )


def refuse_an_open_course(settings: dict, learners: list[str]) -> None:
    """Stop where a learner can enter the instructor's course folder (a folder on the way to it, or an ACL, left it
    open): grading leaves there the lessons with their solutions, every learner's staged work, the gradebook and the
    secrets that name each learner's feedback page."""
    course = course_dir(settings)
    if learners and course.exists() and readable_by(learners[0], course):
        raise SystemExit(f"a learner can enter the course folder {course}: close it first (chmod 700 {course})")


def exchange_course(settings: dict) -> Path:
    """nbgrader's exchange, with the course's folders made now, the instructor's, with nbgrader's own modes
    (course 755, outbound 755, inbound 3733: learners submit but cannot list or remove another's entry, feedback
    711), so that no learner can make them first. A folder of those names that the instructor does not own (made
    by a learner while the exchange's root was open to all), or a link, is moved aside and named."""
    exchange = Path(settings["exchange"])
    exchange.mkdir(parents=True, exist_ok=True)
    os.chmod(exchange, 0o1777)  # nbgrader's release insists on ugo+rwx; the sticky bit protects every entry
    instructor = pwd.getpwnam(settings["instructor"])
    course = exchange / settings["course_id"]
    # inbound: nbgrader's 2733 plus the sticky bit, so that only an entry's maker (or the instructor) can rename or
    # remove it, even knowing its name (nbgrader makes every entry 0777); nbgrader keeps a folder's existing mode
    modes = {course: 0o755, course / "outbound": 0o755, course / "inbound": 0o3733, course / "feedback": 0o711}
    for folder, mode in modes.items():
        try:
            status = folder.lstat()
        except FileNotFoundError:
            folder.mkdir()
        else:
            if not stat.S_ISDIR(status.st_mode) or status.st_uid != instructor.pw_uid:
                aside = folder.with_name(f".untrusted-{folder.name}-{int(time.time())}")
                folder.rename(aside)
                print(f"moved {folder} aside to {aside}: made by uid {status.st_uid}, not the instructor", flush=True)
                folder.mkdir()
        os.lchown(folder, instructor.pw_uid, instructor.pw_gid)
        os.chmod(folder, mode)
    return exchange


def base_python(settings: dict, user: str) -> Path:
    """A Python 3.10+ with venv that ``user`` can run: --base-python, else the first of BASE_PYTHONS."""
    candidates = [settings["base_python"]] if settings["base_python"] else list(BASE_PYTHONS)
    check = "import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))"
    for candidate in candidates:
        if Path(candidate).is_file() and runs_as(user, Path(candidate), check):
            return Path(candidate)
    raise SystemExit(
        f"no Python 3.10+ with venv that every account can run among {', '.join(candidates)}: install one "
        "(Debian: apt-get install python3 python3-venv) and pass it with --base-python, or pass --env a course "
        "environment (`make env`) in a folder every account can enter, e.g. a clone of the repository under /opt"
    )


def shared_env(settings: dict, prefix: Path, given: Path) -> Path:
    """The course environment every account runs: ``given`` when it runs as another account (JupyterHub is added
    to it if missing), else one built or brought up to date under ``PREFIX/env``."""
    user = settings["instructor"]
    python = given / "bin" / "python"
    closed = unreachable(given) if python.exists() else None
    if closed is not None:
        print(
            f"{given} is behind {closed}, closed to other accounts: building the course environment under "
            f"{prefix / 'env'}",
            flush=True,
        )
    elif python.exists() and editable_from_repository(python):
        print(
            f"{given} imports gpulab from this repository (an editable install): learners would read the "
            f"repository through it; building the course environment under {prefix / 'env'}",
            flush=True,
        )
    elif python.exists() and given.resolve() != (prefix / "env").resolve():
        run("chmod", "-R", "o+rX", given)
        if runs_as(user, python, PROBE.removesuffix(", jupyterhub, ipykernel")):
            if subprocess.run([python, "-c", PROBE], cwd="/", capture_output=True).returncode != 0:
                run(python, "-m", "pip", "install", "--quiet", JUPYTERHUB, "ipykernel")
            return given
        print(
            f"{given} does not run as {user} (a folder on its way, or its Python's, is closed to others, or gpulab "
            f"is an editable install of a closed folder): building the course environment under {prefix / 'env'}",
            flush=True,
        )
    return build_env(settings, prefix / "env", user)


def build_env(settings: dict, env: Path, user: str) -> Path:
    """A venv at ``env`` from a Python every account can run: torch first (--torch), then a copy of gpulab with its
    course extra (not an editable install: the repository may sit where learners cannot read), JupyterHub and
    ipykernel, and the course's kernel ``python3`` registered in it for everyone. Rebuilt only when its sources
    changed (``gpulab-source.sha256`` in it)."""
    base = base_python(settings, user)
    stamp_file = env / "gpulab-source.sha256"
    stamp = source_stamp(settings, base)
    python = env / "bin" / "python"
    if stamp_file.is_file() and stamp_file.read_text().strip() == stamp and runs_as(user, python, PROBE):
        print(f"course environment {env} is current", flush=True)
        return env
    began = time.monotonic()
    old = os.umask(0o022)  # every file readable by all, whatever the caller's umask
    try:
        if python.exists() and Path(os.path.realpath(python)).parent != base.resolve().parent:
            shutil.rmtree(env)  # made from another Python: start again
        if python.exists():
            run(python, "-m", "pip", "uninstall", "--quiet", "--yes", "gpulab")  # same version number, new files
        else:
            run(base, "-m", "venv", env)
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        if subprocess.run([python, "-c", "import torch"], cwd="/", capture_output=True).returncode != 0:
            run(*pip, settings["torch"])  # first and on its own: the build asked for wins over any resolver's pick
        with tempfile.TemporaryDirectory(prefix="gpulab-src-") as folder:
            source = Path(folder) / "gpulab"
            source.mkdir()
            for name in PACKAGE_FILES:
                path = REPO / name
                if path.is_dir():
                    shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
                elif path.is_file():
                    shutil.copyfile(path, source / name)
            run(*pip, f"{source}[course]", JUPYTERHUB, "ipykernel")
        run(python, *KERNEL_INSTALL)
    finally:
        os.umask(old)
    run("chmod", "-R", "o+rX", env)
    if not runs_as(user, python, PROBE):
        raise SystemExit(f"the course environment {env} does not run as {user}: is a folder on the way to it closed?")
    stamp_file.write_text(stamp + "\n")
    print(f"course environment {env} ready ({time.monotonic() - began:.0f} s)", flush=True)
    return env


def setup(args) -> None:
    if os.geteuid() != 0:
        raise SystemExit("setup makes accounts and folders for the class: run it as root")
    settings = settings_of(args)
    prefix, env = Path(settings["prefix"]), Path(settings["env"])
    learners = read_class(args.class_file)
    if settings["instructor"] in learners:
        raise SystemExit(f"{settings['instructor']} is the instructor; take them out of {args.class_file}")
    saved = prefix / "class.json"
    known = json.loads(saved.read_text()).get("learners", []) if saved.is_file() else []
    order = [*known, *[name for name in learners if name not in known]]  # nobody's GPUs move when one is added
    for name in [settings["instructor"], *order]:
        if ensure_user(name, settings["home_base"]):
            print(f"added account {name} (set a password: passwd {name})", flush=True)
    refuse_an_open_repository(order)
    # one shared environment for everybody (torch, gpulab, JupyterLab, nbgrader, JupyterHub): every learner's server
    # and kernel run it as that learner, so it must run as another account; --env when it does, else PREFIX/env
    env = shared_env(settings, prefix, env)
    settings["env"] = str(env)
    class_slurm.configure(settings, args)
    class_slurm.prepare(settings, run)
    proxy = prefix / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
    if not proxy.exists():
        (prefix / "proxy").mkdir(parents=True, exist_ok=True)
        run("npm", "install", "--no-fund", "--no-audit", "--prefix", prefix / "proxy", PROXY)
    exchange_course(settings)
    write(prefix / "jupyter" / "learner" / "jupyter_server_config.json", json.dumps(LEARNER_SERVER, indent=2))
    write(prefix / "jupyter" / "learner" / "labconfig" / "page_config.json", json.dumps(LEARNER_LAB, indent=2))
    write(prefix / "jupyter" / "learner" / "nbgrader_config.py", nbgrader_config(settings))
    course = course_dir(settings)
    write(prefix / "jupyter" / "instructor" / "nbgrader_config.py", nbgrader_config(settings, str(course)))
    instructor = pwd.getpwnam(settings["instructor"])
    if not course.exists():
        course.mkdir(parents=True)
        os.chown(course, instructor.pw_uid, instructor.pw_gid)
    os.chmod(course, 0o700)  # what grading leaves there (solutions, every learner's work, secrets) is the instructor's
    refuse_an_open_course(settings, order)
    write(course / "nbgrader_config.py", nbgrader_config(settings, str(course)))
    os.chown(course / "nbgrader_config.py", instructor.pw_uid, instructor.pw_gid)
    write(prefix / "jupyterhub_config.py", hub_config(settings, order), 0o600)
    settings["learners"] = order
    write(saved, json.dumps(settings, indent=2) + "\n", 0o600)
    gpus = settings["gpu_count"] if settings["gpu_count"] >= 0 else None
    if gpus is not None:
        for name, group in plan(order, gpus, settings["gpus_per_learner"]).items():
            print(f"  {name}: GPUs {','.join(map(str, group)) or 'none (virtual devices)'}")
    print(f"class ready: {len(order)} learner(s); start the hub with: {sys.executable} {__file__} start", flush=True)


# ------------------------------------------------------------------------------------------------ the cycle
def as_instructor(settings: dict, *nbgrader_args: str) -> None:
    home = pwd.getpwnam(settings["instructor"]).pw_dir
    python = Path(settings["env"]) / "bin" / "python"
    env = {
        "HOME": home,
        "JUPYTER_CONFIG_PATH": str(Path(settings["prefix"]) / "jupyter" / "instructor"),
        "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin",  # nbgrader runs alembic from the environment
    }
    run(python, "-m", "nbgrader", *nbgrader_args, user=settings["instructor"], cwd=course_dir(settings), env=env)


def due_date(text: str) -> str:
    """``--due``: checked by grade.py's own ``--duedate`` parser (nbgrader's ``parse_utc``: UTC unless a zone is
    named), so a date kept at release is one grading accepts. Imported here only: other commands need no nbgrader."""
    from autograder.grade import due_date as parsed_as_grading_does

    parsed_as_grading_does(text)  # raises argparse.ArgumentTypeError, which argparse reports as a usage error
    return text


def release(args) -> None:
    settings = settings_of(args)
    if args.due:
        saved = Path(settings["prefix"]) / "class.json"
        kept = json.loads(saved.read_text()) if saved.is_file() else {}
        kept.setdefault("due", {})[args.assignment] = args.due
        write(saved, json.dumps(kept, indent=2) + "\n", 0o600)
    course = course_dir(settings)
    instructor = pwd.getpwnam(settings["instructor"])
    for edition, suffix in EDITIONS.items():
        lesson = REPO / "lessons" / (args.assignment if edition == "en" else f"{edition}/{args.assignment}")
        if not lesson.is_dir():
            raise SystemExit(f"no release at {lesson}: run `make lessons`")
        name = args.assignment + suffix
        target = course / "release" / name
        if (Path(settings["exchange"]) / settings["course_id"] / "outbound" / name).is_dir() and not args.force:
            print(f"{name} is released already (--force to release it again)", flush=True)
            continue
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(lesson, target)
        for path in [course / "release", *target.rglob("*"), target]:
            os.chown(path, instructor.pw_uid, instructor.pw_gid)
        as_instructor(settings, "release_assignment", name, *(["--force"] if args.force else []))


def as_account(user: str, function, *args):
    """``function(*args)`` in a forked child that runs as ``user`` (its groups, uid and gid, home), its result
    passed back as JSON: what collect reads is read with no more right than the instructor's."""
    account = pwd.getpwnam(user)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(read_end)
            os.initgroups(user, account.pw_gid)
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            os.environ["HOME"] = account.pw_dir
            with os.fdopen(write_end, "w") as pipe:
                json.dump(function(*args), pipe)
            code = 0
        except BaseException as error:  # noqa: BLE001 - reported by the parent
            with contextlib.suppress(OSError):
                os.write(write_end, json.dumps({"error": repr(error)}).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    _, status = os.waitpid(child, 0)
    answer = json.loads(text) if text else {"error": f"exit status {status}"}
    if os.waitstatus_to_exitcode(status) != 0 or "error" in answer:
        raise SystemExit(f"collect failed as {user}: {answer.get('error')}")
    return answer


def collect_and_stage(inbound: str, roster: dict[str, int], notebooks: list[str], lesson: str, staged: str) -> dict:
    """As the instructor: collect each learner's latest valid entry of ``lesson`` (either edition; its release's
    ``notebooks``) from the exchange (``class_collect.py``), lay the chosen ones out in ``staged`` for grade.py, and
    return what was taken and every finding, as plain data."""
    assignments = {lesson + suffix: set(notebooks) for suffix in EDITIONS.values()}
    collected = class_collect.collect(Path(inbound), roster, assignments)
    class_collect.stage(collected, Path(staged), lesson)
    return {
        "chosen": {
            learner: {"assignment": s.assignment, "entry": s.entry, "timestamp": s.timestamp, "secret": s.secret}
            for learner, s in collected.chosen.items()
        },
        "findings": [asdict(finding) for finding in collected.findings],
    }


def delegated_group(settings: dict, user: str):
    """A cgroup for the instructor's grading, handed to that account (``autograder/cgroups.py``: grade.py makes
    every kernel's and worker's group inside it), or None where none can be made (grade.py then says how it
    counts memory)."""
    from autograder import cgroups

    try:
        group = cgroups.Hierarchy.find().child(f"gpulab-class-grading-{os.getpid()}")
    except cgroups.Unavailable as error:
        print(f"note: no cgroup for the grading ({error})", flush=True)
        return None
    account = pwd.getpwnam(user)
    for folder in group.folders.values():
        for path in [folder, *(folder / name for name in DELEGATED if (folder / name).exists())]:
            os.chown(path, account.pw_uid, account.pw_gid)
    return group


# the files of a cgroup its delegate writes (cgroup v2's delegation model; v1 needs the folder and cgroup.procs)
DELEGATED = ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads", "tasks")


def run_as(user: str, command: list, group=None, env: dict | None = None) -> int:
    """``command`` as ``user`` (no shell, no PAM session: the process itself drops its rights), inside ``group``."""
    account = pwd.getpwnam(user)

    def become() -> None:
        if group is not None:
            for path in group.procs_files():
                with open(path, "w") as handle:
                    handle.write(str(os.getpid()))
        os.initgroups(user, account.pw_gid)
        os.setgid(account.pw_gid)
        os.setuid(account.pw_uid)

    print("+", f"(as {user})", " ".join(map(str, command)), flush=True)
    environment = {"HOME": account.pw_dir, "USER": user, "LOGNAME": user, "PATH": "/usr/local/bin:/usr/bin:/bin"}
    environment.update(env or {})
    return subprocess.run(
        [str(part) for part in command], preexec_fn=become, env=environment, cwd=account.pw_dir
    ).returncode


# what grade.py reads of the repository (solutions/: the references and hidden draws its checks compute from): copied
# into the instructor's private course folder before each grading, so that the repository itself may stay closed to
# every other account
GRADING_KIT = ("autograder", "solutions", "source", "scripts", "pyproject.toml", "README.md")


def grading_kit(settings: dict) -> Path:
    """A fresh copy of what grade.py needs (``GRADING_KIT``) in ``<course>/kit``, the instructor's, mode 700."""
    course = course_dir(settings)
    kit = course / "kit"
    shutil.rmtree(kit, ignore_errors=True)
    kit.mkdir(mode=0o700)
    ignore = shutil.ignore_patterns("__pycache__", "*.ipynb_checkpoints", "*.egg-info")
    for name in GRADING_KIT:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, kit / name, ignore=ignore)
        elif path.is_file():
            shutil.copyfile(path, kit / name)
    chown_tree(kit, settings["instructor"])
    return kit


def chown_tree(path: Path, user: str) -> None:
    """Give ``path`` and everything below it to ``user``, never following a link (the sandbox's own walk)."""
    from autograder.sandbox import chown_tree as give

    account = pwd.getpwnam(user)
    give(path, account.pw_uid, account.pw_gid)


def report_findings(findings: list[dict], out: Path, roster: list[str]) -> None:
    """Print what collect took, refused and skipped, per learner, and write it to ``out/collect.csv``."""
    import csv

    learners = set(roster)
    taken = {f["learner"] for f in findings if f["verdict"] == "taken"}
    rows = [*findings]
    rows += [
        {"learner": name, "entry": "", "verdict": "missing", "reason": "no entry that can be graded"}
        for name in sorted(learners - taken)
    ]
    rows.sort(key=lambda f: (f["learner"], f["verdict"] != "taken", f["entry"]))
    from autograder.export import neutralised  # grades.csv's rule: no cell a spreadsheet would run as a formula

    with open(out / "collect.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["learner", "entry", "verdict", "reason"], lineterminator="\n")
        writer.writeheader()
        writer.writerows({key: neutralised(str(value)) for key, value in row.items()} for row in rows)
    print("\ncollect (every entry of the exchange for this lesson, by the learner who made it):")
    width = max(len(row["learner"]) for row in rows) if rows else 0
    for row in rows:
        print(f"  {row['learner'].ljust(width)}  {row['verdict']:<10}  {row['entry'] or '-'}: {row['reason']}")


def grade(args) -> int:
    if os.geteuid() != 0:
        raise SystemExit(
            "grade collects and grades as the instructor, and gives each learner's feedback: run it as root"
        )
    os.umask(0o077)  # what collect stages, grade.py writes and feedback copies: the instructor's alone
    settings = settings_of(args)
    course = course_dir(settings)
    instructor = settings["instructor"]
    refuse_an_open_course(settings, settings.get("learners", []))
    lesson = args.assignment
    due = args.due or settings.get("due", {}).get(lesson)
    roster = {name: pwd.getpwnam(name).pw_uid for name in settings.get("learners", []) if exists(name)}
    staged = course / "to-grade"
    out = course / "grading"
    for folder in (staged, out):
        if folder.is_symlink() or folder.is_file():
            folder.unlink()
        elif folder.exists():
            chown_tree(folder, instructor)
    shutil.rmtree(staged, ignore_errors=True)
    inbound = Path(settings["exchange"]) / settings["course_id"] / "inbound"
    notebooks = sorted(p.name for p in (REPO / "lessons" / lesson).glob("*.ipynb"))
    if not notebooks:
        raise SystemExit(f"no release of {lesson} in {REPO / 'lessons'}: run `make lessons`")
    taken = as_account(instructor, collect_and_stage, str(inbound), roster, notebooks, lesson, str(staged))
    chosen = taken["chosen"]
    out.mkdir(exist_ok=True)
    chown_tree(out, instructor)
    code = 0
    if chosen:
        kit = grading_kit(settings)
        python = Path(settings["env"]) / "bin" / "python"
        roster_file = course / "roster.txt"  # every learner gets a row in grades.csv, 0 where nothing was taken
        roster_file.write_text("".join(f"{name}\n" for name in roster))
        chown_tree(roster_file, instructor)
        command = [python, kit / "autograder" / "grade.py", staged, "--out", out, "--assignment", lesson]
        command += ["--roster", roster_file]
        # as the instructor every kernel runs as that account on the host: one at a time (--workers 1, the default
        # here), a kernel that exhausts the account's per-uid limits (epoll, inotify watches) harms only itself
        command += ["--no-progress", "--workers", str(args.workers), *(["--duedate", due] if due else [])]
        if args.slurm:  # a job array, several learners per task, merged into one gradebook (scripts/class_slurm.py)
            array = class_slurm.grade_array(settings, args, run_as, kit, staged, out, lesson, due, sorted(chosen))
            code, taken["findings"] = array["code"], taken["findings"] + array["findings"]
        else:
            group = delegated_group(settings, instructor)
            try:
                code = run_as(instructor, command, group)
            finally:
                if group is not None:
                    group.remove()
    else:
        print(f"no submission of {lesson} to grade", flush=True)
    findings = taken["findings"]
    # feedback: grade.py's pages, with the measured timestamp and the secret of the entry they grade
    # (release_feedback names each page by a hash of that secret, which only the learner's own copy holds)
    released = set()
    for learner, entry in sorted(chosen.items()):
        pages = [p for p in sorted((out / "feedback" / learner / lesson).glob("*.html")) if _regular(p)]
        if not pages or not entry["secret"]:
            why = "no feedback page" if not pages else "no valid submission_secret.txt"
            findings.append({"learner": learner, "entry": entry["entry"], "verdict": "no feedback", "reason": why})
            continue
        target = course / "feedback" / learner / entry["assignment"]
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for page in pages:
            shutil.copyfile(page, target / page.name, follow_symlinks=False)
            os.chmod(target / page.name, 0o644)  # release_feedback copies its mode: the learner reads it by name
        (target / "timestamp.txt").write_text(entry["timestamp"])
        (target / "submission_secret.txt").write_text(entry["secret"])
        chown_tree(course / "feedback", instructor)
        released.add(entry["assignment"])
    report_findings(findings, out, list(roster))
    chown_tree(out, instructor)
    for name in sorted(released):
        as_instructor(settings, "release_feedback", name)
    return code


def _regular(path: Path) -> bool:
    return stat.S_ISREG(path.lstat().st_mode)


# the hub's state: its database (users, the admin flag, servers' ports, token hashes), cookie secret, configuration
HUB_STATE = ("jupyterhub.sqlite", "jupyterhub_cookie_secret", "jupyterhub_config.py", "class.json")


def start(args) -> None:
    settings = settings_of(args)
    prefix = Path(settings["prefix"])
    refuse_an_open_repository(settings.get("learners", []))
    hub = Path(settings["env"]) / "bin" / "jupyterhub"
    os.chdir(prefix)
    # readable by the hub only: what it creates from now on (umask), and what an earlier start left
    os.umask(0o077)
    for name in HUB_STATE:
        if (prefix / name).is_file():
            os.chmod(prefix / name, 0o600)
    os.execv(hub, [str(hub), "-f", str(prefix / "jupyterhub_config.py")])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefix", help=f"the hub's folder (default {DEFAULTS['prefix']})")
    commands = parser.add_subparsers(dest="command", required=True)
    set_up = commands.add_parser("setup", help="accounts, environment, proxy, exchange and configuration")
    set_up.add_argument("class_file", type=Path)
    set_up.add_argument(
        "--env",
        help="the course's shared environment (default: the repository's .venv); when it does not run as another "
        "account (e.g. the repository sits under a closed home), one is built under PREFIX/env instead",
    )
    set_up.add_argument("--torch", help=f"the torch requirement of a built environment (default {TORCH})")
    set_up.add_argument(
        "--base-python",
        dest="base_python",
        help=f"the Python a built environment is made from (default: the first of {', '.join(BASE_PYTHONS)} "
        "that every account can run)",
    )
    set_up.add_argument("--exchange", help=f"nbgrader's exchange (default {DEFAULTS['exchange']})")
    set_up.add_argument("--course-id", dest="course_id")
    set_up.add_argument("--instructor", help="the instructor's account (default instructor)")
    set_up.add_argument("--course-dir", dest="course_dir", help="the instructor's course folder")
    set_up.add_argument("--home-base", dest="home_base", help="where new accounts' homes go (default /home)")
    set_up.add_argument("--ip", help="address the hub listens on (default: all)")
    set_up.add_argument("--port", type=int, help="the hub's public port (default 8000)")
    set_up.add_argument("--hub-port", dest="hub_port", type=int, help="the hub's internal API port (8081)")
    set_up.add_argument("--proxy-api-port", dest="proxy_api_port", type=int, help="the proxy's API port (8001)")
    set_up.add_argument("--gpus-per-learner", dest="gpus_per_learner", type=int, help="default 2")
    set_up.add_argument("--gpu-count", dest="gpu_count", type=int, help="GPUs to share out (default: nvidia-smi's)")
    set_up.add_argument(
        "--server-memory", dest="server_memory", type=float, help="GiB each learner's server may hold (default 8)"
    )
    set_up.add_argument("--server-cpus", dest="server_cpus", type=float, help="CPU cores each server may use (2)")
    class_slurm.add_setup_arguments(set_up)
    commands.add_parser("start", help="run the hub")
    for name, what in (("release", "release a lesson, both editions"), ("grade", "collect, grade, feedback")):
        sub = commands.add_parser(name, help=what)
        sub.add_argument("assignment")
        sub.add_argument(
            "--due",
            type=due_date,
            help="due date, ISO 8601 (UTC unless it names a zone), e.g. 2027-01-15T17:00: later submissions are "
            "graded and marked late; given at release it is kept for grade",
        )
        if name == "release":
            sub.add_argument("--force", action="store_true", help="release again")
        else:
            sub.add_argument(
                "--workers",
                type=int,
                default=1,
                help="kernels graded at once (default 1: as the instructor they share that account's per-uid limits, "
                "so one at a time keeps a kernel that exhausts them from harming another's grading)",
            )
            class_slurm.add_grade_arguments(sub)
    args = parser.parse_args(argv)
    # every Python this command starts runs from /, so that none imports a module from the folder it was typed in
    # (a learner's gpulab.py in /tmp would otherwise run as root in setup's checks)
    if args.prefix:
        args.prefix = os.path.abspath(args.prefix)
    if getattr(args, "class_file", None):
        args.class_file = Path(os.path.abspath(args.class_file))
    os.chdir("/")
    if args.command == "setup":
        setup(args)
    elif args.command == "start":
        start(args)
    elif args.command == "release":
        release(args)
    else:
        return grade(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
