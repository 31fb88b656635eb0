"""Grader side of the positive evidence that a test ran to its end (the kernel side is ``guard.py``).

Per notebook and grading run: a fresh 256-bit key and nonce (``EvidenceSession``), and, in a folder of the grader
that the kernel's sandbox does not show, the guard's source and configuration and the evidence file. The kernel
launcher (``limits.py --pass-fd``) opens both before the sandbox starts: the configuration as descriptor
``CONFIG_FD`` (its file is unlinked then: the secret exists only as that descriptor, which the prologue reads
and closes before any learner code runs) and the evidence file as the append-only descriptor ``EVIDENCE_FD``.
The notebook that runs gets the prologue cell and, in place of each autograded test cell,
``__gpulab_guard__.run("<grade_id>")``; after the run the grader reads the evidence file and accepts only records
whose HMAC matches.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

GUARD_FILE = Path(__file__).resolve().with_name("guard.py")
GUARD_NAME = "__gpulab_guard__"
CONFIG_FD, EVIDENCE_FD = 200, 201  # descriptor numbers the kernel inherits from the launcher
HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"


def hidden_line_ranges(source: str) -> list[tuple[int, int]]:
    """1-based, inclusive line ranges of the hidden-test regions of a test cell's source."""
    ranges, start = [], None
    for number, line in enumerate(source.splitlines(), start=1):
        if HIDDEN_BEGIN in line and start is None:
            start = number
        elif HIDDEN_END in line and start is not None:
            ranges.append((start, number))
            start = None
    if start is not None:
        ranges.append((start, len(source.splitlines())))
    return ranges


def visible_source(source: str) -> str:
    """The test with its hidden regions blanked (same line numbers): what a traceback may show."""
    lines = source.splitlines()
    for start, end in hidden_line_ranges(source):
        for index in range(start - 1, end):
            lines[index] = ""
    return "\n".join(lines)


@dataclass
class Record:
    kind: str  # "ok", "fail" or "void"
    grade_id: str
    detail: str


@dataclass
class EvidenceSession:
    """One notebook's evidence: key, nonce, the guard's configuration and what the guard wrote."""

    tests: dict[str, str]  # grade_id -> the instructor's test source
    folder: Path  # the grader's own folder for this notebook: never bound into the sandbox
    trusted_files: list[str] = field(default_factory=list)
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    nonce: str = field(default_factory=lambda: secrets.token_hex(16))

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.config_path = self.folder / f"guard-{secrets.token_hex(8)}.json"
        self.evidence_path = self.folder / f"evidence-{secrets.token_hex(8)}"
        self.evidence_path.touch(mode=0o600)
        config = {
            "key": self.key.hex(),
            "nonce": self.nonce,
            "evidence_fd": EVIDENCE_FD,
            "trusted_files": self.trusted_files,
            "tests": {
                grade_id: {"source": source, "visible": visible_source(source), "hidden": hidden_line_ranges(source)}
                for grade_id, source in self.tests.items()
            },
        }
        descriptor = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump({"guard": GUARD_FILE.read_text(encoding="utf-8"), "config": config}, handle)

    # ------------------------------------------------------------------------------------- the notebook side
    def pass_fds(self) -> dict[int, tuple[str, str]]:
        """What the kernel launcher opens for the kernel: fd -> (mode, path) (``limits.launcher_command``)."""
        return {CONFIG_FD: ("r", str(self.config_path)), EVIDENCE_FD: ("a", str(self.evidence_path))}

    @staticmethod
    def prologue() -> str:
        """The first cell's source: read the guard and its configuration from ``CONFIG_FD``, install it."""
        return (
            "def __grader_prologue__():\n"
            "    import json, os\n"
            f"    with os.fdopen({CONFIG_FD}, encoding='utf-8') as handle:\n"
            "        data = json.load(handle)\n"
            "    module = {'__name__': '__gpulab_guard_module__', '__file__': '<grader guard>'}\n"
            "    exec(compile(data['guard'], '<grader guard>', 'exec'), module)\n"
            "    module['install'](data['config'], globals())\n"
            "__grader_prologue__()\n"
            "del __grader_prologue__"
        )

    @staticmethod
    def test_cell(grade_id: str) -> str:
        """What runs in place of a test cell."""
        return f"{GUARD_NAME}.run({json.dumps(grade_id)})"

    # ------------------------------------------------------------------------------------- the grader side
    def _mac(self, kind: str, grade_id: str, detail: str) -> str:
        digest = hashlib.sha256(self.tests[grade_id].encode()).hexdigest()
        message = f"{self.nonce}\0{kind}\0{grade_id}\0{digest}\0{detail}".encode()
        return hmac.new(self.key, message, "sha256").hexdigest()

    def records(self) -> dict[str, Record]:
        """The authentic record of each test (the last one, when a test ran twice); forged lines are ignored."""
        found: dict[str, Record] = {}
        try:
            text = self.evidence_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return found
        for line in text.splitlines():
            try:
                payload, mac = line.rsplit(" ", 1)
                kind, grade_id, detail = json.loads(payload)
            except ValueError:
                continue
            if not all(isinstance(x, str) for x in (kind, grade_id, detail)) or grade_id not in self.tests:
                continue
            if kind in ("ok", "fail", "void") and hmac.compare_digest(mac, self._mac(kind, grade_id, detail)):
                found[grade_id] = Record(kind, grade_id, detail)
        return found

    def close(self) -> None:
        for path in (self.config_path, self.evidence_path):
            path.unlink(missing_ok=True)
