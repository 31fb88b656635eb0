"""Attacks on the grading of lesson 03's ``LossInForward`` (cells ``loss_in_forward_value``, ``_gradients``,
``_memory``), driven without a kernel: ``LocalSession`` for answers, and ``ForgedSession`` for a kernel that runs the
rules' adapters honestly (``wire.serve``) and then rewrites its ``calls`` answer before it crosses the wire.

Each test asserts the secure behaviour: a forged or malformed answer fails its cell (``CheckFailed``), never passes
and never breaks the grader with another exception; a right answer is not marked down; a wrong answer loses a cell;
and the learner's self-check (``gpulab.check.run("LossInForward", cls)``) passes exactly when the grader takes no
cell. Seconds in all: the honest kernel answers the forgeries start from are computed once per request.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import random
import sys
import warnings
import zipfile
from collections.abc import Callable

import gpulab_solutions
import pytest
import torch
from torch import nn

from tests.local_checks import attacked_verdict, lesson_03_namespace
from tests.nbgrader_tools import REPO

sys.path.insert(0, str(REPO))
from autograder.checks import MAX_ANSWER, LocalSession, checks_for, wire  # noqa: E402
from autograder.checks.rules import _adapter_name  # noqa: E402

CELLS = ("loss_in_forward_value", "loss_in_forward_gradients", "loss_in_forward_memory")
CHECKS = checks_for("03_gpu0_imbalance")
SEED = 0
ADAPTERS = {
    "forward": "gpulab.exercises.gpu0_imbalance:forward_on_a_chunk",
    "mean": "gpulab.exercises.gpu0_imbalance:wrapped_mean_loss",
    "moved": "gpulab.exercises.gpu0_imbalance:parameters_after_moving_the_model",
    "gradients": "gpulab.exercises.gpu0_imbalance:gradients_after_backward",
    "gathered": "gpulab.exercises.gpu0_imbalance:gathered_on_device_0",
}
REFERENCE = lesson_03_namespace()
_HONEST: dict[str, dict] = {}


def _honest(request: dict) -> dict:
    """The reference notebook's honest ``calls`` answer to ``request`` (a fresh copy; computed once per request)."""
    key = json.dumps(request, sort_keys=True)
    if key not in _HONEST:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _HONEST[key] = wire.serve(request, REFERENCE, torch)
    return json.loads(json.dumps(_HONEST[key]))


class ForgedSession(LocalSession):
    """A kernel that runs the grader's ``calls`` (the rules' adapters around the reference ``LossInForward``)
    honestly, then answers ``forge(answer, request)`` instead: a dict (the answer's ``result``) or JSON text."""

    def __init__(self, tmp_path, forge: Callable, seed: int = SEED):
        super().__init__(REFERENCE, tmp_path, random.Random(seed))
        self.forge = forge

    def _request(self, request: dict) -> dict:
        request = json.loads(json.dumps(request))
        if request["kind"] != "calls":
            return super()._request(request)
        forged = self.forge(_honest(request), request)
        return self._parse(forged if isinstance(forged, str) else json.dumps(forged))


def verdict(grade_id: str, session) -> str:
    return attacked_verdict(CHECKS[grade_id], session)


# --------------------------------------------------------------------------------------------- forgery helpers
class Raw:
    """A wire tree sent as it is (what a hostile kernel's own encoder may write)."""

    def __init__(self, tree):
        self.tree = tree


def _payload(data: bytes) -> Raw:
    return Raw(["tensor", base64.b64encode(data).decode("ascii")])


def _saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _rezipped(data: bytes, compression=zipfile.ZIP_STORED, change: Callable | None = None) -> bytes:
    """``torch.save``'s archive ``data`` written again, its records compressed or one of them changed."""
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as archive:
        for name in source.namelist():
            record = source.read(name)
            archive.writestr(name, change(name, record) if change else record)
    return out.getvalue()


def _zip_version(data: bytes, version: int) -> bytes:
    """``data`` with the "version needed to extract" of its first central-directory record set to ``version``."""
    data = bytearray(data)
    at = data.find(b"PK\x01\x02")
    data[at + 6 : at + 8] = version.to_bytes(2, "little")
    return bytes(data)


def _pickled_global(name: str, record: bytes) -> bytes:
    """A ``data.pkl`` that calls ``colorsys.rgb_to_hsv(1, 1, 1)``: a module the grader never imports."""
    return b"ccolorsys\nrgb_to_hsv\n(K\x01K\x01K\x01tR." if name.endswith("data.pkl") else record


def _nested(value, depth: int):
    for _ in range(depth):
        value = [value]
    return value


def _tensors(change: Callable) -> Callable:
    """Apply ``change`` to every tensor inside a decoded value (lists, tuples and the gradients' names kept)."""

    def walk(value):
        if type(value) is torch.Tensor:
            return change(value)
        if type(value) in (list, tuple):
            return type(value)(walk(item) for item in value)
        return value

    return walk


def _values(transform: Callable, only: tuple[str, ...] | None = None, first: bool = False) -> Callable:
    """Rewrite the value of each outcome (of the adapters ``only`` names; only the first one with ``first``)."""

    def forge(answer: dict, request: dict) -> dict:
        done = False
        for outcome, adapter in zip(answer["outcomes"], request["adapters"], strict=True):
            if "value" not in outcome or (only and adapter not in [ADAPTERS[o] for o in only]) or done:
                continue
            outcome["value"] = _encode(transform(wire.decode(outcome["value"], torch)))
            done = first
        return answer

    return forge


def _encode(value):
    """``value`` as a wire tree, as a hostile kernel's own encoder may write it: containers at any depth and of any
    size, ``Raw`` trees as they are; leaves by ``wire.encode``."""
    if isinstance(value, Raw):
        return value.tree
    if type(value) in (list, tuple):
        return [type(value).__name__, [_encode(item) for item in value]]
    if type(value) is dict:
        return ["dict", [[_encode(key), _encode(item)] for key, item in value.items()]]
    return wire.encode(value, torch)


def _entries(change: Callable) -> Callable:
    """Rewrite each outcome entry: ``change(entry) -> entry``."""

    def forge(answer: dict, request: dict) -> dict:
        answer["outcomes"] = [change(dict(entry)) for entry in answer["outcomes"]]
        return answer

    return forge


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return torch.zeros(tensor.shape, dtype=torch.uint8).view(torch.bits8)


# Value forgeries: each makes every outcome of every cell wrong (or unreadable).
VALUE_FORGERIES = {
    "nan": _tensors(lambda t: torch.full_like(t, math.nan)),
    "inf": _tensors(lambda t: torch.full_like(t, math.inf)),
    "minus_inf": _tensors(lambda t: torch.full_like(t, -math.inf)),
    "negated": _tensors(lambda t: -t - 1),
    "bits8": _tensors(_bits),
    "complex": _tensors(lambda t: t.to(torch.complex64)),
    "int64": _tensors(lambda t: t.round().long()),
    "bool": _tensors(lambda t: t != 0),
    "float8": _tensors(lambda t: (t + 1000).to(torch.float8_e4m3fn)),
    "float4": _tensors(lambda t: torch.zeros(t.shape, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)),
    "empty": _tensors(lambda t: t.reshape(-1)[:0]),
    "zero_dim": _tensors(lambda t: t.sum().reshape(()) * 3 + 1),
    "unsqueezed": _tensors(lambda t: t.unsqueeze(-1)),
    "doubled": _tensors(lambda t: torch.cat([t.reshape(-1), t.reshape(-1)])),
    "as_lists": _tensors(lambda t: t.tolist()),
    "as_a_float": _tensors(lambda t: float(t.sum())),
    "as_a_string": _tensors(repr),
    "none": _tensors(lambda t: None),
    "in_a_tuple": _tensors(lambda t: (t,)),
    "in_a_dict": _tensors(lambda t: {"loss": t}),
    "opaque_tensor": _tensors(lambda t: Raw(["object", "torch.Tensor"])),
    "opaque_parameter": _tensors(lambda t: Raw(["object", "torch.nn.parameter.Parameter"])),
    "foreign_real": _tensors(lambda t: Raw(["number", ["float", float.hex(float(t.sum()))], "numpy.float32|real"])),
    "parameter_payload": _tensors(lambda t: _payload(_saved(nn.Parameter(t.clone())))),
    "expanded_payload": _tensors(lambda t: _payload(_saved(t.reshape(-1)[:1].expand(100_000)))),
    "compressed_payload": _tensors(lambda t: _payload(_rezipped(_saved(t), zipfile.ZIP_DEFLATED))),
    "not_a_zip": _tensors(lambda t: _payload(b"not a zip archive at all")),
    "not_base64": _tensors(lambda t: Raw(["tensor", "!!! not base64 !!!"])),
    "dict_payload": _tensors(lambda t: _payload(_saved({"loss": t}))),
    "pickled_global_payload": _tensors(lambda t: _payload(_rezipped(_saved(t), change=_pickled_global))),
    "nested_63": _tensors(lambda t: _nested(t, 63)),
    "nested_too_deep": _tensors(lambda t: _nested(t, 70)),
    "sparse_payload": _tensors(lambda t: _payload(_saved(t.to_sparse()))),
}

# The first outcome only (the answer stays under its size cap).
FIRST_VALUE_FORGERIES = {
    "many_nodes": lambda v: list(range(100_000)),
    "a_big_tensor": lambda v: torch.zeros(1_000_000),
    "many_dict_keys": lambda v: {i: 0 for i in range(1_001)},
    "colliding_int_keys": lambda v: {i * (2**61 - 1): 0 for i in range(1_000)},
    "a_huge_int": lambda v: Raw(["int", "9" * 5_000]),
    "a_float_overflow": lambda v: Raw(["float", "0x1p99999"]),
    "a_malformed_node": lambda v: Raw(["list"]),
    "an_unknown_tag": lambda v: Raw(["pickle", "gASV"]),
}


@pytest.mark.parametrize("forgery", sorted(VALUE_FORGERIES))
@pytest.mark.parametrize("grade_id", CELLS)
def test_a_forged_value_fails_the_cell(grade_id, forgery, tmp_path):
    assert verdict(grade_id, ForgedSession(tmp_path, _values(VALUE_FORGERIES[forgery]))) == "failed"


@pytest.mark.parametrize("forgery", sorted(FIRST_VALUE_FORGERIES))
@pytest.mark.parametrize("grade_id", CELLS)
def test_one_forged_value_fails_the_cell(grade_id, forgery, tmp_path):
    session = ForgedSession(tmp_path, _values(FIRST_VALUE_FORGERIES[forgery], first=True))
    assert verdict(grade_id, session) == "failed"


# --------------------------------------------------------------------------------------------- an unreadable zip
# ``wire.stored_records`` catches BadZipFile, ValueError and EOFError from ``zipfile.ZipFile``; Python's zipfile
# raises NotImplementedError ("zip file version 25.0") for a central-directory record that needs a newer version to
# extract (``zipfile._RealGetContents``). ``wire.decode`` lets it through (it wraps ValueError, OverflowError and
# RecursionError only), ``Session._outcome`` catches KeyError and WireError only: the check raises, and
# ``autograder/execute.py`` stops the grading with "grader error" instead of failing the cell.
@pytest.mark.parametrize("grade_id", CELLS)
def test_a_tensor_payload_of_a_newer_zip_version_fails_the_cell_not_the_grader(grade_id, tmp_path):
    forge = _values(_tensors(lambda t: _payload(_zip_version(_saved(t), 250))))
    assert verdict(grade_id, ForgedSession(tmp_path, forge)) == "failed"


def test_decoding_a_newer_zip_version_is_a_wire_error():
    with pytest.raises(wire.WireError):
        wire.decode(_payload(_zip_version(_saved(torch.zeros(1)), 250)).tree, torch)


# --------------------------------------------------------------------------------------------- the gradients' list
def _grads(change: Callable) -> Callable:
    """Rewrite the value of each ``gradients_after_backward`` outcome (``[[name, gradient], ...]``)."""
    return _values(change, only=("gradients",))


GRADIENT_FORGERIES = {
    "renamed": _grads(lambda v: [[name + "_", g] for name, g in v]),
    "named_as_the_wrapper": _grads(lambda v: [["model." + name, g] for name, g in v]),
    "reordered": _grads(lambda v: v[::-1]),
    "one_dropped": _grads(lambda v: v[:-1]),
    "one_more": _grads(lambda v: [*v, ["extra", torch.zeros(1)]]),
    "the_same_twice": _grads(lambda v: v + v),
    "empty": _grads(lambda v: []),
    "entries_as_tuples": _grads(lambda v: [tuple(entry) for entry in v]),
    "entries_of_three": _grads(lambda v: [[name, g, True] for name, g in v]),
    "as_a_dict": _grads(lambda v: {name: g for name, g in v}),
    "as_a_tuple": _grads(tuple),
    "names_opaque": _grads(lambda v: [[Raw(["object", "builtins.str"]), g] for name, g in v]),
    "names_as_tensors": _grads(lambda v: [[torch.zeros(2), g] for name, g in v]),
    "names_as_ints": _grads(lambda v: [[i, g] for i, (name, g) in enumerate(v)]),
    "gradients_none": _grads(lambda v: [[name, None] for name, g in v]),
    "gradients_as_lists": _grads(lambda v: [[name, g.tolist()] for name, g in v]),
    "gradients_doubled": _grads(lambda v: [[name, 2 * g] for name, g in v]),
    "gradients_halved": _grads(lambda v: [[name, g / 2] for name, g in v]),
    "gradients_zero": _grads(lambda v: [[name, torch.zeros_like(g)] for name, g in v]),
    "gradients_shifted_between_entries": _grads(
        lambda v: [[n, g] for (n, _), (_, g) in zip(v, v[1:] + v[:1], strict=True)]
    ),
    "gradients_transposed": _grads(lambda v: [[name, g.t() if g.dim() == 2 else g.unsqueeze(0)] for name, g in v]),
    "gradients_float64_nan": _grads(
        lambda v: [[name, torch.full_like(g, math.nan, dtype=torch.float64)] for name, g in v]
    ),
    "gradients_bits8": _grads(lambda v: [[name, _bits(g)] for name, g in v]),
    "gradients_int": _grads(lambda v: [[name, (g * 1e6).long()] for name, g in v]),
}


def _moved(change: Callable) -> Callable:
    """Rewrite the value of each ``parameters_after_moving_the_model`` outcome (a list of tensors)."""
    return _values(change, only=("moved",))


MOVED_FORGERIES = {
    "empty": _moved(lambda v: []),
    "as_a_tuple": _moved(tuple),
    "as_lists": _moved(lambda v: [t.tolist() for t in v]),
    "nested_once": _moved(lambda v: [v]),
    "as_a_dict": _moved(lambda v: {str(i): t for i, t in enumerate(v)}),
    "not_moved": _moved(lambda v: [t - 1000 for t in v]),
    "one_missing": _moved(lambda v: v[1:]),
    "subclass_payloads": _moved(lambda v: [_payload(_saved(nn.Parameter(t.clone()))) for t in v]),
    "bits8": _moved(lambda v: [_bits(t) for t in v]),
    "nan": _moved(lambda v: [torch.full_like(t, math.nan) for t in v]),
    "opaque": _moved(lambda v: [Raw(["object", "torch.Tensor"]) for t in v]),
}


@pytest.mark.parametrize("forgery", sorted(GRADIENT_FORGERIES))
def test_a_forged_gradient_list_fails_the_gradients_cell(forgery, tmp_path):
    assert verdict("loss_in_forward_gradients", ForgedSession(tmp_path, GRADIENT_FORGERIES[forgery])) == "failed"


@pytest.mark.parametrize("forgery", sorted(MOVED_FORGERIES))
def test_forged_parameters_after_moving_the_model_fail_the_gradients_cell(forgery, tmp_path):
    assert verdict("loss_in_forward_gradients", ForgedSession(tmp_path, MOVED_FORGERIES[forgery])) == "failed"


MEMORY_FORGERIES = {
    "the_outputs_gathered": _values(lambda v: torch.zeros(96, 6_000), only=("gathered",), first=True),
    "one_number": _values(lambda v: v.sum().reshape(1), only=("gathered",)),
    "chunk_means": _values(lambda v: v / 48, only=("gathered",)),
    "one_per_sample": _values(lambda v: v.repeat_interleave(3), only=("gathered",)),
    "swapped": _values(lambda v: v.flip(0) + torch.tensor([1.0, -1.0]), only=("gathered",)),
}


@pytest.mark.parametrize("forgery", sorted(MEMORY_FORGERIES))
def test_a_forged_gathered_value_fails_the_memory_cell(forgery, tmp_path):
    assert verdict("loss_in_forward_memory", ForgedSession(tmp_path, MEMORY_FORGERIES[forgery])) == "failed"


def test_the_value_cell_rejects_the_mean_of_chunk_means_and_a_scalar(tmp_path):
    """The value rules' own typical forgeries: a 0-dim forward value, a mean of chunk means."""
    zero_dim = _values(lambda v: v.reshape(()), only=("forward",))
    assert verdict("loss_in_forward_value", ForgedSession(tmp_path, zero_dim)) == "failed"
    off = _values(lambda v: v * 1.01 + 0.01, only=("mean",))
    assert verdict("loss_in_forward_value", ForgedSession(tmp_path, off)) == "failed"


# --------------------------------------------------------------------------------------------- the answer's frame
FRAME_FORGERIES = {
    "empty_result": lambda a, r: {},
    "outcomes_none": lambda a, r: {"outcomes": None},
    "outcomes_a_dict": lambda a, r: {"outcomes": {str(i): e for i, e in enumerate(a["outcomes"])}},
    "one_short": lambda a, r: {"outcomes": a["outcomes"][:-1]},
    "one_more": lambda a, r: {"outcomes": [*a["outcomes"], a["outcomes"][0]]},
    "reversed": lambda a, r: {"outcomes": a["outcomes"][::-1]},
    "first_answered_for_all": lambda a, r: {"outcomes": [a["outcomes"][0]] * len(a["outcomes"])},
    "entries_as_lists": lambda a, r: {"outcomes": [list(e.items()) for e in a["outcomes"]]},
    "missing": lambda a, r: {"missing": True},
    "missing_with_outcomes": lambda a, r: {**a, "missing": True},
    "an_error": lambda a, r: {"error": "KeyError: 'LossInForward'"},
    "an_error_deeply_nested": lambda a, r: '{"error": ' + "[" * 900 + "]" * 900 + "}",
    "a_list": lambda a, r: "[]",
    "not_json": lambda a, r: '{"outcomes": [',
    "nan_literal": lambda a, r: '{"outcomes": NaN}',
    "deep_json": lambda a, r: "[" * 100_000 + "]" * 100_000,
    "deep_json_in_outcomes": lambda a, r: '{"outcomes": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "too_large": lambda a, r: json.dumps({**a, "pad": "x" * MAX_ANSWER}),
    "raised_empty": _entries(lambda e: {"raised": []}),
    "raised_a_string": _entries(lambda e: {"raised": "ValueError"}),
    "raised_not_names": _entries(lambda e: {"raised": [1, 2]}),
    "raised_none_with_value": _entries(lambda e: {**e, "raised": None}),
    "raised_well_formed": _entries(lambda e: {"raised": ["ValueError", "Exception"]}),
    "raised_and_a_value": _entries(lambda e: {**e, "raised": ["RuntimeError"]}),
    "unencodable": _entries(lambda e: {"unencodable": "too large"}),
    "unencodable_nested": _entries(lambda e: {"unencodable": _nested("x", 600)}),
    "unencodable_and_a_value": _entries(lambda e: {**e, "unencodable": 0}),
    "no_value": _entries(lambda e: {}),
    "value_none_json": _entries(lambda e: {"value": None}),
    "value_a_bare_list": _entries(lambda e: {"value": []}),
    "args_after_unasked": _entries(lambda e: {**e, "args_after": wire.encode([[], {}], torch)}),
    "malformed_args_after": _entries(lambda e: {**e, "args_after": ["list"]}),
}


@pytest.mark.parametrize("forgery", sorted(FRAME_FORGERIES))
@pytest.mark.parametrize("grade_id", CELLS)
def test_a_malformed_answer_fails_the_cell(grade_id, forgery, tmp_path):
    assert verdict(grade_id, ForgedSession(tmp_path, FRAME_FORGERIES[forgery])) == "failed"


# --------------------------------------------------------------------------------------------- the channel itself
def test_the_reference_passes_through_the_forged_session_untouched(tmp_path):
    for grade_id in CELLS:
        assert verdict(grade_id, ForgedSession(tmp_path, lambda answer, request: answer)) == "passed"


def test_the_grader_asks_only_for_the_rules_own_gpulab_adapters(tmp_path):
    """Every call of every cell names one of the five adapters of the rules (the grader's own choice); the answer
    cannot change what the grader imports or runs: nothing of the answer is looked up by name in its process."""
    seen = []

    def spy(answer, request):
        seen.append((request["name"], list(request["adapters"]), len(request["calls"])))
        return answer

    for grade_id in CELLS:
        assert verdict(grade_id, ForgedSession(tmp_path, spy)) == "passed"
    assert [name for name, _, _ in seen] == ["LossInForward"] * 3
    assert all(len(adapters) == count for _, adapters, count in seen)
    assert {a for _, adapters, _ in seen for a in adapters} == set(ADAPTERS.values())
    from gpulab.check import exercise

    assert {_adapter_name(rule) for rule in exercise("LossInForward").rules} == set(ADAPTERS.values())


def test_a_pickled_global_in_a_tensor_payload_imports_nothing(tmp_path):
    already = "colorsys" in sys.modules
    forge = _values(VALUE_FORGERIES["pickled_global_payload"])
    assert verdict("loss_in_forward_value", ForgedSession(tmp_path, forge)) == "failed"
    assert ("colorsys" in sys.modules) == already


def test_the_references_are_the_same_after_hostile_answers(tmp_path):
    """The grader's references depend only on its inputs: decoding hostile answers changes none of them, nor the
    process's torch defaults."""
    from gpulab.check import exercise

    rules = exercise("LossInForward").rules
    name = "LossInForward"
    calls = [(rule, call) for rule in rules for call in gpulab_solutions.drawn_calls(name, rule, random.Random(SEED))]
    before = [gpulab_solutions.expected(name, rule, call) for rule, call in calls]
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    for forgery in ("parameter_payload", "pickled_global_payload", "sparse_payload", "float8", "nested_too_deep"):
        for grade_id in CELLS:
            verdict(grade_id, ForgedSession(tmp_path, _values(VALUE_FORGERIES[forgery])))
    assert (torch.get_default_dtype(), torch.is_grad_enabled()) == (dtype, grad)
    after = [gpulab_solutions.expected(name, rule, call) for rule, call in calls]
    from gpulab.check import same_values

    assert all(same_values(a, b) for a, b in zip(after, before, strict=True))


@pytest.mark.parametrize(
    "name",
    ["os:system", "builtins:eval", "gpulab:DataParallel", "gpulab.check:run x", "torch.nn:Module", "gpulabx.evil:f"],
)
def test_the_kernel_side_runs_no_adapter_outside_gpulab(name):
    """``wire.serve`` (the kernel's side) refuses an adapter outside ``gpulab.``: the call is reported as raised."""
    request = {
        "kind": "calls",
        "name": "LossInForward",
        "calls": [[wire.encode([], torch), wire.encode({}, torch)]],
        "args_after": False,
        "fresh": False,
        "adapters": [name],
    }
    answer = wire.serve(request, REFERENCE, torch)
    assert answer["outcomes"][0].get("raised", [None])[0] == "WireError"


# --------------------------------------------------------------------------------------------- honest answers
ANSWER = """
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        {init}

    def forward(self, inputs, targets):
        {forward}
"""
KEEP = "self.model = model\n        self.loss_fn = loss_fn"
LOSS = "self.loss_fn(self.model(inputs), targets)"


def _answer(forward: str = f"return {LOSS}.view(1)", init: str = KEEP, before: str = "") -> str:
    return before + ANSWER.format(init=init, forward=forward)


def _self_check_passes(namespace: dict) -> bool:
    from gpulab import check

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return check.run("LossInForward", namespace["LossInForward"]).passed


def _lost(namespace: dict, tmp_path, seed: int = SEED) -> set[str]:
    return {g for g in CELLS if verdict(g, LocalSession(namespace, tmp_path, random.Random(seed))) != "passed"}


WRONG = {
    "a_0_dim_scalar": _answer(f"return {LOSS}"),
    "the_chunk_mean": _answer(f"return ({LOSS} / len(inputs)).view(1)"),
    "the_outputs_too": _answer(
        "outputs = self.model(inputs)\n        return self.loss_fn(outputs, targets).view(1), outputs"
    ),
    "a_detached_loss": _answer(f"return {LOSS}.detach().view(1)"),
    "under_no_grad": _answer(f"with torch.no_grad():\n            return {LOSS}.view(1)"),
    "a_new_tensor_of_the_item": _answer(f"return torch.tensor([{LOSS}.item()])"),
    "a_copy_of_the_model": _answer(
        init="import copy\n        self.model = copy.deepcopy(model)\n        self.loss_fn = loss_fn"
    ),
    "the_model_in_a_plain_list": _answer(
        "return self.loss_fn(self.models[0](inputs), targets).view(1)",
        init="self.models = [model]\n        self.loss_fn = loss_fn",
    ),
    "a_zero_per_replica": _answer("return torch.zeros(1, device=inputs.device)"),
    "ignores_loss_fn": _answer(
        "return nn.functional.cross_entropy(self.model(inputs), targets, reduction='sum').view(1)"
    ),
    "an_nn_parameter": _answer(f"return nn.Parameter({LOSS}.view(1))"),
    "shape_1_by_1": _answer(f"return {LOSS}.reshape(1, 1)"),
    "half_precision": _answer(f"return {LOSS}.half().view(1)"),
    "a_float64_model": _answer(
        "t = targets if targets.dtype == torch.long else targets.double()\n"
        "        return self.loss_fn(self.model(inputs.double()), t).view(1)",
        init="self.model = model.double()\n        self.loss_fn = loss_fn",
    ),
    "the_mean_reduction_forced": _answer(
        f"return ({LOSS} * len(inputs)).view(1)",
        init=f"{KEEP}\n        if hasattr(loss_fn, 'reduction'): loss_fn.reduction = 'mean'",
    ),
    "stale_ones_in_grad": _answer(
        init="self.model = model\n        self.loss_fn = loss_fn\n"
        "        for p in model.parameters(): p.grad = torch.ones_like(p)"
    ),
}

RIGHT = {
    "the_reference": _answer(),
    "float64": _answer(f"return {LOSS}.double().view(1)"),
    "non_contiguous": _answer(f"return {LOSS}.view(1).expand(2)[:1]"),
    "unsqueeze": _answer(f"return {LOSS}.unsqueeze(0)"),
    "the_model_in_eval_mode": _answer(init="self.model = model.eval()\n        self.loss_fn = loss_fn"),
    "mean_of_a_scalar": _answer(f"return {LOSS}.mean().view(1)"),
    "zero_grad_in_init": _answer(init=f"{KEEP}\n        model.zero_grad()"),
    "model_wrapped_in_sequential": _answer(init="self.model = nn.Sequential(model)\n        self.loss_fn = loss_fn"),
    "model_moved_to_the_inputs_device": _answer(f"self.model.to(inputs.device)\n        return {LOSS}.view(1)"),
    "a_copy_kept_besides": _answer(init=f"import copy\n        {KEEP}\n        self.spare = copy.deepcopy(model)"),
    "loss_fn_registered_only_if_a_module": _answer(
        init="self.model = model\n        if isinstance(loss_fn, nn.Module): self.add_module('loss_fn', loss_fn)\n"
        "        else: self.loss_fn = loss_fn"
    ),
    "per_sample_sum": _answer(
        "outputs = self.model(inputs)\n        return sum(self.loss_fn(outputs[i:i+1], targets[i:i+1]) "
        "for i in range(len(inputs))).view(1)"
    ),
    "reduction_sum_forced": _answer(
        init=f"{KEEP}\n        if hasattr(loss_fn, 'reduction'): loss_fn.reduction = 'sum'"
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_wrong_answer_loses_a_cell_and_fails_the_self_check(case, tmp_path):
    namespace = lesson_03_namespace({"loss_in_forward_answer": WRONG[case]})
    lost = _lost(namespace, tmp_path)
    assert lost and all(v in CELLS for v in lost)
    assert not _self_check_passes(namespace)


@pytest.mark.parametrize("case", sorted(RIGHT))
def test_a_right_answer_keeps_every_cell_and_passes_the_self_check(case, tmp_path):
    namespace = lesson_03_namespace({"loss_in_forward_answer": RIGHT[case]})
    assert _lost(namespace, tmp_path) == set()
    assert _self_check_passes(namespace)


# The self-check runs the rules' visible and extra inputs; the grader, visible and hidden ones. No visible or extra
# input has a loss function that is a plain function (``summed_absolute_error``: the grader's hidden "absolute
# error" inputs, one of them fixed in ``_value_hidden``), a ``tanh`` model or ``devices=1``. An answer that
# handles only the loss modules it was shown passes the self-check and loses the value cell.
DISAGREE = {
    "loss_fn_registered_with_add_module": _answer(
        init="self.model = model\n        self.add_module('loss_fn', loss_fn)"
    ),
    "loss_fn_checked_for_a_sum_reduction": _answer(
        init="assert loss_fn.reduction == 'sum', 'loss_fn must sum'\n        " + KEEP
    ),
    "loss_fn_rebuilt_with_reduction_sum": _answer(
        init="self.model = model\n        self.loss_fn = type(loss_fn)(reduction='sum')"
    ),
    "the_loss_chosen_by_the_targets_dtype": _answer(
        "outputs = self.model(inputs)\n"
        "        if targets.dtype == torch.long:\n"
        "            return nn.functional.cross_entropy(outputs, targets, reduction='sum').view(1)\n"
        "        return nn.functional.mse_loss(outputs, targets, reduction='sum').view(1)"
    ),
}


@pytest.mark.parametrize("case", sorted(DISAGREE))
def test_the_self_check_and_the_grader_agree_on_answers_for_loss_modules_only(case, tmp_path):
    namespace = lesson_03_namespace({"loss_in_forward_answer": DISAGREE[case]})
    assert _self_check_passes(namespace) == (_lost(namespace, tmp_path) == set())


# --------------------------------------------------------------------------------------------- the kernel's torch state
@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class KernelStateSession(LocalSession):
    """A kernel whose notebook ran ``torch.set_default_dtype(torch.float64)`` (say, for precision): the adapters run
    under it, the grader's references in the grader's own process (float32), as in a real grading."""

    def _request(self, request: dict) -> dict:
        request = json.loads(json.dumps(request))
        with _default_dtype(torch.float64), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = wire.serve(request, self.namespace, torch)
        return self._parse(json.dumps(result))


def test_a_float64_default_dtype_in_the_kernel_leaves_the_self_check_and_the_grader_agreeing(tmp_path):
    """``loss_scenario`` builds the scenario's model and batch with the process's default dtype: in a kernel that
    made float64 the default, ``nn.Linear``'s initialisation and ``torch.randn`` draw other numbers than the
    grader's float32 scenario. The self-check computes its references in that same kernel (it passes); the grader
    compares with references of its own process, so the reference answer loses every cell."""
    namespace = lesson_03_namespace()
    with _default_dtype(torch.float64):
        self_check = _self_check_passes(namespace)
    lost = {g for g in CELLS if verdict(g, KernelStateSession(namespace, tmp_path, random.Random(SEED))) != "passed"}
    assert self_check == (lost == set())


# --------------------------------------------------------------------------------------------- answers the wire refuses
ODD_RETURNS = {
    "a_sparse_tensor": _answer(f"return {LOSS}.view(1).to_sparse()"),
    "a_meta_tensor": _answer(f"return {LOSS}.view(1).to('meta')"),
}


@pytest.mark.parametrize("case", sorted(ODD_RETURNS))
def test_an_odd_tensor_loses_a_cell_and_the_self_check_says_so_without_raising(case, tmp_path):
    """The grader fails these (the wire refuses a sparse tensor; a meta tensor cannot be encoded); the self-check
    must report a failure, not raise: ``gpulab.check._outcome`` guards the call but not ``case.same``, whose
    ``_close_values`` reshapes a sparse tensor or copies a meta one."""
    namespace = lesson_03_namespace({"loss_in_forward_answer": ODD_RETURNS[case]})
    assert _lost(namespace, tmp_path)
    from gpulab import check

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check.run("LossInForward", namespace["LossInForward"])
    assert not result.passed


# --------------------------------------------------------------------------------------------- virtual replicas
# A module that keeps ``model`` as a submodule but calls the caller's model itself (a closure, or an entry of its
# ``__dict__`` that ``nn.Module`` does not register) instead of its replica's copy. Under ``nn.DataParallel`` on two
# real GPUs, replica 1 runs on cuda:1 with the original model's weights on cuda:0 and raises (a device mismatch) in
# every cell that wraps it; on virtual devices every replica lives on one backing device and would compute the same
# numbers, so gpulab's DataParallel reads the autograd graph and raises the same mismatch: the verdict is the same
# on any machine.
BYPASSES_THE_REPLICAS = {
    "a_closure_over_the_model": _answer(
        "return self.compute(inputs, targets).view(1)",
        init=KEEP + "\n        self.compute = lambda x, y: loss_fn(model(x), y)",
    ),
    "the_model_kept_unregistered_too": _answer(
        "return self.loss_fn(self.__dict__['original'](inputs), targets).view(1)",
        init=KEEP + "\n        self.__dict__['original'] = model",
    ),
    # The replicas share their module's __dict__ entries: the first replica to store its copy is the others' too.
    "one_replicas_copy_in_a_shared_dict": _answer(
        "return self.loss_fn(self.cache.setdefault('model', self.model)(inputs), targets).view(1)",
        init=KEEP + "\n        self.cache = {}",
    ),
    # Replica 0's parameters are views of the model's: the original model only in the other replicas.
    "the_original_in_other_replicas_only": _answer(
        "first = next(m for m in self.model.modules() if isinstance(m, nn.Linear)).weight\n        "
        "model = self.model if first._base is not None or first.grad_fn is None else self.models[0]\n        "
        "return self.loss_fn(model(inputs), targets).view(1)",
        init=KEEP + "\n        self.models = [model]",
    ),
}


@pytest.mark.parametrize("case", sorted(BYPASSES_THE_REPLICAS))
def test_an_answer_that_bypasses_the_replicas_loses_every_cell_that_wraps_it(case, tmp_path):
    namespace = lesson_03_namespace({"loss_in_forward_answer": BYPASSES_THE_REPLICAS[case]})
    assert _lost(namespace, tmp_path) == set(CELLS)
    from gpulab import check

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check.run("LossInForward", namespace["LossInForward"])
    assert not result.passed
    assert "the same device" in result.detail and "self.model" in result.hint
