"""The check framework (``autograder/checks``): the wire format, the readers of files from outside the sandbox,
the kernel stub run in this process, and lesson 01's checks through a ``LocalSession`` (no kernel)."""

from __future__ import annotations

import base64
import enum
import io
import json
import math
import numbers
import os
import pickle
import random
import socket
import sys
from collections import OrderedDict

import pytest
import torch

from tests.nbgrader_tools import REPO

sys.path.insert(0, str(REPO))
from autograder.checks import CheckFailed, LocalSession, Opaque, checks_for, files, probe_source, uses, wire  # noqa: E402
from autograder.checks.kernel import stub  # noqa: E402
from tests.local_checks import (  # noqa: E402
    lesson_01_namespace,
    lesson_02_namespace,
    lesson_03_namespace,
    verdicts_of,
)


def round_trip(value):
    return wire.decode(json.loads(json.dumps(wire.encode(value, torch))), torch)


# --------------------------------------------------------------------------------------------- wire
def test_types_are_kept_exactly():
    value = {1: [True, 1, 1.5, "1", None, (2, [3])], "k": (), (1, "a"): {}, False: 0}
    back = round_trip(value)
    assert back == value
    assert [type(v) for v in back[1]] == [bool, int, float, str, type(None), tuple]
    assert type(back[1][5][1]) is list and list(back) == [1, "k", (1, "a"), False]
    assert type(round_trip(10**80)) is int and round_trip(10**80) == 10**80


def test_floats_are_exact_with_nan_and_inf():
    values = [0.1, -0.0, math.inf, -math.inf, 1e-308]
    back = round_trip(values)
    assert back == values and math.copysign(1, back[1]) == -1
    assert math.isnan(round_trip(math.nan))


def test_subclasses_and_other_objects_become_opaque():
    class Liar(list):
        def __eq__(self, other):
            return True

    class Equal:
        def __eq__(self, other):
            return True

    back = round_trip([Liar([1]), Equal(), True.__class__, 3 + 0j])
    assert all(type(v) is Opaque for v in back)
    assert back[0] != [1] and back[1] != 0 and back[0].type_name.endswith("Liar")


def test_numbers_of_other_classes_keep_their_value_and_their_class():
    import numpy

    class Level(enum.IntEnum):
        HIGH = 3

    back = round_trip([numpy.int64(5), Level.HIGH, numpy.float64(2.5), numpy.float32(1.5), True, 7, 0.5])
    assert back == [5, 3, 2.5, 1.5, True, 7, 0.5]
    assert [type(v) for v in back] == [
        wire.ForeignInt,
        wire.ForeignInt,
        wire.ForeignFloat,
        wire.ForeignReal,
        bool,
        int,
        float,
    ]
    assert back[0].type_name == "numpy.int64" and back[3].type_name == "numpy.float32"
    # as strict as the tests they replace: isinstance(v, numbers.Integral) / isinstance(v, float) / type(v) is int
    assert isinstance(back[1], int) and type(back[1]) is not int
    assert isinstance(back[2], float) and not isinstance(back[3], float) and isinstance(back[3], numbers.Real)


def test_numpy_ints_score_where_the_hidden_tests_took_any_integral(tmp_path):
    numpy_sizes = {
        "chunk_sizes_answer": """
import numpy

def chunk_sizes(batch_size, n_devices):
    if batch_size < 1 or n_devices < 1:
        raise ValueError("both at least 1")
    per_chunk = -(-batch_size // n_devices)
    return [numpy.int64(min(per_chunk, batch_size - start)) for start in range(0, batch_size, per_chunk)]
"""
    }
    assert all(verdicts_of("01_splitting", lesson_01_namespace(numpy_sizes), tmp_path).values())


def test_tensors_travel_by_value_and_are_loaded_weights_only():
    tensor = torch.arange(6.0).reshape(2, 3)[:, 1]  # a view: only its values travel
    back = round_trip([tensor, torch.nn.Parameter(torch.ones(2))])
    assert type(back[0]) is torch.Tensor and torch.equal(back[0], tensor)
    assert type(back[1]) is Opaque  # a Tensor subclass is not a tensor on the wire


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_pickle_payload_in_a_tensor_is_refused():
    buffer = io.BytesIO()
    torch.save({"x": _Boom()}, buffer)
    for payload in (buffer.getvalue(), pickle.dumps(_Boom())):
        with pytest.raises(wire.WireError):
            wire.decode(["tensor", base64.b64encode(payload).decode()], torch)
    buffer = io.BytesIO()
    torch.save({"a": torch.ones(1)}, buffer)  # weights-only but not a tensor
    with pytest.raises(wire.WireError, match="holding a dict"):
        wire.decode(["tensor", base64.b64encode(buffer.getvalue()).decode()], torch)


@pytest.mark.parametrize(
    "tree",
    [
        ["int", 3],
        ["bool", 1],
        ["float", "0x1.zz"],
        ["list", "abc"],
        ["dict", [[["list", []], ["none"]]]],  # an unhashable key
        ["tensor", "not base64!"],
        ["code", "print(1)"],
        "plain",
        [],
        ["none", 1],
    ],
)
def test_malformed_trees_are_refused(tree):
    with pytest.raises(wire.WireError):
        wire.decode(tree, torch)


def test_depth_and_size_are_capped():
    deep = ["none"]
    for _ in range(wire.MAX_DEPTH + 2):
        deep = ["list", [deep]]
    with pytest.raises(wire.WireError):
        wire.decode(deep, torch)
    with pytest.raises(wire.WireError):
        wire.encode([0] * (wire.MAX_NODES + 1), torch)


def test_an_answer_above_the_cap_fails_the_cell(tmp_path, monkeypatch):
    from autograder import checks

    session = LocalSession({"big": lambda: "x" * 1000}, tmp_path)
    assert session.call("big").value == "x" * 1000
    monkeypatch.setattr(checks, "MAX_ANSWER", 500)
    with pytest.raises(CheckFailed, match="larger than 500"):
        session.call("big")


# --------------------------------------------------------------------------------------------- sessions
def test_outcomes_of_calls(tmp_path):
    class Special(ValueError):
        pass

    def raiser():
        raise Special("no")

    session = LocalSession({"add": lambda a, b=0: [a + b], "raiser": raiser}, tmp_path)
    added, missing = session.call("add", 1, b=2), session.call("nothing")
    assert added.value == [3] and added.raised is None
    assert missing.missing and pytest.raises(CheckFailed, lambda: missing.value)
    raised = session.call("raiser")
    assert raised.raised == "Special" and "ValueError" in raised.raised_types
    with pytest.raises(CheckFailed, match="raised Special"):
        raised.value  # noqa: B018
    (after,) = session.calls("add", [((torch.ones(2), torch.ones(2)), {})], args_after=True)
    assert torch.equal(after.value[0], torch.full((2,), 2.0)) and torch.equal(after.args_after[0][0], torch.ones(2))


def test_a_call_past_its_seconds_is_stopped_and_no_later_call_is_made(tmp_path):
    """A call with seconds (a rule's ``Rule.seconds``) is stopped in the kernel past them by the self-check's timer;
    the calls after it are not made, and the caller's own timer (here pytest-timeout's) goes on."""
    import signal
    import time

    made = []

    def slow(n):
        made.append(n)
        time.sleep(n)
        return n

    session = LocalSession({"slow": slow}, tmp_path)
    timer_before = signal.getitimer(signal.ITIMER_REAL)[0]
    started = time.monotonic()
    with pytest.raises(CheckFailed, match="call 2 took longer than 0.5 s") as failure:
        session.calls("slow", [((0.01,), {}), ((30,), {}), ((0.01,), {})], seconds=[0.5, 0.5, 0.5])
    assert time.monotonic() - started < 10 and made == [0.01, 30]
    assert failure.value.index == 1
    assert session.calls("slow", [((0.01,), {})], seconds=[None])[0].value == 0.01  # None: no limit
    if timer_before:
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= timer_before


def test_a_count_that_plays_the_ring_is_stopped_on_its_first_large_ring(tmp_path):
    """ring_all_reduce_bytes as a loop over the ring's steps: right on small rings, stopped on the first drawn ring
    of 100,000 ranks or more after the rule's seconds (the self-check's limit on one input), named with that input,
    instead of holding the cell to its time limit."""
    import time

    played = """
def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    if world_size < 1 or n_elements < 0:
        raise ValueError("world_size >= 1 and n_elements >= 0")
    sent = 0
    for step in range(2 * (world_size - 1)):
        for rank in range(world_size):
            sent += (n_elements // world_size + (rank < n_elements % world_size)) * bytes_per_element
    return sent
"""
    namespace = lesson_03_namespace({"ring_all_reduce_bytes_answer": played})
    assert namespace["ring_all_reduce_bytes"](1000, 4) == 24000
    session = LocalSession(namespace, tmp_path, random.Random(0))
    started = time.monotonic()
    with pytest.raises(CheckFailed, match=r"ring_all_reduce_bytes\(.*\) took longer than 10 s"):
        checks_for("03_gpu0_imbalance")["ring_all_reduce_bytes_total"](session)
    assert time.monotonic() - started < 60


def test_an_ordered_dict_travels_as_itself_and_the_kernel_says_whether_an_argument_came_back(tmp_path):
    """A state dict's own type (``OrderedDict``) travels both ways, in order; asked for ``fresh``, each outcome
    says whether the value returned is one of the call's arguments (``strip_module_prefix``'s new-dict rule)."""
    state = OrderedDict([("b", torch.ones(1)), ("a", torch.zeros(1))])
    back = round_trip([state, {"b": 1, "a": 2}])
    assert type(back[0]) is OrderedDict and list(back[0]) == ["b", "a"] and torch.equal(back[0]["a"], torch.zeros(1))
    assert type(back[1]) is dict and list(back[1]) == ["b", "a"]
    session = LocalSession({"same": lambda d: d, "copy": lambda d: OrderedDict(d)}, tmp_path)
    for name, itself in (("same", True), ("copy", False)):
        (outcome,) = session.calls(name, [((state,), {})], fresh=True)
        assert outcome.returned_an_argument is itself and type(outcome.value) is OrderedDict
    (unasked,) = session.calls("same", [((state,), {})])
    assert unasked.returned_an_argument is False


def _probe(notebook, workdir, factor):
    import pathlib

    pathlib.Path(workdir, "out.txt").write_text(str(notebook["base"] * factor))
    return {"seen": notebook["base"], "workdir": workdir}


def test_probes_run_with_the_notebook_and_a_fresh_folder(tmp_path):
    session = LocalSession({"base": 7}, tmp_path)
    result = session.run(_probe, factor=3)
    assert result == {"seen": 7, "workdir": str(session.workdir)}
    assert session.workdir.parent == tmp_path and session.read_bytes("out.txt") == b"21"
    with pytest.raises(TypeError, match="top-level"):
        session.run(lambda notebook, workdir: 1)
    session.close()
    assert not any(tmp_path.iterdir())


def _tripled(value):
    return 3 * value


@uses(_tripled)
def _probe_with_a_helper(notebook, workdir):
    return _tripled(notebook["base"])


def _probe_without_its_helper(notebook, workdir):
    return _tripled(notebook["base"])


def test_a_probe_takes_its_helpers_to_the_kernel_and_no_decorator(tmp_path):
    source = probe_source(_probe_with_a_helper)
    assert "def _tripled" in source and "@" not in source
    session = LocalSession({"base": 7}, tmp_path)
    assert session.run(_probe_with_a_helper) == 21
    with pytest.raises(CheckFailed, match="NameError"):
        session.run(_probe_without_its_helper)
    session.close()
    assert not any(tmp_path.iterdir())


def test_the_kernel_stub_answers_once_with_its_nonce(monkeypatch):
    published = []
    display = type(sys)("IPython.display")
    display.publish_display_data = published.append
    monkeypatch.setitem(sys.modules, "IPython.display", display)
    notebook = {"double": lambda x: 2 * x}
    request = {"kind": "calls", "name": "double", "calls": [[wire.encode([21]), wire.encode({})]]}
    exec(stub(request, "n0nce"), notebook)  # noqa: S102 - the stub, run as a kernel runs it
    assert published == [{wire.MIME: {"nonce": "n0nce", "result": {"outcomes": [{"value": ["int", "42"]}]}}}]
    assert set(notebook) == {"double", "__builtins__"}  # the stub leaves nothing in the notebook


# --------------------------------------------------------------------------------------------- files
def test_readers_refuse_symlinks_special_files_and_escapes(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "ok.bin").write_bytes(b"data")
    secret = tmp_path.parent / f"{tmp_path.name}-secret"
    secret.write_text("secret")
    (tmp_path / "link").symlink_to(secret)
    (tmp_path / "dirlink").symlink_to(tmp_path / "dir")
    os.mkfifo(tmp_path / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    try:
        assert files.read_bytes(tmp_path, "dir/ok.bin") == b"data"
        assert files.listdir(tmp_path, "dir") == ["ok.bin"]
        for bad in ["link", "dirlink/ok.bin", "fifo", "sock", "../" + secret.name, str(secret), "dir"]:
            with pytest.raises(CheckFailed):
                files.read_bytes(tmp_path, bad)
        with pytest.raises(CheckFailed):
            files.listdir(tmp_path, "dirlink")
        with pytest.raises(CheckFailed, match="larger"):
            files.read_bytes(tmp_path, "dir/ok.bin", limit=3)
        with pytest.raises(CheckFailed):
            files.write_bytes(tmp_path, "link", b"x")
        assert secret.read_text() == "secret"
    finally:
        server.close()
        secret.unlink()


def test_load_weights_refuses_code(tmp_path):
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    files.write_bytes(tmp_path, "ok.pt", buffer.getvalue())
    assert torch.equal(files.load_weights(files.read_bytes(tmp_path, "ok.pt"))["w"], torch.ones(2))
    buffer = io.BytesIO()
    torch.save({"w": _Boom()}, buffer)
    with pytest.raises(CheckFailed, match="weights-only"):
        files.load_weights(buffer.getvalue())


# --------------------------------------------------------------------------------------------- lesson 01
def test_lesson_01_checks_cover_every_graded_test_and_pass_the_reference(tmp_path):
    verdicts = verdicts_of("01_splitting", lesson_01_namespace(), tmp_path, seed=1)
    assert len(verdicts) == 10 and all(verdicts.values()), verdicts


def test_liars_and_list_subclasses_earn_nothing(tmp_path):
    liars = {
        "chunk_sizes_answer": """
class Yes(list):
    def __eq__(self, other):
        return True
def chunk_sizes(batch_size, n_devices):
    if batch_size < 1 or n_devices < 1:
        raise ValueError
    return Yes([1])
""",
        "device_of_sample_answer": """
class Anything:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError
    return Anything()
""",
    }
    verdicts = verdicts_of("01_splitting", lesson_01_namespace(liars), tmp_path)
    assert not verdicts["chunk_sizes_sizes"] and not verdicts["chunk_sizes_tiny_and_invalid"]
    assert not verdicts["device_of_sample_devices"] and verdicts["device_of_sample_out_of_range"]


def test_the_kernel_stops_encoding_past_its_budget(tmp_path):
    with pytest.raises(wire.WireError, match="larger than"):
        wire.encode(["x" * 10, "y" * 10], torch, budget=[15])
    huge = "z" * (wire.MAX_CHARS // 2 + 1)
    outcomes = LocalSession({"huge": lambda: huge}, tmp_path).calls("huge", [((), {})] * 3)
    assert outcomes[0].value == huge and outcomes[1].unencodable and outcomes[2].unencodable
    with pytest.raises(CheckFailed, match="cannot read"):
        outcomes[1].value  # noqa: B018


# --------------------------------------------------------------------------------------------- lesson 03
def test_lesson_03_checks_cover_every_graded_test_and_pass_the_reference(tmp_path):
    verdicts = verdicts_of("03_gpu0_imbalance", lesson_03_namespace(), tmp_path, seed=1)
    assert len(verdicts) == 17 and all(verdicts.values()), verdicts


def test_lesson_03_checks_take_numpy_numbers_and_refuse_liars(tmp_path):
    """The probes pass on integral and real numbers of any type (as the lesson's own tests did) and read them as
    plain int and float in the kernel: an object equal to anything earns nothing."""
    numpy_answers = {
        "gathered_output_bytes_answer": """
import numpy as np
def gathered_output_bytes(batch_size, sample_shape, dtype):
    return np.int64(batch_size * math.prod(sample_shape) * dtype.itemsize)
""",
        "imbalance_ratio_answer": """
import numpy as np
def imbalance_ratio(peak_bytes):
    peaks = np.asarray(list(peak_bytes), dtype=float)
    if peaks.size < 2 or peaks[1:].mean() == 0:
        raise ValueError("peaks")
    return peaks[0] / peaks[1:].mean()
""",
    }
    verdicts = verdicts_of("03_gpu0_imbalance", lesson_03_namespace(numpy_answers), tmp_path, seed=4)
    assert all(verdicts.values()), verdicts
    liars = {
        "imbalance_ratio_answer": """
class Anything(float):
    def __eq__(self, other):
        return True
    def __float__(self):
        return -1.0
def imbalance_ratio(peak_bytes):
    if len(peak_bytes) < 2 or sum(peak_bytes[1:]) == 0:
        raise ValueError("peaks")
    return Anything(0.0)
""",
        "quiz_answers": 'quiz_answers = {"q1": 102_400_000, "q2": 2.25, "q3": "b", "q4": "b", "q5": type("S", (str,), '
        '{"__eq__": lambda s, o: True, "strip": lambda s: s, "lower": lambda s: s})("a")}',
    }
    verdicts = verdicts_of("03_gpu0_imbalance", lesson_03_namespace(liars), tmp_path, seed=5)
    assert {g for g, ok in verdicts.items() if not ok} == {"imbalance_ratio_ratio", "quiz_q5"}


def test_lesson_03_memory_cell_rests_on_the_numbers_returned(tmp_path):
    """Peaks could only be measured in the kernel, where learner code can report any: the memory cell judges what
    DataParallel gathers on device 0. A LossInForward that computes no loss at all (a zero per replica, still
    differentiable) loses it, and so does one that gathers the outputs; the reference keeps it."""
    module = """
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, x, y):
        return RETURNED
"""
    answers = [({}, True)]
    answers += [
        ({"loss_in_forward_answer": module.replace("RETURNED", r)}, False)
        for r in ("self.model(x)", "self.model(x).sum().view(1) * 0")
    ]
    for answer, passes in answers:
        verdict = one_verdict("03_gpu0_imbalance", "loss_in_forward_memory", lesson_03_namespace(answer), tmp_path, 5)
        assert verdict is passes, answer


def test_lesson_03_registration_rests_on_the_modules_parameters_values(tmp_path):
    """Whether the model is LossInForward's submodule is judged by the values its parameters() returns after the
    grader moved the model's weights, not by identities the kernel reports: a module that registers a copy of the
    model, and computes with the model itself, loses the gradients cell; the reference keeps it."""
    copy_registered = """
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        import copy

        self.shown = copy.deepcopy(model)
        self.parts = [model, loss_fn]

    def forward(self, inputs, targets):
        model, loss_fn = self.parts
        return loss_fn(model(inputs), targets).view(1)
"""
    assert one_verdict("03_gpu0_imbalance", "loss_in_forward_gradients", lesson_03_namespace(), tmp_path, 2)
    namespace = lesson_03_namespace({"loss_in_forward_answer": copy_registered})
    assert not one_verdict("03_gpu0_imbalance", "loss_in_forward_gradients", namespace, tmp_path, 2)


# --------------------------------------------------------------------------------------------- lesson 02
def test_lesson_02_checks_cover_every_graded_test_and_pass_the_reference(tmp_path):
    verdicts = verdicts_of("02_gradient_averaging", lesson_02_namespace(), tmp_path, seed=1)
    assert len(verdicts) == 12 and all(verdicts.values()), verdicts


def test_lesson_02_checks_take_what_isinstance_took_and_refuse_list_subclasses(tmp_path):
    answers = {
        # an OrderedDict of Parameters: the hidden tests asked isinstance(got, dict) and isinstance(g, Tensor)
        "data_parallel_grads_answer": """
from collections import OrderedDict

def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    names = [name for name, _ in model.named_parameters()]
    per_device, sizes = [], []
    for xs, ys in zip(inputs.chunk(n_devices), targets.chunk(n_devices)):
        replica = copy.deepcopy(model)
        loss_fn(replica(xs), ys).backward()
        per_device.append([p.grad for p in replica.parameters()])
        sizes.append(len(xs))
    return OrderedDict((n, torch.nn.Parameter(g)) for n, g in zip(names, average_gradients(per_device, sizes)))
""",
        # losses as a float subclass (isinstance(v, float) took them)
        "train_with_data_parallel_answer": """
class Loss(float):
    pass

def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
    parallel = gpulab.DataParallel(model, device_ids=device_ids)
    optimizer = torch.optim.SGD(parallel.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(parallel(x), y)
        loss.backward()
        optimizer.step()
        losses.append(Loss(loss.item()))
    return losses
""",
    }
    assert all(verdicts_of("02_gradient_averaging", lesson_02_namespace(answers), tmp_path).values())
    liar = answers["train_with_data_parallel_answer"].replace("return losses", "return type('L', (list,), {})(losses)")
    namespace = lesson_02_namespace({"train_with_data_parallel_answer": liar})
    verdicts = verdicts_of("02_gradient_averaging", namespace, tmp_path)
    # a list of another class is no list for the rules that read the returned losses (the self-check agrees)
    lost = {g for g, ok in verdicts.items() if not ok}
    assert lost == {"train_with_data_parallel_losses", "train_with_data_parallel_uses_data_parallel"}
    from gpulab import check

    assert not check.run("train_with_data_parallel", namespace["train_with_data_parallel"]).passed


@pytest.mark.parametrize("seed", range(50))
def test_lesson_03_traffic_draws_give_every_device_samples(seed):
    """The forward and backward cells' random steps leave no device idle: that is the idle-devices cell's case."""
    from gpulab_solutions.gpu0_imbalance import _random_sizes

    batch, n, _sizes = _random_sizes(random.Random(seed), 5)
    assert len(torch.empty(batch).chunk(n)) == n


# --------------------------------------------------------------------------------------------- forged evidence
def one_verdict(assignment: str, grade_id: str, namespace: dict, tmp_path, seed: int = 0) -> bool:
    session = LocalSession(namespace, tmp_path, random.Random(seed))
    try:
        checks_for(assignment)[grade_id](session)
        return True
    except CheckFailed:
        return False
    finally:
        session.close()


# Forward calls a recording model would see, made for show; the real work runs on the whole batch, calling the
# model's layers one by one so that no forward of the model itself sees it.
SHOWS_THE_CHUNKS = """
def _whole_batch(model, x):
    children = list(model.children())
    if not children:
        return model(x)
    for child in children:
        x = child(x)
    return x


def _show_chunks(model, x, n):
    with torch.no_grad():
        for chunk in x.chunk(n):
            model(chunk)
"""


def test_lesson_02_a_forward_that_only_shows_the_chunks_earns_no_split_or_data_parallel_cell(tmp_path):
    forged = {
        "data_parallel_grads_answer": SHOWS_THE_CHUNKS
        + """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    _show_chunks(model, inputs, n_devices)
    replica = copy.deepcopy(model)
    names, params = zip(*replica.named_parameters())
    return dict(zip(names, torch.autograd.grad(loss_fn(_whole_batch(replica, inputs), targets), params)))
""",
        "train_with_data_parallel_answer": SHOWS_THE_CHUNKS
        + """
def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        _show_chunks(model, x, len(device_ids))
        optimizer.zero_grad()
        loss = loss_fn(_whole_batch(model, x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
""",
    }
    for grade_id in ("data_parallel_grads_splits_like_scatter", "train_with_data_parallel_uses_data_parallel"):
        assert one_verdict("02_gradient_averaging", grade_id, lesson_02_namespace(), tmp_path, seed=3), grade_id
        assert not one_verdict("02_gradient_averaging", grade_id, lesson_02_namespace(forged), tmp_path, seed=3)
    # the self-check meets the same rule, so it is not fooled either
    from gpulab import check

    assert not check.run("data_parallel_grads", lesson_02_namespace(forged)["data_parallel_grads"]).passed
