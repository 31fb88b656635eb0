"""Lesson 03 (``03_gpu0_imbalance``): the verdicts of its graded test cells, decided in the grader's process.

``gathered_output_bytes``, ``imbalance_ratio``, ``dp_traffic_bytes`` and ``ring_all_reduce_bytes`` are judged by
their exercises' rules (``gpulab.exercises.gpu0_imbalance``, ``rules.enforce``): each rule's visible inputs (those
the learner's cell asserts) and hidden ones drawn under the same rule with ``session.rng``. ``LossInForward``'s
checks run visible and hidden cases of their own. Every check compares what the notebook's code gives with
references computed here: the bytes of a tensor on the ``meta`` device (or of DataParallel's gathered output, when
this process sees two GPUs), exact fractions, the bytes ``gpulab.traffic`` counts on one DataParallel step, a ring
all-reduce played step by step, and the full-batch loss and gradients, and each chunk's loss (``Tensor.chunk``), of
models and batches made here and sent to the kernel. ``LossInForward`` runs only in the kernel (probes), wrapped as
the lesson wraps it (``nn.DataParallel`` on two GPUs or more, else ``gpulab.DataParallel``). Device 0's peak memory
could only be measured there, where learner code could report any number: ``loss_in_forward_memory`` judges instead
what the wrapped module returns, the numbers device 0 receives: one per replica, that replica's own chunk loss.
"""

from __future__ import annotations

import warnings

import torch
from gpulab import check as gpulab_check
from gpulab.check import Call
from torch import nn

from autograder.checks import CheckFailed, Opaque, Outcome, check, expect
from autograder.checks.quiz import register_quiz
from autograder.checks.rules import enforce, statement

LOSS_TOLERANCE = 1e-5  # absolute, plus 1e-4 relative: the lesson's tolerance on losses and gradients

# What a learner reads when a check fails (English -> Japanese): which rule or case, never the hidden input.
RULES = {
    "forward returns a plain tensor of shape [1]": "forwardは形状[1]の通常のテンソルを返します",
    "the wrapped module gathers one number per device": "ラップしたモジュールは、デバイスごとに数を1つgatherします",
    "sum / len(x) of what DataParallel gathers is the mean loss over the whole batch": (
        "DataParallelがgatherしたもののsum / len(x)は、バッチ全体の平均損失です"
    ),
    "the model is a submodule: LossInForward's parameters are the model's": (
        "モデルはサブモジュールです：LossInForwardのパラメータはモデルのパラメータです"
    ),
    "the gradients are those of the mean loss over the whole batch": "勾配はバッチ全体の平均損失の勾配です",
    "device 0 receives one number per replica": "デバイス0はレプリカごとに数を1つ受け取ります",
    "each number device 0 receives is its replica's own chunk loss": (
        "デバイス0が受け取る各数は、そのレプリカ自身のチャンクの損失です"
    ),
}


# --------------------------------------------------------------------------------------------- gathered_output_bytes
def output_bytes(notebook, workdir, cases):
    """Probe: ``gathered_output_bytes(batch, shape, dtype)`` per ``[batch, shape, is_size, dtype name]`` (the shape
    a tuple, or a ``torch.Size`` when ``is_size``); per case ``["int", int(v)]`` (an integral number, not a bool),
    ``["other", type name]`` or ``["raised", exception MRO names]``."""
    import numbers

    import torch

    if "gathered_output_bytes" not in notebook:
        return ["missing"]
    function = notebook["gathered_output_bytes"]
    results = []
    for batch, shape, is_size, dtype_name in cases:
        dtype = getattr(torch, dtype_name)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"{dtype_name} is not a torch dtype")
        try:
            value = function(batch, torch.Size(shape) if is_size else tuple(shape), dtype)
        except Exception as error:  # noqa: BLE001 - the learner's exception is the outcome
            results.append(["raised", [c.__name__ for c in type(error).__mro__]])
            continue
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            results.append(["int", int(value)])
        else:
            results.append(["other", type(value).__name__])
    return results


def data_parallel_output_bytes(batch: int, shape: tuple, dtype: torch.dtype) -> int:
    """The bytes of the output ``nn.DataParallel`` gathers on GPU 0 (this process needs two GPUs)."""
    torch.manual_seed(0)
    head = nn.Linear(4, shape[-1]).cuda().to(dtype)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        out = nn.DataParallel(head, device_ids=[0, 1])(torch.randn(batch, *shape[:-1], 4, device="cuda:0").to(dtype))
    expect(out.device == torch.device("cuda", 0), "DataParallel gathers on GPU 0")
    return out.numel() * out.element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _bytes_calls(session, calls: list) -> list[Outcome]:
    """The calls of ``gathered_output_bytes`` through ``output_bytes`` (a dtype is not plain data: the kernel
    rebuilds it from its name), as outcomes: the integral value made an ``int`` there, any other value opaque."""
    encoded = [[b, list(s), type(s) is torch.Size, _dtype_name(d)] for b, s, d in (call.args for call in calls)]
    results = session.run(output_bytes, cases=encoded)
    if results == ["missing"]:
        return [Outcome("gathered_output_bytes", missing=True) for _ in calls]
    expect(type(results) is list and len(results) == len(calls), "the kernel's answer is malformed")
    outcomes = []
    for got in results:
        expect(type(got) is list and len(got) == 2 and got[0] in ("int", "other", "raised"), "malformed answer")
        if got[0] == "raised":
            names = got[1]
            expect(type(names) is list and len(names) > 0 and all(type(n) is str for n in names), "malformed")
            outcomes.append(Outcome("gathered_output_bytes", raised=names[0], raised_types=tuple(names)))
        elif got[0] == "int":
            expect(type(got[1]) is int, "the kernel's answer is malformed")
            outcomes.append(Outcome("gathered_output_bytes", returned=got[1]))
        else:
            outcomes.append(Outcome("gathered_output_bytes", returned=Opaque(str(got[1]))))
    return outcomes


def _on_gpus(session, batch: int, shape: tuple, dtype: torch.dtype) -> None:
    """On the grader's GPUs: the bytes of the output ``nn.DataParallel`` itself gathers."""
    if torch.cuda.device_count() >= 2:
        want = data_parallel_output_bytes(batch, shape, dtype)
        (outcome,) = _bytes_calls(session, [Call((batch, shape, dtype))])
        got = outcome.value
        on_gpus = statement("gathered_output_bytes", "float32")  # the rule, against DataParallel's own output
        expect(
            type(got) is int and got == want, f"gathered_output_bytes({batch}, {shape}, {dtype}) on two GPUs", on_gpus
        )


# gathered_output_bytes's rules and references (a tensor of the gathered shape on the meta device) are declared
# once, in gpulab.exercises.gpu0_imbalance; on the grader's GPUs, DataParallel's own gathered output too.
@check("gathered_output_bytes_float32")
def gathered_output_bytes_float32(session) -> None:
    enforce(session, "gathered_output_bytes", "float32", calls=_bytes_calls)
    _on_gpus(session, 33, (1000,), torch.float32)


@check("gathered_output_bytes_dtypes_shapes")
def gathered_output_bytes_dtypes_shapes(session) -> None:
    enforce(session, "gathered_output_bytes", "dtypes_shapes", calls=_bytes_calls)
    _on_gpus(session, 10, (6, 300), torch.float16)


# --------------------------------------------------------------------------------------------- imbalance_ratio
# imbalance_ratio's rules and references (exact fractions) are declared once, in gpulab.exercises.gpu0_imbalance.
@check("imbalance_ratio_ratio")
def imbalance_ratio_ratio(session) -> None:
    enforce(session, "imbalance_ratio", "ratio")


@check("imbalance_ratio_errors")
def imbalance_ratio_errors(session) -> None:
    enforce(session, "imbalance_ratio", "errors")


# --------------------------------------------------------------------------------------------- LossInForward
LOSSES = {
    "cross-entropy": (lambda out, y: nn.functional.cross_entropy(out, y, reduction="sum"), False),
    "squared error": (lambda out, y: nn.functional.mse_loss(out, y, reduction="sum"), True),
    "absolute error, a plain function": (lambda out, y: nn.functional.l1_loss(out, y, reduction="sum"), True),
}


def _network(seed: int, layers: list[int], activation: str) -> nn.Module:
    """``Linear`` (two sizes) or ``Linear -> activation -> Linear`` (three), initialised from ``seed``."""
    torch.manual_seed(seed)
    if len(layers) == 2:
        return nn.Linear(*layers)
    act = nn.Tanh() if activation == "tanh" else nn.ReLU()
    return nn.Sequential(nn.Linear(layers[0], layers[1]), act, nn.Linear(layers[1], layers[2]))


def _batch(generator: torch.Generator, batch: int, layers: list[int], regression: bool):
    x = torch.randn(batch, layers[0], generator=generator)
    if regression:
        return x, torch.randn(batch, layers[-1], generator=generator)
    return x, torch.randint(0, layers[-1], (batch,), generator=generator)


def _loss_case(seed, batch, loss, ids, layers, activation, generator=None) -> dict:
    """One scenario, made here: the model's weights and the batch travel to the kernel."""
    model = _network(seed, layers, activation)
    regression = LOSSES[loss][1]
    x, y = _batch(generator or torch.Generator().manual_seed(seed), batch, layers, regression)
    return {
        "layers": list(layers),
        "activation": activation,
        "state": [[name, tensor.detach().clone()] for name, tensor in model.state_dict().items()],
        "loss": loss,
        "ids": list(ids),
        "x": x,
        "y": y,
    }


def _case_model(case: dict) -> nn.Module:
    model = _network(0, case["layers"], case["activation"])
    model.load_state_dict(dict(case["state"]))
    return model


def loss_in_forward_runs(notebook, workdir, cases, backward):
    """Probe: for each scenario, the notebook's ``LossInForward(model, loss_fn)`` on the scenario's model and batch
    (on ``cuda:0`` when there is a GPU), called directly and wrapped in DataParallel on the scenario's devices
    (``nn.DataParallel`` on enough real GPUs, else ``gpulab.DataParallel``), the lesson's two devices chosen first.
    Without ``backward``: the direct and gathered results; with it, the model's parameters are first moved by
    ``case["shift"]`` (in place), then come back: the values of the module's parameters (``module.parameters()``:
    the model's, moved, when the model is its submodule) and the model's gradients after
    ``(wrapped(x, y).sum() / len(x)).backward()``."""
    import warnings

    import gpulab
    import torch
    from torch import nn

    if "LossInForward" not in notebook:
        return ["missing"]
    cls = notebook["LossInForward"]
    gpulab.devices(2, quiet=True)  # the lesson's devices, whatever the notebook chose since
    primary = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    losses = {
        "cross-entropy": nn.CrossEntropyLoss(reduction="sum"),
        "squared error": nn.MSELoss(reduction="sum"),
        "absolute error, a plain function": lambda out, y: nn.functional.l1_loss(out, y, reduction="sum"),
    }

    def plain(value):
        if isinstance(value, torch.Tensor):
            return ["tensor", type(value).__name__, value.detach().cpu().clone().as_subclass(torch.Tensor)]
        return ["other", type(value).__name__]

    def wrap(module, ids):
        if torch.cuda.device_count() >= len(ids) >= 2:
            return nn.DataParallel(module, device_ids=ids), "nn.DataParallel"
        return gpulab.DataParallel(module, device_ids=ids), "gpulab.DataParallel"

    results = []
    for case in cases:
        layers = case["layers"]
        if len(layers) == 2:
            model = nn.Linear(layers[0], layers[1])
        else:
            act = nn.Tanh() if case["activation"] == "tanh" else nn.ReLU()
            model = nn.Sequential(nn.Linear(layers[0], layers[1]), act, nn.Linear(layers[1], layers[2]))
        model.load_state_dict(dict(case["state"]))
        model = model.to(primary)
        x, y = case["x"].to(primary), case["y"].to(primary)
        module = cls(model, losses[case["loss"]])
        kind = None
        if backward:
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(case["shift"])
            held = [plain(parameter) for parameter in module.parameters()]
            if case["ids"]:
                wrapped, kind = wrap(module, case["ids"])
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    (wrapped(x, y).sum() / len(x)).backward()
            grads = [[name, None if p.grad is None else plain(p.grad)] for name, p in model.named_parameters()]
            results.append({"held": held, "grads": grads, "wrapper": kind})
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            direct = module(x, y)
            gathered = None
            if case["ids"]:
                wrapped, kind = wrap(module, case["ids"])
                gathered = wrapped(x, y)
        results.append({"direct": plain(direct), "gathered": plain(gathered), "wrapper": kind})
    return results


def _runs(session, cases: list[dict], backward: bool) -> list[dict]:
    results = session.run(loss_in_forward_runs, cases=cases, backward=backward)
    if results == ["missing"]:
        raise CheckFailed("LossInForward is not defined: run its cell", "the function is not defined: run its cell")
    expect(type(results) is list and len(results) == len(cases), "the kernel's answer is malformed")
    expect(all(type(r) is dict for r in results), "the kernel's answer is malformed")
    return results


def _close(got: float, want: float) -> bool:
    return abs(got - want) <= LOSS_TOLERANCE + 1e-4 * abs(want)


def _tensor(entry, what: str, rule: str) -> torch.Tensor:
    expect(type(entry) is list and len(entry) == 3 and entry[0] == "tensor", f"{what} must return a tensor", rule)
    expect(type(entry[2]) is torch.Tensor, "the kernel's answer is malformed")
    return entry[2]


_SHAPE_1 = "forward returns a plain tensor of shape [1]"
_ONE_PER_DEVICE = "the wrapped module gathers one number per device"


@check("loss_in_forward_value")
def loss_in_forward_value(session) -> None:
    cases = [  # (seed, batch, loss, devices, layers, activation): the visible scenarios first, then the hidden ones
        (1, 10, "cross-entropy", [0, 1], [6, 8, 5], "relu"),
        (2, 7, "squared error", [0, 1], [6, 8, 3], "relu"),
        (1, 10, "cross-entropy", [0, 1], [5, 7, 4], "tanh"),
        (2, 7, "cross-entropy", [0, 1], [5, 7, 4], "tanh"),
        (3, 9, "squared error", [0, 1], [5, 7, 3], "tanh"),
        (4, 3, "absolute error, a plain function", [0, 1], [5, 7, 3], "tanh"),
        (5, 1, "cross-entropy", [0, 1], [5, 7, 4], "tanh"),
        (6, 12, "squared error", [0], [5, 7, 3], "tanh"),
        (7, 13, "cross-entropy", [0, 1], [5, 7, 4], "tanh"),
    ]
    for _ in range(2):
        loss = session.rng.choice(sorted(LOSSES))
        outputs = session.rng.randint(2, 6)
        layers = [session.rng.randint(2, 8), session.rng.randint(2, 8), outputs]
        seed = session.rng.randint(0, 2**31)
        cases.append((seed, session.rng.randint(1, 17), loss, [0, 1], layers, session.rng.choice(["relu", "tanh"])))
    scenarios = [_loss_case(*case) for case in cases]
    # the visible shape test: nn.Linear(3, 2), cross-entropy summed, four samples of ones, called directly
    shape_case = _loss_case(session.rng.randint(0, 2**31), 4, "cross-entropy", [], [3, 2], "")
    shape_case["x"], shape_case["y"] = torch.ones(4, 3), torch.ones(4).long()
    results = _runs(session, [*scenarios, shape_case], backward=False)
    direct = _tensor(results[-1]["direct"], "forward", _SHAPE_1)
    expect(tuple(direct.shape) == (1,), f"forward must return shape [1], not {tuple(direct.shape)}", _SHAPE_1)
    for (_seed, batch, loss, ids, _, _), scenario, result in zip(cases, scenarios, results, strict=False):
        what = f"{batch} samples on devices {ids}, {loss} ({result.get('wrapper')})"
        summed = LOSSES[loss][0]
        with torch.no_grad():
            want = float(summed(_case_model(scenario)(scenario["x"]), scenario["y"])) / batch
        direct = _tensor(result["direct"], f"{what}: forward", _SHAPE_1)
        expect(result["direct"][1] == "Tensor", f"{what}: forward must return a plain tensor", _SHAPE_1)
        # shape [1]: DataParallel gathers it without its scalar warning (a 0-dim result is what it warns about)
        expect(
            tuple(direct.shape) == (1,), f"{what}: forward must return shape [1], got {tuple(direct.shape)}", _SHAPE_1
        )
        gathered = _tensor(result["gathered"], f"{what}: the wrapped module", _ONE_PER_DEVICE)
        chunks = len(torch.empty(batch).chunk(len(ids)))
        expect(tuple(gathered.shape) == (chunks,), f"{what}: one number per device", _ONE_PER_DEVICE)
        got = float(gathered.double().sum()) / batch
        shown_got, shown_want = gpulab_check.format_pair(got, want)
        expect(
            _close(got, want),
            f"{what}: sum / len(x) = {shown_got}, the mean loss is {shown_want}",
            "sum / len(x) of what DataParallel gathers is the mean loss over the whole batch",
        )


def _shifted_model(case: dict, shift: float) -> nn.Module:
    """The case's model with every parameter moved by ``shift``, as the probe moves the kernel's."""
    model = _case_model(case)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(shift)
    return model


def _holds(held, parameter: torch.Tensor) -> bool:
    """``held`` (the module's parameters, as values) holds ``parameter``'s values."""
    return any(
        type(entry) is list
        and len(entry) == 3
        and type(entry[2]) is torch.Tensor
        and entry[2].shape == parameter.shape
        and entry[2].tolist() == parameter.tolist()
        for entry in held
    )


_SUBMODULE = "the model is a submodule: LossInForward's parameters are the model's"


@check("loss_in_forward_gradients")
def loss_in_forward_gradients(session) -> None:
    generator = torch.Generator().manual_seed(21)
    cases = [  # the visible scenario, then the hidden ones (one generator for their batches, as they had)
        (_loss_case(3, 9, "cross-entropy", [0, 1], [6, 8, 5], "relu"), 9),
    ]
    for seed, batch, regression, ids in [
        (11, 9, False, [0, 1]),
        (12, 7, True, [0, 1]),
        (13, 3, False, [0, 1]),
        (14, 16, False, [0, 1]),
        (15, 5, True, [0]),
    ]:
        loss = "squared error" if regression else "cross-entropy"
        layers = [5, 6, 3 if regression else 4]
        cases.append((_loss_case(seed, batch, loss, ids, layers, "relu", generator), batch))
    for _ in range(2):
        loss = session.rng.choice(["squared error", "cross-entropy"])
        layers = [session.rng.randint(2, 7), session.rng.randint(2, 7), session.rng.randint(2, 5)]
        batch = session.rng.randint(2, 15)
        cases.append((_loss_case(session.rng.randint(0, 2**31), batch, loss, [0, 1], layers, "tanh"), batch))
    # the visible registration test: nn.Linear(3, 2) in LossInForward with a summed squared error
    registration = _loss_case(0, 4, "squared error", [], [3, 2], "")
    # The probe moves the model's parameters after LossInForward is built: the module's parameters hold the moved
    # values only when they are the model's (a registered submodule), not a copy or none.
    shift = session.rng.choice([0.25, -0.5, 0.125, 0.75])
    scenarios = [dict(scenario, shift=shift) for scenario, _ in cases] + [dict(registration, shift=shift)]
    results = _runs(session, scenarios, backward=True)
    for result in results:
        expect(type(result.get("held")) is list, "the kernel's answer is malformed")
    # as the visible test asks it: the module's parameters include the model's (first) weight
    first = next(_shifted_model(registration, shift).parameters())
    expect(
        _holds(results[-1]["held"], first),
        "the model must be a submodule: its parameters are LossInForward's",
        _SUBMODULE,
    )
    for (scenario, batch), result in zip(cases, results, strict=False):
        what = f"{batch} samples on devices {scenario['ids']} ({result.get('wrapper')})"
        reference = _shifted_model(scenario, shift)
        registered = all(_holds(result["held"], p.detach()) for p in reference.parameters())
        expect(registered, f"{what}: the model must be a submodule (its parameters)", _SUBMODULE)
        names, parameters = zip(*reference.named_parameters(), strict=True)
        full_batch_mean = LOSSES[scenario["loss"]][0](reference(scenario["x"]), scenario["y"]) / batch
        want = torch.autograd.grad(full_batch_mean, parameters)
        grads = result.get("grads")
        full_batch = "the gradients are those of the mean loss over the whole batch"
        named = [g[0] if type(g) is list else None for g in grads] if type(grads) is list else None
        expect(named == list(names), what, _SUBMODULE)
        for name, (_, entry), wanted in zip(names, grads, want, strict=True):
            expect(entry is not None, f"{what}: no gradient reached {name}", full_batch)
            got = _tensor(entry, f"{what}: the gradient of {name}", full_batch)
            expect(got.numel() == wanted.numel(), f"{what}: shape of {name}'s gradient", full_batch)
            close = [
                _close(a, b)
                for a, b in zip(got.double().reshape(-1).tolist(), wanted.reshape(-1).tolist(), strict=True)
            ]
            expect(all(close), f"{what}: the gradient of {name} is not the full-batch gradient", full_batch)


@check("loss_in_forward_memory")
def loss_in_forward_memory(session) -> None:
    # What device 0 receives from DataParallel is what the wrapped module returns: one number per replica, that
    # replica's own chunk loss (summed or averaged over the chunk: the reduction is loss_in_forward_value's cell),
    # instead of batch x classes outputs. Device 0's peak memory follows from it, but only the kernel could measure
    # it, and learner code there could report any peak: the verdict rests on the returned numbers alone.
    cases = [  # the visible cell's scenario (64 samples x 4,000 classes), then the hidden ones
        _loss_case(5, 64, "cross-entropy", [0, 1], [12, 16, 4_000], "relu"),
        _loss_case(session.rng.randint(0, 2**31), 96, "cross-entropy", [0, 1], [12, 16, 6_000], "relu"),
        _loss_case(
            session.rng.randint(0, 2**31), session.rng.randint(2, 99), "cross-entropy", [0, 1], [8, 16, 3_000], "relu"
        ),
    ]
    summed = LOSSES["cross-entropy"][0]
    for case, result in zip(cases, _runs(session, cases, backward=False), strict=True):
        x, y = case["x"], case["y"]
        what = f"{len(x)} samples x {case['layers'][-1]:,} classes on devices {case['ids']} ({result.get('wrapper')})"
        per_replica = "device 0 receives one number per replica"
        gathered = _tensor(result["gathered"], f"{what}: the wrapped module", per_replica)
        pieces = list(zip(x.chunk(len(case["ids"])), y.chunk(len(case["ids"])), strict=True))
        expect(
            tuple(gathered.shape) == (len(pieces),),
            f"{what}: device 0 should receive one number per replica ({len(pieces)}), not {tuple(gathered.shape)}",
            per_replica,
        )
        model = _case_model(case)
        with torch.no_grad():
            sums = [float(summed(model(xc), yc)) for xc, yc in pieces]
        got = gathered.double().tolist()
        per_chunk = any(
            all(_close(g, w) for g, w in zip(got, wants, strict=True))
            for wants in (sums, [total / len(xc) for total, (xc, _) in zip(sums, pieces, strict=True)])
        )
        own = "each number device 0 receives is its replica's own chunk loss"
        expect(per_chunk, f"{what}: {own}", own)


# --------------------------------------------------------------------------------------------- dp_traffic_bytes
# dp_traffic_bytes's rules, their inputs and references (the bytes gpulab.traffic counts on one DataParallel step,
# measured in this process) are declared once, in gpulab.exercises.gpu0_imbalance; each cell enforces its rules on
# their visible inputs and on hidden ones drawn here (_random_sizes: steps on which every device gets samples).
@check("dp_traffic_bytes_forward")
def dp_traffic_bytes_forward(session) -> None:
    enforce(session, "dp_traffic_bytes", "forward")


@check("dp_traffic_bytes_backward")
def dp_traffic_bytes_backward(session) -> None:
    enforce(session, "dp_traffic_bytes", "backward")


@check("dp_traffic_bytes_idle_devices")
def dp_traffic_bytes_idle_devices(session) -> None:
    enforce(session, "dp_traffic_bytes", "idle_devices")


# --------------------------------------------------------------------------------------------- ring_all_reduce_bytes
# ring_all_reduce_bytes's rules and references are declared once, in gpulab.exercises.gpu0_imbalance; its hidden
# inputs come with the bytes of a ring played on a random cut of the tensor, computed here (the total does not
# depend on the cut).
@check("ring_all_reduce_bytes_total")
def ring_all_reduce_bytes_total(session) -> None:
    enforce(session, "ring_all_reduce_bytes", "total")


@check("ring_all_reduce_bytes_errors")
def ring_all_reduce_bytes_errors(session) -> None:
    enforce(session, "ring_all_reduce_bytes", "errors")


# --------------------------------------------------------------------------------------------- quiz
register_quiz(__name__, "03_gpu0_imbalance")  # quiz_q1...: the declaration in gpulab.exercises.quizzes
