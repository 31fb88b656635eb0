"""Lesson 03 (``03_gpu0_imbalance``): the verdicts of its graded test cells, decided in the grader's process.

Every exercise of the lesson is judged by its rules (``gpulab.exercises.gpu0_imbalance``, ``rules.enforce``): each
rule's visible inputs (those the learner's cell asserts) and hidden ones drawn under the same rule with
``session.rng``. Every check compares what the notebook's code gives with references computed here: the bytes of a
tensor on the ``meta`` device (or of DataParallel's gathered output, when this process sees two GPUs), exact
fractions, the bytes of one DataParallel step counted from the sizes as ``gpulab.transfers.ROUTES`` routes each
stage (and, for drawn steps small enough to run, as ``gpulab.traffic`` counts them), a ring all-reduce played step
by step (and counted, for rings too large to play), and the full-batch loss and gradients, and each chunk's loss
(``Tensor.chunk``), of ``LossInForward``'s scenarios.
``LossInForward`` runs only in the kernel (the rules' adapters), wrapped as the lesson wraps it (``nn.DataParallel``
on two GPUs or more, else ``gpulab.DataParallel``). Device 0's peak memory could only be measured there, where
learner code could report any number: ``loss_in_forward_memory`` judges instead what the wrapped module returns,
the numbers device 0 receives: one per replica, that replica's own chunk loss.
"""

from __future__ import annotations

import warnings

import torch
from gpulab.check import Call
from torch import nn

from autograder.checks import Opaque, Outcome, check, expect
from autograder.checks.quiz import register_quiz
from autograder.checks.rules import enforce, statement


# --------------------------------------------------------------------------------------------- gathered_output_bytes
def output_bytes(notebook, workdir, cases):
    """Probe: ``gathered_output_bytes(batch, shape, dtype)`` per ``[batch, shape, is_size, dtype name]`` (the shape
    a tuple, or a ``torch.Size`` when ``is_size``); per case ``["int", int(v)]`` (an integral number, not a bool),
    ``["other", type name]`` or ``["raised", exception MRO names]``."""
    import numbers

    import torch

    if "gathered_output_bytes" not in notebook:
        return ["missing"]
    function = notebook["gathered_output_bytes"]
    results = []
    for batch, shape, is_size, dtype_name in cases:
        dtype = getattr(torch, dtype_name)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"{dtype_name} is not a torch dtype")
        try:
            value = function(batch, torch.Size(shape) if is_size else tuple(shape), dtype)
        except Exception as error:  # noqa: BLE001 - the learner's exception is the outcome
            results.append(["raised", [c.__name__ for c in type(error).__mro__]])
            continue
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            results.append(["int", int(value)])
        else:
            results.append(["other", type(value).__name__])
    return results


def data_parallel_output_bytes(batch: int, shape: tuple, dtype: torch.dtype) -> int:
    """The bytes of the output ``nn.DataParallel`` gathers on GPU 0 (this process needs two GPUs)."""
    torch.manual_seed(0)
    head = nn.Linear(4, shape[-1]).cuda().to(dtype)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        out = nn.DataParallel(head, device_ids=[0, 1])(torch.randn(batch, *shape[:-1], 4, device="cuda:0").to(dtype))
    expect(out.device == torch.device("cuda", 0), "DataParallel gathers on GPU 0")
    return out.numel() * out.element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _bytes_calls(session, calls: list) -> list[Outcome]:
    """The calls of ``gathered_output_bytes`` through ``output_bytes`` (a dtype is not plain data: the kernel
    rebuilds it from its name), as outcomes: the integral value made an ``int`` there, any other value opaque."""
    encoded = [[b, list(s), type(s) is torch.Size, _dtype_name(d)] for b, s, d in (call.args for call in calls)]
    results = session.run(output_bytes, cases=encoded)
    if results == ["missing"]:
        return [Outcome("gathered_output_bytes", missing=True) for _ in calls]
    expect(type(results) is list and len(results) == len(calls), "the kernel's answer is malformed")
    outcomes = []
    for got in results:
        expect(type(got) is list and len(got) == 2 and got[0] in ("int", "other", "raised"), "malformed answer")
        if got[0] == "raised":
            names = got[1]
            expect(type(names) is list and len(names) > 0 and all(type(n) is str for n in names), "malformed")
            outcomes.append(Outcome("gathered_output_bytes", raised=names[0], raised_types=tuple(names)))
        elif got[0] == "int":
            expect(type(got[1]) is int, "the kernel's answer is malformed")
            outcomes.append(Outcome("gathered_output_bytes", returned=got[1]))
        else:
            outcomes.append(Outcome("gathered_output_bytes", returned=Opaque(str(got[1]))))
    return outcomes


def _on_gpus(session, batch: int, shape: tuple, dtype: torch.dtype) -> None:
    """On the grader's GPUs: the bytes of the output ``nn.DataParallel`` itself gathers."""
    if torch.cuda.device_count() >= 2:
        want = data_parallel_output_bytes(batch, shape, dtype)
        (outcome,) = _bytes_calls(session, [Call((batch, shape, dtype))])
        got = outcome.value
        on_gpus = statement("gathered_output_bytes", "float32")  # the rule, against DataParallel's own output
        expect(
            type(got) is int and got == want, f"gathered_output_bytes({batch}, {shape}, {dtype}) on two GPUs", on_gpus
        )


# gathered_output_bytes's rules and references (a tensor of the gathered shape on the meta device) are declared
# once, in gpulab.exercises.gpu0_imbalance; on the grader's GPUs, DataParallel's own gathered output too.
@check("gathered_output_bytes_float32")
def gathered_output_bytes_float32(session) -> None:
    enforce(session, "gathered_output_bytes", "float32", calls=_bytes_calls)
    _on_gpus(session, 33, (1000,), torch.float32)


@check("gathered_output_bytes_dtypes_shapes")
def gathered_output_bytes_dtypes_shapes(session) -> None:
    enforce(session, "gathered_output_bytes", "dtypes_shapes", calls=_bytes_calls)
    _on_gpus(session, 10, (6, 300), torch.float16)


# --------------------------------------------------------------------------------------------- imbalance_ratio
# imbalance_ratio's rules and references (exact fractions) are declared once, in gpulab.exercises.gpu0_imbalance.
@check("imbalance_ratio_ratio")
def imbalance_ratio_ratio(session) -> None:
    enforce(session, "imbalance_ratio", "ratio")


@check("imbalance_ratio_errors")
def imbalance_ratio_errors(session) -> None:
    enforce(session, "imbalance_ratio", "errors")


# --------------------------------------------------------------------------------------------- LossInForward
# LossInForward's rules, scenarios and references are declared once, in gpulab.exercises.gpu0_imbalance: each input
# is plain data (a seed, a batch size, a loss function's name, layer sizes); the kernel runs the rule's adapter
# around the notebook's class (called directly, wrapped in DataParallel on the scenario's devices: nn.DataParallel
# itself where the kernel has enough GPUs, or run backward) and sends back what it returned, which is compared here
# with the rule's reference computed in this process on one device. Device 0's peak memory could only be measured
# in the kernel, where learner code could report any number: the memory cell judges instead what DataParallel
# gathers on device 0, one number per replica, that replica's own chunk loss.
@check("loss_in_forward_value")
def loss_in_forward_value(session) -> None:
    enforce(session, "LossInForward", "value")


@check("loss_in_forward_gradients")
def loss_in_forward_gradients(session) -> None:
    enforce(session, "LossInForward", "gradients")


@check("loss_in_forward_memory")
def loss_in_forward_memory(session) -> None:
    enforce(session, "LossInForward", "memory")


# --------------------------------------------------------------------------------------------- dp_traffic_bytes
# dp_traffic_bytes's rules and inputs are declared once, in gpulab.exercises.gpu0_imbalance, their references in
# gpulab_solutions (the bytes counted from the sizes, under PyTorch's copies and under NCCL); each cell enforces its
# rules on their visible inputs and on hidden ones drawn here: steps small enough to run, whose expected bytes
# gpulab.traffic also counts in this process, and steps far too large to run (a trillion parameters, 100,000
# devices and more), which only an answer that counts finishes within the cell's time.
@check("dp_traffic_bytes_forward")
def dp_traffic_bytes_forward(session) -> None:
    enforce(session, "dp_traffic_bytes", "forward")


@check("dp_traffic_bytes_backward")
def dp_traffic_bytes_backward(session) -> None:
    enforce(session, "dp_traffic_bytes", "backward")


@check("dp_traffic_bytes_idle_devices")
def dp_traffic_bytes_idle_devices(session) -> None:
    enforce(session, "dp_traffic_bytes", "idle_devices")


# --------------------------------------------------------------------------------------------- ring_all_reduce_bytes
# ring_all_reduce_bytes's rules are declared once, in gpulab.exercises.gpu0_imbalance; its hidden inputs come with
# the bytes of a ring played on a random cut of the tensor, computed here (the total does not depend on the cut),
# and, for rings of 100,000 ranks and more, far too large to play, with the bytes counted (gpulab_solutions).
@check("ring_all_reduce_bytes_total")
def ring_all_reduce_bytes_total(session) -> None:
    enforce(session, "ring_all_reduce_bytes", "total")


@check("ring_all_reduce_bytes_errors")
def ring_all_reduce_bytes_errors(session) -> None:
    enforce(session, "ring_all_reduce_bytes", "errors")


# --------------------------------------------------------------------------------------------- quiz
register_quiz(__name__, "03_gpu0_imbalance")  # quiz_q1...: the declaration in gpulab.exercises.quizzes
