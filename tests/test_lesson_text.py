"""Each lesson reads as a learner needs it: its time and what a red cell means stated at the top, a core path of
at most ~1,500 words of prose in short markdown cells, and the optional material in "Going further" sections
after the core path and its quiz. Lessons in ``tests/learner_pass.py: NOT_YET_EDITED`` are expected to fail."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from tests.learner_pass import (
    AFTER_THE_QUIZ,
    CORE_PROSE_WORDS,
    DEMO_CELL_MINUTES,
    EXERCISE_MINUTES,
    GOING_FURTHER,
    LESSONS,
    MARKDOWN_CELL_WORDS,
    QUIZ_ANSWERS,
    READING_WORDS_PER_MINUTE,
    RED_CELL,
    TIME_AT_THE_TOP,
    TIME_AT_THE_TOP_JA,
    core_path,
    core_path_minutes,
    is_self_check,
    lesson_params,
    prose_words,
    release_notebook,
    sections,
    source_cells,
)
from tests.nbgrader_tools import RELEASE_ROOT


@pytest.mark.parametrize("lesson", lesson_params())
def test_the_top_states_the_time_and_what_a_red_cell_means(lesson):
    introduction = "\n".join(cell.source for cell in sections(source_cells(lesson))[0][1])
    assert TIME_AT_THE_TOP.search(introduction), f"{lesson}: say how long the core path takes ('about 40 minutes')"
    assert RED_CELL.search(introduction), f"{lesson}: say once, at the top, what a red (failing) cell means"


@pytest.mark.parametrize("lesson", lesson_params())
def test_core_path_prose_is_short(lesson):
    markdown = [cell for cell in core_path(source_cells(lesson)) if cell.cell_type == "markdown"]
    words = sum(prose_words(cell.source) for cell in markdown)
    assert words <= CORE_PROSE_WORDS, f"{lesson}: {words} words of prose on the core path (at most {CORE_PROSE_WORDS})"
    long_cells = [
        f"{prose_words(cell.source)} words: {cell.source[:60]!r}"
        for cell in markdown
        if prose_words(cell.source) > MARKDOWN_CELL_WORDS
    ]
    assert not long_cells, f"{lesson}: markdown cells over {MARKDOWN_CELL_WORDS} words: {long_cells}"


@pytest.mark.parametrize("lesson", lesson_params())
def test_going_further_sections_follow_the_core_path_and_its_quiz(lesson):
    cells = source_cells(lesson)
    headings = [heading for heading, _ in sections(cells)]
    assert any(heading.startswith(GOING_FURTHER) for heading in headings), f"{lesson}: no '{GOING_FURTHER}' section"
    quiz = next(
        index
        for index, (_, part) in enumerate(sections(cells))
        if any(QUIZ_ANSWERS in str(cell.metadata.get("nbgrader", {}).get("grade_id", "")) for cell in part)
    )
    before = [heading for heading in headings[:quiz] if heading.startswith(GOING_FURTHER)]
    assert not before, f"{lesson}: '{GOING_FURTHER}' sections before the quiz: {before}"
    after = [heading for heading in headings[quiz + 1 :] if not heading.startswith(AFTER_THE_QUIZ)]
    assert not after, f"{lesson}: after the quiz only {AFTER_THE_QUIZ} sections, not {after}"
    graded_later = [
        cell.metadata["nbgrader"]["grade_id"]
        for heading, part in sections(cells)
        if heading.startswith(GOING_FURTHER)
        for cell in part
        if cell.metadata.get("nbgrader", {}).get("grade")
    ]
    assert not graded_later, f"{lesson}: a skippable section holds graded cells {graded_later}"


def test_the_word_count_skips_code_and_maths():
    assert prose_words("## Two words\n```python\nnot = counted\n```\n$$ L = \\sum_k x $$") == 2
    assert re.search(TIME_AT_THE_TOP, "The core path takes about 25 minutes.")


@pytest.mark.parametrize("lesson", lesson_params())
def test_the_stated_time_is_the_core_paths_words_cells_and_exercises_by_the_rule(lesson):
    """Each edition's release says at its top the time the rule gives for its core path (issue: lesson 03 said
    "about 25 minutes" for 1,422 words and five exercises)."""
    english = nbformat.read(release_notebook(lesson, RELEASE_ROOT), as_version=4).cells
    japanese = nbformat.read(release_notebook(lesson, RELEASE_ROOT / "ja"), as_version=4).cells
    minutes = core_path_minutes(english)
    stated = TIME_AT_THE_TOP.search(sections(english)[0][1][0].source)
    stated_ja = TIME_AT_THE_TOP_JA.search(sections(japanese)[0][1][0].source)
    assert stated and int(stated.group(1)) == minutes, f"{lesson}: the rule gives about {minutes} minutes"
    assert stated_ja and int(stated_ja.group(1)) == minutes, f"{lesson} (ja): the rule gives 約{minutes}分"


def test_the_readmes_give_the_range_of_the_lessons_times():
    times = [
        core_path_minutes(nbformat.read(release_notebook(lesson, RELEASE_ROOT), as_version=4).cells)
        for lesson in LESSONS
    ]
    repository = Path(__file__).resolve().parents[1]
    english = (repository / "README.md").read_text(encoding="utf-8")
    japanese = (repository / "README.ja.md").read_text(encoding="utf-8")
    said = re.search(r"(\d+) to (\d+) minutes to the quiz", english)
    said_ja = re.search(r"確認テストまで(\d+)〜(\d+)分", japanese)
    expected = (min(times), max(times))
    assert said and tuple(map(int, said.groups())) == expected, f"README.md: say {expected[0]} to {expected[1]}"
    assert said_ja and tuple(map(int, said_ja.groups())) == expected, f"README.ja.md: {expected[0]}〜{expected[1]}分"
    rule = (repository / "docs" / "architecture.md").read_text(encoding="utf-8")
    for part in (f"{READING_WORDS_PER_MINUTE} words", f"{DEMO_CELL_MINUTES:g} minute", f"{EXERCISE_MINUTES} minutes"):
        assert part in rule, f"docs/architecture.md states the rule the tests apply: {part!r}"


MARKDOWN_IN_A_COMMENT = re.compile(r"^# {1,3}#{1,6} ", re.MULTILINE)


@pytest.mark.parametrize("lesson", lesson_params())
def test_no_story_is_left_in_a_code_cell(lesson):
    # A missing "# %% [markdown]" line turns the story after it into comments of the code cell above: the learner
    # reads a heading as code, and a translation never sees it.
    stray = [
        cell.source.splitlines()[0]
        for cell in source_cells(lesson)
        if cell.cell_type == "code" and MARKDOWN_IN_A_COMMENT.search(cell.source)
    ]
    assert not stray, f"{lesson}: markdown headings inside code cells (a missing '# %% [markdown]'): {stray}"


@pytest.mark.parametrize("edition_root", [RELEASE_ROOT, RELEASE_ROOT / "ja"], ids=["en", "ja"])
def test_the_first_self_check_says_where_hints_and_solutions_are(edition_root):
    """Where the learner first meets a self-check (lesson 01), the text says once that ``gpulab.check.hint`` and
    ``gpulab.check.solution`` exist, in both editions."""
    cells = nbformat.read(edition_root / "01_splitting" / "01_splitting.ipynb", as_version=4).cells
    first = next(index for index, cell in enumerate(cells) if is_self_check(cell))
    before = next(cell for cell in reversed(cells[:first]) if cell.cell_type == "markdown")
    markdown = "\n".join(cell.source for cell in cells if cell.cell_type == "markdown")
    for call in ("gpulab.check.hint(", "gpulab.check.solution("):
        assert call in before.source, f"say where {call}...) is, just before the first self-check"
        assert markdown.count(call) == 1, f"{call}...) is mentioned {markdown.count(call)} times"


def _lesson_texts(lesson: str) -> tuple[str, str]:
    """A lesson's English source and its Japanese catalogue, as text."""
    folder = Path(__file__).resolve().parents[1] / "source" / lesson
    return (folder / f"{lesson}.py").read_text(encoding="utf-8"), (folder / f"{lesson}.ja.po").read_text(
        encoding="utf-8"
    )


def test_syncbatchnorm_is_said_not_to_run_on_the_cpu_not_to_run_on_gpus_only():
    """PyTorch's SyncBatchNorm accepts CUDA, HPU, XPU and custom-device tensors (torch/nn/modules/batchnorm.py):
    more than GPUs. Both editions say what it refuses, the CPU."""
    import inspect

    from torch import nn

    accepted = inspect.getsource(nn.SyncBatchNorm.forward)
    assert all(f'"{device}"' in accepted for device in ("cuda", "hpu", "xpu"))
    english, japanese = _lesson_texts("02_gradient_averaging")
    assert "runs on GPUs only" not in english and "itself does not run on the CPU" in english
    assert "GPU上でしか動きません" not in japanese and "自体はCPU上では動きません" in japanese


def test_the_scalar_gather_warning_is_said_to_show_once_per_code_location_as_python_shows_it():
    """DataParallel warns whenever replicas return scalars, and Python's default filter shows a warning once per
    code location: a loop of steps shows it once. Both editions say so, not "at every step"."""
    import warnings

    import gpulab
    import torch
    from torch import nn

    class ReturnsScalar(nn.Module):
        def forward(self, x):
            return x.sum()

    parallel = gpulab.DataParallel(ReturnsScalar(), device_ids=gpulab.devices(2, quiet=True, remember=False))
    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()
        warnings.simplefilter("default")  # Python's default action for a UserWarning
        for _step in range(3):
            parallel(torch.ones(6, 2))
    assert len(shown) == 1 and "scalars" in str(shown[0].message)
    english, japanese = _lesson_texts("03_gpu0_imbalance")
    assert "warns at every step" not in english and "warns, once per code location" in english
    assert "ステップのたびに警告" not in japanese and "コード上の同じ場所につき1回" in japanese
