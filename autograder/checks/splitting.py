"""Lesson 01 (``01_splitting``): the verdicts of its graded test cells, decided in the grader's process.

``chunk_sizes`` and ``device_of_sample`` are judged by their exercises' rules (``gpulab.exercises.splitting``,
``rules.enforce``): the rules' visible inputs (the ones the learner's cell asserts) and hidden ones drawn with
``session.rng``, against references computed here from PyTorch (``Tensor.chunk``: what DataParallel's scatter
does), with the rules' own comparisons. So is ``split_batch``, with two probes for what only the kernel can show:
an object of its own repeated as itself, and a split on the grader's GPUs (compared with ``scatter``).
"""

from __future__ import annotations

import torch

from autograder.checks import CheckFailed, Opaque, check, expect
from autograder.checks.rules import enforce
from autograder.checks.wire import ForeignReal


# --------------------------------------------------------------------------------------------- references
def reference_device(index: int, batch_size: int, n_devices: int) -> int:
    return next(d for d, piece in enumerate(torch.arange(batch_size).chunk(n_devices)) if index in piece.tolist())


def plain(value):
    """Plain Python values: lists of numbers for tensors, the container types (exact) and dict order kept."""
    if type(value) is torch.Tensor:
        return ("tensor", value.tolist())
    if type(value) in (tuple, list):
        return (type(value).__name__, [plain(v) for v in value])
    if type(value) is dict:
        return ("dict", [(plain(k), plain(v)) for k, v in value.items()])
    if isinstance(value, (int, float)):  # bool and the wire's ForeignInt/ForeignFloat too, as == compares them
        return ("number", value.real)
    if isinstance(value, ForeignReal):
        return ("number", float(value))
    return ("object", type(value).__name__, value)


# --------------------------------------------------------------------------------------------- chunk_sizes
# The rules of chunk_sizes and device_of_sample, their inputs and references are declared once, in
# gpulab.exercises.splitting; the grader enforces them on their visible inputs and on hidden ones it draws.
@check("chunk_sizes_sizes")
def chunk_sizes_sizes(session) -> None:
    enforce(session, "chunk_sizes", "sizes")


@check("chunk_sizes_tiny_and_invalid")
def chunk_sizes_tiny_and_invalid(session) -> None:
    enforce(session, "chunk_sizes", "tiny_and_invalid")


# --------------------------------------------------------------------------------------------- device_of_sample
@check("device_of_sample_devices")
def device_of_sample_devices(session) -> None:
    enforce(session, "device_of_sample", "devices")


@check("device_of_sample_out_of_range")
def device_of_sample_out_of_range(session) -> None:
    enforce(session, "device_of_sample", "out_of_range")


# --------------------------------------------------------------------------------------------- split_batch
def split_on_gpus(notebook, workdir, values, n):
    """Probe: ``split_batch`` of a CUDA tensor (on machines with two GPUs or more); the pieces, on the CPU."""
    import torch

    if torch.cuda.device_count() < 2:
        return None
    pieces = notebook["split_batch"](torch.tensor(values, device="cuda:0"), n)
    return [piece.cpu() if type(piece) is torch.Tensor else piece for piece in list(pieces)]


@check("split_batch_tensors")
def split_batch_tensors(session) -> None:
    enforce(session, "split_batch", "tensors")
    if torch.cuda.device_count() >= 2:  # the grader's GPUs: compare with DataParallel's own scatter
        from torch.nn.parallel import scatter

        for n in range(2, torch.cuda.device_count() + 1):
            values = torch.randn(11, 2).tolist()
            got = session.run(split_on_gpus, values=values, n=n)
            if got is None:  # the kernel sees fewer GPUs than the grader
                break
            want = [p.cpu().tolist() for p in scatter(torch.tensor(values, device="cuda:0"), list(range(n)))]
            expect(type(got) is list and all(type(p) is torch.Tensor for p in got), f"scatter over {n} GPUs")
            expect([p.tolist() for p in got] == want, f"scatter over {n} GPUs")


@check("split_batch_containers")
def split_batch_containers(session) -> None:
    enforce(session, "split_batch", "containers")


def repeats_an_object(notebook, workdir, n):
    """Probe: ``split_batch`` of an arbitrary object (a ``SimpleNamespace`` holding ``tag="sent"``), whose tag is
    changed to ``"changed"`` after the call; the pieces' tags (``None`` for a piece of another type). Only the
    object itself, repeated, shows the change."""
    import types

    sentinel = types.SimpleNamespace(tag="sent")
    pieces = list(notebook["split_batch"](sentinel, n))
    sentinel.tag = "changed"
    return [len(pieces), [piece.tag if type(piece) is types.SimpleNamespace else None for piece in pieces]]


@check("split_batch_others_and_tiny")
def split_batch_others_and_tiny(session) -> None:
    enforce(session, "split_batch", "others_and_tiny")
    # The rule "any other object is repeated, itself": an object of the kernel's own cannot travel to the grader,
    # so whether the pieces are the object itself shows in the kernel, after the grader changed the object.
    repeated = session.run(repeats_an_object, n=3)
    expect(plain(repeated) == plain([3, ["changed"] * 3]), "other objects are repeated (the same object) per device")


# --------------------------------------------------------------------------------------------- quiz
def notebook_global(notebook, workdir, name):
    """Probe: the notebook's global ``name`` as plain data (``["missing"]`` when it is not defined)."""
    if name not in notebook:
        return ["missing"]
    return ["found", notebook[name]]


def _quiz(session, question: str):
    found = session.run(notebook_global, name="quiz_answers")
    expect(type(found) is list and len(found) == 2 and found[0] == "found", 'set quiz_answers = {"q1": ...}')
    answers = found[1]
    expect(type(answers) is dict and question in answers, 'set quiz_answers = {"q1": ..., "q2": ..., "q3": ...}')
    answer = answers[question]
    if type(answer) not in (str, int, float, bool):
        raise CheckFailed(f"{question}: answer with a number or a letter, not a {_type_name(answer)}")
    return str(answer).strip()


def _type_name(value) -> str:
    return value.type_name if type(value) is Opaque else type(value).__name__


@check("quiz_q1")
def quiz_q1(session) -> None:
    expect(_quiz(session, "q1") == str(len(torch.arange(7).chunk(4))), "q1: 7 over 4 is [2, 2, 2, 1]")


@check("quiz_q2")
def quiz_q2(session) -> None:
    want = reference_device(7, 10, 3)
    expect(_quiz(session, "q2") == str(want), "q2: 10 over 3 is [4, 4, 2]; sample 7 is on GPU 1")


@check("quiz_q3")
def quiz_q3(session) -> None:
    answer = _quiz(session, "q3").lower()
    expect(answer in {"a", "b", "c"}, "q3: a letter")
    expect(answer == "b", "q3: non-tensor arguments are repeated for every replica")
