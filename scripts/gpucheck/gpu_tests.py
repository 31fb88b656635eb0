"""The ``gpu_tests`` step: the ``gpu`` / ``gpu2``-marked tests of every test module holding them, with JUnit XML
(the full profile runs those modules whole)."""

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


# A test module holding gpu tests: one that marks a test (or itself) ``gpu`` or ``gpu2``.
GPU_MARK = re.compile(r"\bmark\.gpu2?\b")


def modules_with_gpu_tests() -> list[str]:
    """The test modules that mark tests ``gpu`` / ``gpu2``, found in their text: no test module is imported (a
    collection of every module took most of a minute, and needs what each of them imports)."""
    found = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        if GPU_MARK.search(path.read_text(encoding="utf-8", errors="replace")):
            found.append(str(path.relative_to(REPO)))
    return found


def gpu_test_names(ctx: StepContext, modules: list[str]) -> tuple[set[str], list[dict[str, Any]]]:
    """The gpu-marked tests of ``modules`` and the modules that cannot even be imported here: collected with
    ``--continue-on-collection-errors``, never aborted."""
    completed, _ = _pytest(ctx, "gpu_tests_collect", "--collect-only", "-m", GPU_MARKERS, *modules)
    ids = [line.strip() for line in completed.stdout.splitlines() if "::" in line and not line.startswith("ERROR")]
    return {node.split("::")[-1] for node in ids}, _not_importable(completed.stdout)


def _not_importable(output: str) -> list[dict[str, Any]]:
    broken = []
    for match in re.finditer(r"^_+ ERROR collecting (\S+) _+\n(.*?)(?=^_{5,}|^=+ )", output, re.M | re.S):
        errors = [line[1:].strip() for line in match.group(2).splitlines() if line.startswith("E ")]
        broken.append({"module": match.group(1), "reason": errors[-1] if errors else "import failed"})
    return broken


def step_gpu_tests(ctx: StepContext) -> None:
    """The gpu-marked tests of every module holding them (the full profile: those modules run whole, their CPU
    parts too, with a GPU visible); modules that cannot be imported here and gpu tests skipped for want of GPUs
    are recorded as not measured, with the reason."""
    modules = modules_with_gpu_tests()
    ctx.details.update(modules=modules)
    if not modules:
        ctx.fail("no test module marks a test gpu or gpu2")
        return
    if ctx.settings.gpu_tests_whole:
        gpu_tests, broken = gpu_test_names(ctx, modules)
        selection: list[str] = []
    else:  # their CPU parts run in CI; here only what needs a GPU
        gpu_tests, broken = None, []
        selection = ["-m", GPU_MARKERS]
    completed, tests = _pytest(ctx, "gpu_tests", *selection, *modules)
    broken = broken or _not_importable(completed.stdout)
    for entry in broken:
        ctx.missing(f"tests in {entry['module']}", f"the module cannot be imported here: {entry['reason']}")
    ctx.details["not_importable"] = broken
    counts = {
        outcome: sum(t["outcome"] == outcome for t in tests) for outcome in ("passed", "failed", "error", "skipped")
    }
    ran = [t for t in tests if t["outcome"] != "not_importable"]
    on_gpus = [t for t in ran if gpu_tests is None or t["test"].split("::")[-1] in gpu_tests]
    counts["gpu_passed"] = sum(t["outcome"] == "passed" for t in on_gpus)
    counts["gpu_tests"] = len(on_gpus)
    ctx.details.update(
        command=f"pytest {' '.join(selection + modules)}", exit_code=completed.returncode, counts=counts, tests=tests
    )
    print(f"tests: {counts}", flush=True)
    # With a module that cannot be imported pytest exits 1; that module is recorded as not measured above.
    if (completed.returncode not in (0, 5) and not broken) or counts["failed"] or counts["error"]:
        ctx.fail(f"pytest exit code {completed.returncode}: {counts['failed']} failed, {counts['error']} errors")
    if not on_gpus and not broken:
        ctx.fail("no gpu-marked test was collected")
    gpus = gpu_count()
    skipped = [t for t in on_gpus if t["outcome"] == "skipped"]
    if skipped:
        reason = f"not measured: only {gpus} GPU(s)" + (" (--cpu)" if ctx.cpu else "")
        ctx.missing([f"gpu test {t['test']} ({t['message']})" for t in skipped], reason)
    if gpus and on_gpus and not counts["gpu_passed"]:
        ctx.fail(f"{gpus} GPU(s) visible but no gpu-marked test ran (all {len(on_gpus)} skipped)")
