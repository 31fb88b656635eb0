"""Lesson 04 (saving checkpoints): graded the way an instructor grades it, with reference, blank, correct-but-different
and wrong submissions (each wrong submission must lose exactly the points of the cells it gets wrong), plus the
self-checks of ``gpulab.exercises.checkpoints`` and the torch behaviour the lesson and its hidden tests rely on.

Every checkpoint is written under a temporary folder that is removed afterwards; nothing is written into the
repository.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.lesson_grading import GradedLesson
from tests.nbgrader_tools import REPO

LESSON = "04_checkpoints"

CORRECT_BUT_DIFFERENT = {
    "removeprefix_namedtemporaryfile": {
        "strip_module_prefix_answer": """
def strip_module_prefix(state_dict):
    return {key.removeprefix("module."): value for key, value in state_dict.items()}
""",
        "save_checkpoint_answer": """
import os
import tempfile


def save_checkpoint(path, model, optimizer, epoch):
    wrapped = isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel))
    net = model.module if wrapped else model
    payload = {"epoch": epoch, "model": net.state_dict(), "optimizer": optimizer.state_dict()}
    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile(dir=directory, delete=False, suffix=".partial") as handle:
        temporary = handle.name
    try:
        torch.save(payload, temporary)
    except Exception:
        os.unlink(temporary)
        raise
    os.replace(temporary, path)
""",
        "load_checkpoint_answer": """
def load_checkpoint(path, model, optimizer=None, map_location=None):
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    target = model.module if isinstance(model, wrappers) else model
    if map_location is None:
        map_location = next(iter(target.parameters())).device
    data = torch.load(path, map_location=map_location, weights_only=True)
    target.load_state_dict(strip_module_prefix(data["model"]))
    if optimizer is not None:
        optimizer.load_state_dict(data["optimizer"])
    return data["epoch"]
""",
        "quiz_answers": """quiz_answers = {"q1": " 'module.head.weight' ", "q2": "C", "q3": " a", "q4": "B "}""",
    },
    "consume_prefix_copy_uuid_finally": {
        "strip_module_prefix_answer": """
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present


def strip_module_prefix(state_dict):
    result = OrderedDict(state_dict)
    consume_prefix_in_state_dict_if_present(result, "module.")
    return result
""",
        "save_checkpoint_answer": """
import os
import uuid

from torch.nn.parallel import DistributedDataParallel


def save_checkpoint(path, model, optimizer, epoch):
    if isinstance(model, (torch.nn.DataParallel, DistributedDataParallel)):
        model = model.module
    path = str(path)
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
""",
        "load_checkpoint_answer": """
def load_checkpoint(path, model, optimizer=None, map_location=None):
    device = map_location if map_location is not None else next(model.parameters()).device
    checkpoint = torch.load(path, map_location=device, weights_only=True)
    inner = getattr(model, "module", model)
    state = checkpoint["model"]
    if any(k.startswith("module.") for k in state) and not any(k.startswith("module.") for k in inner.state_dict()):
        state = strip_module_prefix(state)
    inner.load_state_dict(state)
    if optimizer:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return int(checkpoint["epoch"])
""",
        "quiz_answers": """quiz_answers = {"q1": "module.head.weight", "q2": "c", "q3": "A", "q4": "b"}""",
    },
}

# Each wrong submission: the answers it replaces, and the graded cells it must lose (all others: full marks).
WRONG = {
    "replace_direct_save_unsafe_load": (
        {
            "strip_module_prefix_answer": """
def strip_module_prefix(state_dict):
    return {key.replace("module.", ""): value for key, value in state_dict.items()}
""",
            "save_checkpoint_answer": """
def save_checkpoint(path, model, optimizer, epoch):
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    net = model.module if isinstance(model, wrappers) else model
    torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)
""",
            "load_checkpoint_answer": """
def load_checkpoint(path, model, optimizer=None, map_location=None):
    checkpoint = torch.load(path, map_location=map_location, weights_only=False)
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    net = model.module if isinstance(model, wrappers) else model
    net.load_state_dict(strip_module_prefix(checkpoint["model"]))
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]
""",
            "quiz_answers": 'quiz_answers = {"q1": "head.weight", "q2": "c", "q3": "a", "q4": "b"}',
        },
        {
            "strip_module_prefix_only_at_start",
            "save_checkpoint_atomic",
            "load_checkpoint_resume",
            "load_checkpoint_refuses_code",
            "quiz_q1",
        },
    ),
    "in_place_strip_no_unwrap_stray_tmp_no_optimizer": (
        {
            "strip_module_prefix_answer": """
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present


def strip_module_prefix(state_dict):
    consume_prefix_in_state_dict_if_present(state_dict, "module.")
    return state_dict
""",
            "save_checkpoint_answer": """
import os


def save_checkpoint(path, model, optimizer, epoch):
    temporary = str(path) + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, temporary)
    os.replace(temporary, path)
""",
            "load_checkpoint_answer": """
def load_checkpoint(path, model, optimizer=None, map_location=None):
    if map_location is None:
        map_location = next(model.parameters()).device
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    return checkpoint["epoch"]
""",
            "quiz_answers": 'quiz_answers = {"q1": "module.head.weight", "q2": "a", "q3": "a", "q4": "b"}',
        },
        {
            "strip_module_prefix_new_mapping",
            "save_checkpoint_unwraps",
            "save_checkpoint_atomic",
            "load_checkpoint_models",
            "load_checkpoint_resume",
            "quiz_q2",
        },
    ),
    "strips_twice_misses_ddp_falls_back_to_pickle": (
        {
            "strip_module_prefix_answer": """
def strip_module_prefix(state_dict):
    out = {}
    for key, value in state_dict.items():
        while key.startswith("module."):
            key = key[len("module."):]
        out[key] = value
    return out
""",
            "save_checkpoint_answer": """
import os
import tempfile


def save_checkpoint(path, model, optimizer, epoch):
    net = model.module if isinstance(model, torch.nn.DataParallel) else model
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)))
    os.close(handle)
    try:
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, temporary)
        os.replace(temporary, path)
    except BaseException:
        os.remove(temporary)
        raise
""",
            "load_checkpoint_answer": """
def load_checkpoint(path, model, optimizer=None, map_location=None):
    net = getattr(model, "module", model)
    if map_location is None:
        map_location = next(net.parameters()).device
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception:
        checkpoint = torch.load(path, map_location=map_location, weights_only=False)
    net.load_state_dict(strip_module_prefix(checkpoint["model"]))
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]
""",
            "quiz_answers": 'quiz_answers = {"q1": "module.head.weight", "q2": "c", "q3": "b", "q4": "b"}',
        },
        {"strip_module_prefix_only_at_start", "save_checkpoint_unwraps", "load_checkpoint_refuses_code", "quiz_q3"},
    ),
    "lstrip_swallowed_error_strict_false": (
        {
            "strip_module_prefix_answer": """
def strip_module_prefix(state_dict):
    return {key.lstrip("module."): value for key, value in state_dict.items()}
""",
            "save_checkpoint_answer": """
import os


def save_checkpoint(path, model, optimizer, epoch):
    net = getattr(model, "module", model)
    temporary = str(path) + ".tmp"
    try:
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, temporary)
        os.replace(temporary, path)
    except Exception as error:
        print("could not save the checkpoint:", error)
        os.remove(temporary)
""",
            "load_checkpoint_answer": """
def load_checkpoint(path, model, optimizer=None, map_location=None):
    net = getattr(model, "module", model)
    checkpoint = torch.load(path, map_location=map_location or next(net.parameters()).device, weights_only=True)
    net.load_state_dict(checkpoint["model"], strict=False)
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]
""",
            "quiz_answers": 'quiz_answers = {"q1": "module.head.weight", "q2": "c", "q3": "a", "q4": "a"}',
        },
        {
            "strip_module_prefix_leading",
            "strip_module_prefix_only_at_start",
            "save_checkpoint_atomic",
            "save_checkpoint_unwraps",  # getattr(model, "module", model): a plain model's submodule `module` alone
            "load_checkpoint_models",
            "quiz_q4",
        },
    ),
}


# --------------------------------------------------------------------------------------------- autograding
class TestGrading(GradedLesson):
    LESSON = LESSON
    MIN_GRADED_CELLS = 13
    CORRECT = CORRECT_BUT_DIFFERENT
    WRONG = WRONG


# --------------------------------------------------------------------------------------------- self-checks
def _functions(answers: dict[str, str]) -> dict:
    """Run a submission's answer cells, as the notebook would, and return its namespace."""
    namespace = {"torch": torch, "nn": nn, "OrderedDict": OrderedDict, "Path": Path, "os": os, "tempfile": tempfile}
    for grade_id in ("strip_module_prefix_answer", "save_checkpoint_answer", "load_checkpoint_answer"):
        if grade_id in answers:
            exec(answers[grade_id], namespace)
    return namespace


@pytest.fixture
def no_new_temporary_folders():
    """The self-checks write their checkpoints in temporary folders and remove them."""
    before = set(os.listdir(tempfile.gettempdir()))
    yield
    left = {name for name in set(os.listdir(tempfile.gettempdir())) - before if name.startswith("gpulab-check-")}
    assert not left, f"self-check folders left behind: {left}"


@pytest.mark.parametrize("source", sorted(CORRECT_BUT_DIFFERENT))  # gpulab's solutions: tests/test_check.py
def test_self_checks_pass_correct_answers(source, no_new_temporary_folders):
    import gpulab

    namespace = _functions(CORRECT_BUT_DIFFERENT[source])
    for name in ("strip_module_prefix", "save_checkpoint", "load_checkpoint"):
        result = gpulab.check.run(name, namespace[name])
        assert result.passed, str(result)


@pytest.mark.parametrize(
    ("submission", "name", "hint_words"),
    [
        ("replace_direct_save_unsafe_load", "strip_module_prefix", "str.replace"),
        ("replace_direct_save_unsafe_load", "save_checkpoint", "empties the file"),
        ("replace_direct_save_unsafe_load", "load_checkpoint", "map_location"),
        ("in_place_strip_no_unwrap_stray_tmp_no_optimizer", "strip_module_prefix", "caller's state dict"),
        ("in_place_strip_no_unwrap_stray_tmp_no_optimizer", "save_checkpoint", "model inside the wrapper"),
        ("in_place_strip_no_unwrap_stray_tmp_no_optimizer", "load_checkpoint", "remove a leading"),
        ("strips_twice_misses_ddp_falls_back_to_pickle", "strip_module_prefix", "one leading"),
        ("strips_twice_misses_ddp_falls_back_to_pickle", "load_checkpoint", "weights_only=True"),
        ("lstrip_swallowed_error_strict_false", "strip_module_prefix", "lstrip"),
        ("lstrip_swallowed_error_strict_false", "save_checkpoint", "error disappeared"),
    ],
)
def test_self_checks_give_targeted_hints(submission, name, hint_words, no_new_temporary_folders, capsys):
    import gpulab

    result = gpulab.check.run(name, _functions(WRONG[submission][0])[name])
    assert not result.passed
    assert hint_words in result.hint, str(result)


def test_visible_cases_are_split_by_graded_cell():
    import gpulab

    kinds = {
        name: {case.kind for case in gpulab.check.cases(name)}
        for name in ("strip_module_prefix", "save_checkpoint", "load_checkpoint")
    }
    assert kinds == {
        "strip_module_prefix": {"leading", "only_at_start", "new_mapping"},
        "save_checkpoint": {"contents", "unwraps", "atomic"},
        "load_checkpoint": {"models", "resume", "refuses_code"},
    }
    lesson = (REPO / "source" / LESSON / f"{LESSON}.py").read_text(encoding="utf-8")
    for name, names in kinds.items():
        for kind in names:
            assert f'gpulab.check.cases("{name}", kind="{kind}")' in lesson


# ------------------------------------------------------------------------------------- torch behaviour relied on
def test_a_gpu_tagged_checkpoint_needs_map_location(tmp_path):
    """load_checkpoint's rules make "a checkpoint from a GPU this machine lacks" by patching
    torch.serialization.location_tag for one torch.save; this fails loudly if torch stops asking it."""
    from gpulab.exercises.checkpoints import MISSING_GPU, gpu_tagged_bytes

    model = nn.Linear(3, 2)
    path = tmp_path / "from_gpu.pt"
    path.write_bytes(gpu_tagged_bytes(model.state_dict()))
    assert int(MISSING_GPU.split(":")[1]) >= torch.cuda.device_count()
    with pytest.raises(RuntimeError, match="CUDA device|out of range"):
        torch.load(path, weights_only=True)
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert state["weight"].tolist() == model.weight.tolist()
    assert torch.serialization.location_tag(torch.zeros(1).untyped_storage()) == "cpu"  # the patch was undone


def test_a_failed_torch_save_destroys_the_previous_file(tmp_path):
    """What the lesson shows and save_checkpoint's atomic cell grades: torch.save truncates before it writes."""
    path = tmp_path / "checkpoint.pt"
    torch.save({"epoch": 1}, path)
    with pytest.raises(Exception):  # noqa: B017 - pickle's error type differs between versions
        torch.save({"epoch": 2, "schedule": lambda step: step}, path)
    with pytest.raises(RuntimeError):
        torch.load(path, weights_only=True)


def test_weights_only_refuses_code(tmp_path):
    marker = tmp_path / "ran"

    class MakesFolder:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    path = tmp_path / "untrusted.pt"
    torch.save({"epoch": MakesFolder()}, path)
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(path, weights_only=True)
    assert not marker.exists()


def test_ddp_helper_saves_once_from_rank_0(tmp_path):
    """The lesson's DDP function, launched for real on two ranks (gloo on CPUs), from a copy outside the repo."""
    import shutil
    import sys

    import gpulab

    modules, checkpoints = tmp_path / "modules", tmp_path / "checkpoints"
    modules.mkdir()
    checkpoints.mkdir()
    shutil.copy(REPO / "source" / LESSON / "ddp_checkpoint.py", modules)
    sys.path.insert(0, str(modules))
    try:
        import ddp_checkpoint

        results = gpulab.ddp.launch(ddp_checkpoint.train_and_checkpoint, 2, str(checkpoints), output="none")
    finally:
        sys.path.remove(str(modules))
        sys.modules.pop("ddp_checkpoint", None)
    assert [r["rank"] for r in results] == [0, 1]
    for result in results:
        assert result["DDP keys"][0].startswith("module.") and not result["saved keys"][0].startswith("module.")
        assert result["loaded weights equal this rank's"]
        assert result["files"] == ["checkpoint.pt"]
