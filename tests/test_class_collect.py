"""The class's collect (``scripts/class_collect.py``): an entry counts only for the roster learner who owns it, only
regular files that learner owns are read (no link followed), the time is the entry's change time, and one learner's
odd or hostile entry is reported for that learner and costs nobody else anything.

The learners here are uids without accounts (root may own files by any uid), so nothing is left on the system.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import class_collect  # noqa: E402
from class_collect import collect, stage  # noqa: E402

from tests.class_entries import ASSIGNMENTS, LESSON, NOTEBOOK, ROSTER  # noqa: E402
from tests.class_entries import entry as _entry  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="entries owned by several uids need root")


def _verdicts(collected) -> list[tuple[str, str]]:
    return [(f.learner, f.verdict) for f in collected.findings]


def test_honest_entries_are_taken_with_the_time_the_system_recorded(inbound):
    before = datetime.now(UTC) - timedelta(seconds=2)
    _entry(inbound, f"alice+{LESSON}+2020-01-01 00:00:00.000000 UTC+abc", "alice")
    _entry(inbound, f"bob+{LESSON}_ja+2020-01-01 00:00:00.000000 UTC+def", "bob")
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    assert sorted(collected.chosen) == ["alice", "bob"]
    assert collected.chosen["bob"].assignment == f"{LESSON}_ja"
    for submission in collected.chosen.values():
        assert submission.made_at >= before  # not the 2020 of the name or the learner's timestamp.txt
        assert submission.notebooks == {f"{LESSON}.ipynb": NOTEBOOK.encode()}
        assert submission.secret is not None
    assert sorted(_verdicts(collected)) == [("alice", "taken"), ("bob", "taken")]


def test_an_entry_in_another_learners_name_counts_for_nobody_and_is_reported_for_its_maker(inbound):
    _entry(inbound, f"alice+{LESSON}+2026-01-01 00:00:00.000000 UTC+real", "alice")
    time.sleep(0.02)
    forged = {f"{LESSON}.ipynb": NOTEBOOK.replace("{", '{"forged": 1, ', 1)}
    _entry(inbound, f"alice+{LESSON}+2099-01-01 00:00:00.000000 UTC+fake", "mallory", forged)
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    assert collected.chosen["alice"].notebooks[f"{LESSON}.ipynb"] == NOTEBOOK.encode()
    assert "mallory" not in collected.chosen
    (forgery,) = [f for f in collected.findings if f.verdict == "forged"]
    assert forgery.learner == "mallory" and "alice" in forgery.reason


def test_links_and_files_of_others_are_never_followed_or_copied(inbound, tmp_path):
    alice = _entry(inbound, f"alice+{LESSON}+t+a", "alice")
    secret_file = tmp_path / "gradebook.db"
    secret_file.write_text("not for learners")
    mallory = _entry(inbound, f"mallory+{LESSON}+t+m", "mallory", files={})
    (mallory / f"{LESSON}.ipynb").symlink_to(alice / f"{LESSON}.ipynb")
    os.lchown(mallory / f"{LESSON}.ipynb", ROSTER["mallory"], ROSTER["mallory"])
    (mallory / "grades.ipynb").symlink_to(secret_file)
    bob = _entry(inbound, f"bob+{LESSON}+t+b", "bob", files={})
    os.link(alice / f"{LESSON}.ipynb", bob / f"{LESSON}.ipynb")  # a hard link: alice's file, alice's owner
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    assert sorted(collected.chosen) == ["alice"]
    skipped = {(f.learner, f.reason.split(":")[0]) for f in collected.findings if f.verdict == "skipped"}
    assert ("mallory", f"{LESSON}.ipynb") in skipped and ("bob", f"{LESSON}.ipynb") in skipped
    reasons = " ".join(f.reason for f in collected.findings)
    assert "symbolic link" in reasons and "not by the learner" in reasons
    assert ("mallory", "refused") in _verdicts(collected) and ("bob", "refused") in _verdicts(collected)


def test_odd_entries_cost_only_their_maker(inbound, tmp_path):
    _entry(inbound, f"alice+{LESSON}+t+a", "alice")
    odd = _entry(inbound, f"mallory+{LESSON}+t+odd", "mallory", files={})
    (odd / f"{LESSON}.ipynb").mkdir()  # a folder named like the notebook
    os.mkfifo(odd / "Copy.ipynb")  # a FIFO: opening it must not block
    os.chown(odd / "Copy.ipynb", ROSTER["mallory"], ROSTER["mallory"])
    (inbound / f"mallory+{LESSON}+t+file").write_text("x")  # an entry that is a file
    os.chown(inbound / f"mallory+{LESSON}+t+file", ROSTER["mallory"], ROSTER["mallory"])
    (inbound / f"mallory+{LESSON}+t+link").symlink_to(inbound / f"alice+{LESSON}+t+a")
    os.lchown(inbound / f"mallory+{LESSON}+t+link", ROSTER["mallory"], ROSTER["mallory"])
    _entry(inbound, f"bob+x+{LESSON}+t+plus", "bob")  # a '+' in the learner's part
    _entry(inbound, f"eve+{LESSON}+t+e", 41999)  # not on the roster
    _entry(inbound, "mallory+02_gradient_averaging+t+m", "mallory")  # another lesson: not this collect's
    no_secret = _entry(inbound, f"bob+{LESSON}_ja+t+ns", "bob", secret=False)
    assert no_secret.is_dir()
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    assert sorted(collected.chosen) == ["alice", "bob"]
    assert collected.chosen["bob"].secret is None  # graded; its feedback cannot be released
    by_learner = {}
    for finding in collected.findings:
        by_learner.setdefault(finding.learner, []).append(finding.verdict)
    assert by_learner["alice"] == ["taken"]
    assert by_learner["mallory"].count("refused") == 3, collected.findings
    assert "uid 41999" in by_learner
    assert any("02_gradient" in f.entry for f in collected.findings) is False
    assert any("submission_secret" in f.reason for f in collected.findings if f.learner == "bob")


def test_a_learners_latest_change_is_taken_and_a_future_one_refused(inbound):
    _entry(inbound, f"alice+{LESSON}_ja+2099-12-31 00:00:00.000000 UTC+old", "alice")
    time.sleep(0.05)
    newer = _entry(inbound, f"alice+{LESSON}+2000-01-01 00:00:00.000000 UTC+new", "alice")
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    assert collected.chosen["alice"].entry == newer.name  # by change time, not by the date in the name
    assert ("alice", "superseded") in _verdicts(collected)
    # collected with a clock an hour behind, every entry was changed in the future: refused
    behind = collect(inbound, ROSTER, ASSIGNMENTS, now=datetime.now(UTC) - timedelta(hours=1))
    assert behind.chosen == {}
    assert all(f.verdict == "refused" and "after now" in f.reason for f in behind.findings)


def test_a_notebook_over_the_limit_is_skipped(inbound, monkeypatch):
    monkeypatch.setattr(class_collect, "MAX_NOTEBOOK_BYTES", 100)
    _entry(inbound, f"mallory+{LESSON}+t+big", "mallory", {f"{LESSON}.ipynb": "x" * 101})
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    assert collected.chosen == {}
    assert any("larger than 100 bytes" in f.reason for f in collected.findings)


def test_stage_writes_the_measured_time_not_the_learners(inbound, tmp_path):
    _entry(inbound, f"alice+{LESSON}+t+a", "alice")
    collected = collect(inbound, ROSTER, ASSIGNMENTS)
    stage(collected, tmp_path / "staged", LESSON)
    folder = tmp_path / "staged" / "alice" / LESSON
    assert sorted(p.name for p in folder.iterdir()) == [f"{LESSON}.ipynb", "timestamp.txt"]
    from nbgrader.utils import parse_utc

    assert parse_utc((folder / "timestamp.txt").read_text()) == collected.chosen["alice"].made_at.replace(tzinfo=None)


def test_the_roster_grade_py_gives_every_learner_a_row_from_refuses_what_a_folder_name_may_not_be(tmp_path):
    """``grade.py --roster`` (which ``class_hub.py grade`` passes) registers every learner of the class, so that
    ``grades.csv`` has a row for one whose entry collect refused or never found; an id that ``grade.py`` would
    refuse as a folder name (a formula, a line break) is refused here too."""
    sys.path.insert(0, str(REPO))
    from autograder.grade import read_roster

    roster = tmp_path / "roster.txt"
    roster.write_text("alice\n\n# a comment\nbob  # and another\n")
    assert read_roster(roster) == {"alice", "bob"}
    roster.write_text("alice\n=HYPERLINK(1)\n")
    with pytest.raises(SystemExit, match="refused"):
        read_roster(roster)
