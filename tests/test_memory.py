"""gpulab.memory: the per-device memory tracker (lesson 03), on virtual devices here, on real GPUs when present.

The virtual-device numbers are checked against bytes computed by hand (parameters, gathered outputs, gradients),
and the lesson's claims are checked on measured numbers: DataParallel's output device peaks above the others,
and computing the loss inside forward lowers that peak.
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
import threading
import time
import types

import gpulab
import pytest
import torch
from gpulab import memory, virtual
from gpulab.data_parallel import DataParallel
from gpulab.devices import Devices
from torch import nn

FLOAT = 4  # bytes per float32


@pytest.fixture
def two_virtual():
    """Two virtual devices on the CPU, without touching gpulab's remembered choice."""
    return Devices([0, 1], virtual=True, primary=torch.device("cpu"), reason="two virtual devices (test)")


@pytest.fixture(autouse=True)
def no_leftovers():
    """Every test must leave no sampler thread, no thread hook and no dispatch mode behind."""
    before = set(threading.enumerate())
    yield
    assert set(threading.enumerate()) <= before, threading.enumerate()
    assert not any(t.name == "gpulab-memory-sampler" for t in threading.enumerate())
    assert virtual._thread_hooks == []
    assert torch._C._len_torch_dispatch_stack() == 0


def now(trace: memory.Trace, device_position: int) -> int:
    """Bytes allocated on a device right now (mark() takes a sample)."""
    trace.mark("probe")
    return trace.allocated[device_position][-1]


def test_existing_tensors_count_on_device_0(two_virtual):
    model = nn.Linear(100, 50)
    with memory.track(two_virtual) as trace:
        pass
    param_bytes = (100 * 50 + 50) * FLOAT
    assert trace.allocated[0][0] >= param_bytes
    assert trace.allocated[1] == [0] * len(trace.times)
    assert trace.peaks()[1] == 0
    del model


def test_count_existing_false_starts_from_zero(two_virtual):
    model = nn.Linear(100, 50)
    with memory.track(two_virtual, count_existing=False) as trace:
        extra = torch.empty(250)
        del model  # frees of storages the tracker never counted change nothing
        assert now(trace, 0) == 1000
        del extra
    assert trace.allocated[0][0] == 0 and trace.peaks() == [1000, 0]


def test_new_storages_exact_bytes_views_and_frees(two_virtual):
    with memory.track(two_virtual) as trace:
        base = now(trace, 0)
        a = torch.empty(1000)
        assert now(trace, 0) - base == 4000
        view = a[10:].view(-1, 10)  # an alias: no new bytes
        a.add_(1)  # in place: no new bytes
        assert now(trace, 0) - base == 4000
        with virtual.placing_on(1):
            b = a.clone()  # a transfer: belongs to device 1
        with virtual.on_virtual_device(1):
            c = torch.zeros(250, dtype=torch.float64)  # made from nothing in device 1's context
        d = b * 2  # follows its input to device 1
        assert now(trace, 1) == 4000 + 2000 + 4000
        assert now(trace, 0) - base == 4000
        del a
        assert now(trace, 0) - base == 4000  # the view keeps the storage alive
        del view
        assert now(trace, 0) == base
        del b, c, d
        assert now(trace, 1) == 0
        grows = torch.empty(10)
        grows.resize_(1000)  # the same storage, grown in place
        assert now(trace, 0) - base == 4000
        into = torch.empty(0)
        torch.add(torch.ones(500), 1, out=into)  # out=: resized by the operation
        assert now(trace, 0) - base == 4000 + 2000
        del grows, into
        big = torch.empty(2_000_000)
        del big
    assert trace.peaks()[0] == base + 8_000_000  # peaks are exact, not sampled
    assert max(trace.highest[0]) == base + 8_000_000  # and the spike shows in the series between samples
    assert trace.peaks()[1] == 10_000


def test_backward_ops_are_seen(two_virtual):
    weight = nn.Parameter(torch.randn(300, 200))
    inputs = torch.randn(8, 300)
    with memory.track(two_virtual) as trace:
        base = now(trace, 0)
        loss = (inputs @ weight).relu().sum()
        loss.backward()  # on the CPU the autograd engine runs in this thread, inside the tracker
        del loss
        assert now(trace, 0) - base == weight.numel() * FLOAT  # only the gradient is left


class WideLinear(nn.Module):
    def __init__(self, features: int, classes: int):
        super().__init__()
        self.head = nn.Linear(features, classes)

    def forward(self, inputs):
        return self.head(inputs)


class ChunkLoss(nn.Module):
    """The loss computed inside forward, summed over the chunk's samples (written here, not taken from gpulab)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs, targets):
        return nn.functional.cross_entropy(self.model(inputs), targets, reduction="sum").view(1)


def test_data_parallel_forward_matches_analytic_bytes(two_virtual, monkeypatch):
    monkeypatch.setattr("gpulab.data_parallel.current_devices", lambda: two_virtual)
    batch, features, classes = 64, 32, 1000
    model = WideLinear(features, classes)
    inputs = torch.randn(batch, features)
    wrapped = DataParallel(model, device_ids=[0, 1])
    with memory.track(two_virtual) as trace:
        base = now(trace, 0)
        with torch.no_grad():
            output = wrapped(inputs)
        gathered = now(trace, 0) - base
        on_device_1 = now(trace, 1)
    assert output.shape == (batch, classes)
    assert gathered == batch * classes * FLOAT  # the gathered output lives on device 0, and nothing else
    assert on_device_1 == 0  # replica 1's copies and outputs are gone after the step
    replica_params = (features * classes + classes) * FLOAT
    half = batch // 2
    # Device 1's peak: its copy of the parameters, its input chunk and its output chunk, at the same time.
    assert trace.peaks()[1] == replica_params + half * features * FLOAT + half * classes * FLOAT


def test_data_parallel_gradients_end_on_device_0(two_virtual, monkeypatch):
    monkeypatch.setattr("gpulab.data_parallel.current_devices", lambda: two_virtual)
    model = WideLinear(32, 500)
    inputs, targets = torch.randn(40, 32), torch.randint(0, 500, (40,))
    wrapped = DataParallel(model, device_ids=[0, 1])
    with memory.track(two_virtual) as trace:
        base = now(trace, 0)
        loss = nn.functional.cross_entropy(wrapped(inputs), targets)
        loss.backward()
        del loss
        grads = now(trace, 0) - base
        left_on_1 = now(trace, 1)
    assert grads == sum(p.numel() for p in model.parameters()) * FLOAT  # .grad of each parameter, summed on 0
    assert left_on_1 == 0
    assert trace.peaks()[1] > 0  # replica 1 did work during forward and backward


def _peaks_of_step(devices, model, inputs, targets, loss_in_forward: bool) -> list[int]:
    model.zero_grad(set_to_none=True)
    with memory.track(devices) as trace:
        if loss_in_forward:
            wrapped = DataParallel(ChunkLoss(model), device_ids=[0, 1])
            loss = wrapped(inputs, targets).sum() / len(inputs)
        else:
            wrapped = DataParallel(model, device_ids=[0, 1])
            loss = nn.functional.cross_entropy(wrapped(inputs), targets)
        loss.backward()
        del loss, wrapped
    model.zero_grad(set_to_none=True)
    return trace.peaks()


def test_device_0_peaks_above_device_1_and_loss_in_forward_lowers_it(two_virtual, monkeypatch):
    """Lesson 03's claims, on measured numbers: 512 samples, 50,000 classes, 2 virtual devices."""
    monkeypatch.setattr("gpulab.data_parallel.current_devices", lambda: two_virtual)
    torch.manual_seed(0)
    batch, features, classes = 512, 32, 50_000
    model = WideLinear(features, classes)
    inputs, targets = torch.randn(batch, features), torch.randint(0, classes, (batch,))
    gathered_bytes = batch * classes * FLOAT

    gather = _peaks_of_step(two_virtual, model, inputs, targets, loss_in_forward=False)
    in_forward = _peaks_of_step(two_virtual, model, inputs, targets, loss_in_forward=True)

    # Gathering the outputs: device 0 holds the whole output (and its loss's intermediates) besides its share.
    assert gather[0] > 2 * gather[1], gather
    assert gather[0] - gather[1] > gathered_bytes, gather
    # Loss in forward: device 0's peak drops by more than the gathered output, and the devices are close.
    assert in_forward[0] < gather[0] - gathered_bytes, (gather, in_forward)
    assert in_forward[0] < 1.25 * in_forward[1], in_forward


def test_replica_threads_are_tracked_and_hooks_removed(two_virtual, monkeypatch):
    monkeypatch.setattr("gpulab.data_parallel.current_devices", lambda: two_virtual)
    seen = []

    class Probe(nn.Module):
        def forward(self, inputs):
            seen.append((threading.current_thread().name, torch._C._len_torch_dispatch_stack()))
            return inputs * 2

    with memory.track(two_virtual) as trace:
        DataParallel(Probe(), device_ids=[0, 1])(torch.randn(8, 3))
        hooks_inside = list(virtual._thread_hooks)
    assert len(hooks_inside) == 1
    assert len(seen) == 2 and all(depth == 1 for _, depth in seen)  # one tracker mode in each replica thread
    assert trace.peaks()[1] >= 4 * 4 * FLOAT  # replica 1's input chunk copy and its output


def test_sampler_stops_when_the_block_raises(two_virtual):
    with pytest.raises(RuntimeError, match="boom"):
        with memory.track(two_virtual, interval=0.01) as trace:
            assert any(t.name == "gpulab-memory-sampler" for t in threading.enumerate())
            torch.ones(10)
            raise RuntimeError("boom")
    assert not trace.running
    assert len(trace.times) >= 2  # the first and the final sample
    assert trace.peaks()[0] > 0
    # The no_leftovers fixture checks threads, hooks and the dispatch stack.


def test_replica_error_inside_track_cleans_up(two_virtual, monkeypatch):
    monkeypatch.setattr("gpulab.data_parallel.current_devices", lambda: two_virtual)

    class Fails(nn.Module):
        def forward(self, inputs):
            if virtual.current_virtual_device() == 1:
                raise ValueError("replica 1 fails")
            return inputs

    with pytest.raises(ValueError, match="replica 1 fails"):
        with memory.track(two_virtual):
            DataParallel(Fails(), device_ids=[0, 1])(torch.randn(4, 2))


def test_samples_marks_dict_and_summary(two_virtual):
    with memory.track(two_virtual, interval=0.005) as trace:
        for step in range(3):
            trace.mark(f"step {step}")
            keep = torch.empty(100_000)
            total = 0
            while total < 20_000:  # let the sampler run a little
                total += int(torch.ones(1000).sum())
            del keep
    assert [label for _, label in trace.marks] == ["step 0", "step 1", "step 2"]
    assert trace.times == sorted(trace.times)
    assert all(len(series) == len(trace.times) for series in trace.allocated + trace.peak + trace.highest)
    for allocated, highest, peak in zip(trace.allocated, trace.highest, trace.peak, strict=True):
        assert all(a <= h <= p for a, h, p in zip(allocated, highest, peak, strict=True))
    assert trace.nvml_used == [[], []] and trace.notice is None
    for series in trace.peak:  # the peak-so-far never decreases
        assert all(b >= a for a, b in zip(series, series[1:], strict=False))
    data = json.loads(json.dumps(trace.to_dict()))
    assert data["peaks"] == trace.peaks() and data["virtual"] is True and data["devices"] == [0, 1]
    assert "MiB" in trace.summary() and "device 1" in trace.summary()
    assert "Trace" in repr(trace)


def test_default_devices_come_from_gpulab(monkeypatch, two_virtual):
    monkeypatch.setattr("gpulab.memory.current_devices", lambda: two_virtual)
    with memory.track() as trace:
        pass
    assert trace.devices == [0, 1] and trace.virtual and trace.backing == "cpu"


def test_live_plot_headless(two_virtual):
    from gpulab import plots

    live = plots.LivePlot(two_virtual, fps=100, display=False)
    with memory.track(two_virtual, interval=0.01, live=live):
        deadline = time.perf_counter() + 10
        while live.frames < 2 and time.perf_counter() < deadline:  # the sampler thread renders frames
            torch.ones(1000).sum()
            time.sleep(0.001)
        during = live.frames
    assert during >= 2 and live.frames == during + 1  # plus the final frame
    assert live.png.startswith(b"\x89PNG")
    assert live._figure is None  # released


def test_without_nvml_real_gpu_path_degrades_with_one_notice(monkeypatch, capsys):
    """No GPU here: fake PyTorch's CUDA statistics so the real-GPU path runs; NVML really is missing."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda index: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index: 1000 * (index + 1))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda index: 5000 * (index + 1))
    monkeypatch.setattr(memory, "_printed_notices", set())
    real = Devices([0, 1], virtual=False, primary=torch.device("cuda", 0), reason="two fake GPUs")
    with memory.track(real) as first:
        pass
    with memory.track(real) as second:
        pass
    printed = capsys.readouterr()
    assert printed.out.count("gpulab.memory: NVML is unavailable") == 1 and printed.err == ""
    assert "NVML" in first.notice and first.notice == second.notice
    assert first.peaks() == [5000, 10000] and first.allocated[1][0] == 2000
    assert first.nvml_used == [[], []] and not first.virtual
    assert first.highest[1][0] == 10000  # the allocator's peak over the window (these fake stats never reset)


class FakeCudaAllocator:
    """``torch.cuda``'s allocator statistics for simulated GPUs: allocated bytes and the peak since a reset."""

    def __init__(self, allocated):
        self.allocated = list(allocated)
        self.peak = list(allocated)

    def allocate(self, index, size):
        self.allocated[index] += size
        self.peak[index] = max(self.peak[index], self.allocated[index])

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.allocated))
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index: self.allocated[index])
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda index: self.peak[index])
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "memory_stats", self.stats)

    def reset(self, index):
        self.peak[index] = self.allocated[index]

    def stats(self, index):
        """Every allocated byte in a segment of its own size: reserved == active == allocated."""
        held = self.allocated[index]
        return {f"{name}.all.current": held for name in ("reserved_bytes", "active_bytes", "allocated_bytes")}


def test_real_gpus_measure_from_the_blocks_start_and_keep_spikes_between_samples(monkeypatch):
    """Simulated GPUs holding 100 MiB and 7 MiB before the block: with ``count_existing=False`` the trace counts
    only what the block allocates, as on virtual devices, and a 30 MiB spike freed before the next sample still
    shows as that window's highest value and in the peak."""
    mib = 1 << 20
    fake = FakeCudaAllocator([100 * mib, 7 * mib])
    fake.install(monkeypatch)
    monkeypatch.setattr(memory, "_printed_notices", set())
    real = Devices([0, 1], virtual=False, primary=torch.device("cuda", 0), reason="two simulated GPUs")
    with memory.track(real, interval=60, count_existing=False) as trace:
        trace.mark("start")
        fake.allocate(0, 10 * mib)
        fake.allocate(0, 30 * mib)
        fake.allocate(0, -30 * mib)
        fake.allocate(1, 2 * mib)
        trace.mark("after")
        fake.allocate(0, 1 * mib)
        trace.mark("quiet")
    assert [series[1:4] for series in trace.allocated] == [[0, 10 * mib, 11 * mib], [0, 2 * mib, 2 * mib]]
    assert [series[2:4] for series in trace.highest] == [[40 * mib, 11 * mib], [2 * mib, 2 * mib]]
    assert trace.peaks() == [40 * mib, 2 * mib]
    with memory.track(real, interval=60) as absolute:  # the default counts what the allocator holds
        pass
    assert [series[0] for series in absolute.allocated] == [111 * mib, 9 * mib]


def test_a_fresh_ddp_rank_tracking_its_own_gpu_touches_no_other_gpu(monkeypatch):
    """Rank 1 of a DDP run on a simulated 2-GPU machine, in a fresh process (no lesson choice remembered), calls
    ``track([1])``: only GPU 1 is asked anything; no device choice is made (which would prepare CUDA threads, and
    so create contexts, on GPUs 0 and 1) and no GPU's name is read."""
    fake = FakeCudaAllocator([0, 0])
    fake.install(monkeypatch)
    touched, prepared = set(), []
    for name in ("memory_allocated", "max_memory_allocated", "reset_peak_memory_stats"):
        original = getattr(torch.cuda, name)
        monkeypatch.setattr(torch.cuda, name, lambda index, _f=original: touched.add(index) or _f(index))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: touched.add(("name", index)) or "GPU")
    devices_module = importlib.import_module("gpulab.devices")
    monkeypatch.setattr(devices_module, "_current", None)
    monkeypatch.setattr(devices_module, "prepare_cuda_threads", prepared.append)
    monkeypatch.setattr(memory, "_printed_notices", set())
    with memory.track([1], count_existing=False) as trace:
        fake.allocate(1, 1000)
    assert not trace.virtual and trace.peaks() == [1000]
    assert touched == {1} and prepared == []
    assert devices_module._current is None  # the rank's process still has no lesson choice


def test_tracker_mode_is_not_wrapped_by_dynamo():
    """The tracker opts out of TorchDispatchMode's torch._dynamo.disable wrapper (a private hook, checked here):
    with the wrapper, the first tracked block imports torch._dynamo (about 1 s) and every operation is slower."""
    handler = memory._TrackerMode.__dict__["__torch_dispatch__"]
    assert handler.__code__.co_filename == memory.__file__ and not hasattr(handler, "__wrapped__")


def test_bad_arguments():
    with pytest.raises(ValueError):
        with memory.track(interval=0):
            pass
    with pytest.raises(ValueError):
        with memory.track(devices=[]):
            pass


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_gpu_sees_a_known_allocation_and_nvml():
    real = Devices([0], virtual=False, primary=torch.device("cuda", 0), reason="one real GPU (test)")
    size = 64 * 1024 * 1024
    torch.cuda.synchronize()
    with memory.track(real, interval=0.01) as trace:
        base = now(trace, 0)
        block = torch.empty(size, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        grown = now(trace, 0) - base
        del block
    assert abs(grown - size) <= 0.05 * size, grown
    assert abs(trace.peaks()[0] - base - size) <= 0.05 * size, trace.peaks()
    assert trace.notice is None, trace.notice
    assert trace.nvml_used[0] and all(used > 0 for used in trace.nvml_used[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_virtual_devices_on_cuda_count_cuda_storages_only():
    backed = Devices([0, 1], virtual=True, primary=torch.device("cuda", 0), reason="virtual on cuda:0 (test)")
    with memory.track(backed) as trace:
        base = now(trace, 0)
        on_gpu = torch.empty(1000, device="cuda:0")
        on_cpu = torch.empty(5000)
        with virtual.placing_on(1):
            copy = on_gpu.clone()
        assert now(trace, 0) - base == 4000
        assert now(trace, 1) == 4000
        del on_gpu, on_cpu, copy


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_virtual_data_parallel_on_cuda_tracks_backward_threads(monkeypatch):
    """On CUDA the autograd engine runs backward in its own device thread: the tracker must see it there too."""
    backed = Devices([0, 1], virtual=True, primary=torch.device("cuda", 0), reason="virtual on cuda:0 (test)")
    monkeypatch.setattr("gpulab.data_parallel.current_devices", lambda: backed)
    model = WideLinear(32, 500).cuda()
    inputs = torch.randn(40, 32, device="cuda")
    targets = torch.randint(0, 500, (40,), device="cuda")
    wrapped = DataParallel(model, device_ids=[0, 1])
    with memory.track(backed) as trace:
        base = now(trace, 0)
        loss = nn.functional.cross_entropy(wrapped(inputs), targets)
        loss.backward()
        del loss
        torch.cuda.synchronize()
        grads = now(trace, 0) - base
        left_on_1 = now(trace, 1)
    assert grads == sum(p.numel() for p in model.parameters()) * FLOAT
    assert left_on_1 == 0 and trace.peaks()[1] > 0


class SimulatedNvml:
    """A ``pynvml`` for one H100-like GPU in MIG mode cut into two instances, or for one whole GPU (``mig=False``).
    ``naming``: how the driver names an instance's UUID ("MIG-<uuid>" since R470; "MIG-GPU-<parent>/gi/ci" before)."""

    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, mig: bool = True, naming: str = "R470"):
        self.mig = mig
        self.parent = "parent"
        self.instances = {
            "instance-a": "MIG-a1b2" if naming == "R470" else "MIG-GPU-p0/1/0",
            "instance-b": "MIG-c3d4" if naming == "R470" else "MIG-GPU-p0/2/0",
        }
        self.used = {"parent": 70 << 30, "instance-a": 3 << 30, "instance-b": 9 << 30}

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.parent

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        return self.parent

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid == "GPU-p0":
            return self.parent
        for handle, name in self.instances.items():
            if uuid == name:
                return handle
        raise RuntimeError(f"NVML_ERROR_NOT_FOUND: {uuid}")

    def nvmlDeviceGetMigMode(self, handle):
        if handle != self.parent or not self.mig:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, slot):
        if slot >= len(self.instances):
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return list(self.instances)[slot]

    def nvmlDeviceGetUUID(self, handle):
        return self.instances.get(handle, "GPU-p0").encode()

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=self.used[handle])


@pytest.mark.parametrize(
    ("naming", "cuda_uuid", "expected_gib"),
    [("R470", "c3d4", 9), ("pre-R470", "GPU-p0/2/0", 9), ("R470", "e5f6", None)],
)
def test_under_mig_nvml_reads_the_instance_not_the_parent_gpu(monkeypatch, naming, cuda_uuid, expected_gib):
    """A CUDA device that is a MIG instance: gpulab.memory's NVML series is the instance's used memory (9 GiB),
    never the whole GPU's (70 GiB), whatever the driver calls the instance; a device it cannot match on a GPU in
    MIG mode (the last case: CUDA reports a UUID no instance has) gets no NVML series and a notice saying why."""
    simulated = SimulatedNvml(naming=naming)
    monkeypatch.setitem(sys.modules, "pynvml", simulated)
    FakeCudaAllocator([0]).install(monkeypatch)
    properties = types.SimpleNamespace(uuid=cuda_uuid, pci_bus_id=1, pci_domain_id=0, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
    monkeypatch.setattr(memory, "_printed_notices", set())
    real = Devices([0], virtual=False, primary=torch.device("cuda", 0), reason="one simulated MIG instance")
    with memory.track(real, interval=60) as trace:
        pass
    if expected_gib is None:
        assert trace.nvml_used == [[]] and "MIG" in trace.notice, trace.notice
    else:
        assert trace.notice is None and set(trace.nvml_used[0]) == {expected_gib << 30}


def test_without_mig_nvml_reads_the_gpu_matched_by_uuid(monkeypatch):
    simulated = SimulatedNvml(mig=False)
    monkeypatch.setitem(sys.modules, "pynvml", simulated)
    properties = types.SimpleNamespace(uuid="p0", pci_bus_id=1, pci_domain_id=0, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
    assert importlib.import_module("gpulab.nvml").handle(simulated, 0) == "parent"


# ------------------------------------------------------------------------------------------ a capacity per device
def _two_steps(devices, loss_in_forward, capacity):
    """Lesson 03's wide-output training, two steps, each device given ``capacity``: the trace."""
    from gpulab.models import WideHead
    from gpulab_solutions.gpu0_imbalance import LossInForward

    inputs, labels = gpulab.data.classification(128, 16, 8_000, seed=1)
    with memory.track(devices, count_existing=False, capacity=capacity) as trace:
        torch.manual_seed(0)
        model = WideHead(16, 32, 8_000)
        network = LossInForward(model, nn.CrossEntropyLoss(reduction="sum")) if loss_in_forward else model
        parallel = gpulab.DataParallel(network, device_ids=devices)
        for _ in range(2):
            if loss_in_forward:
                loss = parallel(inputs, labels).sum() / len(inputs)
            else:
                loss = nn.functional.cross_entropy(parallel(inputs), labels)
            loss.backward()
    return trace


def test_a_capacity_makes_device_0_run_out_first_and_not_after_the_fix():
    devices = gpulab.devices(2, quiet=True, remember=False)
    unlimited = _two_steps(devices, False, None).peaks()
    fixed = _two_steps(devices, True, None).peaks()
    assert unlimited[0] > max(fixed) and unlimited[0] > unlimited[1]
    capacity = (unlimited[0] + max(fixed + [unlimited[1]])) // 2  # below device 0's peak, above every other one
    with pytest.raises(torch.OutOfMemoryError, match="Virtual device 0 is out of memory") as raised:
        _two_steps(devices, False, capacity)
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError  # what a CUDA allocator raises, too
    assert "capacity of" in str(raised.value)
    within = _two_steps(devices, True, capacity)
    assert within.out_of_memory is None and within.peaks() == fixed and max(within.peaks()) <= capacity
    assert within.to_dict()["capacity"] == capacity


def test_the_refused_allocation_is_kept_on_the_trace_and_never_counted():
    devices = gpulab.devices(2, quiet=True, remember=False)
    with pytest.raises(torch.OutOfMemoryError):
        with memory.track(devices, count_existing=False, capacity="1 KiB") as trace:
            kept = torch.zeros(128)  # 512 bytes: fits
            torch.zeros(256)  # 1024 more: refused
    assert trace.out_of_memory == {"device": 0, "tried": 1024, "allocated": 512, "capacity": 1024}
    assert trace.peaks() == [512, 0]
    del kept
    # in a replica's thread, the device that runs out is the one named
    with pytest.raises(torch.OutOfMemoryError, match="Virtual device 1 is out of memory"):
        with memory.track(devices, count_existing=False, capacity="1 KiB"):
            with virtual.on_virtual_device(1):
                torch.zeros(512)


def test_sizes_parse_and_bad_ones_are_refused():
    assert memory.parse_bytes("64 MiB") == 64 * 2**20 and memory.parse_bytes("1.5 GiB") == 3 * 2**29
    assert memory.parse_bytes(1000) == 1000 and memory.parse_bytes("500 MB") == 500 * 10**6
    for bad in ("64 parsecs", "lots", 0, -5, True, 1.5):
        with pytest.raises(ValueError):
            memory.parse_bytes(bad)


def test_on_real_gpus_a_capacity_is_a_memory_fraction_put_back_afterwards(monkeypatch):
    """Simulated GPUs of 1 GiB: ``capacity="256 MiB"`` runs the block under a per-process fraction of 0.25."""
    fake = FakeCudaAllocator([0, 0])
    fake.install(monkeypatch)
    monkeypatch.setattr(memory, "_printed_notices", set())
    fractions = {0: 1.0, 1: 0.9}
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda index: fractions[index])
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, index: fractions.__setitem__(index, f))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(total_memory=2**30))
    real = Devices([0, 1], virtual=False, primary=torch.device("cuda", 0), reason="two simulated GPUs")
    with memory.track(real, capacity="256 MiB") as trace:
        during = dict(fractions)
    assert during == {0: 0.25, 1: 0.25} and fractions == {0: 1.0, 1: 0.9} and trace.capacity == 2**28


class SimulatedCachingAllocator:
    """PyTorch's CUDA caching allocator reduced to the rules a memory fraction meets (``torch/cuda/memory.py``;
    ``alloc_block`` and ``malloc`` in ``c10/cuda/CUDACachingAllocator.cpp``), for simulated GPUs:

    * a request is served from free room in a segment the process already reserved, if any is large enough,
      whatever the fraction (``get_free_block``);
    * else a new segment (the request rounded up to 2 MiB) is reserved, unless reserved bytes plus the segment
      would pass ``fraction * total``; then the wholly free segments are released and it tries once more, and
      only then raises ``torch.OutOfMemoryError``;
    * ``empty_cache`` releases the wholly free segments.

    Segments are ``[size, used]``; free room in a used segment counts as "inactive split" bytes."""

    SEGMENT = 2 << 20

    def __init__(self, gpus: int, total: int):
        self.total = total
        self.segments: list[list[list[int]]] = [[] for _ in range(gpus)]
        self.fraction = [1.0] * gpus
        self.peak = [0] * gpus
        self.fractions_set: list[tuple[int, float]] = []

    def allocate(self, index: int, size: int) -> list[int]:
        """Allocate ``size`` bytes on GPU ``index``; returns the segment, for ``free``."""
        segments = self.segments[index]
        segment = next((s for s in segments if s[0] - s[1] >= size), None)
        if segment is None:
            rounded = -(-size // self.SEGMENT) * self.SEGMENT
            if not self._fits(index, rounded):
                self._release_free_segments(index)
                if not self._fits(index, rounded):
                    raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} bytes (simulated)")
            segment = [rounded, 0]
            segments.append(segment)
        segment[1] += size
        self.peak[index] = max(self.peak[index], self.allocated(index))
        return segment

    def free(self, segment: list[int], size: int) -> None:
        segment[1] -= size  # the segment stays reserved: the cache

    def _fits(self, index: int, size: int) -> bool:
        return self.reserved(index) + size <= self.fraction[index] * self.total

    def _release_free_segments(self, index: int) -> None:
        self.segments[index] = [s for s in self.segments[index] if s[1] > 0]

    def allocated(self, index: int) -> int:
        return sum(used for _, used in self.segments[index])

    def reserved(self, index: int) -> int:
        return sum(size for size, _ in self.segments[index])

    def stats(self, index: int) -> dict[str, int]:
        allocated = self.allocated(index)
        split = sum(size - used for size, used in self.segments[index] if used > 0)
        return {
            "allocated_bytes.all.current": allocated,
            "active_bytes.all.current": allocated,
            "inactive_split_bytes.all.current": split,
            "reserved_bytes.all.current": self.reserved(index),
        }

    def set_fraction(self, fraction, index):
        if not isinstance(fraction, float) or not 0 <= fraction <= 1:  # as torch.cuda.set_per_process_memory_fraction
            raise ValueError(f"bad fraction {fraction!r}")
        self.fraction[index] = fraction
        self.fractions_set.append((index, fraction))

    def reset(self, index):
        self.peak[index] = self.allocated(index)

    def empty_cache(self):
        for index in range(len(self.segments)):
            self._release_free_segments(index)

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.segments))
        monkeypatch.setattr(torch.cuda, "memory_allocated", self.allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda index: self.peak[index])
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "memory_stats", self.stats)
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)
        monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda index: self.fraction[index])
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", self.set_fraction)
        properties = types.SimpleNamespace(total_memory=self.total)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)


@pytest.mark.parametrize("earlier_cache", [0, 100], ids=["no cache", "an earlier block's 100 MiB cached"])
def test_on_real_gpus_the_capacity_is_room_for_the_block_on_top_of_what_the_process_holds(monkeypatch, earlier_cache):
    """A simulated 80 GiB GPU whose process holds 74 MiB before the block (cuBLAS's two 32 MiB workspaces, the
    main thread's and autograd's device thread's, and a 9 MiB tensor in a 10 MiB segment), and, in one case, a
    100 MiB segment left free by an earlier block. With ``capacity="64 MiB"`` the block gets 64 MiB: six 10 MiB
    tensors fit and a seventh runs out, as on virtual devices. A fraction of capacity / total refused the first
    (74 MiB already held), and the cache gave a block room beyond the capacity."""
    mib = 1 << 20
    gpu = SimulatedCachingAllocator(gpus=1, total=80 << 30)
    gpu.install(monkeypatch)
    monkeypatch.setattr(memory, "_printed_notices", set())
    for size in (32 * mib, 32 * mib, 9 * mib):
        gpu.allocate(0, size)
    if earlier_cache:
        gpu.free(gpu.allocate(0, earlier_cache * mib), earlier_cache * mib)
    real = Devices([0], virtual=False, primary=torch.device("cuda", 0), reason="one simulated GPU")
    held = []
    with pytest.raises(torch.OutOfMemoryError):
        with memory.track(real, interval=60, count_existing=False, capacity="64 MiB") as trace:
            for _ in range(7):
                held.append(gpu.allocate(0, 10 * mib))
    assert len(held) == 6 and trace.peaks() == [60 * mib]
    assert gpu.fraction == [1.0] and len(gpu.fractions_set) == 2  # set for the block, then put back


def test_on_real_gpus_a_capacity_counts_the_existing_bytes_the_trace_counts(monkeypatch):
    """``count_existing=True`` counts the 20 MiB that exist at the start against the capacity, as virtual devices
    count existing tensors on device 0: a 64 MiB capacity leaves the block 44 MiB."""
    mib = 1 << 20
    gpu = SimulatedCachingAllocator(gpus=1, total=80 << 30)
    gpu.install(monkeypatch)
    monkeypatch.setattr(memory, "_printed_notices", set())
    gpu.allocate(0, 20 * mib)
    real = Devices([0], virtual=False, primary=torch.device("cuda", 0), reason="one simulated GPU")
    held = []
    with pytest.raises(torch.OutOfMemoryError):
        with memory.track(real, interval=60, capacity="64 MiB") as trace:
            for _ in range(5):
                held.append(gpu.allocate(0, 10 * mib))
    assert len(held) == 4 and trace.peaks() == [60 * mib]


def test_the_out_of_memory_error_names_the_device_in_the_lessons_language(monkeypatch):
    from gpulab import messages

    from tests.english_text import gpulab_english_in

    monkeypatch.setattr(messages, "_chosen", ["ja"])
    devices = gpulab.devices(2, quiet=True, remember=False)
    with pytest.raises(torch.OutOfMemoryError) as raised:
        with memory.track(devices, count_existing=False, capacity="1 KiB"):
            with virtual.on_virtual_device(1):
                torch.zeros(512)
    said = str(raised.value)
    assert said.startswith("仮想デバイス1のメモリが足りません。") and "容量は" in said
    assert gpulab_english_in(said) == [], said


def test_garbage_in_a_reference_cycle_is_not_counted_as_existing(two_virtual):
    """A tensor held only by a reference cycle (an exception's traceback keeps frames like this) is collected
    before the existing tensors are counted: else the collector frees it mid-measurement, a drop on device 0 that
    no step caused (seen as 3,120 bytes missing from a DataParallel forward after earlier tests' raises)."""

    class Cycle:
        pass

    gc.disable()
    try:
        cycle = Cycle()
        cycle.itself, cycle.tensor = cycle, torch.empty(780)
        del cycle
        with memory.track(two_virtual) as trace:
            base = now(trace, 0)
            gc.collect()
            assert now(trace, 0) == base
    finally:
        gc.enable()
