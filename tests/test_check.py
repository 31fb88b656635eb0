"""gpulab.check: a pass for right answers, a targeted hint for typical mistakes, solutions only on request."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import gpulab_solutions
import pytest
import torch
from gpulab import check

REPO = Path(__file__).resolve().parents[1]


def _chunk_sizes(batch_size, n_devices):
    if batch_size < 1 or n_devices < 1:
        raise ValueError("bad")
    per = -(-batch_size // n_devices)
    return [min(per, batch_size - start) for start in range(0, batch_size, per)]


def test_right_answer_passes_all_cases():
    result = check.run("chunk_sizes", _chunk_sizes)
    assert result.passed and "Correct" in str(result)


@pytest.mark.parametrize(
    ("wrong", "hint_words"),
    [
        (
            lambda b, n: [len(p) for p in torch.arange(b).tensor_split(n) if len(p)] if b > 0 < n else 1 / 0,
            "tensor_split",
        ),
        (lambda b, n: [len(p) for p in torch.arange(b).chunk(n)] + [0] * (n - len(torch.arange(b).chunk(n))), "empty"),
        (lambda b, n: [len(p) for p in torch.arange(max(b, 1)).chunk(max(n, 1))], "ValueError"),
        # 10 over 3 -> [3, 3, 3]: not a balanced split (that is [4, 3, 3]) but a lost sample
        (lambda b, n: _chunk_sizes(b, n) if b % n == 0 else [b // n] * n, "lost"),
        (lambda b, n: _chunk_sizes(b, n) if b % n == 0 else [-(-b // n)] * n, "counted twice"),
        (
            lambda b, n: _chunk_sizes(b, n) if b % n == 0 else [len(p) for p in torch.arange(b).tensor_split(n)],
            "balanced",
        ),
    ],
)
def test_typical_mistakes_get_their_targeted_hint(wrong, hint_words):
    result = check.run("chunk_sizes", wrong)
    assert not result.passed
    assert hint_words in result.hint, result


def test_the_balanced_split_hint_never_meets_a_wrong_total():
    lost = check.run("chunk_sizes", lambda b, n: [b // n] * n)
    assert "tensor_split" not in lost.hint and "lost" in lost.hint, lost


def _every_hint():
    for name, exercise in check._registry().items():
        for text in [hint.text for hint in exercise.hints] + [exercise.general_hint]:
            yield name, text


# A call with arguments, a slice, an assignment or a method call: code to type in, not a concept to understand.
_CODE = re.compile(r"\b(?!ceil\()\w+\([^)]*\w[^)]*\)|\[\d*:\d*\]|\w = \w|\.\w+\(\)")


@pytest.mark.parametrize(("name", "text"), list(_every_hint()), ids=lambda value: str(value)[:40])
def test_hints_name_the_idea_and_never_dictate_code(name, text):
    assert text, f"{name} has an empty hint"
    assert not _CODE.search(text), f"{name}'s hint dictates code: {_CODE.search(text).group()!r} in {text!r}"


def test_failure_messages_summarise_tensors_and_containers_and_point_at_the_first_difference():
    case = next(case for case in check.cases("split_batch") if case.why == "a dict gives one dict per device")
    wrong = [{"inputs": chunk, "labels": chunk[:, 0]} for chunk in case.args[0]["inputs"].chunk(3)]
    message = case.message("split_batch", wrong)
    assert "'inputs': tensor(shape=[4, 2], dtype=int64)" in message, message
    assert "first differ at [0]['labels'][1]: 2 instead of 1" in message, message
    assert len(message) < 800, message
    x, y = torch.arange(2000).reshape(1000, 2), torch.arange(1000)
    assert check.summarise(x) == "tensor(shape=[1000, 2], dtype=int64)"
    assert check.summarise({"a": y, "b": [1, 2, 3, 4, 5]}) == (
        "{'a': tensor(shape=[1000], dtype=int64), 'b': [1, 2, 3, ... 2 more]}"
    )
    assert check.first_difference([4, 3, 3], [4, 4, 2]) == "[1]: 3 instead of 4"
    assert check.first_difference((x, y), (x, y[:-1])) == "[1]: shape [1000] instead of [999]"
    assert check.first_difference({"a": x}, {"b": x}) == "the top level: the key 'b' is missing"
    assert check.first_difference(x, x) == ""


def test_numbers_within_the_exercises_tolerance_are_not_reported_as_differences():
    """The training case expects losses rounded to 6 decimals; a learner's exact float32 loss is within the
    exercise's tolerance and must not be named, the first loss out of tolerance must, to the digits that matter."""
    case = check.cases("train_with_data_parallel")[0]
    got = [loss + 4.7e-7 for loss in case.expected]  # as float32 training gives: 1.1214724779129028 for 1.121472
    got[1] += 0.01
    message = case.message("train_with_data_parallel", got)
    assert "first differ at [1]: " in message, message
    assert "[0]" not in message, message
    shown = re.search(r"\[1\]: (\S+) instead of (\S+?)\.", message)
    assert shown and all(len(number.replace(".", "").lstrip("0")) <= 7 for number in shown.groups()), message
    within = [loss + 4.7e-7 for loss in case.expected]
    assert (
        check.first_difference(within, case.expected, tolerance=check.exercise("train_with_data_parallel").tolerance)
        == ""
    )
    # an exact exercise still names the smallest difference, with the digits it takes to see it
    assert check.first_difference([1.0000001], [1.0]) == "[0]: 1.0000001 instead of 1.0"
    tolerance = check.Tolerance(absolute=1e-5, relative=1e-4)
    near, far = torch.tensor([1.0, 2.000001, 3.5]), torch.tensor([1.0, 2.0, 3.0])
    assert check.first_difference(near, far, tolerance=tolerance) == "[2]: 3.5 instead of 3.0"


def test_the_self_check_and_its_hint_agree_on_where_training_goes_wrong():
    """A loop that forgets zero_grad: float32 losses whose first step is within tolerance of the expected rounded
    one. The message names step [1] and the hint says the first step matches; neither contradicts the other."""
    from gpulab_solutions.gradient_averaging import one_device_training

    def forgets_zero_grad(model, batches, loss_fn, lr, device_ids):
        losses, _ = one_device_training(model, batches, loss_fn, lr)
        return [losses[0], *(loss + 0.05 for loss in losses[1:])]

    result = check.run("train_with_data_parallel", forgets_zero_grad)
    assert not result.passed
    assert "first differ at [1]: " in result.detail and "[0]" not in result.detail, result
    assert "The first step matches" in result.hint, result


def test_a_dict_that_differs_in_a_value_names_the_key_and_both_values():
    # dp_traffic_bytes's forward cases expect three stages of the five a full answer returns
    case = check.Case((8, 2, 43, 3, 5), {"scatter": 48, "broadcast": 172, "gather": 80}, "8 samples on 2 devices")
    got = {"scatter": 48, "broadcast": 172, "gather": 160, "grad_scatter": 80, "reduce": 172}
    message = case.message("dp_traffic_bytes", got)
    assert "first differ at ['gather']: 160 instead of 80." in message, message
    assert "keys" not in message, message
    assert check.first_difference({"a": 1, "b": 2}, {"b": 2, "a": 1}) == ""  # a dict's order is no difference
    assert check.first_difference({"a": 1, "b": 2}, {"a": 1}) == "the top level: an extra key 'b'"


def test_a_rules_time_limit_stops_a_slow_answer_and_leaves_a_callers_timer_as_it_was():
    """``time_limit``: an answer still running after a rule's seconds is stopped with ``TooSlow`` (in the lesson's
    language); a timer the caller set (a test's time-out) still rings when it would have, and one that rings first
    is left alone."""
    import signal
    import time

    with pytest.raises(check.TooSlow, match="stopped after 0.2 s"):
        with check.time_limit(0.2):
            while True:
                pass
    rang = []
    previous = signal.signal(signal.SIGALRM, lambda *_: rang.append(time.monotonic()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 2.0)  # after the limit's longest wait (WALL_TIME_FACTOR * 0.2 s)
        started = time.monotonic()
        with pytest.raises(check.TooSlow), check.time_limit(0.2):
            while True:
                pass
        assert 1.5 < signal.getitimer(signal.ITIMER_REAL)[0] <= 1.8
        while not rang:
            time.sleep(0.01)
        assert 1.95 < rang[0] - started < 2.3  # the caller's timer, on time
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with check.time_limit(5):  # the caller's timer rings first: no limit of the check's own
            time.sleep(0.3)
        assert len(rang) == 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_an_answer_that_plays_a_ring_too_large_to_play_is_stopped_with_the_hint_to_count(monkeypatch):
    """Lesson 03's rules with inputs too large to run or play stop an answer after their seconds (here shortened)
    and hint at counting: a ring played step by step, with gpulab's own player, on 100,003 ranks."""
    from gpulab.traffic import ring_bytes_sent

    limit = check.time_limit
    monkeypatch.setattr(check, "time_limit", lambda seconds: limit(seconds and 0.5))

    def played(n_elements, world_size, bytes_per_element=4):
        if world_size < 1 or n_elements < 0:
            raise ValueError("bad")
        return ring_bytes_sent([n_elements] + [0] * (world_size - 1), bytes_per_element)

    result = check.run("ring_all_reduce_bytes", played)
    assert not result.passed and "TooSlow" in result.detail and "too large to play" in result.hint, result
    assert all(rule.seconds for rule in check.exercise("ring_all_reduce_bytes").rules_of("total"))


def test_numbers_are_printed_to_the_precision_that_matters():
    assert check.summarise(1.1214724779129028) == "1.12147"
    assert check.summarise([0.30000000000000004, 3.0, 2]) == "[0.3, 3.0, 2]"  # a float stays a float
    assert check.summarise(torch.tensor([0.123456789, 2.0])) == "tensor([0.123457, 2.0], dtype=float32)"
    assert check.format_pair(0.1 + 0.2, 0.3) == ("0.30000000000000004", "0.3")
    assert check.format_pair(2.5, 2.4) == ("2.5", "2.4")
    case = check.Case((), 0.5, "a ratio")
    message = case.message("imbalance_ratio", 0.5000000000004)  # within imbalance_ratio's 1e-9: no digits hunt
    assert "returned 0.5, expected 0.5." in message and "differ" not in message, message
    assert "returned 0.501, expected 0.5." in case.message("imbalance_ratio", 0.501)


def test_unwritten_exercise_says_so():
    def chunk_sizes(batch_size, n_devices):
        raise NotImplementedError()

    assert "Not written yet" in str(check.run("chunk_sizes", chunk_sizes))


def test_visible_cases_are_the_ones_the_nbgrader_cell_asserts():
    cases = check.cases("chunk_sizes")
    assert [case.args for case in cases][:2] == [(64, 2), (10, 3)]
    assert cases[1].expected == [len(p) for p in torch.arange(10).chunk(3)]


def test_cases_of_one_kind_are_the_ones_its_graded_cell_asserts():
    every = check.cases("strip_module_prefix")
    leading = check.cases("strip_module_prefix", kind="leading")

    def described(cases):
        return [(case.kind, case.why, case.describe("strip_module_prefix")) for case in cases]

    assert leading and described(case for case in every if case.kind == "leading") == described(leading)
    assert len(leading) < len(every), "the other kinds' cases are left out"
    with pytest.raises(ValueError, match=r"no visible case of kind 'leadin'; its kinds: \['leading', "):
        check.cases("strip_module_prefix", kind="leadin")


def test_check_prints_plain_text_without_jupyter(capsys):
    check.chunk_sizes(_chunk_sizes)
    assert capsys.readouterr().out.startswith("✓ chunk_sizes")


def test_solution_needs_confirmation_and_is_there_only_with_the_solutions_package():
    def run(code):
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PATH": ""}
        ).stdout

    assert "def chunk_sizes" not in run("from gpulab import check; check.solution('chunk_sizes')")
    assert "def chunk_sizes" in run("from gpulab import check; check.solution('chunk_sizes', confirm=True)")
    # a class's environment has gpulab alone: no solution to show, and none to find
    without = "import sys; sys.modules['gpulab_solutions'] = None; from gpulab import check; "
    shown = run(without + "check.solution('chunk_sizes', confirm=True)")
    assert "not installed" in shown and "def chunk_sizes" not in shown


def test_unknown_exercise_is_a_clear_error():
    with pytest.raises(AttributeError, match="no exercise 'chunk_size'"):
        check.chunk_size(_chunk_sizes)


def _lesson_imports(module_name: str) -> tuple[Path, str]:
    """The folder of the lesson that ``gpulab.exercises.<module>`` belongs to, and the lesson's module-level
    imports (its set-up cells, the modules beside it)."""
    short = module_name.rsplit(".", 1)[-1]
    (source,) = REPO.glob(f"source/[0-9][0-9]_{short}/[0-9][0-9]_{short}.py")
    tree = ast.parse(source.read_text())
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert imports, source
    return source.parent, "\n".join(ast.unparse(node) for node in imports)


LESSON_EXERCISES = [
    (module_name, exercise.name)
    for module_name in check._LESSON_MODULES
    for exercise in importlib.import_module(module_name).EXERCISES
]


@pytest.mark.parametrize(("module_name", "name"), LESSON_EXERCISES)
def test_every_shown_solution_passes_its_own_check(module_name, name, monkeypatch):
    """``check.solution(name, confirm=True)`` shows code a learner may paste into the lesson: pasted after the
    lesson's imports and its earlier exercises' solutions, it must pass the exercise's self-check."""
    folder, imports = _lesson_imports(module_name)
    monkeypatch.syspath_prepend(str(folder))
    namespace: dict = {}
    exec(imports, namespace)
    for exercise in importlib.import_module(module_name).EXERCISES:
        exec(gpulab_solutions.solution_of(exercise.name), namespace)
        if exercise.name == name:
            break
    result = check.run(name, namespace[name])
    assert result.passed, str(result)


_LESSON_OF_MODULE = {
    "gpulab.exercises.splitting": "01_splitting",
    "gpulab.exercises.gradient_averaging": "02_gradient_averaging",
    "gpulab.exercises.gpu0_imbalance": "03_gpu0_imbalance",
    "gpulab.exercises.checkpoints": "04_checkpoints",
}


@pytest.mark.parametrize("module_name", sorted(_LESSON_OF_MODULE))
def test_sections_a_hint_points_to_are_headings_of_its_lesson(module_name):
    lesson = _LESSON_OF_MODULE[module_name]
    source = (REPO / "source" / lesson / f"{lesson}.py").read_text(encoding="utf-8")
    headings = [line.lstrip("# ").strip() for line in source.splitlines() if re.match(r"^# #{2,4} ", line)]
    for exercise in importlib.import_module(module_name).EXERCISES:
        for text in [hint.text for hint in exercise.hints] + [exercise.general_hint]:
            for quoted in re.findall(r"'([A-Z][^']{8,})'", text):
                assert any(heading.startswith(quoted) for heading in headings), (
                    f"{exercise.name}'s hint points to '{quoted}', which is no heading of {lesson}"
                )


@pytest.mark.parametrize("module_name", sorted(_LESSON_OF_MODULE))
def test_sections_a_japanese_hint_points_to_are_headings_of_the_japanese_lesson(module_name):
    """The Japanese hints quote the Japanese edition's headings (the lesson's catalogue, ``NN_name.ja.po``)."""
    import polib

    lesson = _LESSON_OF_MODULE[module_name]
    catalogue = polib.pofile(str(REPO / "source" / lesson / f"{lesson}.ja.po"))
    headings = [
        line.lstrip("#").strip() for entry in catalogue for line in entry.msgstr.splitlines() if line.startswith("##")
    ]
    quoted = [
        heading
        for text in importlib.import_module(module_name).TRANSLATIONS["ja"].values()
        for heading in re.findall(r"「([^」]{6,})」", text)
    ]
    assert quoted, f"no Japanese hint of {lesson} points to a heading"
    for heading in quoted:
        assert any(h.startswith(heading) for h in headings), (
            f"a Japanese hint points to 「{heading}」, no heading of {lesson}"
        )
