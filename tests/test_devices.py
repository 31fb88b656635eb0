"""gpulab.devices and gpulab.environment: the mode, the reason, and bad input."""

from __future__ import annotations

import importlib
import threading

import gpulab
import pytest
import torch

DEVICES_MODULE = importlib.import_module("gpulab.devices")  # the attribute gpulab.devices is the function


@pytest.fixture(autouse=True)
def _restore_default_devices():
    yield
    gpulab.devices(2, quiet=True)


def test_devices_without_enough_gpus_are_virtual_and_say_why(capsys):
    chosen = gpulab.devices(3)
    line = capsys.readouterr().out.strip()
    if torch.cuda.device_count() >= 3:
        assert not chosen.virtual and line.startswith("Real GPUs")
    else:
        assert chosen.virtual and list(chosen) == [0, 1, 2]
        assert line.startswith("Virtual devices: 3 on") and str(chosen.primary) in line
        assert chosen.torch_device(2) == chosen.primary


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_devices_rejects_bad_counts(bad):
    with pytest.raises(ValueError):
        gpulab.devices(bad)


def test_environment_describes_the_machine(monkeypatch):
    environment = gpulab.environment()
    assert environment.torch == torch.__version__ and environment.cpu_count >= 1
    assert len(environment.gpus) == torch.cuda.device_count()
    assert "torch" in str(environment)
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    assert gpulab.environment().platform == "kaggle"
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE")
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release")
    assert gpulab.environment().platform == "colab"


def test_data_parallel_follows_the_chosen_mode():
    gpulab.devices(2, quiet=True)
    wrapped = gpulab.DataParallel(torch.nn.Linear(2, 2))
    if torch.cuda.device_count() >= 2:
        assert type(wrapped) is torch.nn.DataParallel
    else:
        assert isinstance(wrapped, torch.nn.DataParallel) and wrapped.device_ids == [0, 1]


class _BuiltOnRealGpus:
    """Stands in for ``torch.nn.DataParallel`` (which needs CUDA) while GPUs are simulated: records the ids."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        self.device_ids = list(device_ids)


@pytest.mark.parametrize("gpu_count", [2, 3, 4, 8])
def test_a_demo_never_changes_the_lessons_mode(monkeypatch, gpu_count):
    """Lesson 01's sequence on a simulated 2/3/4/8-GPU box: the set-up's 2 devices are real GPUs, the 4-device demo
    is real only with 4 GPUs, and the lesson's later DataParallel calls stay real after the demo."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpu_count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "simulated GPU")
    monkeypatch.setattr("gpulab.data_parallel.nn.DataParallel", _BuiltOnRealGpus)
    prepared = []
    monkeypatch.setattr(DEVICES_MODULE, "prepare_cuda_threads", prepared.append)
    try:
        lesson = gpulab.devices(2, quiet=True)
        assert type(gpulab.DataParallel(torch.nn.Linear(2, 2), device_ids=lesson)) is _BuiltOnRealGpus
        four = gpulab.devices(4, quiet=True, remember=False)
        demo = gpulab.DataParallel(torch.nn.Linear(2, 2), device_ids=four)
        assert (type(demo) is _BuiltOnRealGpus) == (gpu_count >= 4)
        assert demo.device_ids == [0, 1, 2, 3]
        assert gpulab.current_devices() is lesson
        assert prepared == [[0, 1], [0, 1, 2, 3] if gpu_count >= 4 else [0]]
        for device_ids in (lesson, None, [0, 1]):
            after = gpulab.DataParallel(torch.nn.Linear(2, 2), device_ids=device_ids)
            assert type(after) is _BuiltOnRealGpus and after.device_ids == [0, 1]
    finally:
        monkeypatch.undo()
        gpulab.devices(2, quiet=True)


def test_the_cublas_context_warning_is_taken_once_in_a_thread_of_ours(monkeypatch, recwarn):
    """cuBLAS warns once per process when a thread without a current CUDA context asks for a handle; set-up takes
    that warning in its own thread so that no graded cell prints it, and lets any other warning through."""
    import threading
    import warnings

    devices_module = DEVICES_MODULE
    asked_in = []

    def fake_blas_handle():
        asked_in.append(threading.current_thread().name)
        warnings.warn(
            devices_module.CUBLAS_CONTEXT_WARNING + "! Attempting to set the primary context...", stacklevel=1
        )
        warnings.warn("something else", RuntimeWarning, stacklevel=1)
        return 1

    monkeypatch.setattr(torch.cuda, "current_blas_handle", fake_blas_handle)
    devices_module.absorb_cublas_context_warning()
    assert asked_in == ["gpulab-cublas-context"]
    assert [str(w.message) for w in recwarn] == ["something else"]


class _OnGpu(torch.Tensor):
    """A CPU tensor that says it is on ``cuda:<gpu>``: what a replica's input looks like on a GPU machine."""

    gpu = 0

    @property
    def device(self):
        return torch.device("cuda", self.gpu)


def _on_gpu(tensor: torch.Tensor, gpu: int) -> torch.Tensor:
    cls = type(f"OnGpu{gpu}", (_OnGpu,), {"gpu": gpu})
    return tensor.as_subclass(cls)


@pytest.mark.parametrize("gpu_count", [2, 3])
def test_each_replica_reports_its_own_device_whatever_the_lessons_mode(monkeypatch, gpu_count):
    """Lesson 01 on a 2- or 3-GPU machine (Kaggle's T4 x2): the lesson's devices are real GPUs, the 4-device demo
    runs on 4 virtual devices backed by cuda:0. Its replicas (threads in their virtual device's context, inputs on
    cuda:0) report devices 0..3, so 10 samples land as [3, 3, 3, 1]; a real GPU replica reports its GPU."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpu_count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "simulated GPU")
    monkeypatch.setattr(DEVICES_MODULE, "prepare_cuda_threads", lambda indices: None)
    from gpulab import models, virtual

    lesson = gpulab.devices(2, quiet=True)
    four = gpulab.devices(4, quiet=True, remember=False)
    assert not lesson.virtual and four.virtual and four.primary == torch.device("cuda", 0)
    recorder = models.ShapeReporter(torch.nn.Identity(), verbose=False, record_samples=True)
    batch = torch.zeros(10, 4)
    batch[:, 0] = torch.arange(10)

    def replica(device, chunk):
        with virtual.worker_context(device):  # what gpulab.DataParallel's parallel_apply runs each replica in
            recorder(_on_gpu(chunk, four.primary.index))

    threads = [
        threading.Thread(target=replica, args=(device, chunk))
        for device, chunk in zip(four, batch.chunk(len(four)), strict=False)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    received = {call["virtual_device"]: call["samples"] for call in recorder.calls}  # lesson 01's run_and_record
    assert [len(received.get(device, [])) for device in four] == [3, 3, 3, 1]
    assert received[3] == [9]
    real = models.ShapeReporter(torch.nn.Identity(), verbose=False)
    worker = threading.Thread(target=lambda: real(_on_gpu(torch.zeros(2, 4), 1)))  # nn.DataParallel's replica 1
    worker.start()
    worker.join()
    assert real.calls[0]["virtual_device"] == 1 and real.calls[0]["device"] == "cuda:1"
