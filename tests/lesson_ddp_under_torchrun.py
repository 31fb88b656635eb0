"""Run one lesson's DDP function under ``torchrun`` (``tests/test_ddp.py`` starts two of these as two "nodes").

Usage: ``torchrun ... tests/lesson_ddp_under_torchrun.py LESSON OUT_DIR``. Each rank calls the lesson module's
function through ``gpulab.ddp.run_under_torchrun``, the command-line twin of ``gpulab.ddp.launch`` the lessons
show, and saves what it returned, with the ranks torchrun gave it, to ``OUT_DIR/rank<RANK>.pt``.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import gpulab
import torch
from gpulab import ddp

SOURCE = Path(__file__).resolve().parent.parent / "source"


def lesson_call(lesson: str, out_dir: Path):
    """``(function, args)``: the lesson's DDP function and arguments like the ones its notebook passes."""
    if lesson == "02_gradient_averaging":
        module = _import(lesson, "ddp_averaging")
        batches = [gpulab.data.classification(samples=8, features=4, classes=3, seed=1)]
        batches.append(gpulab.data.classification(samples=7, features=4, classes=3, seed=2))
        return module.both_demos, (batches, 0)
    if lesson == "03_gpu0_imbalance":
        module = _import(lesson, "ddp_imbalance")
        sizes = dict(in_features=8, hidden=16, classes=64)
        batch = gpulab.data.classification(32, 8, 64, seed=1)
        return module.memory_and_traffic, (batch, sizes, 2, batch)
    if lesson == "04_checkpoints":
        module = _import(lesson, "ddp_checkpoint")
        return module.train_and_checkpoint, (str(out_dir),)
    raise ValueError(f"no DDP function in lesson {lesson}")


def _import(lesson: str, name: str):
    sys.path.insert(0, str(SOURCE / lesson))
    return importlib.import_module(name)


if __name__ == "__main__":
    lesson, out_dir = sys.argv[1], Path(sys.argv[2])
    fn, args = lesson_call(lesson, out_dir)
    result = ddp.run_under_torchrun(fn, *args)
    ranks = {name: int(os.environ[name]) for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")}
    torch.save({"ranks": ranks, "result": result}, out_dir / f"rank{ranks['RANK']}.pt")
