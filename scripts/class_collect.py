"""Collect a class's submissions from nbgrader's exchange, trusting nothing a learner can write.

Used by ``class_hub.py grade`` in place of ``nbgrader collect``. nbgrader's exchange lets every learner create
entries in the course's ``inbound/`` (mode 2733: write, no read), names each entry
``<learner>+<assignment>+<timestamp>+<random>`` and writes the learner's own ``timestamp.txt`` into it;
``nbgrader collect`` takes the learner from the name (and only warns when the entry's owner is someone else),
follows symbolic links when it copies, and picks the entry whose *name* has the latest date. So a learner could
submit in another's name, copy another's files through a link, and back-date work. Here, instead:

* **Whose entry**: an entry counts only for the roster learner who owns it, by ``lstat`` (never by its name); an
  entry whose name names someone else is a forgery, reported for its owner and taken for nobody. An entry owned by
  an account not on the roster is reported and ignored.
* **What is copied**: only the lesson's notebooks at the top of the entry that are regular files owned by that
  learner, opened without following a link (``O_NOFOLLOW``, ``O_NONBLOCK``, checked again on the open descriptor),
  each at most ``MAX_NOTEBOOK_BYTES``, at most ``MAX_NOTEBOOKS`` of them; a link, a folder, a FIFO, a file of
  another owner or a file over the limit is skipped and reported. Nothing else of the entry is read, except its
  ``submission_secret.txt`` (same rules, a hexadecimal secret of at most 256 characters), which only its own
  learner's feedback needs.
* **When**: the submission time is the latest change time (``ctime``) of the entry and of what was copied: the
  kernel sets it, and no learner can set it back (``touch`` moves it forward, to now; a folder moved into
  ``inbound/`` is changed by the move). The date in the name and the learner's ``timestamp.txt`` are not read. An
  entry changed after now is refused (the clock was set back). An inbound on tmpfs is refused whole: a write
  through a shared memory mapping made earlier sets no change time where pages are never written back (on a disk,
  only for the seconds until write-back).
* **Which**: of a learner's valid entries for a lesson (either edition), the one changed last. Entries are ranked
  by their change times first (``lstat``), and only the latest is read (an older one only where the later ones hold
  nothing to grade): collect holds one entry's notebooks at a time, however many entries a learner makes, and looks
  at a learner's ``MAX_ENTRIES`` latest.
* **Who pays**: every refusal, forgery and skipped file is a ``Finding`` for the learner who made it (by owner);
  nothing one learner leaves in the exchange stops another's collect.

The collect runs as the instructor (``class_hub.py`` forks and drops to that account first), so a mistake here
can reach no more than the instructor's own files. Tests: ``tests/test_class_collect.py``.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

MAX_NOTEBOOK_BYTES = 50 << 20  # grade.py refuses larger notebooks unread; so does collect
MAX_NOTEBOOKS = 4  # notebooks read from an entry that lacks the lesson's own
MAX_LISTED = 1000  # names of an entry looked at for them
MAX_ENTRIES = 100  # of one learner's entries for a lesson, those looked at (the ones changed last)
MAX_FINDINGS = 100  # findings kept per learner; the rest are counted, one line says how many
MAX_SECRET_BYTES = 256
FUTURE_SLACK_SECONDS = 60  # an entry changed more than this after now is refused
SECRET = re.compile(r"[0-9a-f]{16,256}")
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f UTC"  # nbgrader's timestamp.txt format, in UTC


@dataclass
class Finding:
    """Something collect refused, skipped or noticed, for the learner who caused it (by owner)."""

    learner: str  # a roster learner, or "uid <n>" for an account not on the roster
    entry: str  # the entry's name as ``ascii()`` shows it: no line break or escape reaches a report
    verdict: str  # "refused", "forged", "skipped", "superseded", "taken"
    reason: str


@dataclass
class Submission:
    """A learner's entry taken for grading: its notebooks' bytes, the time it was made, its secret."""

    learner: str
    assignment: str  # the exchange's assignment name (the edition: "01_splitting" or "01_splitting_ja")
    entry: str
    made_at: datetime
    notebooks: dict[str, bytes] = field(default_factory=dict)
    secret: str | None = None

    @property
    def timestamp(self) -> str:
        return self.made_at.strftime(TIMESTAMP_FORMAT)


@dataclass
class Collected:
    chosen: dict[str, Submission]
    findings: list[Finding]


class Findings(list):
    """The findings of a collect, at most ``MAX_FINDINGS`` kept per learner (a learner's junk entries cost the
    report, the collect's memory and the JSON passed back one line, however many they are); ``close`` adds one
    line per learner saying how many more there were."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[str, int] = {}
        self.more: dict[str, int] = {}

    def append(self, finding: Finding) -> None:
        if self.kept.get(finding.learner, 0) < MAX_FINDINGS or finding.verdict == "taken":
            self.kept[finding.learner] = self.kept.get(finding.learner, 0) + 1
            super().append(finding)
        else:
            self.more[finding.learner] = self.more.get(finding.learner, 0) + 1

    def __iadd__(self, found):
        for finding in found:
            self.append(finding)
        return self

    def close(self) -> list[Finding]:
        for learner, count in self.more.items():
            super().append(Finding(learner, "", "skipped", f"{count} more findings like these, not listed"))
        return list(self)


def shown(name: str) -> str:
    return ascii(name)[1:-1]


def _ctime(status: os.stat_result) -> datetime:
    return datetime.fromtimestamp(status.st_ctime, UTC)


def _open_owned_file(folder: int, name: str, uid: int, limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of ``name`` in the folder open as ``folder``: a regular file owned by ``uid``, at most ``limit``
    bytes, opened without following a link and without blocking on a FIFO. ``ValueError`` says why not."""
    try:
        before = os.lstat(name, dir_fd=folder)
    except OSError as error:
        raise ValueError(f"cannot be read ({error.strerror})") from None
    if stat.S_ISLNK(before.st_mode):
        raise ValueError("a symbolic link (never followed)")
    if not stat.S_ISREG(before.st_mode):
        raise ValueError("not a regular file")
    if before.st_uid != uid:
        raise ValueError(f"owned by uid {before.st_uid}, not by the learner")
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError as error:
        why = "a symbolic link (never followed)" if error.errno == errno.ELOOP else error.strerror
        raise ValueError(f"cannot be read ({why})") from None
    try:
        status = os.fstat(descriptor)
        if (status.st_dev, status.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(status.st_mode):
            raise ValueError("replaced while it was read")
        if status.st_uid != uid:
            raise ValueError(f"owned by uid {status.st_uid}, not by the learner")
        if status.st_dev != os.fstat(folder).st_dev:
            raise ValueError("on a file system mounted in the exchange")
        if status.st_size > limit:
            raise ValueError(f"larger than {limit} bytes")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(descriptor, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ValueError(f"larger than {limit} bytes")
        return b"".join(chunks), os.fstat(descriptor)
    finally:
        os.close(descriptor)


def _notebooks_to_read(folder: int, notebook_names: set[str]) -> list[str]:
    """The lesson's notebooks present in the entry; where none is, the entry's other notebooks (a renamed copy,
    which ``grade.py`` grades as the lesson's when it is the only one), at most ``MAX_NOTEBOOKS + 1`` of them, found
    among the first ``MAX_LISTED`` names (a folder flooded with files costs the reader nothing more)."""
    present = []
    for name in sorted(notebook_names):
        try:
            os.lstat(name, dir_fd=folder)
            present.append(name)
        except OSError:
            pass
    if present:
        return present
    others = []
    with os.scandir(folder) as listing:
        for count, item in enumerate(listing):
            if count >= MAX_LISTED or len(others) > MAX_NOTEBOOKS:
                break
            if item.name.endswith(".ipynb") and not item.name.startswith("."):
                others.append(item.name)
    return sorted(others)


def read_entry(
    inbound: int, name: str, learner: str, uid: int, assignment: str, notebook_names: set[str]
) -> tuple[Submission | None, list[Finding]]:
    """Copy one entry that ``learner`` (``uid``) owns: its notebooks and secret, into memory."""
    findings = []
    try:
        folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=inbound)
    except OSError as error:
        return None, [Finding(learner, shown(name), "refused", f"its folder cannot be read ({error.strerror})")]
    try:
        status = os.fstat(folder)
        if status.st_uid != uid:
            return None, [Finding(learner, shown(name), "refused", "replaced while it was read")]
        submission = Submission(learner, assignment, shown(name), _ctime(status))
        for item in _notebooks_to_read(folder, notebook_names):
            try:
                data, file_status = _open_owned_file(folder, item, uid, MAX_NOTEBOOK_BYTES)
            except ValueError as why:
                findings.append(Finding(learner, shown(name), "skipped", f"{shown(item)}: {why}"))
                continue
            submission.notebooks[item] = data
            submission.made_at = max(submission.made_at, _ctime(file_status))
        try:
            secret, _ = _open_owned_file(folder, "submission_secret.txt", uid, MAX_SECRET_BYTES)
            text = secret.decode("ascii", "replace").strip()
            submission.secret = text if SECRET.fullmatch(text) else None
        except ValueError:
            pass
        if submission.secret is None:
            findings.append(
                Finding(learner, shown(name), "skipped", "no valid submission_secret.txt: its feedback cannot reach it")
            )
        if not submission.notebooks:
            findings.append(Finding(learner, shown(name), "refused", "no notebook that can be graded"))
            return None, findings
        return submission, findings
    finally:
        os.close(folder)


# file systems whose pages are never written back: a write through a shared mapping made before the due date
# changes the file later and sets no change time (on a disk, only until write-back, about 30 s)
NO_WRITE_BACK = {"tmpfs", "ramfs", "shmem"}


def file_system_of(path: Path, mounts: Path = Path("/proc/self/mounts")) -> str:
    """The type of the file system ``path`` lives on (the longest mount point above it)."""
    where = os.path.realpath(path)
    best, kind = "", ""
    for line in mounts.read_text().splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


@dataclass
class _Candidate:
    learner: str
    uid: int
    name: str
    assignment: str
    changed: float  # the latest change time of the entry and its notebooks, from lstat (nothing read yet)


def _changed(top: int, name: str, status: os.stat_result, notebook_names: set[str]) -> float:
    """The latest change time of an entry and of the notebooks collect would read from it, by ``lstat`` only."""
    latest = status.st_ctime
    try:
        folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
    except OSError:
        return latest
    try:
        for item in _notebooks_to_read(folder, notebook_names):
            try:
                latest = max(latest, os.lstat(item, dir_fd=folder).st_ctime)
            except OSError:
                pass
    finally:
        os.close(folder)
    return latest


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime(TIMESTAMP_FORMAT)


def collect(
    inbound: Path,
    roster: dict[str, int],
    assignments: dict[str, set[str]],
    now: datetime | None = None,
) -> Collected:
    """Each roster learner's latest valid entry among ``assignments`` (exchange name -> the lesson's notebook
    names), and every finding. ``roster`` maps each learner to their account's uid.

    Entries are ranked by their change times (``lstat``, nothing read), and only a learner's latest is read; an
    older one only where the later ones hold nothing to grade. So what collect holds in memory is one entry's
    notebooks, however many entries a learner makes; of a learner's entries, the ``MAX_ENTRIES`` whose folders
    changed last are looked at."""
    now = now or datetime.now(UTC)
    kind = file_system_of(inbound)
    if kind in NO_WRITE_BACK:
        raise SystemExit(
            f"the exchange's inbound {inbound} is on {kind}: a write through a memory mapping sets no change time "
            "there, so no submission's time can be trusted; put the exchange on a disk file system"
        )
    learner_of = {uid: learner for learner, uid in roster.items()}
    findings = Findings()
    entries: dict[str, list[tuple[os.stat_result, str, str]]] = {}
    try:
        top = os.open(inbound, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise SystemExit(f"cannot read the exchange's inbound {inbound}: {error.strerror}") from None
    try:
        device = os.fstat(top).st_dev
        for name in sorted(os.listdir(top)):
            try:
                status = os.lstat(name, dir_fd=top)
            except OSError:
                continue  # removed while listed
            owner = learner_of.get(status.st_uid, f"uid {status.st_uid}")
            parts = name.split("+")
            assignment = parts[1] if len(parts) in (3, 4) else None
            if assignment is not None and assignment not in assignments:
                continue  # another lesson's entry: judged when that lesson is collected
            if owner not in roster:
                findings.append(Finding(owner, shown(name), "refused", "made by an account not on the roster"))
                continue
            if assignment is None:
                findings.append(Finding(owner, shown(name), "refused", "not named <learner>+<assignment>+<time>"))
                continue
            if parts[0] != owner:
                findings.append(
                    Finding(owner, shown(name), "forged", f"named for {shown(parts[0])!r} but made by {owner}")
                )
                continue
            if stat.S_ISLNK(status.st_mode) or not stat.S_ISDIR(status.st_mode):
                findings.append(Finding(owner, shown(name), "refused", "not a folder (a link or a file)"))
                continue
            if status.st_dev != device:
                findings.append(Finding(owner, shown(name), "refused", "a file system mounted in the exchange"))
                continue
            entries.setdefault(owner, []).append((status, name, assignment))
        chosen = {}
        for learner, found in sorted(entries.items()):
            found.sort(key=lambda entry: (entry[0].st_ctime, entry[1]), reverse=True)
            if len(found) > MAX_ENTRIES:
                reason = f"{len(found)} entries: only the {MAX_ENTRIES} changed last were looked at"
                findings.append(Finding(learner, "", "skipped", reason))
            ranked = sorted(
                (
                    _Candidate(
                        learner, roster[learner], name, assignment, _changed(top, name, status, assignments[assignment])
                    )
                    for status, name, assignment in found[:MAX_ENTRIES]
                ),
                key=lambda c: (c.changed, c.name),
                reverse=True,
            )
            for candidate in ranked:
                if learner in chosen:
                    findings.append(
                        Finding(
                            learner, shown(candidate.name), "superseded", f"made at {_when(candidate.changed)}, before"
                        )
                    )
                    continue
                submission, problems = read_entry(
                    top, candidate.name, learner, candidate.uid, candidate.assignment, assignments[candidate.assignment]
                )
                findings += problems
                if submission is None:
                    continue
                ahead = (submission.made_at - now).total_seconds()
                if ahead > FUTURE_SLACK_SECONDS:
                    findings.append(Finding(learner, submission.entry, "refused", f"changed {ahead:.0f} s after now"))
                    continue
                chosen[learner] = submission
                findings.append(Finding(learner, submission.entry, "taken", f"made at {submission.timestamp}"))
    finally:
        os.close(top)
    listed = findings.close()
    listed.sort(key=lambda f: (f.learner, f.verdict != "taken", f.entry))
    return Collected(chosen, listed)


def stage(collected: Collected, staged: Path, lesson: str) -> None:
    """Lay the chosen submissions out as ``grade.py`` reads them: ``<learner>/<lesson>/<notebook>`` and the
    ``timestamp.txt`` collect measured (never the learner's)."""
    for learner, submission in collected.chosen.items():
        folder = staged / learner / lesson
        folder.mkdir(parents=True)
        for name, data in submission.notebooks.items():
            (folder / name).write_bytes(data)
        (folder / "timestamp.txt").write_text(submission.timestamp)
