"""Lesson 04 (saving checkpoints): the specifications of ``strip_module_prefix``, ``save_checkpoint`` and
``load_checkpoint``, shared by the self-check, the graded cells and the grader.

``strip_module_prefix`` is a function of plain data: four ``Rule`` objects (the lesson's four sentences), their
reference PyTorch's own ``consume_prefix_in_state_dict_if_present``. ``save_checkpoint`` and ``load_checkpoint``
are judged by files: their rules are rules of files (``gpulab.check.Rule.observe``). Each call runs in a folder
of its own, its models built from plain descriptions by an adapter (``saved_by``, ``saves_in_turn``,
``loaded_by``) wherever the rule runs; the process that judges plants the checkpoint a loader reads
(``plant_checkpoint``) and reads back, itself, what a saver wrote (``observe_saved``, ``observe_turns``). The
expected outcomes come from PyTorch on the same descriptions: ``torch.load(weights_only=True)`` of the same
models' state dicts, eight uninterrupted training steps for four, a load and four more.

A graded cell asserts the visible cases of its rules::

    for case in gpulab.check.cases("save_checkpoint", kind="unwraps"):
        case.verify(save_checkpoint)
"""

from __future__ import annotations

import io
import os
import random
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn

from gpulab.check import Call, Case, Exercise, Folder, Hint, Rule, Tolerance, same_values
from gpulab.data_parallel import DataParallel
from gpulab.devices import current_devices

PREFIX = "module."
CHECKPOINT_NAME = "checkpoint.pt"


# --------------------------------------------------------------------------------------------- small models
class Residual(nn.Module):
    """``x + module(x)``: a layer that keeps the layer it wraps in an attribute called ``module``.

    Such wrappers exist (the lesson shows one); their keys hold ``module.`` in the *middle*
    (``block.module.weight``), which a careless prefix-stripper breaks.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs + self.module(inputs)


def residual_net(features: int = 4, classes: int = 3) -> nn.Module:
    """A tiny model whose parameter names contain ``module.`` in the middle: ``block.module.weight``, ..."""
    return nn.Sequential(OrderedDict(block=Residual(nn.Linear(features, features)), head=nn.Linear(features, classes)))


def small_mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    from gpulab.models import MLP

    return MLP(in_features=4, hidden=6, classes=3).to(current_devices().primary)


def wrapped(model: nn.Module) -> nn.Module:
    """``model`` in ``gpulab.DataParallel`` (real ``nn.DataParallel`` on GPUs, the virtual one otherwise)."""
    return DataParallel(model, device_ids=current_devices())


# --------------------------------------------------------------------------------------------- strip_module_prefix
# The rules of strip_module_prefix: the lesson's own sentences (its exercise's four points), each enforced by a
# graded cell. Inputs are state dicts (OrderedDicts of tensors, as state_dict() gives them); the grader draws more
# of them (``_wrapped_states``, ``_tricky_states``) and sends them to the kernel.
STRIPS_THE_PREFIX = "a key that starts with `module.` loses that prefix"
ONLY_ONCE = "only one leading `module.` goes: every other key and every value stays as it is, in the same order"
ANY_ORDER = "when only some keys start with `module.`, any order of the keys will do"
A_NEW_DICT = "return a new dict (or `OrderedDict`), not the argument, and leave the argument unmodified"


def same_stripped(got: Any, expected: Mapping) -> bool:
    """A dict or ``OrderedDict`` with the expected keys, in order, and the same tensors (``same_values``)."""
    return type(got) in (dict, OrderedDict) and list(got) == list(expected) and _same_entries(got, expected)


def same_stripped_any_order(got: Any, expected: Mapping) -> bool:
    """As ``same_stripped``, the keys in any order: PyTorch's ``consume_prefix_in_state_dict_if_present`` moves
    the keys it strips to the end when only some carry the prefix."""
    return type(got) in (dict, OrderedDict) and sorted(got) == sorted(expected) and _same_entries(got, expected)


def _same_entries(got: Mapping, expected: Mapping) -> bool:
    return all(key in got and same_values(got[key], value) for key, value in expected.items())


def wrapped_state(model: nn.Module) -> OrderedDict:
    """``nn.DataParallel(model).state_dict()`` on the CPU: the keys DataParallel and gpulab's give."""
    return nn.DataParallel(model).state_dict()


def _state(keys: Sequence[str], ordered: bool = True) -> Mapping:
    """A state dict of ``keys``, each holding a small tensor of its own (a dict when not ``ordered``)."""
    return (OrderedDict if ordered else dict)((key, torch.full((2,), float(i))) for i, key in enumerate(keys))


def _leading_visible() -> list[Call]:
    return [
        Call(
            (wrapped(small_mlp(0)).state_dict(),),
            "every key loses its leading `module.`; the values stay the same tensors",
        ),
        Call((_state(["module.layers.0.weight"], ordered=False),), "module.layers.0.weight becomes layers.0.weight"),
    ]


def _only_once_visible() -> list[Call]:
    return [
        Call(
            (wrapped(residual_net()).state_dict(),),
            "only the *leading* `module.` goes: module.block.module.weight -> block.module.weight",
        ),
        Call((small_mlp(0).state_dict(),), "keys without the prefix stay exactly as they are"),
        Call(
            (wrapped(Residual(nn.Linear(3, 3))).state_dict(),),
            "remove one `module.` only: the second one is the Residual's own attribute",
        ),
        Call((_state(["block.module.weight"], ordered=False),), "`module.` must be at the start"),
    ]


def _only_once_extra() -> list[Call]:
    return [
        Call((_state(["submodule.weight", "modules.0.weight"]),), "`module.` must be at the start"),
        Call((OrderedDict(),), "nothing to strip"),
    ]


def _any_order_visible() -> list[Call]:
    why = "strip each key that starts with `module.`"
    return [
        Call((_state(["module.layer.weight", "head.weight", "module.layer.bias"]),), why),
        Call((_state(["head.weight", "module.body.weight", "module.body.bias"]),), why),
    ]


def random_keys(rng: random.Random) -> list[str]:
    """Keys made of parts that look like the prefix (module, modules, submodule, ...), some with one or more
    leading ``module.``; no two of them the same once stripped, and none, stripped, another of them (``module.x``
    beside ``module.module.x``: stripping in place, as PyTorch's ``consume_prefix_in_state_dict_if_present`` does,
    would overwrite one with the other)."""
    parts = ["module", "modules", "submodule", "module_list", "layer", "0", "weight", "bias", "xmodule"]
    keys = {}
    for _ in range(rng.randint(1, 6)):
        key = ".".join(rng.choice(parts) for _ in range(rng.randint(1, 4))) + rng.choice([".weight", ".bias"])
        key = PREFIX * rng.choice([0, 0, 1, 1, 2]) + key
        stripped = key.removeprefix(PREFIX)
        if stripped not in keys and key not in keys and stripped not in keys.values():
            keys[stripped] = key
    return list(keys.values())


def _new_dict_visible() -> list[Call]:
    why = "build and return a new dict; the caller's state dict must keep its keys"
    return [
        Call((wrapped(nn.Linear(2, 1)).state_dict(),), why),
        Call((_state(["module.fc.weight", "module.fc.bias"], ordered=False),), why),
        Call((nn.ReLU().state_dict(),), "a new dict even when there is nothing to strip"),
    ]


def _new_dict_extra() -> list[Call]:
    return [Call((small_mlp(0).state_dict(),), "a new dict even when there is nothing to strip")]


def same_keys(got: Any, expected: Mapping) -> bool:
    """A dict or ``OrderedDict`` with the expected keys, in any order (the new-dict rule's returned values)."""
    return type(got) in (dict, OrderedDict) and sorted(got) == sorted(expected)


STRIP_MODULE_PREFIX_RULES = (
    Rule(
        STRIPS_THE_PREFIX,
        "leading",
        same=same_stripped,
        visible=_leading_visible,
    ),
    Rule(
        ONLY_ONCE,
        "only_at_start",
        same=same_stripped,
        visible=_only_once_visible,
        extra=_only_once_extra,
    ),
    Rule(
        ANY_ORDER,
        "only_at_start",
        same=same_stripped_any_order,
        visible=_any_order_visible,
    ),
    Rule(
        A_NEW_DICT,
        "new_mapping",
        same=same_keys,
        visible=_new_dict_visible,
        extra=_new_dict_extra,
        unchanged=True,
        fresh=True,
    ),
)


def _strip_mistake(rewrite: Callable[[str], str]) -> Callable[[Case, Any], bool]:
    """A hint predicate: the learner's keys are what ``rewrite`` makes of the input keys (and that is wrong)."""

    def applies(case: Case, got: Any) -> bool:
        if not isinstance(got, Mapping):
            return False
        keys = list(got)
        return keys == [rewrite(key) for key in case.args[0]] and keys != list(case.expected)

    return applies


def _strip_all(key: str) -> str:
    while key.startswith(PREFIX):
        key = key[len(PREFIX) :]
    return key


STRIP_MODULE_PREFIX = Exercise(
    name="strip_module_prefix",
    rules=STRIP_MODULE_PREFIX_RULES,
    hints=[
        Hint(
            lambda case, got: got is None,
            "The contract asks for a new mapping as the return value. (PyTorch's "
            "consume_prefix_in_state_dict_if_present changes a dict in place and returns None.)",
        ),
        Hint(
            lambda case, got: got is case.args[0],
            "It returned the caller's state dict itself, which may still be in use: build and return a new dict, and "
            "leave the argument alone.",
        ),
        Hint(
            _strip_mistake(_strip_all),
            "Remove one leading `module.` only: in module.module.weight the second `module.` is a real attribute name.",
        ),
        Hint(
            _strip_mistake(lambda key: key.replace(PREFIX, "")),
            "str.replace removes `module.` wherever it appears, also inside a name like block.module.weight: see the "
            "Residual block in 'Rescuing a checkpoint saved with the prefix'. Only a prefix at the start of a key "
            "goes.",
        ),
        Hint(
            _strip_mistake(lambda key: key.lstrip(PREFIX)),
            "str.lstrip removes a *set of characters* (m, o, d, u, l, e and '.'), not a word, so it eats into names "
            "like model.weight. Only the exact text `module.` at the start of a key goes.",
        ),
        Hint(
            _strip_mistake(lambda key: key[len(PREFIX) :]),
            "Only keys that start with `module.` change; every other key stays exactly as it is.",
        ),
    ],
    general_hint=(
        "Each key that starts with `module.` loses that one prefix, every other key and every value stays, in the "
        "same order, in a new mapping: what consume_prefix_in_state_dict_if_present did in 'Rescuing a checkpoint "
        "saved with the prefix', without touching the argument."
    ),
)


# --------------------------------------------------------------------------------------------- checkpoint scenarios
# save_checkpoint and load_checkpoint are judged by files: their rules are rules of files (``Rule.observe``). Each
# call runs in a folder of its own; its models are built from plain descriptions (a layer list, a seed, an
# optimizer's name and settings, a number of training steps) wherever the rule runs: the learner's process for the
# self-check and the visible cell, the grading kernel for a grade. What a rule judges is read from that folder by
# the process that judges: the file save_checkpoint wrote and the folder's listing; load_checkpoint reads the file
# that process planted, and what it left in the model comes back as values. Every expected outcome is built from
# the same descriptions in the judging process, with PyTorch.
MLP_LAYERS = ["MLP", 4, 6, 3]  # gpulab.models.MLP(in_features=4, hidden=6, classes=3), as small_mlp makes it
LINEAR_2_1 = [["Linear", 2, 1]]
LINEAR_3_2 = [["Linear", 3, 2]]
LINEAR_4_3 = [["Linear", 4, 3]]
SEQ_BN = [["Linear", 5, 6], ["BatchNorm1d", 6], ["Tanh"], ["Linear", 6, 2]]
SEQ_TANH = [["Linear", 5, 7], ["Tanh"], ["Linear", 7, 2]]
SEQ_RELU = [["Linear", 4, 8], ["ReLU"], ["Linear", 8, 3]]
HOLDER = ["Holder", 4, 5, 2]  # a plain model whose first layer is a submodule called `module` (_Holder)
SGD = ["SGD", {"lr": 0.1}]
SGD_MOMENTUM = ["SGD", {"lr": 0.1, "momentum": 0.9}]
ADAM = ["Adam", {"lr": 0.01}]
FAST_ADAM = ["Adam", {"lr": 0.05}]
ENTRIES = ("epoch", "model", "optimizer")
NOTES = "notes.txt"  # a file of the learner's beside the checkpoint: a save must leave it alone
CODE_RAN = "code-ran"  # the folder a checkpoint that carries code makes when it is unpickled
MISSING_GPU = "cuda:99"  # a GPU no machine that runs the lessons has


class _Holder(nn.Module):
    """A plain model, no wrapper, whose first layer is a submodule called ``module``: its state dict's keys start
    with ``module.`` too, and all of them belong in its checkpoint (a wrapper is told by its type, not by a name)."""

    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.module = nn.Linear(in_features, hidden)
        self.head = nn.Linear(hidden, out_features)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.module(inputs)))


def build_model(layers: Sequence) -> nn.Module:
    """The model a layer list describes: ``["MLP", in, hidden, classes]`` (``gpulab.models.MLP``), ``["Holder",
    in, hidden, out]`` (``_Holder``), or ``[[name, *args], ...]`` of ``torch.nn`` layers (one layer bare, several in
    a ``Sequential``)."""
    from gpulab.models import MLP

    if layers[0] == "MLP":
        return MLP(in_features=layers[1], hidden=layers[2], classes=layers[3])
    if layers[0] == "Holder":
        return _Holder(*layers[1:])
    modules = [getattr(nn, name)(*args) for name, *args in layers]
    return modules[0] if len(modules) == 1 else nn.Sequential(*modules)


def _batches(layers: Sequence, seed: int, start: int, count: int) -> list[torch.Tensor]:
    """Training steps ``start`` to ``start + count`` of the inputs ``trained`` draws for ``seed``."""
    features = layers[1] if layers[0] in ("MLP", "Holder") else layers[0][1]
    generator = torch.Generator().manual_seed(1000 + seed)
    return [torch.randn(10, features, generator=generator) for _ in range(start + count)][start:]


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor) -> None:
    """One training step, on one CPU thread: the kernel and the grader run the same steps in two processes whose
    thread counts differ, and with several threads a CPU adds a sum's parts in another order. Their results must be
    the same bits: under Adam, a gradient that is zero but for rounding (a bias just before a ``BatchNorm1d``, as in
    ``SEQ_BN``) steps by the learning rate in the direction of that rounding."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        optimizer.zero_grad()
        model(inputs).pow(2).mean().backward()
        optimizer.step()
    finally:
        torch.set_num_threads(threads)


def trained(layers: Sequence, seed: int, optimizer: Sequence | None = None, steps: int = 0):
    """``(model, optimizer)``: the model of ``layers`` with ``seed``'s initial weights, on the CPU, after ``steps``
    steps of ``optimizer`` (``[name, settings]`` of ``torch.optim``; None: no optimizer) on ``seed``'s inputs. The
    learner's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(layers)
    made = None if optimizer is None else getattr(torch.optim, optimizer[0])(model.parameters(), **optimizer[1])
    for inputs in _batches(layers, seed, 0, steps):
        _step(model, made, inputs)
    return model, made


def entries(state: Any) -> Any:
    """A state dict as ``[[key, tensor on the CPU], ...]`` in its order (anything else as it is)."""
    if not isinstance(state, Mapping):
        return state
    return [[key, value.detach().cpu() if isinstance(value, torch.Tensor) else value] for key, value in state.items()]


def same_entries(got: Any, expected: list, tolerance: Tolerance | None = None) -> bool:
    """``got`` holds ``expected``'s keys in order and equal tensors (within ``tolerance`` when given)."""
    if type(got) is not list or len(got) != len(expected):
        return False
    for pair, (key, want) in zip(got, expected, strict=True):
        if type(pair) is not list or len(pair) != 2 or pair[0] != key or type(pair[1]) is not torch.Tensor:
            return False
        value = pair[1]
        if value.shape != want.shape or value.layout != torch.strided or value.is_meta:
            return False
        value, want = value.detach().cpu(), want.detach().cpu()
        if tolerance is None:
            if value.tolist() != want.tolist():
                return False
        elif not all(
            tolerance.close(g, w) for g, w in zip(value.flatten().tolist(), want.flatten().tolist(), strict=True)
        ):
            return False
    return True


def same_epoch(got: Any, expected: int) -> bool:
    """``got`` is the epoch as the lesson's code reads it: a number of any class (not a bool, not a string) or a
    one-element tensor, equal to ``expected``."""
    if isinstance(got, (bool, str, bytes)):
        return False
    if isinstance(got, torch.Tensor):
        return got.numel() == 1 and got.dtype != torch.bool and got.item() == expected
    try:
        return float(got) == expected
    except Exception:  # noqa: BLE001 - not a number
        return False


def _path(folder: str, as_path: bool) -> str | Path:
    path = os.path.join(folder, CHECKPOINT_NAME)
    return Path(path) if as_path else path


def _wrapped(inner: nn.Module, wrap: str) -> nn.Module:
    """``inner`` placed and wrapped as ``wrap`` says: ``"bare"`` (where it is), ``"primary"`` (on the lesson's primary
    device), ``"gpulab.DataParallel"`` (on the lesson's devices), ``"nn.DataParallel"`` (on two GPUs when there are
    two, else on no device), ``"DistributedDataParallel"`` (in the one-rank group ``_in_a_group`` made)."""
    if wrap == "primary":
        return inner.to(current_devices().primary)
    if wrap == "gpulab.DataParallel":
        return DataParallel(inner.to(current_devices().primary), device_ids=current_devices())
    if wrap == "nn.DataParallel" and torch.cuda.device_count() >= 2:
        return nn.DataParallel(inner.cuda(), device_ids=[0, 1])
    if wrap == "nn.DataParallel":
        return nn.DataParallel(inner)
    if wrap == "DistributedDataParallel":
        return nn.parallel.DistributedDataParallel(inner)
    return inner


def _one_rank_group(store: str) -> bool:
    """A one-rank gloo process group on the loopback interface, its store the file ``store``; whether this call
    created it (``False``: one already existed)."""
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return False
    saved = os.environ.get("GLOO_SOCKET_IFNAME")
    try:
        loopback = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    except (OSError, AttributeError):
        loopback = []
    if saved is None and loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback[0]
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store, 1), rank=0, world_size=1)
    finally:
        if saved is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
    return True


def _close_group() -> None:
    """Destroy the group ``_one_rank_group`` created, after the scenario's models are gone.

    The group's destructor joins its gloo worker threads, and a worker that has just finished a collective may need
    the GIL to free the work's tensors. PyTorch's Python binding of a process group releases the GIL before that
    destructor runs; a ``DistributedDataParallel``'s reducer, holding the group too, does not. Had a reducer held the
    last reference, dropping it would deadlock with such a worker (pytorch/pytorch#56297: gradings hung so, now and
    then). So the models go first (``gc.collect`` for any in reference cycles), and the last reference is this
    function's own, dropped from Python."""
    import gc

    import torch.distributed as dist

    group = dist.group.WORLD
    gc.collect()
    dist.destroy_process_group()
    del group


def _in_a_group(wrap: str, scenario: Callable[[], Any]) -> Any:
    """``scenario()``, inside a one-rank process group (made here, closed here) when ``wrap`` asks for
    ``DistributedDataParallel``. The scenario builds its models itself, so that none outlives the group; an
    exception leaves without the frames it passed through (the failing call's model among them)."""
    if wrap != "DistributedDataParallel":
        return scenario()
    with tempfile.TemporaryDirectory(prefix="gpulab-group-") as store:
        created = _one_rank_group(os.path.join(store, "store"))
        try:
            return scenario()
        except Exception as error:
            raise error.with_traceback(None) from None
        finally:
            if created:
                _close_group()


def _read_checkpoint(folder: Folder) -> Any:
    """The checkpoint in ``folder`` as the judge reads it: its content, or a sentence saying why there is none."""
    if CHECKPOINT_NAME not in folder.listdir():
        return "no file at path"
    try:
        return folder.load(CHECKPOINT_NAME)
    except Exception as error:  # noqa: BLE001 - the file is what it is: reported, judged as wrong
        return f"not a checkpoint torch.load(weights_only=True) reads: {type(error).__name__}"


def _state_dict_entries(state: Any) -> Any:
    """A saved model entry as ``entries`` has it when it is a state dict (a ``dict`` or ``OrderedDict``, which
    ``load_state_dict`` takes), else a sentence saying what it is."""
    if type(state) not in (dict, OrderedDict):
        return f"a {type(state).__name__}, not a state dict"
    return entries(state)


def same_structure(got: Any, expected: Any, tolerance: Tolerance | None = None) -> bool:
    """``got`` has ``expected``'s structure and values: dicts with the same keys in order, lists and tuples (either)
    of the same length, tensors of the same shape with equal values (within ``tolerance``, when given; compared
    only once their shapes agree, so a huge tensor is never unpacked), numbers (not bools) equal or close, anything
    else ``==``. An optimizer's state dict is compared so (``torch.load`` keeps tuples, the grader's wire does
    not)."""
    if isinstance(expected, torch.Tensor):
        return same_entries([["", got]], [["", expected.detach().cpu()]], tolerance)
    if isinstance(expected, Mapping):
        return (
            isinstance(got, Mapping)
            and list(got) == list(expected)
            and all(same_structure(got[key], expected[key], tolerance) for key in expected)
        )
    if isinstance(expected, (list, tuple)):
        return (
            type(got) in (list, tuple)
            and len(got) == len(expected)
            and all(same_structure(g, e, tolerance) for g, e in zip(got, expected, strict=True))
        )
    if isinstance(expected, (int, float)) and not isinstance(expected, bool) and tolerance is not None:
        return type(got) in (int, float) and tolerance.close(got, expected)
    return type(got) is type(expected) and got == expected


def gpu_tagged_bytes(obj: Any, device: str = MISSING_GPU) -> bytes:
    """``torch.save(obj)``'s bytes, every tensor tagged with ``device``: the file a machine with that GPU would have
    written. ``torch.load`` without ``map_location`` fails on it, exactly as a GPU checkpoint fails on a machine
    without that GPU. ``torch.save`` asks ``torch.serialization.location_tag`` for each storage's device; the tag
    is patched for this one call (tests/test_lesson_04.py checks that torch still works this way)."""
    buffer = io.BytesIO()
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: device):
        torch.save(obj, buffer)
    return buffer.getvalue()


def _bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


# --------------------------------------------------------------------------------------------- save_checkpoint
SAVES_THE_DICT = (
    'it saves `{"model": ..., "optimizer": ..., "epoch": ...}`: the model\'s state dict, `optimizer.state_dict()` '
    "and the epoch"
)
NO_PREFIX = (
    '`"model"` is the state dict with no `module.` prefix, whether `model` is bare, a `DataParallel` (real or '
    "virtual) or a `DistributedDataParallel`"
)
ATOMICALLY = (
    "it saves atomically: saving again replaces the file, and if saving fails, the previous file at `path` is "
    "intact, no temporary file is left, and the error reaches the caller"
)


# A save rule trains its model where the check runs, and the self-check's expected state was trained where the
# lessons were built (``gpulab_solutions.recorded``). Another CPU (another vector width) or build of PyTorch sums in
# another order, so the two agree to float32's rounding, not bit for bit: the save rules compare the saved tensors
# and numbers within this. Every mistake they catch is far outside it: a state one step off moves the weights by
# about the learning rate (0.01-0.1), a half-precision copy by up to 5e-4 of each value.
SAVED_TOLERANCE = Tolerance(absolute=1e-6, relative=1e-5)


def saved_by(answer: Callable, folder: str, layers, seed, optimizer, epoch, wrap="bare", as_path=False) -> None:
    """Adapter of the save rules: ``answer(path, model, optimizer, epoch)`` in ``folder``, the model of ``layers``
    and ``seed`` trained two steps with ``optimizer``, then placed and wrapped as ``wrap`` says."""

    def scenario() -> None:
        inner, made = trained(layers, seed, optimizer, steps=2)
        answer(_path(folder, as_path), _wrapped(inner, wrap), made, epoch)

    _in_a_group(wrap, scenario)


def observe_saved(folder: Folder, returned, layers, seed, optimizer, epoch, wrap="bare", as_path=False) -> Any:
    """What the save rules judge, read from the folder: the checkpoint's entries, epoch, model and optimizer."""
    saved = _read_checkpoint(folder)
    if not isinstance(saved, Mapping):
        return {"file": saved if isinstance(saved, str) else f"holds a {type(saved).__name__}, not a dict"}
    return {
        "entries": sorted(key for key in ENTRIES if key in saved),
        "epoch": saved.get("epoch"),
        "model": _state_dict_entries(saved.get("model")),
        "optimizer": saved.get("optimizer"),
    }


def same_checkpoint(got: Any, expected: dict) -> bool:
    return (
        isinstance(got, dict)
        and got.get("entries") == expected["entries"]
        and same_epoch(got.get("epoch"), expected["epoch"])
        and same_entries(got.get("model"), expected["model"], SAVED_TOLERANCE)
        and same_structure(got.get("optimizer"), expected["optimizer"], SAVED_TOLERANCE)
    )


def same_model_entry(got: Any, expected: dict) -> bool:
    """Only the model's state dict (the unwrapping rule's concern)."""
    return isinstance(got, dict) and same_entries(got.get("model"), expected["model"], SAVED_TOLERANCE)


def _contents_visible() -> list[Call]:
    why = "save {'model': state dict, 'optimizer': optimizer.state_dict(), 'epoch': epoch}"
    return [Call((MLP_LAYERS, 1, ADAM, 3, "primary", True), why), Call((LINEAR_2_1, 0, SGD, 7), why)]


def _unwraps_visible() -> list[Call]:
    why = "a wrapped model saves its .module's state dict: no `module.` prefix in the file"
    return [
        Call((MLP_LAYERS, 2, ADAM, 5, "gpulab.DataParallel", True), why),
        Call((LINEAR_2_1, 0, SGD, 1, "gpulab.DataParallel", True), why),
    ]


def _unwraps_extra() -> list[Call]:
    return [
        Call((SEQ_TANH, 4, SGD_MOMENTUM, 3, "DistributedDataParallel"), "a DistributedDataParallel model too"),
        Call((HOLDER, 6, SGD, 2, "bare"), "a plain model with a submodule called module is no wrapper: it saves whole"),
    ]


def _saved_a_part(case: Case, got: Any) -> bool:
    """A plain model with a submodule called ``module`` saved only that submodule (told a wrapper by a name)."""
    keys = _model_keys(got)
    return case.args[0] == HOLDER and bool(keys) and not any(str(key).startswith(PREFIX) for key in keys)


class FailsWhenSaved:
    """An object whose pickling fails as a full disk does (where a process cannot limit the size of its files)."""

    def __reduce__(self):
        raise OSError(28, "No space left on device")


TEMPORARY = "temporary"  # the default folder for temporary files while the atomic-save rule runs, in the call's


@contextmanager
def _a_full_disk(optimizer: torch.optim.Optimizer):
    """While it lasts, no file can grow past a few hundred bytes (``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored so that
    a write fails with an error instead of ending the process): a save fails *while writing*, as on a full disk.
    Where a process cannot do that (no ``resource`` module, or not in the main thread), the optimizer's settings get
    an object whose pickling fails so instead."""
    try:
        import resource
        import signal

        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except (ImportError, AttributeError, ValueError):
        optimizer.param_groups[0]["disk"] = FailsWhenSaved()
        yield
        return
    resource.setrlimit(resource.RLIMIT_FSIZE, (512 if hard == resource.RLIM_INFINITY else min(512, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def saves_in_turn(answer: Callable, folder: str, saves, as_path=False) -> list:
    """Adapter of the atomic-save rule: ``answer(path, model, optimizer, epoch)`` for each ``[epoch, failure]`` of
    ``saves`` in turn, to one path, the model a ``Linear(4, 3)`` of seed ``epoch`` after one SGD step; a failure
    makes that save fail midway: ``"unpicklable"`` (a lambda in the optimizer's settings) while pickling, ``"disk
    full"`` while writing (``_a_full_disk``). Meanwhile Python's default folder for temporary files is the call's
    ``temporary`` folder, so that a temporary file left anywhere by default is seen. What each save raised: the
    exception's class name, or None."""
    raised = []
    default = tempfile.tempdir
    tempfile.tempdir = os.path.join(folder, TEMPORARY)
    os.makedirs(tempfile.tempdir, exist_ok=True)
    try:
        for epoch, failure in saves:
            model, made = trained(LINEAR_4_3, epoch, SGD_MOMENTUM, steps=1)
            if failure == "unpicklable":
                made.param_groups[0]["schedule"] = lambda step: 0.5**step
            try:
                with _a_full_disk(made) if failure == "disk full" else nullcontext():
                    answer(_path(folder, as_path), model, made, epoch)
            except Exception as error:  # noqa: BLE001 - whether a save raised is the outcome
                raised.append(type(error).__name__)
            else:
                raised.append(None)
    finally:
        tempfile.tempdir = default
    return raised


def plant_notes(path: str, *args, **kwargs) -> dict[str, bytes]:
    return {NOTES: b"the learner's own notes, beside the checkpoint"}


def observe_turns(folder: Folder, returned, saves, as_path=False) -> dict:
    """What the atomic-save rule judges: which saves raised, the folder's names, the checkpoint's epoch and model."""
    saved = _read_checkpoint(folder)
    checkpoint = [saved.get("epoch"), _state_dict_entries(saved.get("model"))] if isinstance(saved, Mapping) else saved
    raised = [item is not None for item in returned] if isinstance(returned, list) else returned
    files = folder.listdir()
    temporary = folder.listdir(TEMPORARY) if TEMPORARY in files else None
    return {"raised": raised, "files": files, "temporary files": temporary, "checkpoint": checkpoint}


def same_turns(got: Any, expected: dict) -> bool:
    if not isinstance(got, dict) or any(
        got.get(key) != expected[key] for key in ("raised", "files", "temporary files")
    ):
        return False
    want, checkpoint = expected["checkpoint"], got.get("checkpoint")
    if isinstance(want, str):
        return checkpoint == want
    return (
        type(checkpoint) is list
        and len(checkpoint) == 2
        and same_epoch(checkpoint[0], want[0])
        and same_entries(checkpoint[1], want[1], SAVED_TOLERANCE)
    )


def _atomic_visible() -> list[Call]:
    return [
        Call(
            ([[1, None], [2, "unpicklable"]],),
            "write to a temporary file in the same folder, os.replace it onto path, delete it if saving fails, "
            "and let the error reach the caller",
        ),
        Call(([[1, None], [2, None]], True), "saving twice replaces the file and leaves no temporary file behind"),
    ]


SAVE_RULES = dict(adapter=saved_by, observe=observe_saved)
SAVE_CHECKPOINT_RULES = (
    Rule(
        SAVES_THE_DICT,
        "contents",
        same=same_checkpoint,
        visible=_contents_visible,
        **SAVE_RULES,
    ),
    Rule(
        NO_PREFIX,
        "unwraps",
        same=same_model_entry,
        visible=_unwraps_visible,
        extra=_unwraps_extra,
        **SAVE_RULES,
    ),
    Rule(
        ATOMICALLY,
        "atomic",
        same=same_turns,
        visible=_atomic_visible,
        adapter=saves_in_turn,
        plant=plant_notes,
        observe=observe_turns,
    ),
)


def _model_keys(got: Any) -> list:
    model = got.get("model") if isinstance(got, dict) else None
    return [pair[0] for pair in model if isinstance(pair, list) and pair] if isinstance(model, list) else []


def _destroyed(case: Case, got: Any) -> bool:
    """The atomic rule's checkpoint is not the last good one (a failed save emptied or replaced it)."""
    return (
        isinstance(got, dict)
        and isinstance(case.expected, dict)
        and got.get("checkpoint") != "no file at path"
        and (not same_turns({**case.expected, "checkpoint": got.get("checkpoint")}, case.expected))
    )


SAVE_CHECKPOINT = Exercise(
    name="save_checkpoint",
    tolerance=SAVED_TOLERANCE,
    shown_words=("no file at path", "temporary files"),
    rules=SAVE_CHECKPOINT_RULES,
    hints=[
        Hint(
            lambda case, got: any(str(key).startswith(PREFIX) for key in _model_keys(got)),
            "The wrapper's state dict has the `module.` prefix (see 'Where the prefix comes from'). Save the state "
            "dict of the model inside the wrapper, for DataParallel and DDP alike; and tell a wrapper by its type, "
            "since a plain model may have an attribute called module.",
        ),
        Hint(
            _saved_a_part,
            "That model is no wrapper: it is a plain model with a submodule called module, and its checkpoint holds "
            "all of it. Tell a wrapper by its type, not by the name of an attribute ('Where the prefix comes from').",
        ),
        Hint(
            lambda case, got: isinstance(got, dict) and "weights_only" in str(got.get("file", "")),
            "Save only state dicts and plain values, not the model or optimizer objects: loading with "
            "weights_only=True refuses other objects.",
        ),
        Hint(
            lambda case, got: (
                isinstance(got, dict)
                and isinstance(got.get("raised"), list)
                and got["raised"] != case.expected["raised"]
                and not any(got["raised"])
            ),
            "The error disappeared: the caller must learn that the checkpoint was not saved. Clean up, then let the "
            "error through.",
        ),
        Hint(
            _destroyed,
            "torch.save empties the file before it writes: a failure destroys the last good checkpoint, as 'A failed "
            "save destroys the last good checkpoint' showed. Write elsewhere first, then put the finished file in "
            "place atomically.",
        ),
        Hint(
            lambda case, got: (
                isinstance(got, dict)
                and isinstance(got.get("files"), list)
                and (len(got["files"]) > len(case.expected["files"]) or bool(got.get("temporary files")))
            ),
            "A temporary file was left behind: a failed save must clean up after itself, whatever went wrong.",
        ),
    ],
    general_hint=(
        "Two ideas from the lesson: save the unwrapped model's state dict ('The clean habit'), and save atomically "
        "('Saving safely'): a temporary file in the same folder, renamed onto path only when complete; on failure, no "
        "trace and the error reaches the caller."
    ),
)


# --------------------------------------------------------------------------------------------- load_checkpoint
# A load call's inputs: the ``source`` the judge plants the checkpoint from and the ``target`` the answer loads it
# into (dicts of plain values, below).
LOADS_ANY_KEYS = (
    "it loads the checkpoint into `model`, bare or wrapped, whether the file's keys carry the `module.` prefix or "
    "not, and returns the epoch"
)
RESTORES_THE_OPTIMIZER = "it restores the optimizer when one is given"
ONTO_THE_MODELS_DEVICE = "by default it loads onto the device of the model's parameters"
RUNS_NO_CODE = "it never runs code from the file: a file that carries code is refused with an error"
RESUME_TOLERANCE = Tolerance(absolute=1e-5, relative=1e-4)


class RunsCode:
    """Unpickling this makes the folder ``marker``: proof that loading ran code from the file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def source(layers, seed, epoch, optimizer=None, steps=0, prefixed=False, tag=None, payload=None) -> dict:
    """What a planted checkpoint holds: the model of ``layers`` and ``seed`` after ``steps`` of ``optimizer``, its
    keys ``prefixed`` as a DataParallel saves them, the epoch; its tensors tagged with the GPU ``tag``; a ``payload``
    of code (``"epoch"``, ``"model"``: in that entry; ``"top"``: the whole file)."""
    return {
        "layers": layers,
        "seed": seed,
        "epoch": epoch,
        "optimizer": optimizer,
        "steps": steps,
        "prefixed": prefixed,
        "tag": tag,
        "payload": payload,
    }


def target(layers, seed, place="primary", optimizer=None, train=0, map_location=None, as_path=True) -> dict:
    """The model an answer loads into: ``layers`` with ``seed``'s weights (which the file must replace), placed or
    wrapped as ``place`` says (``_wrapped``; ``"cpu"``, ``"cuda"``: bare on that device), an ``optimizer`` passed to
    the answer when given, ``train`` more steps after loading, an explicit ``map_location`` when given."""
    return {
        "layers": layers,
        "seed": seed,
        "place": place,
        "optimizer": optimizer,
        "train": train,
        "map_location": map_location,
        "as path": as_path,
    }


def plant_checkpoint(path: str, source: dict, target: dict) -> dict[str, bytes]:
    """The checkpoint file ``source`` describes, made by the judge (the code of a payload makes its folder in
    ``path``)."""
    model, made = trained(source["layers"], source["seed"], source["optimizer"], source["steps"])
    state = nn.DataParallel(model).state_dict() if source["prefixed"] else model.state_dict()
    content: Any = {"model": state, "optimizer": {} if made is None else made.state_dict(), "epoch": source["epoch"]}
    code = RunsCode(os.path.join(path, CODE_RAN))
    if source["payload"] == "epoch":
        content["epoch"] = code
    elif source["payload"] == "model":
        content["model"] = {**model.state_dict(), "weight": code}
    elif source["payload"] == "top":
        content = code
    return {CHECKPOINT_NAME: gpu_tagged_bytes(content, source["tag"]) if source["tag"] else _bytes(content)}


def sent_to_the_loader(source: dict, target: dict) -> tuple:
    """What the loader's side gets of a load call: the target, and the inputs of the training steps after the load
    (those that follow the source's). The source, which says what the file holds, stays with the judge."""
    return target, _batches(source["layers"], source["seed"], source["steps"], target["train"])


def loaded_by(answer: Callable, folder: str, target: dict, after: list) -> dict:
    """Adapter of the load rules: ``answer(path, model[, optimizer][, map_location=...])`` on the planted file, the
    model ``target`` describes; then one step of its optimizer on each input of ``after``. What came back:
    ``{"returned": value}`` or ``{"raised": "Error: message"}``; the bare model's state dict (on the CPU) and its
    parameters' device types; the optimizer's state dict."""

    def scenario() -> dict:
        inner, _ = trained(target["layers"], target["seed"])
        place = target["place"]
        if place in ("cpu", "cuda"):
            inner = inner.to(place)
        model = _wrapped(inner, place)
        kind = target["optimizer"]
        made = None if kind is None else getattr(torch.optim, kind[0])(model.parameters(), **kind[1])
        arguments = [_path(folder, target["as path"]), model, *([made] if made is not None else [])]
        options = {} if target["map_location"] is None else {"map_location": target["map_location"]}
        try:
            outcome = {"returned": answer(*arguments, **options)}
        except Exception as error:  # noqa: BLE001 - refusing a file is an outcome
            return {"raised": f"{type(error).__name__}: {str(error)[:300]}"}
        device = next(inner.parameters()).device
        for inputs in after:
            _step(model, made, inputs.to(device))
        outcome["state"] = entries(inner.state_dict())
        outcome["devices"] = sorted({parameter.device.type for parameter in inner.parameters()})
        if made is not None:
            outcome["optimizer"] = made.state_dict()
        return outcome

    return _in_a_group(target["place"], scenario)


def observe_loaded(folder: Folder, returned, source: dict, target: dict) -> dict:
    """What the load rules judge: what the call returned and left (values), and whether the folder the code of a
    payload makes is there (the judge's own listing)."""
    outcome = dict(returned) if isinstance(returned, dict) else {"returned": returned}
    outcome["code ran"] = CODE_RAN in folder.listdir()
    return outcome


def _loaded(got: Any, expected: dict, tolerance: Tolerance | None = None) -> bool:
    return (
        isinstance(got, dict)
        and "raised" not in got
        and got.get("code ran") is False
        and same_epoch(got.get("returned"), expected["returned"])
        and same_entries(got.get("state"), expected["state"], tolerance)
    )


def same_loaded(got: Any, expected: dict) -> bool:
    return _loaded(got, expected)


def same_resumed(got: Any, expected: dict) -> bool:
    """The model (within ``RESUME_TOLERANCE``: training may run on GPUs) and, where given, the optimizer."""
    if not _loaded(got, expected, RESUME_TOLERANCE):
        return False
    return "optimizer" not in expected or same_structure(got.get("optimizer"), expected["optimizer"], RESUME_TOLERANCE)


def same_on_device(got: Any, expected: dict) -> bool:
    return _loaded(got, expected) and got.get("devices") == expected["devices"]


def same_refusal(got: Any, expected: dict) -> bool:
    """A file with code: refused (raised) and its code never run; a clean file: loaded."""
    if "refused" not in expected:
        return _loaded(got, expected)
    return isinstance(got, dict) and got.get("code ran") is False and "raised" in got


def _models_visible() -> list[Call]:
    clean = source(MLP_LAYERS, 12, 7)
    old = source(MLP_LAYERS, 14, 7, prefixed=True)
    return [
        Call((clean, target(MLP_LAYERS, 13)), "a clean checkpoint loads into a bare model; return the epoch"),
        Call(
            (clean, target(MLP_LAYERS, 15, "gpulab.DataParallel")), "load into model.module when the model is wrapped"
        ),
        Call(
            (old, target(MLP_LAYERS, 13)),
            "an old checkpoint saved with model.state_dict() of a wrapped model has `module.` keys: strip them",
        ),
        Call(
            (source(LINEAR_2_1, 0, 3, prefixed=True), target(LINEAR_2_1, 1)),
            "an old checkpoint saved with model.state_dict() of a wrapped model has `module.` keys: strip them",
        ),
    ]


def _models_extra() -> list[Call]:
    return [
        Call(
            (source(SEQ_TANH, 3, 9), target(SEQ_TANH, 4, "DistributedDataParallel")),
            "load into model.module when the model is wrapped",
        )
    ]


def _resume_visible() -> list[Call]:
    return [
        Call(
            (source(MLP_LAYERS, 5, 2, ADAM, 1), target(MLP_LAYERS, 6, optimizer=ADAM)),
            "restore the optimizer with optimizer.load_state_dict when one is given",
        ),
    ]


def _device_visible() -> list[Call]:
    return [
        Call(
            (source(MLP_LAYERS, 8, 4, tag=MISSING_GPU), target(MLP_LAYERS, 9, "cpu")),
            "map_location defaults to the device of the model's parameters, so a checkpoint from a GPU this "
            "machine does not have still loads",
        ),
    ]


def _refusal_visible() -> list[Call]:
    return [
        Call(
            (source(MLP_LAYERS, 10, 3, payload="epoch"), target(MLP_LAYERS, 11)),
            "torch.load(..., weights_only=True) refuses anything but tensors and plain data",
        ),
        Call((source(MLP_LAYERS, 10, 3), target(MLP_LAYERS, 11)), "a clean checkpoint still loads"),
    ]


LOAD_RULES = dict(
    adapter=loaded_by,
    sent=sent_to_the_loader,
    plant=plant_checkpoint,
    observe=observe_loaded,
)
LOAD_CHECKPOINT_RULES = (
    Rule(
        LOADS_ANY_KEYS,
        "models",
        same=same_loaded,
        visible=_models_visible,
        extra=_models_extra,
        **LOAD_RULES,
    ),
    Rule(
        RESTORES_THE_OPTIMIZER,
        "resume",
        same=same_resumed,
        visible=_resume_visible,
        **LOAD_RULES,
    ),
    Rule(
        ONTO_THE_MODELS_DEVICE,
        "resume",
        same=same_on_device,
        visible=_device_visible,
        **LOAD_RULES,
    ),
    Rule(RUNS_NO_CODE, "refuses_code", same=same_refusal, visible=_refusal_visible, **LOAD_RULES),
)


def _raised(got: Any) -> str:
    return str(got.get("raised", "")) if isinstance(got, dict) else ""


def _on_another_device(case: Case, got: Any) -> bool:
    """The loader failed on a GPU's tensors, or left the model on another device than the one it was on."""
    moved = (
        isinstance(got, dict) and "devices" in got and got["devices"] != case.expected.get("devices", got["devices"])
    )
    return "cuda" in _raised(got).lower() or moved


LOAD_CHECKPOINT = Exercise(
    name="load_checkpoint",
    shown_words=("code ran",),
    rules=LOAD_CHECKPOINT_RULES,
    hints=[
        Hint(
            lambda case, got: isinstance(got, dict) and got.get("code ran") is True,
            "Loading must refuse code (weights_only=True, see 'A checkpoint is a pickle'), and must not fall back to "
            "unsafe loading when that fails: the error is the protection.",
        ),
        Hint(
            _on_another_device,
            "The tensors came back on the device they were saved from. Without a map_location given, they belong on "
            "the device of the model's parameters ('Loading on another device').",
        ),
        Hint(
            lambda case, got: "Missing key" in _raised(got) or "Unexpected key" in _raised(got),
            "The keys did not match: load into the model inside a wrapper, and remove a leading `module.` from the "
            "checkpoint's keys (exercise 1).",
        ),
        Hint(
            lambda case, got: (
                "optimizer" in case.expected
                and not same_structure(got.get("optimizer"), case.expected["optimizer"], RESUME_TOLERANCE)
            ),
            "When an optimizer is given, restore its state too: 'A training checkpoint, and resuming' showed what a "
            "fresh optimizer costs.",
        ),
        Hint(
            lambda case, got: (
                "returned" in case.expected and not same_epoch(got.get("returned"), case.expected["returned"])
            ),
            "Return the epoch stored in the checkpoint.",
        ),
    ],
    general_hint=(
        "The reverse of save_checkpoint: load safely onto the model's device, into the bare model whatever the keys' "
        "prefix, restore the optimizer when given, and give back the epoch."
    ),
)

EXERCISES = [STRIP_MODULE_PREFIX, SAVE_CHECKPOINT, LOAD_CHECKPOINT]

# The texts above in Japanese, for the Japanese edition (gpulab.messages.text looks them up by their English).
TRANSLATIONS: dict[str, dict[str, str]] = {
    "ja": {
        # what the observations say (keys and findings shown in a difference: gpulab.check's _shown_repr)
        "no file at path": "pathにファイルがありません",
        "temporary files": "一時ファイル",
        "code ran": "コードが実行されたか",
        "a plain model with a submodule called module is no wrapper: it saves whole": (
            "`module`という名前のサブモジュールを持つ普通のモデルはラッパーではありません：全体を保存します"
        ),
        # The rules of strip_module_prefix: the lesson's sentences, as its Japanese edition words them.
        STRIPS_THE_PREFIX: "`module.`で始まるキーからそのプレフィックスを取り除きます",
        ONLY_ONCE: "取り除く先頭の`module.`は1つだけです。それ以外のキーとすべての値はそのまま、同じ順番に保ちます",
        ANY_ORDER: "一部のキーだけが`module.`で始まる場合、キーの順番は問いません",
        A_NEW_DICT: "引数ではなく新しい辞書（または`OrderedDict`）を返し、引数は変更しません",
        # The rules of save_checkpoint and load_checkpoint, as the Japanese edition words them.
        SAVES_THE_DICT: (
            '`{"model": ..., "optimizer": ..., "epoch": ...}`、つまりモデルのstate dict、`optimizer.state_dict()`、'
            "エポックを保存します"
        ),
        NO_PREFIX: (
            '`"model"`は`module.`プレフィックスのないstate dictです。`model`がラップされていないモデルでも、'
            "`DataParallel`（本物でも仮想でも）でも、`DistributedDataParallel`でも同じです"
        ),
        ATOMICALLY: (
            "保存はアトミックに行います。もう一度保存するとファイルが置き換わり、保存に失敗したときは、"
            "`path`にあった以前のファイルがそのまま残り、一時ファイルも残らず、エラーが呼び出し元に伝わります"
        ),
        LOADS_ANY_KEYS: (
            "チェックポイントを`model`に読み込み、エポックを返します。モデルはラップされていてもいなくてもよく、"
            "ファイルのキーに`module.`プレフィックスが付いていてもいなくても読み込めます"
        ),
        RESTORES_THE_OPTIMIZER: "オプティマイザが渡されたときは、その状態も復元します",
        ONTO_THE_MODELS_DEVICE: "デフォルトでは、モデルのパラメータがあるデバイスに読み込みます",
        RUNS_NO_CODE: "ファイル内のコードは決して実行しません。コードを含むファイルはエラーで拒否します",
        "a DistributedDataParallel model too": "DistributedDataParallelのモデルでも同じです",
        "a clean checkpoint still loads": "問題のないチェックポイントは読み込めます",
        "module.layers.0.weight becomes layers.0.weight": "module.layers.0.weightはlayers.0.weightになります",
        "a new dict even when there is nothing to strip": "取り除くものがなくても新しい辞書を返します",
        (
            "Each key that starts with `module.` loses that one prefix, every other key and every value stays, in "
            "the same order, in a new mapping: what consume_prefix_in_state_dict_if_present did in 'Rescuing a "
            "checkpoint saved with the prefix', without touching the argument."
        ): (
            "`module.`で始まる各キーからそのプレフィックスを1つだけ取り除き、"
            "それ以外のキーとすべての値は同じ順番のまま新しいマッピングに入れます。"
            "「プレフィックス付きで保存されたチェックポイントを救出する」でconsume_prefix_in_state_dict_if_presentが"
            "行ったことを、引数に手を触れずに行います。"
        ),
        (
            "The contract asks for a new mapping as the return value. (PyTorch's consume_prefix_in_state_dict_if_pres"
            "ent changes a dict in place and returns None.)"
        ): (
            "仕様では、新しいマッピングを戻り値として返すことになっています（PyTorchのconsume_prefix_in_state_dict_if"
            "_presentは辞書をインプレースで書き換え、Noneを返します）。"
        ),
        (
            "It returned the caller's state dict itself, which may still be in use: build and return a new dict, and "
            "leave the argument alone."
        ): (
            "呼び出し元のstate dictそのものを返しています。それはまだ使われているかもしれません。"
            "新しい辞書を作って返し、引数はそのままにしてください。"
        ),
        ("Remove one leading `module.` only: in module.module.weight the second `module.` is a real attribute name."): (
            "先頭の`module.`を1つだけ取り除いてください。module.module.weightでは、2つ目の`module.`は本物の属性名です。"
        ),
        (
            "str.replace removes `module.` wherever it appears, also inside a name like block.module.weight: see the "
            "Residual block in 'Rescuing a checkpoint saved with the prefix'. Only a prefix at the start of a key "
            "goes."
        ): (
            "str.replaceは、block.module.weightのような名前の途中も含め、`module.`をどこにあっても取り除きます。"
            "「プレフィックス付きで保存されたチェックポイントを救出する」のResidualブロックを見てみましょう。"
            "取り除くのはキーの先頭にあるプレフィックスだけです。"
        ),
        (
            "str.lstrip removes a *set of characters* (m, o, d, u, l, e and '.'), not a word, so it eats into names "
            "like model.weight. Only the exact text `module.` at the start of a key goes."
        ): (
            "str.lstripが取り除くのは単語ではなく*文字の集合*（m、o、d、u、l、eと'.'）なので、"
            "model.weightのような名前まで削ってしまいます。取り除くのは、キーの先頭にある`module.`という文字列そのも"
            "のだけです。"
        ),
        "Only keys that start with `module.` change; every other key stays exactly as it is.": (
            "変わるのは`module.`で始まるキーだけで、それ以外のキーはまったくそのままです。"
        ),
        "every key loses its leading `module.`; the values stay the same tensors": (
            "すべてのキーから先頭の`module.`が取り除かれ、値は同じテンソルのままです"
        ),
        "only the *leading* `module.` goes: module.block.module.weight -> block.module.weight": (
            "取り除くのは*先頭の*`module.`だけ：module.block.module.weight -> block.module.weight"
        ),
        "keys without the prefix stay exactly as they are": "プレフィックスのないキーはまったくそのままです",
        "remove one `module.` only: the second one is the Residual's own attribute": (
            "`module.`は1つだけ取り除きます。2つ目はResidual自身の属性です"
        ),
        "build and return a new dict; the caller's state dict must keep its keys": (
            "新しい辞書を作って返します。呼び出し元のstate dictのキーは変えてはいけません"
        ),
        "strip each key that starts with `module.`": "`module.`で始まる各キーからプレフィックスを取り除きます",
        "`module.` must be at the start": "`module.`は先頭になければなりません",
        "nothing to strip": "取り除くものがない",
        (
            "Two ideas from the lesson: save the unwrapped model's state dict ('The clean habit'), and save "
            "atomically ('Saving safely'): a temporary file in the same folder, renamed onto path only when "
            "complete; on failure, no trace and the error reaches the caller."
        ): (
            "レッスンの2つの考え方を使います。ラップを外したモデルのstate "
            "dictを保存すること（「クリーンな習慣」）と、アトミックに保存すること（「安全に保存する」）です。"
            "同じフォルダーに一時ファイルを作り、書き終わってからpathへリネームします。失敗したときは何も残さず、"
            "エラーを呼び出し元に伝えます。"
        ),
        (
            "That model is no wrapper: it is a plain model with a submodule called module, and its checkpoint holds "
            "all of it. Tell a wrapper by its type, not by the name of an attribute ('Where the prefix comes from')."
        ): (
            "このモデルはラッパーではありません。`module`という名前のサブモジュールを持つ普通のモデルで、"
            "チェックポイントにはその全体が入ります。ラッパーかどうかは属性の名前ではなく型で見分けてください"
            "（「プレフィックスはどこから来るのか」）。"
        ),
        (
            "The wrapper's state dict has the `module.` prefix (see 'Where the prefix comes from'). Save the state "
            "dict of the model inside the wrapper, for DataParallel and DDP alike; and tell a wrapper by its type, "
            "since a plain model may have an attribute called module."
        ): (
            "ラッパーのstate dictには`module.`プレフィックスが付きます（「プレフィックスはどこから来るのか」を参照）"
            "。DataParallelでもDDPでも、ラッパーの中のモデルのstate dictを保存してください。また、"
            "普通のモデルにもmoduleという属性があり得るので、ラッパーかどうかは型で判断してください。"
        ),
        (
            "Save only state dicts and plain values, not the model or optimizer objects: loading with "
            "weights_only=True refuses other objects."
        ): (
            "保存するのはstate dictと単純な値だけにし、モデルやオプティマイザのオブジェクトは保存しないでください。"
            "weights_only=Trueで読み込むと、それ以外のオブジェクトは拒否されます。"
        ),
        (
            "The error disappeared: the caller must learn that the checkpoint was not saved. Clean up, then let the "
            "error through."
        ): (
            "エラーが消えています。呼び出し元は、チェックポイントが保存されなかったことを知る必要があります。"
            "後片付けをしてから、エラーをそのまま伝えてください。"
        ),
        (
            "torch.save empties the file before it writes: a failure destroys the last good checkpoint, as 'A failed "
            "save destroys the last good checkpoint' showed. Write elsewhere first, then put the finished file in "
            "place atomically."
        ): (
            "torch.saveは書き込む前にファイルを空にします。「保存に失敗すると、"
            "最後の正常なチェックポイントが失われる」で見たように、失敗すると最後の正常なチェックポイントが失われます"
            "。まず別の場所に書き、書き終わったファイルをアトミックに置き換えてください。"
        ),
        "A temporary file was left behind: a failed save must clean up after itself, whatever went wrong.": (
            "一時ファイルが残っています。保存に失敗したときは、原因が何であれ自分で後片付けをする必要があります。"
        ),
        "save {'model': state dict, 'optimizer': optimizer.state_dict(), 'epoch': epoch}": (
            "{'model': モデルのstate_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch}を保存します"
        ),
        "a wrapped model saves its .module's state dict: no `module.` prefix in the file": (
            "ラップされたモデルでは.moduleのstate dictを保存します。ファイルに`module.`プレフィックスは付きません"
        ),
        (
            "write to a temporary file in the same folder, os.replace it onto path, delete it if saving fails, and "
            "let the error reach the caller"
        ): (
            "同じフォルダーの一時ファイルに書き、os.replaceでpathに置き換えます。"
            "保存に失敗したら一時ファイルを削除し、エラーを呼び出し元に伝えます"
        ),
        "saving twice replaces the file and leaves no temporary file behind": (
            "2回保存するとファイルが置き換わり、一時ファイルは残りません"
        ),
        (
            "The reverse of save_checkpoint: load safely onto the model's device, into the bare model whatever the "
            "keys' prefix, restore the optimizer when given, and give back the epoch."
        ): (
            "save_checkpointの逆です。モデルのデバイスに安全に読み込み、"
            "キーのプレフィックスにかかわらずラップされていないモデルに読み込み、オプティマイザが渡されたら復元して、"
            "エポックを返します。"
        ),
        (
            "Loading must refuse code (weights_only=True, see 'A checkpoint is a pickle'), and must not fall back to "
            "unsafe loading when that fails: the error is the protection."
        ): (
            "読み込みではコードを拒否する必要があり（weights_only=True、「チェックポイントの中身はpickle」を参照）、"
            "それが失敗しても安全でない読み込みに切り替えてはいけません。そのエラーこそが防御です。"
        ),
        (
            "The tensors came back on the device they were saved from. Without a map_location given, they belong on "
            "the device of the model's parameters ('Loading on another device')."
        ): (
            "テンソルが保存元のデバイスに戻っています。map_locationが指定されていなければ、"
            "テンソルはモデルのパラメータのデバイスに置くべきです（「別のデバイスに読み込む」）。"
        ),
        (
            "The keys did not match: load into the model inside a wrapper, and remove a leading `module.` from the "
            "checkpoint's keys (exercise 1)."
        ): (
            "キーが一致しませんでした。ラッパーの中のモデルに読み込み、チェックポイントのキーから先頭の`module.`を取"
            "り除いてください（演習1）。"
        ),
        (
            "When an optimizer is given, restore its state too: 'A training checkpoint, and resuming' showed what a "
            "fresh optimizer costs."
        ): (
            "オプティマイザが渡されたときは、その状態も復元してください。"
            "新しいオプティマイザで始めると何を失うかは「学習用チェックポイントと再開」で見ました。"
        ),
        "Return the epoch stored in the checkpoint.": "チェックポイントに保存されたエポックを返してください。",
        "a clean checkpoint loads into a bare model; return the epoch": (
            "クリーンなチェックポイントはラップされていないモデルに読み込めます。エポックを返します"
        ),
        "load into model.module when the model is wrapped": (
            "モデルがラップされているときはmodel.moduleに読み込みます"
        ),
        "an old checkpoint saved with model.state_dict() of a wrapped model has `module.` keys: strip them": (
            "ラップされたモデルのmodel.state_dict()で保存した古いチェックポイントには`module.`付きのキーがあります。"
            "取り除きましょう"
        ),
        "restore the optimizer with optimizer.load_state_dict when one is given": (
            "オプティマイザが渡されたら、optimizer.load_state_dictで復元します"
        ),
        (
            "map_location defaults to the device of the model's parameters, so a checkpoint from a GPU this machine "
            "does not have still loads"
        ): (
            "map_locationの既定値はモデルのパラメータのデバイスなので、"
            "このマシンにないGPUで保存したチェックポイントも読み込めます"
        ),
        "torch.load(..., weights_only=True) refuses anything but tensors and plain data": (
            "torch.load(..., weights_only=True)は、テンソルと単純なデータ以外をすべて拒否します"
        ),
    },
}
