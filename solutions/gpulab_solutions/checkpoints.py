"""The references, hidden inputs and solutions of ``gpulab.exercises.checkpoints``'s exercises."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping

import torch
from gpulab.check import Call
from gpulab.exercises.checkpoints import (
    ADAM,
    CHECKPOINT_NAME,
    ENTRIES,
    FAST_ADAM,
    HOLDER,
    LINEAR_2_1,
    LINEAR_3_2,
    LINEAR_4_3,
    LOAD_CHECKPOINT_RULES,
    MISSING_GPU,
    NOTES,
    PREFIX,
    SAVE_CHECKPOINT_RULES,
    SEQ_BN,
    SEQ_RELU,
    SEQ_TANH,
    SGD,
    SGD_MOMENTUM,
    STRIP_MODULE_PREFIX_RULES,
    TEMPORARY,
    _state,
    entries,
    random_keys,
    source,
    target,
    trained,
    wrapped_state,
)
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from gpulab_solutions import Answers, for_rules


def reference_strip(state_dict: Mapping) -> OrderedDict:
    """What ``consume_prefix_in_state_dict_if_present(..., "module.")`` makes of each key, in the input's order."""
    stripped = OrderedDict()
    for key, value in state_dict.items():
        single = OrderedDict([(key, value)])
        consume_prefix_in_state_dict_if_present(single, PREFIX)
        stripped[next(iter(single))] = value
    return stripped


def _mixed(call: Call) -> bool:
    """Some keys of the call's state dict carry the prefix and some do not."""
    return len({key.startswith(PREFIX) for key in call.args[0]}) > 1


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


def expected_saved(layers, seed, optimizer, epoch, wrap="bare", as_path=False) -> dict:
    """The save rules' reference: the bare model's state dict and the optimizer's, trained as ``saved_by`` trains."""
    model, made = trained(layers, seed, optimizer, steps=2)
    return {
        "entries": sorted(ENTRIES),
        "epoch": epoch,
        "model": entries(model.state_dict()),
        "optimizer": made.state_dict(),
    }


def _contents_hidden(rng: random.Random) -> list[Call]:
    return [
        Call((SEQ_BN, 1, SGD_MOMENTUM, 17)),
        Call((SEQ_BN, 2, ADAM, 0, "primary")),
        Call((SEQ_BN, rng.randrange(3, 10**6), ADAM, rng.randrange(1, 10**6), "bare", True)),
        Call((LINEAR_2_1, rng.randrange(10**6), SGD, 7, "primary", True)),
    ]


def _unwraps_hidden(rng: random.Random) -> list[Call]:
    wraps = ["nn.DataParallel", "gpulab.DataParallel", "bare", "DistributedDataParallel"]
    calls = [Call((SEQ_TANH, seed, SGD_MOMENTUM, 3, wrap)) for seed, wrap in enumerate(wraps, start=1)]
    holder = Call((HOLDER, rng.randrange(10**6), SGD_MOMENTUM, 2, "bare"))  # no wrapper, a submodule called module
    return [*calls, holder, Call((SEQ_BN, rng.randrange(10**6), ADAM, 2, rng.choice(wraps)))]


def expected_turns(saves, as_path=False) -> dict:
    """The atomic-save rule's reference: only the failing saves raise; the folder holds the learner's notes and the
    last good save's checkpoint (none before one)."""
    good = [epoch for epoch, failure in saves if failure is None]
    checkpoint = "no file at path"
    if good:
        checkpoint = [good[-1], entries(trained(LINEAR_4_3, good[-1], SGD_MOMENTUM, steps=1)[0].state_dict())]
    return {
        "raised": [failure is not None for _, failure in saves],
        "files": sorted([NOTES, TEMPORARY, *([CHECKPOINT_NAME] if good else [])]),
        "temporary files": [],
        "checkpoint": checkpoint,
    }


def _atomic_hidden(rng: random.Random) -> list[Call]:
    first, second = rng.sample(range(3, 1000), 2)
    return [
        Call(([[1, None], [2, None], [3, "disk full"], [4, "unpicklable"]],)),
        Call(([[0, "disk full"]], True)),
        Call(([[first, None], [second, rng.choice(["disk full", "unpicklable"])]], rng.random() < 0.5)),
    ]


def expected_loaded(source: dict, target: dict) -> dict:
    """The load rules' reference: a file with code refused and its code never run; otherwise the source's epoch,
    and the model (and optimizer) as ``source["steps"] + target["train"]`` uninterrupted steps leave them, on the
    target's device."""
    if source["payload"]:
        return {"code ran": False, "refused": True}
    model, made = trained(source["layers"], source["seed"], source["optimizer"], source["steps"] + target["train"])
    expected = {"code ran": False, "returned": source["epoch"], "state": entries(model.state_dict())}
    if target["place"] in ("cpu", "cuda"):
        expected["devices"] = [target["place"]]
    if target["optimizer"] is not None and source["optimizer"] is not None:
        expected["optimizer"] = made.state_dict()
    return expected


def _models_hidden(rng: random.Random) -> list[Call]:
    places = ["bare", "nn.DataParallel", "gpulab.DataParallel", "DistributedDataParallel"]
    calls = [
        Call((source(SEQ_BN, 10, 11 + prefixed, SGD_MOMENTUM, 2, prefixed), target(SEQ_BN, 20 + index, place)))
        for prefixed in (False, True)
        for index, place in enumerate(places)
    ]
    drawn = source(LINEAR_2_1, rng.randrange(10**6), rng.randrange(10**6), prefixed=rng.random() < 0.5)
    return [*calls, Call((drawn, target(LINEAR_2_1, rng.randrange(10**6), rng.choice(places))))]


def _resume_hidden(rng: random.Random) -> list[Call]:
    """Four steps, load_checkpoint, four more: as eight uninterrupted steps (bare, and in nn.DataParallel: on two GPUs
    where there are two); a drawn resume; without an optimizer, the model alone."""
    half = source(SEQ_RELU, 0, 4, FAST_ADAM, 4)
    drawn = source(SEQ_RELU, rng.randrange(10**6), 3, FAST_ADAM, 3)
    return [
        Call((half, target(SEQ_RELU, 99, "cpu", FAST_ADAM, train=4, as_path=False))),
        Call((half, target(SEQ_RELU, 98, "nn.DataParallel", FAST_ADAM, train=4))),
        Call((drawn, target(SEQ_RELU, 97, "primary", FAST_ADAM, train=rng.randint(1, 4)))),
        Call((half, target(SEQ_RELU, 96, "cpu"))),
    ]


def _device_hidden(rng: random.Random) -> list[Call]:
    """A GPU-tagged file with its optimizer, and an explicit ``map_location``; on a grader with a GPU, a CPU file into
    a model on the GPU."""
    tagged = source(SEQ_RELU, 7, 2, FAST_ADAM, 2, tag=MISSING_GPU)
    calls = [
        Call((tagged, target(SEQ_RELU, 8, "cpu", FAST_ADAM))),
        Call((source(SEQ_RELU, rng.randrange(10**6), 5), target(SEQ_RELU, 6, "cpu", map_location="cpu"))),
    ]
    if torch.cuda.is_available():
        calls.append(Call((source(SEQ_RELU, 7, 1), target(SEQ_RELU, 9, "cuda"))))
    return calls


def _refusal_hidden(rng: random.Random) -> list[Call]:
    seed = rng.randrange(10**6)
    payloads = [Call((source(LINEAR_3_2, seed, 1, payload=where), target(LINEAR_3_2, 2))) for where in ("model", "top")]
    return [*payloads, Call((source(LINEAR_3_2, seed, 6), target(LINEAR_3_2, 1, "cpu")))]


ANSWERS = {
    "strip_module_prefix": for_rules(
        STRIP_MODULE_PREFIX_RULES,
        Answers(reference=reference_strip, hidden=_wrapped_states),
        Answers(reference=reference_strip, hidden=_tricky_uniform),
        Answers(reference=reference_strip, hidden=_tricky_mixed),
        Answers(reference=reference_strip, hidden=_new_dict_hidden),
    ),
    "save_checkpoint": for_rules(
        SAVE_CHECKPOINT_RULES,
        Answers(reference=expected_saved, hidden=_contents_hidden),
        Answers(reference=expected_saved, hidden=_unwraps_hidden),
        Answers(reference=expected_turns, hidden=_atomic_hidden),
    ),
    "load_checkpoint": for_rules(
        LOAD_CHECKPOINT_RULES,
        Answers(reference=expected_loaded, hidden=_models_hidden),
        Answers(reference=expected_loaded, hidden=_resume_hidden),
        Answers(reference=expected_loaded, hidden=_device_hidden),
        Answers(reference=expected_loaded, hidden=_refusal_hidden),
    ),
}

SOLUTIONS = {
    "strip_module_prefix": """def strip_module_prefix(state_dict):
    prefix = "module."
    return {
        (key[len(prefix):] if key.startswith(prefix) else key): value
        for key, value in state_dict.items()
    }""",
    "save_checkpoint": """def save_checkpoint(path, model, optimizer, epoch):
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    bare = model.module if isinstance(model, wrappers) else model
    checkpoint = {"model": bare.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        torch.save(checkpoint, temporary)
        os.replace(temporary, path)
    except BaseException:
        os.remove(temporary)
        raise""",
    "load_checkpoint": """def load_checkpoint(path, model, optimizer=None, map_location=None):
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    bare = model.module if isinstance(model, wrappers) else model
    if map_location is None:
        map_location = next(bare.parameters()).device
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    bare.load_state_dict(strip_module_prefix(checkpoint["model"]))
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]""",
}
