"""The ``autograde`` step: per lesson, the reference, the blank release and a wrong submission, autograded."""

from __future__ import annotations

import importlib
import importlib.util
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from gpucheck.context import StepContext, setup_paths
from gpucheck.lessons import LESSON_MODULES, lesson_names


def _wrong_submissions(lesson: str) -> dict[str, tuple[dict[str, str], set[str]]]:
    """The ``WRONG`` submissions of a lesson's test module (module level, or on its GradedLesson subclass)."""
    module_name = f"tests.test_lesson_{lesson.split('_')[0]}"
    if importlib.util.find_spec(module_name) is None:
        return {}
    module = importlib.import_module(module_name)
    wrong = getattr(module, "WRONG", None)
    if isinstance(wrong, dict) and wrong:
        return wrong
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "LESSON", None) == lesson and getattr(value, "WRONG", None):
            return value.WRONG
    return {}


def _grade_submission(lesson: str, kind: str, answers: dict[str, str] | None) -> dict[str, Any]:
    """Build one submission (reference, blank release, or the reference with ``answers``) and autograde it."""
    setup_paths()
    from tests.nbgrader_tools import autograde_notebook, build_release, build_source
    from tests.submissions import with_answers

    with tempfile.TemporaryDirectory(prefix=f"gpu-check-grade-{lesson}-") as tmp:
        started = time.perf_counter()
        if kind == "blank":
            notebook = build_release(lesson, Path(tmp) / "release")
        else:
            notebook = build_source(lesson, Path(tmp) / "reference")
            if answers:
                notebook = with_answers(notebook, answers, Path(tmp) / "submission" / f"{lesson}.ipynb")
        built = time.perf_counter()
        scores = autograde_notebook(lesson, notebook)
        graded = time.perf_counter()
    return {
        "scores": {grade_id: list(pair) for grade_id, pair in scores.items()},
        "build_s": round(built - started, 2),
        "grade_s": round(graded - built, 2),
    }


def step_autograde(ctx: StepContext) -> None:
    """Per lesson: reference, blank release and the first WRONG submission, autograded; expected scores checked.

    Grading kernels run only in a sandbox (``autograder/sandbox.py``); an image without bubblewrap (a bare GPU
    server) records the grading as not measured, with the reason, instead of grading unsandboxed.
    """
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    setup_paths()
    if not ctx.requires((*LESSON_MODULES, "nbgrader"), ["autograding in the grading sandbox"]):
        return
    from autograder import sandbox

    reason = sandbox.unavailable_reason()
    if reason:
        ctx.missing("autograding in the grading sandbox", f"no sandbox here: {reason}")
        return
    tasks = []
    for lesson in lesson_names(ctx.settings.grade_all):
        tasks.append((lesson, "reference", None, None, None))
        tasks.append((lesson, "blank", None, None, None))
        wrong = _wrong_submissions(lesson)
        if wrong:
            name, (answers, expected_lost) = next(iter(wrong.items()))
            tasks.append((lesson, "wrong", name, answers, set(expected_lost)))
        else:
            ctx.warn(f"{lesson}: no WRONG submissions found in tests/test_lesson_{lesson.split('_')[0]}.py")
    ctx.details.update(jobs=ctx.jobs, submissions=[])

    def judge(task: tuple, outcome: Any) -> None:
        """One submission's grades, recorded as soon as it is graded (a step stopped at its time keeps them)."""
        lesson, kind, name, _, expected_lost = task
        label = f"{lesson} {kind}" + (f" ({name})" if name else "")
        if isinstance(outcome, Exception):
            ctx.fail(f"{label}: autograding raised {type(outcome).__name__}: {str(outcome)[-500:]}")
            ctx.details["submissions"].append(
                {"lesson": lesson, "submission": kind, "name": name, "error": str(outcome)}
            )
            return
        scores = outcome["scores"]
        lost = {grade_id for grade_id, (score, maximum) in scores.items() if score != maximum}
        total = sum(score or 0 for score, _ in scores.values())
        maximum = sum(points for _, points in scores.values())
        record = {"lesson": lesson, "submission": kind, "name": name, "score": total, "max_score": maximum}
        record.update(lost=sorted(lost), **outcome)
        if kind == "reference" and lost:
            ctx.fail(f"{label}: the reference lost {sorted(lost)}")
        if kind == "blank" and any(score != 0 for score, _ in scores.values()):
            ctx.fail(f"{label}: the blank release scored {total}")
        if kind == "wrong":
            record["expected_lost"] = sorted(expected_lost)
            zeroed = all(scores[grade_id][0] == 0 for grade_id in lost if grade_id in scores)
            record["as_expected"] = lost == expected_lost and zeroed
            if not record["as_expected"]:
                ctx.fail(f"{label}: lost {sorted(lost)}, expected {sorted(expected_lost)} (all at 0: {zeroed})")
        if not scores:
            ctx.fail(f"{label}: no graded cell was scored")
        ctx.details["submissions"].append(record)
        ctx.figure(f"autograde {label}: score", total, f"of {maximum:g} points", grade_s=outcome["grade_s"])
        print(f"{label}: {total:g}/{maximum:g} in {outcome['grade_s']} s, lost {sorted(lost)}", flush=True)

    if ctx.jobs > 1:
        with ProcessPoolExecutor(max_workers=ctx.jobs, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(_grade_submission, lesson, kind, answers) for lesson, kind, _, answers, _ in tasks]
            for task, future in zip(tasks, futures, strict=True):
                try:
                    judge(task, future.result())
                except Exception as error:  # noqa: BLE001
                    judge(task, error)
    else:
        for task in tasks:
            print(f"autograding {task[0]}: {task[1]} ...", flush=True)
            try:
                outcome = _grade_submission(task[0], task[1], task[3])
            except Exception as error:  # noqa: BLE001
                traceback.print_exc()
                outcome = error
            judge(task, outcome)
