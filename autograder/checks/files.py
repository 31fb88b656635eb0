"""Files a learner's code wrote, read from the grader's process (outside the sandbox), for ``autograder.checks``.

Every path is relative to a check's folder and walked one component at a time with ``O_NOFOLLOW``: a symlink
anywhere (the last component included), ``..``, an absolute path, or anything but a folder on the way and a
regular file at the end is refused (``CheckFailed``), and reads are capped. Used by lesson 04's checks
(checkpoints) and by any check that inspects what notebook code saved.
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

MAX_FILE = 64_000_000
"""Bytes of one file a check may read."""


def _failed(message: str):
    from autograder.checks import CheckFailed

    return CheckFailed(message)


def _parts(relative: str) -> list[str]:
    parts = [p for p in str(relative).split("/") if p not in ("", ".")]
    if str(relative).startswith("/") or any(p == ".." for p in parts):
        raise _failed(f"{relative!r}: only paths inside the check's folder")
    return parts


def _open_folder(root: Path, parts: list[str]) -> int:
    """A descriptor of ``root/parts...``, every component opened without following symlinks."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags)
    except OSError as error:
        raise _failed(f"the check's folder cannot be opened: {error.strerror}") from error
    try:
        for part in parts:
            try:
                next_fd = os.open(part, flags, dir_fd=fd)
            except OSError as error:
                raise _failed(f"{part!r} is not a folder (symlinks are not followed): {error.strerror}") from error
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_bytes(root: Path, relative: str, limit: int = MAX_FILE) -> bytes:
    """The bytes of the regular file ``root/relative`` (no symlink followed, at most ``limit`` bytes)."""
    parts = _parts(relative)
    if not parts:
        raise _failed("a file name is needed")
    folder = _open_folder(Path(root), parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
        except OSError as error:
            raise _failed(f"{relative!r} cannot be read (symlinks are not followed): {error.strerror}") from error
    finally:
        os.close(folder)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _failed(f"{relative!r} is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > limit:
            raise _failed(f"{relative!r} is larger than {limit} bytes")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise _failed(f"{relative!r} is larger than {limit} bytes")
    return data


def listdir(root: Path, relative: str = ".") -> list[str]:
    """The sorted names in the folder ``root/relative`` (no symlink followed)."""
    fd = _open_folder(Path(root), _parts(relative))
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


FOLDER_MODE = 0o777  # a check's folders: the kernel's user writes there (the working copy is the grader's, 0700 above)
FILE_MODE = 0o644  # files the grader plants: the kernel reads them


def open_to_kernel(folder: Path) -> None:
    """Let the kernel's user write in ``folder`` by its mode, set through a descriptor opened without following a
    link (the kernel may have swapped the path for one: then nothing is changed and the check fails)."""
    fd = _open_folder(Path(folder), [])
    try:
        os.fchmod(fd, FOLDER_MODE)
    finally:
        os.close(fd)


def write_bytes(root: Path, relative: str, data: bytes) -> Path:
    """Write ``root/relative`` (its folders made), every component made and opened relative to its parent's
    descriptor without following a link, the file readable and its folders writable by the kernel's user (modes,
    never owners: nothing a kernel can swap reaches ``chown``); the file's path."""
    parts = _parts(relative)
    if not parts:
        raise _failed("a file name is needed")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    folder = _open_folder(Path(root), [])
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, FOLDER_MODE, dir_fd=folder)
            except FileExistsError:
                pass
            try:
                inner = os.open(part, flags, dir_fd=folder)
            except OSError as error:
                raise _failed(f"{relative!r}: {part!r} is not a folder (symlinks are not followed)") from error
            os.fchmod(inner, FOLDER_MODE)
            os.close(folder)
            folder = inner
        try:
            # O_NONBLOCK: a FIFO the kernel left under this name must not hold the grader in open()
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(parts[-1], flags, FILE_MODE, dir_fd=folder)
        except OSError as error:
            raise _failed(f"{relative!r} cannot be written (symlinks are not followed): {error.strerror}") from error
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _failed(f"{relative!r} is not a regular file")
    os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), FILE_MODE)
        handle.write(data)
    return Path(root, *parts)


MAX_CHECKPOINT_ELEMENTS = 16_000_000
"""Elements of one tensor in a checkpoint a check reads (its file is at most ``MAX_FILE`` bytes)."""


def load_weights(data: bytes):
    """``torch.load`` of bytes with ``weights_only=True`` (tensors and plain containers only), its size checked
    before anything is inflated or materialised (``wire.stored_records``: no compressed record, records no larger
    than the file; every tensor ``wire.bounded_tensor``: dense and no larger than its storage); ``CheckFailed``
    when torch or these checks refuse it."""
    import torch

    from autograder.checks import wire

    try:
        wire.stored_records(data)
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        _bounded(loaded, torch, wire)
    except wire.WireError as error:
        raise _failed(f"the file is refused: {error}") from error
    except Exception as error:  # noqa: BLE001 - a pickle with code, a truncated file, ...
        raise _failed(f"the file is not a weights-only checkpoint: {type(error).__name__}") from error
    return loaded


def _bounded(value, torch, wire, depth: int = 0) -> None:
    if depth > 32:
        raise wire.WireError("a checkpoint nested too deep")
    if isinstance(value, torch.Tensor):
        wire.bounded_tensor(value, torch, MAX_CHECKPOINT_ELEMENTS)
    elif isinstance(value, dict):
        for item in value.values():
            _bounded(item, torch, wire, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _bounded(item, torch, wire, depth + 1)
