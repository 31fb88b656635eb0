"""Lesson 04 (``04_checkpoints``): the verdicts of its graded test cells, decided in the grader's process.

Every exercise of the lesson is judged by its rules (``gpulab.exercises.checkpoints``, ``rules.enforce``): each
rule's visible inputs (those the learner's cell asserts) and hidden ones drawn under the same rule with
``session.rng``. ``strip_module_prefix``'s reference is PyTorch's own ``consume_prefix_in_state_dict_if_present``,
key by key. ``save_checkpoint`` and ``load_checkpoint`` are rules of files: each call runs in a folder of its own
under the check's folder, the kernel builds the call's models from the plain descriptions the grader sends (the
rules' adapters), the grader plants the checkpoints a loader reads and reads back, from outside the sandbox
(``checks/files.py``: no link followed, capped, ``weights_only=True``), what a saver wrote and the folder's
listing. Every reference is computed here from the same descriptions: the same models' state dicts, eight
uninterrupted training steps for four, a load and four more.
"""

from __future__ import annotations

from autograder.checks import check
from autograder.checks.quiz import register_quiz
from autograder.checks.rules import enforce, statement

# What each graded cell tests, named by feedback when a failure names no rule of its own.
CELL_RULES = {
    "strip_module_prefix_leading": statement("strip_module_prefix", "leading"),
    "strip_module_prefix_only_at_start": statement("strip_module_prefix", "only_at_start"),
    "strip_module_prefix_new_mapping": statement("strip_module_prefix", "new_mapping"),
    "save_checkpoint_contents": statement("save_checkpoint", "contents"),
    "save_checkpoint_unwraps": statement("save_checkpoint", "unwraps"),
    "save_checkpoint_atomic": statement("save_checkpoint", "atomic"),
    "load_checkpoint_models": statement("load_checkpoint", "models"),
    "load_checkpoint_resume": statement("load_checkpoint", "resume"),
    "load_checkpoint_refuses_code": statement("load_checkpoint", "refuses_code"),
}


@check("strip_module_prefix_leading")
def strip_module_prefix_leading(session) -> None:
    enforce(session, "strip_module_prefix", "leading")


@check("strip_module_prefix_only_at_start")
def strip_module_prefix_only_at_start(session) -> None:
    enforce(session, "strip_module_prefix", "only_at_start")


@check("strip_module_prefix_new_mapping")
def strip_module_prefix_new_mapping(session) -> None:
    enforce(session, "strip_module_prefix", "new_mapping")


@check("save_checkpoint_contents")
def save_checkpoint_contents(session) -> None:
    enforce(session, "save_checkpoint", "contents")


@check("save_checkpoint_unwraps")
def save_checkpoint_unwraps(session) -> None:
    enforce(session, "save_checkpoint", "unwraps")


@check("save_checkpoint_atomic")
def save_checkpoint_atomic(session) -> None:
    enforce(session, "save_checkpoint", "atomic")


@check("load_checkpoint_models")
def load_checkpoint_models(session) -> None:
    enforce(session, "load_checkpoint", "models")


@check("load_checkpoint_resume")
def load_checkpoint_resume(session) -> None:
    enforce(session, "load_checkpoint", "resume")


@check("load_checkpoint_refuses_code")
def load_checkpoint_refuses_code(session) -> None:
    enforce(session, "load_checkpoint", "refuses_code")


register_quiz(__name__, "04_checkpoints")  # quiz_q1...: the declaration in gpulab.exercises.quizzes
