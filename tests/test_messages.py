"""gpulab speaks the lesson's language: the catalogue (``gpulab.messages``) is complete and consistent, the edition
chooses the language, English is the fallback, and Japanese plots draw every glyph with a Japanese font."""

from __future__ import annotations

import re
import string
import warnings
from pathlib import Path

import gpulab_solutions
import pytest
from gpulab import check, messages
from gpulab.check import _registry
from gpulab.devices import choose


@pytest.fixture
def japanese(monkeypatch):
    monkeypatch.setenv(messages.ENVIRONMENT_VARIABLE, "ja")
    monkeypatch.setattr(messages, "_chosen", [])
    yield
    messages._chosen.clear()


@pytest.fixture
def english(monkeypatch):
    monkeypatch.delenv(messages.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setattr(messages, "_chosen", [])


def test_every_translated_key_exists_in_english_with_the_same_placeholders():
    for language, catalogue in messages.TRANSLATIONS.items():
        assert language in messages.LANGUAGES
        unknown = sorted(set(catalogue) - set(messages.ENGLISH))
        assert not unknown, f"{language}: keys with no English message: {unknown}"
        for key, template in catalogue.items():
            assert messages.placeholders(template) == messages.placeholders(messages.ENGLISH[key]), key


def test_the_japanese_catalogue_is_complete_and_japanese():
    missing = sorted(set(messages.ENGLISH) - set(messages.JAPANESE))
    assert not missing, f"English messages with no Japanese translation: {missing}"
    kana_or_kanji = [key for key, text in messages.JAPANESE.items() if any("\u3040" <= c <= "\u9fff" for c in text)]
    untranslated = sorted(set(messages.JAPANESE) - set(kana_or_kanji) - {"plots.mib", "plots.gpus"})  # the same words
    assert not untranslated, f"Japanese messages with no Japanese in them: {untranslated}"


def _exercise_texts() -> set[str]:
    found = set()
    for exercise in _registry().values():
        found |= {exercise.general_hint, *(hint.text for hint in exercise.hints), *exercise.shown_words}
        found |= {case.why for case in [*exercise.visible_cases(), *exercise.extra_cases()]}
        found |= {text for rule in exercise.rules for text in (rule.statement, *rule.case_names)}
    return {text for text in found if text}


def test_every_translated_exercise_text_is_an_english_text_of_an_exercise():
    texts = _exercise_texts()
    for language, catalogue in messages.TEXTS.items():
        stale = sorted(english[:60] for english in catalogue if english not in texts)
        assert not stale, f"{language}: translated texts that no exercise has (changed in English?): {stale}"


def test_every_exercise_text_has_a_japanese_translation():
    missing = sorted(english[:60] for english in _exercise_texts() if english not in messages.TEXTS.get("ja", {}))
    assert not missing, f"exercise texts with no Japanese translation (TRANSLATIONS in gpulab.exercises): {missing}"


def test_english_is_the_default_and_the_contract(english):
    assert messages.language() == "en"
    reason = choose(2, 0).reason
    assert reason.startswith("Virtual devices: 2 on cpu (this machine has no CUDA GPU, the lesson asks for 2).")
    assert str(check.run("chunk_sizes", lambda b, n: [])).startswith("✗ chunk_sizes: chunk_sizes(")


def test_the_edition_chooses_japanese(japanese):
    assert messages.language() == "ja"
    assert choose(2, 0).reason.startswith("仮想デバイス：cpu上に2台（このマシンはCUDA GPUなし、")
    assert choose(2, 1, gpu_names=["G"]).reason.startswith("仮想デバイス：cuda:0上に2台（このマシンはCUDA GPUが1台、")
    assert "実際のGPU" in choose(2, 4, gpu_names=["G"] * 4).reason

    def not_written(batch_size, n_devices):
        raise NotImplementedError()

    result = check.run("chunk_sizes", not_written)
    assert "まだ書かれていません" in str(result) and "✗ まだです" in result._repr_html_()
    namespace = {}
    exec(gpulab_solutions.solution_of("chunk_sizes"), namespace)  # the reference solution a learner may ask for
    correct = check.run("chunk_sizes", namespace["chunk_sizes"])
    assert correct.passed and str(correct).startswith("✓ chunk_sizes: 正解です："), str(correct)
    assert "✓ 正解" in correct._repr_html_()

    def balanced(batch_size, n_devices):  # torch.tensor_split's sizes: a typical mistake, with its own hint
        if batch_size < 1 or n_devices < 1:
            raise ValueError("empty")
        sizes = [batch_size // n_devices + (i < batch_size % n_devices) for i in range(n_devices)]
        return [size for size in sizes if size]

    wrong = check.run("chunk_sizes", balanced)
    assert "最初の例：" not in str(wrong) and "それは均等な分割" in wrong.hint, str(wrong)
    assert "期待される値は" in wrong.detail, wrong.detail


def test_a_message_with_no_translation_falls_back_to_english(japanese, monkeypatch):
    monkeypatch.setitem(messages.TRANSLATIONS, "ja", {})
    assert messages.message("check.correct", count=3) == "Correct: 3 cases pass."
    assert messages.text("an English hint nobody translated") == "an English hint nobody translated"


def test_language_switches_and_refuses_an_unknown_one(english):
    assert messages.language("ja") == "ja" and messages.message("plots.peak") == "ピーク"
    assert messages.language("en") == "en" and messages.message("plots.peak") == "peak"
    with pytest.raises(ValueError, match="not 'fr'"):
        messages.language("fr")
    messages._chosen.clear()


def test_japanese_plots_draw_every_glyph_with_a_japanese_font(japanese):
    import matplotlib
    from gpulab import diagrams, plots

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Glyph ... missing from font(s)" is a UserWarning
        figures = [
            plots.plot_peaks(
                {"出力を集約": [3 * 2**20, 2**20], "損失をフォワード内で計算": [2**20, 2**20]}, display=False
            ),
            diagrams.data_parallel_overview([3, 3, 2], display=False),
            diagrams.sample_grid([[0, 1], [2, 3]], 4, display=False),
        ]
        for figure in figures:
            plots.figure_png(figure)
    assert matplotlib.rcParams["font.family"][0] == messages.FONT
    titles = [text.get_text() for figure in figures for axes in figure.axes for text in [axes.title]]
    assert "デバイスごとのピークメモリ" in titles
    fonts = {text.get_fontname() for figure in figures for axes in figure.axes for text in [axes.title]}
    assert fonts == {messages.FONT}


def test_the_errors_a_learner_meets_launching_ranks_come_in_japanese(japanese):
    from gpulab import ddp

    with pytest.raises(ddp.NotImportableError) as caught:
        ddp._check_importable(lambda rank, world_size: None)
    said = str(caught.value)
    assert said.startswith("gpulab.ddp.launchはfnを新しいPythonプロセスで実行し")
    assert "lambdaには、新しいプロセスがインポートに使える名前がありません" in said
    assert "    from ddp_steps import train\n    gpulab.ddp.launch(train, 2)" in said  # the fix's code stays code


def test_a_lessons_own_label_comes_in_japanese_with_its_values(japanese):
    assert messages.text("optimizer step") == "オプティマイザのステップ"
    assert messages.text("step 12") == "ステップ12"  # f"step {step}" in the lesson
    assert messages.text("DDP rank 1: its own device's memory") == "DDPのランク1：自分のデバイスのメモリ"
    assert messages.text("a label no lesson has") == "a label no lesson has"
    # lesson 03's capacity: the DDP line is not taken for a "{name}: fits" line with an English name
    assert messages.text("DDP, each rank within 64 MiB (the launch above): fits, peaks [3.0, 3.0] MiB") == (
        "DDP（上の起動）：各ランクが64 MiB以内に収まりました。ピーク[3.0, 3.0] MiB"
    )
    name = messages.text("loss outside forward")
    assert messages.text(f"{name}: fits, peaks [1.0] MiB") == f"{name}：収まりました。ピーク[1.0] MiB"
    assert name == "損失をフォワードの外で計算"
    # lesson 03's buckets per step: not taken for a "step {step}" label
    assert messages.text("step 1: 2 bucket(s), 4.97 MiB in all: [5200000, 8448] bytes") == (
        "ステップ1：バケット2個、合計4.97 MiB：[5200000, 8448]バイト"
    )


def test_every_label_is_a_text_of_a_lesson_or_of_gpulab_scaling():
    """``messages.LABELS`` holds only texts a lesson's code writes (as a string or an f-string) or the sources of
    ``gpulab.scaling``'s figures and published measurements: a label changed in English without its translation
    fails here."""
    from gpulab import scaling

    root = Path(__file__).resolve().parents[1] / "source"
    code = "\n".join(path.read_text(encoding="utf-8") for path in root.glob("*/*.py"))
    sources = {text for link in scaling.INTERCONNECTS.values() for text in (link.source, *link.gpu_sources)}
    for study in scaling.PUBLISHED:  # what gpulab.scaling.published_table prints of them (a way's name: two words)
        sources |= {study.source, study.hardware, study.workload, *(way for way in study.seconds if " " in way)}
    for study in scaling.PUBLISHED_SCALING:  # what gpulab.scaling.comparison_table prints of them
        sources |= {study.source, study.hardware, study.workload, study.includes}
    sources.add(scaling.host_costs().source)  # lesson 03 prints where the host's costs come from
    for language, labels in messages.LABELS.items():
        for english, translated in labels.items():
            assert messages.placeholders(english) == messages.placeholders(translated), (language, english)
            pattern = "".join(
                re.escape(literal) + (r"\{[^}]*\}" if field is not None else "")
                for literal, field, _, _ in string.Formatter().parse(english)
            )
            assert english in sources or re.search(f"[\"']{pattern}[\"']", code), (
                f"{language}: no lesson writes {english!r}"
            )
    assert sources <= set(messages.LABELS["ja"]), sorted(sources - set(messages.LABELS["ja"]))
