"""The project's own files agree with each other: environment.yml and pyproject.toml, the README's commands."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].strip().lower()


def test_environment_yml_installs_what_pyproject_declares():
    """The conda environment is the local course environment: gpulab's dependencies and its `course` extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    environment = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    course = project["optional-dependencies"]["course"]
    declared = {_name(r): r.replace(" ", "") for r in project["dependencies"] + course}
    listed = {_name(r): r.replace(" ", "") for r in pip_section if not r.startswith("-e")}
    assert listed == declared, "environment.yml's pip section must list pyproject's dependencies and course extra"
    assert "-e .[course,test]" in pip_section, "environment.yml must install gpulab itself in editable mode"
    assert "-e ./solutions" in pip_section, "self-study's solutions (gpulab.check.solution, the grader's references)"
    python = next(d for d in environment["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert project["requires-python"] == ">=3.10" and python == "python=3.11"


def test_make_env_installs_the_course_and_test_extras():
    setup = (REPO / "scripts" / "setup_env.py").read_text()
    assert '"-e", ".[course,test]"' in setup, "the local environment needs JupyterLab and nbgrader (course extra)"
    assert '"-e", "solutions"' in setup, "self-study's solutions and the grader's references (solutions/)"


def _third_party_imports(folder: Path) -> set[str]:
    """Top-level names of the modules imported anywhere under ``folder``, other than the standard library's."""
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return {name for name in names if name not in sys.stdlib_module_names and name != "gpulab"}


# Imported by gpulab only inside a running IPython (guarded by `except ImportError`), and installed with ipywidgets.
PROVIDED_BY_THE_KERNEL = {"ipython"}


def test_gpulab_depends_on_exactly_what_it_imports():
    """Installing gpulab on Colab or Kaggle brings what it imports and nothing else (no JupyterLab, no nbgrader)."""
    from importlib.metadata import packages_distributions

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    distributions = packages_distributions()
    imported = {}
    for module in _third_party_imports(REPO / "utils" / "gpulab"):
        assert module in distributions, f"gpulab imports {module}, which no installed distribution provides"
        imported[module] = {d.lower() for d in distributions[module]}
    needed = {module: dists for module, dists in imported.items() if not dists & PROVIDED_BY_THE_KERNEL}
    missing = {module: dists for module, dists in needed.items() if not dists & declared}
    assert not missing, f"gpulab imports these without declaring them in [project] dependencies: {missing}"
    provided = set().union(*needed.values())
    unused = declared - provided
    assert not unused, f"[project] dependencies gpulab never imports (move them to an extra): {sorted(unused)}"
    assert {"jupyterlab", "nbgrader"} <= {_name(r) for r in project["optional-dependencies"]["course"]}


def test_torch_requirement_admits_the_pinned_ci_build():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    torch_requirement = next(r for r in project["dependencies"] if _name(r) == "torch")
    from packaging.specifiers import SpecifierSet

    admitted = SpecifierSet(torch_requirement[len("torch") :])
    assert "2.13.0" in admitted, torch_requirement
    # The bare GPU server image's torch (2.11) must be reused as it is; 2.4.0's nn.DataParallel warns on stderr.
    assert "2.11.0" in admitted and "2.4.0" not in admitted, torch_requirement
    assert "torch==2.13.0" in (REPO / "Makefile").read_text(), "CI installs the pinned torch first"


def test_nvml_comes_from_nvidia_ml_py_not_the_deprecated_package():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in project["dependencies"]}
    assert "nvidia-ml-py" in names and "pynvml" not in names


def test_readme_commands_are_make_targets():
    readme = (REPO / "README.md").read_text()
    makefile = (REPO / "Makefile").read_text()
    for command in ("make lab", "make test"):
        assert f"\n{command}\n" in readme, f"the README shows `{command}` on its own line"
        assert re.search(rf"^{command.split()[1]}:", makefile, re.M), f"Makefile has a `{command.split()[1]}` target"
    assert "make test" in (REPO / ".ci" / "run").read_text(), "CI runs the README's test command"


def test_readme_opens_every_lesson_on_colab_and_kaggle():
    """One Colab and one Kaggle link per lesson, to the notebook in lessons/ on GitHub at pyproject's Repository."""
    repository = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    owner, name = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?", repository).groups()
    readme = (REPO / "README.md").read_text()
    lessons = sorted(p.parent.name for p in (REPO / "source").glob("*/*.py") if p.stem == p.parent.name)
    assert lessons, "no lessons found"
    colab = re.findall(r"\(https://colab\.research\.google\.com/github/([^)\s]+)\)", readme)
    kaggle = re.findall(r"\(https://kaggle\.com/kernels/welcome\?src=([^)\s]+)\)", readme)
    notebooks = [f"lessons/{lesson}/{lesson}.ipynb" for lesson in lessons]
    assert colab == [f"{owner}/{name}/blob/main/{path}" for path in notebooks]
    assert kaggle == [f"https://raw.githubusercontent.com/{owner}/{name}/main/{path}" for path in notebooks]
    assert all((REPO / path).is_file() for path in notebooks)


def test_no_module_named_utils_on_the_import_path(tmp_path):
    """gpulab's source folder is called utils/, but nothing named `utils` may be importable once installed."""
    import subprocess
    import sys

    probe = "import importlib.util, gpulab; print(importlib.util.find_spec('utils'))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "None", result.stdout


def gpulab_imports() -> dict[str, set[str]]:
    """Which gpulab modules each gpulab module imports, anywhere in it (at the top or inside a function)."""
    root = REPO / "utils" / "gpulab"
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.startswith("gpulab.")}
            elif isinstance(node, ast.ImportFrom) and node.module == "gpulab":
                found |= {f"gpulab.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpulab."):
                found.add(node.module)
        graph[name] = found
    return graph


def test_gpulab_modules_import_each_other_without_a_circle():
    """One concept per module, stacked: no module reaches itself through the modules it imports, lazily or not
    (the package's ``__init__``, which every submodule passes through, is left out)."""
    graph = {name: deps - {"gpulab"} for name, deps in gpulab_imports().items() if name != "gpulab"}
    circles = []

    def visit(name: str, path: list[str]) -> None:
        for dependency in sorted(graph.get(name, ())):
            if dependency in path:
                circles.append(" -> ".join([*path[path.index(dependency) :], dependency]))
            elif dependency not in done:
                visit(dependency, [*path, dependency])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not circles, circles


# What Python 3.11 added to the standard library that code for 3.10 must not use (What's New in Python 3.11).
NEW_IN_311 = {
    "modules": {"tomllib", "wsgiref.types"},
    "names": {
        "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type", "TypeVarTuple",
                   "Unpack", "NotRequired", "Required", "dataclass_transform", "get_overloads", "clear_overloads"},
        "datetime": {"UTC"},
        "enum": {"StrEnum", "ReprEnum", "EnumCheck", "FlagBoundary", "verify", "member", "nonmember", "global_enum"},
        "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner", "Barrier"},
        "contextlib": {"chdir"},
        "hashlib": {"file_digest"},
        "inspect": {"getmembers_static", "ismethodwrapper"},
        "logging": {"getLevelNamesMapping"},
        "math": {"cbrt", "exp2"},
        "operator": {"call"},
    },
    "builtins": {"ExceptionGroup", "BaseExceptionGroup"},
}  # fmt: skip


def learner_code() -> list[Path]:
    """What runs on a learner's Python: gpulab and the lessons (their sources and the files they ship)."""
    return sorted([*(REPO / "utils" / "gpulab").rglob("*.py"), *(REPO / "source").rglob("*.py")])


def test_gpulab_and_the_lessons_run_on_python_3_10():
    """pyproject admits 3.10 (Colab and Kaggle images have lagged behind), so gpulab and the lessons' code must
    parse with 3.10's grammar (no ``except*``, no PEP 695 generics) and use nothing 3.11 added to the standard
    library."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    found = []
    for path in learner_code():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path), feature_version=(3, 10))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    aliases[alias.asname or alias.name] = alias.name
                    if alias.name in NEW_IN_311["modules"]:
                        found.append(f"{where}: import {alias.name}")
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module in NEW_IN_311["modules"]:
                    found.append(f"{where}: from {node.module}")
                new = NEW_IN_311["names"].get(node.module, set())
                found += [f"{where}: {node.module}.{alias.name}" for alias in node.names if alias.name in new]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                module = aliases.get(node.value.id, node.value.id)
                if node.attr in NEW_IN_311["names"].get(module, set()):
                    found.append(f"{where}: {module}.{node.attr}")
            elif isinstance(node, ast.Name) and node.id in NEW_IN_311["builtins"]:
                found.append(f"{where}: {node.id}")
    assert not found, found


def test_the_docs_example_score_tables_are_what_grade_py_prints_for_todays_lessons():
    """The example runs in the README and docs/instructors.md (alice: the reference solutions, bob: the blank
    release, carol: lesson 01 only and a lesson 02 that is not a notebook) show each lesson's points as they are
    today: the tables are made here by grade.py's own ``table`` from the releases' graded cells."""
    sys.path.insert(0, str(REPO))
    from autograder import grade
    from tests.nbgrader_tools import graded_cells

    lessons = sorted(p.name for p in (REPO / "lessons").iterdir() if (p / f"{p.name}.ipynb").is_file())
    points = {
        lesson: sum(p for _, p in graded_cells(REPO / "lessons" / lesson / f"{lesson}.ipynb")) for lesson in lessons
    }

    def graded(student: str, lesson: str, score: float) -> dict:
        return {"task": {"student": student, "assignment": lesson}, "score": score, "max_score": points[lesson]}

    alice = [graded("alice", lesson, points[lesson]) for lesson in lessons]
    bob = [graded("bob", lesson, 0) for lesson in lessons]
    carol = [
        graded("carol", lessons[0], points[lessons[0]]),
        {"task": {"student": "carol", "assignment": lessons[1]}, "error": "not a readable notebook"},
    ]
    everyone, regraded = grade.table(alice + bob + carol, lessons), grade.table(bob + carol, lessons)
    readme, instructors = (REPO / "README.md").read_text(), (REPO / "docs" / "instructors.md").read_text()
    assert everyone in readme, everyone
    assert everyone in instructors and regraded in instructors, regraded
