"""Loaded by every Python process a grading kernel starts (the grader puts this folder on ``PYTHONPATH``).

Installs ``autograder/guard.py``'s ``FileGuard``: an audit hook that refuses writes to the installed packages,
gpulab, the grader and the grading folder, and the start of programs that would escape it. Does nothing outside
grading (no ``GRADER_PROTECTED`` in the environment).
"""

import importlib.util as _util
import os as _os

if _os.environ.get("GRADER_PROTECTED"):
    _spec = _util.spec_from_file_location(
        "_grader_guard", _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "guard.py")
    )
    _module = _util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _module.install_file_guard()
