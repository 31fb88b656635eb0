"""Lesson 01 (``01_splitting``): the verdicts of its graded test cells, decided in the grader's process.

``chunk_sizes`` and ``device_of_sample`` are judged by their exercises' rules (``gpulab.exercises.splitting``,
``rules.enforce``): the rules' visible inputs (the ones the learner's cell asserts) and hidden ones drawn with
``session.rng``, against references computed here from PyTorch (``Tensor.chunk``: what DataParallel's scatter
does), with the rules' own comparisons. ``split_batch``'s checks run its visible and hidden cases, and probes
for what only the kernel can show (an object repeated as itself, a split on the grader's GPUs).
"""

from __future__ import annotations

import torch

from autograder.checks import CheckFailed, Opaque, check, expect
from autograder.checks.rules import enforce
from autograder.checks.wire import ForeignReal


# --------------------------------------------------------------------------------------------- references
def reference_device(index: int, batch_size: int, n_devices: int) -> int:
    return next(d for d, piece in enumerate(torch.arange(batch_size).chunk(n_devices)) if index in piece.tolist())


def reference_split(batch, n: int):
    if type(batch) is torch.Tensor:
        return list(batch.chunk(n))
    if type(batch) in (tuple, list) and len(batch) > 0:
        return [type(batch)(parts) for parts in zip(*(reference_split(item, n) for item in batch), strict=False)]
    if type(batch) is dict and len(batch) > 0:
        return [
            dict(zip(batch, parts, strict=True))
            for parts in zip(*(reference_split(v, n) for v in batch.values()), strict=False)
        ]
    return [batch for _ in range(n)]


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


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


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
def _expect_split(outcome, batch, n: int, what: str) -> None:
    got = outcome.value
    expect(type(got) is list, "split_batch must return a list")
    expect(plain(got) == plain(reference_split(batch, n)), what)


def split_on_gpus(notebook, workdir, values, n):
    """Probe: ``split_batch`` of a CUDA tensor (on machines with two GPUs or more); the pieces, on the CPU."""
    import torch

    if torch.cuda.device_count() < 2:
        return None
    pieces = notebook["split_batch"](torch.tensor(values, device="cuda:0"), n)
    return [piece.cpu() if type(piece) is torch.Tensor else piece for piece in list(pieces)]


@check("split_batch_tensors")
def split_batch_tensors(session) -> None:
    x = torch.arange(20).reshape(10, 2)
    (visible,) = session.calls("split_batch", [((x, 3), {})])
    pieces = visible.value
    expect(type(pieces) is list and len(pieces) == 3, "a tensor is chunked along dim 0")
    expect(all(type(p) is torch.Tensor for p in pieces), "each chunk is a tensor")
    expect([len(p) for p in pieces] == [4, 4, 2], "a tensor is chunked along dim 0")
    expect(pieces[2].tolist() == [[16, 17], [18, 19]], "the last chunk holds the last rows, in order")
    generator = torch.Generator().manual_seed(1)
    sizes = [(1, 1), (7, 2), (12, 3), (13, 4), (3, 8), (2, 4), (64, 2)]
    sizes += [(session.rng.randint(1, 100), session.rng.randint(1, 9)) for _ in range(4)]
    batches = [(torch.randint(0, 1000, (b, 3), generator=generator), n) for b, n in sizes]
    outcomes = session.calls("split_batch", [((x, n), {}) for x, n in batches], args_after=True)
    for (x, n), outcome in zip(batches, outcomes, strict=True):
        got = outcome.value
        want = x.chunk(n)
        expect(type(got) is list, "return a list")
        expect(len(got) == len(want), f"{len(x)} samples on {n} devices give {len(want)} chunks")
        expect(all(type(p) is torch.Tensor for p in got), "each chunk is a tensor")
        expect([p.tolist() for p in got] == [p.tolist() for p in want], f"chunks of {len(x)} over {n}")
        expect(plain(outcome.args_after[0][0]) == plain(x), "split_batch must not modify the batch")
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


def _random_nested(rng, b: int, depth: int = 0):
    """A random batch of ``b`` samples: tensors in tuples, lists and dicts, nested."""
    kind = rng.choice(["tensor", "tuple", "list", "dict"] if depth < 2 else ["tensor"])
    if kind == "tensor":
        return torch.randint(0, 100, (b, rng.randint(1, 3)))
    items = [_random_nested(rng, b, depth + 1) for _ in range(rng.randint(1, 3))]
    if kind == "dict":
        return {f"k{rng.randint(0, 99)}_{i}": item for i, item in enumerate(items)}
    return tuple(items) if kind == "tuple" else items


@check("split_batch_containers")
def split_batch_containers(session) -> None:
    x, y = torch.arange(20).reshape(10, 2), torch.arange(10)
    a, b = torch.arange(30).reshape(10, 3), torch.arange(10) * 7
    cases = [
        ((x, y), 2),
        ({"inputs": x, "labels": y}, 3),
        ((a, b), 3),
        ([a, b], 4),
        ({"z": a, "a": b}, 3),
        ((a, [b, {"k": a}]), 2),
        ({"pair": (a, b), "list": [b]}, 4),
        ((a[:3].clone(), b[:3].clone()), 5),
    ]
    cases += [(_random_nested(session.rng, session.rng.randint(1, 12)), session.rng.randint(1, 6)) for _ in range(4)]
    outcomes = session.calls("split_batch", [((batch, n), {}) for batch, n in cases])
    for (batch, n), outcome in zip(cases, outcomes, strict=True):
        _expect_split(outcome, batch, n, f"nested split over {n} devices")


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
    n = session.rng.randint(2, 9)
    cases = [("mean", 3), (None, 2), (3.5, 4), ("sum", n), ((torch.arange(3), "sum", 2), 8), (torch.arange(1), 4)]
    outcomes = session.calls("split_batch", [((batch, n), {}) for batch, n in cases])
    for (batch, n), outcome in zip(cases, outcomes, strict=True):
        _expect_split(outcome, batch, n, f"split_batch({_show(batch)}, {n})")
    (tiny,) = session.calls("split_batch", [((torch.arange(2), 4), {})])
    got = tiny.value
    expect(type(got) is list and len(got) == 2, "2 samples on 4 devices: only 2 devices receive data")
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
