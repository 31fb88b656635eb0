"""The kernel transport of ``autograder.checks``: one ``execute_request`` per round trip, one answer back.

The request's code is a small stub: ``wire.py``'s source and the request (JSON text) as literals, run in a
fresh namespace that gets the notebook's globals as data; the kernel answers by publishing one ``display_data``
of the private MIME type ``wire.MIME`` tagged with the request's nonce. The grader reads the message stream of
that request only (messages whose parent is its ``msg_id``): every message carrying the MIME type counts as an
answer, and exactly one, with the right nonce and under the size cap, must come; anything else the request
printed or displayed (learner output during a call) is dropped and never stored in the notebook. Used by
``autograder/execute.py`` for every graded test cell.
"""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path

from jupyter_core.utils import run_sync

from autograder.checks import MAX_ANSWER, CheckFailed, Session, new_nonce, wire
from autograder.reasons import reason

WIRE_SOURCE = Path(wire.__file__).read_text()

_ANSWER = """
def _gpulab_check_answer():
    import json as _json
    try:
        import torch as _torch
    except ImportError:
        _torch = None
    try:
        _result = serve(_json.loads(REQUEST), NOTEBOOK, _torch)
    except Exception as _error:
        _result = {"error": f"{type(_error).__name__}: {_error}"[:500]}
    from IPython.display import publish_display_data
    publish_display_data({MIME: {"nonce": NONCE, "result": _result}})


_gpulab_check_answer()
"""


def stub(request: dict, nonce: str) -> str:
    """The code of one request: runs ``wire.serve`` on it in the kernel, in a namespace of its own."""
    program = WIRE_SOURCE + _ANSWER
    return (
        f'(lambda _b: _b.exec(_b.compile({program!r}, "<grader check>", "exec"), '
        '{"__builtins__": _b, "__name__": "gpulab_check", "NOTEBOOK": globals(), '
        f'"REQUEST": {json.dumps(request)!r}, "NONCE": {nonce!r}}}))(__import__("builtins"))'
    )


class CheckTimeout(CheckFailed):
    """The kernel did not answer within the cell's time limit (the kernel was interrupted)."""


class KernelDied(CheckFailed):
    """The kernel died while the grader waited for its answer."""


class KernelSession(Session):
    """A session talking to the notebook's kernel through ``executor`` (``execute.SandboxedExecute``)."""

    def __init__(self, executor, submission: Path, deadline: float, rng):
        super().__init__(submission, rng)
        self.executor = executor
        self.deadline = deadline
        self.round_trips = 0

    def _request(self, request: dict) -> dict:
        nonce = new_nonce()
        answers = run_sync(self._exchange)(stub(request, nonce))
        self.round_trips += 1
        if len(answers) != 1:
            raise CheckFailed(f"the kernel sent {len(answers)} answers to the grader's request instead of one")
        answer = answers[0]
        if type(answer) is not dict or answer.get("nonce") != nonce or set(answer) != {"nonce", "result"}:
            raise CheckFailed("the kernel's answer does not belong to the grader's request")
        return self._parse(answer["result"])

    async def _exchange(self, code: str) -> list:
        try:
            return await self._messages(code)
        except (CheckFailed, KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:  # noqa: BLE001 - e.g. "Invalid Signature": the kernel's messages are broken
            raise CheckFailed(f"the kernel's messages are broken ({type(error).__name__}: {error})") from error

    async def _messages(self, code: str) -> list:
        kc = self.executor.kc
        msg_id = kc.execute(code, silent=False, store_history=False, allow_stdin=False, stop_on_error=False)
        answers, size, reply, idle = [], 0, None, False
        checked = time.monotonic()
        while reply is None or not idle:
            if time.monotonic() - checked > 0.5:
                checked = time.monotonic()
                if not await self.executor.kernel_alive():
                    raise KernelDied(reason("died_in_check"))
            left = self.deadline - time.monotonic()
            if left <= 0:
                await self.executor.interrupt()
                raise CheckTimeout(reason("check_timeout"))
            if reply is None:
                try:
                    message = await kc.shell_channel.get_msg(timeout=0.001)
                except queue.Empty:
                    message = None
                if message is not None:
                    if message.get("parent_header", {}).get("msg_id") == msg_id:
                        reply = message
                    continue
            try:
                message = await kc.iopub_channel.get_msg(timeout=min(left, 0.05))
            except queue.Empty:
                continue
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message.get("msg_type")
            content = message.get("content") or {}
            if kind == "status" and content.get("execution_state") == "idle":
                idle = True
            data = content.get("data") if isinstance(content, dict) else None
            if isinstance(data, dict) and wire.MIME in data:
                size += len(json.dumps(data[wire.MIME]))
                if size > MAX_ANSWER:
                    raise CheckFailed(f"the kernel's answer is larger than {MAX_ANSWER} characters")
                answers.append(data[wire.MIME])
        return answers
