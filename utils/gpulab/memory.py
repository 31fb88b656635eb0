"""Per-device memory over time, measured: ``with gpulab.memory.track() as trace: ...``.

Lesson 03 (GPU-0 imbalance) uses it to show, live and then as numbers, that DataParallel's output device holds
more memory than the others, and that computing the loss inside the model's forward removes most of that
excess. The same code runs in both modes of ``gpulab.devices``:

* **Real GPUs.** A background thread samples ``torch.cuda.memory_allocated`` and
  ``torch.cuda.max_memory_allocated`` (the peak statistics are reset when the block starts) and, through NVML
  (the ``pynvml`` module of ``nvidia-ml-py``), the memory the driver reports as used on each GPU, which also
  counts the CUDA context, PyTorch's cache and other processes. When NVML is missing or fails, the trace keeps
  PyTorch's numbers and says so once, in ``trace.notice``.
* **Virtual devices.** Several virtual devices share one physical device, so the allocator cannot say which
  virtual device holds what. A dispatch-level tracker (a ``TorchDispatchMode``) sees every ATen operation,
  attributes every new storage to the virtual device that made it and counts its bytes until the storage is
  freed. Attribution follows where the real GPUs would hold the data: a transfer (``gpulab.virtual.placing_on``)
  puts its outputs on the target device; any other operation puts its outputs where its inputs live; a tensor
  made from nothing belongs to the current thread's virtual device (each DataParallel replica thread runs on
  its own). Outputs that share an input's storage (views, in-place operations) add nothing. Tensors that exist
  when the block starts (the model's parameters, the optimizer's state, the data) are counted on the first
  device, where everything outside DataParallel lives. Peaks are updated at each allocation, so they are exact,
  not sampled. Samples are taken when memory changes (at most one per ``interval``), plus one now and then by
  the background thread: frequent wake-ups of a second Python thread slow every tracked operation down on a
  busy machine (measured: see ``benchmarks/bench_memory_overhead.py``).

The trace keeps everything as plain lists (``trace.times``, ``trace.allocated[i]``, ``trace.peak[i]``,
``trace.nvml_used[i]``, ``trace.marks``) and ``trace.peaks()``, so tests and graders assert on numbers and
``gpulab.plots`` draws them.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpulab import nvml, virtual
from gpulab.devices import Devices, current_devices, remembered_devices
from gpulab.messages import message

__all__ = ["MIB", "Trace", "parse_bytes", "track"]

MIB = 1024 * 1024

# On virtual devices without a live plot, the sampler thread wakes at most this often (samples are otherwise
# taken when memory changes).
QUIET_SAMPLE_S = 0.5

# Notices (NVML unavailable, ...) are printed once per process, then only kept on each trace's ``notice``.
_printed_notices: set[str] = set()
_printed_lock = threading.Lock()


def _announce(line: str) -> None:
    """Print ``line`` the first time it occurs in this process (stdout: nbgrader penalises stderr)."""
    with _printed_lock:
        if line in _printed_notices:
            return
        _printed_notices.add(line)
    print(line)


# --------------------------------------------------------------------------------------------------------------
# The trace: data only, filled by a sampler.
# --------------------------------------------------------------------------------------------------------------


class Trace:
    """What ``track()`` measured: per-device memory over time, peaks, and labelled marks (lesson 03).

    Attributes (plain Python values, safe to assert on and to serialise):

    * ``devices``: the device ids, in order; every per-device list below follows this order.
    * ``virtual``: True for virtual devices (dispatch-level tracker), False for real GPUs.
    * ``backing``: the physical device as a string (``"cpu"``, ``"cuda:0"``, or ``"cuda"`` for real GPUs).
    * ``times``: seconds since the block started, one per sample.
    * ``allocated[i]``: bytes allocated on device ``devices[i]`` at each sample.
    * ``peak[i]``: the peak bytes since the block started, as known at each sample.
    * ``highest[i]``: the highest allocated bytes since the previous sample, so that short spikes between two
      samples still show (exact on virtual devices; the allocator's peak over the window on real GPUs).
    * ``nvml_used[i]``: bytes the driver reports as used on the GPU at each sample (real GPUs with NVML);
      an empty list otherwise.
    * ``marks``: ``(time, label)`` pairs added with ``mark()``.
    * ``notice``: one line saying what could not be measured (e.g. NVML unavailable), else ``None``.
    * ``capacity``: the bytes each device may hold (``track(capacity=...)``), else ``None``.
    * ``out_of_memory``: on virtual devices with a capacity, the allocation that was refused
      (``{"device", "tried", "allocated", "capacity"}`` in bytes), else ``None``.
    """

    def __init__(self, devices: Sequence[int], *, virtual: bool, backing: str, interval: float):
        self.devices: list[int] = list(devices)
        self.virtual = virtual
        self.backing = backing
        self.interval = interval
        self.times: list[float] = []
        self.allocated: list[list[int]] = [[] for _ in self.devices]
        self.peak: list[list[int]] = [[] for _ in self.devices]
        self.highest: list[list[int]] = [[] for _ in self.devices]
        self.nvml_used: list[list[int]] = [[] for _ in self.devices]
        self.marks: list[tuple[float, str]] = []
        self.notice: str | None = None
        self.capacity: int | None = None
        self.out_of_memory: dict[str, int] | None = None
        self.running = False
        self._start = time.perf_counter()
        self._lock = threading.Lock()
        self._source: _Source | None = None
        self._final_peaks: list[int] | None = None
        self._last_sample = 0.0  # perf_counter() of the latest sample

    # -- recording (called by the sampler and by mark) -------------------------------------------------------

    def _record(self) -> None:
        source = self._source
        if source is None:
            return
        with self._lock:
            # Read and stored under the lock so that samples from the sampler and from mark() stay in order.
            allocated, peaks, highest, nvml = source.read()
            self._last_sample = time.perf_counter()
            self.times.append(self._last_sample - self._start)
            for i in range(len(self.devices)):
                self.allocated[i].append(allocated[i])
                self.peak[i].append(peaks[i])
                self.highest[i].append(highest[i])
                if nvml is not None:
                    self.nvml_used[i].append(nvml[i])

    def _sample_if_due(self) -> None:
        """Take a sample if the latest one is at least ``interval`` old (called when memory changes)."""
        if time.perf_counter() - self._last_sample >= self.interval and self.running:
            self._record()

    def mark(self, label: str) -> None:
        """Label this moment (e.g. ``"step 3"`` or ``"backward"``); a sample is taken at the same time.

        Lesson 03 marks each training step so the plot shows where steps begin.
        """
        now = time.perf_counter() - self._start
        with self._lock:
            self.marks.append((now, str(label)))
        if self.running:
            self._record()

    # -- reading ---------------------------------------------------------------------------------------------

    def peaks(self) -> list[int]:
        """Peak bytes per device since the block started, first device first (lesson 03).

        Like ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. On virtual devices the
        peaks are exact (updated at every allocation), not limited by the sampling interval. Inside the block
        it returns the peaks so far.
        """
        if self._final_peaks is not None:
            return list(self._final_peaks)
        if self._source is not None:
            with self._lock:  # not while a sample is being read (on GPUs a read resets the window's peak)
                return list(self._source.read_peaks())
        return [max(series, default=0) for series in self.peak]

    @property
    def duration(self) -> float:
        """Seconds between the first and the last sample (lesson 03)."""
        with self._lock:
            return self.times[-1] - self.times[0] if self.times else 0.0

    def snapshot(self) -> dict[str, Any]:
        """A consistent copy of the series so far: what ``gpulab.plots`` draws while lesson 03's block runs."""
        with self._lock:
            return {
                "devices": list(self.devices),
                "virtual": self.virtual,
                "times": list(self.times),
                "allocated": [list(series) for series in self.allocated],
                "peak": [list(series) for series in self.peak],
                "highest": [list(series) for series in self.highest],
                "nvml_used": [list(series) for series in self.nvml_used],
                "marks": list(self.marks),
            }

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready plain values (lesson 03's graders and the benchmarks use it)."""
        data = self.snapshot()
        data["marks"] = [{"time": moment, "label": label} for moment, label in data["marks"]]
        data.update(
            backing=self.backing,
            interval=self.interval,
            peaks=self.peaks(),
            notice=self.notice,
            capacity=self.capacity,
            out_of_memory=self.out_of_memory,
        )
        return data

    def summary(self) -> str:
        """A few lines in MiB: each device's peak and last allocated value, plus the notice (lesson 03)."""
        peaks = self.peaks()
        kind = message("memory.virtual_on", backing=self.backing) if self.virtual else message("memory.real_gpus")
        with self._lock:
            seconds = f"{self._duration_unlocked():.2f}"
            lines = [message("memory.summary", kind=kind, samples=len(self.times), seconds=seconds)]
            for i, device in enumerate(self.devices):
                now = self.allocated[i][-1] if self.allocated[i] else 0
                line = message(
                    "memory.summary_device", device=device, peak=f"{peaks[i] / MIB:9.1f}", now=f"{now / MIB:9.1f}"
                )
                if self.nvml_used[i]:
                    line += message("memory.summary_nvml", used=f"{self.nvml_used[i][-1] / MIB:9.1f}")
                lines.append(line)
        if self.notice:
            lines.append(message("memory.note", notice=self.notice))
        return "\n".join(lines)

    def _duration_unlocked(self) -> float:
        return self.times[-1] - self.times[0] if self.times else 0.0

    def __repr__(self) -> str:
        peaks = ", ".join(f"{peak / MIB:.1f}" for peak in self.peaks())
        kind = "virtual" if self.virtual else "cuda"
        return f"<Trace {kind} devices={self.devices} samples={len(self.times)} peaks MiB=[{peaks}]>"

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython shows the summary
        printer.text(self.summary())


# --------------------------------------------------------------------------------------------------------------
# Sources: where the numbers come from.
# --------------------------------------------------------------------------------------------------------------


class _Source:
    """Reads allocated / peak (and maybe NVML-used) bytes for every tracked device."""

    notice: str | None = None

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def read(self) -> tuple[list[int], list[int], list[int], list[int] | None]:
        """``(allocated, peak, highest since the last read, NVML used or None)``, one value per device."""
        raise NotImplementedError

    def read_peaks(self) -> list[int]:
        return self.read()[1]  # pragma: no cover - every source overrides it


def held_by_the_allocator(index: int) -> int:
    """Bytes of GPU ``index`` that PyTorch's caching allocator holds and cannot give back: its reserved segments
    less the wholly free ones (``reserved - active - inactive split``, segments it releases before it refuses an
    allocation). Read from ``torch.cuda.memory_stats``, which opens no context.

    The per-process memory fraction caps the allocator's reserved bytes: a new segment is refused when
    ``total_allocated_memory + size > allowed_memory_maximum`` (``c10/cuda/CUDACachingAllocator.cpp:
    alloc_block``; ``allowed_memory_maximum`` is the fraction times the GPU's memory), after the allocator has
    released its wholly free cached segments and tried again. So what a block may still take is that cap less
    what this returns: cuBLAS's workspaces, earlier tensors, and the unused rest of their segments."""
    stats = torch.cuda.memory_stats(index)
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    in_use = int(stats.get("active_bytes.all.current", 0)) + int(stats.get("inactive_split_bytes.all.current", 0))
    return min(reserved, in_use)


class _CudaSource(_Source):
    """Real GPUs: PyTorch's allocator statistics plus NVML's used memory when NVML works.

    Measured from the block's start when ``count_existing=False``, as on virtual devices: the bytes allocated
    when the block starts (inputs, leftovers, cuBLAS workspaces from earlier calls) are a baseline subtracted
    from every reading, so lesson 03's ratios, the DDP ranks' peaks and the exercise helpers compare what the
    block itself allocated. (Found by reading: the CUDA source used to ignore ``count_existing`` and report
    absolute numbers.) A block that frees memory that existed before it can then read below zero.

    The highest value between two samples is the allocator's own peak over that window: each read takes
    ``torch.cuda.max_memory_allocated`` and then ``torch.cuda.reset_peak_memory_stats``, and the block's peak
    is the highest of those windows. So the shaded spikes lesson 03 shows on virtual devices appear on GPUs too
    (a spike in the instant between the read and the reset is missed). Resetting the peak statistics is
    process-wide: code in the block that reads ``max_memory_allocated`` itself sees the window's peak.
    Not run on a GPU; ``tests/test_memory.py`` drives it with simulated allocator statistics.
    """

    def __init__(self, device_ids: Sequence[int], count_existing: bool = True, capacity: int | None = None):
        self.device_ids = list(device_ids)
        self.count_existing = count_existing
        self.capacity = capacity
        self.fractions: list[float] = []
        self.baseline = [0 for _ in self.device_ids]
        self.block_peaks = [0 for _ in self.device_ids]
        self.handles: list[Any] | None = None
        self.pynvml: Any = None
        self.nvml_started = False

    def start(self) -> None:
        for i, index in enumerate(self.device_ids):
            torch.cuda.reset_peak_memory_stats(index)
            now = torch.cuda.memory_allocated(index)
            self.baseline[i] = 0 if self.count_existing else now
            self.block_peaks[i] = now - self.baseline[i]
        if self.capacity is not None:
            # Room for the block on top of what the process holds: a fraction of capacity / total would count
            # cuBLAS's workspaces, earlier tensors and their segments' rounding too. The cache goes first: the
            # allocator hands out cached blocks without consulting the fraction, so an earlier block's cache would
            # be room beyond the capacity. Put back as it was when the block ends. Not run on a GPU.
            torch.cuda.empty_cache()
            for i, index in enumerate(self.device_ids):
                self.fractions.append(torch.cuda.get_per_process_memory_fraction(index))
                limit = held_by_the_allocator(index) + max(0, self.capacity - self.block_peaks[i])
                total = torch.cuda.get_device_properties(index).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), index)
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml_started = True
            self.pynvml = pynvml
            self.handles = [nvml.handle(pynvml, index) for index in self.device_ids]
            for handle in self.handles:
                pynvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception as error:  # noqa: BLE001 - any NVML failure degrades to PyTorch's numbers
            self.handles = None
            self.notice = message("memory.nvml_unavailable", error=f"{type(error).__name__}: {error}")

    def stop(self) -> None:
        for index, fraction in zip(self.device_ids, self.fractions, strict=False):
            torch.cuda.set_per_process_memory_fraction(fraction, index)
        self.fractions = []
        if self.nvml_started:
            with contextlib.suppress(Exception):
                self.pynvml.nvmlShutdown()
            self.nvml_started = False

    def read(self):
        allocated, highest = [], []
        for i, index in enumerate(self.device_ids):
            allocated.append(torch.cuda.memory_allocated(index) - self.baseline[i])
            window = torch.cuda.max_memory_allocated(index) - self.baseline[i]
            torch.cuda.reset_peak_memory_stats(index)  # the next window starts here
            highest.append(window)
            self.block_peaks[i] = max(self.block_peaks[i], window)
        nvml = None
        if self.handles is not None:
            try:
                nvml = [int(self.pynvml.nvmlDeviceGetMemoryInfo(handle).used) for handle in self.handles]
            except Exception as error:  # noqa: BLE001 - NVML failing mid-run: keep going without it
                self.handles = None
                self.notice = message("memory.nvml_stopped", error=f"{type(error).__name__}: {error}")
                nvml = None
        return allocated, list(self.block_peaks), highest, nvml

    def read_peaks(self) -> list[int]:
        return [
            max(peak, torch.cuda.max_memory_allocated(index) - baseline)
            for peak, index, baseline in zip(self.block_peaks, self.device_ids, self.baseline, strict=True)
        ]


class _Ledger:
    """Shared state of the virtual-device tracker: which storage lives where, and the per-device counts.

    One ledger per ``track()`` block, shared by the tracker modes of every thread (each thread pushes its own
    ``_TrackerMode`` object, because a mode object keeps per-entry state and dispatch modes are per-thread).
    Storages are keyed by their C++ address (``untyped_storage()._cdata``); a weak reference to the storage's
    Python object tells when it is freed: PyTorch keeps that object alive exactly as long as the C++ storage,
    even after the last Python reference is gone (views, autograd's saved tensors and replicas all hold it).
    """

    def __init__(self, device_ids: Sequence[int], backing: torch.device, capacity: int | None = None):
        self.device_ids = list(device_ids)
        self.capacity = capacity  # bytes per virtual device, or None: no limit
        self.out_of_memory: dict[str, int] | None = None  # the refused allocation, if one was
        self.home = self.device_ids[0]
        self.backing = backing
        self.lock = threading.RLock()
        # storage key -> [virtual device, bytes, weak reference to the storage]
        self.entries: dict[int, list] = {}
        self.allocated: dict[int, int] = {device: 0 for device in self.device_ids}
        self.peak: dict[int, int] = {device: 0 for device in self.device_ids}
        self.window: dict[int, int] = {device: 0 for device in self.device_ids}  # highest since the last read
        self.threads = threading.local()  # .active: this thread already runs a tracker mode
        self.on_change: Any = None  # called after new storages were counted (outside the lock)
        self.closed = False
        self.cpu_backing = backing.type == "cpu"
        if self.cpu_backing:
            self.on_backing = _is_cpu
        else:
            self.on_backing = functools.partial(_is_on, backing)

    # -- bookkeeping -----------------------------------------------------------------------------------------

    def add(self, storage: torch.UntypedStorage, key: int, device: int) -> None:
        """Count a storage not seen before on ``device`` (caller holds the lock)."""
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        self._check_capacity(device, nbytes)
        ref = weakref.ref(storage, functools.partial(self._freed, key))
        self.entries[key] = [device, nbytes, ref]
        self._count(device, nbytes)

    def grow(self, entry: list, nbytes: int) -> None:
        """A known storage was resized (``resize_``, ``out=``): count the extra bytes where it lives."""
        extra = nbytes - entry[1]
        self._check_capacity(entry[0], extra)
        entry[1] = nbytes
        self._count(entry[0], extra)

    def _check_capacity(self, device: int, extra: int) -> None:
        """Refuse ``extra`` bytes on ``device`` beyond its capacity, as the CUDA allocator does: raise PyTorch's
        own ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same class) and count nothing.
        The operation's result is then dropped, so its memory is freed at once."""
        if self.capacity is None:
            return
        allocated = self.allocated.get(device, 0)
        if allocated + extra <= self.capacity:
            return
        self.out_of_memory = {"device": device, "tried": extra, "allocated": allocated, "capacity": self.capacity}
        raise torch.OutOfMemoryError(
            message(
                "memory.out_of_memory",
                device=device,
                tried=extra / MIB,
                capacity=self.capacity / MIB,
                free=max(0, self.capacity - allocated) / MIB,
                allocated=allocated / MIB,
            )
        )

    def _count(self, device: int, extra: int) -> None:
        """Add ``extra`` bytes to ``device`` and raise its window and overall peaks (caller holds the lock)."""
        total = self.allocated.get(device, 0) + extra
        self.allocated[device] = total
        if total > self.window.get(device, 0):
            self.window[device] = total
            if total > self.peak.get(device, 0):
                self.peak[device] = total

    def _freed(self, key: int, ref: weakref.ref) -> None:
        with self.lock:
            entry = self.entries.get(key)
            if entry is None or entry[2] is not ref:
                return
            del self.entries[key]
            self.allocated[entry[0]] = self.allocated.get(entry[0], 0) - entry[1]

    def adopt_existing(self) -> None:
        """Count every tensor that already exists (parameters, optimizer state, data) on the first device.

        Unreachable garbage is collected first: a tensor held only by a reference cycle (an exception's traceback
        and the frames it keeps) would be counted now and freed whenever the collector runs, a drop on device 0
        in the middle of a measurement that no step of the lesson caused."""
        gc.collect()
        with self.lock:
            for obj in gc.get_objects():
                # type(), not isinstance(): isinstance reads __class__, which some lazy module attributes
                # turn into a deprecation warning on stderr (e.g. torch.distributed.reduce_op).
                if not issubclass(type(obj), torch.Tensor):
                    continue
                try:
                    if not self.on_backing(obj):
                        continue
                    storage = obj.untyped_storage()
                except Exception:  # noqa: BLE001 - sparse, meta, fake or otherwise storage-less tensors
                    continue
                if storage._cdata not in self.entries:
                    self.add(storage, storage._cdata, self.home)

    def read(self) -> tuple[list[int], list[int], list[int]]:
        """Allocated, peak, and highest since the previous read (which starts a new window)."""
        with self.lock:
            allocated = [self.allocated.get(device, 0) for device in self.device_ids]
            peaks = [self.peak.get(device, 0) for device in self.device_ids]
            highest = [
                max(self.window.get(device, 0), now) for device, now in zip(self.device_ids, allocated, strict=True)
            ]
            self.window = dict(self.allocated)
            return allocated, peaks, highest

    def read_peaks(self) -> list[int]:
        with self.lock:
            return [self.peak.get(device, 0) for device in self.device_ids]

    def close(self) -> None:
        """Forget every storage: the weak references go, so no callback fires after the block."""
        with self.lock:
            self.closed = True
            self.entries.clear()

    # -- the per-operation rule ------------------------------------------------------------------------------

    def record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Attribute the new storages among ``out`` (see the module docstring for the rule).

        This runs after every ATen operation, so it is written for speed: known storages (views, in-place
        results) cost one dictionary lookup; only ``out=`` and resizing operations are checked for growth.
        """
        if isinstance(out, torch.Tensor):
            outputs: Iterable = (out,)
        elif isinstance(out, (tuple, list)):
            outputs = out
        else:
            return
        entries = self.entries
        cpu = self.cpu_backing
        may_resize = None
        fresh = None
        for tensor in outputs:
            if not isinstance(tensor, torch.Tensor):
                continue
            try:
                if not (tensor.is_cpu if cpu else self.on_backing(tensor)):
                    continue
                storage = tensor.untyped_storage()
            except Exception:  # noqa: BLE001 - storage-less tensors
                continue
            key = storage._cdata
            entry = entries.get(key)
            if entry is None:
                if fresh is None:
                    fresh = []
                fresh.append((storage, key))
                continue
            if may_resize is None:
                may_resize = id(func) in _RESIZING or (bool(kwargs) and "out" in kwargs)
            if may_resize and storage.nbytes() > entry[1]:
                with self.lock:
                    if not self.closed:
                        self.grow(entry, storage.nbytes())
        if fresh is None:
            return
        with self.lock:
            if self.closed:
                return
            device = virtual.forced_virtual_device()
            here = virtual.current_virtual_device()
            # Inputs: the first known storage decides the device; unknown ones (made outside the dispatcher,
            # e.g. torch.tensor or from_numpy) are discovered now and belong to this thread's device.
            for tensor in _tensors_in(args, kwargs):
                try:
                    if not self.on_backing(tensor):
                        continue
                    storage = tensor.untyped_storage()
                except Exception:  # noqa: BLE001
                    continue
                entry = entries.get(storage._cdata)
                if entry is None:
                    self.add(storage, storage._cdata, here)
                elif device is None:
                    device = entry[0]
            if device is None:
                device = here
            for storage, key in fresh:
                if key not in entries:
                    self.add(storage, key, device)
        if self.on_change is not None:
            # Memory changed: sample now if a sample is due. Virtual devices thus need no frequent wake-ups of
            # the sampler thread, which on a busy machine cost more than the samples themselves.
            self.on_change()


def _resizing_overloads() -> frozenset[int]:
    """Ids of every overload of the operations that can grow a storage in place (besides ``out=``).

    Ids, because ``OpOverload`` hashes in Python; the overload objects are cached by ``torch.ops`` for the
    life of the process, so their ids are stable.
    """
    overloads = set()
    for name in ("resize_", "resize_as_", "set_"):
        packet = getattr(torch.ops.aten, name)
        overloads.update(id(getattr(packet, overload)) for overload in packet.overloads())
    return frozenset(overloads)


_RESIZING = _resizing_overloads()


def _is_cpu(tensor: torch.Tensor) -> bool:
    return tensor.is_cpu


def _is_on(backing: torch.device, tensor: torch.Tensor) -> bool:
    return tensor.device == backing


def _tensors_in(args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    """Tensor arguments of an ATen call in order (ATen nests at most lists of tensors)."""
    for value in args:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    yield item
    if kwargs:
        for value in kwargs.values():
            if isinstance(value, torch.Tensor):
                yield value
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, torch.Tensor):
                        yield item


class _TrackerMode(TorchDispatchMode):
    """Sees every ATen operation run in its thread and hands its outputs to the ledger."""

    def __init__(self, ledger: _Ledger):
        super().__init__()
        self.ledger = ledger

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # By default PyTorch wraps __torch_dispatch__ in torch._dynamo.disable: importing torch._dynamo costs
        # about a second on first use and the wrapper adds time to every operation. The tracker never runs
        # under torch.compile, so it opts out (tests/test_memory.py checks that the opt-out still works).
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        out = func(*args, **kwargs)
        self.ledger.record(func, args, kwargs, out)
        return out


class _VirtualSource(_Source):
    """Virtual devices: the dispatch-level tracker in the calling thread and in every replica thread."""

    def __init__(
        self, device_ids: Sequence[int], backing: torch.device, count_existing: bool = True, capacity: int | None = None
    ):
        self.ledger = _Ledger(device_ids, backing, capacity)
        self.count_existing = count_existing
        self.stack: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def _enter_thread(self) -> Iterator[None]:
        """What a replica thread enters (registered with ``virtual.register_thread_hook``)."""
        threads = self.ledger.threads
        if getattr(threads, "active", False) or self.ledger.closed:
            # Already tracked (a single replica runs in the caller's thread): one mode per thread is enough.
            yield
            return
        threads.active = True
        try:
            with _TrackerMode(self.ledger):
                yield
        finally:
            threads.active = False

    def start(self) -> None:
        if self.count_existing:
            self.ledger.adopt_existing()
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(self._enter_thread())
            virtual.register_thread_hook(self._enter_thread)
            stack.callback(virtual.unregister_thread_hook, self._enter_thread)
        except BaseException:
            stack.close()
            raise
        self.stack = stack

    def stop(self) -> None:
        if self.stack is not None:
            stack, self.stack = self.stack, None
            stack.close()

    def read(self):
        allocated, peaks, highest = self.ledger.read()
        return allocated, peaks, highest, None

    def read_peaks(self) -> list[int]:
        return self.ledger.read_peaks()

    def close(self) -> None:
        self.ledger.close()


# --------------------------------------------------------------------------------------------------------------
# The public context manager.
# --------------------------------------------------------------------------------------------------------------


def _resolve_devices(devices: Any) -> tuple[list[int], bool, torch.device | None]:
    """``(ids, virtual, backing)`` from a ``Devices`` list, a list of ints / torch.devices, or ``None``."""
    if devices is None:
        devices = current_devices()
    if isinstance(devices, Devices):
        return list(devices), devices.virtual, devices.backing
    ids = []
    for device in devices:
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "cuda" or device.index is None:
                raise ValueError(f"expected device ids or cuda:N devices, got {device}")
            device = device.index
        if not isinstance(device, int) or isinstance(device, bool):
            raise ValueError(f"expected device ids or cuda:N devices, got {device!r}")
        ids.append(device)
    if not ids:
        raise ValueError("track() needs at least one device")
    # Plain ids are GPUs unless the lesson chose virtual devices or the GPUs do not exist. Only a choice already
    # made counts: making one (current_devices() -> devices(2)) would prepare CUDA threads on GPUs 0 and 1, and a
    # DDP rank tracking its own GPU (``track([rank])`` in a fresh process) would create a CUDA context on the
    # other ranks' GPUs (several hundred MiB each; an error in exclusive-process mode).
    chosen = remembered_devices()
    if (chosen is not None and chosen.virtual) or max(ids) >= torch.cuda.device_count():
        backing = chosen.backing if chosen is not None and chosen.virtual else None
        if backing is None:
            backing = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        return ids, True, backing
    return ids, False, None


@contextlib.contextmanager
def track(
    devices: Any = None,
    interval: float = 0.05,
    live: Any = False,
    *,
    count_existing: bool = True,
    capacity: int | str | None = None,
) -> Iterator[Trace]:
    """Record per-device memory while the block runs; yields the ``Trace`` being filled (lesson 03).

    ``devices``: a ``gpulab.devices(...)`` result, a list of device ids, or ``None`` for the devices chosen by
    the last ``gpulab.devices`` call. ``interval``: seconds between samples (on virtual devices: at most one
    sample per interval, taken when memory changes).
    ``live=True`` shows a per-device plot that updates in place while the block runs (``gpulab.plots``); a
    ``gpulab.plots.LivePlot`` may be passed instead to control it. ``count_existing``: count the
    memory that exists when the block starts (on virtual devices: on the first device), as a GPU's allocator
    would (the default); ``False`` counts only what the block allocates, on real GPUs as on virtual devices
    (there the allocator's bytes at the start are subtracted). ``capacity`` (bytes, or a size such as
    ``"64 MiB"``): what each device may hold, a GPU's memory scaled down. On virtual devices, an allocation that
    would take a device past it raises PyTorch's own ``torch.OutOfMemoryError`` naming that device, and
    ``trace.out_of_memory`` keeps what was refused. On real GPUs the allocator's cache is emptied and the block
    runs under ``torch.cuda.set_per_process_memory_fraction``, set to what the process holds when the block starts
    (cuBLAS's workspaces, earlier tensors, their segments' rounding) plus the capacity, less what the trace counts
    at the start (nothing with ``count_existing=False``): room for the block, as on virtual devices, rounded as
    the allocator rounds segments (not run on a GPU). On a CPU-backed machine every CPU tensor counts,
    including data that a real GPU box would keep in host memory: keep big datasets out of the way or use
    ``False`` when comparing blocks that should not include them.

    Example (lesson 03)::

        with gpulab.memory.track(live=True) as trace:
            for step, (x, y) in enumerate(batches):
                trace.mark(f"step {step}")
                loss = loss_fn(model(x), y)
                loss.backward()
        trace.peaks()   # bytes per device, device 0 first

    The sampler thread and the tracker always stop when the block ends, also when it raises.
    """
    if interval <= 0:
        raise ValueError(f"interval must be > 0 seconds, got {interval}")
    limit = None if capacity is None else parse_bytes(capacity)
    ids, is_virtual, backing = _resolve_devices(devices)
    source: _Source = (
        _VirtualSource(ids, backing, count_existing, limit) if is_virtual else _CudaSource(ids, count_existing, limit)
    )
    trace = Trace(ids, virtual=is_virtual, backing=str(backing) if is_virtual else "cuda", interval=interval)
    trace.capacity = limit
    plot = _live_plot(live, trace)
    sampler: _Sampler | None = None
    started = False
    try:
        source.start()
        started = True
        if source.notice:
            trace.notice = source.notice
            _announce(f"gpulab.memory: {source.notice}")
        trace._source = source
        trace.running = True
        trace._start = time.perf_counter()
        trace._record()
        if isinstance(source, _VirtualSource):
            source.ledger.on_change = trace._sample_if_due
        if plot is not None:
            plot.show()
        # Real GPUs: the thread is the only way to sample. Virtual devices: samples are taken when memory changes;
        # the thread adds one now and then for long quiet stretches, and drives the live plot.
        period = interval if not is_virtual or plot is not None else max(interval, QUIET_SAMPLE_S)
        sampler = _Sampler(trace, period, plot)
        sampler.start()
        yield trace
    finally:
        try:
            if sampler is not None:
                sampler.stop()
            if started:
                trace._record()
                trace._final_peaks = source.read_peaks()
        finally:
            trace.running = False
            if isinstance(source, _VirtualSource):
                source.ledger.on_change = None
                trace.out_of_memory = source.ledger.out_of_memory
            source.stop()
            if isinstance(source, _VirtualSource):
                source.close()
            if source.notice and source.notice != trace.notice:
                trace.notice = source.notice
                _announce(f"gpulab.memory: {source.notice}")
            trace._source = None
            if plot is not None:
                try:
                    plot.finish(trace)
                except Exception as error:  # noqa: BLE001 - a broken picture must not hide the block's error
                    _announce(
                        "gpulab.memory: " + message("memory.live_plot_failed", error=f"{type(error).__name__}: {error}")
                    )


_UNITS = {"B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_bytes(size: int | str) -> int:
    """Bytes from an int or a size such as ``"64 MiB"``, ``"1.5 GiB"`` or ``"500 MB"`` (lesson 03's capacity)."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    elif isinstance(size, str):
        number, _, unit = size.strip().partition(" ")
        factor = _UNITS.get((unit.strip() or "B").upper())
        try:
            value = int(float(number) * factor) if factor else -1
        except ValueError:
            value = -1
    else:
        value = -1
    if value <= 0:
        raise ValueError(f"expected a positive size such as 64 * 2**20 or '64 MiB', got {size!r}")
    return value


def _live_plot(live: Any, trace: Trace):
    if live is False or live is None:
        return None
    from gpulab import plots

    if live is True:
        # Nothing to show outside a notebook (scripts, tests): skip the rendering work altogether.
        return plots.LivePlot(trace.devices) if plots._in_kernel() else None
    if isinstance(live, plots.LivePlot):
        return live
    raise TypeError(f"live must be True, False or a gpulab.plots.LivePlot, got {live!r}")


class _Sampler:
    """The background thread: one sample every ``interval`` seconds, plus live-plot frames when asked."""

    def __init__(self, trace: Trace, interval: float, plot: Any):
        self.trace = trace
        self.interval = interval
        self.plot = plot
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gpulab-memory-sampler", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stopping.wait(self.interval):
                self.trace._record()
                if self.plot is not None:
                    self.plot.maybe_update(self.trace)
        except BaseException as error:  # noqa: BLE001 - reported by stop(), never lost in a thread
            self.error = error

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        if self.error is not None:
            _announce(
                "gpulab.memory: "
                + message("memory.sampler_stopped", error=f"{type(self.error).__name__}: {self.error}")
            )
