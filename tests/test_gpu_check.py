"""The GPU check (``scripts/gpu_check.py``) in its CPU dry run, so that it cannot rot between GPU runs.

``--cpu --quick`` (the quick profile) runs every step that a machine without a GPU can run (for real, on the CPU:
the gpu-marked tests, which skip, benchmarks, memory and lesson 03's capacity, DDP launch, lesson 01 executed and
autograded) and must record the multi-GPU and GPU-only figures as not measured. It runs the way it runs on a bare
GPU server image: started by a Python that holds only what such an image holds (torch, pytest, matplotlib,
nvidia-ml-py, tqdm, psutil, numpy and their dependencies, with pip; no Jupyter, IPython or nbclient), with
``--bundle``: wheels made by ``scripts/gpu_bundle.py`` for this Python, installed offline into the check's own
environment, and without a network where bubblewrap can take it away. The other tests check the orchestration on
its own: the default profile's budgets against its deadline, a step stopped at its budget while the next ones run,
a step that raises, results written after every step, SIGTERM, the deadline counting the preparation, and the
exit code.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_check = _load_script()
sys.path.insert(0, str(REPO / "scripts"))
import gpu_bundle  # noqa: E402 - scripts/ is not a package

BUNDLE_CACHE = REPO / ".build" / f"gpu-bundle-py{sys.version_info.major}.{sys.version_info.minor}"


def _strict_json(path: Path) -> dict:
    def refuse(constant):
        raise ValueError(f"{path} holds {constant}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def _options(out: Path, **overrides) -> argparse.Namespace:
    options = gpu_check._parse([str(out), "--cpu", "--quick"])
    options.out = str(out)
    for key, value in overrides.items():
        setattr(options, key, value)
    return options


# ------------------------------------------------------------------------------------------------ the dry run


def image_requirements() -> list[str]:
    """What the bare GPU server image holds, at this environment's versions: torch (here the CPU build of the same
    version), numpy, matplotlib, pytest, nvidia-ml-py, tqdm and psutil."""
    return [f"{name}=={metadata.version(name).split('+')[0]}" for name in gpu_bundle.IMAGE_PACKAGES]


def _link_distributions(site: Path) -> None:
    """Hard links (in folders of their own) to the files of the image's distributions in this environment, their
    dependencies and pip: real directory entries of ``site``, nothing pointing outside it."""
    for name in sorted(gpu_bundle.closure([*gpu_bundle.IMAGE_PACKAGES, "pip"])):
        distribution = metadata.distribution(name)
        root = Path(distribution.locate_file(""))
        for top in {Path(str(entry)).parts[0] for entry in distribution.files or []}:
            source, target = root / top, site / top
            if top.endswith(".pth") or top == ".." or not source.exists() or target.exists():
                continue
            if source.is_dir():
                shutil.copytree(source, target, copy_function=os.link)
            else:
                os.link(source, target)


def bare_image_python(folder: Path) -> Path:
    """A Python that holds only what the bare GPU server image holds: a fresh virtual environment in ``folder``
    (outside the repository, as an image's packages are) with the distributions of ``image_requirements()``
    (torch 2.13.0, ...), their dependencies and pip, nothing else: no Jupyter, IPython, nbclient, nbgrader or
    gpulab. Its packages are files of its own: hard links to this environment's (seconds to make), or, where the
    folders are on other file systems, ``pip install`` of the same versions (minutes). With the symbolic links into
    this environment it used to make, the grading kernels of the dry run could not import torch (every check that
    sends a tensor failed); inside the repository the sandbox would not show it at all (only the running
    environment's folders of the repository are shown)."""
    requirements = image_requirements()
    subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    found = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True)
    site = Path(found.stdout.decode().strip())
    try:
        _link_distributions(site)
    except OSError:  # another file system: install the same versions instead
        shutil.rmtree(site)
        site.mkdir()
        subprocess.run([str(python), "-m", "ensurepip", "--default-pip"], check=True, capture_output=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *requirements], check=True, timeout=900)
    (folder / "requirements.txt").write_text("\n".join(requirements) + "\n")
    return python


@pytest.fixture(scope="session")
def image_python(tmp_path_factory) -> Path:
    """One image-like Python for the session's tests (made once, reused)."""
    return bare_image_python(tmp_path_factory.mktemp("gpu-check-image") / "image")


def without_network(command: list[str]) -> list[str]:
    """``command`` in a new network namespace (loopback only) where bubblewrap can make one, else as it is."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return command
    probe = [bwrap, "--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", "--", "true"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        return command
    return [*probe[:-1], *command]


@pytest.fixture(scope="module")
def bundle() -> Path:
    """Wheels for this Python, as ``make gpu-bundle`` makes them for 3.12 (downloaded once, then reused)."""
    if not any(BUNDLE_CACHE.glob("*.whl")):
        gpu_bundle.download(BUNDLE_CACHE, f"{sys.version_info.major}.{sys.version_info.minor}")
    return BUNDLE_CACHE


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, bundle, image_python):
    folder = tmp_path_factory.mktemp("gpu-check")
    out = folder / "out"
    for module in ("torch", "pytest", "matplotlib", "pynvml", "tqdm", "psutil", "numpy"):
        subprocess.run([str(image_python), "-c", f"import {module}"], check=True)
    torch_version = subprocess.run(
        [str(image_python), "-c", "import torch; print(torch.__version__)"], capture_output=True
    )
    assert torch_version.stdout.decode().strip() == metadata.version("torch"), torch_version
    for module in ("nbformat", "nbclient", "ipykernel", "IPython", "jupyter_client", "nbgrader", "jupytext", "gpulab"):
        absent = subprocess.run([str(image_python), "-c", f"import {module}"], capture_output=True)
        assert absent.returncode != 0, f"the stand-in for the bare image can import {module}"
    started = time.monotonic()
    command = [str(image_python), str(SCRIPT), str(out), "--cpu", "--quick", "--bundle", str(bundle)]
    completed = subprocess.run(
        without_network([*command, "--venv", str(folder / "check-venv")]),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (out / "report.json").is_file(), completed.stdout[-3000:] + completed.stderr[-3000:]
    return {
        "image": image_python,
        "out": out,
        "completed": completed,
        "seconds": time.monotonic() - started,
        "report": _strict_json(out / "report.json"),
    }


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_dry_run_succeeds_and_its_exit_code_matches_the_steps(dry_run):
    completed, report = dry_run["completed"], dry_run["report"]
    statuses = {step["name"]: step["status"] for step in report["steps"]}
    failed = {name: status for name, status in statuses.items() if status in ("failed", "timed_out")}
    details = "\n".join(
        f"{step['name']}: {step.get('error')}\n{step.get('log_tail', '')}"
        for step in report["steps"]
        if step["name"] in failed
    )
    assert not failed, details + "\n" + completed.stdout[-3000:] + completed.stderr[-3000:]
    assert completed.returncode == report["exit_code"] == gpu_check._exit_code(report["steps"]) == 0
    # The quick profile runs only the gpu-marked tests (their modules' CPU tests run in CI anyway): 355-385 s
    # before, when it ran those modules whole (145 s of it), on the 2-core CPU at a load average of 7-9.
    assert dry_run["seconds"] < 420, f"the quick dry run took {dry_run['seconds']:.0f} s"
    assert report["preparation_s"] > 0 and report["duration_s"] >= report["preparation_s"]  # counted in the deadline
    assert report["complete"] is True
    prepared = report["prepared"]
    assert prepared["wheels"] > 0 and not prepared["downloaded"] and prepared["bundle_mib"] < gpu_bundle.MAX_BUNDLE_MIB
    assert str(dry_run["image"].parent.parent) in prepared["torch"], prepared  # the image's torch, reused
    out = dry_run["out"]
    assert (out / "summary.txt").read_text().startswith("GPU check (CPU dry run (--cpu), profile quick)")
    assert (out.parent / "out.tar.gz").is_file()


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_report_names_the_machine_and_every_step_has_a_status_and_wall_time(dry_run):
    report = dry_run["report"]
    assert report["cpu"] is True and report["quick"] is True
    machine = report["machine"]
    for key in ("gpu_names", "gpu_count", "driver", "torch", "cuda", "cpu_count", "hardware"):
        assert key in machine, key
    assert machine["gpu_count"] == 0 and machine["gpu_names"] == [] and machine["cuda_visible_devices"] == ""
    assert "CPU" in report["measured_on"]
    assert report["profile"] == "quick"
    assert [step["name"] for step in report["steps"]] == gpu_check.PROFILES["quick"].names
    for step in report["steps"]:
        assert step["status"] in gpu_check.STATUSES, step
        assert "wall_s" in step and step["budget_s"] > 0, step
        if step["wall_s"] is not None:
            assert (dry_run["out"] / step["log"]).is_file(), step["log"]


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_what_could_not_be_measured_is_listed_with_the_reason(dry_run):
    report = dry_run["report"]
    steps = {step["name"]: step for step in report["steps"]}
    for name in ("real_scaling", "memory_imbalance"):
        assert steps[name]["status"] == "not_measured"
        assert "only 0 GPU(s)" in steps[name]["reason"]
    gpu_tests = steps["gpu_tests"]
    assert gpu_tests["status"] == "ok", gpu_tests
    counts = gpu_tests["details"]["counts"]
    # Only the gpu tests ran, and skipped here (none for an import error).
    assert counts["gpu_tests"] == counts["skipped"] > 0 and counts["passed"] == counts["gpu_passed"] == 0
    assert counts["failed"] == counts["error"] == 0
    assert gpu_tests["details"]["not_importable"] == []
    assert set(gpu_tests["details"]["modules"]) >= {"tests/test_data_parallel.py", "tests/test_memory.py"}
    assert all("CUDA" in test["message"] or "GPU" in test["message"] for test in gpu_tests["details"]["tests"]
               if test["outcome"] == "skipped")  # fmt: skip
    listed = {entry["step"]: entry for entry in report["not_measured"]}
    assert {
        "gpu_tests",
        "real_scaling",
        "memory_imbalance",
        "memory_accuracy",
        "memory_capacity",
        "memory_overhead",
        "process_memory",
    } <= set(listed)
    for entry in report["not_measured"]:
        assert entry["figures"] and entry["reason"], entry
    assert any("NVML" in figure for figure in listed["memory_accuracy"]["figures"])
    assert "Not measured:" in dry_run["completed"].stdout


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_figures_are_cpu_figures_and_plots_exist(dry_run):
    report = dry_run["report"]
    assert report["figures"], "no figure recorded"
    assert all(figure["on"].startswith("CPU only (--cpu)") for figure in report["figures"])
    measured = {figure["step"] for figure in report["figures"]}
    assert {"step_times", "memory_accuracy", "memory_capacity", "memory_overhead", "ddp_launch"} <= measured
    assert {"lessons", "autograde"} <= measured
    timings = [f for f in report["figures"] if f["step"] == "step_times" and f["unit"] == "samples/s"]
    assert len(timings) == 6 and all(f["value"] > 0 for f in timings), timings  # 2 cases x (1 device, DP, DDP)
    assert len(report["plots"]) >= 4
    for name in report["plots"]:
        assert (dry_run["out"] / name).read_bytes()[:8] == PNG_MAGIC, name


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_link_traffic_counts_bytes_and_lists_what_needs_two_gpus(dry_run):
    report = dry_run["report"]
    step = {step["name"]: step for step in report["steps"]}["link_traffic"]
    assert step["status"] == "ok", step
    counted = [f for f in report["figures"] if f["step"] == "link_traffic" and f["unit"] == "MiB"]
    assert len(counted) == 5 and all(f["value"] > 0 for f in counted), counted  # the five DataParallel stages
    (missing,) = [entry for entry in report["not_measured"] if entry["step"] == "link_traffic"]
    assert "GPU-to-GPU copy bandwidth" in missing["figures"] and "only 0 GPU(s)" in missing["reason"]
    assert "link_traffic.png" in report["plots"]


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_lesson_and_autograding_steps_record_times_and_scores(dry_run):
    steps = {step["name"]: step for step in dry_run["report"]["steps"]}
    (lesson,) = steps["lessons"]["details"]["lessons"]
    assert lesson["lesson"] == "01_splitting" and lesson["error"] is None and lesson["stderr"] == []
    assert lesson["total_s"] > 0 and lesson["slowest_cell"]["seconds"] > 0
    assert lesson["mode"].startswith("Virtual devices: 2 on cpu")
    graded = {record["submission"]: record for record in steps["autograde"]["details"]["submissions"]}
    assert set(graded) == {"reference", "blank", "wrong"}
    assert graded["reference"]["score"] == graded["reference"]["max_score"] > 0
    assert graded["blank"]["score"] == 0
    assert graded["wrong"]["as_expected"] and graded["wrong"]["lost"] == graded["wrong"]["expected_lost"]


# ------------------------------------------------------------------------------------------ the orchestration


def test_exit_code_follows_the_statuses():
    def steps(*statuses):
        return [{"name": str(i), "status": status} for i, status in enumerate(statuses)]

    assert gpu_check._exit_code(steps("ok", "not_measured")) == 0
    assert gpu_check._exit_code(steps("ok", "failed", "skipped")) == 1
    assert gpu_check._exit_code(steps("ok", "timed_out")) == 1
    assert gpu_check._exit_code(steps("ok", "skipped", "not_measured")) == 2


def test_a_spent_deadline_skips_every_step_with_the_reason(tmp_path):
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--cpu", "--deadline", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = _strict_json(tmp_path / "report.json")
    for step in report["steps"]:
        if step["name"] in ("real_scaling", "memory_imbalance"):
            assert step["status"] == "not_measured", step
        else:
            assert step["status"] == "skipped" and step["reason"].startswith("deadline"), step
    assert completed.returncode == report["exit_code"] == 2, completed.stdout + completed.stderr


def test_a_failing_step_is_recorded_and_the_next_steps_still_run(tmp_path, monkeypatch):
    ran = []

    def fake_run(options, step, gpu_count, timeout):
        ran.append(step.name)
        if step.name == "environment":
            return {"status": "ok", "wall_s": 0.1, "details": {"gpu_count": 0, "hardware": "CPU only (test)"}}
        if step.name == "step_times":
            return {"status": "failed", "error": "RuntimeError: boom", "wall_s": 0.2}
        return {"status": "ok", "wall_s": 0.1}

    monkeypatch.setattr(gpu_check.processes, "run_step_process", fake_run)
    monkeypatch.setattr(gpu_check.processes, "become_subreaper", lambda: False)
    code = gpu_check.run_all(_options(tmp_path))
    report = _strict_json(tmp_path / "report.json")
    assert code == report["exit_code"] == 1
    statuses = {step["name"]: step["status"] for step in report["steps"]}
    assert statuses["step_times"] == "failed" and statuses["autograde"] == "ok"
    assert ran == [
        name for name in gpu_check.PROFILES["quick"].names if name not in ("real_scaling", "memory_imbalance")
    ]


def test_a_raising_step_writes_its_error_in_its_result(tmp_path, monkeypatch):
    def broken(ctx):
        ctx.figure("something measured before the failure", 1.0, "s")
        raise RuntimeError("deliberate failure")

    steps = [
        gpu_check.Step(step.name, step.title, broken) if step.name == "ddp_launch" else step for step in gpu_check.STEPS
    ]
    monkeypatch.setattr(gpu_check.steps, "STEPS", steps)
    monkeypatch.setattr(sys, "path", list(sys.path))  # run_step_here puts benchmarks/ on it
    result_path = tmp_path / "result.json"
    options = _options(tmp_path, result=str(result_path))
    assert gpu_check.run_step_here("ddp_launch", options) == 0
    result = _strict_json(result_path)
    assert result["status"] == "failed"
    assert "RuntimeError: deliberate failure" in result["error"]
    assert result["figures"][0]["what"] == "something measured before the failure"


def test_a_step_past_its_time_is_stopped_with_everything_it_started(tmp_path):
    (tmp_path / "logs").mkdir()
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    step = gpu_check.STEPS[gpu_check.STEP_NAMES.index("gpu_tests")]  # its pytest process outlives 2 s
    result = gpu_check.run_step_process(_options(tmp_path), step, 0, timeout=2)
    assert result["status"] == "timed_out", result
    assert "deadline" in result["error"]
    time.sleep(0.5)
    left = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
    left = [child for child in left if child.is_running() and child.status() != psutil.STATUS_ZOMBIE]
    assert not left, [child.cmdline() for child in left]


def _archived_report(archive: Path) -> dict:
    with tarfile.open(archive) as opened:
        member = next(member for member in opened.getmembers() if member.name.endswith("/report.json"))
        return json.loads(opened.extractfile(member).read())


def _no_new_processes(before: set[int]) -> None:
    time.sleep(0.5)
    left = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
    left = [child for child in left if child.is_running() and child.status() != psutil.STATUS_ZOMBIE]
    assert not left, [child.cmdline() for child in left]


def test_the_default_profile_fits_one_gpu_in_8_minutes_with_the_preparation():
    """The default run had no budget per step: estimated at 7-11 minutes against its own 480 s deadline, with
    the preparation outside it. Now the default profile's steps each have a budget (their timeout), and on one GPU
    those budgets and the preparation's add up to at most the deadline; every step the check knows is in it once,
    the steps needing 2+ GPUs last, and each GPU estimate lies within its step's budget."""
    from gpucheck import profiles, steps

    default = gpu_check._parse(["out"])
    assert default.profile == profiles.DEFAULT_PROFILE == "one-gpu" and default.deadline == 480
    profile = profiles.PROFILES["one-gpu"]
    assert sorted(profile.names) == sorted(gpu_check.STEP_NAMES)
    assert profile.names[0] == "environment"
    assert all(budget > 0 for _, budget in profile.steps)
    assert profiles.one_gpu_budget_s(profile, steps.MIN_GPUS) <= profile.deadline_s == 480
    needs_two = [name for name in profile.names if steps.MIN_GPUS[name] >= 2]
    assert profile.names[-len(needs_two) :] == needs_two
    for name, (_cpu_s, gpu_s, basis) in profiles.ESTIMATES.items():
        assert name in profile.names and gpu_s <= profile.budget(name) and basis, name
    assert set(profiles.ESTIMATES) == {name for name in profile.names if steps.MIN_GPUS[name] <= 1}
    # --quick is the quick profile; the longer ones stay behind --profile.
    assert gpu_check._parse(["out", "--quick"]).profile == "quick"
    assert gpu_check._parse(["out", "--profile", "full"]).deadline == profiles.PROFILES["full"].deadline_s


def test_the_readme_gives_the_default_profiles_command_and_each_steps_budget_and_estimate():
    """The README's GPU-check table lists each step of the default profile with its budget and its estimated GPU
    time, as profiles.py holds them, and says that these are estimates, not run on a GPU."""
    from gpucheck import profiles

    readme = (REPO / "README.md").read_text()
    assert "scripts/gpu_check.py" in readme and "--bundle gpu-bundle" in readme
    rows = {row.split("|")[1].strip(" `"): row for row in readme.splitlines() if row.startswith("| `")}
    for name, (cpu_s, gpu_s, _) in profiles.ESTIMATES.items():
        cells = [cell.strip() for cell in rows[name].split("|")]
        assert f"{profiles.ONE_GPU.budget(name):.0f} s" in cells and f"~{gpu_s:.0f} s" in cells, rows[name]
        assert f"{cpu_s:.0f} s" in cells, rows[name]
    assert "not run on a GPU" in readme


def test_a_step_past_its_budget_is_stopped_and_the_next_steps_still_run(tmp_path):
    """A step that does not end within its budget used to run until the deadline, taking every later step's time:
    now it is stopped at its own budget (with what it started), recorded as timed out, and the next step runs."""
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    out = tmp_path / "out"
    command = [
        sys.executable,
        str(SCRIPT),
        str(out),
        "--cpu",
        "--quick",
        "--only",
        "environment,gpu_tests,link_traffic",
    ]
    completed = subprocess.run(
        [*command, "--budget", "gpu_tests=2"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    report = _strict_json(out / "report.json")
    steps = {step["name"]: step for step in report["steps"]}
    assert steps["gpu_tests"]["status"] == "timed_out" and steps["gpu_tests"]["budget_s"] == 2, steps["gpu_tests"]
    assert steps["gpu_tests"]["wall_s"] < 20 and "its budget" in steps["gpu_tests"]["error"]
    assert steps["environment"]["status"] == steps["link_traffic"]["status"] == "ok", report["steps"]
    assert any(figure["step"] == "link_traffic" for figure in report["figures"])
    assert completed.returncode == report["exit_code"] == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert _archived_report(tmp_path / "out.tar.gz")["steps"] == report["steps"]
    _no_new_processes(before)


def test_a_step_stopped_at_its_time_keeps_what_it_had_measured(tmp_path):
    """A step's process writes its result as it goes (after each figure, failure, warning, missing figure and
    plot), so a step stopped at its budget, or whose process dies, keeps the figures it had measured."""
    from gpucheck import processes

    result_path = tmp_path / "result.json"
    ctx = gpu_check.StepContext(name="lessons", out=tmp_path, quick=True, cpu=True, jobs=1, profile="quick")
    ctx.result_path = result_path
    ctx.figure("lesson 01_splitting: run top to bottom", 12.5, "s")
    written = _strict_json(result_path)
    assert written["status"] == "partial" and written["figures"][0]["value"] == 12.5
    stopped = processes.result_of(written, True, 121.0, 120.0, -9)
    assert stopped["status"] == "timed_out" and stopped["partial"] and stopped["figures"] == written["figures"]
    assert "what it had measured is kept" in stopped["error"]
    died = processes.result_of(written, False, 3.0, 120.0, -11)
    assert died["status"] == "failed" and died["figures"] == written["figures"] and "code -11" in died["error"]
    ctx.write_result()
    assert processes.result_of(_strict_json(result_path), False, 3.0, 120.0, 0)["status"] == "ok"
    assert processes.result_of(None, True, 121.0, 120.0, -9)["partial"] is False


def test_every_result_so_far_is_in_the_archive_after_each_step_and_a_step_that_raises_costs_only_itself(
    tmp_path, monkeypatch
):
    """The report and the archive were written once, at the end: a run stopped later (the machine's time limit, a
    crash of the check itself) left nothing. Now they are written after every step; and a step that cannot even be
    run (here: the runner raises) is recorded as failed while the next steps run."""
    archive = tmp_path.parent / f"{tmp_path.name}.tar.gz"
    seen = []

    def fake_run(options, step, gpu_count, timeout):
        seen.append([s["name"] for s in _archived_report(archive)["steps"]] if archive.exists() else None)
        if step.name == "environment":
            return {"status": "ok", "wall_s": 0.1, "details": {"gpu_count": 1, "hardware": "one GPU (test)"}}
        if step.name == "memory_capacity":
            raise OSError("no more processes")
        return {"status": "ok", "wall_s": 0.1, "figures": [{"step": step.name, "what": "x", "value": 1, "unit": "s"}]}

    monkeypatch.setattr(gpu_check.processes, "run_step_process", fake_run)
    monkeypatch.setattr(gpu_check.processes, "become_subreaper", lambda: False)
    options = gpu_check._parse([str(tmp_path), "--only", "environment,memory_accuracy,memory_capacity,step_times"])
    code = gpu_check.run_all(options)
    assert seen == [None, ["environment"], ["environment", "memory_accuracy"], [*seen[2], "memory_capacity"]]
    report = _archived_report(archive)
    assert report["complete"] is True and report["profile"] == "one-gpu" and code == report["exit_code"] == 1
    statuses = {step["name"]: step["status"] for step in report["steps"]}
    assert statuses == {"environment": "ok", "memory_accuracy": "ok", "memory_capacity": "failed", "step_times": "ok"}
    (failed,) = [step for step in report["steps"] if step["status"] == "failed"]
    assert "OSError: no more processes" in failed["error"]
    assert {figure["step"] for figure in report["figures"]} == {"memory_accuracy", "step_times"}


def test_sigterm_ends_the_running_step_and_still_writes_the_report_and_the_archive(tmp_path):
    """A time limit around the whole command (``timeout``) sends SIGTERM: the check used to die at once, leaving
    no report and its step's processes running. Now the step is ended with what it started, the remaining steps are
    recorded as not run, and the report and the archive are written."""
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    out = tmp_path / "out"
    command = [sys.executable, str(SCRIPT), str(out), "--cpu", "--quick", "--only", "environment,gpu_tests,ddp_launch"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        waited = time.monotonic() + 120
        while not (out / "logs" / "gpu_tests.log").exists() and time.monotonic() < waited:
            time.sleep(0.2)
        time.sleep(1.0)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    report = _strict_json(out / "report.json")
    statuses = {step["name"]: step["status"] for step in report["steps"]}
    assert statuses == {"environment": "ok", "gpu_tests": "failed", "ddp_launch": "skipped"}, output[-3000:]
    assert "SIGTERM" in report["steps"][1]["error"] and "SIGTERM" in report["steps"][2]["reason"]
    assert process.returncode == report["exit_code"] == 1 and report["complete"] is True
    assert _archived_report(tmp_path / "out.tar.gz")["steps"] == report["steps"]
    _no_new_processes(before)


def test_the_deadline_counts_the_preparation(tmp_path):
    """The preparation (--bundle's environment) ran before the deadline's clock started, so a slow preparation
    could push the run past the machine's time. Its seconds (passed on as --spent) now count."""
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--cpu", "--deadline", "100", "--spent", "95"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = _strict_json(tmp_path / "report.json")
    assert report["preparation_s"] == 95 and report["duration_s"] >= 95
    skipped = [step for step in report["steps"] if step["status"] == "skipped"]
    assert skipped and all("5 s of the 100 s" in step["reason"] for step in skipped[:1]), report["steps"]
    assert completed.returncode == report["exit_code"] == 2, completed.stdout + completed.stderr


def test_lesson_03s_capacity_runs_as_the_lesson_says_on_virtual_devices(tmp_path):
    """The memory_capacity step on the CPU: lesson 03's block within 64 MiB on two virtual devices runs out on
    device 0 with the loss outside forward and fits with the loss in forward; the real-GPU part is listed as not
    measured, with no figure for it."""
    from gpucheck import memory_capacity

    ctx = gpu_check.StepContext(name="memory_capacity", out=tmp_path, quick=True, cpu=True, jobs=1)
    memory_capacity.step_memory_capacity(ctx)
    assert not ctx.failures, ctx.failures
    runs = ctx.details["virtual"]["runs"]
    assert runs["loss outside forward"]["fits"] is False and runs["loss outside forward"]["refused"]["device"] == 0
    assert runs["loss in forward"]["fits"] is True
    assert ctx.not_measured == [
        {
            "step": "memory_capacity",
            "figures": memory_capacity.REAL_GPU_FIGURES,
            "reason": "no CUDA GPU visible (--cpu)",
        }
    ]
    assert all("real GPU" not in figure["what"] and "cuda:0" not in figure["what"] for figure in ctx.figures)


def test_autograding_without_a_sandbox_is_not_measured(tmp_path, monkeypatch):
    """A bare GPU image has no bubblewrap: the autograde step says so instead of failing or grading unsandboxed."""
    from autograder import sandbox

    monkeypatch.setattr(sandbox, "unavailable_reason", lambda: "the `bwrap` command was not found")
    ctx = gpu_check.StepContext(name="autograde", out=tmp_path, quick=True, cpu=True, jobs=1)
    gpu_check.step_autograde(ctx)
    assert not ctx.failures and "submissions" not in ctx.details
    assert ctx.not_measured == [
        {
            "step": "autograde",
            "figures": ["autograding in the grading sandbox"],
            "reason": "no sandbox here: the `bwrap` command was not found",
        }
    ]


def test_memory_accuracy_compares_the_real_gpu_tracker_with_what_survives_the_block(tmp_path):
    """The real-GPU tracker resets the allocator's peak at every sample, so torch.cuda.max_memory_allocated read
    after the block has forgotten the allocation (the step used to fail on every GPU for it). On simulated
    allocator statistics: that number is indeed back at the base, and the step's comparisons (known size, the
    allocated bytes while held, the tracker's own highest sample) pass, with no figure recorded."""
    sys.path.insert(0, str(REPO / "utils"))
    from gpucheck import memory_accuracy

    ctx = gpu_check.StepContext(name="memory_accuracy", out=tmp_path, quick=True, cpu=True, jobs=1)
    size = 64 << 20
    result = memory_accuracy.real_tracker_accuracy(ctx, size, memory_accuracy.SimulatedGpu())
    assert result["simulated"] and result["samples"] >= 3
    assert result["torch_max_memory_allocated_after_block_minus_base"] == 0  # forgotten: not comparable
    assert result["tracker_peak_minus_base"] == result["torch_memory_allocated_while_held_minus_base"] == size
    assert not ctx.failures and not ctx.figures and not ctx.plots


PYNVML_WARNING = (
    "/opt/venv/lib/python3.12/site-packages/torch/cuda/__init__.py:63: FutureWarning: The pynvml package is "
    "deprecated. Please install nvidia-ml-py instead. If you did not install pynvml directly, please report this to "
    "the maintainers of the package that installed pynvml for you.\n  import pynvml  # type: ignore[import]\n"
)


def test_the_lesson_step_does_not_count_the_deprecated_pynvml_warning_as_a_failure(tmp_path):
    """An image with the deprecated pynvml package: `import torch` warns on stderr in the lesson's first cell. That
    warning is recorded as a warning; anything else on stderr, also in the same output, still fails the step."""
    from gpucheck import lessons

    def result(*texts):
        stderr = [{"cell": 3, "text": text} for text in texts]
        return {"error": None, "mode": "Virtual devices: 2 on cpu", "stderr": stderr}

    quiet = gpu_check.StepContext(name="lessons", out=tmp_path, quick=True, cpu=True, jobs=1)
    lessons.judge(quiet, "01_splitting", result(PYNVML_WARNING))
    assert not quiet.failures and any("pynvml" in warning for warning in quiet.warnings)
    noisy = gpu_check.StepContext(name="lessons", out=tmp_path, quick=True, cpu=True, jobs=1)
    lessons.judge(noisy, "01_splitting", result(PYNVML_WARNING + "UserWarning: something of the lesson's\n"))
    assert len(noisy.failures) == 1 and "something of the lesson's" in noisy.failures[0]
    assert "pynvml" not in noisy.failures[0]


def test_a_bare_image_without_the_notebook_stack_names_the_steps_it_cannot_run_and_exits_0(tmp_path, image_python):
    """The check started by an image-like Python (torch, pytest, matplotlib, nvidia-ml-py, tqdm, psutil, numpy; no
    notebook stack) without --bundle: the lesson and autograding steps are not measured, naming the missing
    modules, and the run exits 0 (the other steps run alike with and without the bundle: the slow dry run)."""
    python = image_python
    out = tmp_path / "out"
    completed = subprocess.run(
        [str(python), str(SCRIPT), str(out), "--cpu", "--quick", "--only", "lessons,autograde"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = _strict_json(out / "report.json")
    steps = {step["name"]: step for step in report["steps"]}
    assert completed.returncode == report["exit_code"] == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    for name in ("lessons", "autograde"):
        assert steps[name]["status"] == "not_measured", steps[name]
        assert "nbformat" in steps[name]["reason"] and "not installed here" in steps[name]["reason"]
    assert "nbgrader" in steps["autograde"]["reason"]
    assert "lessons           not_measured" in completed.stdout


def test_process_memory_is_not_measured_without_a_gpu_and_invents_no_number(tmp_path):
    """What a CUDA kernel and a DDP rank hold is for the grader's GPU memory limit: without a GPU the step records
    why it measured nothing, and no figure."""
    from gpucheck import process_memory

    ctx = gpu_check.StepContext(name="process_memory", out=tmp_path, quick=True, cpu=True, jobs=1)
    process_memory.step_process_memory(ctx)
    assert ctx.status == "not_measured" and "no CUDA GPU visible" in ctx.reason
    assert not ctx.figures and not ctx.failures
    assert ctx.not_measured == [
        {"step": "process_memory", "figures": list(process_memory.FIGURES), "reason": ctx.reason}
    ]


def test_a_process_footprint_reads_rss_and_the_memory_cgroup():
    """The reading the step makes in each CUDA process, here in this CPU process: resident memory from /proc, the
    memory cgroup's own count (or why not), and no NVML number for a process that is not a CUDA one."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check_ranks

    footprint = gpu_check_ranks.process_footprint(None)
    assert footprint["rss_bytes"] > 10 * 2**20 and footprint["peak_rss_bytes"] >= footprint["rss_bytes"]
    cgroup = footprint["cgroup"]
    assert "reason" in cgroup or cgroup["version"] in (1, 2), cgroup
    assert footprint["nvml_process_used_bytes"] is None and footprint["nvml_reason"] == "not a CUDA process"


# ------------------------------------------------------------------------------ a preparation that fails in part


def _wheel(folder: Path, module: str) -> Path:
    """A minimal pure-Python wheel holding ``module`` (``VALUE = 1``), as pip installs it."""
    import zipfile

    path = folder / f"{module}-1.0-py3-none-any.whl"
    info = f"{module}-1.0.dist-info"
    files = {
        f"{module}.py": "VALUE = 1\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_a_wheel_that_will_not_install_costs_only_itself(tmp_path):
    """One wheel of the bundle that pip refuses (here: not a zip file) used to end the preparation (pip's error,
    no report at all); now the other wheels are installed one by one and the refused one is named."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    _wheel(bundle, "gpu_check_probe")
    whole = gpu_check.prepare_environment(bundle, tmp_path / "venv")
    assert whole["failures"] == [] and whole["not_installed"] == [] and whole["wheels"] == 1, whole
    (bundle / "broken_probe-1.0-py3-none-any.whl").write_bytes(b"not a wheel")
    prepared = gpu_check.prepare_environment(bundle, tmp_path / "venv")  # the environment made anew
    assert prepared["not_installed"] == ["broken_probe-1.0-py3-none-any.whl"], prepared
    assert len(prepared["failures"]) == 1 and "installing broken_probe" in prepared["failures"][0]
    probe = subprocess.run([prepared["python"], "-c", "import gpu_check_probe; print(gpu_check_probe.VALUE)"])
    assert probe.returncode == 0, "the wheel that installs is installed"


def test_a_failed_preparation_still_leaves_every_steps_result_in_the_archive(tmp_path):
    """No virtual environment can be made (a file stands where it would go): the check runs with the Python that
    started it, and the report, the summary and the archive hold the steps' results and the failure (exit 1)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    _wheel(bundle, "gpu_check_probe")
    in_the_way = tmp_path / "venv"
    in_the_way.write_text("a file, not a folder\n")
    out = tmp_path / "out"
    command = [sys.executable, str(SCRIPT), str(out), "--cpu", "--only", "environment", "--bundle", str(bundle)]
    completed = subprocess.run(
        [*command, "--venv", str(in_the_way)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    report = _strict_json(out / "report.json")
    assert [step["status"] for step in report["steps"]] == ["ok"], report["steps"]
    assert "making the virtual environment" in report["prepared"]["failures"][0]
    assert report["prepared"]["python"] is None
    assert completed.returncode == report["exit_code"] == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "FAILED: making the virtual environment" in (out / "summary.txt").read_text()
    assert (tmp_path / "out.tar.gz").is_file()


def test_the_gpu_check_uses_nothing_python_3_10_lacks():
    """The check runs with whatever Python a GPU machine has, and the course supports 3.10: ``datetime.UTC`` (new
    in 3.11) in the report ended every run on 3.10 after all steps, before the report was written. Its code must
    parse with 3.10's grammar and use nothing 3.11 added to the standard library."""
    from tests.test_project import NEW_IN_311

    found = []
    for path in [SCRIPT, *sorted((REPO / "scripts" / "gpucheck").glob("*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path), feature_version=(3, 10))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                aliases.update({alias.asname or alias.name: alias.name for alias in node.names})
                found += [f"{where}: import {a.name}" for a in node.names if a.name in NEW_IN_311["modules"]]
            elif isinstance(node, ast.ImportFrom) and node.module:
                new = NEW_IN_311["names"].get(node.module, set())
                found += [f"{where}: {node.module}.{alias.name}" for alias in node.names if alias.name in new]
                if node.module in NEW_IN_311["modules"]:
                    found.append(f"{where}: from {node.module}")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                module = aliases.get(node.value.id, node.value.id)
                if node.attr in NEW_IN_311["names"].get(module, set()):
                    found.append(f"{where}: {module}.{node.attr}")
            elif isinstance(node, ast.Name) and node.id in NEW_IN_311["builtins"]:
                found.append(f"{where}: {node.id}")
    assert not found, found


def test_in_a_bare_image_the_gpu_test_modules_skip_what_needs_the_notebook_stack(image_python):
    """The gpu_tests step runs test_ddp.py whole with the image's Python, which has no IPython: the test of the
    start line in a notebook failed there on ``import IPython`` (the dry run exited 1). It is skipped, naming it."""
    python = image_python
    test = "tests/test_ddp.py::test_the_launch_line_counts_seconds_ready_ranks_and_the_run_in_a_notebook"
    completed = subprocess.run(
        [str(python), "-m", "pytest", test, "-q", "-rs", "-p", "no:cacheprovider", "-W", "ignore"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "utils")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0 and "1 skipped" in completed.stdout, completed.stdout[-3000:]
    assert "No module named 'IPython'" in completed.stdout
