# @title {title}
import importlib.util
import os
import subprocess
import sys
import urllib.request

os.environ["GPULAB_LANGUAGE"] = "{language}"  # the notebook's edition: gpulab's messages and plots speak it

kaggle = "KAGGLE_KERNEL_RUN_TYPE" in os.environ
colab = "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ
fix = "turn Internet on (Settings → Internet → On)" if kaggle else "check the internet connection"
if importlib.util.find_spec("gpulab") is None:
    floor = "{python_floor}"  # pyproject.toml's requires-python
    if sys.version_info[:2] < tuple(int(part) for part in floor.split(".")):
        have = ".".join(map(str, sys.version_info[:3]))
        raise RuntimeError(
            f"gpulab needs Python {floor} or newer; this runtime has Python {have}.\n"
            "To fix: choose a runtime or image with a newer Python, then run this cell again."
        )
    where = "Colab" if colab else "Kaggle" if kaggle else "this Jupyter"
    requirement = os.environ.get("GPULAB_SOURCE", "gpulab @ git+{repository}")
    # self-study's solutions (gpulab.check.solution, the quiz's right or wrong), from the same repository
    solutions = requirement.replace("gpulab @", "gpulab-solutions @", 1) + "#subdirectory=solutions"
    print(f"Installing gpulab on {where} … (once per session)", flush=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--progress-bar", "off", requirement, solutions]
    result = subprocess.run(pip, capture_output=True, text=True)
    if result.returncode != 0:
        pip_said = "\n".join([line for line in (result.stdout + result.stderr).splitlines() if line.strip()][-5:])
        raise RuntimeError(
            f"Could not install gpulab from {requirement}: no internet, or the repository is unreachable.\n"
            f"To fix: {fix}, then run this cell again. The last lines from pip:\n{pip_said}"
        )
    importlib.invalidate_caches()
    print(f"gpulab installed: {requirement}")
# Modules this notebook imports from its own folder (code that DDP's processes run must live in a file).
for lesson_file in "{lesson_files}".split():
    name = os.path.basename(lesson_file)
    if not os.path.exists(name):
        url = os.environ.get("GPULAB_LESSONS_URL", "{lessons_url}") + "/" + lesson_file
        try:
            content = urllib.request.urlopen(url, timeout=60).read()
        except OSError as error:
            raise RuntimeError(
                f"Could not download {url} ({error}).\nTo fix: {fix}, then run this cell again."
            ) from None
        with open(name, "wb") as file:
            file.write(content)
        print(f"downloaded {name}")
