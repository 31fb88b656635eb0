"""NVML (``pynvml``, from ``nvidia-ml-py``): the handle of the GPU, or MIG instance, behind a CUDA device.

``gpulab.memory`` (the driver's used memory next to PyTorch's allocator, lesson 03) and the GPU check read NVML
for a CUDA device index. NVML and CUDA may number GPUs differently, so a device is matched by UUID
(``torch.cuda.get_device_properties(i).uuid``, CUDA's ``cudaDeviceProp.uuid``), then by PCI bus id, then by index.

Under MIG (a GPU cut into instances: A100, H100, H200), a CUDA device is one instance. CUDA reports the instance's
UUID; NVML names the instance ``MIG-<uuid>`` (drivers R470 and later) and the whole GPU ``GPU-<uuid>``, so the
instance is found by its ``MIG-`` UUID, or, for drivers that name instances otherwise, by searching the MIG
devices of every GPU in MIG mode (``nvmlDeviceGetMigMode``, ``nvmlDeviceGetMigDeviceHandleByIndex``,
``nvmlDeviceGetUUID``). The PCI bus id and the index name the parent GPU, whose memory is every instance's: when
a GPU is in MIG mode and the instance cannot be matched, ``handle`` raises ``MigInstanceNotFound`` rather than
read the parent (PyTorch itself gives up on NVML under MIG: ``torch/cuda/__init__.py``, ``_device_count_nvml``,
"Skip MIG parsing"). Not run on a GPU; ``tests/test_memory.py`` checks it against a simulated ``pynvml``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["MigInstanceNotFound", "handle", "mig_enabled_gpus"]

MIG_ENABLED = 1  # pynvml.NVML_DEVICE_MIG_ENABLE


class MigInstanceNotFound(RuntimeError):
    """A CUDA device on a GPU in MIG mode whose instance NVML could not be matched."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bare(uuid: str) -> str:
    for prefix in ("GPU-", "MIG-"):
        if uuid.startswith(prefix):
            return uuid[len(prefix) :]
    return uuid


def mig_enabled_gpus(pynvml: Any) -> list[Any]:
    """Handles of the GPUs whose current MIG mode is enabled (none where MIG is not supported)."""
    found = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        try:
            parent = pynvml.nvmlDeviceGetHandleByIndex(index)
            current, _pending = pynvml.nvmlDeviceGetMigMode(parent)
        except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_SUPPORTED on GPUs without MIG
            continue
        if current == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", MIG_ENABLED):
            found.append(parent)
    return found


def _mig_instance(pynvml: Any, parents: list[Any], uuid: str) -> Any | None:
    for parent in parents:
        for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
            try:
                instance = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
                if uuid in _text(pynvml.nvmlDeviceGetUUID(instance)):
                    return instance
            except Exception:  # noqa: BLE001 - an empty slot
                continue
    return None


def handle(pynvml: Any, index: int) -> Any:
    """NVML's handle for CUDA device ``index``: the GPU's, or under MIG the instance's (see the module docstring).

    Raises ``MigInstanceNotFound`` when a GPU is in MIG mode and the instance cannot be matched.
    """
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    bare = _bare(str(uuid)) if uuid is not None else None
    if bare:
        for prefix in ("GPU-", "MIG-"):
            with contextlib.suppress(Exception):
                return pynvml.nvmlDeviceGetHandleByUUID(prefix + bare)
    parents = mig_enabled_gpus(pynvml)
    if parents:
        instance = _mig_instance(pynvml, parents, bare) if bare else None
        if instance is not None:
            return instance
        raise MigInstanceNotFound(
            f"CUDA device {index} (UUID {uuid}) is on a GPU in MIG mode and NVML has no MIG instance with its UUID; "
            "the whole GPU's numbers would not be this instance's, so NVML is not read"
        )
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain = getattr(props, "pci_domain_id", 0)
        slot = getattr(props, "pci_device_id", 0)
        with contextlib.suppress(Exception):
            return pynvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08X}:{bus:02X}:{slot:02X}.0")
    return pynvml.nvmlDeviceGetHandleByIndex(index)
