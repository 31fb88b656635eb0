"""Shared pytest set-up: the repository root on sys.path (for `tests.*` helpers and DDP worker modules)."""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
