# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 04 — Saving checkpoints
#
# The advice every DataParallel guide ends with: *a wrapped model's state dict carries a `module.` prefix; save
# `model.module.state_dict()` for a clean checkpoint that loads into an unwrapped model*:
#
# ```python
# torch.save(model.module.state_dict(), "model.pt")
# ```
#
# Forgetting it gives one of PyTorch's most visited errors (*Missing key(s) in state_dict*). Make that error
# happen, fix it, rescue checkpoints saved the wrong way, resume training exactly where it stopped, and save so
# that a crash or a stranger's file can never cost you your work.
#
# **Time**: about 45 minutes to the quiz; the "Going further" sections after it are optional.
#
# **Red cells are expected.** Until you answer an exercise, its cell and the test cells after it stop with an error
# (red). Run All carries on past them to the end of the notebook; they turn green once your answer is right.

# %% [markdown]
# ## Set-up

# %%
import gpulab
import torch

devices = gpulab.devices(2)

# %% [markdown]
# Every file this lesson writes goes into a temporary folder, deleted when the kernel stops.

# %%
import os
import shutil
import tempfile
from pathlib import Path

workdir = tempfile.TemporaryDirectory(prefix="lesson04-")
folder = Path(workdir.name)

# %% [markdown]
# ## Where the prefix comes from
#
# A *state dict* maps each parameter's (and buffer's) name to its tensor:

# %%
from torch import nn

model = gpulab.models.MLP(in_features=4, hidden=8, classes=3).to(devices.primary)
print(list(model.state_dict()))

# %% [markdown]
# **Predict**: DataParallel keeps your model in an attribute. What are the names after wrapping it?

# %%
parallel = gpulab.DataParallel(model, device_ids=devices)
print(list(parallel.state_dict()))
print(gpulab.text(f"parallel.module is model: {parallel.module is model}"))

# %% [markdown]
# The wrapper stores your model as `parallel.module`, so every name gains `module.` in front; the tensors are the
# very same ones:

# %%
same = parallel.state_dict()["module.layers.0.weight"].data_ptr() == model.layers[0].weight.data_ptr()
print(gpulab.text(f"same storage: {same}"))

# %% [markdown]
# `DistributedDataParallel` does the same (see "Under DDP" below).
#
# ## The error everyone meets
# Save the *wrapped* model's state dict, then load it into a plain model, as you would on a laptop for inference:

# %%
torch.save(parallel.state_dict(), folder / "wrapped.pt")
bare = gpulab.models.MLP(in_features=4, hidden=8, classes=3)
try:
    bare.load_state_dict(torch.load(folder / "wrapped.pt", map_location="cpu", weights_only=True))
except RuntimeError as error:
    print(error)

# %% [markdown]
# Every key is *missing* and every key is *unexpected*: the same weights under other names. A tempting "fix" is
# `strict=False`. **Predict** what it loads.

# %%
result = bare.load_state_dict(torch.load(folder / "wrapped.pt", map_location="cpu", weights_only=True), strict=False)
print(result)
print(gpulab.text(f"weights loaded: {torch.equal(bare.layers[0].weight, model.layers[0].weight.cpu())}"))

# %% [markdown]
# Nothing: `strict=False` skips every key that does not match, and the model silently keeps its random weights.
#
# ## The clean habit: save `model.module.state_dict()`

# %%
torch.save(parallel.module.state_dict(), folder / "model.pt")
print(list(torch.load(folder / "model.pt", weights_only=True)))

# %% [markdown]
# That file loads into a plain model, on any machine:

# %%
plain = gpulab.models.MLP(in_features=4, hidden=8, classes=3)
print(plain.load_state_dict(torch.load(folder / "model.pt", map_location="cpu", weights_only=True)))
x = torch.randn(5, 4)
same = torch.allclose(plain(x), parallel(x.to(devices.primary)).cpu(), atol=1e-6)
print(gpulab.text(f"same outputs: {same}"))

# %% [markdown]
# Into a wrapped model it fails, now with the prefix missing on the other side; load into the wrapper's `.module`:

# %%
clean = torch.load(folder / "model.pt", map_location=devices.primary, weights_only=True)
rewrapped = gpulab.DataParallel(
    gpulab.models.MLP(in_features=4, hidden=8, classes=3).to(devices.primary), device_ids=devices
)
try:
    rewrapped.load_state_dict(clean)
except RuntimeError as error:
    print("\n".join(str(error).splitlines()[:2]))
print(rewrapped.module.load_state_dict(clean))

# %% [markdown]
# ## Loading on another device: `map_location`
#
# `torch.save` records the device of every tensor and `torch.load` puts each tensor back there, so a checkpoint
# written on a GPU fails on a machine without that GPU. This machine's GPUs:

# %%
print(gpulab.text(f"CUDA GPUs here: {torch.cuda.device_count()}"))

# %% [markdown]
# Write a file as a machine with one more GPU would (for this one save, `torch.save` is told each tensor lives on
# a GPU this machine does not have), and load it:

# %%
from unittest import mock

missing_gpu = f"cuda:{torch.cuda.device_count()}"
with mock.patch.object(torch.serialization, "location_tag", lambda storage: missing_gpu):
    torch.save(model.state_dict(), folder / "from_gpu.pt")
try:
    torch.load(folder / "from_gpu.pt", weights_only=True)
except RuntimeError as error:
    print(error)

# %% [markdown]
# `map_location` says where the tensors should go instead (a device, a string, or a dict such as
# `{"cuda:0": "cuda:1"}`): the device of the model you load into.

# %%
state = torch.load(folder / "from_gpu.pt", map_location=devices.primary, weights_only=True)
print({name: str(tensor.device) for name, tensor in state.items()})
print(gpulab.models.MLP(in_features=4, hidden=8, classes=3).to(devices.primary).load_state_dict(state))

# %% [markdown]
# ## Rescuing a checkpoint saved with the prefix
#
# Someone saved `parallel.state_dict()` months ago. Only the names need their leading `module.` removed; the obvious
# one-liner is `key.replace("module.", "")`. **Predict** what it does to a model whose own layers are called
# `module`, like this residual block:


# %%
from collections import OrderedDict


class Residual(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return x + self.module(x)


def make_net():
    return nn.Sequential(OrderedDict(block=Residual(nn.Linear(4, 4)), head=nn.Linear(4, 3)))


old_state = gpulab.DataParallel(make_net().to(devices.primary), device_ids=devices).state_dict()
print(list(old_state))

# %%
replaced = {key.replace("module.", ""): value for key, value in old_state.items()}
print(list(replaced))
try:
    make_net().load_state_dict(replaced)
except RuntimeError as error:
    print(error)

# %% [markdown]
# `replace` removed the block's own `module.` too. PyTorch's `consume_prefix_in_state_dict_if_present` does it
# right (it changes the dict in place):

# %%
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

rescued = dict(old_state)
consume_prefix_in_state_dict_if_present(rescued, "module.")
print(list(rescued))
print(make_net().load_state_dict(rescued))

# %% [markdown]
# ### Exercise 1: `strip_module_prefix`
# Write `strip_module_prefix(state_dict)`, doing what PyTorch's function above does, yourself rather than by calling
# `consume_prefix_in_state_dict_if_present`:
#
# - a key that starts with `module.` loses that prefix;
# - only one leading `module.` goes: every other key and every value stays as it is, in the same order;
# - when only some keys start with `module.`, any order of the keys will do (PyTorch's function moves the stripped
#   ones to the end);
# - return a new dict (or `OrderedDict`), not the argument, and leave the argument unmodified.


# %% nbgrader={"grade": false, "grade_id": "strip_module_prefix_answer", "locked": false, "schema_version": 3, "solution": true}
def strip_module_prefix(state_dict):
    ### BEGIN SOLUTION
    prefix = "module."
    return OrderedDict(
        (key[len(prefix) :] if key.startswith(prefix) else key, value) for key, value in state_dict.items()
    )
    ### END SOLUTION


# %% [markdown]
# Check yourself (this grades nothing; it gives a hint when something is off):

# %%
gpulab.check.strip_module_prefix(strip_module_prefix)

# %% nbgrader={"grade": true, "grade_id": "strip_module_prefix_leading", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("strip_module_prefix", kind="leading"):
    case.verify(strip_module_prefix)

# %% nbgrader={"grade": true, "grade_id": "strip_module_prefix_only_at_start", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("strip_module_prefix", kind="only_at_start"):
    case.verify(strip_module_prefix)

# %% nbgrader={"grade": true, "grade_id": "strip_module_prefix_new_mapping", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("strip_module_prefix", kind="new_mapping"):
    case.verify(strip_module_prefix)

# %% [markdown]
# ## A training checkpoint, and resuming
#
# To continue a run you need more than the weights: the **optimizer's state** (Adam keeps running averages of
# every gradient) and **where you were** (the epoch or step). Eight batches, a model and an optimizer:

# %%
inputs, labels = gpulab.data.classification(samples=256, features=4, classes=3)
batches = gpulab.data.batches(inputs, labels, batch_size=32)
print(gpulab.text(f"{len(batches)} batches"))


def new_run(seed):
    torch.manual_seed(seed)
    model = gpulab.models.MLP(in_features=4, hidden=16, classes=3).to(devices.primary)
    parallel = gpulab.DataParallel(model, device_ids=devices)
    return parallel, torch.optim.Adam(parallel.parameters(), lr=0.05)


def train(parallel, optimizer, steps):
    for step in steps:
        x, y = (t.to(devices.primary) for t in batches[step])
        optimizer.zero_grad()
        nn.functional.cross_entropy(parallel(x), y).backward()
        optimizer.step()


# %% [markdown]
# First, eight steps without interruption:

# %%
wrapped, optimizer = new_run(seed=0)
train(wrapped, optimizer, range(8))
eight_steps = [p.detach().clone() for p in wrapped.module.parameters()]

# %% [markdown]
# Now four steps, a checkpoint, and the job is killed:

# %%
wrapped, optimizer = new_run(seed=0)
train(wrapped, optimizer, range(4))
checkpoint = {"model": wrapped.module.state_dict(), "optimizer": optimizer.state_dict(), "step": 4}
torch.save(checkpoint, folder / "checkpoint.pt")

# %% [markdown]
# A new job starts from other random weights (seed 123), loads the checkpoint and runs the remaining steps:

# %%
wrapped, optimizer = new_run(seed=123)
checkpoint = torch.load(folder / "checkpoint.pt", map_location=devices.primary, weights_only=True)
wrapped.module.load_state_dict(checkpoint["model"])
optimizer.load_state_dict(checkpoint["optimizer"])
train(wrapped, optimizer, range(checkpoint["step"], 8))

# %% [markdown]
# Compare with the uninterrupted run:


# %%
def max_difference(parameters, reference):
    return max((p.detach() - r).abs().max().item() for p, r in zip(parameters, reference))


difference = max_difference(wrapped.module.parameters(), eight_steps)
print(gpulab.text(f"4 + 4 resumed steps vs 8 steps, largest difference: {difference}"))

# %% [markdown]
# The same weights: resuming lost nothing.
#
# **Predict**: what if the new job restores the model but not the optimizer?

# %%
restarted, new_optimizer = new_run(seed=123)
restarted.module.load_state_dict(checkpoint["model"])
train(restarted, new_optimizer, range(4, 8))
difference = max_difference(restarted.module.parameters(), eight_steps)
print(gpulab.text(f"without the optimizer's state, largest difference: {difference}"))

# %% [markdown]
# A fresh Adam starts its running averages from zero, so the run takes different steps.
#
# ## Saving safely
# ### A failed save destroys the last good checkpoint
#
# `torch.save(obj, path)` first empties `path`, then writes. If anything goes wrong in between (the job is killed,
# the disk fills up, something cannot be saved), the last good checkpoint is gone. Try it with a lambda, which
# cannot be pickled:


# %%
def loads(path):
    try:
        torch.load(path, map_location="cpu", weights_only=True)
        return True
    except Exception:
        return False


path = folder / "checkpoint-copy.pt"
shutil.copyfile(folder / "checkpoint.pt", path)  # break a copy: the cells above still load the checkpoint
print(gpulab.text(f"before: {path.stat().st_size} bytes; loads: {loads(path)}"))
try:
    torch.save({"model": model.state_dict(), "schedule": lambda step: 0.5**step}, path)
except Exception as error:
    print(type(error).__name__, error)
print(gpulab.text(f"after: {path.stat().st_size} bytes; loads: {loads(path)}"))

# %% [markdown]
# The four good steps are lost. The cure is an *atomic* save: write a temporary file in the same folder, then
# rename it onto `path` (`os.replace`). A rename within one file system is atomic, so `path` always holds the old
# checkpoint or the new one, never half of one.
#
# ### A checkpoint is a pickle
#
# `torch.load` unpickles the file, and a pickle may call any function while it is loaded:


# %%
class Surprise:
    def __reduce__(self):
        return (print, (gpulab.text("this line was printed by torch.load: it could have been any code"),))


torch.save({"epoch": Surprise()}, folder / "untrusted.pt")
_ = torch.load(folder / "untrusted.pt", weights_only=False)

# %% [markdown]
# With `weights_only=True`, `torch.load` accepts only tensors and plain containers and numbers, and refuses the rest:

# %%
import pickle

try:
    torch.load(folder / "untrusted.pt", weights_only=True)
except pickle.UnpicklingError as error:
    print(next(line.strip() for line in str(error).splitlines() if "Unsupported global" in line))

# %% [markdown]
# `weights_only=True` is the default since PyTorch 2.6; write it anyway, so the code says what it relies on. Never
# "fix" that error with `weights_only=False` for a file you did not write.
#
# ### Exercise 2: `save_checkpoint`
# Write `save_checkpoint(path, model, optimizer, epoch)`:
#
# - it saves `{"model": ..., "optimizer": ..., "epoch": ...}`: the model's state dict, `optimizer.state_dict()` and
#   the epoch;
# - `"model"` is the state dict with no `module.` prefix, whether `model` is bare, a `DataParallel` (real or
#   virtual) or a `DistributedDataParallel`;
# - it saves atomically: saving again replaces the file, and if saving fails, the previous file at `path` is
#   intact, no temporary file is left, and the error reaches the caller.


# %% nbgrader={"grade": false, "grade_id": "save_checkpoint_answer", "locked": false, "schema_version": 3, "solution": true}
def save_checkpoint(path, model, optimizer, epoch):
    ### BEGIN SOLUTION
    wrappers = (nn.DataParallel, nn.parallel.DistributedDataParallel)
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
        raise
    ### END SOLUTION


# %%
gpulab.check.save_checkpoint(save_checkpoint)

# %% nbgrader={"grade": true, "grade_id": "save_checkpoint_contents", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("save_checkpoint", kind="contents"):
    case.verify(save_checkpoint)


# %% nbgrader={"grade": true, "grade_id": "save_checkpoint_unwraps", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("save_checkpoint", kind="unwraps"):
    case.verify(save_checkpoint)


# %% nbgrader={"grade": true, "grade_id": "save_checkpoint_atomic", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("save_checkpoint", kind="atomic"):
    case.verify(save_checkpoint)


# %% [markdown]
# ### Exercise 3: `load_checkpoint`
# Write `load_checkpoint(path, model, optimizer=None, map_location=None)`:
#
# - it loads the checkpoint into `model`, bare or wrapped, whether the file's keys carry the `module.` prefix or
#   not, and returns the epoch;
# - it restores the optimizer when one is given;
# - by default it loads onto the device of the model's parameters;
# - it never runs code from the file: a file that carries code is refused with an error.


# %% nbgrader={"grade": false, "grade_id": "load_checkpoint_answer", "locked": false, "schema_version": 3, "solution": true}
def load_checkpoint(path, model, optimizer=None, map_location=None):
    ### BEGIN SOLUTION
    wrappers = (nn.DataParallel, nn.parallel.DistributedDataParallel)
    bare = model.module if isinstance(model, wrappers) else model
    if map_location is None:
        map_location = next(bare.parameters()).device
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    state = checkpoint["model"]
    if list(state) != list(bare.state_dict()):
        state = strip_module_prefix(state)
    bare.load_state_dict(state)
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]
    ### END SOLUTION


# %%
gpulab.check.load_checkpoint(load_checkpoint)

# %% nbgrader={"grade": true, "grade_id": "load_checkpoint_models", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("load_checkpoint", kind="models"):
    case.verify(load_checkpoint)


# %% nbgrader={"grade": true, "grade_id": "load_checkpoint_resume", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("load_checkpoint", kind="resume"):
    case.verify(load_checkpoint)


# %% nbgrader={"grade": true, "grade_id": "load_checkpoint_refuses_code", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("load_checkpoint", kind="refuses_code"):
    case.verify(load_checkpoint)


# %% [markdown]
# ## Under DDP: one writer, then a barrier
#
# DDP runs one process per GPU, each holding the same weights, and wraps the model as `module` too. Read how
# `train_and_checkpoint` (in `ddp_checkpoint.py`, which each DDP process imports) saves and loads:

# %%
import inspect

import ddp_checkpoint

print(inspect.getsource(ddp_checkpoint.train_and_checkpoint))

# %% [markdown]
# Launch it on two ranks (one process each: gloo on CPUs, NCCL with one GPU per rank):

# %%
ddp_folder = folder / "ddp"
shutil.rmtree(ddp_folder, ignore_errors=True)  # a new, empty folder each time this cell runs
ddp_folder.mkdir()
results = gpulab.ddp.launch(ddp_checkpoint.train_and_checkpoint, 2, str(ddp_folder))
for result in results:
    print({gpulab.text(key): value for key, value in result.items()})

# %% [markdown]
# The keys carried `module.` under DDP, the file does not; rank 0 wrote it once, no temporary file was left, and
# every rank loaded weights equal to its own. Three rules: **save on rank 0 only** (one writer, one file); **a barrier before anyone loads**
# (`dist.barrier()`: no rank reads a half-written file); **load onto your own device** (`map_location`), or every
# rank piles rank 0's tensors onto GPU 0.

# %% [markdown]
# ## Quiz
# Answer in the cell below by setting `quiz_answers = {"q1": ..., "q2": ..., "q3": ..., "q4": ...}`.
# The next cell checks them, naming what to re-read.
#
# **q1.** A model has a layer `head`. After `wrapped = nn.DataParallel(model)`, under which key does
# `wrapped.state_dict()` hold that layer's weight? (a string)
#
# **q2.** A DDP job runs on 4 GPUs. Who should call `torch.save` for the checkpoint?
# (a) every rank, to the same path; (b) every rank, each to its own file; (c) rank 0 only.

# %% [markdown]
# **q3.** Rank 0 has just saved the checkpoint and rank 1 wants to load it. What must happen in between?
# (a) every rank calls `dist.barrier()`; (b) rank 1 sleeps for a second; (c) nothing: DDP keeps files in sync.
#
# **q4.** Why save to a temporary file and `os.replace` it onto the checkpoint's path?
# (a) it is faster; (b) a crash while saving leaves the previous checkpoint intact; (c) it makes the file smaller.
#
# Answer q2 to q4 with a letter.

# %% nbgrader={"grade": false, "grade_id": "quiz_answers", "locked": false, "schema_version": 3, "solution": true}
### BEGIN SOLUTION
quiz_answers = {"q1": "module.head.weight", "q2": "c", "q3": "a", "q4": "b"}
### END SOLUTION

# %%
gpulab.check.quiz("04")

# %% nbgrader={"grade": true, "grade_id": "quiz_q1", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert type(quiz_answers) is dict and "q1" in quiz_answers, gpulab.text("set quiz_answers in the answer cell above")

# %% nbgrader={"grade": true, "grade_id": "quiz_q2", "locked": true, "points": 1, "schema_version": 3, "solution": false}
letter = str(quiz_answers.get("q2", "")).strip().lower() if type(quiz_answers) is dict else None
assert letter in {"a", "b", "c"}, gpulab.text("answer with a letter: a, b or c")

# %% nbgrader={"grade": true, "grade_id": "quiz_q3", "locked": true, "points": 1, "schema_version": 3, "solution": false}
letter = str(quiz_answers.get("q3", "")).strip().lower() if type(quiz_answers) is dict else None
assert letter in {"a", "b", "c"}, gpulab.text("answer with a letter: a, b or c")

# %% nbgrader={"grade": true, "grade_id": "quiz_q4", "locked": true, "points": 1, "schema_version": 3, "solution": false}
letter = str(quiz_answers.get("q4", "")).strip().lower() if type(quiz_answers) is dict else None
assert letter in {"a", "b", "c"}, gpulab.text("answer with a letter: a, b or c")

# %% [markdown]
# ## What you learned
# - DataParallel and DDP keep your model in `.module`, so their state dicts name every tensor `module.<name>`; such a
#   file fails to load into a plain model, and `strict=False` loads nothing at all.
# - Save `model.module.state_dict()`; load with `map_location` set to the device you load onto.
# - Rescue a prefixed checkpoint by removing `module.` only at the start of each key, once.
# - A training checkpoint holds the model, the optimizer's state and the epoch: resuming then loses nothing.
# - Save atomically, load with `weights_only=True`, and under DDP save on rank 0 only, with a barrier before
#   anyone loads.
#
# That ends the course: you have split batches, averaged gradients, measured GPU 0's extra memory, and kept the
# results safe.

# %% [markdown]
# ## Going further: what the optimizer's state holds
# For the first parameter, from the checkpoint saved above:

# %%
first = checkpoint["optimizer"]["state"][0]
print(
    {name: tuple(value.shape) for name, value in first.items()},
    "| lr:",
    checkpoint["optimizer"]["param_groups"][0]["lr"],
)

# %% [markdown]
# Real jobs also save a learning-rate scheduler's `state_dict()`, a `GradScaler`'s for mixed precision, and the
# random-number generators' states when they need bit-exact resumption.

# %% [markdown]
# ## Going further: the same function under `torchrun`
# On a cluster, the same function runs unchanged under `torchrun`, one process per GPU, on one node or many:
#
# ```python
# # train_ddp.py
# import sys
# from gpulab import ddp
# from ddp_checkpoint import train_and_checkpoint
#
# if __name__ == "__main__":
#     ddp.run_under_torchrun(train_and_checkpoint, sys.argv[1])   # the checkpoint folder
# ```
#
# ```bash
# torchrun --standalone --nproc-per-node=2 train_ddp.py checkpoints/
# ```
#
# With several nodes, "rank 0 writes" needs a folder every node can read (a shared file system), or each node's
# local rank 0 writes its own copy.
