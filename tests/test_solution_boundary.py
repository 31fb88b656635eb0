"""No solution in a learner's reach: what gpulab holds, what only ``gpulab_solutions`` and the grader hold.

gpulab is the package a learner's kernel imports, in a class's environment and inside the grading sandbox. It holds
the exercises' rules, inputs, comparisons and hints, and the expected outcomes of their fixed inputs; the
references, the grader's hidden draws, the solutions and the quizzes' digests are ``gpulab_solutions``'s
(``solutions/``), which self-study installs and a class never does. These tests hold the line:

* no callable of gpulab, used as an answer, passes any exercise's self-check (the attack: a blank notebook whose
  answer cells call what the package holds);
* no file of gpulab holds a line of a solution, and gpulab imports ``gpulab_solutions`` only to show a solution;
* a sandboxed kernel cannot import ``gpulab_solutions``, also where it is installed among the packages the sandbox
  shows (an empty folder lies over it), and ``gpulab.check.solution`` says so;
* without ``gpulab_solutions`` every self-check still says right or wrong, from the recorded outcomes, and those
  are what the references say (``gpulab_solutions.recorded --check``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import gpulab_solutions
import pytest
import torch
from gpulab import check

from autograder import sandbox

REPO = Path(__file__).resolve().parents[1]
LEARNER_PACKAGE = REPO / "utils" / "gpulab"

# Every callable of every gpulab module, tried as the answer of every exercise, in a process where gpulab_solutions
# cannot be imported. Callables that start or end processes (the DDP launcher's, the fork server's) are left out:
# they take no answer's arguments, and an answer calling them gets a process, not a value.
PROBE = textwrap.dedent(
    """
    import importlib, json, pkgutil, signal, sys, warnings
    sys.modules["gpulab_solutions"] = None
    warnings.simplefilter("ignore")
    import gpulab
    from gpulab import check

    SKIPPED = ("exit", "die", "kill", "signal", "serve", "launch", "spawn", "fork", "worker", "main")

    class Late(Exception):
        pass

    def late(*_):
        raise Late()

    signal.signal(signal.SIGALRM, late)
    # each exercise's first visible case, built once and copied for each try: a callable that fails it is no
    # answer; one that passes it is tried on every case of the exercise
    import copy
    first = {name: check.exercise(name).visible_cases()[0] for name in sorted(check._registry())}
    passed, tried = [], 0
    for info in pkgutil.walk_packages(gpulab.__path__, "gpulab."):
        try:
            module = importlib.import_module(info.name)
        except Exception:
            continue
        for attribute, value in list(vars(module).items()):
            if not callable(value) or getattr(value, "__module__", None) != info.name:
                continue
            if any(word in attribute for word in SKIPPED):
                continue
            for name, case in first.items():
                tried += 1
                signal.alarm(5)
                try:
                    copy.deepcopy(case).verify(value)
                    if check.run(name, value).passed:
                        passed.append([info.name, attribute, name])
                except BaseException:
                    pass
                finally:
                    signal.alarm(0)
    print(json.dumps({"passed": passed, "tried": tried}))
    """
)


@pytest.mark.slow
def test_no_callable_of_the_learners_package_passes_an_exercise():
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=900, cwd=REPO / "tests"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["tried"] > 1000, found  # the probe reached the package
    assert found["passed"] == [], f"gpulab holds answers: {found['passed']}"


# Lines of a solution that are an idiom, not the answer: the hints' mistake models list a model's parameter names too.
IDIOMS = {"names = [name for name, _ in model.named_parameters()]"}


def _solution_lines() -> dict[str, list[str]]:
    """Per exercise, the lines of its solution that say something (not a signature, a comment or an idiom)."""
    lines = {}
    for name in sorted(check._registry()):
        code = gpulab_solutions.solution_of(name)
        lines[name] = [
            line.strip()
            for line in code.splitlines()
            if len(line.split("#", 1)[0].strip()) >= 32
            and not line.strip().startswith(("def ", "class ", "#"))
            and line.split("#", 1)[0].strip() not in IDIOMS
        ]
    return lines


def test_no_file_of_the_learners_package_holds_a_solution_or_imports_the_solutions():
    texts = {path: path.read_text() for path in LEARNER_PACKAGE.rglob("*.py")}
    for name, lines in _solution_lines().items():
        assert lines, name
        for path, text in texts.items():
            for line in lines:
                code = line.split("#", 1)[0].strip()
                assert code not in text, f"{path.relative_to(REPO)} holds {name}'s solution line {code!r}"
    importers = [
        path
        for path, text in texts.items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Import)
        and any(alias.name.startswith("gpulab_solutions") for alias in node.names)
        or isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("gpulab_solutions")
    ]
    assert importers == [], importers  # only gpulab.check.solutions() imports it, by name, to show a solution
    assert not list(LEARNER_PACKAGE.rglob("solutions*")), "a solutions file inside gpulab"


def test_every_exercise_self_checks_without_the_solutions_package():
    """A class's environment: right answers pass and wrong ones fail, from the recorded outcomes alone."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["gpulab_solutions"] = None
        from gpulab import check
        for name in sorted(check._registry()):
            cases = [*check.exercise(name).visible_cases(), *check.exercise(name).extra_cases()]
            assert cases, name
            assert not check.run(name, lambda *a, **k: None).passed, name
        print("ok", len(check._registry()))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("ok 14"), result.stderr[-2000:]


def test_the_recorded_outcomes_are_what_the_references_say():
    from gpulab_solutions import recorded

    assert recorded.main(["--check"]) == 0


def test_recorded_values_agree_to_float32_rounding_not_beyond():
    """The recorded file was made on one machine and is checked on others, whose CPUs sum in another order: a float
    or floating tensor one rounding step away is the same recorded value; a change a reference could mean is not."""
    from gpulab_solutions import recorded

    loss = torch.tensor([1.3230056762695312], dtype=torch.float32)
    rounded = torch.nextafter(loss, torch.tensor([2.0]))  # the next float32 up: one rounding step
    assert recorded._equal(loss, rounded) and recorded._equal(loss.item(), rounded.item())
    assert recorded._equal(float("nan"), float("nan"))
    for changed in (loss + 1e-3, loss.half().float() + 1e-4, loss * 1.001):
        assert not recorded._equal(loss, changed) and not recorded._equal(loss.item(), changed.item())
    assert not recorded._equal(loss, loss.double()), "a dtype is no rounding"
    assert not recorded._equal(1.0, float("nan"))


def test_a_saved_state_is_judged_within_float32_rounding():
    """save_checkpoint's rules train the model where the check runs and compare with a state trained where the
    lessons were built: a state that differs by rounding is the right one; one step off or in half precision is not."""
    from gpulab.exercises import checkpoints

    state = [["weight", torch.tensor([[0.4537, -0.0058], [0.1200, 0.0003]])], ["bias", torch.tensor([0.25, -0.5])]]
    expected = {"entries": ["epoch", "model", "optimizer"], "epoch": 3, "model": state, "optimizer": {"lr": 0.01}}

    def saved(change):
        return {**expected, "model": [[key, change(value)] for key, value in state]}

    rounding = saved(lambda v: torch.nextafter(v, torch.full_like(v, 9.0)))
    assert checkpoints.same_checkpoint(rounding, expected) and checkpoints.same_model_entry(rounding, expected)
    for wrong in (lambda v: v - 0.01, lambda v: v.half().float(), lambda v: v * 1.001):
        assert not checkpoints.same_checkpoint(saved(wrong), expected)
        assert not checkpoints.same_model_entry(saved(wrong), expected)


def test_an_argument_returned_itself_is_recorded_as_that_argument():
    """split_batch repeats an object of the learner's own kind itself, not a copy: its recorded outcome names the
    argument, and the self-check compares with the very object it passes."""
    extra = [c for c in check.exercise("split_batch").extra_cases() if "not a copy" in c.why]
    (case,) = extra
    assert all(item is case.args[0] for item in case.expected)


@pytest.fixture()
def installed_copy(tmp_path, monkeypatch):
    """A copy of gpulab_solutions installed in a folder of packages the sandbox shows (as a non-editable install
    into the course's environment would put it), on this process's ``sys.path``."""
    packages = tmp_path / "site-packages"
    packages.mkdir()
    import shutil

    shutil.copytree(Path(gpulab_solutions.__file__).parent, packages / "gpulab_solutions")
    monkeypatch.syspath_prepend(str(packages))
    return packages


@pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this machine")
def test_a_sandboxed_kernel_cannot_import_the_solutions(installed_copy, tmp_path):
    assert installed_copy / "gpulab_solutions" in [Path(p) for p in sandbox.solutions_paths()]
    work = tmp_path / "work"
    work.mkdir()
    sandbox.give_to_kernel(work)
    probe = textwrap.dedent(
        f"""
        import json, os, sys
        sys.path.insert(0, {str(installed_copy)!r})
        found = {{"listed": os.path.isdir({str(installed_copy / "gpulab_solutions")!r})}}
        try:
            found["files"] = os.listdir({str(installed_copy / "gpulab_solutions")!r})
        except OSError as error:
            found["files"] = type(error).__name__
        try:
            import gpulab_solutions
            found["solution_of"] = hasattr(gpulab_solutions, "solution_of")
        except ImportError:
            found["solution_of"] = False
        from gpulab import check
        found["installed"] = check.solutions() is not None
        check.solution("chunk_sizes", confirm=True)
        found["repository"] = os.path.exists({str(REPO / "solutions")!r})
        open("found.json", "w").write(json.dumps(found))
        """
    )
    argv = sandbox.command(
        [sys.executable, "-c", probe],
        workdir=work,
        writable=[work],
        environment=sandbox.kernel_environment({}, work),
    )
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads((work / "found.json").read_text())
    assert found["files"] in ([], "PermissionError"), found
    assert not found["solution_of"] and not found["installed"] and not found["repository"], found
    assert "not installed" in result.stdout and "def chunk_sizes" not in result.stdout, result.stdout
