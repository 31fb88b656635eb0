"""nbgrader configuration of the course (nbgrader 0.9.x).

One assignment per lesson: the assignment ``NN_name`` is the folder ``source/NN_name/`` (its notebook
``NN_name.ipynb`` is built from the jupytext source ``NN_name.py`` by ``make lessons``), released to
``lessons/NN_name/``. nbgrader creates assignments and students in the gradebook as it meets them
(``GenerateAssignment.create_assignment`` and ``Autograde.create_student`` are on), so nothing has to be
registered by hand. (``autograder/grade.py``, which grades in parallel, registers the students itself first and
turns ``create_student`` off: see ``grade.register_students``.)

nbgrader only reads ``nbgrader_config.py`` from the working directory, so this file is not found on its own.
The course's scripts (``scripts/build_lessons.py``, the grading command, the tests) load it explicitly with
``traitlets.config.loader.PyFileConfigLoader``; the paths below are computed from this file's location, so
they work from any working directory.

nbgrader's own command line, from any directory, needs the file named explicitly (it then still prints a
harmless "No nbgrader_config.py file found" warning)::

    nbgrader autograde 01_splitting --NbGrader.config_file=/path/to/repo/autograder/nbgrader_config.py

or run it from this folder (``cd autograder``), where nbgrader finds the file by itself. (``--config`` is not an
nbgrader option: it is ignored with a warning.) Prefer the course's scripts: each nbgrader command costs
about 2 s of start-up, and nbgrader runs the ``alembic`` command from ``PATH`` to create a gradebook, so
activate the environment first.
"""

import os

# `c` and `__file__` are provided by traitlets when it loads this file.
c = get_config()  # noqa: F821

COURSE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --- the course directory: <root>/{source,lessons,submitted,autograded,feedback}/<student>/<assignment>/
c.CourseDirectory.root = COURSE_ROOT
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "lessons"
# submitted/, autograded/ and feedback/ keep nbgrader's default names (they are git-ignored).

# The gradebook: an ignored file at the root (see .gitignore: /gradebook.db). `timeout=30` makes a
# writer wait for a held sqlite lock instead of failing with "database is locked" after 5 s (parallel grading).
c.CourseDirectory.db_url = "sqlite:///{}?timeout=30".format(os.path.join(COURSE_ROOT, "gradebook.db"))

# Never copy a lesson's jupytext source (`NN_name.py`, which holds the solutions and hidden tests) into a
# release or next to a submission being graded. A module whose name starts with a digit cannot be imported,
# so this pattern never matches a helper module a lesson ships. Other patterns are nbgrader's defaults.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "[0-9][0-9]_*.py"]

# --- assignments and students are created in the gradebook when first met
c.GenerateAssignment.create_assignment = True
c.Autograde.create_student = True

# --- executing notebooks (validate, autograde)
# Always the `python3` kernel: run from the course's environment, jupyter_client resolves it to that
# environment's interpreter (where torch and gpulab are installed), whatever kernelspec a submission carries.
c.ExecutePreprocessor.kernel_name = "python3"
# Per-cell limit: GPU cells (CUDA start-up, DDP process launch) can take tens of seconds on a cold machine.
c.ExecutePreprocessor.timeout = 120
c.Execute.timeout = 120  # nbgrader's Execute redefines the trait (default 30 s); set it explicitly too
# Encrypt the kernel's local connection when pyzmq can (ipykernel >= 7 otherwise logs "Kernel is running over
# TCP without encryption" to the terminal for every notebook it runs; harmless, but noise in grading output).
try:
    import zmq

    if zmq.has("curve"):
        c.KernelManager.transport_encryption = "auto"
except ImportError:  # pragma: no cover - pyzmq comes with jupyter_client
    pass

# --- the hardened pipeline (autograder/execute.py, autograder/feedback.py): every kernel in its own bubblewrap
# sandbox (autograder/sandbox.py; grading stops, naming what is missing, where none can be made), under time,
# memory and process limits set from outside; verdicts decided in the grader's process by the lessons' checks
# (autograder/checks; an assignment without checks is a grader error); feedback shows no kernel output (one
# summary line per test). Also used by `nbgrader autograde` / `generate_feedback` run with this configuration.
import sys  # noqa: E402

if COURSE_ROOT not in sys.path:
    sys.path.insert(0, COURSE_ROOT)
from autograder.execute import AUTOGRADE_PREPROCESSORS  # noqa: E402
from autograder.feedback import FEEDBACK_PREPROCESSORS  # noqa: E402

c.Autograde.autograde_preprocessors = AUTOGRADE_PREPROCESSORS
c.GenerateFeedback.preprocessors = FEEDBACK_PREPROCESSORS
# Feedback pages render the learner's markdown: nbgrader's feedback template with every markdown cell passed
# through nbconvert's sanitizer (autograder/feedback.py: sanitize_markup), so a page runs nothing a learner wrote in
# the browser of whoever opens it (the instructor first).
from nbgrader.converters import generate_feedback as _generate_feedback  # noqa: E402

from autograder.feedback import TEMPLATE_FILTERS, TEMPLATE_NAME, TEMPLATES  # noqa: E402

c.HTMLExporter.template_name = TEMPLATE_NAME
c.HTMLExporter.template_file = "page.html.j2"
c.HTMLExporter.extra_template_basedirs = [
    str(TEMPLATES),
    os.path.join(os.path.dirname(_generate_feedback.__file__), "..", "server_extensions", "formgrader", "templates"),
]
c.HTMLExporter.filters = TEMPLATE_FILTERS
c.HTMLExporter.exclude_input_prompt = True  # no "In [ ]:" beside a graded cell: the page shows no run
c.HTMLExporter.exclude_output_prompt = True
c.HTMLExporter.sanitize_html = True  # nbconvert's own switch too (outputs, raw cells of its base template)
# `nbgrader export` (and grade.py's grades.csv): nbgrader's columns, quoted and formula-safe (autograder/export.py).
c.ExportApp.plugin_class = "autograder.export.SafeCsvExportPlugin"
