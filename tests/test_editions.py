"""The Japanese edition, built from the English source and its translation catalogues (``NN_name.ja.po``):

* the edition's release is the English release with its markdown translated: same graded cells, ids, points and
  checksums, same code; its install cell makes gpulab speak Japanese and fetches the edition's files;
* a changed English markdown cell without its translation fails ``--check`` (``make check-lessons``) and the
  build, naming the cell; so does an obsolete entry; ``--refresh-translations`` brings the catalogue in step,
  carrying a changed cell's old translation over as fuzzy;
* a Japanese submission, intact or saved by Colab without its metadata, is recognised, repaired against the
  Japanese release and graded by ``autograder/grade.py`` on the same assignment, with feedback in Japanese (the
  quiz's explanations included).

Catalogues here are the tests' own (``stand_in_catalogue``): nothing depends on how complete the real ones are.
"""

from __future__ import annotations

import copy
import csv
import html
import json
import re
import shutil

import nbformat
import polib
import pytest
from gpulab.messages import placeholders
from gpulab.quiz import quiz_of

from autograder.feedback import summary
from autograder.quizzes import explanation
from autograder.reasons import REASONS, reason
from autograder.repair import edition_of, problems, repair
from tests.nbgrader_tools import (
    SOURCE_ROOT,
    build_release,
    build_source,
    builder,
    stand_in_catalogue,
    write_catalogue,
)
from tests.test_autograder import colab_copy, run_grade, stripped_copy, write

LESSON = "01_splitting"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course of lesson 01 with a complete Japanese catalogue, built: ``(source root, release root)``."""
    root = tmp_path_factory.mktemp("course")
    sources, releases = root / "source", root / "lessons"
    shutil.copytree(SOURCE_ROOT / LESSON, sources / LESSON, ignore=shutil.ignore_patterns("*.ipynb", "*.po"))
    write_catalogue(stand_in_catalogue(LESSON), builder.translation_file(sources / LESSON, "ja"))
    assert builder.main(["--source-root", str(sources), "--release-root", str(releases)]) == 0
    return sources, releases


def _notebooks(releases):
    english = nbformat.read(releases / LESSON / f"{LESSON}.ipynb", as_version=4)
    japanese = nbformat.read(releases / "ja" / LESSON / f"{LESSON}.ipynb", as_version=4)
    return english, japanese


def test_the_japanese_release_is_the_english_one_with_its_prose_translated(course):
    _, releases = course
    english, japanese = _notebooks(releases)
    assert sorted(p.name for p in (releases / "ja" / LESSON).iterdir()) == sorted(
        p.name for p in (releases / LESSON).iterdir()
    )
    assert [c.id for c in japanese.cells] == [c.id for c in english.cells]
    assert [c.metadata.get("nbgrader") for c in japanese.cells] == [c.metadata.get("nbgrader") for c in english.cells]
    assert japanese.metadata["gpulab"] == {"edition": "ja"} and "gpulab" not in english.metadata
    catalogue = stand_in_catalogue(LESSON)
    install = builder.install_cell_source(SOURCE_ROOT / LESSON)
    for en, ja in zip(english.cells, japanese.cells, strict=True):
        if en.cell_type == "markdown":
            assert ja.source == catalogue[en.source]
        elif en.source == install:
            assert 'os.environ["GPULAB_LANGUAGE"] = "ja"' in ja.source
            assert "/main/lessons/ja" in ja.source and ja.source.startswith("# @title gpulabと")
            assert 'os.environ["GPULAB_LANGUAGE"] = "en"' in en.source
        else:
            assert ja.source == en.source  # code, answers, visible tests: one source
    assert all(c.source.strip() for c in japanese.cells if c.cell_type == "markdown")


def test_a_changed_english_cell_without_its_translation_fails_check_naming_the_cell(course, tmp_path, capsys):
    sources, releases = course
    roots = ["--source-root", str(tmp_path / "source"), "--release-root", str(tmp_path / "lessons")]
    shutil.copytree(sources, tmp_path / "source")
    shutil.copytree(releases, tmp_path / "lessons")
    assert builder.main(["--check", *roots]) == 0
    source = tmp_path / "source" / LESSON / f"{LESSON}.py"
    text = source.read_text(encoding="utf-8")
    old_line = "# ## Set-up\n"
    assert text.count(old_line) == 1
    source.write_text(text.replace(old_line, "# ## Setting up\n"), encoding="utf-8")
    cell = next(c for c in builder.markdown_cells(tmp_path / "source" / LESSON) if "## Setting up" in c[1])
    capsys.readouterr()
    assert builder.main(["--check", *roots]) == 1
    said = capsys.readouterr().out
    assert f"{LESSON}: cell {cell[0]} ('## Setting up'): no ja translation of this English text" in said, said
    assert re.search(rf"{LESSON}: .*\.ja\.po: obsolete entry '## Set-up' matches no English cell", said), said
    # the build fails too (after writing the English release), and writes no outdated Japanese
    before = (tmp_path / "lessons" / "ja" / LESSON / f"{LESSON}.ipynb").read_bytes()
    assert builder.main(roots) == 2
    assert (tmp_path / "lessons" / "ja" / LESSON / f"{LESSON}.ipynb").read_bytes() == before

    # the translators' command: the changed cell carries its old translation over, marked fuzzy; still failing
    assert builder.main(["--refresh-translations", *roots[:2]]) == 0
    catalogue = polib.pofile(str(builder.translation_file(tmp_path / "source" / LESSON, "ja")))
    entry = catalogue.find(cell[1])
    assert "fuzzy" in entry.flags and entry.previous_msgid.startswith("## Set-up") and entry.msgstr
    assert entry.comment == f"cell {cell[0]}" and not catalogue.obsolete_entries()
    capsys.readouterr()
    assert builder.main(["--check", *roots]) == 1
    assert f"cell {cell[0]} ('## Setting up'): the ja translation is marked fuzzy" in capsys.readouterr().out
    # reviewed: the build passes again
    entry.flags.remove("fuzzy")
    entry.msgstr = entry.msgstr.replace("テスト用", "レビュー済み")
    catalogue.save()
    assert builder.main(roots) == 0 and builder.main(["--check", *roots]) == 0


def test_refresh_adds_new_cells_empty_and_keeps_translations(tmp_path):
    sources = tmp_path / "source"
    shutil.copytree(SOURCE_ROOT / LESSON, sources / LESSON, ignore=shutil.ignore_patterns("*.ipynb", "*.po"))
    path, counts = builder.refresh_translation(sources / LESSON, "ja")
    cells = builder.markdown_cells(sources / LESSON)
    assert counts == {"kept": 0, "new": len({text for _, text in cells}), "fuzzy": 0, "obsolete": 0}
    first = polib.pofile(str(path))
    assert [e.msgid for e in first] == list(dict.fromkeys(text for _, text in cells)) and not first.translated_entries()
    first[0].msgstr = "# レッスン 01"
    first.save()
    again, counts = builder.refresh_translation(sources / LESSON, "ja")
    assert counts["kept"] == len(first) and polib.pofile(str(again))[0].msgstr == "# レッスン 01"
    problems_left = builder.translation_problems(sources / LESSON, "ja")
    assert len(problems_left) == len(first) - 1 and all("not translated into ja yet" in p for p in problems_left)


def test_a_lesson_without_a_catalogue_fails_in_this_course():
    assert "ja" in builder.course_editions(SOURCE_ROOT)
    missing = [
        p for p in builder.find_lessons() if not builder.translation_file(builder.find_lessons()[p], "ja").exists()
    ]
    for name in missing:
        assert builder.translation_problems(SOURCE_ROOT / name, "ja")[0].startswith(f"{name}: no ja translation")


@pytest.fixture(scope="module")
def japanese_reference(tmp_path_factory):
    return nbformat.read(build_source(LESSON, tmp_path_factory.mktemp("ja-reference"), "ja"), as_version=4)


def _releases(tmp_path):
    english = nbformat.read(build_release(LESSON, tmp_path / "en"), as_version=4)
    japanese = nbformat.read(build_release(LESSON, tmp_path / "ja", "ja"), as_version=4)
    return {"en": english, "ja": japanese}


@pytest.mark.parametrize("saved_by", ["intact", "stripped", "colab"])
def test_a_japanese_submission_is_recognised_and_repaired_against_its_edition(japanese_reference, tmp_path, saved_by):
    releases = _releases(tmp_path)
    submission = {"intact": lambda nb: nb, "stripped": stripped_copy, "colab": colab_copy}[saved_by](japanese_reference)
    assert edition_of(submission, releases) == "ja"
    fixed = repair(submission, releases["ja"], LESSON)
    assert not problems(fixed.notebook, releases["ja"]), fixed.notes
    assert (saved_by == "stripped") == bool(fixed.notes)  # Colab keeps cell metadata, drops the edition
    # an English submission stays English
    english = build_source(LESSON, tmp_path / "en-reference")
    assert edition_of(stripped_copy(nbformat.read(english, as_version=4)), releases) == "en"


def test_feedback_lines_come_in_the_students_edition():
    cell = nbformat.v4.new_code_cell("assert True")
    cell.metadata["autograder"] = {"status": "passed"}
    assert summary(cell) == "✔ The tests in this cell passed."
    assert summary(cell, "ja") == "✔ このセルのテストはすべて通りました。"
    cell.metadata["autograder"] = {"status": "failed", "where": "hidden", "reason": "chunk_sizes(13, 4)"}
    assert summary(cell) == (
        "✘ The grader's tests of this cell failed (run the cell in your notebook to read the visible tests)."
    )
    assert summary(cell, "ja").startswith("✘ このセルの採点テストが失敗しました（") and "chunk_sizes" not in summary(
        cell, "ja"
    )
    time_up = reason("notebook_time", seconds=600)
    cell.metadata["autograder"] = {"status": "not run", "reason": str(time_up), "why": time_up.record()}
    assert summary(cell) == "✘ Not run: the notebook's time limit (600 s) was used up"
    assert summary(cell, "ja") == "✘ 実行されませんでした：ノートブック全体の制限時間（600 秒）を使い切りました"
    memory = reason("in_cell", why=reason("memory", gib="1.5"), cell=12)
    cell.metadata["autograder"] = {"status": "failed", "where": None, "reason": str(memory), "why": memory.record()}
    assert summary(cell) == "✘ A test failed: the memory limit (1.5 GiB) was exceeded in cell 12"
    assert summary(cell, "ja") == "✘ テストが失敗しました：メモリの上限（1.5 GiB）を超えました（セル 12）"
    cell.metadata["autograder"] = {"status": "not run", "reason": "an old record", "why": {"key": "no such reason"}}
    assert summary(cell, "ja") == "✘ 実行されませんでした：an old record"  # a record it cannot read: its English text


def test_every_reason_has_every_language_with_the_same_placeholders():
    for language, templates in REASONS.items():
        assert templates.keys() == REASONS["en"].keys(), language
        for key, template in templates.items():
            assert placeholders(template) == placeholders(REASONS["en"][key]), (language, key)
    untranslated = [
        key for key, text in REASONS["ja"].items() if re.search(r"[a-z]{4,}", re.sub(r"\{\w+\}|os\._exit", "", text))
    ]
    assert not untranslated, untranslated


@pytest.mark.slow
def test_grade_py_grades_both_editions_on_one_assignment(course, japanese_reference, tmp_path):
    """One run of the grading command: an English and a Japanese student (Colab-saved, metadata lost) on the same
    lesson: full marks each, one row each in grades.csv, Japanese feedback for the Japanese student. The grading
    folder is deep: the kernels' Unix sockets must not be placed in it."""
    sources, _ = course
    english = nbformat.read(build_source(LESSON, tmp_path / "references"), as_version=4)
    submissions = tmp_path / "submissions"
    out = tmp_path / "a grading folder named as instructors name them, for the class of 2026-27" / "out"
    assert len(str(out / ".scratch" / "kernel-12345678" / "ipc" / "kernel-ipc-4")) > 108  # deeper than a socket path
    write(english, submissions / "alice" / LESSON / f"{LESSON}.ipynb")
    write(colab_copy(japanese_reference), submissions / "kenji" / LESSON / f"Copy of {LESSON}.ipynb")
    # a Japanese student whose device_of_sample is wrong only for fewer samples than devices (no visible input
    # has such a batch): feedback names the failed case in Japanese
    wrong = copy.deepcopy(japanese_reference)
    (answer,) = [c for c in wrong.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "device_of_sample_answer"]
    answer.source = (
        "def device_of_sample(index, batch_size, n_devices):\n"
        "    if not 0 <= index < batch_size:\n"
        "        raise IndexError(index)\n"
        "    if batch_size < n_devices:\n"
        "        return 0\n"
        "    return index // -(-batch_size // n_devices)\n"
    )
    write(wrong, submissions / "hana" / LESSON / f"{LESSON}.ipynb")
    process = run_grade(submissions, out, "--source-root", str(sources), "--cell-timeout", "30")
    assert process.returncode == 0, process.stdout + process.stderr
    report = json.loads((out / "report.json").read_text())
    results = {r["task"]["student"]: r for r in report["results"]}
    assert results["kenji"]["editions"] == {f"{LESSON}.ipynb": "ja"}
    assert results["alice"]["editions"] == {f"{LESSON}.ipynb": "en"}
    for student in ("alice", "kenji"):
        assert results[student]["score"] == results[student]["max_score"] > 0, results[student]
    assert results["hana"]["editions"] == {f"{LESSON}.ipynb": "ja"}
    assert 0 < results["hana"]["score"] < results["hana"]["max_score"], results["hana"]
    with (out / "grades.csv").open() as file:
        rows = sorted((r["assignment"], r["student_id"], r["score"], r["max_score"]) for r in csv.DictReader(file))
    maximum = str(results["alice"]["max_score"])
    assert [row[:2] for row in rows] == [(LESSON, "alice"), (LESSON, "hana"), (LESSON, "kenji")], rows
    full = [row for row in rows if row[1] != "hana"]
    assert {float(row[2]) for row in full} == {float(row[3]) for row in full} == {float(maximum)}, rows
    feedback = {s: (out / "feedback" / s / LESSON / f"{LESSON}.html").read_text() for s in ("alice", "kenji", "hana")}
    # the case that failed, from the grader's record, in the student's edition; not the call the grader drew
    assert (
        "次の点で失敗しました：デバイスよりサンプルが少ない場合：チャンクを受け取るのは一部のデバイスだけです"
        in feedback["hana"]
    )
    assert "fewer samples than devices" not in feedback["hana"] and "device_of_sample(1, 2, 3)" not in feedback["hana"]
    assert "次の点で失敗しました" not in feedback["kenji"]
    assert (
        "このセルのテストはすべて通りました" in feedback["kenji"]
        and "The tests in this cell passed" not in feedback["kenji"]
    )
    assert "The tests in this cell passed" in feedback["alice"] and "このセルのテスト" not in feedback["alice"]
    # each quiz cell: the answer, right, and the explanation (the grader's key), in the student's edition
    pages = {student: html.unescape(page) for student, page in feedback.items()}
    for question in quiz_of(LESSON).questions:
        english, japanese = explanation(LESSON, question.key, "en"), explanation(LESSON, question.key, "ja")
        assert f"✔ {question.key}: your answer " in pages["alice"] and english in pages["alice"]
        assert f"✔ {question.key}：あなたの解答" in pages["kenji"] and japanese in pages["kenji"]
        assert english not in pages["kenji"]
