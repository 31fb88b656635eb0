"""The exercises of each lesson, declared as ``gpulab.check.Exercise`` objects (one module per lesson)."""
