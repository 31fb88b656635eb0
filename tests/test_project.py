"""The project's own files agree with each other: environment.yml and pyproject.toml, the README's commands."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].strip().lower()


def test_environment_yml_installs_what_pyproject_declares():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    environment = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    declared = {_name(r): r.replace(" ", "") for r in project["dependencies"]}
    listed = {_name(r): r.replace(" ", "") for r in pip_section if not r.startswith("-e")}
    assert listed == declared, "environment.yml's pip section must list pyproject.toml's dependencies exactly"
    assert "-e .[test]" in pip_section, "environment.yml must install gpulab itself in editable mode"
    python = next(d for d in environment["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert project["requires-python"] == ">=3.11" and python == "python=3.11"


def test_torch_requirement_admits_the_pinned_ci_build():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    torch_requirement = next(r for r in project["dependencies"] if _name(r) == "torch")
    from packaging.specifiers import SpecifierSet

    assert "2.13.0" in SpecifierSet(torch_requirement[len("torch") :]), torch_requirement
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


def test_no_module_named_utils_on_the_import_path(tmp_path):
    """gpulab's source folder is called utils/, but nothing named `utils` may be importable once installed."""
    import subprocess
    import sys

    probe = "import importlib.util, gpulab; print(importlib.util.find_spec('utils'))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "None", result.stdout
