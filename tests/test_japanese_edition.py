"""The Japanese edition all the way: what counts as English in its outputs (``tests/english_text.py``, used by
``tests/test_lessons_execute.py`` on every executed Japanese lesson), and the feedback page's fixed headings in the
student's edition."""

from __future__ import annotations

import copy
import os
import re
import shutil

import nbformat
import pytest
from nbconvert import HTMLExporter
from nbgrader.converters import generate_feedback

from autograder.feedback import HEADINGS, TEMPLATE_FILTERS, TEMPLATE_NAME, TEMPLATES
from tests.english_text import (
    english_printed,
    english_sentences,
    gpulab_english_in,
    gpulab_sentences,
    lesson_sentences,
)
from tests.learner_pass import LESSONS, cell_kind
from tests.nbgrader_tools import RELEASE_ROOT


@pytest.mark.parametrize(
    "text",
    [
        "output_device=1        peaks [29.7, 63.5] MiB, device 0 / device 1 0.47",  # code, numbers, units
        "(<class 'gpulab.data_parallel.DataParallel'>, <class 'torch.nn.parallel.data_parallel.DataParallel'>) [0, 1]",
        "仮想デバイス：cpu上に2台（このマシンはCUDA GPUなし、レッスンが使うのは2台）。DataParallelのscatter、replicate",
        "scatter         0.02 MiB",  # PyTorch's names for the stages, as the Japanese edition keeps them
        "PCIe 3.0 x16                  15.75 GB/s: 『PCI-SIG PCIe 3.0 base specification』：1レーンあたり8 GT/s",
        "DataParallel（予測）",
    ],
)
def test_code_numbers_units_names_and_quoted_titles_are_not_english_sentences(text):
    assert english_sentences(text) == []


def test_english_sentences_are_found_in_prose_and_labels():
    assert english_sentences("memory trace (virtual devices on cpu), 19 samples over 1.07 s") == [
        "memory trace virtual devices on cpu",
        "samples over",
    ]
    assert english_sentences("  device 0: peak      36.2 MiB, allocated at end       4.2 MiB") == ["allocated at end"]
    assert english_sentences("Peak memory per device, three ways") == ["Peak memory per device three ways"]
    assert english_sentences("the GIL, a lambda") == ["a lambda"]  # "the" alone: one word is no sentence


def test_gpulabs_english_is_told_from_the_lessons_own_words(monkeypatch):
    from tests import english_text

    assert "allocated at end" in gpulab_sentences()  # a summary's words (as formatted in the catalogue)
    said = "memory trace (virtual devices on cpu), 19 samples over 1.07 s"
    assert gpulab_english_in(said) == ["memory trace virtual devices on cpu"]
    # the lesson printing its own dict key, worded as a sentence of gpulab's is worded, is the lesson's
    known = gpulab_sentences() | {"loss in forward"}
    monkeypatch.setattr(english_text, "gpulab_sentences", lambda: known)
    own = lesson_sentences(['peaks = {"loss in forward": peaks_of(model)}'])
    assert gpulab_english_in("loss in forward        peaks [44.3, 34.2] MiB", own) == []
    assert gpulab_english_in("loss in forward        peaks [44.3, 34.2] MiB") == ["loss in forward"]


def test_a_label_inside_a_lessons_f_string_is_the_lessons_own(monkeypatch):
    """Lesson 03 prints ``f"{'peak of the step':<30}..."``; a sentence of gpulab's ("... mean peak of the other
    devices") that shares words with it does not make the lesson's own label gpulab's English."""
    from tests import english_text

    monkeypatch.setattr(english_text, "gpulab_sentences", lambda: frozenset({"peak of the"}))
    printing = ["print(f\"{'peak of the step':<30}{peak_0 / MIB:>10.1f}\")"]
    said = "peak of the step                    45.1"
    assert english_text.gpulab_english_in(said) == ["peak of the step"]
    assert english_text.gpulab_english_in(said, lesson_sentences(printing)) == []


def _feedback_page(edition: str) -> str:
    """The course's feedback template (as ``autograder/nbgrader_config.py`` sets it up) on a notebook of the edition
    with an answer cell, a graded test cell and a commented answer."""
    answer = nbformat.v4.new_code_cell("def chunk_sizes(batch_size, n_devices):\n    return []")
    answer.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "chunk_sizes", "locked": False}
    test = nbformat.v4.new_code_cell("assert chunk_sizes(10, 3) == [4, 4, 2]")
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "chunk_sizes_sizes", "points": 2}
    test.metadata["nbgrader"]["score"] = 0
    essay = nbformat.v4.new_markdown_cell("My answer")
    essay.metadata["nbgrader"] = {"solution": True, "grade": True, "grade_id": "essay", "points": 1, "score": 1}
    essay.metadata["nbgrader"]["comment"] = "Good"
    notebook = nbformat.v4.new_notebook(cells=[answer, test, essay])
    if edition != "en":
        notebook.metadata["gpulab"] = {"edition": edition}
    formgrader = os.path.join(os.path.dirname(generate_feedback.__file__), "..", "server_extensions", "formgrader")
    exporter = HTMLExporter(
        template_name=TEMPLATE_NAME,
        template_file="page.html.j2",
        extra_template_basedirs=[str(TEMPLATES), os.path.join(formgrader, "templates")],
        extra_template_paths=[os.path.join(formgrader, "static", "node_modules", "bootstrap", "dist", "css")],
        filters=TEMPLATE_FILTERS,
    )  # as autograder/nbgrader_config.py and nbgrader's generate_feedback set it up
    resources = {"nbgrader": {"notebook": "01_splitting", "score": 1, "max_score": 3, "late_penalty": 0.5}}
    page, _ = exporter.from_notebook_node(notebook, resources=resources)
    return page


ENGLISH_HEADINGS = ["Student's answer", "Score", "Test cell", "Grade cell", "Comments:", "(Top)", "Late submission"]


def test_the_feedback_page_says_its_fixed_words_in_the_students_edition():
    english, japanese = _feedback_page("en"), _feedback_page("ja")
    for words in ENGLISH_HEADINGS:
        assert words.replace("'", "&#39;") in english or words in english, words
        assert words not in japanese and words.replace("'", "&#39;") not in japanese, words
    for key in ("answer", "score", "test_cell", "grade_cell", "comments", "top", "late"):
        assert HEADINGS["ja"][key] in japanese, key
    assert "chunk_sizes_sizes" in japanese  # the test cell named by its grade id, in both editions


DIFFERING = [
    ([1, 3], [1, 4]),
    ({"a": 1.0}, {"a": 1}),
    ({"a": 1}, {"b": 1}),
    ({"a": 1, "c": 2}, {"a": 1}),
    ("shape", None),
    ([1], (1,)),
    ([1, 2], [1, 2, 3]),
    ("dtype", None),
    ({"w": "tensor"}, {"w": [0.5]}),
]


@pytest.mark.parametrize("language", ["en", "ja"])
def test_a_self_checks_difference_is_said_in_the_lessons_language(language, monkeypatch):
    """gpulab.check's "where they first differ" ("[1]: 3 instead of 4") has no English in the Japanese edition."""
    import torch
    from gpulab import check, messages

    monkeypatch.setattr(messages, "_chosen", [language])
    pairs = [
        (torch.zeros(2), torch.zeros(3))
        if got == "shape"
        else (torch.zeros(2), torch.zeros(2, dtype=torch.int64))
        if got == "dtype"
        else (got, expected)
        for got, expected in DIFFERING
    ]
    said = [
        check.first_difference(got, expected) or check.first_difference([got], [expected]) for got, expected in pairs
    ]
    assert all(said), said
    english = [sentence for line in said for sentence in english_sentences(line)]
    if language == "ja":
        assert english == [], english
        assert not any("instead" in line for line in said), said
    else:
        assert all("instead of" in line or "key" in line for line in said), said


# ------------------------------------------------------------------ what the Japanese lessons print, all of it
WRONG_QUIZ_ANSWERS = 'quiz_answers = dict.fromkeys(["q1", "q2", "q3", "q4", "q5"], "z")'
# English that an exercise's self-check and visible tests still show in the Japanese edition, by lesson: each text
# as its source writes it, with that file. A sentence found inside one of them is allowed; each must still be seen
# (the test fails when one is gone, so that its entry goes with its fix), and no other English is allowed. None is
# left: an observation's keys and findings are translated where feedback shows them (gpulab.check's _shown_repr).
NOT_YET_TRANSLATED: dict[str, dict[str, str]] = {}


def answered_wrongly(cell) -> str:
    """The source of a release's answer cell answered wrongly: each function's ``raise NotImplementedError()``
    becomes ``return None``; the quiz's, an answer of the wrong form to every question (``WRONG_QUIZ_ANSWERS``)."""
    source = re.sub(r"(?m)^(\s+)raise NotImplementedError\(\)", r"\1return None", cell.source)
    return re.sub(r"(?m)^raise NotImplementedError\(\)", WRONG_QUIZ_ANSWERS, source)


@pytest.mark.parametrize("lesson", LESSONS)
def test_the_japanese_release_prints_no_english_sentence_unanswered_or_answered_wrongly(lesson, tmp_path):
    """Run All on the Japanese edition as a learner opens it (exercises not done: their cells fail and the run goes
    on), then, in the same kernel, every exercise answered wrongly and its self-check and visible tests run again:
    no line the notebook shows holds an English sentence, its own prints, the self-checks' hints and the visible
    tests' assert messages included, but for ``NOT_YET_TRANSLATED``. (The solved lessons are held to the same in
    ``tests/test_lessons_execute.py``, whose Japanese run reads them with ``english_printed`` too.)"""
    from nbclient import NotebookClient

    folder = tmp_path / lesson
    shutil.copytree(RELEASE_ROOT / "ja" / lesson, folder)
    notebook = nbformat.read(folder / f"{lesson}.ipynb", as_version=4)
    client = NotebookClient(
        notebook, timeout=120, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(folder)}}
    )
    wrongly = [nbformat.v4.new_code_cell() for _ in notebook.cells]
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type == "code":
                client.execute_cell(cell, index)
        for index, cell in enumerate(notebook.cells):
            kind = cell_kind(cell) if cell.cell_type == "code" else "text"
            if kind in ("answer", "self-check", "graded"):
                wrongly[index] = copy.deepcopy(cell)
                wrongly[index].source = answered_wrongly(cell) if kind == "answer" else cell.source
                client.execute_cell(wrongly[index], index)
                notebook.cells[index] = cell  # nbclient puts the cell it ran in the notebook: keep Run All's
    pending = NOT_YET_TRANSLATED.get(lesson, {})
    shown = [("", found) for found in english_printed(notebook.cells, folder)]
    shown += [("answered wrongly: ", found) for found in english_printed(wrongly, folder)]
    assert [f"{when}{found}" for when, found in shown if not any(found.sentence in text for text in pending)] == []
    seen = {text for text in pending for _, found in shown if found.sentence in text}
    assert sorted(set(pending) - seen) == [], "translated now: remove from NOT_YET_TRANSLATED"


def test_what_counts_as_english_printed_by_a_lesson(tmp_path):
    """The check above on a made-up notebook: a print of English prose is found, and so is the English of a
    display's HTML (what JupyterLab shows), of a visible test's assert message and of gpulab's own error; a listing
    of the lesson's own code, PyTorch's advice quoted from its docstring, a figure's text/plain, a value's repr
    (``True``, one-word keys) and Python's own error are not."""
    from gpulab import messages
    from torch import nn

    advice = re.search(r"It is recommended.*?node\.", " ".join(nn.DataParallel.__doc__.split())).group(0)
    (tmp_path / "helper.py").write_text("def train(rank):\n    # the same weights on every rank\n", encoding="utf-8")
    cell = nbformat.v4.new_code_cell("...")
    cell.outputs = [
        nbformat.v4.new_output(
            "stream", name="stdout", text="2 ranks returned after 7.6 s\n# the same weights on every rank\n"
        ),
        nbformat.v4.new_output("stream", name="stdout", text=f"{advice}\nCaught ValueError in replica 1 on device 7\n"),
        nbformat.v4.new_output(
            "display_data", data={"image/png": "", "text/plain": "<Figure size 600x340 with 1 Axes>"}
        ),
        nbformat.v4.new_output(
            "display_data",
            data={"text/html": "<style>p {color: red}</style><p>&#x2717; Not yet &mdash; 4 of 6</p>", "text/plain": ""},
        ),
        nbformat.v4.new_output("stream", name="stdout", text="{'rank': 0, 'files': ['checkpoint.pt'], 'same': True}\n"),
        nbformat.v4.new_output("error", ename="NameError", evalue="name 'quiz_answers' is not defined", traceback=[]),
        nbformat.v4.new_output("error", ename="AssertionError", evalue="q2: a letter", traceback=[]),
        nbformat.v4.new_output("error", ename="ValueError", evalue=messages.ENGLISH["gil.no_waits"], traceback=[]),
    ]
    found = [shown.sentence for shown in english_printed([cell], tmp_path)]
    gpulabs = gpulab_english_in(messages.ENGLISH["gil.no_waits"])
    # a line made to look like PyTorch's error is no quote of it
    assert found == ["ranks returned after", "in replica", "on device", "Not yet", "a letter", *gpulabs], found
    assert any("count a thread's waits" in sentence for sentence in gpulabs), gpulabs
