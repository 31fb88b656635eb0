"""DDP from a notebook: run a function on N ranks, one process each, and get back what every rank returned.

Lessons 02 ("gradient averaging": DDP's all-reduce run for real), 03 (DDP's balanced memory and step times)
and 04 (saving from rank 0 only) call::

    from ddp_steps import train              # a .py file next to the notebook (see below)
    results = gpulab.ddp.launch(train, 2)     # train(rank, world_size) on 2 ranks; [result of rank 0, rank 1]

``launch`` starts one Python process per rank (start method *forkserver*, below), gives each a ``torch.distributed``
process group (NCCL with one GPU per rank when there are enough GPUs, gloo on the CPU otherwise), calls
``fn(rank, world_size, *args)``, destroys the group and hands back the return values in rank order.

Why the function must live in a ``.py`` module
    A spawned process is a new interpreter: it receives ``fn`` *by name* (``module.qualname``) and imports it.
    A function typed into a notebook cell lives in ``__main__``, which the new process cannot import, and a
    lambda or a function nested in another has no importable name at all. ``launch`` checks this before any
    process starts and says how to fix it: write the function to a file with ``%%writefile ddp_steps.py`` and
    ``from ddp_steps import train``.

Where the ranks come from: a fork server
    Never a fork of the notebook's kernel: CUDA must not be initialised before a fork, and a fork after torch
    has run a multithreaded operation (or of a kernel's own threads) can hang the child. The first launch starts
    multiprocessing's *fork server*: a fresh interpreter that imports torch (with ``torch._dynamo``, which DDP's
    constructor imports) and gpulab once (``PRELOADED``), touches no GPU and runs no torch operation; every rank
    is forked from it. So each rank starts in a fraction of a second instead of importing torch itself (about
    2.5 s of CPU per rank measured on the 2-core CI machine; lessons 02-04 and grading launch 2 ranks), and a
    second launch in the same kernel starts nothing slow at all. As with *spawn*, a rank shares nothing with the
    notebook: it receives ``fn`` by name, the notebook's current ``sys.path`` and working folder
    (multiprocessing's preparation data) and its current environment variables (``launch`` passes them, and a
    rank deletes those the notebook deleted since the server started). The server lives as long as the kernel,
    like multiprocessing's resource tracker, and ends with it. A server that something else ended and collected
    (a clean-up that kills every process below the kernel) is replaced at the next launch. The grader's kernels
    (``python -m gpulab.kernel``) fork the server from themselves as they start (``start_fork_server_here``),
    so that its imports are the kernel's own instead of a second time.

The same function under ``torchrun``
    Nothing in ``fn`` depends on ``launch``: each rank reads ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` from
    its environment exactly as ``torchrun`` sets them. To run the same training function on many GPUs or
    nodes, put this in a script and start it with ``torchrun`` (see ``run_under_torchrun``)::

        # train_ddp.py
        from gpulab import ddp
        from ddp_steps import train

        if __name__ == "__main__":
            ddp.run_under_torchrun(train)

        $ torchrun --standalone --nproc-per-node=2 train_ddp.py                  # one machine, 2 GPUs
        $ torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d \\
              --rdzv-endpoint=HOST:29400 train_ddp.py                             # 2 machines, 8 GPUs each

Machinery
    ``launch`` is built on ``torch.distributed.elastic.multiprocessing.start_processes``, the engine behind
    ``torchrun`` (and accelerate's ``notebook_launcher``): it starts the ranks, carries return values back,
    and each rank's stdout is shown here prefixed with ``[rank N]``. On top of it this module adds what a
    notebook needs: checks before anything starts, a line that counts the seconds while the ranks start and
    run (in a notebook; in a terminal while they start; none in a log), a free port, a readable error naming the
    rank that failed (with its traceback), a kernel interrupt that ends every rank, and no process left behind in
    any case.
    Only public torch APIs are used (``start_processes``, ``DefaultLogsSpecs``, ``Std``, ``SignalException``,
    ``PContext.wait``, ``PContext.close``, ``PContext.pids``, ``RunProcsResult``, ``ProcessFailure``); the
    test suite checks that their parameters are still the ones used here.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import gc
import importlib
import inspect
import io
import json
import logging
import multiprocessing
import multiprocessing.util
import os
import pickle
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std, start_processes

from gpulab.messages import message

__all__ = [
    "NotImportableError",
    "RankFailedError",
    "all_reduce_demo",
    "default_backend",
    "launch",
    "run_under_torchrun",
    "start_fork_server_here",
]

LOOPBACK_ADDRESS = "127.0.0.1"
DEFAULT_TIMEOUT_S = 600.0
PORT_ATTEMPTS = 3  # a port found free can be taken by someone else before rank 0 binds it: try a fresh one
POLL_INTERVAL_S = 0.05
SHUTDOWN_GRACE_S = 5  # seconds a rank gets to exit after SIGTERM before SIGKILL
STDERR_TAIL_LINES = 20
PROGRESS_TICK_S = 0.25  # how often the start line looks at the clock and the ranks
OUTPUT_CHOICES = ("stdout", "all", "none")

_MAIN_MODULE_NAMES = ("__main__", "__mp_main__")
# Signals torch's PContext.start() takes over in the calling process (see _keep_signal_handlers).
_SIGNALS_TORCH_TAKES_OVER = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
# Loggers that repeat, at WARNING/ERROR level, what RankFailedError already says.
_TORCH_LAUNCH_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn")
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# The ranks' start method, and what the fork server imports once for every rank it forks (module docstring).
START_METHOD = "forkserver"
PRELOADED = ("torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "gpulab", "gpulab.ddp")


class NotImportableError(TypeError):
    """``fn`` (or an argument) cannot be imported by name in a fresh process, so it cannot run there.

    What a learner meets in lesson 02 on launching a function typed into a notebook cell; the message shows
    the ``%%writefile`` fix.
    """


class RankFailedError(RuntimeError):
    """A rank failed: it raised an exception, was killed, or exited without returning (lessons 02-04).

    ``rank`` is the rank that failed first, ``exitcode`` its process exit code (negative: killed by that
    signal; ``None`` when unknown), ``rank_traceback`` the traceback text it raised (``None`` when it died
    without a Python exception).
    """

    def __init__(self, message: str, *, rank: int, exitcode: int | None, rank_traceback: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.rank_traceback = rank_traceback


class _PortTakenError(Exception):
    """Rank 0 could not listen on the chosen port: launch again on another one."""


@dataclass(frozen=True)
class _RankOptions:
    """What ``launch`` tells each rank besides ``fn`` and its arguments."""

    backend: str
    threads_per_rank: int | None
    timeout_s: float | None
    report_dir: str
    parent_pid: int
    environment: frozenset[str]  # the names of the variables a rank keeps: the notebook's now, and torchrun's


# ----------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------


def default_backend(local_world_size: int) -> str:
    """The process-group backend for ``local_world_size`` ranks on this machine (lessons 02-04).

    ``"nccl"`` when there is one CUDA GPU per rank (each rank then uses GPU ``LOCAL_RANK``), else ``"gloo"``:
    gloo runs collectives on CPU tensors, and on CUDA tensors too when several ranks share one GPU.
    """
    enough_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size
    return "nccl" if enough_gpus and dist.is_nccl_available() else "gloo"


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    threads_per_rank: int | None = 1,
    output: str = "stdout",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks and return their results in rank order.

    Used by lesson 02 (DDP's all-reduce gives every rank the full-batch gradient), lesson 03 (DDP's memory and
    step times per rank) and lesson 04 (only rank 0 saves the checkpoint).

    Each rank is a fresh process (spawn) with a ``torch.distributed`` process group already initialised, and
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set as ``torchrun`` sets
    them; the group is destroyed after ``fn`` returns.

    Args:
        fn: a function defined at the top level of an importable ``.py`` module (not in the notebook: see the
            module docstring). It receives ``rank, world_size, *args``; what it returns must be picklable.
        world_size: number of ranks (processes), at least 1.
        *args: passed to ``fn`` on every rank; must be picklable.
        backend: ``"nccl"`` or ``"gloo"``; by default ``default_backend(world_size)``. With NCCL, each rank
            is pinned to GPU ``LOCAL_RANK`` (``torch.cuda.set_device``; ``r`` for rank ``r`` on one machine).
            NCCL is refused, before any process starts, when a GPU the ranks need is in exclusive-process
            compute mode and this process already uses it (``exclusive_gpus_held_here``).
        timeout: seconds allowed for the whole run (also the process group's collective timeout); on expiry
            every rank is ended and ``TimeoutError`` is raised. ``None``: no limit.
        threads_per_rank: ``torch.set_num_threads`` in each rank (1 keeps N ranks from fighting over the CPU
            cores); ``None`` leaves torch's default.
        output: ``"stdout"`` shows each rank's printed output here, prefixed ``[rank N]``, and keeps stderr
            for error messages (stock nbgrader gives no points to a test cell that writes to stderr); ``"all"``
            shows stderr too; ``"none"`` shows nothing.

    Raises:
        ValueError: ``world_size < 1`` or another bad option, before any process starts.
        NotImportableError: ``fn`` lives in the notebook (``__main__``), is a lambda or a nested function, or
            an argument refers to something defined in the notebook; before any process starts.
        TypeError: an argument cannot be pickled; before any process starts.
        RankFailedError: a rank raised (the message names the rank and holds its traceback), was killed, or
            exited without returning. Every other rank is ended first.
        TimeoutError: the run took longer than ``timeout``.
        KeyboardInterrupt: the kernel was interrupted; every rank is ended first.
    """
    _check_world_size(world_size)
    _check_options(timeout=timeout, threads_per_rank=threads_per_rank, output=output)
    _check_importable(fn)
    _check_picklable(args)
    chosen_backend = backend or default_backend(world_size)
    _check_backend(chosen_backend, world_size)
    for _ in range(PORT_ATTEMPTS):
        try:
            return _launch_on_port(
                fn,
                world_size,
                args,
                port=_find_free_port(),
                backend=chosen_backend,
                timeout=timeout,
                threads_per_rank=threads_per_rank,
                output=output,
            )
        except _PortTakenError:
            continue
    raise RuntimeError(f"gpulab.ddp.launch: rank 0 found its port taken {PORT_ATTEMPTS} times; giving up")


def run_under_torchrun(
    fn: Callable[..., Any],
    *args: Any,
    backend: str | None = None,
    timeout: float | None = None,
    threads_per_rank: int | None = None,
) -> Any:
    """Run ``fn(rank, world_size, *args)`` in a process started by ``torchrun``; return this rank's result.

    The command-line twin of ``launch``, for the ``torchrun`` command lessons 02-04 show for real clusters
    (many GPUs or nodes): it reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` from the
    environment, initialises the process group (NCCL pinned to GPU ``LOCAL_RANK`` when this machine has a GPU
    per local rank, else gloo), calls ``fn`` and destroys the group. Call it from a script::

        # train_ddp.py
        from gpulab import ddp
        from ddp_steps import train

        if __name__ == "__main__":
            ddp.run_under_torchrun(train, 5)        # train(rank, world_size, 5) on every rank

        $ torchrun --standalone --nproc-per-node=2 train_ddp.py

    ``torchrun`` already sets ``OMP_NUM_THREADS=1``; ``threads_per_rank`` can override it.
    """
    missing = [name for name in ("RANK", "WORLD_SIZE") if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"run_under_torchrun: {', '.join(missing)} not set; this process was not started by torchrun. "
            "Start the script with `torchrun --standalone --nproc-per-node=2 script.py`, "
            "or call gpulab.ddp.launch(fn, world_size) from a notebook."
        )
    return _run_in_process_group(
        fn, args, backend=backend, timeout_s=timeout, threads_per_rank=threads_per_rank, phase=[""]
    )


def local_device() -> torch.device:
    """This rank's own device: GPU ``LOCAL_RANK`` under NCCL, else the CPU (lessons 02-04's DDP modules).

    The CUDA index of a rank is its *local* rank, never its global rank: under
    ``torchrun --nnodes=2 --nproc-per-node=8`` ranks 8-15 run on the second machine's GPUs 0-7, and ``cuda:8``
    does not exist there. (Found by reading: the lessons' DDP modules used ``cuda:{rank}``.) ``launch`` and
    ``run_under_torchrun`` have already pinned the process to this GPU with ``torch.cuda.set_device``.
    """
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return torch.device("cpu")


def all_reduce_demo(rank: int, world_size: int) -> dict[str, Any]:
    """Each rank holds ``rank + 1``; after ``all_reduce(SUM)`` every rank holds ``1 + 2 + ... + world_size``.

    The smallest picture of DDP's gradient averaging (lesson 02): the all-reduce DDP runs on gradients, here
    on one number. ``gpulab.ddp.launch(gpulab.ddp.all_reduce_demo, 2)`` also checks that launching works.
    """
    # NCCL reduces GPU tensors only: keep the number on this rank's GPU there, on the CPU for gloo.
    device = local_device()
    value = torch.tensor([float(rank + 1)], device=device)
    before = value.item()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return {"rank": rank, "before": before, "after": value.item(), "backend": dist.get_backend()}


# ----------------------------------------------------------------------------------------------------------
# Checks made before any process starts
# ----------------------------------------------------------------------------------------------------------


def _check_world_size(world_size: Any) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be a whole number of ranks, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")


def _check_options(*, timeout: float | None, threads_per_rank: int | None, output: str) -> None:
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    if threads_per_rank is not None and (not isinstance(threads_per_rank, int) or threads_per_rank < 1):
        raise ValueError(f"threads_per_rank must be a whole number >= 1 or None, got {threads_per_rank!r}")
    if output not in OUTPUT_CHOICES:
        raise ValueError(f"output must be one of {OUTPUT_CHOICES}, got {output!r}")


def _check_backend(backend: str, world_size: int) -> None:
    if "nccl" in backend and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"backend {backend!r} needs one CUDA GPU per rank: {world_size} ranks, "
            f"{torch.cuda.device_count()} GPU(s) here. Use backend='gloo' (CPU, or ranks sharing a GPU)."
        )
    if "nccl" in backend:
        held = exclusive_gpus_held_here(world_size)
        if held:
            raise RuntimeError(
                f"GPU(s) {held} are in exclusive-process compute mode and this process (the notebook's kernel) "
                "already uses them, so a DDP rank cannot open them. Restart the kernel and launch DDP before "
                "using those GPUs here, or use backend='gloo'."
            )


def exclusive_gpus_held_here(world_size: int) -> list[int]:
    """The GPUs the ranks would use (0 .. world_size-1) that are in ``EXCLUSIVE_PROCESS`` compute mode while this
    process already holds memory on them (lessons 03-04 run DataParallel before DDP): a rank, another process,
    could not open them. Empty when NVML cannot tell (no driver library, no GPU)."""
    from gpulab.bench import devices_in_use

    held = [index for index in devices_in_use() if index < world_size]
    if not held:
        return []
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - without NVML nothing can be said before the ranks try
        return []
    try:
        from gpulab import nvml

        exclusive = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
        return [index for index in held if pynvml.nvmlDeviceGetComputeMode(nvml.handle(pynvml, index)) == exclusive]
    except Exception:  # noqa: BLE001
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _how_to_fix(name: str) -> str:
    return message("ddp.how_to_fix", name=name)


def _importability_problem(fn: Any) -> str | None:
    """Why a fresh process could not import ``fn`` by name, or ``None`` when it can."""
    if isinstance(fn, functools.partial):
        return _importability_problem(fn.func)
    if inspect.ismethod(fn):
        return _importability_problem(fn.__func__)
    target = fn if inspect.isfunction(fn) or inspect.isbuiltin(fn) or inspect.isclass(fn) else type(fn)
    module_name = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not module_name or not qualname:
        return message("ddp.no_module_and_name", target=repr(target))
    if module_name in _MAIN_MODULE_NAMES:
        return message("ddp.defined_in_main", qualname=qualname)
    if "<lambda>" in qualname:
        return message("ddp.lambda")
    if "<locals>" in qualname:
        return message("ddp.local_function", qualname=qualname)
    try:
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        return message("ddp.cannot_import", name=f"{module_name}.{qualname}", error=error)
    if found is not target:
        return message("ddp.different_object", name=f"{module_name}.{qualname}")
    return None


def _check_importable(fn: Callable[..., Any]) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__}")
    problem = _importability_problem(fn)
    if problem is not None:
        name = getattr(fn, "__name__", "train")
        name = name if name.isidentifier() else "train"
        raise NotImportableError(message("ddp.not_importable", problem=problem, fix=_how_to_fix(name)))


class _NotebookReferenceFinder(pickle.Pickler):
    """Pickles like ``pickle.dumps`` but refuses objects whose class or function lives in ``__main__``.

    ``pickle`` stores such objects by reference to ``__main__``; the parent pickles them happily and the rank
    then fails to unpickle them, before any of our code runs. Catching them here gives a readable error.
    """

    def persistent_id(self, obj: Any) -> None:
        owner = obj if isinstance(obj, type | types.FunctionType) else type(obj)
        if getattr(owner, "__module__", None) in _MAIN_MODULE_NAMES:
            name = getattr(owner, "__qualname__", repr(owner))
            fix = _how_to_fix(name if name.isidentifier() else "train")
            raise NotImportableError(message("ddp.argument_in_main", name=name, fix=fix))
        return None


def _check_picklable(args: tuple[Any, ...]) -> None:
    try:
        _NotebookReferenceFinder(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(args)
    except NotImportableError:
        raise
    except Exception as error:
        raise TypeError(
            "gpulab.ddp.launch sends its arguments to each rank with pickle, and these cannot be pickled: "
            f"{type(error).__name__}: {error}. Pass plain data (numbers, strings, tensors, lists, dicts) and "
            "build models, data loaders and open files inside fn."
        ) from error


def _find_free_port() -> int:
    """A TCP port nobody listens on right now (bind to port 0 and let the OS choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK_ADDRESS, 0))
        return probe.getsockname()[1]


# ----------------------------------------------------------------------------------------------------------
# Running the ranks (parent side)
# ----------------------------------------------------------------------------------------------------------


def _rank_environment(rank: int, world_size: int, port: int, backend: str) -> dict[str, str]:
    """The variables ``torchrun --standalone`` gives a rank, for one machine."""
    environment = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": LOOPBACK_ADDRESS,
        "MASTER_PORT": str(port),
    }
    # All ranks are on this machine: keep gloo on the loopback interface rather than whatever address the host
    # name resolves to (in containers that can be an address nobody can connect to).
    if "gloo" in backend and "GLOO_SOCKET_IFNAME" not in os.environ and sys.platform.startswith("linux"):
        if any(name == "lo" for _, name in socket.if_nameindex()):
            environment["GLOO_SOCKET_IFNAME"] = "lo"
    return environment


@contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """Undo ``PContext.start()``'s signal handlers once it returns.

    ``start()`` makes SIGINT/SIGTERM/SIGHUP/SIGQUIT raise ``SignalException`` in this process, for good. In a
    notebook kernel that would turn every later interrupt into a SignalException, so the handlers are put back
    as soon as the ranks have started: an interrupt is then the usual ``KeyboardInterrupt``.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # start() only installs handlers from the main thread
        return
    saved = {}
    for name in _SIGNALS_TORCH_TAKES_OVER:
        number = getattr(signal, name, None)
        if number is not None:
            saved[number] = signal.getsignal(number)
    try:
        yield
    finally:
        for number, handler in saved.items():
            if handler is not None:
                signal.signal(number, handler)


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Ignore a second Ctrl-C / kernel interrupt while ranks are being ended, so none is left running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _DropRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.CRITICAL


@contextmanager
def _torch_launch_logs_silenced() -> Iterator[None]:
    """torch logs each failure and each rank it terminates; RankFailedError says it once, readably."""
    drop = _DropRecords()
    loggers = [logging.getLogger(name) for name in _TORCH_LAUNCH_LOGGERS]
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)


def _launch_on_port(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...],
    *,
    port: int,
    backend: str,
    timeout: float | None,
    threads_per_rank: int | None,
    output: str,
) -> list[Any]:
    started_at = time.monotonic()
    work_dir = tempfile.mkdtemp(prefix="gpulab_ddp_")
    report_dir = os.path.join(work_dir, "reports")
    os.mkdir(report_dir)
    # The notebook's environment as it is now (the fork server's is the one it had when the server started).
    # start_processes only sets the variables it is given in the forked rank (torch/distributed/elastic/
    # multiprocessing/api.py: _wrap), so the rank also deletes those the notebook no longer has.
    envs = {rank: {**os.environ, **_rank_environment(rank, world_size, port, backend)} for rank in range(world_size)}
    options = _RankOptions(
        backend=backend,
        threads_per_rank=threads_per_rank,
        timeout_s=timeout,
        report_dir=report_dir,
        parent_pid=os.getpid(),
        environment=frozenset(envs[0]),
    )
    shown = {"stdout": Std.OUT, "all": Std.ALL, "none": Std.NONE}[output]
    logs_specs = DefaultLogsSpecs(log_dir=os.path.join(work_dir, "logs"), redirects=Std.ALL, tee=shown)
    _configure_fork_server()
    _forget_a_lost_fork_server()
    context = progress = None
    try:
        progress = _LaunchLine(world_size, _name_of(fn), report_dir, started_at, shown=output != "none")
        with _torch_launch_logs_silenced():
            try:
                with _keep_signal_handlers():
                    context = start_processes(
                        name="gpulab-ddp",
                        entrypoint=_rank_main,
                        args={rank: (fn, args, options) for rank in range(world_size)},
                        envs=envs,
                        logs_specs=logs_specs,
                        log_line_prefixes={rank: f"[rank {rank}] " for rank in range(world_size)},
                        start_method=START_METHOD,
                    )
            except SignalException as interrupted:
                if interrupted.sigval == signal.SIGINT:
                    raise KeyboardInterrupt from interrupted
                raise
            result = _wait_for_ranks(context, fn, world_size, started_at, timeout)
            with _sigint_deferred():
                # every rank has exited or is ended here: the reports and logs are complete
                context.close(timeout=SHUTDOWN_GRACE_S)
            if result.is_failed():
                raise _failure_error(fn, world_size, result, _read_reports(report_dir))
            return [result.return_values[rank] for rank in range(world_size)]
    finally:
        if progress is not None:
            progress.close()
        if context is not None:
            with _sigint_deferred(), _torch_launch_logs_silenced():
                # ends every rank still running: SIGTERM, then SIGKILL after the grace period
                context.close(timeout=SHUTDOWN_GRACE_S)
        shutil.rmtree(work_dir, ignore_errors=True)


def _configure_fork_server() -> None:
    """What the fork server imports (``PRELOADED``, used when it starts) and where it listens, for ``launch`` and
    ``start_fork_server_here`` alike. Python 3.9.0-3.9.15 and 3.10.0-3.10.8 put the server's socket in Linux's
    abstract namespace, which has no permissions: anyone on the machine (other learners on a class server) could
    send it a pickle to run as this learner (CVE-2022-42919). Later versions use a file only its owner can open;
    this makes the older ones do so."""
    multiprocessing.get_context(START_METHOD).set_forkserver_preload(list(PRELOADED))
    multiprocessing.util.abstract_sockets_supported = False


def _forget_a_lost_fork_server() -> None:
    """Make multiprocessing start a new fork server when the one it remembers is no longer this process's child.

    multiprocessing checks its server with ``waitpid``, which raises ``ChildProcessError`` (and so would every
    later launch in this kernel) when something else collected the server's exit: a clean-up that kills and
    reaps every process below the kernel, for example. That server is gone; forgetting it lets ``ensure_running``
    start a new one."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    try:
        ended = os.waitpid(pid, os.WNOHANG)[0] == pid  # collected here, so multiprocessing's own check would raise
    except ChildProcessError:
        ended = True
    if not ended:
        return
    with server._lock:
        with suppress(OSError, TypeError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
        if hasattr(server, "_forkserver_authkey"):  # Pythons whose server checks a key: the key goes with it
            server._forkserver_authkey = None


def start_fork_server_here() -> bool:
    """Start the fork server ``launch`` uses as a fork of this process instead of a new interpreter (``gpulab.kernel``:
    the grader's kernels). Its imports (``PRELOADED``) are then this process's, made once for both: about 4 s of
    CPU less for every kernel that launches DDP. Done only while no Python thread but this one runs (``import
    torch`` starts one of its own, as in a server started anew) and before anything touches a GPU: the state the
    server itself forks ranks in. The server is what ``launch`` would have started (multiprocessing's
    ``ForkServer.ensure_running`` makes its socket, file mode 0600, and keep-alive pipe), running the same code
    with the same files open and multiprocessing's lock free; ``launch`` then finds it running. multiprocessing's
    resource tracker, which ``ensure_running`` starts first, is started as usual, a small new interpreter. Returns
    whether it started one (False on any failure: ``launch`` then starts one as usual)."""
    if threading.active_count() != 1 or not sys.platform.startswith("linux"):
        return False
    from multiprocessing import forkserver, resource_tracker, util

    try:
        for name in PRELOADED:
            importlib.import_module(name)
        _configure_fork_server()
        resource_tracker.ensure_running()  # a new interpreter of its own, before the fork below is put in place
        spawn = util.spawnv_passfds
        util.spawnv_passfds = functools.partial(_fork_running, spawn)
        try:
            forkserver.ensure_running()
        finally:
            util.spawnv_passfds = spawn
    except Exception:  # noqa: BLE001 - no server started here: launch starts one the usual way
        _forget_a_lost_fork_server()
        return False
    return getattr(forkserver._forkserver, "_forkserver_pid", None) is not None


FORK_SERVER_COMMAND = "from multiprocessing.forkserver import main"


def _fork_running(spawn: Callable[..., int], path: str, args: list[str], passfds: list[int]) -> int:
    """``multiprocessing.util.spawnv_passfds(path, args, passfds)`` for the fork server's command without the new
    interpreter: a fork of this process runs the command's code (``python ... -c CODE``) with only ``passfds`` and
    the standard streams open, as the new interpreter would, and the lock ``ensure_running`` holds while it starts
    the server made free again (a rank that starts a fork server of its own would otherwise wait on it for ever).
    Any other command goes to ``spawn``."""
    code = args[args.index("-c") + 1] if "-c" in args else ""
    if not code.startswith(FORK_SERVER_COMMAND):
        return spawn(path, args, passfds)
    compiled = compile(code, "<fork server>", "exec")
    pid = os.fork()
    if pid:
        return pid
    status = 0
    try:
        from multiprocessing import forkserver

        forkserver._forkserver._lock = threading.Lock()
        for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
            if fd > 2 and fd not in passfds:
                with suppress(OSError):
                    os.close(fd)
        exec(compiled, {"__name__": "__main__"})  # noqa: S102 - multiprocessing's own command for its server
    except SystemExit:
        pass
    except BaseException:  # noqa: BLE001 - said on stderr, as the interpreter would
        traceback.print_exc()
        status = 1
    finally:
        os._exit(status)


def _ready_marker(report_dir: str, rank: int) -> str:
    """The file a rank leaves as soon as its process runs ``_rank_main`` (torch is imported by then)."""
    return os.path.join(report_dir, f"rank{rank}.ready")


def _mark_ready(report_dir: str, rank: int) -> None:
    try:
        open(_ready_marker(report_dir, rank), "w").close()
    except OSError:
        pass  # only the start line misses it


class _LaunchLine:
    """One line that counts the seconds of a launch and says where it is: "starting 2 ranks… 12 s, ready: rank 0"
    while the ranks start, then "2 ranks running train… 15 s" until their results are back (lessons 02-04).

    A launch can sit for ten seconds and more on a loaded machine: the first launch in a kernel starts the fork
    server, which imports torch, and ``start_processes`` waits for it; then each rank creates its process group and
    runs ``fn`` (lesson 03's launch cell, a kernel's first launch, took 9.5-15.5 s at load 7.6-9.8 on 2 cores,
    2.4-3.7 s of it after every rank was up: ``benchmarks/results/lesson_launches_cpu.json``). A thread keeps the
    line up to date (``start_processes`` and the wait for the ranks block the caller meanwhile), in the caller's
    context so that a notebook's display goes to the launching cell. In a notebook the line is a display updated in
    place (never stderr, which costs a graded cell its points) and cleared when the launch returns, so that an
    executed or graded notebook keeps no trace of it; the ranks' printed output comes after it in the cell. In a
    terminal it is a line on stderr rewritten with a carriage return, wiped once every rank runs, since the ranks'
    own output then goes to the same screen; where stderr is a file or a pipe (logs), nothing.
    """

    def __init__(self, world_size: int, function: str, report_dir: str, started_at: float, *, shown: bool = True):
        self.world_size = world_size
        self.function = function
        self.report_dir = report_dir
        self.started_at = started_at
        self.ready: list[int] = []
        self.last_line = ""
        self._handle = None
        self._terminal = None
        self._lock = threading.RLock()
        self._closed = threading.Event()
        if not shown:
            return
        if _in_kernel():
            from IPython.display import display

            self._handle = display({"text/plain": ""}, raw=True, display_id=True)
        elif _is_terminal(sys.stderr):
            self._terminal = sys.stderr
        if self.active:
            self.update()
            caller = contextvars.copy_context()
            threading.Thread(target=caller.run, args=(self._tick,), name="gpulab-ddp-line", daemon=True).start()

    @property
    def active(self) -> bool:
        return self._handle is not None or self._terminal is not None

    def _tick(self) -> None:
        while not self._closed.wait(PROGRESS_TICK_S):
            self.update()

    def update(self) -> None:
        with self._lock:
            if self.active:
                self._update()

    def _update(self) -> None:
        not_ready = [rank for rank in range(self.world_size) if rank not in self.ready]
        self.ready += [rank for rank in not_ready if os.path.exists(_ready_marker(self.report_dir, rank))]
        all_running = len(self.ready) == self.world_size
        if all_running and self._terminal is not None:
            self.close()
            return
        seconds = int(time.monotonic() - self.started_at)  # the line changes once a second
        if all_running:
            line = message("ddp.running", world_size=self.world_size, function=self.function, seconds=seconds)
        else:
            line = message("ddp.starting", world_size=self.world_size, seconds=seconds)
            if self.ready:
                line += message("ddp.ready", ranks=", ".join(str(rank) for rank in sorted(self.ready)))
        if line != self.last_line:
            self._show(line)

    def _show(self, line: str) -> None:
        if self._handle is not None:
            self._handle.update({"text/plain": line}, raw=True)
        elif self._terminal is not None:
            width = max(len(self.last_line), len(line))
            self._terminal.write("\r" + line.ljust(width))
            self._terminal.flush()
        self.last_line = line

    def close(self) -> None:
        """Take the line away (the launch ended, or in a terminal every rank runs); what follows starts clean."""
        with self._lock:
            if self._handle is not None:
                self._handle.update({"text/plain": ""}, raw=True)
            elif self._terminal is not None and self.last_line:
                self._terminal.write("\r" + " " * len(self.last_line) + "\r")
                self._terminal.flush()
            self._handle = self._terminal = None
            self._closed.set()


def _in_kernel() -> bool:
    """True in a Jupyter kernel (where a display can be updated in place), False in scripts and terminals."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _wait_for_ranks(context: Any, fn: Callable, world_size: int, started_at: float, timeout: float | None):
    """Poll until every rank returned or one failed; raise on timeout or on a rank that vanished."""
    rank_pids = context.pids()
    while True:
        # A rank only exits after the parent collected every return value (it waits on an event). One that is
        # gone (checked before polling, so a failure exit code is seen by the poll) left without returning and
        # without an error code: os._exit(0).
        gone = [rank for rank, pid in rank_pids.items() if not _process_exists(pid)]
        result = context.wait(timeout=0)
        if result is not None:
            return result
        if gone:
            stderr_path = getattr(context, "stderrs", {}).get(gone[0])
            raise _died_without_exception(fn, world_size, gone[0], 0, stderr_path)
        if timeout is not None and time.monotonic() - started_at > timeout:
            raise TimeoutError(
                message("ddp.timeout", world_size=world_size, function=_describe(fn), timeout=f"{timeout:g}")
            )
        time.sleep(POLL_INTERVAL_S)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _name_of(fn: Callable[..., Any]) -> str:
    """The name a learner gave ``fn`` (``train``), for the launch line."""
    return getattr(getattr(fn, "func", fn), "__name__", "fn")


def _describe(fn: Callable[..., Any]) -> str:
    target = getattr(fn, "func", fn)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def _read_reports(report_dir: str) -> dict[int, dict[str, Any]]:
    reports = {}
    for file_name in os.listdir(report_dir):
        if file_name.endswith(".json"):
            try:
                with open(os.path.join(report_dir, file_name)) as report_file:
                    report = json.load(report_file)
                reports[int(report["rank"])] = report
            except (OSError, ValueError, KeyError):
                continue
    return reports


def _stderr_tail(path: str | None) -> str:
    if not path or not os.path.isfile(path):
        return ""
    with open(path, errors="replace") as stderr_file:
        lines = stderr_file.read().splitlines()
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def _failure_error(
    fn: Callable[..., Any], world_size: int, result: Any, reports: dict[int, dict[str, Any]]
) -> Exception:
    """Turn torch's first observed failure plus the ranks' own reports into one readable error."""
    if any(_is_port_taken(report) for report in reports.values()):
        return _PortTakenError()
    first_rank, first_failure = next(iter(result.failures.items()))
    if first_rank in reports:
        # The rank torch saw die first raised; the one that raised earliest is the cause (ranks blocked in a
        # collective with it raise too, a moment later).
        root = min(reports.values(), key=lambda report: report["time_ns"])
        rank = int(root["rank"])
        exitcode = first_failure.exitcode if rank == first_rank else None
        others = [
            f"  rank {other}: {report['exception'].splitlines()[-1] if report['exception'] else '?'}"
            for other, report in sorted(reports.items())
            if other != rank
        ]
        also = "\nAfterwards, these ranks failed too:\n" + "\n".join(others) if others else ""
        said = (
            f"rank {rank} of {world_size} raised {root['exception']}\n"
            f"in {_describe(fn)} (while {root['phase']}). The other ranks were ended.{also}\n\n"
            f"Traceback from rank {rank}:\n{root['traceback']}"
        )
        return RankFailedError(said, rank=rank, exitcode=exitcode, rank_traceback=root["traceback"])
    stderr_path = result.stderrs.get(first_rank) if result.stderrs else None
    return _died_without_exception(fn, world_size, first_rank, first_failure.exitcode, stderr_path)


def _died_without_exception(
    fn: Callable[..., Any], world_size: int, rank: int, exitcode: int | None, stderr_path: str | None
) -> RankFailedError:
    if exitcode is not None and exitcode < 0:
        try:
            signal_name = signal.Signals(-exitcode).name
        except ValueError:
            signal_name = "unknown signal"
        how = f"was killed by signal {-exitcode} ({signal_name}, exit code {exitcode})"
        if signal_name == "SIGKILL":
            how += " - often the machine ran out of memory"
    elif exitcode == 0:
        how = "exited with code 0 without returning a result (did it call os._exit(0)?)"
    else:
        how = (
            f"exited with code {exitcode} without raising a Python exception "
            "(os._exit(), a crash in C/C++ code, or the process could not start)"
        )
    stderr_tail = _stderr_tail(stderr_path)
    stderr_part = f"\n\nLast lines rank {rank} wrote to stderr:\n{stderr_tail}" if stderr_tail else ""
    who = f"rank {rank} of {world_size} ({_describe(fn)})"
    said = f"{who} {how}. The other ranks were ended.{stderr_part}"
    return RankFailedError(said, rank=rank, exitcode=exitcode)


def _is_port_taken(report: dict[str, Any]) -> bool:
    text = report.get("traceback", "")
    return report.get("phase") == "initialising the process group" and (
        "EADDRINUSE" in text or "address already in use" in text.lower()
    )


# ----------------------------------------------------------------------------------------------------------
# Inside each rank
# ----------------------------------------------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    """End this rank when the notebook kernel (``parent_pid``) ends: a crash or a restart leaves no orphan.

    The rank's parent is the fork server, and the server lives as long as any process it forked (multiprocessing
    hands each of them the server's keep-alive pipe), so Linux's parent-death signal alone would never fire. A
    thread waits on a pidfd of the kernel (no polling) and ends the rank when the kernel is gone; the death
    signal still covers the fork server dying."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    try:
        kernel = os.pidfd_open(parent_pid)
    except ProcessLookupError:  # the kernel died before this rank started
        os._exit(1)
    except (OSError, AttributeError):  # no pidfd here (old kernel, a seccomp filter): look once a second
        kernel = None
    if kernel is None and not _process_exists(parent_pid):
        os._exit(1)
    threading.Thread(target=_exit_when_gone, args=(parent_pid, kernel), name="gpulab-kernel-watch", daemon=True).start()


def _exit_when_gone(parent_pid: int, kernel: int | None) -> None:
    if kernel is not None:
        select.select([kernel], [], [])  # a pidfd turns readable when its process has exited
    else:
        while _process_exists(parent_pid):
            time.sleep(1.0)
    os._exit(1)


def _traceback_from_caller_code(error: BaseException) -> str:
    """The traceback text, without the frames of this module that lead to ``fn`` (they say nothing new)."""
    frames = error.__traceback__
    while frames is not None and frames.tb_next is not None and _is_this_module(frames.tb_frame):
        frames = frames.tb_next
    return "".join(traceback.format_exception(type(error), error, frames))


def _is_this_module(frame: types.FrameType) -> bool:
    return frame.f_globals.get("__name__") == __name__


def _write_report(report_dir: str, rank: int, phase: str, error: BaseException) -> bool:
    """Leave this rank's exception for the parent: what, where, and when (to tell cause from consequence)."""
    report = {
        "rank": rank,
        "time_ns": time.time_ns(),
        "phase": phase,
        "exception": "".join(traceback.format_exception_only(error)).strip(),
        "traceback": _traceback_from_caller_code(error),
    }
    try:
        path = os.path.join(report_dir, f"rank{rank}.json")
        with open(path + ".tmp", "w") as report_file:
            json.dump(report, report_file)
        os.replace(path + ".tmp", path)
    except OSError:
        return False
    return True


def _check_result_picklable(fn: Callable[..., Any], result: Any) -> None:
    try:
        pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        raise TypeError(
            f"{getattr(fn, '__name__', 'fn')} returned a {type(result).__name__}, which cannot be sent "
            f"back with pickle ({type(error).__name__}: {error}). Return plain data: numbers, strings, "
            "tensors, and lists or dicts of them."
        ) from error


def _drop_variables_the_notebook_deleted(given: frozenset[str]) -> None:
    """Delete from this rank's environment every variable ``launch`` did not give it: the fork server's
    environment is the notebook's when the server started, and a variable deleted since would otherwise live on
    in every rank. ``del os.environ[...]`` unsets it for C code too (NCCL, CUDA read ``getenv``)."""
    for name in [name for name in os.environ if name not in given]:
        del os.environ[name]


def _rank_main(fn: Callable[..., Any], args: tuple[Any, ...], options: _RankOptions) -> Any:
    """The function every launched process runs: torchrun's environment in, ``fn``'s result out."""
    _drop_variables_the_notebook_deleted(options.environment)
    _die_with_parent(options.parent_pid)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # stdout goes to a file the parent shows live
    rank = int(os.environ["RANK"])
    _mark_ready(options.report_dir, rank)  # this process is up: launch's start line counts it
    phase = ["starting"]
    try:
        result = _run_in_process_group(
            fn,
            args,
            backend=options.backend,
            timeout_s=options.timeout_s,
            threads_per_rank=options.threads_per_rank,
            phase=phase,
        )
        phase[0] = "sending its result back"
        _check_result_picklable(fn, result)
        return result
    except BaseException as error:
        if _write_report(options.report_dir, rank, phase[0], error):
            # Exit with code 1 as torch.multiprocessing would after an exception, but through SystemExit,
            # which it lets pass: it would otherwise pickle the traceback again into a /tmp file it never
            # deletes. (It would also treat KeyboardInterrupt and sys.exit(0) as a clean exit, no result.)
            raise SystemExit(1) from None
        if not isinstance(error, Exception):
            raise RuntimeError(f"rank {rank} stopped by {type(error).__name__}") from error
        raise


def _run_in_process_group(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    backend: str | None,
    timeout_s: float | None,
    threads_per_rank: int | None,
    phase: list[str],
) -> Any:
    """Initialise the default process group from torchrun's variables, call ``fn``, destroy the group."""
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if threads_per_rank is not None:
        torch.set_num_threads(threads_per_rank)
    backend = backend or default_backend(local_world_size)
    init_options: dict[str, Any] = {}
    if timeout_s is not None:
        init_options["timeout"] = timedelta(seconds=timeout_s)
    phase[0] = "initialising the process group"
    if "nccl" in backend:
        torch.cuda.set_device(local_rank)
        init_options["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **init_options)
    phase[0] = f"running {getattr(fn, '__name__', 'fn')}"
    result = fn(rank, world_size, *args)
    phase[0] = "destroying the process group"
    if dist.is_initialized():  # fn may have destroyed it itself
        # A DistributedDataParallel lives in a reference cycle, so it outlives fn until a collection. Collected
        # after the group is destroyed, its reducer would drop the group's last reference without releasing the
        # GIL, and the group's destructor, joining its gloo workers, could deadlock with one that needs the GIL
        # (pytorch/pytorch#56297). Collected first, the group's last reference goes from Python, which releases it.
        gc.collect()
        dist.destroy_process_group()
    return result
