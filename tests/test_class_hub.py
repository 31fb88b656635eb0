"""A class on one box (``scripts/class_hub.py``): the GPU groups, and the whole cycle through a real JupyterHub.

The GPU assignment is a pure function (``jupyter/hub/gpu_pairs.py``), tested here with simulated GPU counts and
``nvidia-smi`` listings. The hub test closes the clone to other accounts (as the docs ask; ``setup`` and ``start``
refuse otherwise), makes three learner accounts and an instructor (random names, removed afterwards), runs
``setup``, starts the hub on free ports of 127.0.0.1 and drives it in Debian's Chromium: learner 1 logs in, fetches
lesson 01 in the Assignments tab, answers (the reference answers, saved through the learner's own server) and
submits; learner 3 does the same with the Japanese edition; learner 2 logs in for the first time (timed from
"Sign in" to the first output of lesson 01) and then, from a terminal, tries for a better grade than he earned
after the due date: an entry in learner 1's name, a link to learner 1's notebook, a folder named like the notebook,
and his own work back-dated. The instructor's side collects, grades with ``autograder/grade.py`` as the instructor
and releases feedback (``class_hub.py grade``); learner 1 fetches the feedback and reads the page. It checks that
the honest learners' grades equal grading their notebooks laid out by hand, that learner 2 gets his own late work
only and every refusal reported for him, that each server runs in its own control group, that the hub's state and
the exchange's course folders are not the learners', and that a learner can read neither another's home nor the
exchange's inbound, through the file system or the hub.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.lab_pages import wait_idle

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "jupyter" / "hub"))

from gpu_pairs import Device, gpus_for, listed_devices, plan, visible_devices  # noqa: E402

CLASS_HUB = REPO / "scripts" / "class_hub.py"
CHROMIUM = Path("/usr/bin/chromium")
LESSON = "01_splitting"


# ------------------------------------------------------------------------------------------------ GPU groups
@pytest.mark.parametrize(
    ("gpu_count", "expected"),
    [
        (0, [[], [], []]),  # no GPU: every GPU hidden, virtual devices
        (1, [[0], [0], [0]]),  # one GPU: everybody on it
        (2, [[0, 1], [0, 1], [0, 1]]),
        (3, [[0, 1], [0, 2], [1, 2]]),  # wraps round: each GPU serves two learners
        (8, [[0, 1], [2, 3], [4, 5]]),
    ],
)
def test_three_learners_spread_over_the_box(gpu_count, expected):
    learners = ["ann", "ben", "cho"]
    assert plan(learners, gpu_count) == dict(zip(learners, expected, strict=True))
    assert [visible_devices(i, gpu_count) for i in range(3)] == [",".join(map(str, g)) for g in expected]


def test_gpu_groups_use_every_gpu_evenly_and_honour_the_group_size():
    for gpu_count in range(1, 9):
        for per_learner in range(1, 4):
            uses = [0] * gpu_count
            for index in range(gpu_count * per_learner):  # a whole number of rounds
                group = gpus_for(index, gpu_count, per_learner)
                assert len(group) == min(per_learner, gpu_count)
                for gpu in group:
                    uses[gpu] += 1
            assert len(set(uses)) == 1, (gpu_count, per_learner, uses)
    assert gpus_for(5, 8, 0) == []
    with pytest.raises(ValueError):
        gpus_for(-1, 8)


NVIDIA_SMI_LIST = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-1111-2222-3333-444455556666)
  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-aaaa-bbbb-cccc-ddddeeeeffff)
  MIG 3g.20gb     Device  1: (UUID: MIG-0b1c2d3e-aaaa-bbbb-cccc-ddddeeeeffff)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-7e8f9a0b-1111-2222-3333-444455556666)
GPU 2: NVIDIA A100-SXM4-40GB (UUID: GPU-9a8b7c6d-1111-2222-3333-444455556666)
"""


def test_the_hubs_devices_are_the_drivers_gpus_and_the_mig_instances_of_a_gpu_in_mig_mode():
    """``nvidia-smi -L``'s order is the driver's (PCI bus id), the order the servers' ``CUDA_DEVICE_ORDER`` pins;
    a GPU in MIG mode is given out as its instances (``CUDA_VISIBLE_DEVICES`` takes their ``MIG-`` UUIDs)."""
    devices = listed_devices(NVIDIA_SMI_LIST)
    assert devices == [
        Device("MIG-c6d4f1ef-aaaa-bbbb-cccc-ddddeeeeffff", 0),
        Device("MIG-0b1c2d3e-aaaa-bbbb-cccc-ddddeeeeffff", 0),
        Device("1", 1),
        Device("2", 2),
    ]
    groups = [[devices[i].name for i in gpus_for(learner, len(devices))] for learner in range(2)]
    assert groups == [[devices[0].name, devices[1].name], ["1", "2"]]
    assert listed_devices("") == [] and listed_devices("No devices were found\n") == []


def test_class_file_keeps_order_drops_comments_and_refuses_bad_names(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    from class_hub import read_class

    listed = tmp_path / "class.txt"
    listed.write_text("# spring\nann\n\nben  # late joiner\nann\n")
    assert read_class(listed) == ["ann", "ben"]
    listed.write_text("ann\nRoot;rm\n")
    with pytest.raises(SystemExit, match="2"):
        read_class(listed)


@pytest.mark.parametrize(
    "text", ["2027-01-15T17:00", "2027-01-15 18:00+01:00", "2027-W03-5", "2027-01-15 17:00 CET", "next friday"]
)
def test_a_due_date_kept_at_release_is_one_grading_accepts(text):
    sys.path.insert(0, str(REPO / "scripts"))
    sys.path.insert(0, str(REPO))
    import argparse

    from class_hub import due_date as release_due_date

    from autograder.grade import due_date as grading_due_date

    def verdict(parse):
        try:
            parse(text)
        except argparse.ArgumentTypeError:
            return "refused"
        return "accepted"

    assert verdict(release_due_date) == verdict(grading_due_date)


@pytest.mark.skipif(os.geteuid() != 0, reason="asks the system as another account")
def test_setup_and_start_refuse_a_clone_a_learner_can_read():
    sys.path.insert(0, str(REPO / "scripts"))
    from class_hub import refuse_an_open_repository

    clone = Path(tempfile.mkdtemp(prefix="gpulab-clone-", dir="/tmp"))
    try:
        for name in ("source", "autograder", ".git", "tests"):
            (clone / name).mkdir()
        for path in [clone, *clone.iterdir()]:
            os.chmod(path, 0o755)
        with pytest.raises(SystemExit, match=r"\.git, autograder, source, tests in"):
            refuse_an_open_repository(["nobody"], clone)  # any account stands for a learner here
        for name in ("source", "autograder", ".git"):
            os.chmod(clone / name, 0o700)
        with pytest.raises(SystemExit, match=r"read tests in"):  # full-mark submissions, readable: refused
            refuse_an_open_repository(["nobody"], clone)
        os.chmod(clone, 0o700)  # closed, as the docs say: nothing in it is reached, whatever its own modes
        refuse_an_open_repository(["nobody"], clone)
    finally:
        shutil.rmtree(clone)


# ------------------------------------------------------------------------------------------------ the hub
def _free_ports(n: int) -> list[int]:
    import socket

    probes = [socket.socket() for _ in range(n)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _run(command: list, **options) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a session of its own, killed with all it started when the test stops (a failure, its
    timeout, Ctrl-C), so nothing writes into the test's folders after they are removed."""
    process = subprocess.Popen([str(part) for part in command], start_new_session=True, text=True, **options)
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _as(user: str, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *command], capture_output=True, text=True)


def _kill_users(users: list[str]) -> None:
    """Stop every process still running as one of the test's accounts (by pid), then remove the accounts."""
    import psutil

    uids = set()
    for user in users:
        with contextlib.suppress(KeyError):
            import pwd

            uids.add(pwd.getpwnam(user).pw_uid)
    for _ in range(3):
        left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in uids]
        if not left:
            break
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(left, timeout=10)
    for user in users:
        subprocess.run(["userdel", "--remove", user], capture_output=True)
        subprocess.run(["groupdel", user], capture_output=True)


@contextlib.contextmanager
def _class_hub(env: Path, extra_setup: tuple = (), name: str = "class_hub", again: bool = True):
    """Set up and start a hub for three learners on the course environment ``env`` (``tests/class_environment.py``:
    one built for the session, as ``setup`` builds one; ``extra_setup``: more options of ``setup``, e.g. a Slurm
    partition; ``again``: run ``setup`` a second time, after adding a learner, and check what it changed); yields
    its settings. Everything is removed afterwards; the logs are kept in test-artifacts/ as ``<name>_setup.log``
    and ``<name>_hub.log``."""
    tag = secrets.token_hex(3)
    learners = [f"gl{tag}{n}" for n in (1, 2, 3)]
    late_joiner = f"gl{tag}4"  # added to the class file after the first setup
    instructor = f"gi{tag}"
    users = [instructor, *learners, late_joiner]
    root = Path(tempfile.mkdtemp(prefix="class-hub-", dir="/tmp"))
    os.chmod(root, 0o755)  # the learners' homes are below it
    port, hub_port, api_port = _free_ports(3)
    prefix = root / "hub"
    hub = None
    # what an admin does first: the clone closed to every other account (setup and start refuse to run while a
    # learner can read any of it); put back as it was afterwards
    clone_mode = REPO.stat().st_mode & 0o7777
    os.chmod(REPO, 0o700)
    try:
        (root / "class.txt").write_text("\n".join(learners) + "\n")
        # --env: the session's course environment (built as setup builds one where the learners cannot run the
        # environment it is given, as this test's own, behind the closed clone); setup checks it and uses it
        setup = [sys.executable, CLASS_HUB, "--prefix", prefix, "setup", root / "class.txt", "--env", env]
        setup += ["--exchange", root / "exchange", "--instructor", instructor, "--home-base", root / "home"]
        setup += ["--ip", "127.0.0.1", "--port", port, "--hub-port", hub_port, "--proxy-api-port", api_port]
        setup += ["--gpu-count", "8"]  # simulated: the servers get CUDA_VISIBLE_DEVICES, this CPU has no GPU
        setup += list(extra_setup)
        # pip's and npm's caches inside the test's folder, removed with it
        caches = {"PIP_CACHE_DIR": str(root / "cache" / "pip"), "npm_config_cache": str(root / "cache" / "npm")}

        def set_up(log_name: str) -> str:
            began = time.monotonic()
            with open(root / log_name, "wb") as setup_log:
                done = _run(setup, stdout=setup_log, stderr=subprocess.STDOUT, env={**os.environ, **caches})
            print(f"class hub {log_name}: {time.monotonic() - began:.1f} s")
            if done.returncode != 0:
                raise RuntimeError("class_hub.py setup failed:\n" + (root / log_name).read_text()[-4000:])
            return (root / log_name).read_text()

        if not again:  # the same class in one setup: the late joiner (who never logs in) listed from the start
            (root / "class.txt").write_text("\n".join([*learners, late_joiner]) + "\n")
        first_run = set_up("setup.log")
        if again:
            # idempotent: after a learner is added to the class file, running it again adds that account and its GPU
            # group only; nobody else's account, GPUs or environment changes
            environment = json.loads((prefix / "class.json").read_text())["env"]
            built = (Path(environment) / "bin" / "python").lstat().st_mtime_ns
            (root / "class.txt").write_text("\n".join([learners[0], late_joiner, *learners[1:]]) + "\n")
            second_run = set_up("setup-again.log")
            assert [line for line in second_run.splitlines() if line.startswith("added account")] == [
                f"added account {late_joiner} (set a password: passwd {late_joiner})"
            ]
            groups = [line for line in second_run.splitlines() if ": GPUs " in line]
            assert groups == [line for line in first_run.splitlines() if ": GPUs " in line] + [
                f"  {late_joiner}: GPUs 6,7"
            ]
            assert json.loads((prefix / "class.json").read_text())["learners"] == [*learners, late_joiner]
            assert (Path(environment) / "bin" / "python").lstat().st_mtime_ns == built
            assert late_joiner in (prefix / "jupyterhub_config.py").read_text()
        passwords = {user: secrets.token_urlsafe(12) for user in users}
        chpasswd = "".join(f"{user}:{password}\n" for user, password in passwords.items())
        subprocess.run(["chpasswd"], input=chpasswd, text=True, check=True)
        log = open(root / "hub.log", "wb")  # noqa: SIM115 - closed below
        hub = subprocess.Popen(
            [sys.executable, CLASS_HUB, "--prefix", prefix, "start"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/hub/api", timeout=2)
                break
            except OSError:
                if hub.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((root / "hub.log").read_text()[-3000:]) from None
                time.sleep(0.3)
        yield {
            "url": url,
            "root": root,
            "prefix": prefix,
            "learners": learners,
            "late_joiner": late_joiner,
            "name": name,
            "instructor": instructor,
            "passwords": passwords,
            "course": root / "home" / instructor / "gpulab",
            "exchange": root / "exchange",
        }
    finally:
        if hub is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(hub.pid, signal.SIGTERM)  # the hub stops the learners' servers and its proxy
            try:
                hub.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(hub.pid, signal.SIGKILL)
                hub.wait()
            log.close()
        pid_file = prefix / "proxy.pid"
        if pid_file.is_file():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        _kill_users(users)
        os.chmod(REPO, clone_mode)
        artifacts = REPO / "test-artifacts"
        for log_name in ("setup.log", "hub.log"):
            if (root / log_name).is_file():
                artifacts.mkdir(exist_ok=True)
                shutil.copyfile(root / log_name, artifacts / f"{name}_{log_name}")
        shutil.rmtree(root, ignore_errors=True)


def _answered(fetched: dict, reference: dict) -> dict:
    """The fetched notebook with every answer cell's source replaced by the reference's (by grade id)."""
    answers = {
        cell["metadata"]["nbgrader"]["grade_id"]: cell["source"]
        for cell in reference["cells"]
        if cell["metadata"].get("nbgrader", {}).get("solution")
    }
    for cell in fetched["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell["source"] = answers[grade_id]
    return fetched


SAVE = """async ([path, notebook]) => {
    const xsrf = document.cookie.split('; ').find(c => c.startsWith('_xsrf=')).slice(6);
    const base = document.querySelector('body').dataset.baseUrl || window.location.pathname.split('lab')[0];
    const r = await fetch(base + 'api/contents/' + path, {method: 'PUT', headers: {'X-XSRFToken': xsrf,
        'Content-Type': 'application/json'}, body: JSON.stringify({type: 'notebook', format: 'json',
        content: notebook})});
    return r.status;
}"""


def _log_in(browser, hub: dict, user: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{hub['url']}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub["passwords"][user])
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=90_000)
    page.wait_for_selector(".lm-MenuBar-itemLabel", timeout=90_000)
    return page


def _assignments(page):
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
    page.wait_for_selector("#released_assignments_list", timeout=30_000)


def _fetch_answer_submit(page, hub: dict, user: str, assignment: str, reference: dict) -> None:
    """In the Assignments tab: fetch ``assignment``, answer it, submit it."""
    _assignments(page)
    row = page.locator("#released_assignments_list .list_item", has_text=assignment).filter(
        has_not_text=f"{assignment}_ja"
    )
    row.locator("button", has_text="Fetch").click()
    home = hub["root"] / "home" / user
    notebook = home / assignment / f"{LESSON}.ipynb"
    deadline = time.monotonic() + 30
    while not notebook.is_file():
        assert time.monotonic() < deadline, f"{assignment} was not fetched into {home}"
        time.sleep(0.3)
    answered = _answered(json.loads(notebook.read_text()), reference)
    assert page.evaluate(SAVE, [f"{assignment}/{LESSON}.ipynb", answered]) == 200
    fetched = page.locator("#fetched_assignments_list .list_item", has_text=assignment).filter(
        has_not_text=f"{assignment}_ja"
    )
    fetched.locator("button", has_text="Submit").first.click()
    page.locator("#submitted_assignments_list .list_item", has_text=assignment).first.wait_for(timeout=30_000)


def _submitted_at(hub: dict, user: str, suffix: str = ""):
    """When ``user`` submitted, as the system recorded it: the change time of their entry in the exchange's inbound
    (what collect grades by; nbgrader's ``timestamp.txt`` is the learner's word)."""
    (entry,) = (hub["exchange"] / "gpulab" / "inbound").glob(f"{user}+*{suffix}")
    return datetime.fromtimestamp(entry.stat().st_ctime, UTC).replace(tzinfo=None)


# what a learner can do from a terminal in their JupyterLab: make entries in the exchange's inbound by hand
MAKE_ENTRY = """
import json, os, sys
inbound, name, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
entry = os.path.join(inbound, name)
os.mkdir(entry)
for file, text in spec.get("files", {}).items():
    with open(os.path.join(entry, file), "w") as handle:
        handle.write(text)
for file, target in spec.get("links", {}).items():
    os.symlink(target, os.path.join(entry, file))
for folder in spec.get("folders", []):
    os.mkdir(os.path.join(entry, folder))
with open(os.path.join(entry, "timestamp.txt"), "w") as handle:
    handle.write(spec.get("timestamp", "2020-01-01 00:00:00.000000 UTC"))
if spec.get("secret", True):
    with open(os.path.join(entry, "submission_secret.txt"), "w") as handle:
        handle.write(os.urandom(64).hex())
"""


def _hand_made_entry(hub: dict, user: str, name: str, **spec) -> None:
    inbound = hub["exchange"] / "gpulab" / "inbound"
    made = _as(user, "/usr/bin/python3", "-c", MAKE_ENTRY, str(inbound), name, json.dumps(spec))
    assert made.returncode == 0, made.stderr


STOP_KERNELS = """async () => {
    const xsrf = document.cookie.split('; ').find(c => c.startsWith('_xsrf=')).slice(6);
    const base = document.querySelector('body').dataset.baseUrl || window.location.pathname.split('lab')[0];
    const kernels = await (await fetch(base + 'api/kernels', {headers: {'X-XSRFToken': xsrf}})).json();
    for (const kernel of kernels) {
        await fetch(base + 'api/kernels/' + kernel.id, {method: 'DELETE', headers: {'X-XSRFToken': xsrf}});
    }
    return kernels.length;
}"""


def _first_output_seconds(browser, hub: dict, user: str, notebook: str, others=None) -> tuple[float, dict | None]:
    """Seconds from pressing "Sign in" to the first output of ``notebook`` under Run All, pressed only once the
    status bar shows the kernel connected and idle (Run All before then runs nothing); and, given ``others``
    (``tests/machine_load.py: OtherWork``), what other work used of the machine meanwhile. The kernel is then shut
    down, so that the rest of the lesson costs the test nothing. Shared by the hub test and the Slurm test."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{hub['url']}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub["passwords"][user])
    if others is not None:
        others.start()
    began = time.monotonic()
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=90_000)
    page.goto(f"{hub['url']}/user/{user}/lab/tree/{notebook}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_selector(".jp-StatusBar-TextItem:has-text('| Idle')", timeout=90_000)
    wait_idle(page, seconds=0.5)
    page.locator(".jp-Notebook .jp-MarkdownCell").first.click()
    page.keyboard.press("Escape")
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]:not(.lm-mod-disabled)').click()
    try:
        page.wait_for_selector(".jp-Notebook .jp-OutputArea-output", timeout=240_000)
    except Exception:
        (REPO / "test-artifacts").mkdir(exist_ok=True)
        page.screenshot(path=str(REPO / "test-artifacts" / f"{hub['name']}_first_output.png"))
        raise
    seconds = time.monotonic() - began
    other_work = others.stop() if others is not None else None
    assert page.evaluate(STOP_KERNELS) >= 1
    page.close()
    return seconds, other_work


def _seconds_late(gradebook: Path, assignment: str) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{gradebook}") as book:
        return {s.student.id: s.total_seconds_late for s in book.assignment_submissions(assignment)}


def _grades(csv_file: Path) -> dict[str, str]:
    with open(csv_file, newline="") as handle:
        return {row["student_id"]: row["raw_score"] for row in csv.DictReader(handle)}


@pytest.mark.alone  # a class of learners and a hub: after the other tests, on the quiet machine
@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.timeout(900)  # 8 min measured on a loaded 2-core box, the environment's build included
def test_a_class_fetches_submits_is_graded_and_reads_feedback_through_the_hub(tmp_path, request):
    if os.geteuid() != 0:
        pytest.skip("the class hub test makes accounts: it needs root")
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    missing = [program for program in ("useradd", "runuser", "chpasswd", "npm") if shutil.which(program) is None]
    if missing:
        if os.environ.get("CI"):  # root with chromium: CI must run this test (scripts/run_tests.py installs npm)
            raise RuntimeError(f"CI must run the class hub test: {', '.join(missing)} missing")
        pytest.skip(f"the class hub test needs {', '.join(missing)}")
    from playwright.sync_api import sync_playwright

    from tests.nbgrader_tools import build_source

    reference = json.loads(build_source(LESSON, tmp_path / "source").read_text())
    environment = request.getfixturevalue("course_environment")  # built once per session, after the skips
    started = time.monotonic()
    with _class_hub(environment) as hub, sync_playwright() as playwright:
        first, second, third = hub["learners"]
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        try:
            released = _run([sys.executable, CLASS_HUB, "--prefix", hub["prefix"], "release", LESSON])
            assert released.returncode == 0
            page = _log_in(browser, hub, first)
            # the learner's JupyterLab: the Assignments tab, none of the instructor's tools
            assert page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").count() == 1
            page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").first.click()
            assert page.locator(".lm-Menu-itemLabel", has_text="Formgrader").count() == 0
            page.keyboard.press("Escape")
            _fetch_answer_submit(page, hub, first, LESSON, reference)
            japanese = _log_in(browser, hub, third)
            _fetch_answer_submit(japanese, hub, third, f"{LESSON}_ja", reference)
            # learner 2's first login, timed to the first output of lesson 01 (fetched before, as learners do)
            home = hub["root"] / "home" / second
            (home / LESSON).mkdir()
            shutil.copyfile(REPO / "lessons" / LESSON / f"{LESSON}.ipynb", home / LESSON / f"{LESSON}.ipynb")
            for path in (home / LESSON, home / LESSON / f"{LESSON}.ipynb"):
                shutil.chown(path, second, second)
            first_output, _ = _first_output_seconds(browser, hub, second, f"{LESSON}/{LESSON}.ipynb")
            print(f"class hub: {first_output:.1f} s from a learner's login to the first output of lesson 01")
            artifacts = REPO / "test-artifacts"
            artifacts.mkdir(exist_ok=True)
            load = os.getloadavg()
            record = {"login_to_first_output_s": round(first_output, 1), "load_average": [round(x, 1) for x in load]}
            (artifacts / "class_hub_timings.json").write_text(json.dumps(record) + "\n")

            # each server sees its own simulated GPU group (learners in class order, 2 GPUs each, 8 GPUs)
            import psutil

            seen = {}
            for process in psutil.process_iter(["username", "cmdline", "environ"]):
                if process.info["username"] in hub["learners"] and "singleuser" in " ".join(
                    process.info["cmdline"] or []
                ):
                    seen[process.info["username"]] = (process.info["environ"] or {}).get("CUDA_VISIBLE_DEVICES")
            assert seen == {first: "0,1", second: "2,3", third: "4,5"}
            # ... and runs in a control group of its own, under the limits and with the other GPUs' nodes denied
            for process in psutil.process_iter(["username", "cmdline", "pid"]):
                user = process.info["username"]
                if user in hub["learners"] and "singleuser" in " ".join(process.info["cmdline"] or []):
                    groups = Path(f"/proc/{process.info['pid']}/cgroup").read_text()
                    assert f"gpulab-hub-{user}" in groups, groups
            # the hub's state is the hub's; the course's folders in the exchange are the instructor's
            for name in ("jupyterhub.sqlite", "jupyterhub_cookie_secret", "jupyterhub_config.py", "class.json"):
                assert (hub["prefix"] / name).stat().st_mode & 0o077 == 0, name
            course_folder = hub["exchange"] / "gpulab"
            instructor_uid = pwd.getpwnam(hub["instructor"]).pw_uid
            assert course_folder.stat().st_uid == instructor_uid
            assert (course_folder / "inbound").stat().st_mode & 0o7777 == 0o3733

            # a learner reads neither another's home nor the exchange's inbound, nor another's server
            assert _as(second, "ls", str(hub["root"] / "home" / first)).returncode != 0
            assert _as(second, "cat", str(hub["root"] / "home" / first / LESSON / f"{LESSON}.ipynb")).returncode
            inbound = hub["exchange"] / "gpulab" / "inbound"
            assert _as(second, "ls", str(inbound)).returncode != 0
            assert _as(second, "ls", str(hub["exchange"] / "gpulab" / "feedback")).returncode != 0
            other = page.request.get(f"{hub['url']}/user/{second}/api/contents/")
            assert other.status in (403, 404) or f"/user/{second}/" not in other.url, (other.status, other.url)

            # a due date between the two submissions: learner 1 is on time, learner 3 late (the system's times)
            stamps = {user: _submitted_at(hub, user) for user in (first, third)}
            assert stamps[first] < stamps[third], stamps
            due = stamps[first] + (stamps[third] - stamps[first]) / 2

            # learner 2 wants a better grade than he earned, after the due date, from a terminal: his own work under
            # an early date, with no secret; an entry in learner 1's name dated in the future; and, made last (so that
            # collect reads them first), a link to learner 1's notebook where the instructor grades it and a folder
            # named like the notebook
            blank = (REPO / "lessons" / LESSON / f"{LESSON}.ipynb").read_text()
            answered = json.dumps(_answered(json.loads(blank), reference))
            to_grade = hub["course"] / "to-grade" / first / LESSON / f"{LESSON}.ipynb"
            _hand_made_entry(
                hub,
                second,
                f"{second}+{LESSON}+2020-01-01 00:00:00.000000 UTC+late",
                files={f"{LESSON}.ipynb": answered},
                secret=False,
            )
            _hand_made_entry(
                hub, second, f"{first}+{LESSON}+2099-01-01 00:00:00.000000 UTC+forged", files={f"{LESSON}.ipynb": blank}
            )
            time.sleep(0.1)
            _hand_made_entry(
                hub,
                second,
                f"{second}+{LESSON}+2020-01-01 00:00:00.000000 UTC+link",
                links={f"{LESSON}.ipynb": str(to_grade)},
            )
            _hand_made_entry(
                hub, second, f"{second}+{LESSON}+2020-01-01 00:00:00.000000 UTC+odd", folders=[f"{LESSON}.ipynb"]
            )
            late_entry = _submitted_at(hub, second, "+late")
            graded = _run(
                [sys.executable, CLASS_HUB, "--prefix", hub["prefix"], "grade", LESSON, "--due", due.isoformat()],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
            collected = _grades(hub["course"] / "grading" / "grades.csv")
            # learner 2: his own late work only; learner 1's grade and time untouched by the entry in her name; the
            # learner who never submitted has a row too, with nothing graded
            assert collected == {first: "13.0", second: "13.0", third: "13.0", hub["late_joiner"]: "0.0"}, collected
            assert _seconds_late(hub["course"] / "grading" / "gradebook.db", LESSON) == {
                first: 0,
                second: pytest.approx((late_entry - due).total_seconds(), abs=1),
                third: pytest.approx((stamps[third] - due).total_seconds(), abs=1),
            }
            with open(hub["course"] / "grading" / "grades.csv", newline="") as handle:
                late = {row["student_id"]: row["timestamp"] > row["duedate"] for row in csv.DictReader(handle)}
            # all times in grades.csv, one format (no time: the learner with nothing graded)
            assert late == {first: False, second: True, third: True, hub["late_joiner"]: False}, late
            # every refusal is reported for the learner who made it, in the table and in collect.csv
            with open(hub["course"] / "grading" / "collect.csv", newline="") as handle:
                report = Counter((row["learner"], row["verdict"]) for row in csv.DictReader(handle))
            assert report == Counter(
                {
                    (first, "taken"): 1,
                    (third, "taken"): 1,
                    (second, "taken"): 1,  # his own late work
                    (second, "forged"): 1,  # the entry in learner 1's name
                    (second, "refused"): 2,  # the link and the folder: no notebook to grade in either
                    (second, "skipped"): 3,  # the link, the folder, and the missing secret
                    (second, "no feedback"): 1,
                    (hub["late_joiner"], "missing"): 1,  # on the roster, never submitted
                }
            ), report
            assert "forged" in graded.stdout and f"named for '{first}'" in graded.stdout

            # the same notebooks laid out by hand grade the same
            by_hand = tmp_path / "by-hand"
            for user, assignment in ((first, LESSON), (third, f"{LESSON}_ja")):
                folder = by_hand / user / LESSON
                folder.mkdir(parents=True)
                shutil.copyfile(
                    hub["root"] / "home" / user / assignment / f"{LESSON}.ipynb", folder / f"{LESSON}.ipynb"
                )
            by_hand_graded = _run(
                [sys.executable, REPO / "autograder" / "grade.py", by_hand, "--out", tmp_path / "g", "--no-progress"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            assert by_hand_graded.returncode == 0, by_hand_graded.stdout[-3000:]
            # the honest learners' notebooks laid out by hand grade the same: nothing learner 2 did changed them
            assert _grades(tmp_path / "g" / "grades.csv") == {user: collected[user] for user in (first, third)}

            # learner 1 fetches the feedback in the Assignments tab and reads it
            page.reload()
            page.wait_for_selector(".lm-MenuBar-itemLabel", timeout=60_000)
            _assignments(page)
            page.locator("#submitted_assignments_list button", has_text="Fetch Feedback").first.click()
            pages = hub["root"] / "home" / first / LESSON / "feedback"
            deadline = time.monotonic() + 30
            while not list(pages.glob(f"*/{LESSON}.html")):
                assert time.monotonic() < deadline, "no feedback was fetched"
                time.sleep(0.3)
            stamp = next(pages.glob(f"*/{LESSON}.html")).parent.name
            page.goto(f"{hub['url']}/user/{first}/files/{LESSON}/feedback/{stamp}/{LESSON}.html")
            assert "13" in page.locator("body").inner_text()
            assert "Score" in page.locator("body").inner_text()
            assert not (hub["course"] / "feedback" / second).exists()  # his entry had no secret to name a page by
            assert (hub["exchange"] / "gpulab" / "feedback").stat().st_mode & 0o777 == 0o711
        finally:
            browser.close()
    print(f"class hub cycle: {time.monotonic() - started:.1f} s")
