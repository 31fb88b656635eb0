"""Every check has a bound on the grader's CPU time (``autograder/limits.py: cpu_budget``): a check made slow by a
hostile answer ends its grading worker, in a C call that never returns to Python too, and the pool reports that
notebook alone (``grade.Pool``), then grades the next submission with a fresh worker."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autograder import grade, limits  # noqa: E402

BURN = """
import sys, time
sys.path.insert(0, {repo!r})
from autograder.limits import cpu_budget
with cpu_budget(1):
    pass
began = time.process_time()
while time.process_time() - began < 2.5:  # after the block: the budget no longer holds
    pass
print("after the block", flush=True)
with cpu_budget(1):
    {burn}
print("never here", flush=True)
"""


def _run(burn: str) -> subprocess.CompletedProcess:
    code = BURN.format(repo=str(REPO), burn=burn)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_check_past_its_cpu_budget_ends_its_worker_even_inside_one_c_call():
    for burn in ("pow(7, 10**9)", "while True: pass"):  # one C call that never returns to Python; Python code
        done = _run(burn)
        assert done.returncode == -signal.SIGXCPU, (burn, done.returncode, done.stderr[-500:])
        assert done.stdout == "after the block\n"


def test_the_pool_names_the_check_budget_for_that_notebook_only():
    pool = grade.Pool.__new__(grade.Pool)
    pool._settings = {"worker_memory": 2 << 30}
    process = SimpleNamespace(exitcode=-signal.SIGXCPU, join=lambda timeout: None)
    why = pool._why_it_died({"group": None, "process": process})
    assert f"more than {limits.CHECK_CPU_SECONDS} s of the grader's CPU time" in why
    process.exitcode = -signal.SIGKILL
    assert pool._why_it_died({"group": None, "process": process}) == "the grading worker died"
