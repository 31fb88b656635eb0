"""Lesson 01 (``01_splitting``): the verdicts of its graded test cells, decided in the grader's process.

``chunk_sizes`` and ``device_of_sample`` are judged by their exercises' rules (``gpulab.exercises.splitting``,
``rules.enforce``): the rules' visible inputs (the ones the learner's cell asserts) and hidden ones drawn with
``session.rng``, against references computed here from PyTorch (``Tensor.chunk``: what DataParallel's scatter
does), with the rules' own comparisons. So is ``split_batch``, with two probes for what only the kernel can show:
an object of its own repeated as itself, and a split on the grader's GPUs (compared with ``scatter``).
"""

from __future__ import annotations

import torch

from autograder.checks import check, expect
from autograder.checks.quiz import register_quiz
from autograder.checks.rules import enforce, statement
from autograder.checks.wire import ForeignReal


# --------------------------------------------------------------------------------------------- references
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
            scattered = statement("split_batch", "tensors")  # the rule, on the grader's GPUs
            expect(type(got) is list and all(type(p) is torch.Tensor for p in got), f"scatter over {n} GPUs", scattered)
            expect([p.tolist() for p in got] == want, f"scatter over {n} GPUs", scattered)


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
    same_object = statement("split_batch", "others_and_tiny")  # any other object is repeated, itself
    expect(plain(repeated) == plain([3, ["changed"] * 3]), same_object, same_object)


# --------------------------------------------------------------------------------------------- quiz
register_quiz(__name__, "01_splitting")  # quiz_q1...: the declaration in gpulab.exercises.quizzes
