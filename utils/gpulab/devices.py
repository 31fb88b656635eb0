"""Which devices a lesson runs on, and what machine this is.

Every lesson's set-up cell calls ``gpulab.devices(n)`` (lesson 01 explains the two modes). With at least ``n``
CUDA GPUs the course uses them for real. With fewer, it uses ``n`` *virtual devices*: the DataParallel algorithm
run faithfully on the one physical device (``cuda:0`` if there is one, else the CPU), one thread per replica,
with memory attributed per virtual device by ``gpulab.memory``.

The mode a lesson runs in never changes behind the learner's back. A ``Devices`` list carries its own mode, and
``gpulab.DataParallel(model, device_ids=devices)`` follows the list it is given, not whatever was chosen last.
The set-up cell's call is *remembered* as the lesson's choice (``current_devices()``), which is what
``gpulab.DataParallel`` without a ``Devices`` list, ``gpulab.memory`` and the exercise helpers use. A demo that
wants a different count asks with ``remember=False`` (lesson 01's 4-device demo): it gets 4 devices, real or
virtual, and the lesson's choice stays as it was. (Found by reading: lesson 01 used to call ``devices(4)``, which
replaced the global choice, so on a 2- or 3-GPU box every later ``gpulab.DataParallel`` was the virtual class.)
``tests/test_devices.py`` simulates 2, 3, 4 and 8 GPUs and checks, for every ``gpulab.DataParallel`` call each
lesson makes, which class it builds.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass

import torch

from gpulab.messages import message

DEFAULT_DEVICE_COUNT = 2


class Devices(list):
    """The device ids a lesson uses (``[0, 1, ...]``) plus what they are.

    It is a plain ``list`` of ints, so ``nn.DataParallel(model, device_ids=devices)`` and ``len(devices)`` work
    as usual. Extra attributes:

    * ``virtual``: True when the ids are virtual devices on one physical device.
    * ``primary``: the ``torch.device`` where the model and the inputs go (``cuda:0`` or ``cpu``): device 0.
    * ``backing``: the physical device behind virtual devices (``None`` for real GPUs).
    * ``reason``: one human-readable line saying which mode this is and why.
    """

    def __init__(self, ids, *, virtual: bool, primary: torch.device, reason: str):
        super().__init__(ids)
        self.virtual = virtual
        self.primary = primary
        self.backing = primary if virtual else None
        self.reason = reason

    def torch_device(self, index: int) -> torch.device:
        """The ``torch.device`` that holds data for device ``index`` (the backing device when virtual)."""
        if index not in self:
            raise IndexError(f"device {index} is not one of {list(self)}")
        return self.primary if self.virtual else torch.device("cuda", index)

    def __repr__(self) -> str:
        return self.reason

    def _repr_markdown_(self) -> str:
        return f"**{self.reason}**"


_current: Devices | None = None


def devices(n: int = DEFAULT_DEVICE_COUNT, *, quiet: bool = False, remember: bool = True) -> Devices:
    """Choose the ``n`` devices the lesson runs on and say, once, which mode that is and why.

    Introduced in lesson 01; every lesson's set-up cell calls it. Real CUDA GPUs are used when at least ``n``
    are visible; otherwise ``n`` virtual devices backed by ``cuda:0`` (one GPU) or the CPU (no GPU). The choice
    is remembered as the lesson's choice (``current_devices()``) unless ``remember=False``: a demo that needs
    another count (lesson 01's 4 devices) asks that way and leaves the lesson's mode alone.
    """
    global _current
    chosen = choose(n, torch.cuda.device_count())
    if chosen.primary.type == "cuda":
        prepare_cuda_threads(list(chosen) if not chosen.virtual else [chosen.primary.index or 0])
    if remember:
        _current = chosen
    if not quiet:
        print(chosen.reason)
    return chosen


def choose(n: int, gpu_count: int, gpu_names: list[str] | None = None) -> Devices:
    """The ``Devices`` ``devices(n)`` gives on a machine with ``gpu_count`` visible CUDA GPUs (no side effects).

    ``gpu_names`` (one per GPU) defaults to asking CUDA; tests pass names to simulate machines they are not on.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a whole number of devices >= 1, got {n!r}")
    if gpu_count >= n:
        names = sorted({gpu_names[i] if gpu_names else torch.cuda.get_device_name(i) for i in range(n)})
        reason = message("devices.real", n=n, gpu_count=gpu_count, names=", ".join(names))
        chosen = Devices(range(n), virtual=False, primary=torch.device("cuda", 0), reason=reason)
    else:
        backing = torch.device("cuda", 0) if gpu_count else torch.device("cpu")
        if gpu_count <= 1:
            have = message("devices.one_gpu" if gpu_count == 1 else "devices.no_gpu")
        else:
            have = message("devices.gpus", count=gpu_count)
        reason = message("devices.virtual", n=n, backing=backing, have=have)
        chosen = Devices(range(n), virtual=True, primary=backing, reason=reason)
    return chosen


CUBLAS_CONTEXT_WARNING = "Attempting to run cuBLAS, but there was no current CUDA context"
_prepared_gpus: set[int] = set()


def bind_cuda_context(device: torch.device) -> None:
    """Make ``device``'s primary CUDA context current in the calling thread (a replica's thread, lesson 01).

    cuBLAS, asked for a handle in a thread with no current context, warns on stderr (once per process) before
    setting the primary context itself (``at::cuda::getCurrentCUDABlasHandle``), and that line would cost a
    graded cell its points. ``torch.cuda.device(0)`` does not help in a fresh thread: ``c10::cuda::SetDevice``
    skips ``cudaSetDevice`` when the thread's device already is 0. Any CUDA runtime call that needs a context
    makes the primary context current; querying the device's current stream is one that waits for nothing.
    Not run on a GPU.
    """
    torch.cuda.current_stream(device).query()


def prepare_cuda_threads(indices: list[int]) -> None:
    """Before a lesson uses GPUs ``indices``: give autograd's backward thread of each a current CUDA context
    (a first backward of an element-wise product: that thread lives for the process, so its later cuBLAS calls
    find the context), and take cuBLAS's one-time "no current CUDA context" warning now, in a thread of ours,
    where it is expected: ``nn.DataParallel``'s own replica thread for GPU 0 would otherwise print it in
    whichever cell first runs a forward. Only that warning is absorbed; anything else is shown. Not run on a GPU.
    """
    for index in indices:
        if index in _prepared_gpus:
            continue
        _prepared_gpus.add(index)
        leaf = torch.ones(1, device=torch.device("cuda", index), requires_grad=True)
        (leaf * 2).sum().backward()
    absorb_cublas_context_warning()


def absorb_cublas_context_warning() -> None:
    """Ask cuBLAS for a handle in a fresh thread, where no context is current, catching its one-time warning."""
    import threading
    import warnings

    caught: list[warnings.WarningMessage] = []

    def ask() -> None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.current_blas_handle()
        caught.extend(seen)

    thread = threading.Thread(target=ask, name="gpulab-cublas-context")
    thread.start()
    thread.join()
    for warning in caught:
        if CUBLAS_CONTEXT_WARNING not in str(warning.message):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def remembered_devices() -> Devices | None:
    """The lesson's choice if ``devices()`` remembered one in this process, else ``None``; never makes a choice
    (which would prepare CUDA threads on GPUs 0 and 1: see ``gpulab.memory.track`` in a DDP rank)."""
    return _current


def current_devices() -> Devices:
    """The lesson's choice: the last remembered ``devices()`` call; the default (2 devices) if there was none."""
    if _current is None:
        return devices(DEFAULT_DEVICE_COUNT, quiet=True)
    return _current


@dataclass(frozen=True)
class Environment:
    """What ``gpulab.environment()`` reports; ``str()`` gives a short readable summary."""

    platform: str
    python: str
    torch: str
    cuda: str | None
    gpus: tuple[str, ...]
    driver: str | None
    cpu_count: int

    def __str__(self) -> str:
        gpus = ", ".join(self.gpus) if self.gpus else "none"
        return (
            f"platform: {self.platform} | python {self.python} | torch {self.torch} | CUDA {self.cuda or '-'} | "
            f"driver {self.driver or '-'} | GPUs ({len(self.gpus)}): {gpus} | CPU cores: {self.cpu_count}"
        )


def detect_platform() -> str:
    """``"colab"``, ``"kaggle"`` or ``"local"``, from the variables those services set in every kernel."""
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ or "COLAB_GPU" in os.environ:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ or "KAGGLE_URL_BASE" in os.environ:
        return "kaggle"
    return "local"


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver version from NVML, or ``None`` when NVML is unavailable (no GPU, no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def environment() -> Environment:
    """Describe the machine: GPUs, driver, torch, CUDA, and whether this is Colab, Kaggle or a plain box.

    Recorded in the GPU check's report (``scripts/gpu_check.py``), for the instructor; no lesson shows it, so its
    labels stay English in both editions.
    """
    gpu_names = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return Environment(
        platform=detect_platform(),
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        gpus=gpu_names,
        driver=nvidia_driver_version() if gpu_names else None,
        cpu_count=os.cpu_count() or 1,
    )
