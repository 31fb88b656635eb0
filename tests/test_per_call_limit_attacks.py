"""Attacks on the per-call time limit of graded checks (``Rule.seconds``): a learner's answer, running in the kernel,
against the timer that stops one call (``gpulab.check.time_limit`` in ``checks/wire.py: serve``), the ``too_slow``
report it answers with, and how the grader reads that report (``Session.calls``, ``rules.enforce``).

The invariants these tests hold:

* a ``too_slow`` report only ever costs its cell: beside every right outcome, for a stopped input the answer could not
  compute, or raised by the answer itself, it never passes, skips an input or lets outcomes stand for inputs that
  were not computed;
* a report whose index is no call the grader gave seconds to (not an ``int``, a ``bool``, out of range, negative, a
  call without seconds) is a malformed answer, never a grader error and never the name of another input; a report on
  a request without seconds changes nothing; an answer with fewer outcomes than calls is malformed;
* a failure names the input the kernel was stopped on (its rule or case for the learner, a catalogue text that
  quotes no hidden input), and no call after it is made;
* the timer is the kernel's, one call's: after a call it is cancelled and the handler put back, so it stops no later
  call; a stop the answer catches is no excuse: what it returns is judged;
* an answer that switches the timer off (``setitimer(0)``, ``SIG_IGN``, a shorter timer of its own, a replaced
  ``time_limit``, its exception caught) or moves its work after the call (into the encoding of what it returns) is
  bounded by the grader's own deadline, the cell's time (``KernelSession``), in a real kernel; one that the interrupt
  cannot stop either (``BaseException`` caught, a C loop) leaves the kernel unresponsive, which is what makes the
  grader stop it (``SandboxedExecute._responsive``);
* in a real kernel, a Python loop, a sleep in C, a C ``sleep`` through ctypes, a joined thread and ``SIGALRM``
  blocked in the answer's thread are all stopped at their seconds;
* the lesson's reference answer finishes the largest drawn input far within the limit, so that the wall-clock timer
  does not fail honest work slowed by other kernels on the same cores.

Unit tests run the checks through ``LocalSession`` (the kernel's side in this process), with the rules' seconds cut to
a fraction of a second where a test waits for them; the kernel tests start one plain ``ipykernel`` (not sandboxed:
what is tested is the timer and the grader's deadline, not the sandbox) and talk to it through ``KernelSession``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.nbgrader_tools import REPO

sys.path.insert(0, str(REPO))
import gpulab_solutions  # noqa: E402
from gpulab import check as gpulab_check  # noqa: E402

from autograder.checks import CheckFailed, LocalSession, TooSlow, checks_for, rule_texts  # noqa: E402
from autograder.checks import rules as rules_module  # noqa: E402
from tests.local_checks import lesson_03_namespace  # noqa: E402

LESSON = "03_gpu0_imbalance"
MODULE = "autograder.checks.gpu0_imbalance"
QUICK = 0.3  # seconds a rule gives a call in the tests that wait for the timer


def _check(grade_id: str):
    return checks_for(LESSON)[grade_id]


def _pending(name: str, kind: str, seed: int) -> list:
    """``(rule, call)`` in the order ``enforce`` sends them for ``random.Random(seed)``."""
    rng = random.Random(seed)
    rules = gpulab_check.exercise(name).rules_of(kind)
    pending = [(rule, call) for rule in rules for call in gpulab_solutions.drawn_calls(name, rule, rng)]
    errors = {rule.raises for rule in rules if rule.raises is not None}
    if len(errors) == 1 and all(rule.raises is not None for rule in rules):
        pending += rules_module.valid_calls(name, rng)
    return pending


@pytest.fixture
def quick(monkeypatch):
    """The rules' seconds cut to ``QUICK``: the grader's code runs as it is, only the number is smaller."""
    exercise = gpulab_check.exercise

    def quicker(name):
        found = copy.copy(exercise(name))
        found.rules = tuple(dataclasses.replace(r, seconds=QUICK if r.seconds else None) for r in found.rules)
        return found

    monkeypatch.setattr(gpulab_check, "exercise", quicker)


class Forged(LocalSession):
    """A kernel that answers what ``forge(request, honest)`` makes of each request (``honest()`` runs it for real)."""

    def __init__(self, namespace, submission, rng, forge):
        super().__init__(namespace, submission, rng)
        self.forge = forge

    def _request(self, request):
        return self._parse(json.dumps(self.forge(request, lambda: LocalSession._request(self, request))))


def _verdict(check, session) -> CheckFailed | None:
    """The check's failure, or None when it passed; anything else escapes (a grader error fails the test)."""
    try:
        check(session)
    except CheckFailed as failure:
        return failure
    finally:
        session.close()
    return None


# --------------------------------------------------------------------------------------------- forged reports
@pytest.mark.parametrize("index", [None, True, False, 1.0, "0", -1, "len", 10**30, "no seconds"])
def test_a_too_slow_report_naming_no_call_with_seconds_is_malformed_never_another_input(tmp_path, index):
    """A report of any index but a call with seconds is a malformed answer, not a grader error (``pending[len]``) nor
    the name of another input (``pending[-1]``, ``pending[True]``): every call of the ring's total cell has seconds;
    its errors cell sends invalid inputs without seconds first (``"no seconds"``: index 0 there)."""
    cell, kind = ("errors", "errors") if index == "no seconds" else ("total", "total")
    pending = _pending("ring_all_reduce_bytes", kind, 0)
    assert all(rule.seconds for rule, _ in pending) if kind == "total" else pending[0][0].seconds is None
    index = {"len": len(pending), "no seconds": 0}.get(index, index) if isinstance(index, str) else index
    session = Forged({}, tmp_path, random.Random(0), lambda request, honest: {"outcomes": [], "too_slow": index})
    failure = _verdict(_check(f"ring_all_reduce_bytes_{cell}"), session)
    assert failure is not None and not isinstance(failure.__cause__, TooSlow)
    assert "malformed" in str(failure), str(failure)


def test_a_too_slow_report_costs_its_cell_even_beside_every_right_outcome(tmp_path):
    """The reference's outcomes, all right, with a report that one call was stopped: the cell fails. A report is
    never a way to have outcomes judged without the call it names."""
    namespace = lesson_03_namespace()

    def forge(request, honest):
        return {**honest(), "too_slow": len(request["calls"]) - 1}

    failure = _verdict(_check("ring_all_reduce_bytes_total"), Forged(namespace, tmp_path, random.Random(0), forge))
    assert failure is not None and isinstance(failure.__cause__, TooSlow) and "took longer" in str(failure)
    assert _verdict(_check("ring_all_reduce_bytes_total"), LocalSession(namespace, tmp_path, random.Random(0))) is None


def _numbers(value) -> list[int]:
    if isinstance(value, (list, tuple)):
        return [n for item in value for n in _numbers(item)]
    return [value] if type(value) is int else []


def test_a_too_slow_report_names_the_input_it_gives_and_its_rule_and_no_hidden_value(tmp_path):
    """Whichever call the kernel says it was stopped on, the failure names that call (for the instructor) and its
    rule's case (for the learner): a catalogue text, which quotes no hidden input. ``dp_traffic_bytes``'s forward
    cell has three rules with seconds and case names."""
    name, kind, seed = "dp_traffic_bytes", "forward", 3
    pending = _pending(name, kind, seed)
    assert len({rule.key for rule, _ in pending}) > 1
    for index, (rule, call) in enumerate(pending):
        session = Forged({}, tmp_path, random.Random(seed), lambda r, h, i=index: {"outcomes": [], "too_slow": i})
        failure = _verdict(_check("dp_traffic_bytes_forward"), session)
        assert str(failure).startswith(rules_module._describe(name, call) + " took longer than 10 s"), str(failure)
        assert failure.rule == rule.named(call)
        texts = rule_texts(failure.rule, MODULE)
        drawn = [str(n) for n in _numbers(call.args) if n >= 1000]
        assert texts is not None and not any(number in text for number in drawn for text in texts.values())


def test_a_too_slow_report_on_a_request_without_seconds_changes_nothing(tmp_path):
    """``imbalance_ratio``'s ratio cell gives no seconds: a report there is not read; the wrong outcomes beside it are
    judged (and fail), and nothing the grader does not give crashes it."""
    wrong = lesson_03_namespace({"imbalance_ratio_answer": "def imbalance_ratio(*sizes):\n    return 1.0\n"})

    def forge(request, honest):
        assert "seconds" not in request
        return {**honest(), "too_slow": 0}

    failure = _verdict(_check("imbalance_ratio_ratio"), Forged(wrong, tmp_path, random.Random(0), forge))
    assert failure is not None and "returned" in str(failure) and not isinstance(failure.__cause__, TooSlow)


@pytest.mark.parametrize("cut", [-1, 1])
def test_outcomes_for_fewer_or_more_calls_than_were_made_are_malformed(tmp_path, cut):
    """A kernel that stops early without a report (or adds an outcome) has its answer refused: no outcome stands for
    a call that was not made, and none shifts onto another input."""
    namespace = lesson_03_namespace()

    def forge(request, honest):
        result = honest()
        outcomes = result["outcomes"]
        return {"outcomes": outcomes[:cut] if cut < 0 else [*outcomes, outcomes[-1]]}

    failure = _verdict(_check("ring_all_reduce_bytes_total"), Forged(namespace, tmp_path, random.Random(0), forge))
    assert failure is not None and "malformed" in str(failure)


# --------------------------------------------------------------------------------------------- answers in the kernel
PLAYED_RING = """
made = []


def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    made.append((n_elements, world_size, bytes_per_element))
    if world_size < 1 or n_elements < 0:
        raise ValueError("world_size >= 1 and n_elements >= 0")
    if world_size >= 10**5:
        {giant}
    return 2 * (world_size - 1) * n_elements * bytes_per_element
"""


def _ring(giant: str) -> dict:
    return lesson_03_namespace({"ring_all_reduce_bytes_answer": PLAYED_RING.format(giant=giant)})


def test_an_answer_stopped_on_one_input_fails_naming_it_and_no_later_call_is_made(tmp_path, quick):
    """Right on every input but a ring of 100,000 ranks or more, where it plays: stopped there after the rule's
    seconds, the failure names that input; the calls after it are never made."""
    namespace = _ring("while True:\n            pass")
    started = time.monotonic()
    failure = _verdict(_check("ring_all_reduce_bytes_total"), LocalSession(namespace, tmp_path, random.Random(0)))
    assert time.monotonic() - started < 10
    made = namespace["made"]
    sent = [(*call.args, 4)[:3] for _, call in _pending("ring_all_reduce_bytes", "total", 0)]
    first_giant = next(index for index, args in enumerate(sent) if args[1] >= 10**5)
    assert made == sent[: first_giant + 1] and len(made) < len(sent)
    assert str(failure) == f"ring_all_reduce_bytes{sent[first_giant]} took longer than {QUICK:g} s"


def test_an_answer_that_catches_the_stop_and_guesses_earns_nothing(tmp_path, quick):
    """The timer's exception caught inside the answer, a guess returned: the guess is judged like any value."""
    namespace = _ring(
        "try:\n            while True:\n                pass\n        except BaseException:\n            return 0"
    )
    failure = _verdict(_check("ring_all_reduce_bytes_total"), LocalSession(namespace, tmp_path, random.Random(0)))
    assert failure is not None and " returned 0, expected " in str(failure)
    assert not isinstance(failure.__cause__, TooSlow)


def test_an_answer_raising_the_timers_own_exception_where_it_cannot_count_is_not_skipped(tmp_path):
    """Right on small rings, ``gpulab.check.TooSlow`` raised at once on the giants (the inputs it cannot count): the
    cell fails; a stopped input is never left out of the verdict. In the errors cell, an exception that is both
    ``TooSlow`` and ``ValueError`` raised on every input passes the invalid ones and is stopped on the valid ones."""
    raising = _ring("import gpulab.check\n        raise gpulab.check.TooSlow('cannot count')")
    failure = _verdict(_check("ring_all_reduce_bytes_total"), LocalSession(raising, tmp_path, random.Random(0)))
    assert failure is not None and isinstance(failure.__cause__, TooSlow)
    both = """
import gpulab.check


class Both(gpulab.check.TooSlow, ValueError):
    pass


def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    raise Both("everything is invalid, or too slow")
"""
    namespace = lesson_03_namespace({"ring_all_reduce_bytes_answer": both})
    failure = _verdict(_check("ring_all_reduce_bytes_errors"), LocalSession(namespace, tmp_path, random.Random(0)))
    assert failure is not None and isinstance(failure.__cause__, TooSlow)


def test_the_timer_is_cancelled_after_a_call_and_stops_no_later_one(tmp_path):
    """A call that returns within its seconds leaves no timer behind: a later call without seconds that runs longer
    than them is not stopped, and the caller's handler of ``SIGALRM`` is the one it had."""
    handler = signal.getsignal(signal.SIGALRM)
    session = LocalSession({"fast": lambda: 1, "slower": lambda: time.sleep(3 * QUICK) or 2}, tmp_path)
    caller = signal.setitimer(signal.ITIMER_REAL, 0)  # pytest-timeout's timer, which time_limit would re-arm
    try:
        assert session.calls("fast", [((), {})], seconds=[QUICK])[0].value == 1
        assert session.calls("slower", [((), {})])[0].value == 2
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        if caller[0]:
            signal.setitimer(signal.ITIMER_REAL, *caller)
    assert signal.getsignal(signal.SIGALRM) is handler


def test_a_call_slowed_by_others_is_stopped_by_its_cpu_time_not_by_the_clock(tmp_path):
    """The seconds are the call's own CPU time: a call that has waited past them (as a kernel does whose cores other
    kernels hold, where no CPU controller shares them out) but worked for less is not stopped, and one that works
    past them is, within a ring of them; one that only waits is stopped at ``WALL_TIME_FACTOR`` times its seconds."""
    from gpulab.check import WALL_TIME_FACTOR

    def waits_then_answers():
        time.sleep(2 * QUICK)
        return 1

    def works():
        began = time.process_time()
        while time.process_time() - began < 10 * QUICK:
            pass
        return 2

    session = LocalSession({"waits_then_answers": waits_then_answers, "works": works, "waits": time.sleep}, tmp_path)
    assert session.calls("waits_then_answers", [((), {})], seconds=[QUICK])[0].value == 1
    began = time.process_time()
    with pytest.raises(TooSlow):
        session.calls("works", [((), {})], seconds=[QUICK])
    assert 0.9 * QUICK <= time.process_time() - began < 3 * QUICK  # a ring comes within MIN_RING of them
    began = time.monotonic()
    with pytest.raises(TooSlow):
        session.calls("waits", [((100,), {})], seconds=[QUICK])
    assert WALL_TIME_FACTOR * QUICK <= time.monotonic() - began < (WALL_TIME_FACTOR + 5) * QUICK


def test_a_ring_after_the_block_ended_stops_nothing_and_the_handler_is_put_back(monkeypatch):
    """The timer may ring after the call has returned but before it is stopped: that ring raises nothing (the call
    was within its seconds), and the handler and the caller's timer are put back all the same."""
    from gpulab import check

    handler = signal.getsignal(signal.SIGALRM)
    caller = signal.setitimer(signal.ITIMER_REAL, 0)  # pytest-timeout's timer, put back below
    setitimer = signal.setitimer

    def ring_before_stopping(which, seconds, *interval):
        if seconds == 0:  # the block has ended: the ring comes just before the timer is stopped
            os.kill(os.getpid(), signal.SIGALRM)
        return setitimer(which, seconds, *interval)

    try:
        monkeypatch.setattr(check.signal, "setitimer", ring_before_stopping)
        with check.time_limit(60):
            pass
        monkeypatch.undo()
        assert signal.getsignal(signal.SIGALRM) is handler
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        monkeypatch.undo()
        if caller[0]:
            setitimer(signal.ITIMER_REAL, *caller)


def test_the_reference_finishes_the_largest_drawn_input_far_within_the_limit():
    """The timer measures wall time: a kernel slowed by others on the same cores must not fail honest work. The
    lesson's reference ``dp_traffic_bytes`` (``torch.chunk`` over every device) on the largest draw (150,000 devices,
    450,000 samples) takes less than a fifth of ``COUNTING_SECONDS`` of CPU time."""
    from gpulab.exercises.gpu0_imbalance import COUNTING_SECONDS

    answer = lesson_03_namespace()["dp_traffic_bytes"]
    answer(450_000, 150_000, 174, 5, 12)  # warm
    started = time.process_time()
    answer(450_000, 150_000, 174, 5, 12, algorithm="nccl")
    assert time.process_time() - started < COUNTING_SECONDS / 5


# --------------------------------------------------------------------------------------------- a real kernel
DEADLINE = 1.5  # the cell's time in the kernel tests


class Kernel:
    """A plain ipykernel and what ``KernelSession`` and ``SandboxedExecute._responsive`` need of an executor."""

    probe_timeout = 2

    def __init__(self, folder: Path):
        from jupyter_client.manager import AsyncKernelManager
        from jupyter_core.utils import run_sync

        self.run_sync, self.manager, self.folder = run_sync, AsyncKernelManager, folder
        self.start()

    def start(self):
        self.spent = False
        self.km = self.manager(kernel_name="python3")
        self.km.kernel_spec.interrupt_mode = "message"  # as the grader's kernels are interrupted
        self.run_sync(self.km.start_kernel)(cwd=str(self.folder))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.run_sync(self.kc.wait_for_ready)(timeout=120)
        self.execute("import contextlib, ctypes, signal, threading, time\nimport torch, gpulab.check")
        self.session(120).calls("len", [(("warm",), {})], seconds=[10])  # the stub's first run, untimed

    def ready(self) -> Kernel:
        """This kernel, started afresh if an earlier test left it busy for good."""
        if self.spent:
            self.close()
            self.start()
        return self

    def close(self):
        self.kc.stop_channels()
        self.run_sync(self.km.shutdown_kernel)(now=True)

    def execute(self, code: str) -> None:
        async def run():
            msg_id = self.kc.execute(code)
            while True:
                reply = await self.kc.shell_channel.get_msg(timeout=120)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return reply["content"]

        content = self.run_sync(run)()
        assert content["status"] == "ok", content

    def session(self, seconds: float):
        from autograder.checks.kernel import KernelSession

        return KernelSession(self, self.folder, time.monotonic() + seconds, random.Random(0))

    async def interrupt(self):
        await self.km.interrupt_kernel()

    async def kernel_alive(self):
        return await self.km.is_alive()

    def responsive(self) -> bool:
        from autograder.execute import SandboxedExecute

        return SandboxedExecute._responsive(self)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    started = Kernel(tmp_path_factory.mktemp("kernel"))
    yield started
    started.close()


def _answer(body: str, before: str = "") -> str:
    """A notebook cell: ``before``, then ``def answer(index)`` of ``body`` (unindented source)."""
    return f"{before}\ndef answer(index):\n{textwrap.indent(textwrap.dedent(body), '    ')}\n"


LOOP = """
while True:
    pass
"""

STOPPED = {
    "a Python loop": LOOP,
    "a sleep in C": "time.sleep(1000)",
    # a signal cuts libc's sleep short: a waiting answer calls it again
    "libc's sleep through ctypes": "while True:\n    ctypes.CDLL(None).sleep(1000)",
    "a joined thread": """
        worker = threading.Thread(target=time.sleep, args=(5,), daemon=True)
        worker.start()
        worker.join()
    """,
    # blocked in the main thread only: the signal goes to another of the kernel's threads, and Python runs the
    # handler in the main thread all the same
    "SIGALRM blocked in the answer's thread": "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})" + LOOP,
}
UNBLOCK = (
    "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"  # a signal still pending is discarded
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})\n"
    "signal.signal(signal.SIGALRM, signal.SIG_DFL)\n"
)


def test_in_a_kernel_a_loop_a_sleep_a_thread_and_a_blocked_signal_are_stopped_at_their_seconds(kernel):
    """The second of three calls never returns by itself: the kernel's timer stops it after its seconds of CPU time
    (a loop) or ``WALL_TIME_FACTOR`` times as many of wall time (a wait), well before the cell's time; the report
    names it, and the kernel keeps no timer armed."""
    kernel.ready()
    for what, body in STOPPED.items():
        kernel.execute(_answer(f"if index == 1:\n{textwrap.indent(textwrap.dedent(body), '    ')}\nreturn index"))
        started = time.monotonic()
        with pytest.raises(TooSlow) as stopped:
            kernel.session(15).calls("answer", [((i,), {}) for i in range(3)], seconds=[QUICK] * 3)
        assert stopped.value.index == 1 and time.monotonic() - started < 15, what
        kernel.execute("assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)\n")
        kernel.execute("assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL\n")
        kernel.execute(UNBLOCK)


SWITCHED_OFF = {  # what: (a cell before, the answer's body, a cell after that puts the kernel back)
    "setitimer(0)": ("", "signal.setitimer(signal.ITIMER_REAL, 0)" + LOOP, ""),
    "SIG_IGN": ("", "signal.signal(signal.SIGALRM, signal.SIG_IGN)" + LOOP, ""),
    "a shorter timer of the notebook's": (
        "signal.signal(signal.SIGALRM, lambda *_: None)\n"
        f"signal.setitimer(signal.ITIMER_REAL, {QUICK / 2}, {QUICK / 2})",
        LOOP,
        "signal.setitimer(signal.ITIMER_REAL, 0)\nsignal.signal(signal.SIGALRM, signal.SIG_DFL)",
    ),
    "a replaced time_limit": (
        "kept = gpulab.check.time_limit\ngpulab.check.time_limit = lambda seconds: contextlib.nullcontext()",
        LOOP,
        "gpulab.check.time_limit = kept",
    ),
    "the work moved into encoding the value, after the call": (
        "import numbers\n\n\nclass Endless:\n    def __int__(self):\n        while True:\n            pass\n\n\n"
        "numbers.Integral.register(Endless)",
        "return Endless()",
        "",
    ),
    "the stop caught": (
        "",
        """
        while True:
            try:
                time.sleep(10)
            except Exception:
                pass
        """,
        "",
    ),
}


def test_in_a_kernel_an_answer_that_switches_the_timer_off_is_bounded_by_the_cells_deadline(kernel):
    """Each way an answer can keep the timer from stopping it gets it as far as the cell's deadline: the grader's
    own bound fails the cell there (``CheckTimeout``) and interrupts the kernel, which answers again."""
    from autograder.checks.kernel import CheckTimeout

    kernel.ready()
    for what, (before, body, after) in SWITCHED_OFF.items():
        kernel.execute(_answer(body, before))
        started = time.monotonic()
        with pytest.raises(CheckTimeout):
            kernel.session(DEADLINE).calls("answer", [((0,), {})], seconds=[QUICK])
        assert DEADLINE <= time.monotonic() - started < DEADLINE + 10, what
        assert kernel.responsive(), what
        if after:
            kernel.execute(after)


UNSTOPPABLE = {
    "BaseException caught": """
        while True:
            try:
                time.sleep(10)
            except BaseException:
                pass
    """,
    "a C loop": "return sum(range(10**15))",
}


def test_in_a_kernel_an_answer_the_interrupt_cannot_stop_is_left_unresponsive_for_the_grader_to_stop(kernel):
    """An answer that keeps the timer's exception and the interrupt's (or never returns to Python) still fails at
    the cell's deadline; the kernel then does not answer a trivial request, which is what makes the grader end it
    (``SandboxedExecute._run_check``: ``_responsive``, then ``_stop``)."""
    from autograder.checks.kernel import CheckTimeout

    for what, body in UNSTOPPABLE.items():
        kernel.ready().execute(_answer(body))
        started = time.monotonic()
        with pytest.raises(CheckTimeout):
            kernel.session(DEADLINE).calls("answer", [((0,), {})], seconds=[QUICK])
        assert DEADLINE <= time.monotonic() - started < DEADLINE + 10, what
        assert not kernel.responsive(), what
        kernel.spent = True  # the grader would end it here (``_stop``); the next use starts another
