"""Quizzes that teach back, on the learner's side: each lesson's quiz as the notebook sees it, with no answer key.

Each lesson ends with a quiz: the learner sets ``quiz_answers = {"q1": ..., ...}``. gpulab declares each question
in ``gpulab.exercises.quizzes`` (``QUIZZES``) by its form (a letter among ``options``, a number, a text), the
section of the lesson to re-read and a nudge. gpulab is importable in a grading kernel and in the learner's lab, so
nothing here may be, or compute, the answer key, nor a digest of it (a digest of one of 3 to 5 options is the
option, to anyone who tries them):

* in self-study, ``gpulab.check.quiz("01")`` digests the learner's answer with the salt and compares it with the
  ``digest = sha256(lesson, key, salt, canonical right answer)`` (``digest``) of the package of solutions
  (``gpulab_solutions.quiz_digests``), and says, per question, right or not yet, with a hint for a wrong answer
  that points to the section to re-read and never names the right option. Without that package (a class) it only
  says whether each answer can be read;
* the grader decides every verdict in its own process from its own answer key (``autograder/quizzes.py``: the
  right answers and the explanations), never from anything here; the feedback page shows the answer, the verdict
  and the explanation (``autograder/quizzes.py: feedback_line``). A test holds each digest to the grader's key.

What the digest protects, honestly: in self-study the answer key cannot be *read* (no right option, number or
text, and no explanation, is stored or computed); a learner may still *find* an answer by trying, which is the
self-check's point. In a class, nothing the learner can reach says whether an answer is right: the grader's verdict
rests only on the answers the notebook returns, compared with the grader's key, in the grader's process.

Answers are read the same way everywhere (``plain``): a ``str`` (exactly), or a number (``numbers.Integral`` as
``int``, ``numbers.Real`` as ``float``; ``bool`` is no number here); anything else cannot be read. The grader
receives the answers through ``autograder/checks/wire.py``, which keeps exactly these distinctions, and reads them
with the same ``Question.read`` and ``Question.canonical`` before comparing with its key.
"""

from __future__ import annotations

import hashlib
import html
import importlib
import numbers
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpulab import messages

STATUSES = ("right", "wrong", "read", "unreadable", "unanswered")  # read: its form is right, nothing to compare


# --------------------------------------------------------------------------------------------- reading answers
def plain(value: Any) -> str | int | float | None:
    """An answer as the quiz reads it: a ``str`` as it is, an integral number as ``int``, a real one as ``float``;
    ``None`` for anything else (``bool``, containers, tensors, subclasses of ``str``)."""
    try:
        if type(value) is str:
            return value
        if type(value) is bool:
            return None
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            return float(value)
    except Exception:  # noqa: BLE001 - a number that cannot say its value cannot be read
        return None
    return None


def _type_name(value: Any) -> str:
    name = getattr(value, "type_name", None) if type(value).__name__ == "Opaque" else None
    name = name if isinstance(name, str) else type(value).__name__
    return name.rsplit(".", 1)[-1][:40]


def shown(value: Any, limit: int = 60) -> str:
    """The learner's answer, short, for a verdict: ``'b'``, ``4``, or ``a list`` for what cannot be read."""
    readable = plain(value)
    if readable is None:
        return f"<{_type_name(value)}>"
    text = repr(readable)
    return text if len(text) <= limit else text[: limit - 3] + "..."


MAX_NUMBER_CHARACTERS = 100
"""Characters of a number answer written as a text, once spaces, commas and underscores are dropped: at most this
many digits."""
MAX_EXPONENT = 400
"""Largest exponent (either sign) of a number answer written as a text: every float's shortest form (``1e+308``,
``5e-324``) is within it, and the exact fraction it stands for has at most about 500 digits. Checked on the text,
before ``Fraction`` sees it: ``Fraction("1e999999999")`` computes ``10**999999999`` (a cell, or the grader, busy
for as long as it takes) and ``"1e5000"`` makes a fraction too long to write."""
_EXPONENT = re.compile(r"[eE][-+]?(\d+)\Z")


def _fraction(value: str | int | float) -> Fraction | None:
    """A number from an answer: an ``int``, a ``float`` (by its shortest repr: 0.375 is 3/8) or a text such as
    ``"3.5"``, ``"3/8"`` or ``"12,800"``; ``None`` when it is none of these, or a text longer than
    ``MAX_NUMBER_CHARACTERS`` or with an exponent over ``MAX_EXPONENT``. The self-check and the grader read numbers
    with it alike."""
    if isinstance(value, str):
        value = re.sub(r"[\s,_]", "", value)
        if not value or len(value) > MAX_NUMBER_CHARACTERS:
            return None
        exponent = _EXPONENT.search(value)
        if exponent is not None and int(exponent.group(1)) > MAX_EXPONENT:
            return None
    elif isinstance(value, float):
        value = repr(value)
    try:
        return Fraction(value)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


# --------------------------------------------------------------------------------------------- questions
def digest(lesson: str, key: str, salt: str, canonical: str) -> str:
    """The digest of one answer (``Question.canonical``) to question ``key`` of ``lesson``'s quiz."""
    return hashlib.sha256("\n".join(("gpulab-quiz-1", lesson, key, salt, canonical)).encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Question:
    """One quiz question: its key in ``quiz_answers``, the lesson's section that teaches it (its heading, in
    English) and an optional nudge added to the hint (never the answer); no right answer, no digest of it and no
    explanation."""

    key: str
    section: str
    nudge: str = ""

    def read(self, value: Any):
        """The answer in this question's terms, or ``None`` when it has the wrong form (subclasses)."""
        raise NotImplementedError

    def canonical(self, reading) -> str:
        """One text per answer that this question counts as the same (``read``'s result): what is digested."""
        return str(reading)

    def matches(self, lesson: str, reading, salt: str, wanted: str) -> bool:
        """Whether ``reading`` digests, with ``salt``, to ``wanted`` (the right answer's digest)."""
        return digest(lesson, self.key, salt, self.canonical(reading)) == wanted

    def form(self, language: str) -> str:
        """Which form an answer takes ("a number"), in ``language``."""
        return _message(self.form_key, language)

    def reading(self, answers: Any) -> tuple[str, str, Any]:
        """``(status, shown answer, reading)`` of ``answers`` (the learner's ``quiz_answers``, or what the grader
        read of it: a dict): status ``"unanswered"``, ``"unreadable"`` or ``"read"``."""
        if type(answers) is not dict or self.key not in answers:
            return "unanswered", "", None
        value = answers[self.key]
        readable = plain(value)
        reading = None if readable is None else self.read(readable)
        return ("unreadable" if reading is None else "read"), shown(value), reading


@dataclass(frozen=True, kw_only=True)
class Letter(Question):
    """Answered with one of the letters ``options`` (case and surrounding spaces do not matter)."""

    options: str = "abc"

    def read(self, value):
        text = value.strip().lower() if isinstance(value, str) else None
        return text if text is not None and len(text) == 1 and text in self.options else None

    def form(self, language: str) -> str:
        return _message("quiz.form_letter", language, first=self.options[0], last=self.options[-1])


@dataclass(frozen=True, kw_only=True)
class Number(Question):
    """Answered with a number (or a text that is one: ``"3.5"``, ``"3/8"``, ``"12,800"``), right when it
    equals the right number exactly (as fractions: ``0.375`` is ``3/8``)."""

    def read(self, value):
        return _fraction(value)

    def canonical(self, reading) -> str:
        return f"{reading.numerator}/{reading.denominator}"

    form_key = "quiz.form_number"


@dataclass(frozen=True, kw_only=True)
class Text(Question):
    """Answered with a text, compared exactly once spaces and surrounding quotes or backticks are removed."""

    def read(self, value):
        return value.strip().strip("\"'`").strip() if isinstance(value, str) else None

    form_key = "quiz.form_text"


@dataclass(frozen=True)
class Quiz:
    """A lesson's quiz: the assignment it belongs to and its questions, in order."""

    lesson: str
    questions: tuple[Question, ...]

    def question(self, key: str) -> Question:
        for question in self.questions:
            if question.key == key:
                return question
        raise KeyError(f"{self.lesson}'s quiz has no question {key!r}")

    def judge(self, answers: Any, digests: dict[str, tuple[str, str]] | None = None) -> list[Verdict]:
        """The self-check's verdict per question: right or wrong by ``digests`` (``{key: (salt, digest)}``, from
        ``gpulab_solutions``), "read" for an answer of the right form without them (the grader has its own key:
        module docstring)."""
        verdicts = []
        for question in self.questions:
            status, answer, reading = question.reading(answers)
            if status == "read" and digests is not None:
                salt, wanted = digests[question.key]
                status = "right" if question.matches(self.lesson, reading, salt, wanted) else "wrong"
            verdicts.append(Verdict(question.key, status, answer))
        return verdicts

    def text(self, english: str, language: str) -> str:
        """One of this quiz's texts (a section, a nudge) in ``language``, else in English."""
        translations = _declarations().TRANSLATIONS
        return translations.get(language, {}).get(english, english)


@dataclass(frozen=True)
class Verdict:
    """What the quiz found for one question: ``status`` (one of ``STATUSES``) and the answer as shown."""

    key: str
    status: str
    answer: str

    @property
    def right(self) -> bool:
        return self.status == "right"

    def record(self, lesson: str) -> dict:
        """Plain data for the grader's record of the cell (``metadata.autograder.quiz``, ``report.json``)."""
        return {"lesson": lesson, "question": self.key, "status": self.status, "answer": self.answer}


# --------------------------------------------------------------------------------------------- the declarations
def _declarations():
    """``gpulab.exercises.quizzes``, which imports this module's classes: loaded on first use (as ``gpulab.check``
    loads the exercises)."""
    return importlib.import_module("gpulab.exercises.quizzes")


def quizzes() -> dict[str, Quiz]:
    """Every lesson's quiz, by assignment (``"01_splitting"``...)."""
    return {quiz.lesson: quiz for quiz in _declarations().QUIZZES}


def quiz_of(lesson: str) -> Quiz:
    """The quiz of ``lesson``: its assignment name or its number (``"01"``)."""
    found = [quiz for name, quiz in quizzes().items() if name == lesson or name.split("_", 1)[0] == str(lesson)]
    if len(found) != 1:
        raise KeyError(f"no quiz for lesson {lesson!r}; known: {', '.join(sorted(quizzes()))}")
    return found[0]


# --------------------------------------------------------------------------------------------- words
def _message(name: str, language: str, **values: object) -> str:
    """Message ``name`` of ``gpulab.messages`` in ``language`` (English when it has no translation)."""
    template = messages.TRANSLATIONS.get(language, {}).get(name, messages.ENGLISH[name])
    return template.format(**values)


def _join(language: str, *parts: str) -> str:
    """Sentences one after the other: with a space in English, none in Japanese."""
    return ("" if language == "ja" else " ").join(part for part in parts if part)


def _section(quiz: Quiz, question: Question, language: str) -> str:
    return quiz.text(question.section, language)


def hint(quiz: Quiz, question: Question, language: str) -> str:
    """Where to look again for a wrong answer: the section to re-read, and the question's nudge."""
    nudge = quiz.text(question.nudge, language) if question.nudge else ""
    where = _message("quiz.reread", language, section=_section(quiz, question, language))
    return _join(language, where, nudge)


def _line(quiz: Quiz, verdict: Verdict, language: str) -> tuple[str, str, str]:
    """(mark, text, hint) of one question in the notebook's self-check."""
    question = quiz.question(verdict.key)
    if verdict.status == "unanswered":
        return "✗", _message("quiz.unanswered", language, key=verdict.key), ""
    if verdict.status == "unreadable":
        form = question.form(language)
        return "✗", _message("quiz.unreadable", language, key=verdict.key, answer=verdict.answer, form=form), ""
    if verdict.status == "read":
        return "·", _message("quiz.read", language, key=verdict.key, answer=verdict.answer), ""
    if verdict.right:
        return "✓", _message("quiz.right", language, key=verdict.key, answer=verdict.answer), ""
    return "✗", _message("quiz.wrong", language, key=verdict.key, answer=verdict.answer), hint(quiz, question, language)


@dataclass(repr=False)
class QuizReport:
    """The notebook's self-check of a quiz: one line per question; rich text in Jupyter, plain text elsewhere."""

    lesson: str
    lines: list[tuple[str, str, str]]

    @property
    def passed(self) -> bool:
        return all(mark == "✓" for mark, _, _ in self.lines)

    def __str__(self) -> str:
        label = messages.message("check.hint_label")
        parts = []
        for mark, text, tip in self.lines:
            parts.append(f"{mark} {text}" + (f"\n    {label}: {tip}" if tip else ""))
        return "\n".join(parts)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colours = {"✓": "#1b7f3b", "✗": "#b3261e", "·": "#555555"}
        label = html.escape(messages.message("check.hint_label"))
        rows = []
        for mark, text, tip in self.lines:
            colour = colours[mark]
            row = f"<div><b style='color:{colour}'>{mark}</b> {html.escape(text)}"
            if tip:
                row += f"<div style='margin-left:1.5em'><b>{label}:</b> {html.escape(tip)}</div>"
            rows.append(row + "</div>")
        style = "border-left:4px solid #555;padding:4px 10px"
        return f"<div class='gpulab-check' style='{style}'>" + "".join(rows) + "</div>"


def self_check(
    lesson: str, answers: Any, language: str | None = None, digests: dict[str, tuple[str, str]] | None = None
) -> QuizReport:
    """The notebook's self-check of ``answers`` against ``lesson``'s quiz (module docstring): right or wrong by
    ``digests`` (``gpulab.check.quiz_report`` passes them where ``gpulab_solutions`` is installed), the answers'
    form only without them."""
    quiz = quiz_of(lesson)
    language = language or messages.language()
    return QuizReport(quiz.lesson, [_line(quiz, verdict, language) for verdict in quiz.judge(answers, digests)])
