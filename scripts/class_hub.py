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
import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "jupyter" / "hub"))

from gpu_pairs import plan  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
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
    return subprocess.run([str(part) for part in command], cwd=cwd, env=env, check=check)


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
c.GpuPairSpawner.learner_config = {str(prefix / "jupyter" / "learner")!r}
c.GpuPairSpawner.instructor_config = {str(prefix / "jupyter" / "instructor")!r}
"""


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
    return theirs == subprocess.run([str(python), "-c", STDLIB], capture_output=True, text=True).stdout


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
    elif python.exists() and given.resolve() != (prefix / "env").resolve():
        run("chmod", "-R", "o+rX", given)
        if runs_as(user, python, PROBE.removesuffix(", jupyterhub, ipykernel")):
            if subprocess.run([python, "-c", PROBE], capture_output=True).returncode != 0:
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
        if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0:
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
    # one shared environment for everybody (torch, gpulab, JupyterLab, nbgrader, JupyterHub): every learner's server
    # and kernel run it as that learner, so it must run as another account; --env when it does, else PREFIX/env
    env = shared_env(settings, prefix, env)
    settings["env"] = str(env)
    proxy = prefix / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
    if not proxy.exists():
        (prefix / "proxy").mkdir(parents=True, exist_ok=True)
        run("npm", "install", "--no-fund", "--no-audit", "--prefix", prefix / "proxy", PROXY)
    # nbgrader's exchange: anyone may create entries in the root (the instructor's release creates the course's
    # folder with nbgrader's own modes); the sticky bit keeps anyone from renaming or deleting another's entry
    exchange = Path(settings["exchange"])
    exchange.mkdir(parents=True, exist_ok=True)
    os.chmod(exchange, 0o1777)
    write(prefix / "jupyter" / "learner" / "jupyter_server_config.json", json.dumps(LEARNER_SERVER, indent=2))
    write(prefix / "jupyter" / "learner" / "labconfig" / "page_config.json", json.dumps(LEARNER_LAB, indent=2))
    write(prefix / "jupyter" / "learner" / "nbgrader_config.py", nbgrader_config(settings))
    course = course_dir(settings)
    write(prefix / "jupyter" / "instructor" / "nbgrader_config.py", nbgrader_config(settings, str(course)))
    instructor = pwd.getpwnam(settings["instructor"])
    if not course.exists():
        course.mkdir(parents=True)
        os.chown(course, instructor.pw_uid, instructor.pw_gid)
    write(course / "nbgrader_config.py", nbgrader_config(settings, str(course)))
    os.chown(course / "nbgrader_config.py", instructor.pw_uid, instructor.pw_gid)
    write(prefix / "jupyterhub_config.py", hub_config(settings, order), 0o600)
    settings["learners"] = order
    write(saved, json.dumps(settings, indent=2) + "\n")
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
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from autograder.grade import due_date as parsed_as_grading_does

    parsed_as_grading_does(text)  # raises argparse.ArgumentTypeError, which argparse reports as a usage error
    return text


def release(args) -> None:
    settings = settings_of(args)
    if args.due:
        saved = Path(settings["prefix"]) / "class.json"
        kept = json.loads(saved.read_text()) if saved.is_file() else {}
        kept.setdefault("due", {})[args.assignment] = args.due
        write(saved, json.dumps(kept, indent=2) + "\n")
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


def latest(folders: list[Path]) -> Path | None:
    """The submission folder with the latest ``timestamp.txt`` (nbgrader's format sorts as text)."""
    stamped = [(f.joinpath("timestamp.txt").read_text().strip(), f) for f in folders if f.is_dir()]
    return max(stamped)[1] if stamped else None


def grade(args) -> int:
    settings = settings_of(args)
    course = course_dir(settings)
    lesson = args.assignment
    due = args.due or settings.get("due", {}).get(lesson)
    for suffix in EDITIONS.values():
        as_instructor(settings, "collect", "--update", lesson + suffix)
    # each learner's latest submission, either edition, laid out for the one gradebook assignment
    staged = course / "to-grade"
    shutil.rmtree(staged, ignore_errors=True)
    chosen = {}
    submitted = course / "submitted"
    for student in sorted(p.name for p in submitted.iterdir()) if submitted.is_dir() else []:
        folder = latest([submitted / student / (lesson + suffix) for suffix in EDITIONS.values()])
        if folder is None:
            continue
        chosen[student] = folder
        target = staged / student / lesson
        target.mkdir(parents=True)
        for item in folder.iterdir():
            if item.suffix == ".ipynb" or item.name == "timestamp.txt":
                shutil.copyfile(item, target / item.name)
    if not chosen:
        print(f"no submission of {lesson} to grade", flush=True)
        return 0
    out = course / "grading"
    code = run(
        args.python,
        REPO / "autograder" / "grade.py",
        staged,
        "--out",
        out,
        "--assignment",
        lesson,
        "--no-progress",
        *(["--duedate", due] if due else []),
        check=False,
    ).returncode
    # feedback: grade.py's pages, with the timestamp and secret of the submission they grade (release_feedback
    # names each page by a hash of that secret, which only the learner's own copy of the submission holds)
    instructor = pwd.getpwnam(settings["instructor"])
    released = set()
    for student, folder in chosen.items():
        pages = sorted((out / "feedback" / student / lesson).glob("*.html"))
        if not pages:
            continue
        target = course / "feedback" / student / folder.name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for page in pages:
            shutil.copyfile(page, target / page.name)
        for name in ("timestamp.txt", "submission_secret.txt"):
            shutil.copyfile(folder / name, target / name)
        released.add(folder.name)
    for path in [course, *course.rglob("*")]:
        os.lchown(path, instructor.pw_uid, instructor.pw_gid)
    for name in sorted(released):
        as_instructor(settings, "release_feedback", name)
    return code


def start(args) -> None:
    settings = settings_of(args)
    prefix = Path(settings["prefix"])
    hub = Path(settings["env"]) / "bin" / "jupyterhub"
    os.chdir(prefix)
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
            sub.add_argument("--python", default=sys.executable, help="the Python that runs grade.py")
    args = parser.parse_args(argv)
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
