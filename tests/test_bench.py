"""gpulab.bench: step timing (lesson 03) — warm-up, medians, throughput, progress bars, DDP ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gpulab import bench, plots
from gpulab.data_parallel import DataParallel
from gpulab.devices import Devices
from torch import nn


class FakeClock:
    """Stands in for time.perf_counter: each step advances it by the next of the given durations."""

    def __init__(self, durations):
        self.now = 0.0
        self.durations = list(durations)
        self.calls = 0

    def perf_counter(self):
        return self.now

    def step(self):
        self.calls += 1
        self.now += self.durations.pop(0)


@pytest.fixture
def clock(monkeypatch):
    def install(durations):
        fake = FakeClock(durations)
        monkeypatch.setattr(bench.time, "perf_counter", fake.perf_counter)
        return fake

    return install


def test_time_step_median_throughput_and_warmup(clock):
    fake = clock([9.0, 9.0, 0.01, 0.01, 0.5, 0.02, 0.03])  # two slow warm-up steps, one stray slow repeat
    timing = bench.time_step(fake.step, batch_size=64, warmup=2, repeats=5, label="one", progress=False)
    assert fake.calls == 7
    assert timing.times == pytest.approx([0.01, 0.01, 0.5, 0.02, 0.03])
    assert timing.median_s == pytest.approx(0.02)
    assert timing.samples_per_s == pytest.approx(64 / 0.02)
    assert (timing.label, timing.batch_size, timing.devices, timing.warmup) == ("one", 64, 1, 2)
    assert "ms/step" in str(timing) and timing.to_dict()["times"] == timing.times


def test_synchronize_brackets_every_timed_step(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "synchronize", lambda: calls.append("sync"))
    bench.time_step(lambda: calls.append("step"), 1, warmup=1, repeats=2, sync=True, progress=False)
    assert calls == ["step", "sync", "sync", "step", "sync", "sync", "step", "sync"]
    bench.synchronize()  # the real one: nothing to wait for without CUDA, and no error


def test_synchronize_touches_only_the_gpus_in_use(monkeypatch):
    """On a simulated 8-GPU box where this process used GPUs 0 and 1, only those two are synchronised: a call on
    the others would create a CUDA context there (and fail on an exclusive-process GPU another process holds)."""
    synced = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index=None: 2 << 20 if index in (0, 1) else 0)
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    bench.synchronize()
    assert synced == [0, 1]
    synced.clear()
    bench.synchronize([3])
    assert synced == [3]


def test_progress_bar_only_for_long_runs(clock, monkeypatch):
    opened = []
    monkeypatch.setattr(bench, "_progress_bar", lambda total, label, initial=0: opened.append(initial) or _Bar())
    fake = clock([1.0] * 3)
    bench.time_step(fake.step, 1, warmup=1, repeats=2)  # 3 steps of 1 s: under the threshold
    assert opened == []
    fake = clock([1.0] * 6)
    bench.time_step(fake.step, 1, warmup=1, repeats=5)  # 5 s left after the first step: a bar from there
    assert opened == [1]
    fake = clock([0.1, 0.1, 2.0, 2.0, 2.0])
    bench.time_step(fake.step, 1, warmup=0, repeats=5)  # turns slow at the third step: 2 x 2 s left
    assert opened == [1, 3]
    fake = clock([100.0] * 3)
    bench.time_step(fake.step, 1, warmup=1, repeats=2, progress=False)
    assert opened == [1, 3]
    bench.time_step(lambda: None, 1, warmup=1, repeats=2, progress=True)
    assert opened == [1, 3, 0]


class _Bar:
    def update(self, count):
        pass

    def close(self):
        pass


def test_real_progress_bar_runs(capsys):
    timing = bench.time_step(lambda: None, 4, warmup=0, repeats=3, progress=True, label="with a bar")
    assert len(timing.times) == 3


def test_bad_counts():
    for kwargs in ({"batch_size": 0}, {"batch_size": 8, "repeats": 0}, {"batch_size": 8, "warmup": -1}):
        with pytest.raises(ValueError):
            bench.time_step(lambda: None, **kwargs)


def test_compare_one_device_and_data_parallel(monkeypatch):
    two = Devices([0, 1], virtual=True, primary=torch.device("cpu"), reason="two virtual devices (test)")
    monkeypatch.setattr("gpulab.data_parallel.current_devices", lambda: two)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    inputs, targets = torch.randn(64, 16), torch.randint(0, 4, (64,))
    before = model[0].weight.detach().clone()
    single = bench.make_train_step(model, nn.functional.cross_entropy, inputs, targets)
    assert isinstance(single(), float)
    assert not torch.equal(model[0].weight, before)  # the step trained the model
    parallel = bench.make_train_step(DataParallel(model), nn.functional.cross_entropy, inputs, targets)
    results = bench.compare(
        {"1 device": single, "DataParallel x2": parallel},
        batch_size=64,
        warmup=1,
        repeats=3,
        devices={"DataParallel x2": 2},
        methods={"1 device": "single", "DataParallel x2": "DataParallel"},
        progress=False,
    )
    assert [r.label for r in results] == ["1 device", "DataParallel x2"]
    assert [r.devices for r in results] == [1, 2] and results[1].method == "DataParallel"
    assert all(len(r.times) == 3 and r.median_s > 0 and r.samples_per_s > 0 for r in results)
    figure = plots.plot_step_times(results, display=False)
    assert len(figure.axes[0].patches) == 2


def test_time_ddp_step_needs_a_process_group():
    with pytest.raises(RuntimeError, match="gpulab.ddp.launch"):
        bench.time_ddp_step(lambda: None, 8)


def test_time_ddp_step_in_a_one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        timing = bench.time_ddp_step(lambda: None, 16, warmup=1, repeats=4)
    finally:
        dist.destroy_process_group()
    assert (timing.rank, timing.world_size, timing.devices, timing.batch_size) == (0, 1, 1, 16)
    assert len(timing.times) == 4 and timing.method == "DDP"


def test_merge_ranks_takes_the_slowest_rank_per_step():
    common = {"batch_size": 32, "devices": 2, "method": "DDP", "world_size": 2}
    rank0 = bench.StepTiming("DDP", 0.0, 0.0, [0.010, 0.030, 0.010], rank=0, **common)
    rank1 = bench.StepTiming("DDP", 0.0, 0.0, [0.020, 0.010, 0.040], rank=1, **common)
    merged = bench.merge_ranks([rank0, rank1])
    assert merged.times == [0.020, 0.030, 0.040] and merged.median_s == pytest.approx(0.030)
    assert merged.samples_per_s == pytest.approx(32 / 0.030) and merged.rank is None
    with pytest.raises(ValueError):
        bench.merge_ranks([rank0, bench.StepTiming("DDP", 0.0, 0.0, [0.1], rank=1, **common)])
    with pytest.raises(ValueError):
        bench.merge_ranks([])


def timed_ddp_rank(rank: int, world_size: int, batch_size: int) -> bench.StepTiming:
    """A DDP rank that times its own training steps (what lesson 03's ddp_steps.py does)."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
    inputs, targets = torch.randn(batch_size, 8), torch.randint(0, 2, (batch_size,))
    step = bench.make_train_step(model, nn.functional.cross_entropy, inputs, targets)
    return bench.time_ddp_step(step, batch_size, warmup=1, repeats=3)


def test_ddp_ranks_return_timings_through_launch():
    from gpulab import ddp

    results = ddp.launch(timed_ddp_rank, 2, 8, timeout=120)
    assert [r.rank for r in results] == [0, 1]
    assert all(r.batch_size == 16 and r.devices == 2 and len(r.times) == 3 for r in results)
    merged = bench.merge_ranks(results)
    assert merged.median_s >= max(min(r.times) for r in results)
    figure = plots.plot_scaling([merged], display=False)
    assert figure.axes
