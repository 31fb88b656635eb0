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
# # Lesson 03 — GPU-0 imbalance
#
# Every DataParallel guide warns that *GPU 0 fills up first* and that *it does not scale*. Measure both, in bytes:
# what device 0 holds that the others do not, how to remove most of it, what each algorithm moves between
# devices, and when DataParallel is still fine.
#
# **Time**: about 50 minutes to the quiz; the "Going further" sections after it are optional.
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
# ## A model with a wide output
#
# A language model's *head* scores every word of its vocabulary: tens of thousands of numbers per sample.
# `gpulab.models.WideHead` is one in miniature, with a 20,000-class output that dwarfs everything else:

# %%
from torch import nn

MIB = 2**20
batch_size, vocabulary = 256, 20_000
sizes = dict(in_features=32, hidden=64, classes=vocabulary)
inputs, labels = (t.to(devices.primary) for t in gpulab.data.classification(batch_size, 32, vocabulary, seed=1))
parameter_bytes = sum(p.numel() * p.element_size() for p in gpulab.models.WideHead(**sizes).parameters())
output_mib = batch_size * vocabulary * 4 / MIB
print(
    gpulab.text(
        f"parameters: {parameter_bytes / MIB:.1f} MiB; one batch's output ({batch_size} x {vocabulary:,} floats): {output_mib:.1f} MiB"
    )
)

# %% [markdown]
# ## Watch the memory of each device
#
# Train it with DataParallel on two devices for a few Adam steps, watching each device's memory:
#
# **Predict** before running: will both devices climb to the same height? If not, which one climbs higher?


# %%
def new_model():
    torch.manual_seed(0)
    return gpulab.models.WideHead(**sizes).to(devices.primary)


def train_step(network, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(network(x), y)
    loss.backward()
    optimizer.step()


# %%
parallel = optimizer = None  # free the earlier ones now, not inside the block
with gpulab.memory.track(interval=0.01, live=True, count_existing=False) as trace:
    parallel = gpulab.DataParallel(new_model(), device_ids=devices)
    optimizer = torch.optim.Adam(parallel.parameters(), lr=1e-3)
    for step in range(6):
        trace.mark(f"step {step}")
        train_step(parallel, optimizer, inputs, labels)
print(trace.summary())

# %% [markdown]
# Device 0 climbs far higher, at every step, although each replica ran half the batch.
#
# ## What device 0 holds that device 1 does not
#
# One step taken apart: what each device holds after each stage, counting only what the block allocates
# (`count_existing=False`), as on a GPU that starts empty:


# %%
def allocated(trace, label):
    trace.mark(label)
    return [series[-1] for series in trace.allocated]


# %%
model = parallel = optimizer = None  # free the earlier ones now, not inside the block
after = {}
with gpulab.memory.track(count_existing=False) as step_trace:
    after["start"] = allocated(step_trace, "start")
    model = new_model()
    parallel = gpulab.DataParallel(model, device_ids=devices)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    after["model"] = allocated(step_trace, "model")
    outputs = parallel(inputs)
    after["forward"] = allocated(step_trace, "forward")
    loss = nn.functional.cross_entropy(outputs, labels)
    after["loss"] = allocated(step_trace, "loss")
    del outputs
    loss.backward()
    backward_peak = step_trace.peaks()
    del loss
    after["backward"] = allocated(step_trace, "backward")
    optimizer.step()
    after["step"] = allocated(step_trace, "optimizer step")

# %%
parts = {
    "master parameters": (after["model"], after["start"]),
    "forward: gathered outputs": (after["forward"], after["model"]),
    "loss: log-softmax kept": (after["loss"], after["forward"]),
    "backward, at its peak": (backward_peak, after["loss"]),
    "gradients left by backward": (after["backward"], after["model"]),
    "optimizer step: Adam's state": (after["step"], after["backward"]),
}
print(gpulab.text("MiB on device 0 and on device 1, for each part of the step:"))
for part, (now, before) in parts.items():
    print("".join(f"{(n - b) / MIB:>8.1f}" for n, b in zip(now, before)), " ", gpulab.text(part))
peak_0, peak_1 = step_trace.peaks()
print(
    f"{peak_0 / MIB:>8.1f}{peak_1 / MIB:>8.1f}  ",
    gpulab.text(f"peak of the step, difference {(peak_0 - peak_1) / MIB:.1f}"),
)

# %%
gpulab.plots.plot_trace(step_trace, title="One DataParallel step, stage by stage")
# %% [markdown]
# - **Master parameters**, their **gradients** and Adam's **state** live on device 0 only; replica 1 is a fresh
#   copy made at every forward.
# - **Gathered outputs**: every replica's output is concatenated on device 0, the output device.
# - **The loss** runs there too, keeping a log-softmax of the same size for backward.
# - **Backward's peak**: device 0 also holds the gathered outputs' gradient (the shaded spike).
#
# The largest parts grow with batch × vocabulary: they make device 0 run out of memory first.

# %% [markdown]
# ### Exercise 1: `gathered_output_bytes`
# Write `gathered_output_bytes(batch_size, sample_shape, dtype)`: the bytes of the output DataParallel gathers on
# the output device for a batch. `sample_shape` is the shape of one sample's output (a tuple or `torch.Size`:
# `(20_000,)` here, `(positions, vocabulary)` for a sequence model), `dtype` a torch dtype. Return an int.

# %% nbgrader={"grade": false, "grade_id": "gathered_output_bytes_answer", "locked": false, "schema_version": 3, "solution": true}
import math


def gathered_output_bytes(batch_size, sample_shape, dtype):
    ### BEGIN SOLUTION
    return batch_size * math.prod(sample_shape) * dtype.itemsize
    ### END SOLUTION


# %% [markdown]
# Check yourself (this grades nothing; it hints when something is off):

# %%
gpulab.check.gathered_output_bytes(gathered_output_bytes)

# %% nbgrader={"grade": true, "grade_id": "gathered_output_bytes_float32", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("gathered_output_bytes", kind="float32"):
    case.verify(gathered_output_bytes)

# %% nbgrader={"grade": true, "grade_id": "gathered_output_bytes_dtypes_shapes", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("gathered_output_bytes", kind="dtypes_shapes"):
    case.verify(gathered_output_bytes)

# %% [markdown]
# The forward row against the size PyTorch gives a tensor of the gathered shape:

# %%
gathered = torch.empty(batch_size, vocabulary, dtype=torch.float32, device="meta")
forward_row = after["forward"][0] - after["model"][0]
print(
    gpulab.text(f"gathered output {gathered.nbytes / MIB:.2f} MiB, forward row {forward_row / MIB:.2f} MiB on device 0")
)

# %% [markdown]
# The rest is replica 0's activations, kept for backward (and, on GPUs, library workspaces).

# %% [markdown]
# ### Exercise 2: `imbalance_ratio`
# Imbalance in one number: device 0's peak divided by the **mean** peak of the *other* devices.
# Write `imbalance_ratio(peak_bytes)` taking a list of peaks, device 0 first (what `trace.peaks()` returns), and
# returning a float. Raise `ValueError` for fewer than two devices, or when the others' mean is 0. Leave
# `peak_bytes` unchanged.


# %% nbgrader={"grade": false, "grade_id": "imbalance_ratio_answer", "locked": false, "schema_version": 3, "solution": true}
def imbalance_ratio(peak_bytes):
    ### BEGIN SOLUTION
    peaks = list(peak_bytes)
    if len(peaks) < 2:
        raise ValueError("need device 0 and at least one other device")
    others = sum(peaks[1:]) / len(peaks[1:])
    if others == 0:
        raise ValueError("the other devices' mean peak is 0")
    return peaks[0] / others
    ### END SOLUTION


# %%
gpulab.check.imbalance_ratio(imbalance_ratio)

# %% nbgrader={"grade": true, "grade_id": "imbalance_ratio_ratio", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("imbalance_ratio", kind="ratio"):
    case.verify(imbalance_ratio)

# %% nbgrader={"grade": true, "grade_id": "imbalance_ratio_errors", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("imbalance_ratio", kind="errors"):
    case.verify(imbalance_ratio)

# %% [markdown]
# ## One number per device: the scalar warning
#
# The standard fix moves the loss into the replicas: each computes its own chunk's loss, and only that number is
# gathered. But gathering concatenates along dimension 0, and a loss is a 0-dim tensor. **Predict** what
# DataParallel does with a model that returns one:


# %%
class ReturnsScalar(nn.Module):
    def forward(self, x):
        return x.sum()


# %%
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = gpulab.DataParallel(ReturnsScalar(), device_ids=devices)(torch.ones(6, 2, device=devices.primary))
print(gpulab.text(f"result: {result.tolist()}, shape {tuple(result.shape)}"))
print(gpulab.text(f"warning: {[str(warning.message) for warning in caught]}"))

# %% [markdown]
# It makes each scalar a one-element vector, concatenates them and warns, once per code location (Python's default).
#
# What goes in that number? Chunks can be uneven (lesson 02): one mean per chunk would give 3 samples as much say
# as 4. Per-chunk **sums** work for any chunking: their total over the batch size is the batch's mean.

# %% [markdown]
# ### Exercise 3: `LossInForward`
# Write the module `LossInForward(model, loss_fn)`, where `loss_fn` sums over samples:
#
# - `forward(inputs, targets)` returns a plain tensor of shape `[1]` holding `loss_fn(model(inputs), targets)`;
# - wrapped in DataParallel, `wrapped(x, y).sum() / len(x)` is the full-batch mean loss;
# - `model` is a submodule: its parameters are `LossInForward`'s;
# - backward of that mean leaves the full-batch gradients in `model`;
# - device 0 receives one number per replica: `loss_fn` on that replica's chunk.


# %% nbgrader={"grade": false, "grade_id": "loss_in_forward_answer", "locked": false, "schema_version": 3, "solution": true}
class LossInForward(nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        ### BEGIN SOLUTION
        self.model = model
        self.loss_fn = loss_fn
        ### END SOLUTION

    def forward(self, inputs, targets):
        ### BEGIN SOLUTION
        return self.loss_fn(self.model(inputs), targets).view(1)
        ### END SOLUTION


# %%
gpulab.check.LossInForward(LossInForward)

# %% nbgrader={"grade": true, "grade_id": "loss_in_forward_value", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("LossInForward", kind="value"):
    case.verify(LossInForward)

# %% nbgrader={"grade": true, "grade_id": "loss_in_forward_gradients", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("LossInForward", kind="gradients"):
    case.verify(LossInForward)

# %% nbgrader={"grade": true, "grade_id": "loss_in_forward_memory", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("LossInForward", kind="memory"):
    case.verify(LossInForward)

# %% [markdown]
# ## Before and after, measured
#
# Three runs of the same training: outputs gathered on device 0 (the default), on device 1 (`output_device=1`),
# and the loss in `forward`, by your `LossInForward` of exercise 3.


# %%
def peaks_of(make_parallel, loss_in_forward=False, label_device=devices.primary, steps=2, capacity=None):
    """Each device's peak over `steps` training steps of a new model wrapped by `make_parallel`."""
    with gpulab.memory.track(count_existing=False, capacity=capacity) as run:
        model = new_model()
        network = LossInForward(model, nn.CrossEntropyLoss(reduction="sum")) if loss_in_forward else model
        parallel = make_parallel(network)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            if loss_in_forward:
                loss = parallel(inputs, labels).sum() / len(inputs)
            else:
                loss = nn.functional.cross_entropy(parallel(inputs), labels.to(label_device))
            loss.backward()
            optimizer.step()
    return run.peaks()


# %%
peaks = {
    "gathered on device 0": peaks_of(lambda m: gpulab.DataParallel(m, device_ids=devices)),
    "output_device=1": peaks_of(
        lambda m: gpulab.DataParallel(m, device_ids=devices, output_device=1), label_device=devices.torch_device(1)
    ),
}
try:  # your LossInForward of exercise 3
    peaks["loss in forward"] = peaks_of(lambda m: gpulab.DataParallel(m, device_ids=devices), loss_in_forward=True)
except NotImplementedError:
    print(gpulab.text("Write LossInForward (exercise 3) to measure the loss in forward too."))
for name, run_peaks in peaks.items():
    name, peaks_mib = gpulab.text(name), [round(p / MIB, 1) for p in run_peaks]
    print(gpulab.text(f"{name}: peaks {peaks_mib} MiB, device 0 / device 1 {run_peaks[0] / run_peaks[1]:.2f}"))

# %%
gpulab.plots.plot_peaks(peaks, title="Peak memory per device, three ways")
# %% [markdown]
# - **`output_device=1`** moves the imbalance to device 1; it does not go away.
# - **The loss in `forward`** removes the batch × vocabulary tensors from device 0, which gathers one number per
#   device. Still extra there: the master copy's gradients and Adam's state.
#
# ## The same training under DDP
#
# DDP runs one process per GPU (a *rank*), each with a full copy of the model and optimizer; during backward the
# ranks all-reduce (average) their gradients. Nothing is gathered. The ranks run a function from a file next to
# this notebook:

# %%
import inspect

import ddp_imbalance

print(inspect.getsource(ddp_imbalance.train_and_track))

# %% [markdown]
# One launch runs it on 2 ranks (plus three steps noting what DDP all-reduces). A first launch imports torch:
# 9.5-15.5 s measured on 2 busy cores.

# %%
import time

per_device = 128
capacity = "64 MiB"  # for "Going further": each rank trains within this capacity
started = time.perf_counter()
per_rank = gpulab.ddp.launch(
    ddp_imbalance.memory_and_traffic, 2, (inputs.cpu(), labels.cpu()), sizes, 2, (inputs.cpu(), labels.cpu()), capacity
)
print(gpulab.text(f"{len(per_rank)} ranks returned after {time.perf_counter() - started:.1f} s"))

# %%
ddp_peaks = [rank["trace"]["peaks"][0] for rank in per_rank]
with_ddp = {**peaks, "DDP, one rank per device": ddp_peaks}
ddp_mib, dp_mib = [round(p / MIB, 1) for p in ddp_peaks], [round(p / MIB, 1) for p in peaks["gathered on device 0"]]
print(gpulab.text(f"DDP: every rank's peak {ddp_mib} MiB, rank 0 / rank 1 {ddp_peaks[0] / ddp_peaks[1]:.2f}"))
print(gpulab.text(f"DataParallel: device 0 {dp_mib[0]} MiB, device 1 {dp_mib[1]} MiB"))
gpulab.plots.plot_peaks(with_ddp, title="Peak memory per device: DataParallel three ways, and DDP")
# %%
for rank in per_rank:
    gpulab.plots.plot_trace(
        rank["trace"], title=f"DDP rank {rank['rank']}: its own device's memory", device_labels=[f"rank {rank['rank']}"]
    )

# %% [markdown]
# The ranks peak at the same height. A rank holds less than DataParallel's device 0 (no gathered outputs) but
# more than its device 1: a *full* copy of the parameters, gradients, DDP's buckets and optimizer state. DDP's
# trade: the same memory on every GPU, more of it in total.
#
# ## The bandwidth bottleneck, in bytes
#
# Step times on virtual devices say nothing about GPUs; the bytes each algorithm *moves* do. `gpulab.traffic`
# counts every copy of one step on 4 devices, with and without NCCL:

# %%
steps = {
    algorithm: gpulab.traffic.counted_step(new_model(), inputs, labels, nn.functional.cross_entropy, 4, algorithm)
    for algorithm in gpulab.traffic.ALGORITHMS
}
print(gpulab.traffic.stage_table(steps))
gpulab.plots.plot_traffic(steps, title="One DataParallel step on 4 devices: bytes through each device's link")

# %% [markdown]
# Copies cross device 0's link once per other device. On GPUs PyTorch hands the broadcast and the reduce to NCCL
# (the lines printed), which chains them: device 0's link carries the parameters and their gradients once. The
# outputs and their gradient still cross it per device: the bandwidth bottleneck.

# %% [markdown]
# ### Exercise 4: `dp_traffic_bytes`
# Write `dp_traffic_bytes(batch_size, n_devices, n_params, in_features, out_features, bytes_per_element=4,
# algorithm="copy")`: for one DataParallel training step, model (`n_params` parameter elements, no buffers) and
# batch on device 0, input `[batch_size, in_features]`, output `[batch_size, out_features]`, return the bytes that
# leave or enter device 0 by stage, as a dict with the keys `"scatter"`, `"broadcast"`, `"gather"`,
# `"grad_scatter"` and `"reduce"` (ints). Each element takes `bytes_per_element` bytes; device 0 keeps its own
# chunk, and only devices that receive data get a replica. With `algorithm="nccl"`, the broadcast and the reduce
# cross device 0's link once each. Raise `ValueError` if any argument is below 1, `bytes_per_element` included.


# %% nbgrader={"grade": false, "grade_id": "dp_traffic_bytes_answer", "locked": false, "schema_version": 3, "solution": true}
def dp_traffic_bytes(batch_size, n_devices, n_params, in_features, out_features, bytes_per_element=4, algorithm="copy"):
    ### BEGIN SOLUTION
    counts = (batch_size, n_devices, n_params, in_features, out_features, bytes_per_element)
    if min(counts) < 1:
        raise ValueError("every count must be at least 1")
    chunks = [len(chunk) for chunk in torch.empty(batch_size).chunk(n_devices)]
    sent = sum(chunks[1:])
    replicas = len(chunks) - 1
    if algorithm == "nccl":
        replicas = min(replicas, 1)
    return {
        "scatter": sent * in_features * bytes_per_element,
        "broadcast": replicas * n_params * bytes_per_element,
        "gather": sent * out_features * bytes_per_element,
        "grad_scatter": sent * out_features * bytes_per_element,
        "reduce": replicas * n_params * bytes_per_element,
    }
    ### END SOLUTION


# %%
gpulab.check.dp_traffic_bytes(dp_traffic_bytes)

# %% nbgrader={"grade": true, "grade_id": "dp_traffic_bytes_forward", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("dp_traffic_bytes", kind="forward"):
    case.verify(dp_traffic_bytes)

# %% nbgrader={"grade": true, "grade_id": "dp_traffic_bytes_backward", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("dp_traffic_bytes", kind="backward"):
    case.verify(dp_traffic_bytes)

# %% nbgrader={"grade": true, "grade_id": "dp_traffic_bytes_idle_devices", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("dp_traffic_bytes", kind="idle_devices"):
    case.verify(dp_traffic_bytes)

# %% [markdown]
# ### DDP: the all-reduce, over every link at once
#
# During backward, DDP's ranks *all-reduce* their gradients in buckets. Rank 0 noted them, step by step:

# %%
for step, step_buckets in enumerate(per_rank[0]["buckets_by_step"]):
    total_mib = sum(step_buckets) / MIB
    print(gpulab.text(f"step {step}: {len(step_buckets)} bucket(s), {total_mib:.2f} MiB in all: {step_buckets} bytes"))
print(gpulab.text(f"the parameters: {parameter_bytes / MIB:.2f} MiB"))
buckets = per_rank[0]["buckets_by_step"][-1]  # DDP's buckets from step 1 on

# %% [markdown]
# Each step, every gradient once: as many bytes as the parameters; step 0 in one bucket (why: "Going further").
# gloo (and often NCCL) all-reduces them in a **ring** of
# N ranks, the tensor cut into N chunks. *Reduce-scatter*: at each step every rank passes one chunk to its
# neighbour, which adds it to its own, until each rank holds one fully summed chunk. *All-gather*: the summed
# chunks go round until every rank has them all.

# %% [markdown]
# ### Exercise 5: `ring_all_reduce_bytes`
# Write `ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4)`: the bytes all ranks together send
# in a ring all-reduce of `n_elements` elements (reduce-scatter, then all-gather), an int; 0 for one rank. Raise
# `ValueError` if `world_size` < 1 or `n_elements` < 0.


# %% nbgrader={"grade": false, "grade_id": "ring_all_reduce_bytes_answer", "locked": false, "schema_version": 3, "solution": true}
def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    ### BEGIN SOLUTION
    if world_size < 1 or n_elements < 0:
        raise ValueError("world_size must be at least 1 and n_elements at least 0")
    return 2 * (world_size - 1) * n_elements * bytes_per_element
    ### END SOLUTION


# %%
gpulab.check.ring_all_reduce_bytes(ring_all_reduce_bytes)

# %% nbgrader={"grade": true, "grade_id": "ring_all_reduce_bytes_total", "locked": true, "points": 2, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("ring_all_reduce_bytes", kind="total"):
    case.verify(ring_all_reduce_bytes)

# %% nbgrader={"grade": true, "grade_id": "ring_all_reduce_bytes_errors", "locked": true, "points": 1, "schema_version": 3, "solution": false}
for case in gpulab.check.cases("ring_all_reduce_bytes", kind="errors"):
    case.verify(ring_all_reduce_bytes)

# %% [markdown]
# ## When DataParallel is fine, and when to use DDP
#
# PyTorch's own documentation of `nn.DataParallel` says:

# %%
import re

advice = re.search(r"It is recommended.*?node\.", " ".join(nn.DataParallel.__doc__.split()))
print(advice.group(0) if advice else gpulab.text("See the warnings in help(nn.DataParallel)."))

# %% [markdown]
# DataParallel is one line, no launcher: fine for a quick two-GPU experiment.
# Everything measured above (device 0's extra memory, its link's extra shares) grows with each GPU; DDP's ranks
# stay equal, on one machine or many.
#
# ## Quiz
# Answer in the cell below by setting `quiz_answers = {"q1": ..., "q2": ..., "q3": ..., "q4": ..., "q5": ...}`;
# q1 and q2 are numbers, q3 to q5 letters.
# The next cell checks them, naming what to re-read.
#
# **q1.** DataParallel on 4 GPUs, a batch of 512 samples, a float32 output of 50,000 classes per sample. How many
# **bytes** of gathered outputs land on GPU 0 in one forward?
#
# **q2.** Four GPUs peaked at 9, 3, 3 and 6 GiB. What is the imbalance ratio?
#
# **q3.** GPU 0 runs out of memory first. Which change takes the batch × vocabulary tensors off GPU 0 without
# putting them on another GPU? (a) `output_device=1`; (b) the loss computed in `forward`; (c) a smaller learning
# rate.

# %% [markdown]
# **q4.** On 2 GPUs, a model's `forward` returns `loss.mean()`. What does the DataParallel-wrapped model return?
# (a) a 0-dim tensor, the mean of the two; (b) a tensor of shape `[2]`, with a warning; (c) an error.
#
# **q5.** A colleague starts a week-long run on a machine with 8 GPUs. Following PyTorch's advice, what does the
# run use? (a) `nn.DataParallel`, since it is one machine; (b) DistributedDataParallel, one process per GPU
# (e.g. started with `torchrun`); (c) either: they scale the same.

# %% nbgrader={"grade": false, "grade_id": "quiz_answers", "locked": false, "schema_version": 3, "solution": true}
### BEGIN SOLUTION
quiz_answers = {"q1": 102_400_000, "q2": 2.25, "q3": "b", "q4": "b", "q5": "b"}
### END SOLUTION

# %%
gpulab.check.quiz("03")

# %% nbgrader={"grade": true, "grade_id": "quiz_q1", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert type(quiz_answers) is dict and "q1" in quiz_answers, gpulab.text("set quiz_answers in the answer cell above")

# %% nbgrader={"grade": true, "grade_id": "quiz_q2", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert type(quiz_answers) is dict and "q2" in quiz_answers, gpulab.text("set quiz_answers in the answer cell above")

# %% nbgrader={"grade": true, "grade_id": "quiz_q3", "locked": true, "points": 1, "schema_version": 3, "solution": false}
letter = str(quiz_answers.get("q3", "")).strip().lower() if type(quiz_answers) is dict else None
assert letter in {"a", "b", "c"}, gpulab.text("answer with a letter: a, b or c")

# %% nbgrader={"grade": true, "grade_id": "quiz_q4", "locked": true, "points": 1, "schema_version": 3, "solution": false}
letter = str(quiz_answers.get("q4", "")).strip().lower() if type(quiz_answers) is dict else None
assert letter in {"a", "b", "c"}, gpulab.text("answer with a letter: a, b or c")

# %% nbgrader={"grade": true, "grade_id": "quiz_q5", "locked": true, "points": 1, "schema_version": 3, "solution": false}
letter = str(quiz_answers.get("q5", "")).strip().lower() if type(quiz_answers) is dict else None
assert letter in {"a", "b", "c"}, gpulab.text("answer with a letter: a, b or c")

# %% [markdown]
# ## What you learned
# - Device 0 holds the master copy, its gradients and optimizer state, and the batch × vocabulary tensors of the
#   gathered outputs, the loss and the outputs' gradient.
# - The loss in `forward` gathers one number per device instead; `output_device` only moves the outputs.
# - DDP gathers nothing: balanced memory, one process per GPU, a full copy on each.
# - DataParallel's bytes all cross device 0's link (with NCCL, the parameters once); DDP's ring uses every link.
# - DataParallel suits a quick two-GPU experiment; otherwise PyTorch recommends DDP, even on one machine.
#
# Next: lesson 04, where the `module.` prefix of both wrappers meets your checkpoints.

# %% [markdown]
# ## Going further: replicas are re-created at every step
#
# DataParallel has no replicas between steps: each forward broadcasts the parameters and builds new replica
# modules, which are thrown away after backward. A forward pre-hook on the model runs on each replica (hooks are
# copied with the module), so it can collect them:

# %%
model = new_model()
parallel = gpulab.DataParallel(model, device_ids=devices)
replicas = []
hook = model.register_forward_pre_hook(lambda replica, args: replicas.append(replica))
for _ in range(3):
    parallel(inputs[:8])
hook.remove()
distinct = len({id(replica) for replica in replicas})
print(gpulab.text(f"{len(replicas)} replica forwards, {distinct} different replica objects"))
print(gpulab.text(f"any of them the model itself: {any(replica is model for replica in replicas)}"))
model_memory, last = model.head.weight.data_ptr(), len(replicas) - 1
shared = [index for index, replica in enumerate(replicas) if replica.head.weight.data_ptr() == model_memory]
print(gpulab.text(f"replicas whose weight shares the model's memory: {shared} (numbered from 0 to {last})"))

# %% [markdown]
# Six new modules for three steps: in each step, replica 0 shares the model's memory and replica 1 is a fresh copy,
# made at every step, for every parameter.

# %% [markdown]
# ## Going further: GPU 0 runs out of memory first
#
# A GPU's memory is fixed. `gpulab.memory.track(capacity=...)` gives every device a capacity, a GPU scaled down
# to this lesson's model: an allocation that would take a device past it raises PyTorch's own
# `torch.OutOfMemoryError` (the class of CUDA's "out of memory" errors), naming the device. The same DataParallel
# training as above, on devices of 64 MiB each:

# %%
for name, loss_in_forward in [("loss outside forward", False), ("loss in forward", True)]:
    name = gpulab.text(name)  # in the notebook's language, as the lines printed below
    try:
        run_peaks = peaks_of(lambda m: gpulab.DataParallel(m, device_ids=devices), loss_in_forward, capacity=capacity)
        peaks_mib = [round(p / MIB, 1) for p in run_peaks]
        print(gpulab.text(f"{name}: fits, peaks {peaks_mib} MiB"))
    except torch.OutOfMemoryError as error:
        print(f"{name}: {type(error).__name__}: {error}")
    except NotImplementedError:
        print(gpulab.text("Write LossInForward (exercise 3) to measure the loss in forward too."))
capacity_mib = per_rank[0]["trace"]["capacity"] / MIB
peaks_mib = [round(rank["trace"]["peaks"][0] / MIB, 1) for rank in per_rank]
print(gpulab.text(f"DDP, each rank within {capacity_mib:.0f} MiB (the launch above): fits, peaks {peaks_mib} MiB"))

# %% [markdown]
# Device 0 runs out while device 1 still has room: it is asked for one more batch × vocabulary tensor. With the
# loss in `forward` no device runs out, and DDP's ranks, each holding a full copy, trained within the same
# capacity. On real GPUs the same `capacity=` runs the block under `torch.cuda.set_per_process_memory_fraction`,
# which makes PyTorch's allocator refuse memory beyond that share of each GPU.

# %% [markdown]
# ## Going further: one process, threads and the GIL
#
# DataParallel runs its replicas in threads of this one Python process. Python lets only one thread at a time
# run Python code: the *global interpreter lock* (GIL). Tensor kernels release it, but a replica's Python (a
# loop, hooks, every small operation launched) does not. DDP's ranks are processes, each with its own GIL.
# `gpulab.gil.PythonBound` is a forward that is all Python, a loop per sample. `gpulab.gil.measure` runs it on
# the same batch under DataParallel's two threads and in two DDP processes (a launch of their own: 2.6-3.5 s measured),
# and notes each worker's CPU time. Its *parallelism* is the CPU time of the workers added up, divided by the
# time they took: how many cores' worth of work ran at once. Other programs on the machine take cores too, so
# just before each of their runs the two processes also run a plain Python loop side by side, a calibration of
# what the machine gives two processes right now:

# %%
gil_run = gpulab.gil.measure(devices, batch_size=16, work=50_000, repeats=3)
print(gil_run.summary())
gil_run.plot()

# %% [markdown]
# With a second core free, the threads never run more than about one core's worth at once: they take turns holding
# the GIL, and a thread that waits for it uses no CPU. The processes reach about what the calibration reached: each
# has its own GIL. Without one (other programs are using it), no thread could run at once with another anyway, so
# these numbers show nothing, and the output says only that. What shows the GIL at any load is the waits: a
# pure-Python loop gives up its core by itself only to wait for a lock, and the threads wait for each other's GIL,
# the processes do not. On GPUs the threads overlap while kernels run, but each replica's Python still waits its
# turn: the more small operations a model has, the more its replicas queue, and the more devices, the longer the
# queue. DDP's ranks never wait for each other's Python.

# %% [markdown]
# ## Going further: bytes as the devices add up, and what they cost
#
# With `per_device` samples on each device, `gpulab.traffic` counts device 0's link on 1 to 8 devices, both ways
# (on the meta device: shapes only, a batch of any size in a moment). Against it, what each DDP rank sends in a
# ring all-reduce of the buckets measured above, the ring played step by step by `gpulab`:


# %%
def device_0_bytes(n, algorithm):
    x, y = inputs[:1].expand(n * per_device, -1), labels[:1].expand(n * per_device)
    step = gpulab.traffic.counted_step(new_model(), x, y, nn.functional.cross_entropy, n, algorithm)
    return sum(step.by_stage(0).values())


counts = list(range(1, 9))
copies_through_device_0 = [device_0_bytes(n, "copy") for n in counts]
through_device_0 = [device_0_bytes(n, "nccl") for n in counts]  # as on GPUs: what the predictions below use
elements = sum(buckets) // 4  # float32 gradients
chunks = {n: [len(part) for part in torch.arange(elements).tensor_split(n)] for n in counts}
per_rank_sent = [gpulab.traffic.ring_bytes_sent(chunks[n]) // n for n in counts]
gpulab.plots.plot_bytes_by_devices(
    counts,
    {
        "DataParallel, copies: device 0's link": copies_through_device_0,
        "DataParallel, NCCL: device 0's link": through_device_0,
        "DDP: what each rank sends": per_rank_sent,
    },
    title=f"Bytes per step, {per_device} samples per device",
)

# %% [markdown]
# DataParallel's lines climb by the same amount with every device from 2 on, all through one link; with NCCL, the
# parameters' share no longer grows. DDP's stays below twice the gradients' bytes, and every rank sends over its
# own link at the same time.
#
# ### What the bytes cost: a prediction
#
# `gpulab.scaling` turns bytes into time: DataParallel's stages one after another through device 0's link; DDP's
# ring over every link at once, each bucket starting as soon as backward has made it; both after the same compute.
# The compute is measured on real GPUs; on virtual devices (a CPU says nothing about a GPU) it is the step's FLOPs,
# counted by PyTorch, at the peak rate of the GPU usually found on each link, in the precision PyTorch uses there
# by default: TF32 for float32 convolutions where the GPU has it (`torch.backends.cudnn.allow_tf32` is `True`),
# FP32 for matrix products (`torch.backends.cuda.matmul.allow_tf32` is `False`). Each figure's source is printed:

# %%
links = gpulab.scaling.INTERCONNECTS
for link in links.values():
    source = gpulab.text(link.source)  # in the notebook's language
    gpu_sources = "; ".join(gpulab.text(gpu_source) for gpu_source in link.gpu_sources)
    print(f"{link.name:<28}{link.bytes_per_s / 1e9:>7.2f} GB/s: {source}; {link.gpu}: {gpu_sources}")

# %% [markdown]
# The host pays too. Python launches every operation through PyTorch's dispatcher onto the GPU, so a step takes at
# least its operations' launch time, however fast the GPU. DataParallel adds, at every step and in its one
# process, `replicate()` and a thread per replica (timed here on virtual devices backed by the `meta` device,
# which move no data), and every replica's forward launched under one GIL. DDP adds two copies per gradient
# tensor, into its bucket and back (`torch/csrc/distributed/c10d/reducer.cpp`). The launch and copy costs are
# calibrated on PyTorch's own DDP benchmark, which timed a ResNet-50 step on one V100 with and without DDP:

# %%
host = gpulab.scaling.host_costs()
operation_us, gradient_us = f"{host.per_operation_s * 1e6:.1f}", f"{host.ddp_per_gradient_s * 1e6:.1f}"
print(
    gpulab.text(
        f"host: {operation_us} µs per operation, {gradient_us} µs per gradient under DDP; from: {gpulab.text(host.source)}"
    )
)


# %%
def wide_batch(n):
    return torch.randn(n, 32), torch.randint(0, vocabulary, (n,))


lesson_cost = gpulab.scaling.cost_on_meta(
    "WideHead (this lesson)", lambda: gpulab.models.WideHead(**sizes), wide_batch, per_device
)
same_bytes, same_buckets = lesson_cost.device0_bytes == through_device_0, lesson_cost.bucket_bytes == buckets
print(
    gpulab.text(
        f"counted on the meta device: device 0's bytes as above {same_bytes}, DDP's buckets as measured {same_buckets}"
    )
)
measured, compute = {}, None  # None: the counted FLOPs and operations, unless measured on real GPUs
if not devices.virtual:
    measured, compute = gpulab.scaling.measure_on_gpus(new_model, inputs, labels, per_device, devices, per_rank)
predictions = {f"{name}, {link.gpu}": lesson_cost.speedups(link, compute) for name, link in links.items()}
gpulab.plots.plot_predicted_speedups(counts, predictions, measured)
print(gpulab.scaling.caveat())

# %% [markdown]
# On every link DDP's predicted speed-up is above DataParallel's from 2 devices on, and the gap widens with every
# device. This model computes little for the bytes it moves: DataParallel is predicted slower than one device on
# every link; DDP's speed-up rises with every device from 2 on, most steeply on the NVLinks, and stays below linear.
# A step of this model is *launch-bound*: its few small operations take the host longer to launch than any of these
# GPUs takes to compute them, so the H100 runs it no faster than the A100, and their curves differ by their links
# only. Models that compute more per byte lift every curve. On real GPUs, crosses mark the speed-ups measured here.

# %% [markdown]
# ### When is DDP near-linear?
#
# *Efficiency* is the speed-up divided by the number of devices: 1 is linear scaling. It depends on how much a
# step computes for each byte it moves. `gpulab.scaling.cost_on_meta` counts a model's FLOPs, operations and
# bytes on PyTorch's `meta` device, which has shapes but no data, so a model far too big for this machine is
# counted in seconds: this lesson's model (above), and a VGG-style convolutional network (`gpulab.models.ConvNet`,
# 64 images of 224 × 224 per device), whose convolutions compute a lot for few parameters:


# %%
def image_batch(n):
    return torch.randn(n, 3, 224, 224), torch.randint(0, 1000, (n,))


costs = [lesson_cost, gpulab.scaling.cost_on_meta("ConvNet (compute-bound)", gpulab.models.ConvNet, image_batch, 64)]
table_links = [links["PCIe 3.0 x16"], links["NVLink 3 (A100)"], links["NVLink 4 (H100)"]]
print(gpulab.scaling.efficiency_table(costs, table_links, counts=(2, 4, 8)))

# %% [markdown]
# DDP is near-linear when backward takes longer than the all-reduce of its gradients, which then hides behind it:
# the convolutional network, on every link. This lesson's model computes little and is far from it; DataParallel
# falls further behind with every device, for both. On the H100 the convolutional network's efficiencies are lower
# than on the A100, although each of its steps is faster: it computes its convolutions 3.2 times as fast (TF32:
# 494.5 against 156 TFLOPS), its NVLink moves bytes only 1.5 times as fast (450 against 300 GB/s), and the host is
# no faster, so bytes and launches weigh more in a shorter step. Efficiency compares a GPU with itself alone.
#
# ### Beside published measurements
#
# Runs on real GPUs, as published, each with its source, beside what `gpulab.scaling` predicts for the same model
# (`gpulab.models.ResNet50`, torchvision's ResNet-50, counted on the meta device), batch per GPU and hardware (its
# datasheet's figures); the gap is the measured efficiency minus the predicted one:

# %%
resnet_cost = gpulab.scaling.cost_on_meta("ResNet-50", gpulab.models.ResNet50, image_batch, 32, max_devices=4)
print(gpulab.scaling.comparison_table(resnet_cost))

# %% [markdown]
# One GPU's step is predicted at about half the measured time: peak rates are optimistic (BatchNorm and ReLU move
# bytes rather than compute), so compare efficiencies, ratios of one GPU's own times. On the DGX-1, DDP's measured
# efficiency is within 0.02 of the prediction, partly by luck: DDP's calibrated 3 ms is 3 % of the measured step
# but 6 % of the predicted one, and the measured runs lose as much again to what the model leaves out (ranks
# waiting for the slowest, the all-reduce's kernels sharing the GPU with backward). On the T4s, the epochs also
# load and decode images and DDP synchronised BatchNorm across GPUs: DDP measured below the prediction. No
# published DataParallel run on 8 GPUs with its model, batch and hardware named is quoted here: that prediction
# stays unchecked. Another published measurement, of two GPUs, gives seconds only:

# %%
print(gpulab.scaling.published_table(gpulab.scaling.PUBLISHED))

# %% [markdown]
# On 2 GPUs joined by NVLink, DDP was faster than DataParallel; with NVLink turned off, DDP was slower than
# DataParallel with it. A batch of 4 per GPU computes little for all of GPT-2's gradients: the link decides.

# %% [markdown]
# ## Going further: DDP's buckets, step by step
#
# Rank 0 noted one bucket in step 0 and two from step 1 on. DDP's constructor groups the gradients for the first
# step only: with `find_unused_parameters=False`, the default, `_BucketCapacityConfig.compute_bucket_size_limits`
# in `torch/nn/parallel/distributed.py` gives it one limit, `sys.maxsize`, so every gradient lands in one bucket,
# all-reduced only once backward has made the last one. The order of `model.parameters()` need not be the order
# backward makes the gradients in, so during that backward `Reducer::autograd_hook`
# (`torch/csrc/distributed/c10d/reducer.cpp`) notes the order they arrive in, and the next forward
# (`DistributedDataParallel._pre_forward`) calls `Reducer::rebuild_buckets`, once for the whole training: in that
# order, a bucket closes as soon as it holds 1 MiB for the first (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`)
# and 25 MiB for the others (`bucket_cap_mb`). `gpulab.scaling.ddp_buckets` follows those rules from the
# parameters' sizes:

# %%
parameter_sizes = [p.numel() * p.element_size() for p in gpulab.models.WideHead(**sizes).parameters()]
modelled = gpulab.scaling.ddp_buckets(parameter_sizes)
print(gpulab.text(f"modelled: {modelled} bytes; measured from step 1 on: {buckets} bytes"))

# %% [markdown]
# The head's gradients, made first, pass 1 MiB on their own; the first layer's 8,448 bytes make the second bucket.
# Buckets buy overlap: a bucket is all-reduced while backward still computes earlier layers' gradients.
# `gpulab.scaling.ddp_timeline` plays one predicted step, with the model of the predictions above, on 8 devices over
# PCIe 4.0: when backward has made each bucket (after the share of backward's FLOPs counted on the meta device up to
# its last gradient) and when the link all-reduces it:

# %%
timeline_link = links["PCIe 4.0 x16"]
cases = {
    "this lesson's model, step 0: one bucket": (lesson_cost, per_rank[0]["buckets_by_step"][0], [1.0]),
    "this lesson's model, from step 1 on": (lesson_cost, lesson_cost.bucket_bytes, lesson_cost.bucket_ready),
    "ConvNet, from step 1 on": (costs[1], costs[1].bucket_bytes, costs[1].bucket_ready),
}
timelines = {}
for case, (case_cost, case_buckets, ready) in cases.items():
    case_compute = case_cost.compute_on(timeline_link)
    timeline = gpulab.scaling.ddp_timeline(case_compute, case_buckets, 8, timeline_link, ready)
    timelines[case] = (case_compute.backward_s, timeline)
gpulab.plots.plot_ddp_timeline(timelines, title="8 devices over PCIe 4.0 x16: backward and each bucket's all-reduce")

# %% [markdown]
# This lesson's gradients are nearly all the head's: rebuilt or not, its big bucket is ready only as backward ends,
# and the whole all-reduce comes after it. The ConvNet's head is made first and fills a bucket of its own, all-reduced
# while the convolutions' gradients are computed; only its last bucket's all-reduce is left when backward ends.

# %% [markdown]
# ## Going further: less memory per DDP rank
#
# `DistributedDataParallel(..., gradient_as_bucket_view=True)` lets the gradients live in DDP's buckets and saves
# one copy of them on every rank; FSDP and ZeRO go further and shard the parameters and the optimizer state across
# the ranks.

# %% [markdown]
# ## Going further: the same function on many GPUs, `torchrun`
#
# `ddp_imbalance.train_and_track` does not depend on this notebook: each rank reads its rank and world size from
# the environment, as `torchrun` sets them. On one machine with 8 GPUs, or on 2 machines with 8 GPUs each:
#
# ```python
# # train_ddp.py
# import gpulab
# from ddp_imbalance import train_and_track
#
# if __name__ == "__main__":
#     batch = gpulab.data.classification(256, 32, 20_000, seed=1)
#     sizes = dict(in_features=32, hidden=64, classes=20_000)
#     gpulab.ddp.run_under_torchrun(train_and_track, batch, sizes, 10)
# ```
#
# ```bash
# torchrun --standalone --nproc-per-node=8 train_ddp.py                      # one machine, 8 GPUs
# torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d \
#          --rdzv-endpoint=HOST:29400 train_ddp.py                           # on each of 2 machines
# ```
