"""What the class's tests share (``tests/test_class_collect.py``, ``tests/test_class_attacks.py``,
``tests/test_class_attacks_2.py``, ``tests/test_server_limits.py``): learners that are bare uids (root may own
files by, and run as, any uid: no account is made, nothing is left on the system), exchange entries made as
nbgrader's submit makes them, and a Python every account can run for what runs as a learner."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROSTER = {"alice": 41001, "bob": 41002, "mallory": 41003}
LESSON = "01_splitting"
NOTEBOOK_NAME = f"{LESSON}.ipynb"
ASSIGNMENTS = {LESSON: {NOTEBOOK_NAME}, f"{LESSON}_ja": {NOTEBOOK_NAME}}
NOTEBOOK = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
# what runs as a learner: a Python every account can run (the clone's own may sit behind a closed folder)
LEARNERS_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def uid_of(owner: str | int) -> int:
    return ROSTER[owner] if isinstance(owner, str) else owner


def entry(inbound: Path, name: str, owner: str | int, files: dict[str, str] | None = None, secret=True) -> Path:
    """An entry as nbgrader's submit makes it (folder 0777, files 0644, the learner's own ``timestamp.txt``, a
    secret unless ``secret`` is false), owned by ``owner`` (a roster learner or a uid)."""
    uid = uid_of(owner)
    folder = inbound / name
    folder.mkdir()
    files = files if files is not None else {NOTEBOOK_NAME: NOTEBOOK}
    files = {**files, "timestamp.txt": "2020-01-01 00:00:00.000000 UTC"}  # the learner's word: never read
    if secret:
        files["submission_secret.txt"] = os.urandom(64).hex()
    for file_name, text in files.items():
        (folder / file_name).write_text(text)
        os.chmod(folder / file_name, 0o644)
        os.lchown(folder / file_name, uid, uid)
    os.chmod(folder, 0o777)
    os.lchown(folder, uid, uid)
    return folder


def become(owner: str | int):
    """A ``preexec_fn``: become ``owner`` (a roster learner or a uid), with no supplementary group."""
    uid = uid_of(owner)

    def drop() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return drop
