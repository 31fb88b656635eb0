"""Lesson 04 (``04_checkpoints``): the verdicts of its graded test cells, decided in the grader's process.

The learner's ``strip_module_prefix``, ``save_checkpoint`` and ``load_checkpoint`` run in the kernel, inside
*probes* (top-level functions below, sent as source) that build the models, optimizers and wrappers of each case
from layer lists and weights the grader sends, call the learner's function, and send back plain data: returned
values, state dicts as tensors, which exceptions were raised. Checkpoint files are planted by the grader
(``Session.write_bytes``: clean, prefixed, tagged with a missing GPU, carrying code) and the files the learner's
``save_checkpoint`` wrote are read from outside the sandbox (``Session.load_weights``, ``read_bytes``,
``listdir``). Every reference is computed here: key names from ``consume_prefix_in_state_dict_if_present``,
weights from the grader's own models, the "eight uninterrupted steps" of a resumed run from the grader's own
training (on the device the kernel reports it used).
"""

from __future__ import annotations

import io
import os
from unittest import mock

import torch
from gpulab import check as gpulab_check
from gpulab.exercises.checkpoints import plain, wrapped_state
from torch import nn

from autograder.checks import CheckFailed, check, expect, uses
from autograder.checks.quiz import register_quiz
from autograder.checks.rules import enforce, statement
from autograder.checks.wire import ForeignReal

PREFIX = "module."

# Layer lists (``[name, *args]`` of ``torch.nn`` layers in a Sequential; ``["MLP", in, hidden, classes]`` for
# ``gpulab.models.MLP``): the probes build the same models from them in the kernel.
SEQ_BN = [["Linear", 5, 6], ["BatchNorm1d", 6], ["Tanh"], ["Linear", 6, 2]]
SEQ_TANH = [["Linear", 5, 7], ["Tanh"], ["Linear", 7, 2]]
SEQ_BN7 = [["Linear", 5, 7], ["BatchNorm1d", 7], ["Tanh"], ["Linear", 7, 2]]
SEQ_RELU = [["Linear", 4, 8], ["ReLU"], ["Linear", 8, 3]]
MLP = ["MLP", 4, 6, 3]  # gpulab.exercises.checkpoints.small_mlp
LINEAR_2_1 = [["Linear", 2, 1]]
LINEAR_3_2 = [["Linear", 3, 2]]


# What each graded cell tests, named by feedback when a failure names no rule of its own (English -> Japanese).
CELL_RULES = {
    "strip_module_prefix_leading": statement("strip_module_prefix", "leading"),
    "strip_module_prefix_only_at_start": statement("strip_module_prefix", "only_at_start"),
    "strip_module_prefix_new_mapping": statement("strip_module_prefix", "new_mapping"),
    "save_checkpoint_contents": "the checkpoint is a dict with the model's state dict, the optimizer's and the epoch",
    "save_checkpoint_unwraps": "a wrapped model (DataParallel) is saved with the bare model's keys",
    "save_checkpoint_atomic": (
        "saving is atomic: a temporary file renamed onto the path, none left behind, the previous "
        "checkpoint intact when saving fails"
    ),
    "load_checkpoint_models": (
        "the weights load into a bare or wrapped model, from a prefixed or a clean checkpoint, and the "
        "epoch is returned"
    ),
    "load_checkpoint_resume": (
        "training resumed from a checkpoint continues as if it had not stopped (model, optimizer and devices)"
    ),
    "load_checkpoint_refuses_code": "a checkpoint that carries code is refused (weights_only=True), a clean one loads",
}
RULES = {
    "the checkpoint is a dict with the model's state dict, the optimizer's and the epoch": (
        "チェックポイントは、モデルのstate dict、オプティマイザのstate dict、エポックを持つ辞書です"
    ),
    "a wrapped model (DataParallel) is saved with the bare model's keys": (
        "ラップされたモデル（DataParallel）は、素のモデルのキーで保存します"
    ),
    (
        "saving is atomic: a temporary file renamed onto the path, none left behind, the previous "
        "checkpoint intact when saving fails"
    ): (
        "保存はアトミックです：一時ファイルをパスに名前変更し、何も残さず、保存に失敗しても前のチェックポイン"
        "トはそのままです"
    ),
    (
        "the weights load into a bare or wrapped model, from a prefixed or a clean checkpoint, and the "
        "epoch is returned"
    ): (
        "接頭辞つきでもそうでないチェックポイントでも、素のモデルにもラップしたモデルにも重みを読み込み、エポ"
        "ックを返します"
    ),
    ("training resumed from a checkpoint continues as if it had not stopped (model, optimizer and devices)"): (
        "チェックポイントから再開した学習は、止まらなかった場合と同じように続きます（モデル、オプティマイザ、デバイス）"
    ),
    "a checkpoint that carries code is refused (weights_only=True), a clean one loads": (
        "コードを含むチェックポイントは拒否し（weights_only=True）、問題のないものは読み込みます"
    ),
}


# --------------------------------------------------------------------------------------------- grader-side helpers


def build(layers) -> nn.Module:
    """The model a layer list describes, unwrapped: a bare ``Linear`` for one layer. The grader builds its
    references with it, and the probes the learner's models in the kernel (``@uses``)."""
    from gpulab.models import MLP as Perceptron
    from torch import nn

    if layers[0] == "MLP":
        return Perceptron(in_features=layers[1], hidden=layers[2], classes=layers[3])
    modules = [getattr(nn, name)(*args) for name, *args in layers]
    return modules[0] if len(modules) == 1 else nn.Sequential(*modules)


def one_rank_group(workdir, cases) -> bool:
    """In the kernel: a one-rank gloo process group on the loopback interface, its store in ``workdir``, when a case
    wraps its model in ``DistributedDataParallel``; whether this call created it (``False``: no case needs one, or
    one already existed)."""
    import os
    import socket

    import torch.distributed as dist

    if dist.is_initialized() or all(case["wrap"] != "DistributedDataParallel" for case in cases):
        return False
    saved = os.environ.get("GLOO_SOCKET_IFNAME")
    try:
        loopback = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    except (OSError, AttributeError):
        loopback = []
    if saved is None and loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback[0]
    try:
        store = dist.FileStore(os.path.join(workdir, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    finally:
        if saved is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
    return True


def close_group() -> None:
    """In the kernel: destroy the process group ``one_rank_group`` created, after the probe's models are gone.

    The group's destructor joins its gloo worker threads, and a worker that has just finished a collective may
    need the GIL to free the work's tensors. PyTorch's Python binding of a process group releases the GIL before
    that destructor runs; a ``DistributedDataParallel``'s reducer, holding the group too, does not. Had a reducer
    held the last reference, dropping it would deadlock with such a worker (pytorch/pytorch#56297; lesson 04's
    gradings hung so, now and then). So the models go first (``gc.collect`` for any in reference cycles), and the
    last reference is this function's own, dropped from Python."""
    import gc

    import torch.distributed as dist

    group = dist.group.WORLD
    gc.collect()
    dist.destroy_process_group()
    del group


def observe_cases(observe, workdir, cases) -> list:
    """In the kernel: ``[observe(case) for case in cases]``, inside a one-rank group when a case needs one (created
    here, closed here). An exception keeps the frames it passed through, the failing case's model among them: it
    leaves without them, so that no model outlives the group (``close_group``)."""
    created = one_rank_group(workdir, cases)
    try:
        return [observe(case) for case in cases]
    except Exception as error:
        raise error.with_traceback(None) from None
    finally:
        if created:
            close_group()


def wrapped(inner, case):
    """In the kernel: ``(model, inner)``, ``inner`` placed and wrapped as ``case["wrap"]`` says: ``nn.DataParallel``
    (on ``case["device_ids"]``, else on two GPUs when there are two, else as it is), ``gpulab.DataParallel`` on the
    lesson's devices, ``DistributedDataParallel`` in the group of ``one_rank_group``, ``primary`` (bare, on the
    lesson's primary device); anything else: bare, where it is."""
    import gpulab
    import torch
    from torch import nn

    wrap = case["wrap"]
    if wrap == "nn.DataParallel" and case.get("device_ids") is not None:
        return nn.DataParallel(inner, device_ids=case["device_ids"]), inner
    if wrap == "nn.DataParallel" and torch.cuda.device_count() >= 2:
        inner = inner.cuda()
        return nn.DataParallel(inner, device_ids=[0, 1]), inner
    if wrap == "nn.DataParallel":
        return nn.DataParallel(inner), inner
    if wrap == "gpulab.DataParallel":
        inner = inner.to(gpulab.current_devices().primary)
        return gpulab.DataParallel(inner, device_ids=gpulab.current_devices()), inner
    if wrap == "DistributedDataParallel":
        return nn.parallel.DistributedDataParallel(inner), inner
    if wrap == "primary":
        inner = inner.to(gpulab.current_devices().primary)
        return inner, inner
    return inner, inner


def seeded(layers, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return build(layers)


def cpu_state(model: nn.Module) -> dict:
    """A plain dict of ``model``'s state dict, detached copies on the CPU (what the wire carries to a probe)."""
    return {key: value.detach().cpu().clone() for key, value in model.state_dict().items()}


def to_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def gpu_tagged_bytes(obj, device: str) -> bytes:
    """``torch.save`` of ``obj`` with every tensor tagged ``device`` (a GPU the kernel does not have)."""
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: device):
        return to_bytes(obj)


def trained_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """``gpulab.exercises.checkpoints.trained_optimizer`` on the CPU: Adam after one step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(7)
    inputs, targets = torch.randn(6, 4, generator=generator), torch.randint(0, 3, (6,), generator=generator)
    nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()
    optimizer.zero_grad()
    return optimizer


def same_tensors(got, want: dict) -> bool:
    """``got`` (``[[key, tensor], ...]`` from a probe) holds exactly ``want``'s keys, in order, with equal values."""
    if type(got) is not list or any(type(p) is not list or len(p) != 2 for p in got):
        return False
    if [p[0] for p in got] != list(want):
        return False
    return all(type(v) is torch.Tensor and v.tolist() == want[k].tolist() for k, v in got)


def close_tensors(got, want: dict, tolerance: float = 1e-5) -> bool:
    """As ``same_tensors``, within ``tolerance`` (every element; a NaN is never close)."""
    if type(got) is not list or any(type(p) is not list or len(p) != 2 for p in got):
        return False
    if [p[0] for p in got] != list(want):
        return False
    for key, value in got:
        reference = want[key]
        if type(value) is not torch.Tensor or value.shape != reference.shape:
            return False
        if value.numel() and not bool(((value.double() - reference.double()).abs() <= tolerance).all()):
            return False
    return True


def is_epoch(got, want: int, allow_bool: bool = False) -> bool:
    """``got == want`` as the lesson's tests read it: a number of any class (``numpy.int64`` too, as it arrives:
    ``wire.ForeignInt``...; a bool only with ``allow_bool``), or a one-element tensor holding it."""
    if type(got) is bool:
        return allow_bool and got == want
    if isinstance(got, (int, float, ForeignReal)):
        return got == want
    if type(got) is torch.Tensor:
        return got.numel() == 1 and got.dtype != torch.bool and got.item() == want
    return False


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _check_visible_kinds(name: str, kind: str) -> None:
    """The visible cases this check replays exist (the lesson's cell asserts ``cases(name, kind=kind)``)."""
    gpulab_check.cases(name, kind=kind)


# --------------------------------------------------------------------------------------------- probes
def kernel_devices(notebook, workdir):
    """Probe: the kernel's CUDA device count."""
    import torch

    return torch.cuda.device_count()


@uses(build, one_rank_group, close_group, observe_cases, wrapped)
def save_calls(notebook, workdir, cases):
    """Probe: ``save_checkpoint(path, model, optimizer, epoch)`` for each case: the model built from its layer list
    and weights, wrapped (bare, nn.DataParallel, gpulab.DataParallel, DistributedDataParallel), the optimizer
    built and given its state; the files stay for the grader. What each call raised (``None``: nothing)."""
    import os
    from pathlib import Path

    import torch

    class FailsWhenSaved:
        def __reduce__(self):
            raise OSError(28, "No space left on device")

    function = notebook["save_checkpoint"]

    def save(case):
        if case.get("seed") is not None:
            torch.manual_seed(case["seed"])
        inner = build(case["layers"])
        if case.get("state") is not None:
            inner.load_state_dict(case["state"])
        model, inner = wrapped(inner, case)
        kind, settings = case["optimizer"]
        optimizer = getattr(torch.optim, kind)(model.parameters(), **settings)
        if case.get("optimizer state") is not None:
            optimizer.load_state_dict(case["optimizer state"])
        failure = case.get("failure")
        if failure == "unpicklable":
            optimizer.param_groups[0]["schedule"] = lambda step: 0.9**step
        elif failure == "disk full":
            optimizer.param_groups[0]["disk"] = FailsWhenSaved()
        path = os.path.join(workdir, case["file"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            function(Path(path) if case.get("as path") else path, model, optimizer, case["epoch"])
        except Exception as error:  # noqa: BLE001 - whether it raised is the observation
            if not case.get("may raise"):
                raise
            return type(error).__name__
        return None

    return observe_cases(save, workdir, cases)


@uses(build, one_rank_group, close_group, observe_cases, wrapped)
def load_calls(notebook, workdir, cases):
    """Probe: ``load_checkpoint`` on files the grader planted: the target model built from its layer list and
    weights, placed and wrapped as the case says, an optimizer when the case has one; after the call, the
    optimizer steps of ``train`` (the grader's batches). What came back: the return value (or the exception's
    name), the bare model's state dict, its parameters' device types, the optimizer's state dict."""
    import os
    from pathlib import Path

    import gpulab
    import torch
    from torch import nn

    function = notebook["load_checkpoint"]

    def load(case):
        inner = build(case["layers"])
        inner.load_state_dict(case["state"])
        device = case.get("device", "cpu")
        if device == "primary":
            device = gpulab.current_devices().primary
        model, inner = wrapped(inner.to(device), case)
        optimizer = None
        if case.get("optimizer") is not None:
            kind, settings = case["optimizer"]
            optimizer = getattr(torch.optim, kind)(model.parameters(), **settings)
        path = os.path.join(workdir, case["file"])
        path = Path(path) if case.get("as path") else path
        args = [path, model] + ([optimizer] if case.get("pass optimizer") else []) + case.get("extra", [])
        entry = {}
        try:
            entry["returned"] = function(*args)
        except Exception as error:  # noqa: BLE001 - refusing a file is an observation
            if not case.get("may raise"):
                raise
            entry["raised"] = type(error).__name__
        if case.get("train"):
            train_device = next(inner.parameters()).device
            for inputs, labels in case["train"]:
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(inputs.to(train_device)), labels.to(train_device))
                loss.backward()
                optimizer.step()
        entry["state"] = [[key, value.detach().cpu()] for key, value in inner.state_dict().items()]
        entry["devices"] = sorted({p.device.type for p in inner.parameters()})
        if optimizer is not None:
            entry["optimizer"] = optimizer.state_dict()
        return entry

    return observe_cases(load, workdir, cases)


# --------------------------------------------------------------------------------------------- strip_module_prefix
# Its rules, inputs and reference are declared once, in gpulab.exercises.checkpoints; the grader enforces them on
# their visible inputs and on hidden state dicts it draws (the reference: PyTorch's own
# consume_prefix_in_state_dict_if_present, key by key).
@check("strip_module_prefix_leading")
def strip_module_prefix_leading(session) -> None:
    enforce(session, "strip_module_prefix", "leading")


@check("strip_module_prefix_only_at_start")
def strip_module_prefix_only_at_start(session) -> None:
    enforce(session, "strip_module_prefix", "only_at_start")


@check("strip_module_prefix_new_mapping")
def strip_module_prefix_new_mapping(session) -> None:
    enforce(session, "strip_module_prefix", "new_mapping")


# --------------------------------------------------------------------------------------------- save_checkpoint
def _trained(layers, seed: int, kind: str, settings: dict):
    """The lesson's hidden ``_trained``: a model and optimizer after two steps (the grader's references)."""
    torch.manual_seed(seed)
    model = build(layers)
    optimizer = getattr(torch.optim, kind)(model.parameters(), **settings)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(2):
        inputs = torch.randn(8, 5, generator=generator)
        optimizer.zero_grad()
        model(inputs).pow(2).mean().backward()
        optimizer.step()
    return model, optimizer


def _expect_saved(session, file: str, model: nn.Module, optimizer, epoch, what: str, level: str = "full") -> dict:
    """The file ``save_checkpoint`` wrote, read here, judged as the lesson's tests judged it: ``"full"``: a dict of
    model (keys in order, values), optimizer (when given), epoch; ``"model"``: the model's keys and values only;
    ``"keys"``: the epoch and the model's keys only; ``"names"``: the model's keys only."""
    saved = session.load_weights(file)
    expect(isinstance(saved, dict), f"{what}: save a dict")
    if level == "full":
        expect({"model", "optimizer", "epoch"} <= set(saved), f"{what}: the dict needs model, optimizer, epoch")
    if level in ("full", "keys"):
        expect("epoch" in saved and is_epoch(saved["epoch"], epoch, allow_bool=True), f"{what}: save the epoch")
    state = saved.get("model")
    expect(isinstance(state, dict), f"{what}: save the model's state dict under 'model'")
    expect(list(state) == list(model.state_dict()), f"{what}: save the bare model's keys, got {_show(list(state))}")
    if level in ("full", "model"):
        expect(plain(dict(state)) == plain(cpu_state(model)), f"{what}: the model's weights and buffers")
    if level == "full" and optimizer is not None:
        expect(plain(saved["optimizer"]) == plain(optimizer.state_dict()), f"{what}: save optimizer.state_dict()")
    return saved


def _save_case(file, layers, model, optimizer, epoch, wrap="bare", as_path=False) -> dict:
    kind = type(optimizer).__name__
    settings = {key: value for key, value in optimizer.defaults.items() if key in ("lr", "momentum")}
    return {
        "file": file,
        "layers": layers,
        "state": cpu_state(model),
        "optimizer": [kind, settings],
        "optimizer state": optimizer.state_dict(),
        "epoch": epoch,
        "wrap": wrap,
        "as path": as_path,
    }


@check("save_checkpoint_contents")
def save_checkpoint_contents(session) -> None:
    _check_visible_kinds("save_checkpoint", "contents")
    # (file, layers, model, optimizer, epoch, a Path or a str, how the lesson's test judged it): the hidden
    # tests' two trained runs, one more drawn here, gpulab's "contents" case and the visible Linear
    visible = seeded(MLP, 1)
    linear = seeded(LINEAR_2_1, session.rng.randint(0, 10**6))
    runs = [
        ("run1.pt", SEQ_BN, *_trained(SEQ_BN, 1, "SGD", {"lr": 0.1, "momentum": 0.9}), 17, False, "full"),
        ("run2.pt", SEQ_BN, *_trained(SEQ_BN, 2, "Adam", {"lr": 0.01}), 0, False, "full"),
        (
            "random.pt",
            SEQ_BN,
            *_trained(SEQ_BN, session.rng.randint(3, 10**6), "Adam", {"lr": 0.01}),
            session.rng.randint(1, 10**6),
            False,
            "full",
        ),
        ("visible.pt", MLP, visible, trained_optimizer(visible), 3, True, "full"),
        ("c.pt", LINEAR_2_1, linear, torch.optim.SGD(linear.parameters(), lr=0.1), 7, True, "keys"),
    ]
    cases = [
        _save_case(file, layers, model, optimizer, epoch, wrap="primary" if file == "visible.pt" else "bare", as_path=p)
        for file, layers, model, optimizer, epoch, p, _ in runs
    ]
    session.run(save_calls, cases=cases)
    for file, layers, model, optimizer, epoch, _, level in runs:
        saved = _expect_saved(session, file, model, optimizer, epoch, f"save_checkpoint ({file})", level)
        if level == "full":
            try:
                build(layers).load_state_dict(saved["model"])
            except (RuntimeError, TypeError, AttributeError) as error:
                raise CheckFailed(
                    f"the saved state dict does not load into a fresh model: {type(error).__name__}"
                ) from None


@check("save_checkpoint_unwraps")
def save_checkpoint_unwraps(session) -> None:
    _check_visible_kinds("save_checkpoint", "wrapped")
    cases, references = [], []
    for name, seed in [("nn.DataParallel", 1), ("gpulab.DataParallel", 2), ("bare", 3), ("DistributedDataParallel", 4)]:
        inner = seeded(SEQ_TANH, seed)
        optimizer = torch.optim.SGD(inner.parameters(), lr=0.1, momentum=0.9)
        cases.append(_save_case(f"{name}.pt", SEQ_TANH, inner, optimizer, 3, wrap=name))
        references.append((f"{name}.pt", inner, None, 3, "model"))
    visible = seeded(MLP, 2)  # gpulab's "wrapped" case: a DataParallel model after one Adam step, epoch 5
    optimizer = trained_optimizer(visible)
    cases.append(_save_case("visible.pt", MLP, visible, optimizer, 5, wrap="gpulab.DataParallel", as_path=True))
    references.append(("visible.pt", visible, optimizer, 5, "full"))
    linear = seeded(LINEAR_2_1, session.rng.randint(0, 10**6))
    optimizer = torch.optim.SGD(linear.parameters(), lr=0.1)
    cases.append(_save_case("c.pt", LINEAR_2_1, linear, optimizer, 1, wrap="gpulab.DataParallel", as_path=True))
    references.append(("c.pt", linear, None, 1, "names"))
    session.run(save_calls, cases=cases)
    for file, model, optimizer, epoch, level in references:
        _expect_saved(session, file, model, optimizer, epoch, f"save_checkpoint on a {file[:-3]} model", level)


def _atomic_op(file, seed, epoch, failure=None, as_path=False, layers=None) -> dict:
    return {
        "file": file,
        "layers": layers or [["Linear", 4, 3]],
        "seed": seed,
        "state": None,
        "optimizer": ["SGD", {"lr": 0.1, "momentum": 0.9}],
        "epoch": epoch,
        "wrap": "bare",
        "failure": failure,
        "may raise": failure is not None,
        "as path": as_path,
    }


def _epoch_in(session, file: str):
    saved = session.load_weights(file)
    expect(isinstance(saved, dict) and "epoch" in saved, f"{file}: a checkpoint dict with an epoch")
    return saved["epoch"]


@check("save_checkpoint_atomic")
def save_checkpoint_atomic(session) -> None:
    _check_visible_kinds("save_checkpoint", "atomic")
    # The check's folder holds last.pt next to a file of the learner's (notes.txt) and the folders the kernel makes
    # for the other cases (visible: gpulab's cases; twice: two saves to one path; sub: a failed first save).
    folders = {"sub", "twice", "visible"}

    def files_at_top():
        return [name for name in session.listdir() if name not in folders]

    session.write_bytes("notes.txt", b"not a checkpoint")
    # 1. two saves to one path (str and Path), and the visible cases' first good checkpoint
    done = session.run(
        save_calls,
        cases=[
            _atomic_op("last.pt", 0, 1),
            _atomic_op("last.pt", 0, 2),
            _atomic_op("visible/checkpoint.pt", 3, 1, as_path=True, layers=MLP),
            _atomic_op("twice/checkpoint.pt", 4, 1, as_path=True, layers=MLP),
            _atomic_op("twice/checkpoint.pt", 4, 2, as_path=True, layers=MLP),
        ],
    )
    expect(done == [None] * 5, "save_checkpoint raised on a good save")
    expect(is_epoch(_epoch_in(session, "last.pt"), 2), "a second save replaces the first")
    expect(is_epoch(_epoch_in(session, "twice/checkpoint.pt"), 2), "saving twice replaces the file")
    expect(files_at_top() == ["last.pt", "notes.txt"], f"no temporary file left: {_show(files_at_top())}")
    expect(
        session.listdir("visible") == ["checkpoint.pt"], f"no temporary file left: {_show(session.listdir('visible'))}"
    )
    expect(session.listdir("twice") == ["checkpoint.pt"], "saving twice leaves no temporary file behind")
    before = session.read_bytes("last.pt")
    visible_before = session.read_bytes("visible/checkpoint.pt")
    # 2. failed saves: each must raise and leave the last checkpoint and the folder as they were
    for failure, extra in [("unpicklable", True), ("disk full", False)]:
        ops = [_atomic_op("last.pt", 1, 3, failure=failure)]
        if extra:
            ops.append(_atomic_op("visible/checkpoint.pt", 3, 2, failure=failure, as_path=True, layers=MLP))
        raised = session.run(save_calls, cases=ops)
        expect(type(raised) is list and len(raised) == len(ops), "the kernel's answer is malformed")
        expect(all(r is not None for r in raised), f"a failed save ({failure}) must raise: the caller has to know")
        expect(
            session.read_bytes("last.pt") == before, f"a failed save ({failure}) must leave the last checkpoint intact"
        )
        expect(files_at_top() == ["last.pt", "notes.txt"], f"stray file after a failed save ({failure})")
        if extra:
            expect(session.read_bytes("visible/checkpoint.pt") == visible_before, "the previous checkpoint intact")
            expect(session.listdir("visible") == ["checkpoint.pt"], "stray file after a failed save")
    expect(is_epoch(_epoch_in(session, "last.pt"), 2), "the last good checkpoint still loads")
    # 3. a failed first save leaves no file at all
    raised = session.run(save_calls, cases=[_atomic_op("sub/first.pt", 2, 0, failure="disk full")])
    expect(raised != [None], "a failed save must raise")
    expect(session.listdir("sub") == [], "a failed first save leaves no file at all")


# --------------------------------------------------------------------------------------------- load_checkpoint
def _target(file, layers, seed, wrap="bare", device="cpu", as_path=False, **more) -> dict:
    """A ``load_calls`` case: the target model (the grader's seeded weights, which the file must replace)."""
    return {
        "file": file,
        "layers": layers,
        "state": cpu_state(seeded(layers, seed)),
        "wrap": wrap,
        "device": device,
        "as path": as_path,
        **more,
    }


def _run_load(session, cases: list[dict]) -> list[dict]:
    observed = session.run(load_calls, cases=cases)
    expect(type(observed) is list and len(observed) == len(cases), "the kernel's answer is malformed")
    expect(all(type(entry) is dict for entry in observed), "the kernel's answer is malformed")
    return observed


@check("load_checkpoint_models")
def load_checkpoint_models(session) -> None:
    _check_visible_kinds("load_checkpoint", "models")
    source = seeded(SEQ_BN7, 10)
    source[1].running_mean.add_(1.5)
    optimizer = torch.optim.SGD(source.parameters(), lr=0.1)
    want = cpu_state(source)
    session.write_bytes(
        "clean.pt", to_bytes({"model": source.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 11})
    )
    prefixed = nn.DataParallel(source).state_dict()
    expect(all(key.startswith(PREFIX) for key in prefixed), "grader: a DataParallel state dict is prefixed")
    session.write_bytes("legacy.pt", to_bytes({"model": prefixed, "optimizer": optimizer.state_dict(), "epoch": 12}))
    # gpulab's "models" cases (small_mlp seeds 12 to 15, epoch 7) and the visible prefixed Linear (epoch 3)
    visible_source, wrapped_source = seeded(MLP, 12), seeded(MLP, 14)
    session.write_bytes(
        "visible-clean.pt", to_bytes({"model": visible_source.state_dict(), "optimizer": {}, "epoch": 7})
    )
    session.write_bytes(
        "visible-old.pt", to_bytes({"model": wrapped_state(wrapped_source), "optimizer": {}, "epoch": 7})
    )
    old = seeded(LINEAR_2_1, session.rng.randint(0, 10**6))
    session.write_bytes("old.pt", to_bytes({"model": wrapped_state(old), "optimizer": {}, "epoch": 3}))
    cases, expected = [], []
    for file, epoch in [("clean.pt", 11), ("legacy.pt", 12)]:
        for seed, wrap in [
            (20, "bare"),
            (21, "nn.DataParallel"),
            (22, "gpulab.DataParallel"),
            (23, "DistributedDataParallel"),
        ]:
            cases.append(_target(file, SEQ_BN7, seed, wrap=wrap))
            expected.append((epoch, want, f"{'clean' if file == 'clean.pt' else 'prefixed (legacy)'} into {wrap}"))
    for file, seed, wrap, reference in [
        ("visible-clean.pt", 13, "bare", visible_source),
        ("visible-clean.pt", 15, "gpulab.DataParallel", visible_source),
        ("visible-old.pt", 13, "bare", wrapped_source),
    ]:
        cases.append(_target(file, MLP, seed, wrap=wrap, device="primary", as_path=True))
        expected.append((7, cpu_state(reference), f"{file[8:-3]} checkpoint into a {wrap} model"))
    cases.append(_target("old.pt", LINEAR_2_1, session.rng.randint(0, 10**6), device="primary", as_path=True))
    expected.append((3, cpu_state(old), "an old prefixed checkpoint into a bare model"))
    for entry, (epoch, state, what) in zip(_run_load(session, cases), expected, strict=True):
        expect(is_epoch(entry.get("returned"), epoch), f"return the epoch ({what}), got {_show(entry.get('returned'))}")
        expect(same_tensors(entry.get("state"), state), f"the weights of a {what}")


def _resume_batches() -> list:
    generator = torch.Generator().manual_seed(5)
    return [
        (torch.randn(10, 4, generator=generator), torch.randint(0, 3, (10,), generator=generator)) for _ in range(8)
    ]


def _train(model, optimizer, batches, device) -> None:
    for inputs, labels in batches:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs.to(device)), labels.to(device)).backward()
        optimizer.step()


def _resume_reference(device: str, device_ids):
    """The grader's runs on ``device`` (wrapped in nn.DataParallel over ``device_ids`` when not None): eight
    uninterrupted steps, and the four-step checkpoint (its state dict and its file's bytes)."""
    batches = _resume_batches()

    def run(steps):
        inner = seeded(SEQ_RELU, 0).to(device)
        model = inner if device_ids is None else nn.DataParallel(inner, device_ids=device_ids)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        _train(model, optimizer, batches[:steps], device)
        return inner, optimizer

    eight, _ = run(8)
    half, optimizer = run(4)
    data = to_bytes({"model": half.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 4})
    return cpu_state(eight), cpu_state(half), data


@check("load_checkpoint_resume")
def load_checkpoint_resume(session) -> None:
    _check_visible_kinds("load_checkpoint", "resume")
    cuda = session.run(kernel_devices)
    expect(type(cuda) is int and cuda >= 0, "the kernel's answer is malformed")
    # The hidden tests' two runs: the bare model on the CPU; nn.DataParallel (on the GPUs when the kernel has some).
    # The grader trains its reference on the same devices (on the CPU only when it has no GPU itself).
    wrappings = [("cpu", None, "bare"), ("cuda:0", list(range(min(2, cuda))), "nn.DataParallel")]
    if not cuda:
        wrappings[1] = ("cpu", None, "nn.DataParallel")
    batches = _resume_batches()
    cases, checks = [], []
    for index, (device, device_ids, wrap) in enumerate(wrappings):
        on_gpu = device != "cpu" and torch.cuda.is_available()
        eight, half, data = _resume_reference(device if on_gpu else "cpu", device_ids if on_gpu else None)
        session.write_bytes(f"half{index}.pt", data)
        cases.append(
            _target(
                f"half{index}.pt",
                SEQ_RELU,
                99,
                device=device,
                wrap=wrap,
                device_ids=device_ids,
                optimizer=["Adam", {"lr": 0.05}],
                train=batches[4:],
                **{"pass optimizer": True},
            )
        )
        checks.append((4, eight, "4 steps + load_checkpoint + 4 steps must equal 8 steps: restore the optimizer", True))
    last = f"half{len(wrappings) - 1}.pt"
    cases.append(_target(last, SEQ_RELU, 98))
    checks.append((4, half, "optimizer=None loads the model only", True))
    cases.append(_target(last, SEQ_RELU, 97, extra=[None, "cpu"]))
    checks.append((4, half, "an explicit map_location", True))
    # A checkpoint written on a GPU the kernel does not have: map_location must default to the model's device. The
    # index does not rest on the count the kernel reported (a kernel that claimed fewer GPUs would get a file for
    # a GPU it has): no grading kernel sees a hundred GPUs.
    missing = "cuda:99"
    source = seeded(SEQ_RELU, 7)
    source_optimizer = torch.optim.Adam(source.parameters(), lr=0.05)
    _train(source, source_optimizer, _resume_batches()[:2], "cpu")
    content = {"model": source.state_dict(), "optimizer": source_optimizer.state_dict(), "epoch": 2}
    session.write_bytes("from_gpu.pt", gpu_tagged_bytes(content, missing))
    cases.append(_target("from_gpu.pt", SEQ_RELU, 8, optimizer=["Adam", {"lr": 0.05}], **{"pass optimizer": True}))
    checks.append((2, cpu_state(source), f"a checkpoint saved on {missing}", True))
    if cuda:
        session.write_bytes("from_cpu.pt", to_bytes({"model": source.state_dict(), "optimizer": {}, "epoch": 1}))
        cases.append(_target("from_cpu.pt", SEQ_RELU, 9, device="cuda"))
        checks.append((1, cpu_state(source), "a CPU checkpoint into a model on a GPU", True))
    # gpulab's "resume" cases: the optimizer restored (small_mlp 5 into 6), a GPU-tagged file (small_mlp 8 into 9)
    visible = seeded(MLP, 5)
    visible_optimizer = trained_optimizer(visible)
    session.write_bytes(
        "visible-optimizer.pt",
        to_bytes({"model": visible.state_dict(), "optimizer": visible_optimizer.state_dict(), "epoch": 2}),
    )
    cases.append(
        _target(
            "visible-optimizer.pt",
            MLP,
            6,
            device="primary",
            as_path=True,
            optimizer=["Adam", {"lr": 0.01}],
            **{"pass optimizer": True},
        )
    )
    checks.append((2, cpu_state(visible), "with an optimizer", False))
    tagged = seeded(MLP, 8)
    session.write_bytes(
        "visible-gpu.pt", gpu_tagged_bytes({"model": tagged.state_dict(), "optimizer": {}, "epoch": 4}, missing)
    )
    cases.append(_target("visible-gpu.pt", MLP, 9, device="primary", as_path=True))
    checks.append((4, cpu_state(tagged), f"a checkpoint saved on {missing} into a model on this machine", False))
    observed = _run_load(session, cases)
    for index, (entry, (epoch, state, what, tolerant)) in enumerate(zip(observed, checks, strict=True)):
        expect(is_epoch(entry.get("returned"), epoch), f"return the epoch ({what})")
        matches = close_tensors if tolerant else same_tensors
        expect(matches(entry.get("state"), state), what)
        if cases[index]["file"] == "from_gpu.pt":
            expect(entry.get("devices") == ["cpu"], "the model stays where it is")
    optimizer_entry = observed[-2]
    expect(
        plain(optimizer_entry.get("optimizer")) == plain(visible_optimizer.state_dict()),
        "restore the optimizer with optimizer.load_state_dict when one is given",
    )


class RunsCode:
    """Unpickling this creates the folder ``marker``: proof that loading ran code from the file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@check("load_checkpoint_refuses_code")
def load_checkpoint_refuses_code(session) -> None:
    _check_visible_kinds("load_checkpoint", "safety")
    source = seeded(LINEAR_3_2, 0)
    session.write_bytes("clean.pt", to_bytes({"model": source.state_dict(), "optimizer": {}, "epoch": 6}))
    visible = seeded(MLP, 10)
    session.write_bytes("visible-clean.pt", to_bytes({"model": visible.state_dict(), "optimizer": {}, "epoch": 3}))
    markers = {}
    for where in ("epoch", "model", "top", "visible"):
        markers[where] = f"code-ran-{where}"
        payload = RunsCode(str(session.workdir / markers[where]))
        if where in ("epoch", "visible"):
            state = (visible if where == "visible" else source).state_dict()
            content = {"model": state, "optimizer": {}, "epoch": payload}
        elif where == "model":
            content = {"model": {"weight": payload, "bias": source.bias.detach()}, "optimizer": {}, "epoch": 1}
        else:
            content = payload
        session.write_bytes(f"untrusted-{where}.pt", to_bytes(content))
    cases = [_target("clean.pt", LINEAR_3_2, 1)]
    cases += [
        _target(f"untrusted-{where}.pt", LINEAR_3_2, 2, **{"may raise": True}) for where in ("epoch", "model", "top")
    ]
    cases += [_target("visible-clean.pt", MLP, 11, device="primary", as_path=True)]
    cases += [_target("untrusted-visible.pt", MLP, 11, device="primary", as_path=True, **{"may raise": True})]
    observed = _run_load(session, cases)
    left = session.listdir()
    ran = sorted(name for name in markers.values() if name in left)
    expect(not ran, "load_checkpoint ran code from the file: use weights_only=True")
    expect(is_epoch(observed[0].get("returned"), 6), "a clean checkpoint must load")
    expect(same_tensors(observed[0].get("state"), cpu_state(source)), "a clean checkpoint's weights")
    expect(is_epoch(observed[4].get("returned"), 3), "a clean checkpoint must load (return its epoch)")
    for entry in observed[1:4] + observed[5:]:
        expect("raised" in entry, "a checkpoint that carries code must be refused (raise)")


# --------------------------------------------------------------------------------------------- quiz
register_quiz(__name__, "04_checkpoints")  # quiz_q1...: the declaration in gpulab.exercises.quizzes
