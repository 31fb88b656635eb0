"""The GPU check's parts (``scripts/gpu_check.py`` is the command): one module per step or concern.

``context`` (paths, statuses, ``StepContext``), one module per step (``environment``, ``gpu_tests``, ``timing``,
``memory_accuracy``, ``memory_capacity``, ``memory_overhead``, ``ddp_launch``, ``memory_imbalance``,
``link_traffic``, ``process_memory``, ``lessons``, ``autograde``), ``steps`` (every step the check knows),
``profiles`` (which steps a run takes, in which order, with how many seconds each), ``processes`` (each step in its
own process), ``report`` (the run, and its report and archive after every step) and ``prepare`` (``--bundle``'s
environment).
"""
