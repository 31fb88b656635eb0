"""The course's autograder: ``grade.py`` (the instructor's command) and the nbgrader pipeline it runs.

``repair`` re-attaches lost nbgrader metadata, ``execute`` runs notebooks in a ``sandbox`` under ``limits`` and
decides each graded cell by its ``checks`` (in the grader's process), ``feedback`` keeps hidden tests out of
feedback, and
``redteam`` holds the submissions that try to cheat it. ``nbgrader_config.py`` is the course's nbgrader
configuration.

The checks compute their expected values from ``gpulab_solutions`` (``solutions/`` beside this folder: the
references and the hidden draws, which no kernel can import): where it is not installed (the grading kit a class
copies, a clone without ``make env``), the folder beside this one is put on ``sys.path``.
"""

import importlib.util as _importlib_util
import sys as _sys
from pathlib import Path as _Path

_SOLUTIONS = _Path(__file__).resolve().parents[1] / "solutions"
if _importlib_util.find_spec("gpulab_solutions") is None and (_SOLUTIONS / "gpulab_solutions").is_dir():
    _sys.path.append(str(_SOLUTIONS))
