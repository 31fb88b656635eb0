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
# # Lesson 02 — Gradient averaging
#
# Each replica sees only its own chunk, yet the optimizer must take the step the *whole* batch asks for. Take one
# DataParallel step apart, follow each replica's gradient home, check that the result is the full-batch gradient,
# then run DDP, which gets there with one process per GPU. You will leave knowing what "the gradients are
# averaged" really means, when a plain average is wrong, why BatchNorm is the exception, and why DDP wants equal
# batches on every rank.
#
# **Time**: about 40 minutes to the quiz; the "Going further" sections after it are optional.
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
# ## One DataParallel step, taken apart
#
# `nn.DataParallel.forward` runs four stages: **scatter** the batch, **replicate** the model, run the replicas
# side by side (**parallel_apply**), **gather** their outputs. Call them one at a time on a batch of 9 samples:

# %%
import copy

from torch import nn

torch.manual_seed(0)
model = gpulab.models.MLP(in_features=4, hidden=8, classes=3).to(devices.primary)
parallel = gpulab.DataParallel(model, device_ids=devices)
inputs, labels = (t.to(devices.primary) for t in gpulab.data.classification(samples=9, features=4, classes=3))

# %% [markdown]
# **1. Scatter**: the batch is cut along dim 0, as in lesson 01. 9 samples on 2 devices do not split evenly.

# %%
chunks, chunk_kwargs = parallel.scatter((inputs,), {}, parallel.device_ids)
print(gpulab.text(f"each replica's input: {[tuple(chunk[0].shape) for chunk in chunks]}"))

# %% [markdown]
# **2. Replicate**: one copy of the model per device that received data. Look at each replica's first weight:

# %%
replicas = parallel.replicate(parallel.module, parallel.device_ids[: len(chunks)])
for index, replica in enumerate(replicas):
    weight = replica.layers[0].weight
    same_memory = weight.data_ptr() == model.layers[0].weight.data_ptr()
    kind, grad_fn = type(weight).__name__, type(weight.grad_fn).__name__
    print(gpulab.text(f"replica {index}: {kind}, grad_fn {grad_fn}, shares the model's memory: {same_memory}"))
    weight.retain_grad()  # keep this gradient so we can look at it after backward

# %% [markdown]
# Not a `Parameter` any more: every replica's weight hangs off the model's one `Parameter` through
# `BroadcastBackward`, the road their gradients will take home.
#
# **3. Parallel apply**: each replica runs on its chunk, in its own thread.

# %%
outputs = parallel.parallel_apply(replicas, chunks, chunk_kwargs)
print(gpulab.text(f"each replica's output: {[tuple(output.shape) for output in outputs]}"))

# %% [markdown]
# **4. Gather**: the outputs are concatenated on the output device (device 0 by default), and *there* you compute
# the loss, a mean over the whole gathered batch.

# %%
gathered = parallel.gather(outputs, parallel.output_device)
loss = nn.functional.cross_entropy(gathered, labels)
print(gpulab.text(f"gathered {tuple(gathered.shape)} on {gathered.device}; loss {loss.item():.4f} on {loss.device}"))
print(gpulab.text(f"largest difference from parallel(inputs): {(gathered - parallel(inputs)).abs().max().item()}"))

# %% [markdown]
# ## Where do the gradients go?
#
# **Predict** before running: after `loss.backward()`, how does `model.layers[0].weight.grad` relate to the two
# replicas' gradients? Their average? Their sum? Only replica 0's?

# %%
model.zero_grad()  # no gradient left from an earlier run of this cell
for replica in replicas:
    replica.layers[0].weight.grad = None
loss.backward(retain_graph=True)  # keep the graph, so that this cell can run again
replica_grads = [replica.layers[0].weight.grad.to(devices.primary) for replica in replicas]
summed = sum(replica_grads)
difference = (model.layers[0].weight.grad - summed).abs().max().item()
print(gpulab.text(f"model's gradient - (replica 0's + replica 1's): {difference}"))

# %% [markdown]
# **Summed**: nothing divides by the number of devices. So where does any averaging happen? Compare each
# replica's gradient with the gradient of *its own chunk's* mean loss:


# %%
def chunk_mean_gradient(batch_inputs, batch_labels, index, n_chunks):
    """The first layer's gradient of the mean loss over chunk `index` alone, on a fresh copy of the model."""
    own = copy.deepcopy(model)
    chunk_inputs, chunk_labels = batch_inputs.chunk(n_chunks)[index], batch_labels.chunk(n_chunks)[index]
    chunk_loss = nn.functional.cross_entropy(own(chunk_inputs), chunk_labels)
    return torch.autograd.grad(chunk_loss, own.layers[0].weight)[0]


for index, chunk in enumerate(chunks):
    share = len(chunk[0]) / len(inputs)
    own_gradient = chunk_mean_gradient(inputs, labels, index, len(chunks))
    difference = (replica_grads[index] - share * own_gradient).abs().max().item()
    of_batch = f"{len(chunk[0])} of {len(inputs)}"
    print(
        gpulab.text(
            f"replica {index}: {of_batch} samples; its gradient - {share:.4f} x its chunk's mean-loss gradient: {difference:.1e}"
        )
    )

# %% [markdown]
# Each replica's gradient is its chunk's mean-loss gradient **scaled by its share of the batch**, n/B: the mean
# over the gathered batch divides every sample's loss by B. So "the gradients are averaged (summed, then scaled)"
# is exact the other way round: **scaled first**, by 1/B, inside the mean loss; **summed second**, by autograd.

# %% [markdown]
# ## Why it equals the full-batch gradient
#
# With chunks of sizes n_1 … n_K (their sum is B) and L_k the mean loss over chunk k:
#
# $$L = \frac{1}{B}\sum_{i=1}^{B}\ell_i = \sum_{k}\frac{n_k}{B}\,L_k
# \quad\Rightarrow\quad \nabla L = \sum_k \frac{n_k}{B}\,\nabla L_k .$$
#
# Replica k's share of the backward is (n_k / B) ∇L_k, and their sum is ∇L: one big batch on one device. Check:

# %%
one_device = copy.deepcopy(model)
full_loss = nn.functional.cross_entropy(one_device(inputs), labels)
full_gradient = torch.autograd.grad(full_loss, one_device.layers[0].weight)[0]
print(gpulab.text(f"DataParallel - full batch: {(model.layers[0].weight.grad - full_gradient).abs().max().item()}"))

# %% [markdown]
# Equal up to float rounding, for any chunking, as long as a sample's loss does not depend on the other samples
# of its chunk (BatchNorm breaks that, below).
#
# ## When a plain average is wrong
#
# Suppose you only had each device's gradient of its own chunk's mean loss, g_k, and averaged them plainly.
# **Predict**: for 10 samples on 3 devices (chunks 4, 4, 2), which samples would get too much say?

# %%
batch_size, n_devices = 10, 3
sizes = [len(chunk) for chunk in torch.arange(batch_size).chunk(n_devices)]
plain_weight = [1 / (n_devices * size) for size in sizes for _ in range(size)]
print(gpulab.text(f"chunk sizes: {sizes}"))
print(gpulab.text(f"weight of each sample in a plain average: {[round(w, 4) for w in plain_weight]}"))
print(gpulab.text(f"weight of each sample in the full-batch mean: {1 / batch_size}"))

# %%
import matplotlib.pyplot as plt

say = gpulab.text  # a label in the notebook's language, and a font that draws it (before the figure is made)
title, xlabel, ylabel = (
    say("A plain average of chunk means"),
    say("sample (colour: device)"),
    say("weight in the update"),
)
colours = [gpulab.diagrams.colour_of(device) for device, size in enumerate(sizes) for _ in range(size)]
figure, axes = plt.subplots(figsize=(7, 2.4))
axes.bar(range(batch_size), plain_weight, color=colours)
axes.axhline(1 / batch_size, color="black", linestyle="--", label=say("full batch: 1/B for every sample"))
axes.set(xlabel=xlabel, ylabel=ylabel, title=title)
axes.legend(loc="upper left")
plt.show()

# %% [markdown]
# The two samples of the short last chunk count twice as much as the others. With numbers, on the same model:

# %%
ten = [t.to(devices.primary) for t in gpulab.data.classification(samples=10, features=4, classes=3, seed=1)]
per_chunk = [chunk_mean_gradient(*ten, index, n_devices) for index in range(len(sizes))]
plain = sum(per_chunk) / len(per_chunk)
reference = torch.autograd.grad(nn.functional.cross_entropy(model(ten[0]), ten[1]), model.layers[0].weight)[0]
print(gpulab.text(f"plain average - full batch: {(plain - reference).abs().max().item():.2e}"))

# %% [markdown]
# Not rounding: a different update. DataParallel never sees the g_k; in exercise 1 you combine them so that they
# give the full-batch gradient.
#
# ### Exercise 1: `average_gradients`
# Write `average_gradients(grads_per_device, chunk_sizes)`. `grads_per_device[k]` is device k's list of parameter
# gradients (the same parameters in the same order on every device), each the gradient of the **mean** loss over
# that device's chunk of `chunk_sizes[k]` samples. Return a list with one tensor per parameter: the gradient of
# the mean loss over the whole batch. Raise `ValueError` if the two arguments have different lengths, and do
# not modify the tensors you are given.


# %% nbgrader={"grade": false, "grade_id": "average_gradients_answer", "locked": false, "schema_version": 3, "solution": true}
def average_gradients(grads_per_device, chunk_sizes):
    ### BEGIN SOLUTION
    if len(grads_per_device) != len(chunk_sizes):
        raise ValueError(f"{len(grads_per_device)} devices' gradients but {len(chunk_sizes)} chunk sizes")
    batch_size = sum(chunk_sizes)
    return [
        sum(size / batch_size * gradient for size, gradient in zip(chunk_sizes, gradients))
        for gradients in zip(*grads_per_device)
    ]
    ### END SOLUTION


# %% [markdown]
# Check yourself (this grades nothing; it gives a hint when something is off):

# %%
gpulab.check.average_gradients(average_gradients)

# %% nbgrader={"grade": true, "grade_id": "average_gradients_weights", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("average_gradients", kind="weights"):
    case.verify(average_gradients)

# %% nbgrader={"grade": true, "grade_id": "average_gradients_checks", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("average_gradients", kind="checks"):
    case.verify(average_gradients)

# %% [markdown]
# ### Exercise 2: `data_parallel_grads`
# Write `data_parallel_grads(model, inputs, targets, loss_fn, n_devices)`: DataParallel's whole step on
# `n_devices`, taken apart above, by hand on one device; `loss_fn` is a mean:
#
# - return `{parameter name: gradient}`, equal to the gradient of the mean loss `loss_fn(model(inputs), targets)`
#   over the whole batch;
# - split the batch as DataParallel's scatter splits it, and forward each chunk through a replica;
# - leave the arguments as they were (`model`, its weights and `.grad`, `inputs`, `targets`), and let no old
#   `.grad` leak into the result.


# %% nbgrader={"grade": false, "grade_id": "data_parallel_grads_answer", "locked": false, "schema_version": 3, "solution": true}
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    ### BEGIN SOLUTION
    names = [name for name, _ in model.named_parameters()]
    grads_per_device, chunk_sizes = [], []
    for chunk_inputs, chunk_targets in zip(inputs.chunk(n_devices), targets.chunk(n_devices)):
        replica = copy.deepcopy(model)
        loss_fn(replica(chunk_inputs), chunk_targets).backward()
        grads_per_device.append([parameter.grad for parameter in replica.parameters()])
        chunk_sizes.append(len(chunk_inputs))
    return dict(zip(names, average_gradients(grads_per_device, chunk_sizes)))
    ### END SOLUTION


# %%
gpulab.check.data_parallel_grads(data_parallel_grads)

# %% nbgrader={"grade": true, "grade_id": "data_parallel_grads_full_batch", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("data_parallel_grads", kind="full_batch"):
    case.verify(data_parallel_grads)

# %% nbgrader={"grade": true, "grade_id": "data_parallel_grads_splits_like_scatter", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("data_parallel_grads", kind="splits_like_scatter"):
    case.verify(data_parallel_grads)

# %% nbgrader={"grade": true, "grade_id": "data_parallel_grads_model_unchanged", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("data_parallel_grads", kind="model_unchanged"):
    case.verify(data_parallel_grads)

# %% [markdown]
# ## The exception: BatchNorm
#
# In training mode BatchNorm normalises with the mean and variance *of the batch it receives*, and under
# DataParallel every replica receives only its chunk. **Predict**: will the gradients match the full batch?

# %%
torch.manual_seed(2)
bn_model = gpulab.models.BatchNormMLP(in_features=4, hidden=8, classes=3).to(devices.primary)
bn_one_device = copy.deepcopy(bn_model)  # same weights, trained on one device
bn_inputs, bn_labels = (t.to(devices.primary) for t in gpulab.data.classification(samples=12, features=4, classes=3))
bn_parallel = gpulab.DataParallel(bn_model, device_ids=devices)
nn.functional.cross_entropy(bn_parallel(bn_inputs), bn_labels).backward()
nn.functional.cross_entropy(bn_one_device(bn_inputs), bn_labels).backward()
gap = (bn_model.layers[0].weight.grad - bn_one_device.layers[0].weight.grad).abs().max().item()
print(gpulab.text(f"BatchNorm model, DataParallel - full batch: {gap:.2e}"))

# %% [markdown]
# Not a rounding error: each replica normalised with its own chunk's statistics.
#
# ## The training loop does not change
#
# With full-batch gradients, DataParallel training takes the same steps as one-device training (for a model
# without BatchNorm). A model, and batches of 32 (the last one shorter), for the comparison after exercise 3:

# %%
torch.manual_seed(3)
initial_model = gpulab.models.MLP(in_features=4, hidden=8, classes=3).to(devices.primary)
batches = gpulab.data.batches(*gpulab.data.classification(samples=100, features=4, classes=3), batch_size=32)
batches = [(x.to(devices.primary), y.to(devices.primary)) for x, y in batches]

# %% [markdown]
# ### Exercise 3: `train_with_data_parallel`
# Write `train_with_data_parallel(model, batches, loss_fn, lr, device_ids)`: the training loop with
# `torch.optim.SGD(..., lr=lr)`, one step per `(x, y)` in `batches`:
#
# - forward each batch through `gpulab.DataParallel(model, device_ids=device_ids)`;
# - return one loss per batch, a Python float: the same as on one device;
# - train the `model` you are given: afterwards it holds the trained weights.


# %% nbgrader={"grade": false, "grade_id": "train_with_data_parallel_answer", "locked": false, "schema_version": 3, "solution": true}
def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
    ### BEGIN SOLUTION
    parallel = gpulab.DataParallel(model, device_ids=device_ids)
    optimizer = torch.optim.SGD(parallel.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(parallel(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
    ### END SOLUTION


# %%
gpulab.check.train_with_data_parallel(train_with_data_parallel)

# %% nbgrader={"grade": true, "grade_id": "train_with_data_parallel_losses", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("train_with_data_parallel", kind="losses"):
    case.verify(train_with_data_parallel)

# %% nbgrader={"grade": true, "grade_id": "train_with_data_parallel_weights", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("train_with_data_parallel", kind="weights"):
    case.verify(train_with_data_parallel)

# %% nbgrader={"grade": true, "grade_id": "train_with_data_parallel_uses_data_parallel", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("train_with_data_parallel", kind="uses_data_parallel"):
    case.verify(train_with_data_parallel)

# %% [markdown]
# ### Side by side
# The loop of exercise 3 on two copies of that model, on one device and under DataParallel:

# %%
on_one_device, on_two_devices = copy.deepcopy(initial_model), copy.deepcopy(initial_model)
networks = {"one device": on_one_device, "DataParallel": gpulab.DataParallel(on_two_devices, device_ids=devices)}
optimizers = {name: torch.optim.SGD(network.parameters(), lr=0.5) for name, network in networks.items()}
for step, (x, y) in enumerate(batches):
    losses = {}
    for name, network in networks.items():
        optimizers[name].zero_grad()
        step_loss = nn.functional.cross_entropy(network(x), y)
        step_loss.backward()
        optimizers[name].step()
        losses[name] = step_loss.item()
    print(
        gpulab.text(f"step {step} ({len(x)} samples):"),
        *(f"{gpulab.text(name)} {value:.6f}" for name, value in losses.items()),
    )

# %%
weight_gap = max((a - b).abs().max().item() for a, b in zip(on_two_devices.parameters(), on_one_device.parameters()))
print(gpulab.text(f"largest difference between the trained weights: {weight_gap:.1e}"))

# %% [markdown]
# The same losses and the same weights, up to float rounding: the optimizer was built on the wrapper's
# parameters, which *are* the model's.

# %% [markdown]
# ## DDP's way: one process per GPU, gradients all-reduced
#
# PyTorch recommends **DistributedDataParallel** (DDP), even on one machine: one process (a *rank*) per GPU, each
# with its own copy of the model, built once, and its own shard of every batch. During `backward` DDP
# **all-reduces** the gradients: every rank receives the sum over all ranks divided by the number of ranks, and
# takes the same optimizer step. The ranks import the function they run from `ddp_averaging.py`, next to the
# notebook. Read `ddp_gradients`, the DDP step:

# %%
import ddp_averaging
from IPython.display import Code

Code(filename="ddp_averaging.py", language="python")

# %% [markdown]
# Run it for real on 2 ranks (gloo on the CPU, NCCL with a GPU per rank), on a batch of 8 (4 per rank) and one of
# 7 (4 and 3); the same launch runs `batchnorm_means` for a "Going further" section. **Predict**: will both ranks
# end with the same gradients? Will they equal the full-batch gradient for both batches?

# %%
import time

even_batch = gpulab.data.classification(samples=8, features=4, classes=3, seed=1)
uneven_batch = gpulab.data.classification(samples=7, features=4, classes=3, seed=2)
started = time.perf_counter()
per_rank = gpulab.ddp.launch(ddp_averaging.both_demos, 2, [even_batch, uneven_batch], 0)
print(
    gpulab.text(
        f"{len(per_rank)} ranks returned after {time.perf_counter() - started:.1f} s (mostly starting Python and torch)"
    )
)


# %%
def full_batch_first_layer_gradient(batch, seed=0):
    torch.manual_seed(seed)  # the same starting weights as every rank
    reference_model = gpulab.models.MLP(in_features=4, hidden=8, classes=3)
    batch_loss = nn.functional.cross_entropy(reference_model(batch[0]), batch[1])
    return torch.autograd.grad(batch_loss, reference_model.layers[0].weight)[0]


for index, batch in enumerate([even_batch, uneven_batch]):
    rank0, rank1 = (rank["gradients"][index] for rank in per_rank)
    full = full_batch_first_layer_gradient(batch)
    between = (rank0["gradient"] - rank1["gradient"]).abs().max().item()
    shards = f"{rank0['samples']} + {rank1['samples']}"
    print(
        gpulab.text(
            f"{len(batch[0])} samples, {shards}: rank 0 - rank 1: {between:.1e}   DDP - full batch: {(rank0['gradient'] - full).abs().max().item():.1e}"
        )
    )

# %% [markdown]
# Both ranks always end with **identical** gradients: that is what the all-reduce is for. With equal shards the
# result is the full-batch gradient; with shards of 4 and 3 it is not: dividing by the number of ranks is the
# plain average of exercise 1's mistake. That is why DDP wants **the same number of samples on every rank**:
# `DistributedSampler` gives each rank an equal share of the dataset, and a fixed per-rank batch size does the rest.

# %% [markdown]
# ## Quiz
# Answer in the cell below by setting `quiz_answers = {"q1": ..., "q2": ..., "q3": ..., "q4": ...}`.
# The next cell checks them, naming what to re-read.
#
# **q1.** 10 samples on 3 GPUs give chunks of 4, 4 and 2. g0, g1, g2 are the gradients of each chunk's own mean
# loss, and the full-batch gradient is w0·g0 + w1·g1 + w2·g2. What is w2? (a number)
#
# **q2.** During `nn.DataParallel`'s backward, how do the replicas' gradients reach the model's parameters?
# (a) they are summed, then divided by the number of GPUs; (b) they are summed, each already scaled by 1/B through
# the mean loss over the gathered batch; (c) only replica 0's gradients are kept. Answer with a letter.

# %% [markdown]
# **q3.** DDP on 2 ranks; rank 0's shard has 6 samples, rank 1's has 2, and each rank's loss is the mean over its
# shard. Is the all-reduced gradient the gradient of the mean loss over all 8 samples? (a) yes; (b) no: each of
# rank 1's samples weighs 1/4 instead of 1/8; (c) no: each of rank 0's samples weighs 1/4 instead of 1/8.
# Answer with a letter.
#
# **q4.** A model with BatchNorm, DataParallel on 2 GPUs, a batch of 64 in training mode. Which statistics
# normalise the samples on GPU 1? (a) those of all 64 samples; (b) those of GPU 1's 32 samples; (c) the running
# statistics. Answer with a letter.

# %% nbgrader={"grade": false, "grade_id": "quiz_answers", "locked": false, "schema_version": 3, "solution": true}
### BEGIN SOLUTION
quiz_answers = {"q1": 0.2, "q2": "b", "q3": "b", "q4": "b"}
### END SOLUTION

# %%
gpulab.check.quiz("02")

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
# - A DataParallel step is scatter → replicate → parallel apply → gather; the loss is computed on the output
#   device, over the whole gathered batch.
# - In backward the replicas' gradients are **summed** into the model's parameters; the mean loss has already
#   scaled each by 1/B. Nothing divides by the number of GPUs.
# - That equals the full-batch gradient for any chunking; a plain average of per-device mean gradients does not
#   when chunks are uneven.
# - BatchNorm is the exception: each replica normalises with its own chunk's statistics.
# - The training loop does not change, and trains to the same losses and weights as one device.
# - DDP all-reduces the gradients, averaging over ranks: identical on every rank, and the full-batch gradient when
#   every rank has the same number of samples.
#
# Next: lesson 03, where device 0 pays for gathering, and DDP does not.

# %% [markdown]
# ## Going further: DataParallel itself scales nothing
# Take the **sum** over the batch instead of the mean, and the gradient that reaches the model of the first step
# grows by exactly B:

# %%
first_weight = parallel.module.layers[0].weight
mean_gradient = torch.autograd.grad(nn.functional.cross_entropy(parallel(inputs), labels), first_weight)[0]
sum_loss = nn.functional.cross_entropy(parallel(inputs), labels, reduction="sum")
sum_gradient = torch.autograd.grad(sum_loss, first_weight)[0]
ratio = (sum_gradient.norm() / mean_gradient.norm()).item()
print(
    gpulab.text(f"gradient of the summed loss / gradient of the mean loss = {ratio:.4f}; batch size B = {len(inputs)}")
)

# %% [markdown]
# ## Going further: BatchNorm's running statistics, and chunks of one sample
# With `momentum=1.0` BatchNorm's `running_mean` becomes the mean it just used; after one
# DataParallel forward it holds...

# %%
bn_model.layers[1].momentum = 1.0
with torch.no_grad():
    bn_parallel(bn_inputs)
    features = bn_model.layers[0](bn_inputs)  # what BatchNorm normalises
chunk_size = len(bn_inputs.chunk(len(devices))[0])
print(f"running_mean: {[round(v, 3) for v in bn_model.layers[1].running_mean[:4].tolist()]}")
print(gpulab.text(f"chunk 0's mean: {[round(v, 3) for v in features[:chunk_size].mean(dim=0)[:4].tolist()]}"))
print(gpulab.text(f"whole batch mean: {[round(v, 3) for v in features.mean(dim=0)[:4].tolist()]}"))

# %% [markdown]
# ... replica 0's chunk mean: the other replicas' statistics are thrown away with the replicas. And a chunk of a
# single sample cannot be normalised at all. 3 samples on 2 devices give chunks of 2 and 1:

# %%
bn_model.layers[1].momentum = 0.1
try:
    bn_parallel(bn_inputs[:3])
except ValueError as error:
    lines = str(error).strip().splitlines()
    print(lines[0], "...", lines[-1], sep="\n")

# %% [markdown]
# With DataParallel there is no cure but big enough chunks. Under DDP there is one, `SyncBatchNorm`; we meet it
# below.

# %% [markdown]
# ## Going further: BatchNorm under DDP, SyncBatchNorm
# Each rank's BatchNorm sees only its shard, as each DataParallel replica saw only its chunk. `SyncBatchNorm`
# fixes this under DDP: in every forward the ranks exchange their statistics (means, variances and counts), so
# every rank normalises with the statistics of the whole global batch. One line converts a model:

# %%
print(nn.SyncBatchNorm.convert_sync_batchnorm(gpulab.models.BatchNormMLP(in_features=4, hidden=8, classes=3)))

# %% [markdown]
# `SyncBatchNorm` itself does not run on the CPU. `batchnorm_means`, in the launch above, reported on every machine the
# mean each rank's ordinary BatchNorm used for the 8-sample batch, and the mean obtained by all-reducing the
# ranks' sums and counts — SyncBatchNorm's idea, done by hand (on GPUs, also SyncBatchNorm's own):

# %%
print(gpulab.text(f"whole batch mean: {[round(v, 3) for v in even_batch[0].mean(dim=0).tolist()]}"))
for rank in per_rank:
    means = rank["batchnorm"]
    for kind in ("local", "all_reduced", "sync_batchnorm"):
        if kind in means:
            print(gpulab.text(f"rank {means['rank']}"), f"{kind:<15}", [round(v, 3) for v in means[kind]])

# %% [markdown]
# ## Going further: the same function on many GPUs, `torchrun`
# Nothing in `ddp_gradients` depends on the notebook: each rank reads its rank and world size from the
# environment, as `torchrun` sets them. To run it on a machine with 8 GPUs, or on several machines:
#
# ```python
# # train_ddp.py
# import gpulab
# from ddp_averaging import ddp_gradients
#
# if __name__ == "__main__":
#     batch = gpulab.data.classification(samples=64, features=4, classes=3)
#     gpulab.ddp.run_under_torchrun(ddp_gradients, [batch], 0)
# ```
#
# ```bash
# torchrun --standalone --nproc-per-node=8 train_ddp.py
# ```
