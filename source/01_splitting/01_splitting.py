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
# # Lesson 01 — Splitting the batch
#
# One line turns a model into a multi-GPU model: `nn.DataParallel(model, device_ids=[0, 1])`. Watch what that
# line does to every batch, predict it, then write it yourself: how a batch is cut, what happens to uneven and tiny
# batches, and how tuples, dicts and other arguments travel to each GPU.
#
# **Time**: about 30 minutes to the quiz; the "Going further" sections after it are optional.
#
# **Red cells are expected.** Until you answer an exercise, its cell and the test cells after it stop with an error
# (red). Run All carries on past them to the end of the notebook; they turn green once your answer is right.

# %% [markdown]
# ## Set-up
# The set-up cell says which mode this notebook runs in: real GPUs, or *virtual devices* (DataParallel's own
# algorithm run on one device) when this machine has fewer than two.

# %%
import gpulab
import torch

devices = gpulab.devices(2)

# %% [markdown]
# ## Why several GPUs?
#
# More memory and more samples per second. **Data parallelism** is the simplest split: every GPU holds a full copy
# (a *replica*) of the model, the batch is cut into pieces, each replica processes its piece, and the results are
# combined.

# %%
gpulab.diagrams.data_parallel_overview([len(chunk) for chunk in torch.arange(64).chunk(len(devices))])
# %% [markdown]
# ## One line
#
# With PyTorch you wrap the model:
#
# ```python
# model = MyModel().cuda()
# model = nn.DataParallel(model, device_ids=[0, 1])
# ```
#
# Try PyTorch's own class on *this* machine and look at the devices it will use:

# %%
from torch import nn

plain = nn.DataParallel(nn.Linear(4, 2))
print(gpulab.text(f"nn.DataParallel device_ids on this machine: {plain.device_ids}"))

# %% [markdown]
# With two or more GPUs this prints `[0, 1, ...]`. With none it prints `[]`: PyTorch then *silently just calls the
# model*. So the course wraps models with `gpulab.DataParallel`: it **is** `nn.DataParallel` when there are enough
# GPUs, and otherwise runs the same algorithm on virtual devices.

# %%
model = gpulab.models.MLP(in_features=4, hidden=8, classes=3).to(devices.primary)
parallel = gpulab.DataParallel(model, device_ids=devices)
print(type(parallel).__mro__[:2], parallel.device_ids)

# %% [markdown]
# ## See it run
#
# `ShapeReporter` prints, from inside `forward`, where it runs and what it receives (the trick of PyTorch's
# DataParallel tutorial). Feed a batch of 64 samples:

# %%
reporter = gpulab.models.ShapeReporter(model)
parallel = gpulab.DataParallel(reporter, device_ids=devices)
outputs = parallel(torch.randn(64, 4, device=devices.primary))
print(gpulab.text(f"gathered output: {tuple(outputs.shape)} on {outputs.device}"))

# %% [markdown]
# Each replica received 32 samples, and the outputs came back together, in order, on the first device.
#
# ### Which sample went where?
# Put each sample's index in column 0 and let every replica report the indices it received.
#
# **Predict**: with 64 samples on 2 devices, which samples does device 1 process?


# %%
def run_and_record(batch_size, device_ids):
    recorder = gpulab.models.ShapeReporter(model, verbose=False, record_samples=True)
    batch = torch.zeros(batch_size, 4, device=devices.primary)
    batch[:, 0] = torch.arange(batch_size)
    gpulab.DataParallel(recorder, device_ids=device_ids)(batch)
    received = {call["virtual_device"]: call["samples"] for call in recorder.calls}
    return [received.get(device, []) for device in device_ids]


samples_per_device = run_and_record(64, devices)
for device, samples in enumerate(samples_per_device):
    print(gpulab.text(f"device {device}: samples {samples[0]}..{samples[-1]} ({len(samples)})"))

# %%
gpulab.diagrams.sample_grid(samples_per_device, batch_size=64)
# %% [markdown]
# The batch is cut along **dimension 0**, in order, one contiguous block per device.
#
# ## Uneven and tiny batches
#
# DataParallel cuts with `Tensor.chunk`. **Predict** before running: how many samples does each of 3 devices get
# for a batch of 10? How many of 4 devices receive anything for a batch of 2?

# %%
for batch_size, n in [(10, 3), (2, 4), (5, 4), (1, 2)]:
    pieces = torch.arange(batch_size).chunk(n)
    print(gpulab.text(f"{batch_size:>2} samples on {n} devices -> {[len(p) for p in pieces]}"))

# %% [markdown]
# Were you right? `chunk` fills every piece to the same size, `ceil(B / N)`, and the last piece gets what is left;
# devices beyond the last piece sit idle for that batch, even when there are more samples than devices. Watch the
# real thing with 4 devices:

# %%
four = gpulab.devices(4, remember=False)
for batch_size in (10, 2):
    print(gpulab.text(f"{batch_size} samples -> {[len(s) for s in run_and_record(batch_size, four)]}"))

# %%
gpulab.diagrams.sample_grid(run_and_record(10, four), batch_size=10)
# %% [markdown]
# A *balanced* split, `torch.tensor_split`, is **not** what DataParallel does:

# %%
print([len(p) for p in torch.arange(10).tensor_split(4)], "vs", [len(p) for p in torch.arange(10).chunk(4)])

# %% [markdown]
# ### Exercise 1: `chunk_sizes`
# Write `chunk_sizes(batch_size, n_devices)`: the sub-batch sizes DataParallel produces, in device order, as a list
# of ints, one per device that receives data. Raise `ValueError` if either argument is below 1. Use plain
# arithmetic, not `Tensor.chunk` itself.


# %% nbgrader={"grade": false, "grade_id": "chunk_sizes_answer", "locked": false, "schema_version": 3, "solution": true}
def chunk_sizes(batch_size, n_devices):
    ### BEGIN SOLUTION
    if batch_size < 1 or n_devices < 1:
        raise ValueError("batch_size and n_devices must both be at least 1")
    per_chunk = -(-batch_size // n_devices)
    return [min(per_chunk, batch_size - start) for start in range(0, batch_size, per_chunk)]
    ### END SOLUTION


# %% [markdown]
# Check yourself (this grades nothing; it gives a hint when something is off). Stuck on any exercise?
# `gpulab.check.hint("chunk_sizes")` shows a hint, `gpulab.check.solution("chunk_sizes")` a solution once you
# confirm:

# %%
gpulab.check.chunk_sizes(chunk_sizes)

# %% nbgrader={"grade": true, "grade_id": "chunk_sizes_sizes", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("chunk_sizes", kind="sizes"):
    case.verify(chunk_sizes)

# %% nbgrader={"grade": true, "grade_id": "chunk_sizes_tiny_and_invalid", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("chunk_sizes", kind="tiny_and_invalid"):
    case.verify(chunk_sizes)

# %% [markdown]
# ### Exercise 2: `device_of_sample`
# Which device processes sample `index` of a batch? Write `device_of_sample(index, batch_size, n_devices)`: the
# device (an int) whose chunk, cut as in Exercise 1, holds that sample. Raise `IndexError` if `index` is outside
# `[0, batch_size)`.


# %% nbgrader={"grade": false, "grade_id": "device_of_sample_answer", "locked": false, "schema_version": 3, "solution": true}
def device_of_sample(index, batch_size, n_devices):
    ### BEGIN SOLUTION
    if not 0 <= index < batch_size:
        raise IndexError(f"sample {index} is not in a batch of {batch_size}")
    return index // -(-batch_size // n_devices)
    ### END SOLUTION


# %%
gpulab.check.device_of_sample(device_of_sample)

# %% nbgrader={"grade": true, "grade_id": "device_of_sample_devices", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("device_of_sample", kind="devices"):
    case.verify(device_of_sample)

# %% nbgrader={"grade": true, "grade_id": "device_of_sample_out_of_range", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("device_of_sample", kind="out_of_range"):
    case.verify(device_of_sample)

# %% [markdown]
# ## More than one tensor: tuples, dicts, kwargs and other arguments
#
# `forward` often takes several arguments, some of them containers, some not tensors at all. **Predict** what
# each replica of this model receives:


# %%
class Inspector(nn.Module):
    def forward(self, features, extra, scale=1.0, mode="train"):
        shapes = {name: tuple(t.shape) for name, t in extra.items()}
        scale_seen = tuple(scale.shape) if torch.is_tensor(scale) else scale
        print(f"  features={tuple(features.shape)}, extra={shapes}, scale={scale_seen}, mode={mode!r}")
        return features * scale


inspector = gpulab.DataParallel(Inspector(), device_ids=devices)
x = torch.randn(6, 3, device=devices.primary)
masks = {"mask": torch.ones(6, 5, device=devices.primary), "ids": torch.arange(6, device=devices.primary)}
_ = inspector(x, masks, scale=torch.full((6, 1), 2.0, device=devices.primary), mode="eval")

# %% [markdown]
# Scatter walked into the dict and cut every tensor inside it, the keyword argument `scale` included. Compare what
# happened to `mode`.
#
# ### Exercise 3: `split_batch`
# Write `split_batch(batch, n_devices)`: the list of per-device arguments `torch.nn.parallel.scatter` would make of
# `batch`, without moving data, one entry per device that receives data. A tensor is cut along dim 0 as in
# Exercise 1; a tuple, list or dict gives a list of tuples, lists or dicts, split element by element; any other
# object is repeated, itself, for each device (the demo above showed all three). Leave `batch` unchanged.


# %% nbgrader={"grade": false, "grade_id": "split_batch_answer", "locked": false, "schema_version": 3, "solution": true}
def split_batch(batch, n_devices):
    ### BEGIN SOLUTION
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(n_devices))
    if isinstance(batch, (tuple, list)) and len(batch) > 0:
        pieces = zip(*(split_batch(item, n_devices) for item in batch))
        return [type(batch)(piece) for piece in pieces]
    if isinstance(batch, dict) and len(batch) > 0:
        pieces = zip(*(split_batch(value, n_devices) for value in batch.values()))
        return [dict(zip(batch.keys(), piece)) for piece in pieces]
    return [batch for _ in range(n_devices)]
    ### END SOLUTION


# %%
gpulab.check.split_batch(split_batch)

# %% nbgrader={"grade": true, "grade_id": "split_batch_tensors", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("split_batch", kind="tensors"):
    case.verify(split_batch)

# %% nbgrader={"grade": true, "grade_id": "split_batch_containers", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("split_batch", kind="containers"):
    case.verify(split_batch)

# %% nbgrader={"grade": true, "grade_id": "split_batch_others_and_tiny", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("split_batch", kind="others_and_tiny"):
    case.verify(split_batch)

# %% [markdown]
# ## Quiz
# Answer in the cell below by setting `quiz_answers = {"q1": ..., "q2": ..., "q3": ...}`.
# The next cell checks them, naming what to re-read.
#
# **q1.** A batch of 7 samples on 4 GPUs with `nn.DataParallel`. How many GPUs receive data? (a number)
#
# **q2.** With 3 GPUs and a batch of 10, which GPU processes sample 7? (a number)
#
# **q3.** `model(x, temperature=0.5)` on two GPUs, `temperature` a Python float: what does each replica receive
# as `temperature`? (a) `0.5` on GPU 0 only, `None` on GPU 1; (b) `0.5` on both; (c) `0.25` on each.
# Answer with a letter.

# %% nbgrader={"grade": false, "grade_id": "quiz_answers", "locked": false, "schema_version": 3, "solution": true}
### BEGIN SOLUTION
quiz_answers = {"q1": 4, "q2": 1, "q3": "b"}
### END SOLUTION

# %%
gpulab.check.quiz("01")

# %% nbgrader={"grade": true, "grade_id": "quiz_q1", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert type(quiz_answers) is dict and "q1" in quiz_answers, gpulab.text("set quiz_answers in the answer cell above")

# %% nbgrader={"grade": true, "grade_id": "quiz_q2", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert type(quiz_answers) is dict and "q2" in quiz_answers, gpulab.text("set quiz_answers in the answer cell above")

# %% nbgrader={"grade": true, "grade_id": "quiz_q3", "locked": true, "points": 1, "schema_version": 3, "solution": false}
letter = str(quiz_answers.get("q3", "")).strip().lower() if type(quiz_answers) is dict else None
assert letter in {"a", "b", "c"}, gpulab.text("answer with a letter: a, b or c")

# %% [markdown]
# ## What you learned
# - `nn.DataParallel(model, device_ids=[0, 1])` wraps a model in one line; with fewer than two GPUs PyTorch's
#   class just calls the model, so the course uses `gpulab.DataParallel`, the same algorithm on virtual devices.
# - The batch is cut along dim 0 with `Tensor.chunk`: `ceil(B / N)` samples per device, the last one shorter;
#   small batches leave devices idle (`2 over 4 → [1, 1]`, `5 over 4 → [2, 2, 1]`).
# - Tuples, lists, dicts and keyword arguments are split element-wise; other objects are repeated.
# - Inputs go to the primary device, and the gathered outputs come back there.
#
# Next: lesson 02, where the replicas' gradients become one update.

# %% [markdown]
# ## Going further: memory on each device, live
# `gpulab.memory.track(live=True)` samples the memory each device holds a few times a second and plots it while
# the block runs. A wider model and a batch of 16,384 make each device's share visible: a few seconds of forwards.

# %%
wide = gpulab.models.MLP(in_features=64, hidden=512, classes=10).to(devices.primary)
wide_parallel = gpulab.DataParallel(wide, device_ids=devices)
big_batch = torch.randn(16384, 64, device=devices.primary)
with gpulab.memory.track(devices, live=True) as trace:
    for _ in range(8):
        wide_parallel(big_batch)
print(trace.summary())

# %% [markdown]
# Each device holds its own chunk's activations, about the same on both. Device 0 also holds the whole input
# batch and the gathered outputs: lesson 03 measures that difference.
#
# ## Going further: splitting along another dimension
# The split dimension is `dim=0` unless you pass another one to DataParallel:

# %%
by_columns = gpulab.DataParallel(Inspector(), device_ids=devices, dim=1)
_ = by_columns(torch.randn(2, 6, device=devices.primary), {"mask": torch.ones(4, 6, device=devices.primary)})

# %% [markdown]
# ## Going further: the training loop on real GPUs
#
# Your training loop does not change: move the batch to the first device (the *primary*, `device_ids[0]`), call
# the wrapped model, compute the loss on its output. DataParallel does the splitting, copying and gathering:
#
# ```python
# for x, y in loader:
#     x, y = x.cuda(), y.cuda()         # to the primary GPU
#     optimizer.zero_grad()
#     out = model(x)                    # split across GPUs, outputs gathered on GPU 0
#     loss = criterion(out, y)
#     loss.backward()
#     optimizer.step()
# ```
#
# The same loop, running on this machine's devices:

# %%
inputs, labels = gpulab.data.classification(samples=96, features=4, classes=3)
model = gpulab.models.MLP(in_features=4, hidden=8, classes=3).to(devices.primary)
parallel = gpulab.DataParallel(model, device_ids=devices)
optimizer = torch.optim.SGD(parallel.parameters(), lr=0.5)
for x, y in gpulab.data.batches(inputs, labels, batch_size=32):
    x, y = x.to(devices.primary), y.to(devices.primary)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(parallel(x), y)
    loss.backward()
    optimizer.step()
    print(f"loss {loss.item():.3f}")

# %% [markdown]
# How the gradients of the replicas become one update is the subject of lesson 02.
