"""gpulab.gil: DataParallel's replica threads serialise on Python-bound work; DDP's processes do not (lesson 03).

Judged by parallelism (the workers' CPU time added up / wall time), which other programs on the machine cannot
push above what the workers really got: the threads stay at or below about 1 whatever the load; the processes
track a calibration taken in the same run, and are judged only when it shows a free second core (see
gpulab.gil's docstring)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import gpulab
import pytest
import torch
from gpulab import gil
from gpulab.gil import Span


def _spans(*cpu_and_wall: tuple[float, float]) -> list[Span]:
    """Workers that all start at 0: (CPU seconds, seconds until the end) each."""
    return [Span(worker=index, cpu=cpu, start=0.0, end=wall) for index, (cpu, wall) in enumerate(cpu_and_wall)]


def _run(threads: list[float], calibration: list[float], processes: list[float]) -> gil.GILRun:
    """A run whose repeats have these parallelisms (two workers, one second of wall each)."""

    def repeats(values):
        return [_spans((value / 2, 1.0), (value / 2, 1.0)) for value in values]

    return gil.GILRun(2, 16, 10, repeats(threads), repeats(calibration), repeats(processes))


def test_parallelism_is_the_cpu_time_added_up_over_the_wall_from_first_start_to_last_end():
    assert gil.parallelism(_spans((1.0, 1.0), (1.0, 1.0))) == pytest.approx(2.0)
    assert gil.parallelism(_spans((0.5, 1.0), (0.5, 1.0))) == pytest.approx(1.0)
    staggered = [Span(1, 1.0, start=0.0, end=1.0), Span(2, 1.0, start=1.0, end=2.0)]  # one after the other
    assert gil.parallelism(staggered) == pytest.approx(1.0)


def test_python_bound_forward_gives_one_number_per_sample_and_notes_each_replica_thread():
    module = gil.PythonBound(work=50)
    batch = torch.arange(6, dtype=torch.float32).view(6, 1)
    whole = module(batch)
    assert whole.shape == (6,) and len(module.spans) == 1
    assert module.spans[0].worker == threading.get_native_id() and module.spans[0].cpu > 0
    module.spans.clear()
    parallel = gpulab.DataParallel(module, device_ids=gpulab.devices(2, quiet=True, remember=False))
    assert torch.equal(parallel(batch), whole)
    workers = {span.worker for span in module.spans}  # the replicas share the module's list of spans
    assert len(module.spans) == 2 and len(workers) == 2 and threading.get_native_id() not in workers


def test_the_judgement_fails_threads_that_run_at_once_and_processes_that_do_not():
    holds = _run(threads=[0.97, 0.99], calibration=[1.9, 1.95], processes=[1.85, 1.9])
    assert holds.free_core and holds.problems() == []
    # replicas that ran at once (in processes, or without a GIL): the claim is false
    at_once = _run(threads=[0.97, 1.8], calibration=[1.9, 1.95], processes=[1.85, 1.9])
    assert len(at_once.problems()) == 1 and "repeat 1" in at_once.problems()[0]
    # processes that took turns while the machine had a free core: false too
    in_turn = _run(threads=[0.97, 0.99], calibration=[1.9, 1.95], processes=[1.0, 1.0])
    assert len(in_turn.problems()) == 1 and "processes" in in_turn.problems()[0]
    # one repeat in which the processes tracked a free core is enough: the load changes between repeats
    assert _run(threads=[0.9, 0.9], calibration=[1.9, 1.4], processes=[1.0, 1.2]).problems() == []


def test_without_a_free_core_the_processes_are_not_judged_and_the_summary_says_so():
    loaded = _run(threads=[0.5, 0.6], calibration=[1.0, 1.1], processes=[0.6, 1.0])
    assert not loaded.free_core and loaded.problems() == []
    assert "1.10" in loaded.summary() and "no second core is free" in loaded.summary()
    assert "no second core" not in _run([0.9], [1.9], [1.9]).summary()
    assert _run(threads=[1.5, 0.6], calibration=[1.0, 1.1], processes=[0.6, 1.0]).problems()  # threads still judged


def test_measure_takes_rank_spans_from_a_launch_already_made():
    def rank(pid, starts):
        return {
            name: [dict(worker=pid, cpu=0.5, start=start, end=start + 0.5) for start in starts]
            for name in ("calibration", "processes")
        }

    fake = [rank(101, [0.0, 2.0]), rank(102, [0.0, 2.25])]
    run = gil.measure(2, batch_size=4, work=10, repeats=2, ranks=fake)
    assert len(run.threads) == 2 and all(len(spans) == 2 for spans in run.threads)
    assert run.processes_parallelism == pytest.approx([2.0, 1.0 / 0.75])
    with pytest.raises(ValueError):
        gil.measure(2, batch_size=4, work=10, repeats=2, ranks=fake[:1])


@pytest.mark.alone  # needs a free second core
def test_threads_serialise_and_processes_track_the_calibration_on_this_machine_now():
    """The lesson's claim, measured: two replica threads never run more than about one core's worth of Python at
    once; two DDP processes run as much at once as two plain processes side by side did a moment before.

    Only a run with a free second core can tell threads that take turns from threads that run at once (measured:
    with the threads' timings replaced by the processes', 1.69-1.99 > 1.15 with a free core, and no failure without
    one), so a loaded machine gets up to three tries, and a skip that says why when none had a free core."""
    for _ in range(3):
        run = gil.measure(2, batch_size=16, work=50_000, repeats=5)
        assert run.problems() == [], run.to_dict()
        if run.free_core:
            break
    else:
        pytest.skip(
            f"no second core was free in three tries: the claim cannot be told from its opposite ({run.summary()})"
        )
    assert [len(run.threads), len(run.calibration), len(run.processes)] == [5, 5, 5]
    pids = {span.worker for spans in run.processes for span in spans}
    assert len(pids) == 2 and os.getpid() not in pids  # two processes of their own
    print(run.summary())  # with -s: what this machine gave now
    assert "DataParallel" in run.summary() and run.to_dict()["free_core"] == run.free_core
    assert len(run.plot(display=False).axes) == 1


def test_the_report_and_the_plot_come_in_japanese_in_the_japanese_edition(monkeypatch):
    from gpulab import messages

    from tests.english_text import english_sentences, gpulab_english_in

    monkeypatch.setattr(messages, "_chosen", ["ja"])
    loaded = _run(threads=[0.5, 0.6], calibration=[1.0, 1.1], processes=[0.6, 1.0])
    summary = loaded.summary()
    assert "並列度" in summary and "2つ目のコアが空いていない" in summary and "1.10" in summary
    assert gpulab_english_in(summary) == [], summary
    figure = loaded.plot(display=False)
    axes = figure.axes[0]
    drawn = [axes.get_title(), axes.get_ylabel(), *(label.get_text() for label in axes.get_xticklabels())]
    assert "（DataParallel）" in drawn[3] and not [text for text in drawn if english_sentences(text)], drawn


def _waits(run: gil.GILRun, threads: int, processes: int) -> gil.GILRun:
    """``run`` with each thread's and each process's loop counting these waits (voluntary context switches)."""
    for name, count in (("threads", threads), ("processes", processes)):
        for spans in getattr(run, name):
            for span in spans:
                span.waits = count
    return run


@pytest.mark.parametrize("language", ["en", "ja"])
def test_on_a_saturated_machine_the_summary_claims_nothing_the_run_did_not_show(monkeypatch, language):
    """No free core (the calibration below FREE_CORE): the parallelisms show nothing about the GIL, and the summary
    says only that, never that the threads' number still shows it; what it says of the waits follows the counts,
    and where the system does not count them it says that nothing in the run can show the GIL."""
    from gpulab import messages

    from tests.english_text import gpulab_english_in

    monkeypatch.setattr(messages, "_chosen", [language])
    claims = {"en": "The threads' number still shows the GIL", "ja": "それでもスレッドの値はGILを示しています"}
    cannot = {"en": "show nothing about the GIL", "ja": "GILについて何も示しません"}
    shown = {"en": "that shows the GIL, at any load", "ja": "負荷によらずGILを示しています"}
    not_shown = {"en": "These counts do not show the GIL", "ja": "これらの回数はGILを示していません"}
    uncounted = {"en": "nothing in this run can show the GIL", "ja": "この実行ではGILを示せません"}

    def saturated():
        return _run(threads=[0.5, 0.6], calibration=[0.9, 1.0], processes=[0.6, 0.9])

    alone = saturated().summary()
    assert claims[language] not in alone and cannot[language] in alone and uncounted[language] in alone, alone
    assert shown[language] not in alone and not_shown[language] not in alone
    waited = _waits(saturated(), threads=30, processes=0)
    assert waited.shown_by_waits and waited.problems() == []
    assert shown[language] in waited.summary() and "120" in waited.summary(), waited.summary()
    assert claims[language] not in waited.summary() and uncounted[language] not in waited.summary()
    for free_threads in (_waits(saturated(), threads=0, processes=0), _waits(saturated(), threads=30, processes=30)):
        assert free_threads.shown_by_waits is False and free_threads.problems(), free_threads.to_dict()
        assert not_shown[language] in free_threads.summary() and shown[language] not in free_threads.summary()
    if language == "ja":
        for run in (saturated(), waited, free_threads):
            assert gpulab_english_in(run.summary()) == [], run.summary()


def test_on_a_machine_saturated_by_busy_loops_the_waits_show_the_gil_and_parallelism_claims_nothing(monkeypatch):
    """A real saturated machine: three busy Python loops per core, started here, take every core. The calibration
    then shows no free core and the summary says that parallelism shows nothing; the waits still show the GIL (the
    threads block on it, the processes never do), in both languages."""
    from gpulab import messages

    from tests.english_text import gpulab_english_in

    loops = [
        subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"], stdin=subprocess.DEVNULL)
        for _ in range(3 * (os.cpu_count() or 1))
    ]
    try:
        time.sleep(0.5)
        run = gil.measure(2, batch_size=16, work=50_000, repeats=3)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert not run.free_core and run.shown_by_waits and run.problems() == [], run.to_dict()
    english = run.summary()
    assert "show nothing about the GIL" in english and "that shows the GIL, at any load" in english, english
    assert "still shows" not in english
    monkeypatch.setattr(messages, "_chosen", ["ja"])
    japanese = run.summary()
    assert "GILについて何も示しません" in japanese and "負荷によらずGILを示しています" in japanese, japanese
    assert "それでもスレッドの値" not in japanese and gpulab_english_in(japanese) == [], japanese
