"""What the browser tests (``tests/test_browser.py``, ``tests/test_class_hub.py``) wait for in a JupyterLab page."""

from __future__ import annotations

import time


def wait_idle(page, seconds: float = 1.0, timeout_s: float = 120) -> None:
    """Wait until the kernel indicator has been idle for ``seconds`` in a row."""
    deadline = time.monotonic() + timeout_s
    idle_since = None
    while time.monotonic() < deadline:
        idle = page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').count() > 0
        if idle:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= seconds:
                return
        else:
            idle_since = None
        page.wait_for_timeout(200)
    raise TimeoutError("the kernel never became idle")
