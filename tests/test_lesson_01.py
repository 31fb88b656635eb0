"""Lesson 01 (splitting): graded the way an instructor grades it, with reference, blank, correct-but-different
and wrong submissions. Each wrong submission must lose exactly the points of the cells it gets wrong."""

from __future__ import annotations

from tests.lesson_grading import GradedLesson

LESSON = "01_splitting"

CORRECT_BUT_DIFFERENT = {
    "chunk_sizes_answer": """
import math
def chunk_sizes(batch_size, n_devices):
    if batch_size <= 0 or n_devices <= 0:
        raise ValueError("need at least one sample and one device")
    size = math.ceil(batch_size / n_devices)
    out = []
    left = batch_size
    while left > 0:
        out.append(min(size, left))
        left -= size
    return out
""",
    "device_of_sample_answer": """
def device_of_sample(index, batch_size, n_devices):
    if index < 0 or index >= batch_size:
        raise IndexError(index)
    start = 0
    for device, size in enumerate(chunk_sizes(batch_size, n_devices)):
        if index < start + size:
            return device
        start += size
""",
    "split_batch_answer": """
def split_batch(batch, n_devices):
    if torch.is_tensor(batch):
        return [piece for piece in torch.chunk(batch, n_devices, dim=0)]
    if isinstance(batch, tuple) and batch:
        return [tuple(p) for p in zip(*[split_batch(b, n_devices) for b in batch])]
    if isinstance(batch, list) and batch:
        return [list(p) for p in zip(*[split_batch(b, n_devices) for b in batch])]
    if isinstance(batch, dict) and batch:
        keys = list(batch.keys())
        columns = [split_batch(batch[k], n_devices) for k in keys]
        return [{k: column[i] for k, column in zip(keys, columns)} for i in range(len(columns[0]))]
    return [batch] * n_devices
""",
    "quiz_answers": 'quiz_answers = {"q1": "4", "q2": 1, "q3": " B "}',
}

# Each wrong submission: the answers it replaces, and the graded cells it must lose (all others: full marks).
WRONG = {
    "balanced_split_and_no_index_error_and_wrong_quiz": (
        {
            "chunk_sizes_answer": """
def chunk_sizes(batch_size, n_devices):
    if batch_size < 1 or n_devices < 1:
        raise ValueError("bad")
    sizes = [batch_size // n_devices + (1 if i < batch_size % n_devices else 0) for i in range(n_devices)]
    return [s for s in sizes if s > 0]
""",
            "device_of_sample_answer": """
def device_of_sample(index, batch_size, n_devices):
    per_chunk = -(-batch_size // n_devices)
    return index // per_chunk
""",
            "quiz_answers": 'quiz_answers = {"q1": 4, "q2": 1, "q3": "a"}',
        },
        {"chunk_sizes_sizes", "chunk_sizes_tiny_and_invalid", "device_of_sample_out_of_range", "quiz_q3"},
    ),
    "no_value_error_and_proportional_devices_and_flat_split": (
        {
            "chunk_sizes_answer": """
def chunk_sizes(batch_size, n_devices):
    per_chunk = -(-batch_size // max(n_devices, 1))
    return [min(per_chunk, batch_size - start) for start in range(0, max(batch_size, 0), max(per_chunk, 1))]
""",
            "device_of_sample_answer": """
def device_of_sample(index, batch_size, n_devices):
    if not 0 <= index < batch_size:
        raise IndexError(index)
    return index * n_devices // batch_size
""",
            "split_batch_answer": """
def split_batch(batch, n_devices):
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(n_devices))
    return [batch for _ in range(n_devices)]
""",
            "quiz_answers": 'quiz_answers = {"q1": 3, "q2": 2, "q3": "b"}',
        },
        {
            "chunk_sizes_tiny_and_invalid",
            "device_of_sample_devices",
            "split_batch_containers",
            "split_batch_others_and_tiny",
            "quiz_q1",
            "quiz_q2",
        },
    ),
    "split_pads_idle_devices": (
        {
            "split_batch_answer": """
def split_batch(batch, n_devices):
    if isinstance(batch, torch.Tensor):
        pieces = list(batch.chunk(n_devices))
        return pieces + [batch[:0]] * (n_devices - len(pieces))
    if isinstance(batch, (tuple, list)) and batch:
        return [type(batch)(p) for p in zip(*(split_batch(b, n_devices) for b in batch))]
    if isinstance(batch, dict) and batch:
        return [dict(zip(batch, p)) for p in zip(*(split_batch(v, n_devices) for v in batch.values()))]
    return [batch for _ in range(n_devices)]
""",
        },
        {"split_batch_tensors", "split_batch_containers", "split_batch_others_and_tiny"},
    ),
}


class TestGrading(GradedLesson):
    LESSON = LESSON
    MIN_GRADED_CELLS = 10
    CORRECT = {"different": CORRECT_BUT_DIFFERENT}
    WRONG = WRONG
