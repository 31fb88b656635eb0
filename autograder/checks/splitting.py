"""Lesson 01 (``01_splitting``): the verdicts of its graded test cells, decided in the grader's process.

Each check runs the cell's visible cases (``gpulab.check.cases``, the same the learner's cell asserts) and its
hidden ones (fixed edge cases and inputs drawn from ``session.rng``), and compares what the notebook's functions
return with references computed here from PyTorch (``Tensor.chunk``: what DataParallel's scatter does).
"""

from __future__ import annotations

import torch
from gpulab import check as gpulab_check
from gpulab.check import Raises

from autograder.checks import check, expect
from autograder.checks.quiz import register_quiz
from autograder.checks.wire import ForeignReal

# What a learner reads when a check fails (English -> Japanese): which rule or case, never the hidden input.
RULES = {
    "chunk_sizes returns a list of ints": "chunk_sizesはintのリストを返します",
    "a batch that divides evenly over the devices": "デバイス数で割り切れるバッチ",
    "an uneven batch, e.g. 7 samples over 4 devices: [2, 2, 2, 1]": (
        "割り切れないバッチ（例：4台のデバイスに7サンプルなら[2, 2, 2, 1]）"
    ),
    "2 samples on 4 devices: only two devices receive one sample each": (
        "4台のデバイスに2サンプル：1サンプルずつ受け取るのは2台だけです"
    ),
    "fewer samples than devices: only some devices receive a chunk": (
        "デバイスよりサンプルが少ない場合：チャンクを受け取るのは一部のデバイスだけです"
    ),
    "batch_size < 1 must raise ValueError": "batch_sizeが1未満ならValueErrorを送出します",
    "n_devices < 1 must raise ValueError": "n_devicesが1未満ならValueErrorを送出します",
    "device_of_sample returns an int": "device_of_sampleはintを返します",
    "the device of each sample of a batch that divides evenly": "割り切れるバッチの各サンプルのデバイス",
    "the device of each sample of an uneven batch (the last chunk is shorter)": (
        "割り切れないバッチ（最後のチャンクが短い）の各サンプルのデバイス"
    ),
    "an index past the end of the batch must raise IndexError": (
        "バッチの末尾を超えるインデックスならIndexErrorを送出します"
    ),
    "a negative index must raise IndexError": "負のインデックスならIndexErrorを送出します",
    "split_batch returns a list": "split_batchはリストを返します",
    "a tensor is chunked along dim 0": "テンソルは次元0に沿ってチャンクに分けます",
    "each chunk is a tensor": "各チャンクはテンソルです",
    "the last chunk holds the last rows, in order": "最後のチャンクには最後の行が順番どおりに入ります",
    "as many chunks as Tensor.chunk makes": "チャンクの数はTensor.chunkと同じです",
    "each chunk holds its rows of the batch, in order": "各チャンクにはバッチの該当する行が順番どおりに入ります",
    "split_batch must not modify the batch": "split_batchはバッチを変更してはいけません",
    "the same chunks as DataParallel's scatter on GPUs": "GPU上のDataParallelのscatterと同じチャンク",
    "tensors inside tuples, lists and dicts (nested) are split one by one, each container keeping its type": (
        "タプル・リスト・辞書（入れ子も）の中のテンソルは1つずつ分割し、各コンテナは型を保ちます"
    ),
    "an object that is neither a tensor nor a container is repeated for every device": (
        "テンソルでもコンテナでもないオブジェクトは、デバイスごとに繰り返します"
    ),
    "2 samples on 4 devices: only 2 devices receive data": "4台のデバイスに2サンプル：データを受け取るのは2台だけです",
    "other objects are repeated (the same object) per device": (
        "その他のオブジェクトは、デバイスごとに（同じオブジェクトを）繰り返します"
    ),
}


# --------------------------------------------------------------------------------------------- references
def reference_sizes(batch_size: int, n_devices: int) -> list[int]:
    return [len(piece) for piece in torch.arange(batch_size).chunk(n_devices)]


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


def _int(value) -> bool:
    # the tests this replaces took any numbers.Integral but bool: numpy's ints arrive as wire.ForeignInt
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value) -> bool:
    return type(value) is list and all(_int(v) for v in value)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _expect_raises(outcome, error: str, call: str, rule: str) -> None:
    if outcome.missing:
        outcome.value  # noqa: B018 - raises CheckFailed: not defined
    expect(error in outcome.raised_types, f"{call} should raise {error}", rule)


def _uneven(batch_size: int, n_devices: int) -> str:
    """The rule a batch of ``batch_size`` over ``n_devices`` is a case of (evenly divided or not)."""
    if batch_size % n_devices == 0:
        return "a batch that divides evenly over the devices"
    return "an uneven batch, e.g. 7 samples over 4 devices: [2, 2, 2, 1]"


def _invalid(values: tuple, rules: tuple[str, ...]) -> str:
    """The rule an invalid call breaks: ``rules[i]`` for the first argument ``values[i]`` below 1."""
    return next((rule for value, rule in zip(values, rules, strict=False) if value < 1), rules[-1])


# --------------------------------------------------------------------------------------------- chunk_sizes
def _visible(session, name: str) -> None:
    """The learner's visible cases of ``name`` (what its cell asserts), in one round trip."""
    cases = gpulab_check.cases(name)
    outcomes = session.calls(name, [(case.args, case.kwargs) for case in cases])
    for case, outcome in zip(cases, outcomes, strict=True):
        call = f"{name}{case.args}"
        if isinstance(case.expected, Raises):
            _expect_raises(outcome, case.expected.error.__name__, call, case.why)
        else:
            got = outcome.value
            expect(
                plain(got) == plain(case.expected), f"{call} returned {_show(got)}, expected {case.expected}", case.why
            )


_RETURNS_INTS = "chunk_sizes returns a list of ints"


@check("chunk_sizes_sizes")
def chunk_sizes_sizes(session) -> None:
    _visible(session, "chunk_sizes")
    pairs = [(b, n) for b in [1, 2, 3, 5, 7, 10, 11, 13, 16, 17, 31, 64, 97, 100] for n in [1, 2, 3, 4, 5, 7, 8]]
    pairs = [(b, n) for b, n in pairs if b >= n]
    for _ in range(20):
        n = session.rng.randint(1, 16)
        pairs.append((session.rng.randint(n, 600), n))
    outcomes = session.calls("chunk_sizes", [((b, n), {}) for b, n in pairs])
    for (b, n), outcome in zip(pairs, outcomes, strict=True):
        got = outcome.value
        expect(type(got) is list, f"chunk_sizes must return a list, got {type(got).__name__}", _RETURNS_INTS)
        expect(_int_list(got), "chunk_sizes must return a list of ints", _RETURNS_INTS)
        expect(got == reference_sizes(b, n), f"chunk_sizes({b}, {n})", _uneven(b, n))


@check("chunk_sizes_tiny_and_invalid")
def chunk_sizes_tiny_and_invalid(session) -> None:
    (tiny,) = session.calls("chunk_sizes", [((2, 4), {})])
    tiny_rule = "2 samples on 4 devices: only two devices receive one sample each"
    expect(plain(tiny.value) == plain([1, 1]), tiny_rule, tiny_rule)
    pairs = [(b, n) for b in [1, 2, 3, 5, 6] for n in [4, 6, 7, 8, 16]]
    for _ in range(10):
        n = session.rng.randint(2, 64)
        pairs.append((session.rng.randint(1, n - 1), n))
    bad = [(0, 2), (3, 0), (0, 1), (-3, 2), (5, -1), (0, 0)]
    bad += [(-session.rng.randint(1, 1000), session.rng.randint(1, 8)), (session.rng.randint(1, 50), 0)]
    outcomes = session.calls("chunk_sizes", [((b, n), {}) for b, n in pairs + bad])
    for (b, n), outcome in zip(pairs, outcomes[: len(pairs)], strict=True):
        got = outcome.value
        expect(type(got) is list and all(isinstance(v, int) for v in got), f"chunk_sizes({b}, {n})", _RETURNS_INTS)
        expect(
            [int(v) for v in got] == reference_sizes(b, n),
            f"chunk_sizes({b}, {n})",
            "fewer samples than devices: only some devices receive a chunk",
        )
    rules = ("batch_size < 1 must raise ValueError", "n_devices < 1 must raise ValueError")
    for pair, outcome in zip(bad, outcomes[len(pairs) :], strict=True):
        _expect_raises(outcome, "ValueError", f"chunk_sizes{pair}", _invalid(pair, rules))


# --------------------------------------------------------------------------------------------- device_of_sample
@check("device_of_sample_devices")
def device_of_sample_devices(session) -> None:
    _visible(session, "device_of_sample")
    sizes = [(b, n) for b in [1, 2, 5, 7, 10, 13, 64, 99] for n in [1, 2, 3, 4, 8]]
    sizes += [(session.rng.randint(1, 300), session.rng.randint(1, 12)) for _ in range(4)]
    triples = [(i, b, n) for b, n in sizes for i in range(b)]
    outcomes = session.calls("device_of_sample", [(triple, {}) for triple in triples])
    for (i, b, n), outcome in zip(triples, outcomes, strict=True):
        got = outcome.value
        expect(_int(got), "return an int", "device_of_sample returns an int")
        if b % n == 0:
            rule = "the device of each sample of a batch that divides evenly"
        elif b < n:
            rule = "fewer samples than devices: only some devices receive a chunk"
        else:
            rule = "the device of each sample of an uneven batch (the last chunk is shorter)"
        expect(got == reference_device(i, b, n), f"device_of_sample({i}, {b}, {n})", rule)


@check("device_of_sample_out_of_range")
def device_of_sample_out_of_range(session) -> None:
    bad = [(64, 64, 2), (-1, 64, 2), (10, 10, 3), (11, 10, 3), (-5, 10, 3), (1, 1, 4), (-1, 1, 1)]
    for _ in range(4):
        b = session.rng.randint(1, 200)
        bad += [(b + session.rng.randint(0, 50), b, session.rng.randint(1, 8))]
        bad += [(-session.rng.randint(1, 50), b, session.rng.randint(1, 8))]
    outcomes = session.calls("device_of_sample", [(triple, {}) for triple in bad])
    for triple, outcome in zip(bad, outcomes, strict=True):
        rule = (
            "a negative index must raise IndexError"
            if triple[0] < 0
            else "an index past the end of the batch must raise IndexError"
        )
        _expect_raises(outcome, "IndexError", f"device_of_sample{triple}", rule)


# --------------------------------------------------------------------------------------------- split_batch
def _expect_split(outcome, batch, n: int, what: str, rule: str) -> None:
    got = outcome.value
    expect(type(got) is list, "split_batch must return a list", "split_batch returns a list")
    expect(plain(got) == plain(reference_split(batch, n)), what, rule)


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
    along = "a tensor is chunked along dim 0"
    expect(type(pieces) is list and len(pieces) == 3, along, along)
    expect(all(type(p) is torch.Tensor for p in pieces), "each chunk is a tensor", "each chunk is a tensor")
    expect([len(p) for p in pieces] == [4, 4, 2], along, along)
    last = "the last chunk holds the last rows, in order"
    expect(pieces[2].tolist() == [[16, 17], [18, 19]], last, last)
    generator = torch.Generator().manual_seed(1)
    sizes = [(1, 1), (7, 2), (12, 3), (13, 4), (3, 8), (2, 4), (64, 2)]
    sizes += [(session.rng.randint(1, 100), session.rng.randint(1, 9)) for _ in range(4)]
    batches = [(torch.randint(0, 1000, (b, 3), generator=generator), n) for b, n in sizes]
    outcomes = session.calls("split_batch", [((x, n), {}) for x, n in batches], args_after=True)
    for (x, n), outcome in zip(batches, outcomes, strict=True):
        got = outcome.value
        want = x.chunk(n)
        expect(type(got) is list, "return a list", "split_batch returns a list")
        expect(
            len(got) == len(want),
            f"{len(x)} samples on {n} devices give {len(want)} chunks",
            "as many chunks as Tensor.chunk makes",
        )
        expect(all(type(p) is torch.Tensor for p in got), "each chunk is a tensor", "each chunk is a tensor")
        expect(
            [p.tolist() for p in got] == [p.tolist() for p in want],
            f"chunks of {len(x)} over {n}",
            "each chunk holds its rows of the batch, in order",
        )
        unchanged = "split_batch must not modify the batch"
        expect(plain(outcome.args_after[0][0]) == plain(x), unchanged, unchanged)
    if torch.cuda.device_count() >= 2:  # the grader's GPUs: compare with DataParallel's own scatter
        from torch.nn.parallel import scatter

        for n in range(2, torch.cuda.device_count() + 1):
            values = torch.randn(11, 2).tolist()
            got = session.run(split_on_gpus, values=values, n=n)
            if got is None:  # the kernel sees fewer GPUs than the grader
                break
            want = [p.cpu().tolist() for p in scatter(torch.tensor(values, device="cuda:0"), list(range(n)))]
            scattered = "the same chunks as DataParallel's scatter on GPUs"
            expect(type(got) is list and all(type(p) is torch.Tensor for p in got), f"scatter over {n} GPUs", scattered)
            expect([p.tolist() for p in got] == want, f"scatter over {n} GPUs", scattered)


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
        _expect_split(
            outcome,
            batch,
            n,
            f"nested split over {n} devices",
            "tensors inside tuples, lists and dicts (nested) are split one by one, each container keeping its type",
        )


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
        if type(batch) is torch.Tensor:
            rule = "fewer samples than devices: only some devices receive a chunk"
        elif type(batch) is tuple:
            rule = (
                "tensors inside tuples, lists and dicts (nested) are split one by one, each container keeping its type"
            )
        else:
            rule = "an object that is neither a tensor nor a container is repeated for every device"
        _expect_split(outcome, batch, n, f"split_batch({_show(batch)}, {n})", rule)
    (tiny,) = session.calls("split_batch", [((torch.arange(2), 4), {})])
    got = tiny.value
    tiny_rule = "2 samples on 4 devices: only 2 devices receive data"
    expect(type(got) is list and len(got) == 2, tiny_rule, tiny_rule)
    repeated = session.run(repeats_an_object, n=3)
    same_object = "other objects are repeated (the same object) per device"
    expect(plain(repeated) == plain([3, ["changed"] * 3]), same_object, same_object)


# --------------------------------------------------------------------------------------------- quiz
register_quiz(__name__, "01_splitting")  # quiz_q1...: the declaration in gpulab.exercises.quizzes
