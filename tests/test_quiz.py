"""Quizzes that teach back, with the answer key in the grader only:

* nothing a learner's kernel can import (``utils/``) holds a quiz's right answer, a digest of it or its
  explanation: gpulab declares each question by its form, section and nudge (``gpulab.exercises.quizzes``);
  self-study's ``gpulab_solutions`` holds a salted digest of each right answer, the grader the right answers and
  explanations (``autograder/quizzes.py``), and each digest is that key's;
* the notebook's self-check (``gpulab.check.quiz``, from the digests) and the grader's checks
  (``autograder/checks/quiz.py``, from the grader's key, run here through ``LocalSession``: the same wire as a
  kernel's answer) agree on every answer, right, wrong or malformed, for every lesson's quiz; a digest changed in
  the kernel's packages changes no grade;
* a hint for a wrong answer points to a section of the lesson (English and Japanese headings) and never names the
  right option; without ``gpulab_solutions`` (a class) the self-check checks the form only;
* the feedback page's line of a graded quiz cell shows the answer, right or wrong, and the explanation, in the
  student's edition; one lesson-01 notebook graded end to end shows them on the page.
"""

from __future__ import annotations

import ast
import html
import json
import random
import re
import sys
from fractions import Fraction
from pathlib import Path

import gpulab_solutions
import nbformat
import polib
import pytest
from gpulab import check, messages
from gpulab import quiz as quizzes

from autograder import quizzes as key
from autograder.checks import LocalSession, checks_for
from autograder.feedback import summary
from tests.nbgrader_tools import SOURCE_ROOT, build_source

LESSONS = ["01_splitting", "02_gradient_averaging", "03_gpu0_imbalance", "04_checkpoints"]
UTILS = Path(__file__).resolve().parent.parent / "utils"
QUIZ_MODULES = ("gpulab/quiz.py", "gpulab/exercises/quizzes.py", "gpulab/messages.py")


class _Sneaky(str):
    """A str that says it equals anything: no answer, for the notebook as for the grader."""

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


class _Answers(dict):
    """A dict subclass: ``quiz_answers`` must be a plain dict."""


def _source(lesson: str) -> str:
    return (SOURCE_ROOT / lesson / f"{lesson}.py").read_text(encoding="utf-8")


def reference_answers(lesson: str) -> dict:
    """The lesson's own solution: ``quiz_answers`` as its solution cell sets it."""
    cell = re.search(r"### BEGIN SOLUTION\n(quiz_answers = .*?)\n### END SOLUTION", _source(lesson), re.S)[1]
    namespace: dict = {}
    exec(cell, namespace)  # noqa: S102 - the course's own solution
    return namespace["quiz_answers"]


def grader(lesson: str, namespace: dict, tmp_path) -> dict[str, tuple[bool, dict | None]]:
    """``{question: (the graded cell passed, the verdict the check kept for feedback)}``."""
    found = {}
    for grade_id, run in checks_for(lesson).items():
        if not grade_id.startswith("quiz_"):
            continue
        session = LocalSession(namespace, tmp_path, random.Random(0))
        try:
            run(session)
            passed = True
        except Exception as error:  # noqa: BLE001 - CheckFailed, asserted below by type
            assert type(error).__name__ == "CheckFailed", error
            passed = False
        finally:
            session.close()
        found[grade_id.removeprefix("quiz_")] = (passed, (session.feedback or {}).get("quiz"))
    return found


def _forms(question: quizzes.Question, reference) -> dict[str, list]:
    """Answers of each kind for one question: right ones (as learners write them), wrong and malformed ones."""
    malformed = [None, True, [reference], {"answer": reference}, _Sneaky(str(reference)), object()]
    if isinstance(question, quizzes.Letter):
        wrong = [letter for letter in question.options if letter != reference]
        return {
            "right": [reference, reference.upper(), f" {reference} "],
            "wrong": wrong + [w.upper() for w in wrong],
            "malformed": [*malformed, "d", f"({reference})", "", 2],
        }
    if isinstance(question, quizzes.Number):
        value = Fraction(str(reference))
        return {
            "right": [reference, str(reference), float(value), f"{value.numerator}/{value.denominator}"],
            "wrong": [float(value) + 1, str(value + 1), -float(value), 0],
            "malformed": [*malformed, "many", "1/0", float("nan"), "2.25.1"],
        }
    return {
        "right": [reference, f" '{reference}' ", f"`{reference}`"],
        "wrong": [reference.split(".", 1)[-1], reference.upper(), "state_dict"],
        "malformed": [*malformed, 5],
    }


def _cases(lesson: str):
    quiz = quizzes.quiz_of(lesson)
    reference = reference_answers(lesson)
    for question in quiz.questions:
        for kind, answers in _forms(question, reference[question.key]).items():
            for answer in answers:
                yield question, kind, {**reference, question.key: answer}


@pytest.mark.parametrize("lesson", LESSONS)
def test_the_self_check_and_the_grader_agree_on_right_wrong_and_malformed_answers(lesson, tmp_path):
    quiz = quizzes.quiz_of(lesson)
    reference = reference_answers(lesson)
    assert set(reference) == {question.key for question in quiz.questions}
    assert set(checks_for(lesson)) >= {f"quiz_{question.key}" for question in quiz.questions}
    checked = 0
    for question, kind, answers in _cases(lesson):
        graded = grader(lesson, {"quiz_answers": answers}, tmp_path)
        report = check.quiz_report(lesson, answers, "en")
        marks = dict(zip([q.key for q in quiz.questions], [mark for mark, _, _ in report.lines], strict=True))
        digests = gpulab_solutions.quiz_digests(lesson)
        said = {verdict.key: verdict.status for verdict in quiz.judge(answers, digests)}  # the self-check's
        for name, (passed, kept) in graded.items():
            assert kept is not None and kept["status"] == said[name], (name, answers, kept, said)
            assert passed == (said[name] == "right") == (marks[name] == "✓"), (name, answers, passed, said)
        expected = {"right": {"right"}, "wrong": {"wrong"}, "malformed": {"unreadable"}}[kind]
        assert graded[question.key][1]["status"] in expected, (question.key, kind, answers[question.key])
        checked += 1
    assert checked >= 10 * len(quiz.questions)


@pytest.mark.parametrize("lesson", LESSONS)
@pytest.mark.parametrize(
    "answers",
    [None, [1, 2], _Answers(a=1), {}],
    ids=["missing", "a list", "a dict subclass", "empty"],
)
def test_answers_that_are_not_a_dict_of_answers_score_nothing_on_either_side(lesson, answers, tmp_path):
    namespace = {} if answers is None else {"quiz_answers": answers}
    graded = grader(lesson, namespace, tmp_path)
    report = check.quiz_report(lesson, answers, "en")
    assert graded and all(not passed and kept["status"] == "unanswered" for passed, kept in graded.values())
    assert all(mark == "✗" and "quiz_answers[" in text for mark, text, _ in report.lines), str(report)


def _option_texts(lesson: str, key: str) -> dict[str, str]:
    """The options of a letter question as the lesson's text writes them: ``{letter: words}``."""
    source = _source(lesson)
    start = source.index(f"# **{key}.**")
    end = min(i for i in (source.find("# **q", start + 5), source.find("\n# %%", start)) if i != -1)
    text = " ".join(line.lstrip("# ").strip() for line in source[start:end].splitlines())
    parts = re.split(r"\(([a-z])\)", text)
    options = {}
    for letter, words in zip(parts[1::2], parts[2::2], strict=True):
        words = re.sub(r"Answer with a letter\.?", "", words).replace("`", "").strip(" ;.")
        options[letter] = words.lower()
    return options


def _right_forms(lesson: str, question: quizzes.Question) -> list[str]:
    """The right answer of a number or text question as a text would hold it (``102,400,000``, ``9/4``...)."""
    right = key.answer_of(lesson, question.key).right_answer()
    if isinstance(question, quizzes.Number):
        value = Fraction(str(right)) if not isinstance(right, Fraction) else right
        forms = {str(value), f"{value.numerator}/{value.denominator}", str(float(value)).removesuffix(".0")}
        if value.denominator == 1:
            forms |= {f"{value.numerator:,}", f"{value.numerator:_}"}
        return sorted(forms)
    return [str(right)]


@pytest.mark.parametrize("lesson", LESSONS)
@pytest.mark.parametrize("language", ["en", "ja"])
def test_a_hint_points_to_a_section_and_never_names_the_right_option(lesson, language):
    quiz = quizzes.quiz_of(lesson)
    reference = reference_answers(lesson)
    for question in quiz.questions:
        wrong = next(iter(_forms(question, reference[question.key])["wrong"]))
        (mark, text, hint) = check.quiz_report(lesson, {question.key: wrong}, language).lines[
            [q.key for q in quiz.questions].index(question.key)
        ]
        assert mark == "✗" and hint, (question.key, text)
        assert quiz.text(question.section, language) in hint
        explanation = key.explanation(lesson, question.key, language)
        assert explanation not in text + hint
        if isinstance(question, quizzes.Letter):
            right = key.answer_of(lesson, question.key).right_answer()
            assert not re.search(rf"\(\s*{right}\s*\)|\b{right}\)|option {right}\b", hint, re.I), hint
            option = _option_texts(lesson, question.key)[right]
            assert len(option) >= 4 and option not in hint.lower().replace("`", ""), (option, hint)
        for form in [] if isinstance(question, quizzes.Letter) else _right_forms(lesson, question):
            assert not re.search(rf"(?<![\w.]){re.escape(form)}(?![\w.])", hint, re.ASCII), (form, hint)


def _utils_texts() -> dict[str, str]:
    """Every text file under ``utils/``: what a learner's kernel can import or read of the repository. A Python
    file's text is followed by its string constants as Python joins them (``"a" "b"`` over two lines is ``"ab"``)."""
    texts = {}
    for path in sorted(UTILS.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        name = str(path.relative_to(UTILS))
        try:
            texts[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            texts[name] = path.read_bytes().decode("latin-1")
        if path.suffix == ".py":
            constants = [node.value for node in ast.walk(ast.parse(texts[name])) if isinstance(node, ast.Constant)]
            texts[name] += "\n" + "\n".join(value for value in constants if isinstance(value, str))
    return texts


def test_no_file_under_utils_holds_a_right_answer_or_an_explanation():
    """The answer key is the grader's: no file a kernel can read states a right answer in clear."""
    texts = _utils_texts()
    assert "gpulab/exercises/quizzes.py" in texts and "gpulab/quiz.py" in texts
    for lesson in LESSONS:
        quiz = quizzes.quiz_of(lesson)
        for question in quiz.questions:
            # the explanations name the right option: none of them, in either edition
            for language in ("en", "ja"):
                explanation = key.explanation(lesson, question.key, language)
                for name, text in texts.items():
                    assert explanation not in text, (lesson, question.key, language, name)
            # a number or text answer, in any way a text would write it: in every file when it is distinctive
            # (102,400,000, module.head.weight), in gpulab's quiz modules when it is short (2.25, 0.2, 1/5)
            forms = [] if isinstance(question, quizzes.Letter) else _right_forms(lesson, question)
            for form in (f for f in forms if len(f) >= 3):
                pattern = rf"(?<![\w.]){re.escape(form)}(?![\w])"
                for name, text in texts.items():
                    if len(form) >= 5 or name in QUIZ_MODULES:
                        assert not re.search(pattern, text, re.ASCII), (lesson, question.key, form, name)
            # the declaration holds no field that is the right answer, nor a digest of it: its words
            right = key.right_canonical(lesson, question.key)
            for field, value in vars(question).items():
                read = question.read(value) if isinstance(value, str) else None
                assert read is None or question.canonical(read) != right, (lesson, question.key, field)
    # and no quiz module of gpulab declares or computes a right answer
    for name in QUIZ_MODULES[:2]:
        assert not re.search(r"\bright\s*=|def right_answer|explanation\s*=", texts[name]), name


@pytest.mark.parametrize("lesson", LESSONS)
def test_each_digest_of_the_solutions_package_is_the_graders_answer(lesson):
    digests = key.digests()[lesson]
    quiz = quizzes.quiz_of(lesson)
    declared = gpulab_solutions.quiz_digests(lesson)
    assert [answer.key for answer in key.KEY[lesson]] == [question.key for question in quiz.questions]
    assert list(declared) == [question.key for question in quiz.questions]
    salts = [salt for salt, _ in declared.values()]
    assert len(set(salts)) == len(salts) and all(len(salt) >= 32 for salt in salts)
    for question_key, (_, digest) in declared.items():
        assert digest == digests[question_key], (
            f"{lesson} {question_key}: gpulab_solutions' digest is not the grader's answer's; "
            f"python -m autograder.quizzes prints {digests[question_key]}"
        )


def test_a_digest_changed_in_the_kernels_packages_changes_no_grade(monkeypatch, tmp_path):
    """The grader decides from its own key: a kernel whose digests call a wrong answer right (the notebook's
    self-check then says right) still loses the point, and the right answer still scores."""
    lesson = "01_splitting"
    quiz = quizzes.quiz_of(lesson)
    reference = reference_answers(lesson)
    wrong = {"q1": 3, "q2": 2, "q3": "a"}
    forged = {}
    for question in quiz.questions:
        canonical = question.canonical(question.read(wrong[question.key]))
        salt = "0" * 32
        forged[question.key] = (salt, quizzes.digest(lesson, question.key, salt, canonical))
    from gpulab_solutions import quizzes as declared

    monkeypatch.setitem(declared.DIGESTS, lesson, forged)
    assert check.quiz_report(lesson, wrong, "en").passed  # the forged digests fool the self-check
    assert all(not passed for passed, _ in grader(lesson, {"quiz_answers": wrong}, tmp_path).values())
    assert all(passed for passed, _ in grader(lesson, {"quiz_answers": reference}, tmp_path).values())


def _headings_en(lesson: str) -> set[str]:
    return {line.lstrip("# ").strip() for line in _source(lesson).splitlines() if re.match(r"^# #{2,4} ", line)}


def _headings_ja(lesson: str) -> set[str]:
    catalogue = polib.pofile(str(SOURCE_ROOT / lesson / f"{lesson}.ja.po"))
    return {
        line.lstrip("#").strip() for entry in catalogue for line in entry.msgstr.splitlines() if line.startswith("##")
    }


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_section_is_a_heading_of_both_editions_and_every_text_is_translated(lesson):
    quiz = quizzes.quiz_of(lesson)
    for question in quiz.questions:
        assert question.section in _headings_en(lesson), question.section
        assert quiz.text(question.section, "ja") in _headings_ja(lesson), question.section
        japanese = quiz.text(question.nudge, "ja")
        assert japanese != question.nudge and re.search("[\u3040-\u30ff]", japanese), question.nudge
        english, japanese = (key.explanation(lesson, question.key, language) for language in ("en", "ja"))
        assert japanese != english and re.search("[\u3040-\u30ff]", japanese), english


def test_without_the_solutions_package_only_the_form_is_checked(monkeypatch):
    """A class's environment has gpulab alone: the quiz's self-check then says whether each answer can be read,
    never whether it is right."""
    reference = reference_answers("01_splitting")
    right = check.quiz_report("01", reference, "en")
    wrong = check.quiz_report("01", {"q1": 3, "q2": 2, "q3": "a"}, "en")
    assert right.passed and not wrong.passed and any(tip for _, _, tip in wrong.lines)
    monkeypatch.setitem(sys.modules, "gpulab_solutions", None)  # import gpulab_solutions: ImportError
    shown = [check.quiz_report("01", answers, "en") for answers in (reference, {"q1": 3, "q2": 2, "q3": "a"})]
    malformed = check.quiz_report("01", {"q1": [4], "q2": 1, "q3": "b"}, "en")
    for report in shown:
        assert [mark for mark, _, _ in report.lines] == ["·", "·", "·"], str(report)
        assert not any(tip for _, _, tip in report.lines)
        assert " is right." not in str(report) and "not right yet" not in str(report), str(report)
        assert "Re-read" not in str(report) and "chunks of" not in str(report)
    assert [mark for mark, _, _ in malformed.lines] == ["✗", "·", "·"], str(malformed)


def test_the_lessons_cell_reads_the_notebooks_answers(capsys, monkeypatch):
    monkeypatch.delenv(messages.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setattr(messages, "_chosen", [])
    import gpulab

    notebook = {"gpulab": gpulab, "quiz_answers": {"q1": 4, "q2": 2, "q3": "b"}}
    exec('gpulab.check.quiz("01")', notebook)  # noqa: S102 - the lesson's own cell
    said = capsys.readouterr().out
    assert said.startswith("✓ q1: 4 is right.") and "✗ q2: 2 is not right yet." in said, said
    exec('gpulab.check.quiz("01")', {"gpulab": gpulab})  # noqa: S102 - before the learner answers: no error
    assert capsys.readouterr().out.count("no answer yet") == 3


def key_explanation(lesson: str, name: str, language: str) -> str:
    return key.explanation(lesson, name, language)


def _quiz_cell(record: dict):
    cell = nbformat.v4.new_code_cell("assert True")
    cell.metadata["autograder"] = record
    return cell


@pytest.mark.parametrize("language", ["en", "ja"])
def test_the_feedback_line_shows_the_answer_the_verdict_and_the_explanation(language, tmp_path):
    answers = {"q1": "102,400,000", "q2": 3, "q3": ["b"], "q4": "B"}  # right, wrong, unreadable, right; no q5
    graded = grader("03_gpu0_imbalance", {"quiz_answers": answers}, tmp_path)
    said = {}
    for name, (passed, kept) in graded.items():
        record = {"status": "passed" if passed else "failed", "where": None if passed else "hidden"}
        said[name] = summary(_quiz_cell({**record, "feedback": {"quiz": kept}}), language)
        assert key_explanation("03_gpu0_imbalance", name, language) in said[name], said[name]
    phrases = {
        "en": {
            "q1": "✔ q1: your answer '102,400,000' is right.",
            "q2": "✘ q2: your answer 3 is wrong.",
            "q3": "✘ q3: your answer <list> could not be read (the question asks for one letter, a to c).",
            "q4": "✔ q4: your answer 'B' is right.",
            "q5": "✘ q5: no answer was given.",
        },
        "ja": {
            "q1": "✔ q1：あなたの解答'102,400,000'は正解です。",
            "q2": "✘ q2：あなたの解答3は不正解です。",
            "q3": "✘ q3：あなたの解答<list>は読み取れませんでした（a〜cの記号で答える問題です）。",
            "q4": "✔ q4：あなたの解答'B'は正解です。",
            "q5": "✘ q5：解答がありませんでした。",
        },
    }[language]
    for name, phrase in phrases.items():
        assert said[name].startswith(phrase), (said[name], phrase)
    # a record the grader did not write for a declared question falls back to the ordinary lines
    for forged in ({"lesson": "99_none", "question": "q1", "status": "right", "answer": "1"}, "right", None):
        line = summary(_quiz_cell({"status": "failed", "where": "hidden", "feedback": {"quiz": forged}}), language)
        assert line == summary(_quiz_cell({"status": "failed", "where": "hidden"}), language)


@pytest.mark.slow
def test_a_graded_lesson_01_notebook_shows_each_quiz_answer_verdict_and_explanation(tmp_path):
    """One lesson-01 notebook graded by the grading command: the feedback page shows, per quiz question, the
    answer, whether it is right, and the explanation; ``report.json`` keeps the verdicts."""
    from tests.submissions import with_answers
    from tests.test_autograder import run_grade

    lesson = "01_splitting"
    reference = build_source(lesson, tmp_path / "reference")
    submissions = tmp_path / "submissions"
    answers = {"quiz_answers": 'quiz_answers = {"q1": 4, "q2": 2, "q3": ["b"]}'}
    with_answers(reference, answers, submissions / "ada" / lesson / f"{lesson}.ipynb")
    out = tmp_path / "out"
    process = run_grade(submissions, out, "--cell-timeout", "60")
    assert process.returncode == 0, process.stdout + process.stderr
    (result,) = json.loads((out / "report.json").read_text())["results"]
    (notebook,) = result["notebooks"].values()
    assert {g: s for g, (s, _, _) in notebook["cells"].items() if g.startswith("quiz")} == {
        "quiz_q1": 1.0,
        "quiz_q2": 0.0,
        "quiz_q3": 0.0,
    }
    kept = {g: t["feedback"]["quiz"]["status"] for g, t in notebook["report"]["tests"].items() if g.startswith("quiz")}
    assert kept == {"quiz_q1": "right", "quiz_q2": "wrong", "quiz_q3": "unreadable"}
    page = html.unescape((out / "feedback" / "ada" / lesson / f"{lesson}.html").read_text())
    assert "q1: your answer 4 is right. " + key.explanation(lesson, "q1") in page
    assert "q2: your answer 2 is wrong. " + key.explanation(lesson, "q2") in page
    assert "q3: your answer <list> could not be read" in page and key.explanation(lesson, "q3") in page
    # a line wraps instead of scrolling, and no cell shows a prompt of a run the page does not show
    assert "white-space: pre-wrap" in page and "In&nbsp;[" not in page and "In [" not in page


def test_a_feedback_line_shows_no_code_marks():
    cell = nbformat.v4.new_code_cell("")
    rule = {
        "en": "Raise `ValueError` if either argument is below 1",
        "ja": "どちらかの引数が1未満なら`ValueError`を送出します",
    }
    cell.metadata["autograder"] = {"status": "failed", "where": "hidden", "rule": rule}
    for language in ("en", "ja"):
        line = summary(cell, language)
        assert "`" not in line and "ValueError" in line, line


def test_the_learners_self_check_reads_a_number_bomb_as_unreadable_at_once():
    """A number question's answer is read by one function in the self-check and the grader alike
    (``gpulab.quiz._fraction``): a text like ``"1e999999999"`` is refused on its exponent before ``Fraction`` would
    expand it into a billion-digit integer, in the learner's kernel as in the grader."""
    import subprocess
    import sys

    probe = (
        "from gpulab import quiz\n"
        "numbers = [q for q in quiz.quiz_of('01').questions if isinstance(q, quiz.Number)]\n"
        "for bomb in ('1e999999999', '-2.25E-5000', '1e 401', '9' * 101):\n"
        "    assert numbers[0].reading({numbers[0].key: bomb})[0] == 'unreadable', bomb\n"
        "assert numbers[0].reading({numbers[0].key: '1e400'})[0] == 'read'\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
