"""Attacks on the grading of lesson 02's ``data_parallel_grads`` (cells ``data_parallel_grads_full_batch``,
``_splits_like_scatter``, ``_model_unchanged``), driven without a kernel: ``LocalSession`` for answers, and
``ForgedSession`` for a kernel that rewrites the probe's (``call_with_models``) answer before it crosses the wire.

Each test asserts the secure behaviour: a forged or malformed answer fails its cell (``CheckFailed``), never passes
and never breaks the grader with another exception; a right answer that the self-check accepts is not marked down;
a wrong answer loses its cell. Seconds in all.
"""

from __future__ import annotations

import json
import math
import random
import sys

import pytest
import torch

from tests.local_checks import attacked_verdict, lesson_02_namespace
from tests.nbgrader_tools import REPO

sys.path.insert(0, str(REPO))
from autograder.checks import LocalSession, checks_for, wire  # noqa: E402
from autograder.checks import gradient_averaging as checks_02  # noqa: E402

CELLS = (
    "data_parallel_grads_full_batch",
    "data_parallel_grads_splits_like_scatter",
    "data_parallel_grads_model_unchanged",
)
CHECKS = checks_for("02_gradient_averaging")


class ForgedSession(LocalSession):
    """A kernel that runs the grader's probe on the notebook (honestly), then answers ``forge(results, cases)``
    instead: the learner owns the interpreter that answers, and the wire's encoder is the kernel's own."""

    def __init__(self, namespace: dict, path, forge, seed: int = 0):
        super().__init__(namespace, path, random.Random(seed))
        self.forge = forge

    def _request(self, request: dict) -> dict:
        request = json.loads(json.dumps(request))
        if request["kind"] != "probe":
            return super()._request(request)
        inputs = wire.decode(request["inputs"], torch)
        cases = inputs["cases"]
        # the DataParallel cases ("gpus") run on this machine's CPU: a kernel that says it has two GPUs
        inputs["cases"] = [dict(case, device="cpu" if case["device"] == "gpus" else case["device"]) for case in cases]
        request["inputs"] = wire.encode(inputs, torch)
        answer = wire.serve(request, self.namespace, torch)
        if "value" in answer:
            forged = self.forge(wire.decode(answer["value"], torch), cases)
            answer = {"value": wire.encode(forged, torch)}
        return self._parse(json.dumps(answer))


def verdict(grade_id: str, session) -> str:
    return attacked_verdict(CHECKS[grade_id], session)


def answer(code: str | None = None) -> dict:
    return lesson_02_namespace({"data_parallel_grads_answer": code} if code else {})


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor of ``tensor``'s shape whose dtype (``torch.bits8``) survives the wire but not ``repr``/``tolist``."""
    return torch.zeros(tensor.shape, dtype=torch.uint8).view(torch.bits8)


# --------------------------------------------------------------------------------------------- sanity
def test_the_reference_passes_through_the_forged_session_untouched(tmp_path):
    for grade_id in CELLS:
        assert verdict(grade_id, ForgedSession(answer(), tmp_path, lambda results, cases: results)) == "passed"


# --------------------------------------------------------------------------------------------- a dtype repr refuses
# rules.enforce builds its failure message eagerly (``_show(got)`` = ``repr``), also when the comparison passed or
# raised; a ``torch.bits8`` tensor decodes (torch.save/weights_only keep it) but its repr raises
# NotImplementedError. No forgery needed: the kernel's own encoder sends what the function returned.
BITS_ANSWER = """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    return {name: torch.zeros(p.shape, dtype=torch.uint8).view(torch.bits8) for name, p in model.named_parameters()}
"""


@pytest.mark.parametrize("grade_id", CELLS)
def test_returned_tensors_whose_repr_raises_fail_the_cell_not_the_grader(grade_id, tmp_path):
    assert verdict(grade_id, LocalSession(answer(BITS_ANSWER), tmp_path, random.Random(0))) == "failed"


def _gpu_branch(monkeypatch):
    """The full-batch cell's extra comparison against nn.DataParallel, reached on this CPU-only machine: four
    "GPUs" counted, the grader's reference run on the CPU (nn.DataParallel without CUDA runs the module as is)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    reference = checks_02._reference
    monkeypatch.setattr(
        checks_02, "_reference", lambda name, fn, cases, devices=None: reference(name, fn, cases, ["cpu"] * len(cases))
    )


def _on_gpus(forge):
    """Forge only the round trip of the DataParallel cases (device ``"gpus"``); the rule's cases stay honest."""
    return lambda results, cases: forge(results, cases) if cases and cases[0]["device"] == "gpus" else results


def _gpu_answers(transform):
    return lambda results, cases: [dict(result, value=transform(result["value"])) for result in results]


def test_the_gpu_branch_is_reached_and_an_honest_answer_passes_it(tmp_path, monkeypatch):
    _gpu_branch(monkeypatch)
    seen = []

    def spy(results, cases):
        seen.append(len(cases))
        return _gpu_answers(lambda value: value)(results, cases)

    assert verdict(CELLS[0], ForgedSession(answer(), tmp_path, _on_gpus(spy))) == "passed"
    assert seen == [4]
    wrong = _gpu_answers(lambda value: {k: v + 1 for k, v in value.items()})
    assert verdict(CELLS[0], ForgedSession(answer(), tmp_path, _on_gpus(wrong))) == "failed"


@pytest.mark.parametrize(
    "transform",
    [
        pytest.param(lambda value: {k: bits(v) for k, v in value.items()}, id="bits8_tensors"),
        pytest.param(lambda value: {k: torch.full_like(v, math.nan) for k, v in value.items()}, id="nan"),
        pytest.param(lambda value: list(value.values()), id="a_list"),
        pytest.param(lambda value: {(k,): v for k, v in value.items()}, id="tuple_keys"),
        pytest.param(lambda value: {k: v.tolist() for k, v in value.items()}, id="nested_lists"),
    ],
)
def test_a_forged_answer_to_the_data_parallel_cases_fails_the_cell(transform, tmp_path, monkeypatch):
    """``_same_dict``/``_close`` (GPU graders only) call ``.tolist()`` outside any guard."""
    _gpu_branch(monkeypatch)
    session = ForgedSession(answer(), tmp_path, _on_gpus(_gpu_answers(transform)))
    assert verdict(CELLS[0], session) == "failed"


# --------------------------------------------------------------------------------------------- forged probe answers
def _each(change):
    """Apply ``change(result, case)`` to every case's answer."""
    return lambda results, cases: [change(dict(r), c) for r, c in zip(results, cases, strict=True)]


def _value(transform):
    return _each(lambda r, c: {**r, "value": transform(r["value"])})


def _after(transform):
    return _each(lambda r, c: {**r, "after": transform(r["after"])})


def _model_state(transform):
    return _after(lambda after: [transform(after[0]), *after[1:]])


def _parameters(change):
    """Rewrite each parameter's entry ``[name, weight, .grad, requires_grad]`` of the model's reported state."""
    return _model_state(lambda state: {**state, "parameters": [change(*entry) for entry in state["parameters"]]})


FORGERIES = {
    # the answer's frame (``_described_calls``)
    "none": lambda results, cases: None,
    "not_a_list": lambda results, cases: {"results": results},
    "one_short": lambda results, cases: results[:-1],
    "one_more": lambda results, cases: [*results, results[0]],
    "a_case_not_a_dict": _each(lambda r, c: list(r.items())),
    "raised_empty": _each(lambda r, c: {"raised": []}),
    "raised_a_string": _each(lambda r, c: {"raised": "ValueError"}),
    "raised_not_names": _each(lambda r, c: {"raised": [1, 2]}),
    "raised_well_formed": _each(lambda r, c: {"raised": ["ValueError", "Exception"]}),
    "skipped_on_cpu": _each(lambda r, c: {"skipped": True}),
    "no_value": _each(lambda r, c: {k: v for k, v in r.items() if k != "value"}),
    "no_after": _each(lambda r, c: {k: v for k, v in r.items() if k != "after"}),
    "after_a_tuple": _after(tuple),
    "after_short": _after(lambda after: after[:-1]),
    "loss_slot_forged": _after(lambda after: [*after[:3], "LOSS ", after[4]]),
    "loss_slot_missing": _after(lambda after: [*after[:3], None, after[4]]),
    # the value (``same_gradients``)
    "value_nan": _value(lambda v: {k: torch.full_like(t, math.nan) for k, t in v.items()}),
    "value_inf": _value(lambda v: {k: torch.full_like(t, math.inf) for k, t in v.items()}),
    "value_flattened": _value(lambda v: {k: t.reshape(-1) for k, t in v.items()}),
    "value_as_lists": _value(lambda v: {k: t.tolist() for k, t in v.items()}),
    "value_a_list": _value(lambda v: list(v.values())),
    "value_extra_key": _value(lambda v: {**v, "extra": torch.zeros(1)}),
    "value_mixed_keys": _value(lambda v: {**v, 0: torch.zeros(1)}),
    "value_complex": _value(lambda v: {k: t.to(torch.complex64) for k, t in v.items()}),
    "value_opaque": _value(lambda v: {k: object() for k in v}),
    "value_many_keys": lambda results, cases: [
        {**results[0], "value": {f"k{i}": 0.0 for i in range(90_000)}},
        *results[1:],
    ],
    # the arguments after the call (``same_values``)
    "weights_as_float64": _parameters(lambda n, w, g, r: [n, w.double(), g, r]),
    "weights_bits8": _parameters(lambda n, w, g, r: [n, bits(w), g, r]),
    "stale_grad_dropped": _parameters(lambda n, w, g, r: [n, w, None, r]),
    "requires_grad_as_an_int": _parameters(lambda n, w, g, r: [n, w, g, int(r)]),
    "requires_grad_dropped": _parameters(lambda n, w, g, r: [n, w, g]),
    "modes_dropped": _model_state(lambda state: {"parameters": state["parameters"]}),
    "modes_as_ints": _model_state(lambda state: {**state, "training": [[n, int(t)] for n, t in state["training"]]}),
    "model_as_parameters_only": _model_state(lambda state: state["parameters"]),
    "model_as_a_dict": _model_state(lambda state: {n: [w, g] for n, w, g, _ in state["parameters"]}),
    "inputs_as_lists": _after(lambda after: [after[0], after[1].tolist(), *after[2:]]),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_probe_answer_fails_the_model_unchanged_cell(forgery, tmp_path):
    session = ForgedSession(answer(), tmp_path, FORGERIES[forgery])
    assert verdict("data_parallel_grads_model_unchanged", session) == "failed"


# --------------------------------------------------------------------------------------------- honest answers
def _self_check_passes(namespace: dict) -> bool:
    from gpulab import check

    return check.run("data_parallel_grads", namespace["data_parallel_grads"]).passed


def _lost(namespace: dict, tmp_path) -> set[str]:
    return {g for g in CELLS if verdict(g, LocalSession(namespace, tmp_path, random.Random(0))) != "passed"}


PICKLED_REPLICAS = """
import io

def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    saved = io.BytesIO()
    torch.save(model, saved)
    names = [name for name, _ in model.named_parameters()]
    grads_per_device, chunk_sizes = [], []
    for chunk_inputs, chunk_targets in zip(inputs.chunk(n_devices), targets.chunk(n_devices)):
        saved.seek(0)
        replica = torch.load(saved, weights_only=False)
        loss_fn(replica(chunk_inputs), chunk_targets).backward()
        grads_per_device.append([p.grad for p in replica.parameters()])
        chunk_sizes.append(len(chunk_inputs))
    return dict(zip(names, average_gradients(grads_per_device, chunk_sizes)))
"""


FROZEN = """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    model.{change}                                      # "so that nothing lands in the caller's .grad"
    names = [name for name, _ in model.named_parameters()]
    grads_per_device, chunk_sizes = [], []
    for chunk_inputs, chunk_targets in zip(inputs.chunk(n_devices), targets.chunk(n_devices)):
        replica = copy.deepcopy(model).requires_grad_(True)
        loss_fn(replica(chunk_inputs), chunk_targets).backward()
        grads_per_device.append([p.grad for p in replica.parameters()])
        chunk_sizes.append(len(chunk_inputs))
    return dict(zip(names, average_gradients(grads_per_device, chunk_sizes)))
"""


def test_replicas_copied_through_torch_save_are_right_in_both(tmp_path):
    """The probe's models are gpulab's own classes, as the self-check's: an answer that pickles them passes both."""
    namespace = answer(PICKLED_REPLICAS)
    assert _self_check_passes(namespace)
    assert _lost(namespace, tmp_path) == set()


@pytest.mark.parametrize("change", ["requires_grad_(False)", "eval()"])
def test_a_model_left_frozen_or_in_eval_mode_is_wrong_in_both(change, tmp_path):
    """Arguments "left as they were" include each parameter's ``requires_grad`` and each module's mode."""
    namespace = answer(FROZEN.format(change=change))
    assert not _self_check_passes(namespace)
    assert _lost(namespace, tmp_path) == {"data_parallel_grads_model_unchanged"}
