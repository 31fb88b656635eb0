"""Graded-test verdicts decided in the grader's process: the check-author API.

A lesson's hidden tests are *checks*, one module per assignment (``splitting.py`` for lesson 01
``01_splitting``, then ``gradient_averaging.py``, ``gpu0_imbalance.py``, ``checkpoints.py``). Each autograded
test cell's verdict is the check registered for its ``grade_id``::

    from autograder.checks import CheckFailed, check, expect

    @check("chunk_sizes_sizes")
    def sizes(session):
        outcome = session.call("chunk_sizes", 10, 3)      # the kernel calls the notebook's chunk_sizes(10, 3)
        expect(outcome.value == [4, 4, 2], "chunk_sizes(10, 3)")

The learner's code runs only in the sandboxed kernel. A check asks the kernel to call notebook definitions on
inputs the check chooses (``Session.call``/``calls``) or to run a *probe* (``Session.run``: a top-level function
of the check module, sent as source, called in the kernel as ``probe(notebook_globals, workdir, **inputs)``;
``@uses(helper, ...)`` sends top-level helper functions along with it, so that probes share them);
plain data comes back (``wire.py``: exact types, tensors loaded with ``weights_only=True``), and the check
compares it with references it computes itself. Files the learner's code wrote are read from outside the sandbox
(``files.py``). A check fails by raising ``CheckFailed`` (``expect``); any other exception is a grader bug
(``autograder/execute.py`` reports it as such). ``LocalSession`` runs checks without a kernel, for unit tests.

A failure's message is for the instructor (it names the inputs, hidden ones too). Its ``rule`` is for the learner:
which rule or case of the exercise failed, without the input (``expect(got == want, f"chunk_sizes({b}, {n})",
rule="an uneven batch, e.g. 7 samples over 4 devices")``); a failure without one is named by what its cell tests
(the module's ``CELL_RULES``, by grade id). Feedback shows a rule only when it is a text of a fixed
catalogue: a key of the check module's ``RULES`` (English -> Japanese), of ``COMMON_RULES`` below, or an exercise
text of ``gpulab`` (a visible case's ``why``, a rule's statement or one of its ``case_names``, translated in its
exercise module: an exercise declared as rules is named by those, ``rules.enforce``, with no second copy here), so
that nothing a check computes from a hidden input, and nothing the learner's code returned, can reach the feedback
(``rule_texts``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import random
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autograder.checks import files, wire
from autograder.checks.wire import Opaque, WireError

__all__ = [
    "MODULES",
    "CheckFailed",
    "LocalSession",
    "Opaque",
    "Outcome",
    "Session",
    "check",
    "checks_for",
    "expect",
    "cell_rule",
    "rule_texts",
    "uses",
]

MODULES = {
    "01_splitting": "autograder.checks.splitting",
    "02_gradient_averaging": "autograder.checks.gradient_averaging",
    "03_gpu0_imbalance": "autograder.checks.gpu0_imbalance",
    "04_checkpoints": "autograder.checks.checkpoints",
}
"""Assignment -> its check module. An assignment with no check module cannot be graded (a grader error)."""

MAX_ANSWER = 16_000_000
"""Characters of one kernel answer (its JSON text); a larger answer fails the cell."""

_REGISTRY: dict[str, dict[str, Callable]] = {}


COMMON_RULES = {
    "the function is not defined: run its cell": "関数が定義されていません：そのセルを実行してください",
    "the function raised an exception on one of the grader's inputs": (
        "採点の入力のひとつで、関数が例外を送出しました"
    ),
    "the function returned a value the grader cannot read": "関数が、採点で読み取れない値を返しました",
    "the notebook's code raised an exception while the grader ran it": (
        "採点の実行中に、ノートブックのコードが例外を送出しました"
    ),
}
"""Rules of every check module (their learner-facing texts, English -> Japanese)."""
RAISED = "the function raised an exception on one of the grader's inputs"
RAISED_ON = f"{RAISED}, breaking: "  # + the rule or case the input belongs to (``raised_on``)


def raised_on(rule: str) -> str:
    """The rule a failure names when the call on an input of ``rule`` (a rule's statement or case) raised."""
    return RAISED_ON + rule


class CheckFailed(Exception):
    """The learner's answer is wrong (or missing, or the kernel did not answer): the cell scores 0.

    ``rule``: which rule or case failed, for the learner's feedback (module docstring); None when none is named.
    """

    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message)
        self.rule = rule


class TooSlow(CheckFailed):
    """The kernel stopped a call past the seconds it was given (``Session.calls``): ``index``, which call."""

    def __init__(self, index: int, seconds: float):
        super().__init__(f"call {index + 1} took longer than {seconds:g} s")
        self.index, self.seconds = index, seconds


def expect(condition, message: str, rule: str | None = None) -> None:
    """Raise ``CheckFailed(message, rule)`` unless ``condition`` is true (a real ``bool``, computed by the grader).
    ``message`` is for the instructor, ``rule`` for the learner (module docstring)."""
    if condition is not True:
        raise CheckFailed(message, rule)


def cell_rule(grade_id: str, module_name: str) -> str | None:
    """What graded cell ``grade_id`` tests, as a rule (``CELL_RULES`` of its check module): named by feedback when
    a failure names no rule of its own."""
    import sys

    return getattr(sys.modules.get(module_name), "CELL_RULES", {}).get(grade_id)


def failure_rule(failure: CheckFailed, grade_id: str, module_name: str) -> dict[str, str] | None:
    """``{language: text}`` of the rule a failure of graded cell ``grade_id`` names for the learner: its own rule,
    else what its cell tests; None when neither is a catalogue text (``rule_texts``)."""
    return rule_texts(getattr(failure, "rule", None) or cell_rule(grade_id, module_name), module_name)


def rule_texts(rule: str | None, module_name: str) -> dict[str, str] | None:
    """``{language: text}`` of a failure's ``rule`` when it is a text of a fixed catalogue: the ``RULES`` of check
    module ``module_name``, ``COMMON_RULES``, or gpulab's exercise texts (a visible case's ``why``); None for any
    other text (then feedback names no rule)."""
    if type(rule) is not str or not rule:
        return None
    if rule.startswith(RAISED_ON):  # an exception on an input of a named rule: both parts from the catalogue
        broken = rule_texts(rule[len(RAISED_ON) :], module_name)
        if broken is None:
            return None
        return {"en": rule, "ja": f"{COMMON_RULES[RAISED]}。破られた規則：{broken['ja']}"}
    import sys

    from gpulab import check as gpulab_check
    from gpulab import messages

    module = sys.modules.get(module_name)
    for catalogue in (getattr(module, "RULES", {}), COMMON_RULES):
        if rule in catalogue:
            return {"en": rule, "ja": catalogue[rule]}
    gpulab_check._registry()  # loads the exercises' texts
    if rule in messages.TEXTS.get("ja", {}):
        return {"en": rule, "ja": messages.TEXTS["ja"][rule]}
    return None


def check(grade_id: str):
    """Register ``fn(session) -> None`` as the verdict of the graded test cell ``grade_id`` of its module."""

    def register(fn):
        module = _REGISTRY.setdefault(fn.__module__, {})
        if grade_id in module:
            raise ValueError(f"two checks for {grade_id!r} in {fn.__module__}")
        module[grade_id] = fn
        return fn

    return register


def checks_for(assignment: str, modules: dict[str, str] | None = None) -> dict[str, Callable] | None:
    """``{grade_id: check}`` of an assignment, or ``None`` when it has no check module (then it cannot be graded).
    ``modules``: more ``assignment -> module`` entries, over ``MODULES`` (the grader's ``check_modules`` option)."""
    name = {**MODULES, **(modules or {})}.get(assignment)
    if name is None:
        return None
    importlib.import_module(name)
    return dict(_REGISTRY.get(name, {}))


@dataclass(frozen=True)
class Outcome:
    """What one call of a notebook function did, as plain data decoded in the grader's process."""

    name: str
    missing: bool = False
    raised: str | None = None  # the exception's class name
    raised_types: tuple[str, ...] = ()  # the names of its class's MRO
    unencodable: str | None = None
    returned: object = None
    args_after: object = None  # [args, kwargs] after the call, when asked for
    returned_an_argument: bool = False  # the value returned is one of the call's arguments (when asked for)

    @property
    def value(self):
        """The decoded return value; ``CheckFailed`` if the name is missing, the call raised or its value could
        not be encoded."""
        if self.missing:
            raise CheckFailed(f"{self.name} is not defined: run its cell", "the function is not defined: run its cell")
        if self.raised is not None:
            raise CheckFailed(
                f"{self.name} raised {self.raised}", "the function raised an exception on one of the grader's inputs"
            )
        if self.unencodable is not None:
            raise CheckFailed(
                f"{self.name} returned a value the grader cannot read: {self.unencodable}",
                "the function returned a value the grader cannot read",
            )
        return self.returned


def _torch():
    import torch

    return torch


def uses(*helpers: Callable) -> Callable[[Callable], Callable]:
    """Mark a probe as calling ``helpers`` (top-level functions of its module): ``Session.run`` sends their source
    along with the probe's, so that probes share helpers instead of each carrying its own copy."""

    def mark(probe: Callable) -> Callable:
        probe.probe_helpers = helpers
        return probe

    return mark


def probe_source(probe: Callable) -> str:
    """The code that defines ``probe`` and its ``@uses`` helpers in the kernel, decorators left out."""
    parts = []
    for function in (*getattr(probe, "probe_helpers", ()), probe):
        if "<locals>" in function.__qualname__ or function.__qualname__ != function.__name__:
            raise TypeError(f"{function.__qualname__}: a probe and its helpers must be top-level functions")
        (definition,) = ast.parse(inspect.getsource(function)).body
        definition.decorator_list = []
        parts.append(ast.unparse(definition))
    # Annotations stay unevaluated: the kernel's namespace has none of the names they use.
    return "from __future__ import annotations\n\n\n" + "\n\n\n".join(parts) + "\n"


class Session:
    """One check's access to the graded notebook's kernel and working copy (subclasses move the requests)."""

    def __init__(self, submission: Path, rng: random.Random | None = None):
        self.submission = Path(submission)
        self.rng = rng if rng is not None else random.Random(int.from_bytes(os.urandom(16), "big"))
        self._workdir: Path | None = None
        # What the check lets the learner's feedback show, as plain JSON data the grader made (a quiz verdict:
        # ``checks/quiz.py``), whether the check passes or fails; kept in the cell's record as ``feedback``.
        self.feedback: dict | None = None

    # ---------------------------------------------------------------------------------------- transport
    def _request(self, request: dict) -> dict:
        """Send one request, return the decoded ``result`` dict of exactly one answer (subclasses)."""
        raise NotImplementedError

    @staticmethod
    def _parse(text_or_tree) -> dict:
        text = text_or_tree if isinstance(text_or_tree, str) else json.dumps(text_or_tree)
        if len(text) > MAX_ANSWER:
            raise CheckFailed(f"the kernel's answer is larger than {MAX_ANSWER} characters")
        try:
            result = json.loads(text)
        except (ValueError, RecursionError) as error:
            raise CheckFailed("the kernel's answer is malformed") from error
        if type(result) is not dict:
            raise CheckFailed("the kernel's answer is malformed")
        if "error" in result:
            raise CheckFailed(f"the grader's request failed in the kernel: {str(result['error'])[:300]}")
        return result

    # ---------------------------------------------------------------------------------------- calls
    def call(self, name: str, *args, **kwargs) -> Outcome:
        """Call the notebook's global ``name(*args, **kwargs)`` in the kernel (plain encodable arguments)."""
        return self.calls(name, [(args, kwargs)])[0]

    def calls(
        self,
        name: str,
        calls: list,
        *,
        args_after: bool = False,
        fresh: bool = False,
        adapters: list | None = None,
        seconds: list | None = None,
    ) -> list[Outcome]:
        """Several calls of ``name`` in one round trip: ``calls`` is ``[(args, kwargs), ...]``. With
        ``args_after``, each ``Outcome.args_after`` is ``[args, kwargs]`` as they were after the call; with
        ``fresh``, each ``Outcome.returned_an_argument`` says whether the value returned was one of them. With
        ``adapters`` (one per call: ``"gpulab.module:function"`` or None), a call runs that function of gpulab on
        ``name`` and the arguments instead (``gpulab.check.Rule.adapter``). With ``seconds`` (one per call, or
        None), the kernel stops a call past its seconds and makes no later one: ``TooSlow``."""
        torch = _torch()
        encoded = [[wire.encode(list(args), torch), wire.encode(dict(kwargs), torch)] for args, kwargs in calls]
        request = {"kind": "calls", "name": name, "calls": encoded, "args_after": args_after, "fresh": fresh}
        if adapters is not None:
            request["adapters"] = list(adapters)
        if seconds is not None:
            request["seconds"] = [float(s) if s else None for s in seconds]
        result = self._request(request)
        if result.get("missing") is True:
            return [Outcome(name, missing=True) for _ in calls]
        if "too_slow" in result and seconds is not None:
            index = result["too_slow"]
            if type(index) is not int or not 0 <= index < len(calls) or not seconds[index]:
                raise CheckFailed("the kernel's answer is malformed")
            raise TooSlow(index, seconds[index])
        entries = result.get("outcomes")
        if type(entries) is not list or len(entries) != len(calls) or any(type(e) is not dict for e in entries):
            raise CheckFailed("the kernel's answer is malformed")
        return [self._outcome(name, entry, torch, args_after, fresh) for entry in entries]

    @staticmethod
    def _outcome(name: str, entry: dict, torch, args_after: bool = False, fresh: bool = False) -> Outcome:
        try:
            if "args_after" in entry and not args_after:
                raise WireError("arguments sent back that the grader did not ask for")
            if fresh and "value" in entry and type(entry.get("returned_an_argument")) is not bool:
                raise WireError("no word on whether the value returned is an argument")
            returned_an_argument = fresh and entry.get("returned_an_argument") is True
            after = wire.decode(entry["args_after"], torch) if "args_after" in entry else None
            if "raised" in entry:
                types = entry["raised"]
                if type(types) is not list or not types or any(type(t) is not str for t in types):
                    raise WireError("malformed exception")
                return Outcome(name, raised=types[0], raised_types=tuple(types), args_after=after)
            if "unencodable" in entry:
                return Outcome(name, unencodable=str(entry["unencodable"])[:200], args_after=after)
            returned = wire.decode(entry["value"], torch)
            return Outcome(name, returned=returned, args_after=after, returned_an_argument=returned_an_argument)
        except (KeyError, WireError) as error:
            raise CheckFailed(f"the kernel's answer is malformed: {error}") from error

    def run(self, probe: Callable, **inputs):
        """Run ``probe(notebook_globals, workdir, **inputs)`` in the kernel; its decoded return value.

        ``probe`` must be a top-level function of a check module, importing what it needs (standard library,
        torch) inside its body; so must the helpers it names with ``@uses``, which are defined before it in the
        kernel. If it raises, the check fails with the exception's name.
        """
        torch = _torch()
        request = {
            "kind": "probe",
            "name": probe.__name__,
            "source": probe_source(probe),
            "inputs": wire.encode(dict(inputs), torch),
            "workdir": str(self.workdir),
        }
        result = self._request(request)
        if "raised" in result:
            raised = result["raised"]
            name = raised[0] if type(raised) is list and raised and type(raised[0]) is str else "an exception"
            raise CheckFailed(
                f"{name} while the grader ran {probe.__name__}: {str(result.get('message'))[:200]}",
                "the notebook's code raised an exception while the grader ran it",
            )
        if "value" not in result:
            raise CheckFailed("the kernel's answer is malformed")
        try:
            return wire.decode(result["value"], torch)
        except WireError as error:
            raise CheckFailed(f"the kernel's answer is malformed: {error}") from error

    # ---------------------------------------------------------------------------------------- files
    @property
    def workdir(self) -> Path:
        """A fresh folder inside the submission's working copy for this check (the same path in the kernel), open
        to the kernel's user by its mode (``files.open_to_kernel``): no owner is changed while the kernel runs,
        so no path the kernel can swap for a link is ever handed to ``chown``."""
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix=".grader-check-", dir=self.submission))
            files.open_to_kernel(self._workdir)
        return self._workdir

    def read_bytes(self, relative: str, limit: int = files.MAX_FILE) -> bytes:
        """A file under ``workdir``, read from the grader's process: no symlink, regular files only, capped."""
        return files.read_bytes(self.workdir, relative, limit)

    def listdir(self, relative: str = ".") -> list[str]:
        """The names in a folder under ``workdir`` (sorted; no symlink followed)."""
        return files.listdir(self.workdir, relative)

    def load_weights(self, relative: str, limit: int = files.MAX_FILE):
        """``torch.load(..., weights_only=True)`` of a file under ``workdir`` read as ``read_bytes`` does."""
        return files.load_weights(self.read_bytes(relative, limit))

    def write_bytes(self, relative: str, data: bytes) -> Path:
        """Plant a file under ``workdir`` (e.g. a malicious checkpoint), readable by the kernel; its path."""
        return files.write_bytes(self.workdir, relative, data)

    def make_folder(self, relative: str) -> Path:
        """A folder under ``workdir`` the kernel can write in; its path (the same in the kernel)."""
        return files.make_folder(self.workdir, relative)

    def close(self) -> None:
        """Remove the check's folder."""
        if self._workdir is not None:
            from autograder.sandbox import remove_tree

            remove_tree(self._workdir)
            self._workdir = None


class LocalSession(Session):
    """A session without a kernel, for unit tests of checks: requests run in ``namespace`` in this process,
    through the same encoder, JSON text and decoder as a kernel's answer."""

    def __init__(self, namespace: dict, submission: Path, rng: random.Random | None = None):
        super().__init__(submission, rng)
        self.namespace = namespace

    def _request(self, request: dict) -> dict:
        request = json.loads(json.dumps(request))
        try:
            result = wire.serve(request, self.namespace, _torch())
        except Exception as error:  # noqa: BLE001 - as the kernel stub reports it
            result = {"error": f"{type(error).__name__}: {error}"}
        return self._parse(json.dumps(result))


def new_nonce() -> str:
    """A per-request tag of a kernel answer."""
    return secrets.token_hex(16)
