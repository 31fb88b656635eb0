# Thin wrappers: every target calls a script or a tool; the logic lives in scripts/ and autograder/.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first and on its own: a GPU box may override this with its own CUDA build.
TORCH_SPEC ?= torch==2.13.0
PORT ?= 8888
LAB_ARGS ?=
# Jupyter refuses to run as root unless told; containers and cloud boxes often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: hub lab lab-headless lab-instructor test test-draws lint format lessons check-lessons translations grade gpu-bundle gpu-check gpu-check-cpu env clean

env: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) scripts/setup_env.py --venv $(VENV) --torch "$(TORCH_SPEC)"
	touch $@

# The learner's JupyterLab: nbgrader's instructor tools (menu, Formgrader, Validate) turned off by jupyter/learner/.
LEARNER_CONFIG := JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter/learner$(if $(JUPYTER_CONFIG_PATH),:$(JUPYTER_CONFIG_PATH))

lab: env
	$(LEARNER_CONFIG) $(BIN)/jupyter lab --notebook-dir=lessons --port=$(PORT) $(ROOT_FLAG) $(LAB_ARGS)

lab-headless: env
	$(LEARNER_CONFIG) $(BIN)/jupyter lab --notebook-dir=lessons --port=$(PORT) --no-browser --ip=127.0.0.1 $(ROOT_FLAG) $(LAB_ARGS)

# The instructor's JupyterLab, with nbgrader's tools, at the course root (nbgrader_config.py: autograder/); see
# docs/instructors.md. LAB_ARGS="--no-browser --ip=127.0.0.1" on a server.
lab-instructor: env
	cd autograder && PATH="$(CURDIR)/$(BIN):$$PATH" ../$(BIN)/jupyter lab --notebook-dir=.. --port=$(PORT) $(ROOT_FLAG) $(LAB_ARGS)

# A class on this box (as root): accounts for CLASS's learners and an instructor, JupyterHub, nbgrader's exchange, a
# GPU group per learner; HUB_ARGS="--port 8000 --gpus-per-learner 2 ..." (scripts/class_hub.py setup --help). Then
# `$(BIN)/python scripts/class_hub.py start`; see docs/instructors.md, "A class on one GPU box".
hub: CLASS ?= class.txt
hub: env
	$(BIN)/python scripts/class_hub.py setup $(CLASS) --env $(CURDIR)/$(VENV) --torch "$(TORCH_SPEC)" $(HUB_ARGS)

test: env
	$(BIN)/python scripts/run_tests.py

# The grading-draws test under 16 draws per lesson instead of make test's 6 (tests/test_checks_draws.py).
test-draws: env
	GPULAB_TEST_DRAWS=16 $(BIN)/python -m pytest tests/test_checks_draws.py

lint: env
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: env
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

# Regenerate lessons/ (and the git-ignored source/*/*.ipynb) from source/*/*.py; LESSONS="01_splitting" for some.
lessons: env
	$(BIN)/python scripts/build_lessons.py $(LESSONS)

# Fail, listing them, if any committed release (English or Japanese) differs from a fresh build, or a translation
# is stale (what CI checks).
check-lessons: env
	$(BIN)/python scripts/build_lessons.py --check $(LESSONS)

# Bring the translation catalogues (source/*/*.ja.po) in step with the English cells, for translators; see
# docs/translating.md.
translations: env
	$(BIN)/python scripts/build_lessons.py --refresh-translations $(LESSONS)

# Grade a folder of <student>/<assignment>/<notebook>.ipynb; see docs/instructors.md. GRADE_ARGS="--student bob" etc.
grade: SUBMISSIONS ?= submissions
grade: OUT ?= grading
grade: env
	$(BIN)/python autograder/grade.py $(SUBMISSIONS) --out $(OUT) $(GRADE_ARGS)

# The wheels the GPU check needs on a bare GPU server image (Python 3.12, x86_64), downloaded here: GPU_BUNDLE.
GPU_BUNDLE ?= gpu-bundle
gpu-bundle: env
	$(BIN)/python scripts/gpu_bundle.py $(GPU_BUNDLE)

# Prove every GPU path and record the numbers (report.json, summary.txt, plots, logs/ under OUT, and OUT.tar.gz),
# with the Python that has the GPU build of torch (PYTHON) and the bundle's wheels; GPU_CHECK_ARGS="--quick" etc.
gpu-check: OUT ?= benchmarks/results/gpu-check-$(shell date +%Y-%m-%d)
gpu-check:
	$(PYTHON) scripts/gpu_check.py $(OUT) --bundle $(GPU_BUNDLE) $(GPU_CHECK_ARGS)

# The same on the CPU (a dry run, as CI's tests/test_gpu_check.py does with --quick).
gpu-check-cpu: OUT ?= benchmarks/results/gpu-check-cpu-$(shell date +%Y-%m-%d)
gpu-check-cpu: env
	$(BIN)/python scripts/gpu_check.py $(OUT) --cpu $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .build
