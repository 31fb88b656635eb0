"""The checks of the test lessons built from ``tests/fixtures/pipeline_lesson`` (``tests/test_lessons_build.py``),
registered for grading by ``tests/nbgrader_tools.py: autograde_notebook`` through ``check_modules``. They decide
the fixture's graded cells as the course's checks decide a lesson's (``autograder/checks``)."""

from __future__ import annotations

import sys

from autograder.checks import check, expect

FIXTURE_CHECK_MODULES = {name: __name__ for name in ("pipeline_lesson", "interpreter_lesson", "99_pipeline")}


@check("count_chunks_test")
def count_chunks_test(session) -> None:
    pairs = [(10, 4)] + [(batch, size) for batch in range(1, 30) for size in range(1, 9)]
    for (batch, size), outcome in zip(pairs, session.calls("count_chunks", [(p, {}) for p in pairs]), strict=True):
        expect(outcome.value == len(range(0, batch, size)), f"batch {batch}, chunks of {size}")


def interpreter_probe(notebook, workdir):
    """Probe: the kernel's interpreter prefix, and whether gpulab is importable there."""
    import importlib.util
    import sys

    return [sys.prefix, importlib.util.find_spec("gpulab") is not None]


@check("interpreter_test")
def interpreter_test(session) -> None:
    prefix, has_gpulab = session.run(interpreter_probe)
    expect(prefix == sys.prefix, f"the kernel runs {prefix}, not this environment ({sys.prefix})")
    expect(has_gpulab is True, "gpulab is not installed in the kernel")
