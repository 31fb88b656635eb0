"""The graded quiz cells of every lesson (``quiz_q1``, ``quiz_q2``...), decided from the grader's answer key.

A lesson's check module calls ``register_quiz(__name__, "<assignment>")``: one check per question of the grader's
key (``autograder/quizzes.py``), which reads the notebook's ``quiz_answers`` back from the kernel
(``quiz_answer_values``: exact types through ``wire.py``) and judges it in the grader's process against that key
(``autograder.quizzes.judge``). Nothing the kernel holds takes part in the verdict: not gpulab's digests, not a
verdict the notebook's self-check printed. The verdict (the answer as shown, right or not) is kept for the feedback
page (``Session.feedback``), which adds the explanation from the same key in the student's edition.
"""

from __future__ import annotations

from autograder import quizzes
from autograder.checks import CheckFailed, check


def quiz_answer_values(notebook, workdir, questions):
    """Probe: ``["missing"]``, ``["not a dict"]`` or ``["found", {question: answer}]`` for the questions that
    ``quiz_answers`` holds (an exact ``dict``; its own methods are not called)."""
    if "quiz_answers" not in notebook:
        return ["missing"]
    answers = notebook["quiz_answers"]
    if type(answers) is not dict:
        return ["not a dict"]
    return ["found", {q: dict.__getitem__(answers, q) for q in questions if dict.__contains__(answers, q)}]


def _answers(found) -> dict | None:
    """What the grader read of ``quiz_answers``: a dict of the answers, or ``None`` (missing, not a dict)."""
    if type(found) is list and len(found) == 2 and found[0] == "found" and type(found[1]) is dict:
        return found[1]
    return None


def quiz_check(lesson: str, key: str, keys: list[str]):
    """The check of graded cell ``quiz_<key>``: passes when the grader's key says the answer is right."""

    def run(session) -> None:
        found = session.run(quiz_answer_values, questions=keys)
        verdict = quizzes.judge(lesson, key, _answers(found))
        session.feedback = {"quiz": verdict.record(lesson)}
        if not verdict.right:
            set_answers = ", ".join(f'"{k}": ...' for k in keys)
            if verdict.status == "unanswered":
                raise CheckFailed(f"{key}: no answer; set quiz_answers = {{{set_answers}}}")
            if verdict.status == "unreadable":
                form = quizzes.forms.quiz_of(lesson).question(key).form("en")
                raise CheckFailed(f"{key}: {verdict.answer} cannot be read: answer with {form}")
            raise CheckFailed(f"{key}: {verdict.answer} is wrong. {quizzes.explanation(lesson, key)}")

    run.__name__ = run.__qualname__ = f"quiz_{key}"
    return run


def register_quiz(module: str, lesson: str) -> None:
    """Register the checks of ``lesson``'s quiz (the grader's key) as checks of the check module ``module``."""
    keys = [answer.key for answer in quizzes.KEY[lesson]]
    for key in keys:
        function = quiz_check(lesson, key, keys)
        function.__module__ = module
        check(f"quiz_{key}")(function)
