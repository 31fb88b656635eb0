"""Grader side of the positive evidence that a test ran to its end (the kernel side is ``guard.py``).

Per notebook and grading run: a fresh 256-bit key and nonce (``EvidenceSession``), a private folder holding the
guard's configuration (deleted by the guard before learner code runs) and the evidence file. The notebook that
runs gets a prologue cell and, in place of each autograded test cell, ``__gpulab_guard__.run("<grade_id>")``;
after the run the grader reads the evidence file and accepts only records whose HMAC matches.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

GUARD_FILE = Path(__file__).resolve().with_name("guard.py")
GUARD_NAME = "__gpulab_guard__"
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
    trusted_files: list[str] = field(default_factory=list)
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    nonce: str = field(default_factory=lambda: secrets.token_hex(16))

    def __post_init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="grading-evidence-"))
        os.chmod(self.folder, 0o700)
        self.config_path = self.folder / f"guard-{secrets.token_hex(8)}.json"
        self.evidence_path = self.folder / f"evidence-{secrets.token_hex(8)}"
        self.evidence_path.touch(mode=0o600)
        config = {
            "key": self.key.hex(),
            "nonce": self.nonce,
            "evidence": str(self.evidence_path),
            "trusted_files": self.trusted_files,
            "tests": {
                grade_id: {"source": source, "visible": visible_source(source), "hidden": hidden_line_ranges(source)}
                for grade_id, source in self.tests.items()
            },
        }
        descriptor = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(config, handle)

    # ------------------------------------------------------------------------------------- the notebook side
    def prologue(self) -> str:
        """The first cell's source: load the guard and give it its configuration."""
        return f"__import__('runpy').run_path({str(GUARD_FILE)!r})['install']({str(self.config_path)!r}, globals())"

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
        shutil.rmtree(self.folder, ignore_errors=True)
