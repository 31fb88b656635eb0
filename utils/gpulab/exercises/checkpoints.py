"""Lesson 04 (saving checkpoints): the self-checks of ``strip_module_prefix``, ``save_checkpoint``, ``load_checkpoint``.

``strip_module_prefix`` is a function of plain data: its specification is four ``Rule`` objects (the lesson's
four sentences), which the self-check, the graded cells and the grader share. A checkpoint exercise has side
effects (files), so each of its cases is a small *scenario*: it builds fresh models and
optimizers, runs the learner's function in a temporary folder (removed afterwards) and reports what it observed
as plain values, e.g. ``{"model keys": [...], "weights equal": True}``. The expected observations come from
PyTorch itself: ``consume_prefix_in_state_dict_if_present`` for the keys, ``torch.load(weights_only=True)`` to read
what was saved, the models' own ``state_dict()`` for the weights.

Every case has a ``kind`` naming the graded test cell of the lesson whose visible part asserts it::

    for case in gpulab.check.cases("save_checkpoint", kind="wrapped"):
        got = case.call(save_checkpoint)
        assert got == case.expected, case.message("save_checkpoint", got)
"""

from __future__ import annotations

import os
import random
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from gpulab.check import Call, Case, Exercise, Hint, Rule, Scenario, same_values
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


def plain(value: Any) -> Any:
    """Nested dicts/lists/tuples with tensors turned into lists of numbers: comparable with ``==``."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def weights(model: nn.Module) -> dict[str, Any]:
    return plain(model.state_dict())


def trained_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """An Adam optimizer after one step, so that it has state (``step``, ``exp_avg``, ``exp_avg_sq``)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(6, 4, generator=generator).to(device)
    targets = torch.randint(0, 3, (6,), generator=generator).to(device)
    nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()
    optimizer.zero_grad()
    return optimizer


@contextmanager
def scratch_folder():
    with tempfile.TemporaryDirectory(prefix="gpulab-check-") as folder:
        yield Path(folder)


def save_as_if_on_gpu(obj: Any, path: str | os.PathLike) -> str:
    """``torch.save(obj, path)``, every tensor tagged with a CUDA device this machine does not have.

    That is the file a machine with one more GPU would have written; ``torch.load`` without ``map_location``
    fails on it here, exactly as a GPU checkpoint fails on a CPU-only machine. Returns the device name used.
    ``torch.save`` asks ``torch.serialization.location_tag`` for each storage's device; the tag is patched for
    this one call (tests/test_lesson_04.py checks that torch still works this way).
    """
    device = f"cuda:{torch.cuda.device_count()}"
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: device):
        torch.save(obj, path)
    return device


def reference_strip(state_dict: Mapping) -> OrderedDict:
    """What ``consume_prefix_in_state_dict_if_present(..., "module.")`` makes of each key, in the input's order."""
    stripped = OrderedDict()
    for key, value in state_dict.items():
        single = OrderedDict([(key, value)])
        consume_prefix_in_state_dict_if_present(single, PREFIX)
        stripped[next(iter(single))] = value
    return stripped


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


def _mixed(call: Call) -> bool:
    """Some keys of the call's state dict carry the prefix and some do not."""
    return len({key.startswith(PREFIX) for key in call.args[0]}) > 1


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


def _wrapped_states(rng: random.Random) -> list[Call]:
    """DataParallel state dicts of several models, two of them random layer stacks (keys of any depth)."""
    torch.manual_seed(rng.randrange(1 << 16))
    inners = [
        nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)),
        nn.Sequential(OrderedDict(encoder=nn.Linear(2, 2), decoder=nn.Linear(2, 5))),
        nn.Linear(6, 1),
    ]
    for _ in range(2):
        width = rng.randint(1, 5)
        layers = [nn.Linear(width, width) for _ in range(rng.randint(1, 4))]
        inners.append(nn.Sequential(*layers) if rng.random() < 0.5 else nn.ModuleList(layers))
    return [Call((wrapped_state(inner),)) for inner in inners]


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


def _tricky_states(rng: random.Random) -> list[Call]:
    """Keys with `module.` inside, twice or thrice at the start, look-alike prefixes, mixed, none; random ones."""
    key_lists = [
        ["module.encoder.module.weight", "module.encoder.module.bias", "module.classifier.weight"],
        ["encoder.module.weight", "head.weight"],
        ["module.module.weight", "module.module.bias"],
        ["module.module.module.weight"],
        ["submodule.weight", "modules.0.weight", "module_list.0.bias", "modulelayer.weight"],
        ["module.a.weight", "b.weight", "module.c.bias", "d.module.e"],
        ["head.weight", "module.body.weight", "module.body.bias"],  # the first key alone does not tell
        ["layers.0.weight", "layers.0.bias", "moduleX.weight", "xmodule.weight"],
        ["module.submodule.weight", "module.modules.0.weight"],
        [],
        *(random_keys(rng) for _ in range(3)),
    ]
    return [Call((_state(keys, ordered=rng.random() < 0.7),)) for keys in key_lists]


def _tricky_uniform(rng: random.Random) -> list[Call]:
    return [call for call in _tricky_states(rng) if not _mixed(call)]


def _tricky_mixed(rng: random.Random) -> list[Call]:
    return [call for call in _tricky_states(rng) if _mixed(call)]


def _new_dict_visible() -> list[Call]:
    why = "build and return a new dict; the caller's state dict must keep its keys"
    return [
        Call((wrapped(nn.Linear(2, 1)).state_dict(),), why),
        Call((_state(["module.fc.weight", "module.fc.bias"], ordered=False),), why),
        Call((nn.ReLU().state_dict(),), "a new dict even when there is nothing to strip"),
    ]


def _new_dict_extra() -> list[Call]:
    return [Call((small_mlp(0).state_dict(),), "a new dict even when there is nothing to strip")]


def _new_dict_hidden(rng: random.Random) -> list[Call]:
    """Keys whose stripping no plausible mistake gets wrong (one leading prefix, then a name that neither holds
    `module` nor starts with a letter of it), so that this rule's cell judges only the new dict and the argument;
    and a state dict with nothing to strip that is not empty (its one key empty: no prefix, and no way of stripping
    changes it), so that an answer that hands back the argument when no key has the prefix is caught too."""
    names = ["w", "b", "fc", "head", "0", "1", "fc.0", "net.2", "weight", "bias"]
    calls = [Call((wrapped_state(nn.Linear(rng.randint(1, 4), rng.randint(1, 4))),))]
    for ordered in (True, False):
        keys = {PREFIX + rng.choice(names) + rng.choice(["", ".weight", ".bias"]) for _ in range(rng.randint(1, 4))}
        calls.append(Call((_state(sorted(keys), ordered),)))
    return [*calls, Call((OrderedDict(),)), *(Call((_state([""], ordered),)) for ordered in (True, False))]


def same_keys(got: Any, expected: Mapping) -> bool:
    """A dict or ``OrderedDict`` with the expected keys, in any order (the new-dict rule's returned values)."""
    return type(got) in (dict, OrderedDict) and sorted(got) == sorted(expected)


STRIP_MODULE_PREFIX_RULES = (
    Rule(
        STRIPS_THE_PREFIX,
        "leading",
        reference=reference_strip,
        same=same_stripped,
        visible=_leading_visible,
        hidden=_wrapped_states,
    ),
    Rule(
        ONLY_ONCE,
        "only_at_start",
        reference=reference_strip,
        same=same_stripped,
        visible=_only_once_visible,
        extra=_only_once_extra,
        hidden=_tricky_uniform,
    ),
    Rule(
        ANY_ORDER,
        "only_at_start",
        reference=reference_strip,
        same=same_stripped_any_order,
        visible=_any_order_visible,
        hidden=_tricky_mixed,
    ),
    Rule(
        A_NEW_DICT,
        "new_mapping",
        reference=reference_strip,
        same=same_keys,
        visible=_new_dict_visible,
        extra=_new_dict_extra,
        hidden=_new_dict_hidden,
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
    solution="""def strip_module_prefix(state_dict):
    prefix = "module."
    return {
        (key[len(prefix):] if key.startswith(prefix) else key): value
        for key, value in state_dict.items()
    }""",
)


# --------------------------------------------------------------------------------------------- save_checkpoint
def _read(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def _observe_contents(make_model: Callable[[], nn.Module], epoch: int) -> Callable[[Callable], dict]:
    def observe(function: Callable) -> dict:
        model = make_model()
        inner = model.module if isinstance(model, nn.DataParallel) else model
        optimizer = trained_optimizer(model)
        with scratch_folder() as folder:
            path = folder / CHECKPOINT_NAME
            function(path, model, optimizer, epoch)
            try:
                saved = _read(path)
            except Exception as error:  # noqa: BLE001 - reported as an observation
                return {"torch.load(path, weights_only=True)": f"failed: {type(error).__name__}"}
        if not isinstance(saved, Mapping):
            return {"saved": type(saved).__name__}
        state = saved.get("model")
        return {
            "entries": sorted(set(saved) & {"model", "optimizer", "epoch"}),
            "epoch": saved.get("epoch"),
            "model keys": list(state) if isinstance(state, Mapping) else type(state).__name__,
            "weights equal": isinstance(state, Mapping) and plain(state) == weights(inner),
            "optimizer state equal": plain(saved.get("optimizer")) == plain(optimizer.state_dict()),
        }

    return observe


def _expected_contents(make_model: Callable[[], nn.Module], epoch: int) -> dict:
    model = make_model()
    inner = model.module if isinstance(model, nn.DataParallel) else model
    return {
        "entries": ["epoch", "model", "optimizer"],
        "epoch": epoch,
        "model keys": list(inner.state_dict()),
        "weights equal": True,
        "optimizer state equal": True,
    }


def _unpicklable_group(optimizer: torch.optim.Optimizer) -> None:
    """Make the optimizer's state dict impossible to pickle (a lambda in its param group): the save fails midway."""
    optimizer.param_groups[0]["schedule"] = lambda step: 0.5**step


def _observe_failed_save(function: Callable) -> dict:
    model = small_mlp(3)
    optimizer = trained_optimizer(model)
    with scratch_folder() as folder:
        path = folder / CHECKPOINT_NAME
        function(path, model, optimizer, 1)
        before = path.read_bytes()
        _unpicklable_group(optimizer)
        try:
            function(path, model, optimizer, 2)
        except Exception:  # noqa: BLE001 - the error is expected; which one does not matter
            raised = True
        else:
            raised = False
        return {
            "raised an error": raised,
            "previous checkpoint intact": path.is_file() and path.read_bytes() == before,
            "files in the folder": sorted(p.name for p in folder.iterdir()),
        }


def _observe_overwrite(function: Callable) -> dict:
    model = small_mlp(4)
    optimizer = trained_optimizer(model)
    with scratch_folder() as folder:
        path = folder / CHECKPOINT_NAME
        function(path, model, optimizer, 1)
        function(path, model, optimizer, 2)
        return {"epoch in the file": _read(path).get("epoch"), "files in the folder": sorted(os.listdir(folder))}


def _save_cases() -> list[Case]:
    bare = lambda: small_mlp(1)  # noqa: E731
    parallel = lambda: wrapped(small_mlp(2))  # noqa: E731
    return [
        Scenario(
            (),
            _expected_contents(bare, 3),
            "save {'model': state dict, 'optimizer': optimizer.state_dict(), 'epoch': epoch}",
            kind="contents",
            title="on a bare model, epoch 3",
            observe=_observe_contents(bare, 3),
        ),
        Scenario(
            (),
            _expected_contents(parallel, 5),
            "a wrapped model saves its .module's state dict: no `module.` prefix in the file",
            kind="wrapped",
            title="on a DataParallel model, epoch 5",
            observe=_observe_contents(parallel, 5),
        ),
        Scenario(
            (),
            {"raised an error": True, "previous checkpoint intact": True, "files in the folder": [CHECKPOINT_NAME]},
            "write to a temporary file in the same folder, os.replace it onto path, delete it if saving fails, "
            "and let the error reach the caller",
            kind="atomic",
            title="when the save fails midway (an optimizer setting that cannot be pickled)",
            observe=_observe_failed_save,
        ),
        Scenario(
            (),
            {"epoch in the file": 2, "files in the folder": [CHECKPOINT_NAME]},
            "saving twice replaces the file and leaves no temporary file behind",
            kind="atomic",
            title="twice to the same path",
            observe=_observe_overwrite,
        ),
    ]


SAVE_CHECKPOINT = Exercise(
    name="save_checkpoint",
    visible_cases=_save_cases,
    hints=[
        Hint(
            lambda case, got: (
                isinstance(got, dict) and any(str(key).startswith(PREFIX) for key in got.get("model keys", []))
            ),
            "The wrapper's state dict has the `module.` prefix (see 'Where the prefix comes from'). Save the state "
            "dict of the model inside the wrapper, for DataParallel and DDP alike; and tell a wrapper by its type, "
            "since a plain model may have an attribute called module.",
        ),
        Hint(
            lambda case, got: isinstance(got, dict) and any("failed" in str(v) for v in got.values()),
            "Save only state dicts and plain values, not the model or optimizer objects: loading with "
            "weights_only=True refuses other objects.",
        ),
        Hint(
            lambda case, got: isinstance(got, dict) and got.get("raised an error") is False,
            "The error disappeared: the caller must learn that the checkpoint was not saved. Clean up, then let the "
            "error through.",
        ),
        Hint(
            lambda case, got: isinstance(got, dict) and got.get("previous checkpoint intact") is False,
            "torch.save empties the file before it writes: a failure destroys the last good checkpoint, as 'A failed "
            "save destroys the last good checkpoint' showed. Write elsewhere first, then put the finished file in "
            "place atomically.",
        ),
        Hint(
            lambda case, got: isinstance(got, dict) and len(got.get("files in the folder", [])) > 1,
            "A temporary file was left behind: a failed save must clean up after itself, whatever went wrong.",
        ),
    ],
    general_hint=(
        "Two ideas from the lesson: save the unwrapped model's state dict ('The clean habit'), and save atomically "
        "('Saving safely'): a temporary file in the same folder, renamed onto path only when complete; on failure, no "
        "trace and the error reaches the caller."
    ),
    solution="""import os
import tempfile
from pathlib import Path


def save_checkpoint(path, model, optimizer, epoch):
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    bare = model.module if isinstance(model, wrappers) else model
    checkpoint = {"model": bare.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(descriptor)
    try:
        torch.save(checkpoint, temporary)
        os.replace(temporary, path)
    except BaseException:
        os.remove(temporary)
        raise""",
)


# --------------------------------------------------------------------------------------------- load_checkpoint
def _observe_load(
    make_source: Callable[[], nn.Module], make_target: Callable[[], nn.Module], save_wrapped_keys: bool
) -> Callable[[Callable], dict]:
    def observe(function: Callable) -> dict:
        source = make_source()
        state = (source if save_wrapped_keys else _bare(source)).state_dict()
        target = make_target()
        with scratch_folder() as folder:
            path = folder / CHECKPOINT_NAME
            torch.save({"model": state, "optimizer": {}, "epoch": 7}, path)
            returned = function(path, target)
        return {"returned": returned, "weights equal": weights(_bare(target)) == weights(_bare(source))}

    return observe


def _bare(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.DataParallel) else model


def _observe_optimizer(function: Callable) -> dict:
    source = small_mlp(5)
    optimizer = trained_optimizer(source)
    target = small_mlp(6)
    fresh_optimizer = torch.optim.Adam(target.parameters(), lr=0.01)
    with scratch_folder() as folder:
        path = folder / CHECKPOINT_NAME
        torch.save({"model": source.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 2}, path)
        returned = function(path, target, fresh_optimizer)
    return {
        "returned": returned,
        "weights equal": weights(target) == weights(source),
        "optimizer state equal": plain(fresh_optimizer.state_dict()) == plain(optimizer.state_dict()),
    }


def _observe_gpu_file(function: Callable) -> dict:
    source = small_mlp(8)
    target = small_mlp(9)
    with scratch_folder() as folder:
        path = folder / CHECKPOINT_NAME
        save_as_if_on_gpu({"model": source.state_dict(), "optimizer": {}, "epoch": 4}, path)
        returned = function(path, target)
    return {"returned": returned, "weights equal": weights(target) == weights(source)}


class _RunsCode:
    """Unpickling this creates a folder: proof that loading ran code from the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _observe_untrusted(function: Callable) -> dict:
    source = small_mlp(10)
    target = small_mlp(11)
    with scratch_folder() as folder:
        clean, untrusted = folder / "clean.pt", folder / CHECKPOINT_NAME
        marker = folder / "code-ran-here"
        torch.save({"model": source.state_dict(), "optimizer": {}, "epoch": 3}, clean)
        torch.save({"model": source.state_dict(), "optimizer": {}, "epoch": _RunsCode(marker)}, untrusted)
        returned = function(clean, target)
        try:
            function(untrusted, target)
        except Exception:  # noqa: BLE001 - refusing is the expected outcome
            refused = True
        else:
            refused = False
        return {"clean checkpoint returned": returned, "refused to load": refused, "code ran": marker.exists()}


def _load_cases() -> list[Case]:
    bare_source = lambda: small_mlp(12)  # noqa: E731
    bare_target = lambda: small_mlp(13)  # noqa: E731
    wrapped_source = lambda: wrapped(small_mlp(14))  # noqa: E731
    wrapped_target = lambda: wrapped(small_mlp(15))  # noqa: E731
    loaded = {"returned": 7, "weights equal": True}
    return [
        Scenario(
            (),
            loaded,
            "a clean checkpoint loads into a bare model; return the epoch",
            kind="models",
            title="(clean checkpoint) into a bare model",
            observe=_observe_load(bare_source, bare_target, False),
        ),
        Scenario(
            (),
            loaded,
            "load into model.module when the model is wrapped",
            kind="models",
            title="(clean checkpoint) into a DataParallel model",
            observe=_observe_load(bare_source, wrapped_target, False),
        ),
        Scenario(
            (),
            loaded,
            "an old checkpoint saved with model.state_dict() of a wrapped model has `module.` keys: strip them",
            kind="models",
            title="(old prefixed checkpoint) into a bare model",
            observe=_observe_load(wrapped_source, bare_target, True),
        ),
        Scenario(
            (),
            {"returned": 2, "weights equal": True, "optimizer state equal": True},
            "restore the optimizer with optimizer.load_state_dict when one is given",
            kind="resume",
            title="with an optimizer",
            observe=_observe_optimizer,
        ),
        Scenario(
            (),
            {"returned": 4, "weights equal": True},
            "map_location defaults to the device of the model's parameters, so a checkpoint from a GPU this "
            "machine does not have still loads",
            kind="resume",
            title=f"(a checkpoint saved on cuda:{torch.cuda.device_count()}) into a model on this machine",
            observe=_observe_gpu_file,
        ),
        Scenario(
            (),
            {"clean checkpoint returned": 3, "refused to load": True, "code ran": False},
            "torch.load(..., weights_only=True) refuses anything but tensors and plain data",
            kind="safety",
            title="on a clean checkpoint, then on one that carries code",
            observe=_observe_untrusted,
        ),
    ]


LOAD_CHECKPOINT = Exercise(
    name="load_checkpoint",
    visible_cases=_load_cases,
    hints=[
        Hint(
            lambda case, got: isinstance(got, dict) and got.get("code ran") is True,
            "Loading must refuse code (weights_only=True, see 'A checkpoint is a pickle'), and must not fall back to "
            "unsafe loading when that fails: the error is the protection.",
        ),
        Hint(
            lambda case, got: "CUDA" in str(got) or "cuda" in str(got),
            "The tensors came back on the device they were saved from. Without a map_location given, they belong on "
            "the device of the model's parameters ('Loading on another device').",
        ),
        Hint(
            lambda case, got: "Missing key" in str(got) or "Unexpected key" in str(got),
            "The keys did not match: load into the model inside a wrapper, and remove a leading `module.` from the "
            "checkpoint's keys (exercise 1).",
        ),
        Hint(
            lambda case, got: isinstance(got, dict) and got.get("optimizer state equal") is False,
            "When an optimizer is given, restore its state too: 'A training checkpoint, and resuming' showed what a "
            "fresh optimizer costs.",
        ),
        Hint(
            lambda case, got: isinstance(got, dict) and got.get("returned") != case.expected.get("returned"),
            "Return the epoch stored in the checkpoint.",
        ),
    ],
    general_hint=(
        "The reverse of save_checkpoint: load safely onto the model's device, into the bare model whatever the keys' "
        "prefix, restore the optimizer when given, and give back the epoch."
    ),
    solution="""def load_checkpoint(path, model, optimizer=None, map_location=None):
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    bare = model.module if isinstance(model, wrappers) else model
    if map_location is None:
        map_location = next(bare.parameters()).device
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    bare.load_state_dict(strip_module_prefix(checkpoint["model"]))
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]""",
)

EXERCISES = [STRIP_MODULE_PREFIX, SAVE_CHECKPOINT, LOAD_CHECKPOINT]

# The texts above in Japanese, for the Japanese edition (gpulab.messages.text looks them up by their English).
TRANSLATIONS: dict[str, dict[str, str]] = {
    "ja": {
        # The rules of strip_module_prefix: the lesson's sentences, as its Japanese edition words them.
        STRIPS_THE_PREFIX: "`module.`で始まるキーからそのプレフィックスを取り除きます",
        ONLY_ONCE: "取り除く先頭の`module.`は1つだけです。それ以外のキーとすべての値はそのまま、同じ順番に保ちます",
        ANY_ORDER: "一部のキーだけが`module.`で始まる場合、キーの順番は問いません",
        A_NEW_DICT: "引数ではなく新しい辞書（または`OrderedDict`）を返し、引数は変更しません",
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
            "{'model': state dict, 'optimizer': optimizer.state_dict(), 'epoch': epoch}を保存します"
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
