"""gpulab.gil: DataParallel's replica threads serialise on Python-bound work; DDP's processes do not (lesson 03).

Judged by ratios within one run, on a machine that other jobs may be using (see gpulab.gil's docstring)."""

from __future__ import annotations

import gpulab
import pytest
import torch
from gpulab import gil

ATTEMPTS = 3


def test_python_bound_forward_gives_one_number_per_sample_on_any_chunking():
    module = gil.PythonBound(work=50)
    batch = torch.arange(6, dtype=torch.float32).view(6, 1)
    whole = module(batch)
    assert whole.shape == (6,)
    parallel = gpulab.DataParallel(module, device_ids=gpulab.devices(2, quiet=True, remember=False))
    assert torch.equal(parallel(batch), whole)


def test_threads_take_the_serial_time_and_processes_less():
    """Two replica threads take about the time of one thread alone (without the GIL they would take half);
    two DDP processes take clearly less than one process alone."""
    runs = []
    for _ in range(ATTEMPTS):
        run = gil.measure(2, batch_size=16, work=100_000, repeats=5)
        runs.append(run)
        if run.threads_ratio > 0.8 and run.processes_ratio < 0.85:
            break
    else:
        pytest.fail("; ".join(f"threads {r.threads_ratio:.2f}, processes {r.processes_ratio:.2f}" for r in runs))
    assert len(run.processes) == len(run.threads) == 5
    assert "DataParallel" in run.summary() and run.to_dict()["threads_ratio"] == run.threads_ratio
    assert len(run.plot(display=False).axes) == 1


def test_measure_takes_rank_times_from_a_launch_already_made():
    fake = [{"serial": [1.0, 0.8], "parallel": [0.5, 0.45]}, {"serial": [], "parallel": [0.55, 0.4]}]
    run = gil.measure(2, batch_size=4, work=10, repeats=2, ranks=fake)
    assert run.processes == [0.55, 0.45] and run.processes_ratio == pytest.approx(0.45 / 0.8)
    with pytest.raises(ValueError):
        gil.measure(2, batch_size=4, work=10, repeats=2, ranks=fake[:1])
