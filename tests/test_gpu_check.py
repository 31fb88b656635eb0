"""The GPU check (``scripts/gpu_check.py``) in its CPU dry run, so that it cannot rot between GPU runs.

``--cpu --quick`` runs every step that a machine without a GPU can run (for real, on the CPU: the test modules
holding gpu tests, benchmarks, memory, DDP launch, lesson 01 executed and autograded) and must record the
multi-GPU and GPU-only figures as not measured. It runs the way it runs on a bare GPU server image: started by a
Python that holds only what such an image holds (torch, pytest, matplotlib, nvidia-ml-py, tqdm, psutil, numpy and
their dependencies, with pip), with ``--bundle``: wheels made by ``scripts/gpu_bundle.py`` for this Python,
installed offline into the check's own environment, and without a network where bubblewrap can take it away.
The other tests check the orchestration on its own: the deadline, a failing step, a step stopped at the deadline
with everything it started, and the exit code.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
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
    # With the environment prepared from the bundle (33 s) and the gpu test modules run (145 s): 355 s in all on the
    # 2-core CPU at a load average of 7-9 (other work running), 385 s in another loaded run.
    assert dry_run["seconds"] < 420, f"the quick dry run took {dry_run['seconds']:.0f} s"
    prepared = report["prepared"]
    assert prepared["wheels"] > 0 and not prepared["downloaded"] and prepared["bundle_mib"] < gpu_bundle.MAX_BUNDLE_MIB
    assert str(dry_run["image"].parent.parent) in prepared["torch"], prepared  # the image's torch, reused
    out = dry_run["out"]
    assert (out / "summary.txt").read_text().startswith("GPU check (CPU dry run (--cpu), quick)")
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
    assert [step["name"] for step in report["steps"]] == gpu_check.STEP_NAMES
    for step in report["steps"]:
        assert step["status"] in gpu_check.STATUSES, step
        assert "wall_s" in step, step
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
    # The modules' CPU parts ran (nothing skipped for an import error); only the gpu tests were skipped.
    assert counts["passed"] > 0 and counts["failed"] == counts["error"] == 0 and counts["gpu_passed"] == 0
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
    assert {"step_times", "memory_accuracy", "memory_overhead", "ddp_launch", "lessons", "autograde"} <= measured
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
    assert ran == [name for name in gpu_check.STEP_NAMES if name not in ("real_scaling", "memory_imbalance")]


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
    test = "tests/test_ddp.py::test_the_start_line_counts_seconds_and_ready_ranks_in_a_notebook"
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
