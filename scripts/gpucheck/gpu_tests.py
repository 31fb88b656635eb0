"""The ``gpu_tests`` step: every test module holding ``gpu`` / ``gpu2``-marked tests, run whole with JUnit XML."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from typing import Any

from gpucheck.context import REPO, StepContext, gpu_count

GPU_MARKERS = "gpu or gpu2"


def _pytest(ctx: StepContext, name: str, *arguments: str) -> tuple[subprocess.CompletedProcess, list[dict[str, Any]]]:
    """Run pytest with JUnit XML in ``logs/<name>.xml``; the process and each test case's outcome."""
    import xml.etree.ElementTree as ElementTree

    junit = ctx.logs / f"{name}.xml"
    command = [
        sys.executable, "-m", "pytest", *arguments, "-q", "-rfEs", "-p", "no:cacheprovider",
        "--continue-on-collection-errors", f"--junitxml={junit}", "-o", "junit_family=xunit2",
    ]  # fmt: skip
    print("+", " ".join(command), flush=True)
    # A private temporary folder: tests that check they leave nothing in it must not see other processes' files.
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{name}-") as private:
        environment = dict(os.environ, TMPDIR=private)
        completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environment)
    print(completed.stdout[-20000:], completed.stderr[-5000:], sep="\n", flush=True)
    cases = []
    if junit.is_file():
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for kind in ("failure", "error", "skipped"):
                found = case.find(kind)
                if found is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                    message = (found.get("message") or found.text or "")[:500]
                    if kind == "error" and not case.get("classname") and "collection" in message:
                        outcome, message = "not_importable", (found.text or message)[-500:]
                    break
            name_ = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append({"test": name_, "outcome": outcome, "seconds": float(case.get("time", 0)), "message": message})
    return completed, cases


def gpu_test_modules(ctx: StepContext) -> tuple[list[str], set[str], list[dict[str, Any]]]:
    """The test modules that hold gpu-marked tests, those tests' names, and the modules that cannot even be
    imported here (so cannot be searched): collected with ``--continue-on-collection-errors``, never aborted."""
    completed, _ = _pytest(ctx, "gpu_tests_collect", "--collect-only", "-m", GPU_MARKERS)
    ids = [line.strip() for line in completed.stdout.splitlines() if "::" in line and not line.startswith("ERROR")]
    modules = sorted({node.split("::")[0] for node in ids})
    broken = []
    for match in re.finditer(r"^_+ ERROR collecting (\S+) _+\n(.*?)(?=^_{5,}|^=+ )", completed.stdout, re.M | re.S):
        errors = [line[1:].strip() for line in match.group(2).splitlines() if line.startswith("E ")]
        broken.append({"module": match.group(1), "reason": errors[-1] if errors else "import failed"})
    return modules, {node.split("::")[-1] for node in ids}, broken


def step_gpu_tests(ctx: StepContext) -> None:
    """Every test module holding gpu-marked tests, run whole (its CPU parts too); modules that cannot be imported
    here and gpu tests skipped for want of GPUs are recorded as not measured, with the reason."""
    modules, gpu_tests, broken = gpu_test_modules(ctx)
    for entry in broken:
        ctx.missing(f"tests in {entry['module']}", f"the module cannot be imported here: {entry['reason']}")
    ctx.details.update(modules=modules, not_importable=broken)
    if not modules:
        ctx.fail("no gpu-marked test was collected")
        return
    # --quick (CI) leaves out the modules' slow CPU tests; the gpu tests always run.
    selection = ["-m", f"{GPU_MARKERS} or not slow"] if ctx.quick else []
    completed, tests = _pytest(ctx, "gpu_tests", *selection, *modules)
    counts = {
        outcome: sum(t["outcome"] == outcome for t in tests) for outcome in ("passed", "failed", "error", "skipped")
    }
    on_gpus = [t for t in tests if t["test"].split("::")[-1] in gpu_tests]
    counts["gpu_passed"] = sum(t["outcome"] == "passed" for t in on_gpus)
    ctx.details.update(
        command=f"pytest {' '.join(modules)}", exit_code=completed.returncode, counts=counts, tests=tests
    )
    print(f"tests: {counts}", flush=True)
    if completed.returncode not in (0, 5) or counts["failed"] or counts["error"]:
        ctx.fail(f"pytest exit code {completed.returncode}: {counts['failed']} failed, {counts['error']} errors")
    gpus = gpu_count()
    skipped = [t for t in on_gpus if t["outcome"] == "skipped"]
    if skipped:
        reason = f"not measured: only {gpus} GPU(s)" + (" (--cpu)" if ctx.cpu else "")
        ctx.missing([f"gpu test {t['test']} ({t['message']})" for t in skipped], reason)
    if gpus and not counts["gpu_passed"]:
        ctx.fail(f"{gpus} GPU(s) visible but no gpu-marked test ran (all {len(on_gpus)} skipped)")
