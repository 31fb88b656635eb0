"""One specification per exercise: the self-check (``gpulab.check``), the visible test cell and the grader's check
all derive from the exercise's rules (``gpulab.check.Rule``), so they cannot disagree.

* Per exercise, the reference, the lesson's correct-but-different answers and a set of wrong-but-plausible answers
  (floor division, a missing error, a wrong type, an off-by-one...), with the wrong answers of the lesson's grading
  tests: the grader's checks (run in this process through ``LocalSession``, several draws) mark an answer down
  exactly when the self-check calls it wrong.
* Every rule's statement is a sentence of the lesson's text, in English (``source/NN/NN.py``) and, through its
  translation, in Japanese (the lesson's ``.ja.po``).
"""

from __future__ import annotations

import importlib
import random
import re
import sys

import gpulab_solutions
import pytest
from gpulab import check

from tests.local_checks import NAMESPACES, PATCH_THE_PROCESS, answer_cell, reference_answer
from tests.nbgrader_tools import REPO, SOURCE_ROOT

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from autograder.checks import CheckFailed, LocalSession, checks_for  # noqa: E402

# The exercises whose whole specification is declared as rules, by lesson.
SPECIFIED = {
    "01_splitting": ("chunk_sizes", "device_of_sample", "split_batch"),
    "02_gradient_averaging": ("average_gradients", "data_parallel_grads", "train_with_data_parallel"),
    "03_gpu0_imbalance": (
        "gathered_output_bytes",
        "imbalance_ratio",
        "LossInForward",
        "dp_traffic_bytes",
        "ring_all_reduce_bytes",
    ),
    "04_checkpoints": ("strip_module_prefix", "save_checkpoint", "load_checkpoint"),
}
DRAWS = range(3)

CHUNK_SIZES = """
def chunk_sizes(batch_size, n_devices):
    if batch_size < 1 or n_devices < 1:
        raise ValueError("at least 1")
    per_chunk = -(-batch_size // n_devices)
    return [min(per_chunk, batch_size - start) for start in range(0, batch_size, per_chunk)]
"""

DP_TRAFFIC_BYTES = """
def dp_traffic_bytes(
    batch_size, n_devices, n_params, in_features, out_features, bytes_per_element=4, algorithm="copy"
):
    if min(batch_size, n_devices, n_params, in_features, out_features, bytes_per_element) < 1:
        raise ValueError("every argument must be at least 1")
    chunks = [len(chunk) for chunk in torch.empty(batch_size).chunk(n_devices)]
    sent = sum(chunks[1:])
    replicas = len(chunks) - 1
    copies = min(replicas, 1) if algorithm == "nccl" else replicas
    return {
        "scatter": sent * in_features * bytes_per_element,
        "broadcast": copies * n_params * bytes_per_element,
        "gather": sent * out_features * bytes_per_element,
        "grad_scatter": sent * out_features * bytes_per_element,
        "reduce": copies * n_params * bytes_per_element,
    }
"""

# Wrong but plausible answers: name -> the code of the answer cell.
PLAUSIBLE = {
    "chunk_sizes": {
        "balanced_like_tensor_split": """
def chunk_sizes(batch_size, n_devices):
    if batch_size < 1 or n_devices < 1:
        raise ValueError("at least 1")
    sizes = [batch_size // n_devices + (1 if i < batch_size % n_devices else 0) for i in range(n_devices)]
    return [s for s in sizes if s > 0]
""",
        "floor_division": """
def chunk_sizes(batch_size, n_devices):
    if batch_size < 1 or n_devices < 1:
        raise ValueError("at least 1")
    return [batch_size // n_devices] * n_devices
""",
        "ceil_for_every_device": """
def chunk_sizes(batch_size, n_devices):
    if batch_size < 1 or n_devices < 1:
        raise ValueError("at least 1")
    return [-(-batch_size // n_devices)] * n_devices
""",
        "empty_chunks_for_idle_devices": CHUNK_SIZES.replace("return [", "sizes = [").replace(
            "per_chunk)]", "per_chunk)]\n    return sizes + [0] * (n_devices - len(sizes))"
        ),
        "no_value_error": CHUNK_SIZES.replace("raise ValueError", "return []  #"),
        "value_error_only_below_0": CHUNK_SIZES.replace("< 1", "< 0").replace(
            "return [", "return [] if batch_size == 0 else ["
        ),
        "zero_division_instead_of_value_error": CHUNK_SIZES.replace("or n_devices < 1", ""),
        "a_tuple": CHUNK_SIZES.replace("return [", "return tuple([").replace("per_chunk)]", "per_chunk)])"),
        "a_tensor": CHUNK_SIZES.replace("return [", "return torch.tensor([").replace("per_chunk)]", "per_chunk)])"),
        "floats": CHUNK_SIZES.replace(
            "[min(per_chunk, batch_size - start)", "[float(min(per_chunk, batch_size - start))"
        ),
    },
    "device_of_sample": {
        "floor_division": """
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError(index)
    return index // (batch_size // n_devices)
""",
        "proportional": """
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError(index)
    return index * n_devices // batch_size
""",
        "round_robin": """
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError(index)
    return index % n_devices
""",
        "no_index_error": """
def device_of_sample(index, batch_size, n_devices):
    return index // -(-batch_size // n_devices)
""",
        "off_by_one_at_the_end": """
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index <= batch_size:
        raise IndexError(index)
    return index // -(-batch_size // n_devices)
""",
        "value_error": """
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise ValueError(index)
    return index // -(-batch_size // n_devices)
""",
        "a_float": """
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError(index)
    return float(index // -(-batch_size // n_devices))
""",
        "a_bool_for_two_devices": """
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError(index)
    device = index // -(-batch_size // n_devices)
    return bool(device) if n_devices == 2 else device
""",
    },
}

PLAUSIBLE["dp_traffic_bytes"] = {
    "no_value_error_for_zero_bytes_per_element": DP_TRAFFIC_BYTES.replace(", bytes_per_element) < 1", ") < 1"),
    "value_error_only_below_0": DP_TRAFFIC_BYTES.replace(") < 1:", ") < 0:"),
    "four_bytes_always": DP_TRAFFIC_BYTES.replace("* bytes_per_element,", "* 4,"),
    "elements_not_bytes": DP_TRAFFIC_BYTES.replace(" * bytes_per_element,", ","),
    "own_chunk_sent": DP_TRAFFIC_BYTES.replace("sent = sum(chunks[1:])", "sent = batch_size"),
    "replicas_for_idle_devices": DP_TRAFFIC_BYTES.replace("replicas = len(chunks) - 1", "replicas = n_devices - 1"),
    "no_backward": DP_TRAFFIC_BYTES.replace(
        '"grad_scatter": sent * out_features * bytes_per_element', '"grad_scatter": 0'
    ).replace('"reduce": copies * n_params * bytes_per_element', '"reduce": 0'),
    "nccl_counted_as_copies": DP_TRAFFIC_BYTES.replace(
        'min(replicas, 1) if algorithm == "nccl" else replicas', "replicas"
    ),
    "nccl_chains_every_stage": DP_TRAFFIC_BYTES.replace(
        "    sent = sum(chunks[1:])\n", '    sent = sum(chunks[1:]) if algorithm == "copy" else sum(chunks[1:2])\n'
    ),
    "without_the_algorithm": DP_TRAFFIC_BYTES.replace(', algorithm="copy"', "").replace(
        'min(replicas, 1) if algorithm == "nccl" else replicas', "replicas"
    ),
    "balanced_split": DP_TRAFFIC_BYTES.replace(").chunk(n_devices)]", ").tensor_split(n_devices) if len(chunk)]"),
    "floats": DP_TRAFFIC_BYTES.replace("sent = sum(chunks[1:])", "sent = float(sum(chunks[1:]))"),
    "an_ordered_dict": "from collections import OrderedDict\n"
    + DP_TRAFFIC_BYTES.replace("return {", "return OrderedDict({").replace("    }\n", "    })\n"),
}

SPLIT_BATCH = """
def split_batch(batch, n_devices):
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(n_devices))
    if isinstance(batch, (tuple, list)) and len(batch) > 0:
        pieces = zip(*(split_batch(item, n_devices) for item in batch))
        return [type(batch)(piece) for piece in pieces]
    if isinstance(batch, dict) and len(batch) > 0:
        pieces = zip(*(split_batch(value, n_devices) for value in batch.values()))
        return [dict(zip(batch.keys(), piece)) for piece in pieces]
    return [batch for _ in range(n_devices)]
"""

PLAUSIBLE["split_batch"] = {
    "tensor_split": SPLIT_BATCH.replace("list(batch.chunk(n_devices))", "list(batch.tensor_split(n_devices))"),
    "a_tuple_of_chunks": SPLIT_BATCH.replace("list(batch.chunk(n_devices))", "batch.chunk(n_devices)"),
    "tuples_become_lists": SPLIT_BATCH.replace("[type(batch)(piece) for", "[list(piece) for"),
    "dicts_by_sorted_keys": SPLIT_BATCH.replace("dict(zip(batch.keys(), piece))", "dict(sorted(zip(batch, piece)))"),
    "copies_other_objects": "import copy\n" + SPLIT_BATCH.replace("[batch for _", "[copy.copy(batch) for _"),
    "deep_copies_other_objects": "import copy\n" + SPLIT_BATCH.replace("[batch for _", "[copy.deepcopy(batch) for _"),
    "pads_idle_devices": SPLIT_BATCH.replace(
        "return list(batch.chunk(n_devices))",
        "pieces = list(batch.chunk(n_devices))\n        return pieces + [batch[:0]] * (n_devices - len(pieces))",
    ),
    "changes_the_batch": SPLIT_BATCH.replace(
        "return list(batch.chunk(n_devices))",
        "pieces = list(batch.clone().chunk(n_devices))\n        batch.zero_()\n        return pieces",
    ),
    "a_dict_of_the_non_tensors_once": SPLIT_BATCH.replace("[batch for _ in range(n_devices)]", "[batch]"),
}

AVERAGE_GRADIENTS = """
def average_gradients(grads_per_device, chunk_sizes):
    if len(grads_per_device) != len(chunk_sizes):
        raise ValueError("one chunk size per device")
    batch_size = sum(chunk_sizes)
    return [
        sum(size / batch_size * gradient for size, gradient in zip(chunk_sizes, gradients))
        for gradients in zip(*grads_per_device)
    ]
"""

PLAUSIBLE["average_gradients"] = {
    "plain_mean": AVERAGE_GRADIENTS.replace("size / batch_size * gradient", "gradient / len(chunk_sizes)"),
    "plain_sum": AVERAGE_GRADIENTS.replace("size / batch_size * gradient", "gradient"),
    "unnormalised_weights": AVERAGE_GRADIENTS.replace("size / batch_size * gradient", "size * gradient"),
    "integer_weights": AVERAGE_GRADIENTS.replace("size / batch_size * gradient", "size // batch_size * gradient"),
    "in_place": AVERAGE_GRADIENTS.replace(
        "sum(size / batch_size * gradient for", "sum(gradient.mul_(size / batch_size) for"
    ),
    "no_value_error": AVERAGE_GRADIENTS.replace('raise ValueError("one chunk size per device")', "pass"),
    "a_tuple": AVERAGE_GRADIENTS.replace("return [", "return tuple([").replace(
        "in zip(*grads_per_device)\n    ]", "in zip(*grads_per_device)\n    ])"
    ),
    "one_per_device": AVERAGE_GRADIENTS.replace(
        "for gradients in zip(*grads_per_device)", "for gradients in [list(d) for d in grads_per_device]"
    ),
    "parameters": AVERAGE_GRADIENTS.replace("return [", "return [torch.nn.Parameter(").replace(
        "zip(chunk_sizes, gradients))", "zip(chunk_sizes, gradients)))"
    ),
}

DP_GRADS = reference_answer("02_gradient_averaging", "data_parallel_grads")

PLAUSIBLE["data_parallel_grads"] = {
    "plain_mean_of_replicas": DP_GRADS.replace(
        "average_gradients(grads_per_device, chunk_sizes)",
        "[sum(grads) / len(grads) for grads in zip(*grads_per_device)]",
    ),
    "balanced_like_tensor_split": DP_GRADS.replace(".chunk(n_devices)", ".tensor_split(n_devices)"),
    "the_whole_batch_at_once": """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    replica = copy.deepcopy(model)
    loss_fn(replica(inputs), targets).backward()
    return {name: parameter.grad for name, parameter in replica.named_parameters()}
""",
    "one_replica_for_every_chunk": DP_GRADS.replace("        replica = copy.deepcopy(model)\n", "")
    .replace("    for chunk_inputs", "    replica = copy.deepcopy(model)\n    for chunk_inputs")
    .replace("[parameter.grad for", "[parameter.grad.clone() for"),
    "clears_the_callers_grad_first": DP_GRADS.replace(
        "    names = [", "    model.zero_grad(set_to_none=True)\n    names = ["
    ),
    "keeps_the_old_grad": """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    replica = copy.deepcopy(model)
    for mine, theirs in zip(replica.parameters(), model.parameters()):
        mine.grad = None if theirs.grad is None else theirs.grad.clone()
    for xs, ys in zip(inputs.chunk(n_devices), targets.chunk(n_devices)):
        (loss_fn(replica(xs), ys) * len(xs) / len(inputs)).backward()
    return {name: parameter.grad for name, parameter in replica.named_parameters()}
""",
    "standardises_the_inputs_in_place": DP_GRADS.replace(
        "    names = [", "    inputs -= inputs.mean(0)\n    names = ["
    ),
    "a_list_of_gradients": DP_GRADS.replace(
        "return dict(zip(names, average_gradients(grads_per_device, chunk_sizes)))",
        "return average_gradients(grads_per_device, chunk_sizes)",
    ),
}

RING = """
def ring_all_reduce_bytes(n_elements, world_size, bytes_per_element=4):
    if world_size < 1 or n_elements < 0:
        raise ValueError("world_size must be at least 1 and n_elements at least 0")
    return 2 * (world_size - 1) * n_elements * bytes_per_element
"""

TRAIN = reference_answer("02_gradient_averaging", "train_with_data_parallel")

PLAUSIBLE["train_with_data_parallel"] = {
    "forgets_zero_grad": TRAIN.replace("        optimizer.zero_grad()\n", ""),
    "trains_a_copy": TRAIN.replace("DataParallel(model,", "DataParallel(copy.deepcopy(model),"),
    "torchs_own_data_parallel": TRAIN.replace("gpulab.DataParallel(", "nn.DataParallel("),
    "the_model_itself": TRAIN.replace("gpulab.DataParallel(model, device_ids=device_ids)", "model"),
    "loss_tensors": TRAIN.replace("losses.append(loss.item())", "losses.append(loss.detach())"),
    "one_step_for_all_batches": TRAIN.replace("        optimizer.step()\n", "").replace(
        "    return losses", "    optimizer.step()\n    return losses"
    ),
    "a_learning_rate_of_its_own": TRAIN.replace("lr=lr", "lr=0.1"),
    "running_mean_of_the_losses": TRAIN.replace(
        "losses.append(loss.item())", "losses.append((sum(losses) + loss.item()) / (len(losses) + 1))"
    ),
}

PLAUSIBLE["ring_all_reduce_bytes"] = {
    "off_by_one_ranks": RING.replace("2 * (world_size - 1)", "2 * world_size"),
    "one_ranks_share": RING.replace("* bytes_per_element", "* bytes_per_element // world_size"),
    "reduce_scatter_only": RING.replace("2 * (world_size - 1)", "(world_size - 1)"),
    "a_float": RING.replace("return 2 *", "return 2.0 *"),
    "a_numpy_int": "import numpy\n" + RING.replace("return 2 *", "return numpy.int64(2) *"),
    "no_value_error_for_negative_elements": RING.replace(" or n_elements < 0", ""),
    "value_error_for_zero_elements": RING.replace("n_elements < 0", "n_elements < 1"),
    "four_bytes_always": RING.replace("* bytes_per_element", "* 4"),
}

RATIO = """
def imbalance_ratio(peak_bytes):
    peaks = list(peak_bytes)
    if len(peaks) < 2:
        raise ValueError("need device 0 and at least one other device")
    others = sum(peaks[1:]) / len(peaks[1:])
    if others == 0:
        raise ValueError("the other devices' mean peak is 0")
    return peaks[0] / others
"""

PLAUSIBLE["imbalance_ratio"] = {
    "mean_of_every_device": RATIO.replace("return peaks[0] / others", "return peaks[0] / (sum(peaks) / len(peaks))"),
    "max_over_min": RATIO.replace("return peaks[0] / others", "return max(peaks) / min(peaks[1:])"),
    "over_the_smallest_other": RATIO.replace("return peaks[0] / others", "return peaks[0] / min(peaks[1:])"),
    "integer_division": RATIO.replace("return peaks[0] / others", "return peaks[0] // others"),
    "rounded": RATIO.replace("return peaks[0] / others", "return round(peaks[0] / others, 2)"),
    "float32": "import numpy\n" + RATIO.replace("return peaks[0] / others", "return numpy.float32(peaks[0] / others)"),
    "a_bool_for_balanced": RATIO.replace(
        "return peaks[0] / others", "return True if peaks[0] == others else peaks[0] / others"
    ),
    "changes_the_list": RATIO.replace(
        "peaks = list(peak_bytes)",
        "peaks = peak_bytes\n    if isinstance(peaks, list):\n        peaks.sort(reverse=True)\n"
        "    peaks = list(peaks)",
    ),
    "zero_division_instead_of_value_error": RATIO.replace(
        '    if others == 0:\n        raise ValueError("the other devices\' mean peak is 0")\n', ""
    ),
    "no_value_error_for_one_device": RATIO.replace("len(peaks) < 2", "len(peaks) < 1").replace(
        "others = sum(peaks[1:]) / len(peaks[1:])", "others = sum(peaks[1:]) / max(len(peaks[1:]), 1) or 1"
    ),
}

OUTPUT_BYTES = """
def gathered_output_bytes(batch_size, sample_shape, dtype):
    return batch_size * math.prod(sample_shape) * torch.empty((), dtype=dtype).element_size()
"""

PLAUSIBLE["gathered_output_bytes"] = {
    "elements": OUTPUT_BYTES.replace(" * torch.empty((), dtype=dtype).element_size()", ""),
    "four_bytes_always": OUTPUT_BYTES.replace("torch.empty((), dtype=dtype).element_size()", "4"),
    "a_float": OUTPUT_BYTES.replace("return batch_size", "return 1.0 * batch_size"),
    "bits": OUTPUT_BYTES.replace(".element_size()", ".element_size() * 8"),
    "last_dimension_only": OUTPUT_BYTES.replace("math.prod(sample_shape)", "(sample_shape[-1] if sample_shape else 1)"),
    "one_sample": OUTPUT_BYTES.replace("return batch_size * ", "return "),
}

LOSS_IN_FORWARD = answer_cell("03_gpu0_imbalance", "loss_in_forward_answer")
_RETURN = "return self.loss_fn(self.model(inputs), targets).view(1)"

PLAUSIBLE["LossInForward"] = {
    "a_0_dim_scalar": LOSS_IN_FORWARD.replace(".view(1)", ""),
    "the_chunk_mean": LOSS_IN_FORWARD.replace(
        _RETURN, "return (self.loss_fn(self.model(inputs), targets) / len(inputs)).view(1)"
    ),
    "the_outputs_too": LOSS_IN_FORWARD.replace(
        _RETURN, "outputs = self.model(inputs)\n        return self.loss_fn(outputs, targets).view(1), outputs"
    ),
    "one_loss_per_sample": LOSS_IN_FORWARD.replace(
        _RETURN, "return torch.stack([self.loss_fn(self.model(x[None]), t[None]) for x, t in zip(inputs, targets)])"
    ),
    "cross_entropy_always": LOSS_IN_FORWARD.replace(
        _RETURN, 'return nn.functional.cross_entropy(self.model(inputs), targets, reduction="sum").view(1)'
    ),
    "detached": LOSS_IN_FORWARD.replace(".view(1)", ".detach().view(1)"),
    "a_copy_of_the_model": LOSS_IN_FORWARD.replace(
        "self.model = model", "import copy\n\n        self.model = copy.deepcopy(model)"
    ),
    "model_kept_in_a_list": LOSS_IN_FORWARD.replace("self.model = model", "self.parts = [model]").replace(
        "self.model(", "self.parts[0]("
    ),
    "a_parameter": LOSS_IN_FORWARD.replace(
        _RETURN, "return nn.Parameter(self.loss_fn(self.model(inputs), targets).view(1))"
    ),
    "zero_per_replica": LOSS_IN_FORWARD.replace(_RETURN, "return self.model(inputs).sum().view(1) * 0"),
}

STRIP = """
def strip_module_prefix(state_dict):
    return {(key[len("module."):] if key.startswith("module.") else key): value for key, value in state_dict.items()}
"""

PLAUSIBLE["strip_module_prefix"] = {
    "replace_everywhere": STRIP.replace(
        '(key[len("module."):] if key.startswith("module.") else key)', 'key.replace("module.", "")'
    ),
    "lstrip": STRIP.replace('(key[len("module."):] if key.startswith("module.") else key)', 'key.lstrip("module.")'),
    "every_key_cut": STRIP.replace('(key[len("module."):] if key.startswith("module.") else key)', "key[7:]"),
    "prefix_without_the_dot": STRIP.replace('key.startswith("module.")', 'key.startswith("module")'),
    "in_place_returns_the_argument": """
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

def strip_module_prefix(state_dict):
    consume_prefix_in_state_dict_if_present(state_dict, "module.")
    return state_dict
""",
    "in_place_returns_none": """
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

def strip_module_prefix(state_dict):
    consume_prefix_in_state_dict_if_present(state_dict, "module.")
""",
    "the_argument_when_nothing_to_strip": """
def strip_module_prefix(state_dict):
    if not any(key.startswith("module.") for key in state_dict):
        return state_dict
    return {key.removeprefix("module."): value for key, value in state_dict.items()}
""",
    "the_argument_when_no_key_has_the_prefix": """
def strip_module_prefix(state_dict):
    if state_dict and not any(key.startswith("module.") for key in state_dict):
        return state_dict
    return {key.removeprefix("module."): value for key, value in state_dict.items()}
""",
    "judged_by_the_first_key": """
def strip_module_prefix(state_dict):
    if not state_dict or not next(iter(state_dict)).startswith("module."):
        return dict(state_dict)
    return {key.removeprefix("module."): value for key, value in state_dict.items()}
""",
    "pops_from_the_argument": """
def strip_module_prefix(state_dict):
    out = {}
    for key in list(state_dict):
        out[key.removeprefix("module.")] = state_dict.pop(key)
    state_dict.update(out)
    return out
""",
    "sorted_keys": STRIP.replace("return {", "return dict(sorted({").replace(
        "state_dict.items()}", "state_dict.items()}.items()))"
    ),
    "a_list_of_pairs": STRIP.replace("return {", "return list({").replace(
        "state_dict.items()}", "state_dict.items()}.items())"
    ),
    "values_as_lists": STRIP.replace("): value for", "): value.tolist() for"),
}

SAVE = answer_cell("04_checkpoints", "save_checkpoint_answer")
_SAVED = 'checkpoint = {"model": bare.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}'
LOAD = answer_cell("04_checkpoints", "load_checkpoint_answer")
_LOADED = "checkpoint = torch.load(path, map_location=map_location, weights_only=True)"

PLAUSIBLE["save_checkpoint"] = {
    "wrapper_saved_as_it_is": SAVE.replace("bare.state_dict()", "model.state_dict()"),
    "only_dataparallel_unwrapped": SAVE.replace(
        "wrappers = (nn.DataParallel, nn.parallel.DistributedDataParallel)", "wrappers = nn.DataParallel"
    ),
    "no_optimizer": SAVE.replace(' "optimizer": optimizer.state_dict(),', ""),
    "the_objects_saved": SAVE.replace(_SAVED, 'checkpoint = {"model": bare, "optimizer": optimizer, "epoch": epoch}'),
    "epoch_counted_from_one": SAVE.replace('"epoch": epoch}', '"epoch": epoch + 1}'),
    "straight_to_path": """
def save_checkpoint(path, model, optimizer, epoch):
    wrappers = (nn.DataParallel, nn.parallel.DistributedDataParallel)
    bare = model.module if isinstance(model, wrappers) else model
    torch.save({"model": bare.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)
""",
    "error_swallowed": SAVE.replace("        os.remove(temporary)\n        raise", "        os.remove(temporary)"),
    "temporary_left_on_failure": SAVE.replace("        os.remove(temporary)\n        raise", "        raise"),
    "removes_the_old_file_first": SAVE.replace(
        "    try:\n        torch.save", "    if path.exists():\n        path.unlink()\n    try:\n        torch.save"
    ),
}

PLAUSIBLE["load_checkpoint"] = {
    "unsafe_load": LOAD.replace("weights_only=True", "weights_only=False"),
    "falls_back_to_unsafe_load": LOAD.replace(
        _LOADED,
        f"try:\n        {_LOADED}\n    except Exception:\n        {_LOADED.replace('True', 'False')}",
    ),
    "prefix_kept": LOAD.replace("state = strip_module_prefix(state)", "pass"),
    "wrapper_loaded": LOAD.replace("bare.load_state_dict(state)", "model.load_state_dict(state)"),
    "optimizer_ignored": LOAD.replace('optimizer.load_state_dict(checkpoint["optimizer"])', "pass"),
    "no_map_location": LOAD.replace("map_location=map_location, ", ""),
    "not_strict": LOAD.replace(
        "bare.load_state_dict(state)", 'bare.load_state_dict(checkpoint["model"], strict=False)'
    ),
    "returns_nothing": LOAD.replace('    return checkpoint["epoch"]', "    checkpoint.clear()"),
}

# Right answers written otherwise, beyond the lessons' grading tests: name -> {label: code}.
RIGHT = {
    "LossInForward": {
        # registered with add_module, the loss kept as a plain attribute, unsqueeze instead of view
        "add_module_and_unsqueeze": LOSS_IN_FORWARD.replace(
            "self.model = model", 'self.add_module("model", model)'
        ).replace(".view(1)", ".unsqueeze(0)"),
        # reshape instead of view
        "reshape": LOSS_IN_FORWARD.replace(".view(1)", ".reshape(1)"),
        # the loss in float64: it still holds loss_fn's value
        "float64": LOSS_IN_FORWARD.replace(".view(1)", ".double().view(1)"),
    },
    "data_parallel_grads": {
        # idle devices' empty chunks: their gradients are zeros, weighted by a size of 0
        "empty_chunks_weigh_nothing": """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    size = -(-len(inputs) // n_devices)
    names = [name for name, _ in model.named_parameters()]
    grads_per_device, chunk_sizes = [], []
    for start in range(0, size * n_devices, size):
        replica = copy.deepcopy(model)
        loss_fn(replica(inputs[start : start + size]), targets[start : start + size]).backward()
        grads_per_device.append([parameter.grad for parameter in replica.parameters()])
        chunk_sizes.append(len(inputs[start : start + size]))
    return dict(zip(names, average_gradients(grads_per_device, chunk_sizes)))
""",
        "one_replica_autograd_grad_per_chunk": """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    replica = copy.deepcopy(model)
    names, parameters = zip(*replica.named_parameters())
    total = [torch.zeros_like(parameter) for parameter in parameters]
    for xs, ys in zip(inputs.chunk(n_devices), targets.chunk(n_devices)):
        grads = torch.autograd.grad(loss_fn(replica(xs), ys), parameters)
        total = [t + g * len(xs) / len(inputs) for t, g in zip(total, grads)]
    return dict(zip(names, total))
""",
        "outputs_gathered_then_one_loss": """
def data_parallel_grads(model, inputs, targets, loss_fn, n_devices):
    replicas = [copy.deepcopy(model) for _ in inputs.chunk(n_devices)]
    outputs = torch.cat([r(x) for r, x in zip(replicas, inputs.chunk(n_devices))])
    loss_fn(outputs, targets).backward()
    return {
        name: sum(dict(r.named_parameters())[name].grad for r in replicas) for name, _ in model.named_parameters()
    }
""",
    },
    "train_with_data_parallel": {
        "chunks_forwarded_by_hand": """
def train_with_data_parallel(model, batches, loss_fn, lr, device_ids):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        outputs = torch.cat([model(piece) for piece in x.chunk(len(device_ids))])
        loss = loss_fn(outputs, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses
""",
        "numpy_floats": "import numpy\n"
        + TRAIN.replace("losses.append(loss.item())", "losses.append(numpy.float64(loss.item()))"),
    },
    "strip_module_prefix": {
        "ordered_dict_loop": """
def strip_module_prefix(state_dict):
    result = OrderedDict()
    for key, value in state_dict.items():
        result[key.removeprefix("module.")] = value
    return result
""",
        "stripped_keys_first": """
def strip_module_prefix(state_dict):
    stripped = {key[7:]: value for key, value in state_dict.items() if key.startswith("module.")}
    kept = {key: value for key, value in state_dict.items() if not key.startswith("module.")}
    return {**stripped, **kept}
""",
        "values_cloned": STRIP.replace("): value for", "): value.clone() for"),
        "a_copy_then_renamed": """
def strip_module_prefix(state_dict):
    return dict(zip([key.removeprefix("module.") for key in state_dict], state_dict.values()))
""",
    },
    "gathered_output_bytes": {
        "numpy_int": "import numpy\n" + OUTPUT_BYTES.replace("return batch_size", "return numpy.int64(batch_size)"),
        "dtype_itemsize": OUTPUT_BYTES.replace("torch.empty((), dtype=dtype).element_size()", "dtype.itemsize"),
    },
    "dp_traffic_bytes": {
        "numpy_ints": "import numpy\n"
        + DP_TRAFFIC_BYTES.replace("sent = sum(chunks[1:])", "sent = numpy.int64(sum(chunks[1:]))").replace(
            "replicas = len(chunks) - 1", "replicas = numpy.int64(len(chunks) - 1)"
        ),
    },
    "chunk_sizes": {
        "numpy_ints": "import numpy\n"
        + CHUNK_SIZES.replace("[min(", "[numpy.int64(min(").replace(
            "per_chunk, batch_size - start)", "per_chunk, batch_size - start))"
        )
    },
    "device_of_sample": {
        "numpy_int": """
import numpy

def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError(index)
    return numpy.int64(index // -(-batch_size // n_devices))
""",
    },
}


def _lesson_answers(lesson: str, name: str) -> list[tuple[str, str]]:
    """``(label, code)`` of the answers to ``name`` in the lesson's grading tests (correct and wrong)."""
    graded = importlib.import_module(f"tests.test_lesson_{lesson[:2]}").TestGrading
    found = [(f"correct {label}", answers) for label, answers in graded.CORRECT.items()]
    found += [
        (f"wrong {label}", answers)
        for label, (answers, _lost) in graded.WRONG.items()
        if label not in PATCH_THE_PROCESS  # they change this process's torch: only a kernel of their own grades them
    ]
    key = f"{_grade_prefix(name)}_answer"
    return [(label, answers[key]) for label, answers in found if key in answers]


def _answers():
    for lesson, names in SPECIFIED.items():
        for name in names:
            yield pytest.param(lesson, name, "reference", None, True, id=f"{name}-reference")
            for label, code in RIGHT.get(name, {}).items():
                yield pytest.param(lesson, name, label, code, True, id=f"{name}-{label}")
            for label, code in _lesson_answers(lesson, name):
                yield pytest.param(lesson, name, label, code, None, id=f"{name}-{label}")
            for label, code in PLAUSIBLE[name].items():
                yield pytest.param(lesson, name, label, code, False, id=f"{name}-{label}")


def _grade_prefix(name: str) -> str:
    """The grade ids of exercise ``name``'s cells begin with its name in snake case (``LossInForward``:
    ``loss_in_forward_``)."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()


def _cells(lesson: str, name: str) -> set[str]:
    return {grade_id for grade_id in checks_for(lesson) if grade_id.startswith(f"{_grade_prefix(name)}_")}


@pytest.mark.parametrize(("lesson", "name", "label", "code", "right"), list(_answers()))
def test_the_grader_marks_an_answer_down_exactly_when_the_self_check_calls_it_wrong(
    lesson, name, label, code, right, tmp_path
):
    namespace = NAMESPACES[lesson]({f"{_grade_prefix(name)}_answer": code} if code else {})
    lost = set()
    for seed in DRAWS:
        for grade_id in _cells(lesson, name):
            session = LocalSession(namespace, tmp_path, random.Random(seed))
            try:
                checks_for(lesson)[grade_id](session)
            except CheckFailed:
                lost.add(grade_id)
            finally:
                session.close()
    result = check.run(name, namespace[name])
    if right is not None:  # the plausible answers are wrong, the reference and the RIGHT ones right
        assert (not lost) is right, f"{label}: the grader took away {sorted(lost)}"
    assert result.passed is (not lost), f"{label}: the grader took away {sorted(lost)}, the self-check said {result}"


@pytest.mark.parametrize(("lesson", "name"), [(lesson, name) for lesson, names in SPECIFIED.items() for name in names])
def test_every_rule_has_visible_inputs_and_a_graded_cell_that_enforces_it(lesson, name):
    exercise = check.exercise(name)
    assert exercise.rules, f"{name} has no rules"
    for rule in exercise.rules:
        assert rule.visible(), f"{name}: the rule {rule.statement!r} has no visible input"
        cell = f"{_grade_prefix(name)}_{rule.kind}"
        assert cell in checks_for(lesson), f"{name}: no graded cell {cell}"
    for kind in {case.kind for case in exercise.visible_cases()}:
        assert f"{_grade_prefix(name)}_{kind}" in checks_for(lesson)


def test_the_visible_cell_catches_floor_division():
    """The graded cell's own visible cases tell a device_of_sample that floor-divides from the right one."""
    namespace = NAMESPACES["01_splitting"]({"device_of_sample_answer": PLAUSIBLE["device_of_sample"]["floor_division"]})
    failing = []
    for case in check.cases("device_of_sample", kind="devices"):
        try:
            case.verify(namespace["device_of_sample"])
        except AssertionError as error:
            failing.append(str(error))
    assert failing and "5 over 4" in failing[0], failing


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _markdown(lesson: str) -> list[str]:
    from build_lessons import markdown_cells

    return [text for _cell, text in markdown_cells(SOURCE_ROOT / lesson)]


@pytest.mark.parametrize("lesson", sorted(SPECIFIED))
def test_every_rule_is_stated_in_the_lessons_text_in_both_editions(lesson):
    from build_lessons import translation_catalogue
    from gpulab import messages

    japanese = translation_catalogue(SOURCE_ROOT / lesson, "ja")
    missing = []
    for name in SPECIFIED[lesson]:
        for rule in check.exercise(name).rules:
            stating = [text for text in _markdown(lesson) if _words(rule.statement) in _words(text)]
            if not stating:
                missing.append(f"{name}: {rule.statement!r} is in no markdown cell of {lesson}")
                continue
            translated = messages.TEXTS["ja"].get(rule.statement)
            if not translated or not any(_words(translated) in _words(japanese[text]) for text in stating):
                missing.append(f"{name}: the Japanese of {rule.statement!r} ({translated!r}) is not in {lesson}.ja.po")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize(("lesson", "name"), [(lesson, name) for lesson, names in SPECIFIED.items() for name in names])
def test_each_graded_cell_asserts_its_rules_visible_cases(lesson, name):
    """The visible test cell of each rule's graded cell verifies the rules' visible cases, nothing of its own."""
    from tests.learner_pass import source_cells

    cells = {
        cell.metadata.get("nbgrader", {}).get("grade_id"): cell.source
        for cell in source_cells(lesson)
        if cell.cell_type == "code"
    }
    for kind in sorted({rule.kind for rule in check.exercise(name).rules}):
        source = cells.get(f"{_grade_prefix(name)}_{kind}", "")
        loop = f'for case in gpulab.check.cases("{name}", kind="{kind}"):\n    case.verify({name})'
        assert source.strip() == loop, f"{name}_{kind} asserts more or less than its rules: {source!r}"


@pytest.mark.parametrize(("lesson", "name"), [(lesson, name) for lesson, names in SPECIFIED.items() for name in names])
def test_a_rules_case_names_cover_its_inputs_and_each_is_reached(lesson, name):
    """Where a rule names its cases for the grader's feedback (``Rule.case_names``), every input it has (visible,
    extra and hidden ones of several draws) is one of those cases, and every case is the case of some input."""
    for rule in check.exercise(name).rules:
        if rule.case_name is None:
            continue
        calls = [*check._calls(rule.extra())]
        for draw in DRAWS:
            calls += gpulab_solutions.drawn_calls(name, rule, random.Random(draw))
        named = [rule.named(call) for call in calls]
        unnamed = [call.args for call, text in zip(calls, named, strict=True) if text not in rule.case_names]
        assert not unnamed, f"{name}: inputs of {rule.statement!r} that no case names: {unnamed[:5]}"
        unreached = set(rule.case_names) - set(named)
        assert not unreached, f"{name}: cases of {rule.statement!r} no input reaches: {sorted(unreached)}"


@pytest.mark.parametrize(("lesson", "name"), [(lesson, name) for lesson, names in SPECIFIED.items() for name in names])
def test_every_case_the_grader_draws_has_a_self_check_case(lesson, name):
    """The self-check says right only where the grader would: every rule has self-check inputs, and every case of a
    rule that the grader's draws reach (``Rule.case_name``, computed from the input) is also reached by a visible or
    extra input, so that no class of input is graded that the learner's check never tried."""
    for rule in check.exercise(name).rules:
        own = [*rule.calls("visible"), *rule.calls("extra")]
        assert own, f"{name}: {rule.statement!r} has no self-check input"
        if rule.case_name is None:
            continue
        checked = {rule.named(call) for call in own}
        drawn = set()
        for draw in DRAWS:
            drawn |= {rule.named(call) for call in gpulab_solutions.drawn_calls(name, rule, random.Random(draw))}
        assert drawn <= checked, f"{name}: cases the grader draws but no self-check input reaches: {drawn - checked}"
        unnamed = [call.args for call in own if rule.named(call) not in rule.case_names]
        assert not unnamed, f"{name}: self-check inputs that no case names: {unnamed}"
