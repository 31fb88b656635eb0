"""Lesson 02 (``02_gradient_averaging``): the verdicts of its graded test cells, decided in the grader's process.

Every exercise of the lesson is judged by its rules (``gpulab.exercises.gradient_averaging``, ``rules.enforce``):
each rule's visible inputs and hidden ones drawn under the same rule, compared here with the rule's reference. The
exercises after ``average_gradients`` take models and loss functions, which do not travel on the wire: the grader
describes each model (``_describe``: its layers) and sends its weights, and the probe ``call_with_models`` builds
the same model in the kernel from that description, loads the grader's weights (and stale ``.grad``), calls the
notebook's function and sends back plain data: the return value (tensor and float subclasses made plain, as
``isinstance`` accepted them), the arguments afterwards (the model as its weights and ``.grad``) and the device it
ran on. On a grader with two GPUs or more, some cells also meet ``nn.DataParallel`` itself, run here by the same
probe on the GPUs.

Whether the batch was split as DataParallel's scatter splits it (``data_parallel_grads``) and whether training ran
through DataParallel (``train_with_data_parallel``) is *how* an answer computes, which the kernel could misreport:
those cells send a model whose output depends on the chunk each replica receives (``BatchMix``: each sample plus
its chunk's mean, as BatchNorm's training statistics depend on the chunk), so that only that split gives the
gradients and losses the grader computes chunk by chunk.
"""

from __future__ import annotations

import copy
import functools
import warnings

import torch
from gpulab.check import Call, plain_state
from gpulab.exercises.gradient_averaging import BatchMix, Chain
from gpulab_solutions.gradient_averaging import sgd_loop
from torch import nn

from autograder.checks import CheckFailed, Outcome, expect
from autograder.checks import check as register_check
from autograder.checks.quiz import register_quiz
from autograder.checks.rules import enforce, statement

TOLERANCE = 1e-5
"""Absolute tolerance of the lesson's comparisons; the relative one is ten times it (1e-5 + 1e-4 * |want|)."""

GPU_TOLERANCE = 1e-4
"""Against ``nn.DataParallel`` on real GPUs (another summation order across devices)."""

# What each graded cell tests, named by feedback when a failure names no rule of its own (English -> Japanese).
CELL_RULES = {
    # the exercise declared as rules: its rules' own statements
    "average_gradients_weights": statement("average_gradients", "weights"),
    "average_gradients_checks": statement("average_gradients", "checks"),
    "data_parallel_grads_full_batch": statement("data_parallel_grads", "full_batch"),
    "data_parallel_grads_splits_like_scatter": statement("data_parallel_grads", "splits_like_scatter"),
    "data_parallel_grads_model_unchanged": statement("data_parallel_grads", "model_unchanged"),
    "train_with_data_parallel_losses": "one loss per batch, a Python float, the same as training on one device",
    "train_with_data_parallel_weights": "the model you are given ends up holding the trained weights",
    "train_with_data_parallel_uses_data_parallel": (
        "each step's forward goes through DataParallel (its chunks of the batch)"
    ),
}
RULES = {
    "one loss per batch, a Python float, the same as training on one device": (
        "バッチごとに損失を1つ、Pythonのfloatで返し、1デバイスでの学習と同じ値です"
    ),
    "the model you are given ends up holding the trained weights": "渡されたモデルが、学習後の重みを持つようになります",
    "each step's forward goes through DataParallel (its chunks of the batch)": (
        "各ステップのフォワードはDataParallel（バッチのチャンク）を通ります"
    ),
}


def check(grade_id: str):
    """``autograder.checks.check``, with the grader's torch on one thread while the check runs: its models are
    tiny, and a second thread only spins against the kernel's (several times slower on a busy machine)."""

    def register(fn):
        @functools.wraps(fn)
        def one_thread(session):
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return fn(session)
            finally:
                torch.set_num_threads(threads)

        return register_check(grade_id)(one_thread)

    return register


# --------------------------------------------------------------------------------------------- models
def _linear(n_in: int, n_out: int, bias: bool = True) -> list:
    return ["linear", n_in, n_out, bias]


def _mlp(n_in: int, hidden: int, n_out: int, activation: str = "tanh") -> list:
    """``nn.Sequential(Linear, activation, Linear)``: parameters ``0.weight``, ``0.bias``, ``2.weight``, ..."""
    return ["sequential", [_linear(n_in, hidden), [activation], _linear(hidden, n_out)]]


def _build(spec) -> nn.Module:
    """The grader's copy of a described model (the probe builds the same one in the kernel)."""
    kind = spec[0]
    if kind == "linear":
        return nn.Linear(spec[1], spec[2], bias=spec[3])
    if kind == "sequential":
        return nn.Sequential(*[_build(s) for s in spec[1]])
    if kind == "chain":
        return Chain(spec[2], **{name: _build(child) for name, child in spec[1]})
    return {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "batchmix": BatchMix}[kind]()


def _weights(spec, seed: int) -> dict[str, torch.Tensor]:
    """``{name: weight}`` of ``spec`` built right after ``torch.manual_seed(seed)``, as the hidden tests built it
    (the grader's own random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return {name: p.detach().clone() for name, p in _build(spec).named_parameters()}


def _describe(module: nn.Module) -> list:
    """The description of a rule's model (gpulab's small MLPs and ``Chain``s)."""
    if type(module) is nn.Linear:
        return _linear(module.in_features, module.out_features, module.bias is not None)
    if isinstance(module, nn.Sequential):
        return ["sequential", [_describe(child) for child in module]]
    for kind, cls in (("tanh", nn.Tanh), ("relu", nn.ReLU), ("gelu", nn.GELU), ("batchmix", BatchMix)):
        if type(module) is cls:
            return [kind]
    if type(module) is Chain:
        return ["chain", [[name, _describe(child)] for name, child in module.named_children()], module.label]
    raise RuntimeError(f"grader error: no description of a {type(module).__name__}")


def _loss(loss_fn) -> list:
    """The description of a rule's loss function."""
    for name in ("cross_entropy", "mse_loss"):
        if loss_fn is getattr(nn.functional, name):
            return [name, {}]
    if type(loss_fn) is nn.CrossEntropyLoss and loss_fn.reduction == "mean" and loss_fn.weight is None:
        smoothing = loss_fn.label_smoothing
        return ["CrossEntropyLoss", {"label_smoothing": smoothing} if smoothing else {}]
    if type(loss_fn) is nn.MSELoss and loss_fn.reduction == "mean":
        return ["MSELoss", {}]
    raise RuntimeError(f"grader error: no description of the loss {loss_fn!r}")


CROSS_ENTROPY = ["cross_entropy", {}]


# --------------------------------------------------------------------------------------------- the probe
def call_with_models(notebook, workdir, name, cases):
    """Probe: call ``notebook[name]`` once per case; ``None`` when the name is not defined.

    A case: ``args`` (``"MODEL"`` and ``"LOSS"`` stand for the case's model and loss function; tensors, also
    inside lists and tuples, go to the case's device), ``model`` (a description, or ``None``), ``state`` (its
    weights), ``stale`` (``.grad`` to leave in it first, or ``None``), ``loss`` and ``device`` (``"cpu"``,
    ``"cuda:0"``, ``"primary"``: ``cuda:0`` when CUDA is available, ``"gpus"``: ``cuda:0`` on a machine with two
    GPUs or more, else the case is skipped), ``report_state`` (send the model back as ``plain_state`` has it: weights,
    ``.grad``, ``requires_grad`` and modes). The models are built of gpulab's own classes (``Chain``, ``BatchMix``),
    as the self-check's are, so that an answer copies or pickles them there as it does here. Per case:
    ``{"raised": [exception class names]}``, ``{"skipped": True}`` or ``{"value", "state", "after", "device"}``
    (``after``, with ``report_state``: the arguments after the call, the model as its ``state``, the loss function
    as ``"LOSS"``).
    The calls run with torch on one thread (tiny models; a second thread only spins against the grader's).
    """
    import torch
    from torch import nn

    if name not in notebook:
        return None
    function = notebook[name]

    # gpulab's own classes, as in the self-check: a model pickles (torch.save) and copies as it does there
    from gpulab.check import plain_state
    from gpulab.exercises.gradient_averaging import BatchMix, Chain

    def build(spec):
        if spec[0] == "linear":
            return nn.Linear(spec[1], spec[2], bias=spec[3])
        if spec[0] == "sequential":
            return nn.Sequential(*[build(s) for s in spec[1]])
        if spec[0] == "chain":
            return Chain(spec[2], **{child_name: build(child) for child_name, child in spec[1]})
        return {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "batchmix": BatchMix}[spec[0]]()

    def moved(value, device):
        if type(value) is torch.Tensor:
            return value.to(device)
        if type(value) in (list, tuple):
            return type(value)(moved(item, device) for item in value)
        return value

    def plain(value, depth=0):
        # what isinstance accepted, as the wire carries it: tensor, float and dict subclasses made plain
        if depth > 2:
            return value
        if isinstance(value, torch.Tensor) and type(value) is not torch.Tensor:
            try:
                return torch.Tensor.as_subclass(value, torch.Tensor)
            except Exception:  # noqa: BLE001 - left as it is: the wire sends its type's name only
                return value
        if isinstance(value, float) and type(value) is not float:
            return float.__float__(value)
        if isinstance(value, dict):
            return {key: plain(item, depth + 1) for key, item in dict.items(value)}
        if type(value) is list:
            return [plain(item, depth + 1) for item in value]
        return value

    def run(case):
        device = case["device"]
        if device == "gpus":
            if torch.cuda.device_count() < 2:
                return {"skipped": True}
            device = "cuda:0"
        elif device == "primary":
            device = "cuda:0" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        model = None
        if case["model"] is not None:
            model = build(case["model"])
            with torch.no_grad():
                for parameter_name, parameter in model.named_parameters():
                    parameter.copy_(case["state"][parameter_name])
            model = model.to(device)
            for parameter_name, parameter in model.named_parameters():
                if case["stale"] is not None and parameter_name in case["stale"]:
                    parameter.grad = case["stale"][parameter_name].to(device)
        loss_fn = None
        if case["loss"] is not None:
            loss_name, loss_kwargs = case["loss"]
            functions = {"cross_entropy": nn.functional.cross_entropy, "mse_loss": nn.functional.mse_loss}
            modules = {"CrossEntropyLoss": nn.CrossEntropyLoss, "MSELoss": nn.MSELoss}
            loss_fn = functions[loss_name] if loss_name in functions else modules[loss_name](**loss_kwargs)
        stands_for = {"MODEL": model, "LOSS": loss_fn}
        args = [stands_for[a] if type(a) is str and a in stands_for else a for a in case["args"]]
        called = moved(args, device)
        try:
            value = function(*called)
        except Exception as error:  # noqa: BLE001 - the learner's exception is the outcome
            return {"raised": [c.__name__ for c in type(error).__mro__]}
        state = after = None
        if model is not None and case["report_state"]:
            state = plain_state(model)
        if case["report_state"]:  # the arguments as they are now; the loss function stays a name
            after = [state if a is model else "LOSS" if a is loss_fn else plain_state(a) for a in called]
        value = plain(value)
        return {"value": value, "state": state, "after": after, "device": str(device)}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only spins against the grader's process
    try:
        return [run(case) for case in cases]
    finally:
        torch.set_num_threads(threads)


def _case(args, model=None, state=None, stale=None, loss=None, device="cpu", report_state=False) -> dict:
    return {
        "args": list(args),
        "model": model,
        "state": state,
        "stale": stale,
        "loss": loss,
        "device": device,
        "report_state": report_state,
    }


def _kernel(session, name: str, cases: list[dict]) -> list[dict]:
    """The probe's results in the kernel, one round trip for all ``cases``; each checked for shape here."""
    results = session.run(call_with_models, name=name, cases=cases)
    if results is None:
        raise CheckFailed(f"{name} is not defined: run its cell")
    expect(type(results) is list and len(results) == len(cases), "the kernel's answer is malformed")
    for result in results:
        expect(type(result) is dict, "the kernel's answer is malformed")
        if "raised" in result:
            raised = result["raised"]
            what = raised[0] if type(raised) is list and raised and type(raised[0]) is str else "an exception"
            raise CheckFailed(f"{name} raised {what}")
        expect("skipped" in result or {"value", "state", "device"} <= set(result), "malformed answer")
    return results


def _reference(name: str, function, cases: list[dict], devices: list[str] | None = None) -> list[dict]:
    """The same probe run in the grader's process on a reference ``function`` (on ``devices``, one per case:
    where the kernel ran, when this process has that device)."""
    if devices is not None:
        cases = [dict(case, device=_here(device)) for case, device in zip(cases, devices, strict=True)]
    with torch.random.fork_rng(devices=[]):
        return call_with_models({name: function}, None, name, cases)


def _here(device) -> str:
    return "cuda:0" if device == "cuda:0" and torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------------------------- comparing
def _close(got, want: torch.Tensor, tolerance: float = TOLERANCE, shaped: bool = True) -> bool:
    """``got`` is a tensor with ``want``'s values within ``tolerance + 10 * tolerance * |want|`` (NaN never
    matches); ``shaped``: and its shape, else only its number of values."""
    if type(got) is not torch.Tensor or not got.is_floating_point():  # bits, quantised or complex: no gradient
        return False
    if shaped and tuple(got.shape) != tuple(want.shape):
        return False
    g, w = got.detach().cpu().reshape(-1).tolist(), want.detach().cpu().reshape(-1).tolist()
    return len(g) == len(w) and all(
        abs(a - b) <= tolerance + 10 * tolerance * abs(b) for a, b in zip(g, w, strict=True)
    )


def _same_dict(got, want: dict, what: str, tolerance: float = TOLERANCE, shaped: bool = True) -> None:
    expect(type(got) is dict, f"{what}: return a dict keyed by parameter name")
    expect(all(type(k) is str for k in got) and sorted(got) == sorted(want), f"{what}: keys {sorted(want)}")
    for name, w in want.items():
        expect(type(got[name]) is torch.Tensor, f"{what}: {name} is not a tensor")
        expect(_close(got[name], w, tolerance, shaped), f"{what}: gradient of {name}")


# --------------------------------------------------------------------------------------------- average_gradients
# average_gradients's rules, inputs and references (a model's full-batch gradient, made with its chunk gradients,
# or exact weights applied in float64) are declared once, in gpulab.exercises.gradient_averaging; each cell
# enforces its rules on their visible inputs and on hidden ones drawn here.
@check("average_gradients_weights")
def average_gradients_weights(session) -> None:
    enforce(session, "average_gradients", "weights")


@check("average_gradients_checks")
def average_gradients_checks(session) -> None:
    enforce(session, "average_gradients", "checks")


# --------------------------------------------------------------------------------------------- data_parallel_grads
# data_parallel_grads's rules, inputs and references (full-batch gradients; each chunk forwarded on its own through
# a model that mixes each chunk; arguments left as they were) are declared once, in
# gpulab.exercises.gradient_averaging; each cell enforces its rules through the probe, which rebuilds each rule's
# model and loss function in the kernel from their descriptions. On a grader with two GPUs or more, the full-batch
# cell also meets nn.DataParallel itself.
def _described(call: Call, device: str) -> dict:
    """The probe's case of one rule input: its model (an ``nn.Module`` that is not a loss) and loss function stand
    as ``"MODEL"`` and ``"LOSS"``, described; its tensors go to ``device`` in the kernel."""
    model = loss_fn = None
    args = []
    for value in call.args:
        if _is_loss(value):
            loss_fn, value = value, "LOSS"
        elif isinstance(value, nn.Module):
            model, value = value, "MODEL"
        args.append(_on_cpu(value))
    trains = all(m.training for m in model.modules()) and all(p.requires_grad for p in model.parameters())
    if not trains:  # the description carries weights and .grad only: every rule's model trains all its parameters
        raise RuntimeError("grader error: a rule's model is frozen or in eval mode")
    state = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
    stale = {name: p.grad.detach().cpu().clone() for name, p in model.named_parameters() if p.grad is not None}
    return _case(args, _describe(model), state, stale or None, _loss(loss_fn), device, report_state=True)


def _is_loss(value) -> bool:
    return isinstance(value, nn.modules.loss._Loss) or value in (nn.functional.cross_entropy, nn.functional.mse_loss)


def _on_cpu(value):
    """Tensors (also inside lists and tuples) on the CPU, for the wire; the probe puts them on the case's device."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if type(value) in (list, tuple):
        return type(value)(_on_cpu(item) for item in value)
    return value


def _described_calls(session, calls: list[Call], name: str, device: str = "cpu") -> list[Outcome]:
    """``rules.enforce``'s calling path for the exercises that take a model: one probe round trip for all
    ``calls``; each outcome with the arguments after the call as ``plain_state`` has them (the loss function is
    rebuilt from its name in the kernel: nothing of it can reach the caller, so the grader's own stands in for
    it)."""
    cases = [_described(call, device) for call in calls]
    results = session.run(call_with_models, name=name, cases=cases)
    if results is None:
        return [Outcome(name, missing=True) for _ in calls]
    expect(type(results) is list and len(results) == len(calls), "the kernel's answer is malformed")
    outcomes = []
    for call, case, result in zip(calls, cases, results, strict=True):
        expect(type(result) is dict, "the kernel's answer is malformed")
        if "raised" in result:
            raised = result["raised"]
            expect(type(raised) is list and raised and all(type(r) is str for r in raised), "malformed answer")
            outcomes.append(Outcome(name, raised=raised[0], raised_types=tuple(raised)))
            continue
        after = result.get("after")
        expect(type(after) is list and len(after) == len(call.args) and "value" in result, "malformed answer")
        losses = [index for index, value in enumerate(case["args"]) if type(value) is str and value == "LOSS"]
        expect(all(type(after[i]) is str and after[i] == "LOSS" for i in losses), "the kernel's answer is malformed")
        args_after = [plain_state(call.args[i]) if i in losses else value for i, value in enumerate(after)]
        outcomes.append(Outcome(name, returned=result["value"], args_after=[args_after, {}]))
    return outcomes


def _with_data_parallel(model, inputs, targets, loss_fn, n_devices):
    """Reference on real GPUs: the gradients ``nn.DataParallel`` itself leaves in the parameters."""
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel = nn.DataParallel(reference, device_ids=list(range(n_devices)))
        loss_fn(parallel(inputs), targets).backward()
    return {name: p.grad for name, p in reference.named_parameters()}


def _gradients_case(spec, state, x, y, loss, n, device="cpu") -> dict:
    return _case(["MODEL", x, y, "LOSS", n], spec, state, None, loss, device)


# The tensors of data_parallel_grads's inputs stay on the CPU, as in the lesson's visible cells.
_DATA_PARALLEL_GRADS_CALLS = functools.partial(_described_calls, name="data_parallel_grads")


@check("data_parallel_grads_full_batch")
def data_parallel_grads_full_batch(session) -> None:
    enforce(session, "data_parallel_grads", "full_batch", calls=_DATA_PARALLEL_GRADS_CALLS)
    if torch.cuda.device_count() >= 2:  # the grader's GPUs: against nn.DataParallel itself
        generator = torch.Generator().manual_seed(3)
        gpu_cases = []
        for b, n in [(12, 2), (11, 2), (10, 3), (9, 4)]:
            if n > torch.cuda.device_count():
                continue
            spec = _mlp(5, 6, 3, "relu")
            x = torch.randn(b, 5, generator=generator)
            y = torch.randint(0, 3, (b,), generator=generator)
            gpu_cases.append(_gradients_case(spec, _weights(spec, b * n), x, y, CROSS_ENTROPY, n, device="gpus"))
        results = _kernel(session, "data_parallel_grads", gpu_cases)
        references = _reference("data_parallel_grads", _with_data_parallel, gpu_cases)
        for case, result, reference in zip(gpu_cases, results, references, strict=True):
            if "skipped" in result:  # the kernel sees fewer GPUs than the grader
                break
            what = f"{len(case['args'][1])} samples on {case['args'][4]} GPUs, against nn.DataParallel"
            _same_dict(result["value"], reference["value"], what, GPU_TOLERANCE)


@check("data_parallel_grads_splits_like_scatter")
def data_parallel_grads_splits_like_scatter(session) -> None:
    enforce(session, "data_parallel_grads", "splits_like_scatter", calls=_DATA_PARALLEL_GRADS_CALLS)


@check("data_parallel_grads_model_unchanged")
def data_parallel_grads_model_unchanged(session) -> None:
    enforce(session, "data_parallel_grads", "model_unchanged", calls=_DATA_PARALLEL_GRADS_CALLS)


# --------------------------------------------------------------------------------------------- train_with_data_parallel
# train_with_data_parallel's rules, inputs and references (the one-device SGD loop's losses and trained weights; the
# loop with each batch chunked over device_ids, on a model that mixes each chunk) are declared once, in
# gpulab.exercises.gradient_averaging; each cell enforces its rules through the probe, on the lesson's primary
# device (cuda:0 where the kernel has a GPU). On a grader with two GPUs or more, the losses and weights cells also
# meet a loop through nn.DataParallel itself.
_TRAINING_CALLS = functools.partial(_described_calls, name="train_with_data_parallel", device="primary")


def _data_parallel_loop(model, batches, loss_fn, lr, device_ids):
    """Reference on real GPUs: the lesson's SGD loop through ``nn.DataParallel`` itself, training ``model``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sgd_loop(nn.DataParallel(model, device_ids=device_ids), batches, loss_fn, lr)


def _on_two_gpus(session, seed: int, samples: int, batch_size: int) -> tuple[dict, dict] | None:
    """The kernel's training on two GPUs and ``nn.DataParallel``'s here; None where the kernel has fewer."""
    spec = _mlp(5, 8, 3)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 5, generator=generator)
    y = torch.randint(0, 3, (samples,), generator=generator)
    batches = [(x[s : s + batch_size], y[s : s + batch_size]) for s in range(0, samples, batch_size)]
    args = ["MODEL", batches, "LOSS", 0.5, [0, 1]]
    case = _case(args, spec, _weights(spec, seed), None, CROSS_ENTROPY, "gpus", report_state=True)
    result = _kernel(session, "train_with_data_parallel", [case])[0]
    if "skipped" in result:
        return None
    with torch.random.fork_rng(devices=[]):
        reference = call_with_models({"loop": _data_parallel_loop}, None, "loop", [case])[0]
    return result, reference


@check("train_with_data_parallel_losses")
def train_with_data_parallel_losses(session) -> None:
    enforce(session, "train_with_data_parallel", "losses", calls=_TRAINING_CALLS)
    if torch.cuda.device_count() >= 2 and (ran := _on_two_gpus(session, 5, 50, 16)):
        result, reference = ran
        expect(type(result["value"]) is list and all(type(v) is float for v in result["value"]), "malformed")
        expect(
            len(result["value"]) == len(reference["value"])
            and all(
                abs(g - w) <= GPU_TOLERANCE + 10 * GPU_TOLERANCE * abs(w)
                for g, w in zip(result["value"], reference["value"], strict=True)
            ),
            "on 2 GPUs, the losses of a loop through nn.DataParallel",
        )


@check("train_with_data_parallel_weights")
def train_with_data_parallel_weights(session) -> None:
    enforce(session, "train_with_data_parallel", "weights", calls=_TRAINING_CALLS)
    if torch.cuda.device_count() >= 2 and (ran := _on_two_gpus(session, 9, 40, 12)):
        result, reference = ran
        got, want = result["state"], reference["state"]["parameters"]
        got = got.get("parameters") if type(got) is dict else None
        ok = type(got) is list and all(type(e) is list and len(e) == 4 and type(e[1]) is torch.Tensor for e in got)
        ok = ok and [e[0] for e in got] == [e[0] for e in want]
        ok = ok and all(_close(g[1], w[1], GPU_TOLERANCE) for g, w in zip(got, want, strict=True))
        expect(ok, "on 2 GPUs, the weights of a loop through nn.DataParallel")


@check("train_with_data_parallel_uses_data_parallel")
def train_with_data_parallel_uses_data_parallel(session) -> None:
    enforce(session, "train_with_data_parallel", "uses_data_parallel", calls=_TRAINING_CALLS)


# --------------------------------------------------------------------------------------------- quiz
register_quiz(__name__, "02_gradient_averaging")  # quiz_q1...: the declaration in gpulab.exercises.quizzes
