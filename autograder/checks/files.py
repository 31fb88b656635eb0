"""Files a learner's code wrote, read from the grader's process (outside the sandbox), for ``autograder.checks``.

Every path is relative to a check's folder and walked one component at a time with ``O_NOFOLLOW``: a symlink
anywhere (the last component included), ``..``, an absolute path, or anything but a folder on the way and a
regular file at the end is refused (``CheckFailed``), and reads are capped. Used by lesson 04's checks
(checkpoints) and by any check that inspects what notebook code saved.
"""

from __future__ import annotations

import io
import json
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


def _made_folder(root: Path, parts: list[str], relative: str) -> int:
    """A descriptor of ``root/parts...``, each component made where missing and opened relative to its parent's
    descriptor without following a link, writable by the kernel's user by its mode."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    folder = _open_folder(Path(root), [])
    try:
        for part in parts:
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
        return folder
    except BaseException:
        os.close(folder)
        raise


def make_folder(root: Path, relative: str) -> Path:
    """Make the new folder ``root/relative`` (its parents as ``write_bytes`` makes them) for the kernel to write in;
    its path. A folder or anything else already under that name is refused: the kernel may have left it, with
    links inside, where the grader is about to plant files."""
    parts = _parts(relative)
    if not parts:
        raise _failed("a folder name is needed")
    parent = _made_folder(Path(root), parts[:-1], relative)
    try:
        try:
            os.mkdir(parts[-1], FOLDER_MODE, dir_fd=parent)
        except OSError as error:
            raise _failed(f"{relative!r} cannot be made: {error.strerror}") from error
    finally:
        os.close(parent)
    os.close(_made_folder(Path(root), parts, relative))  # its mode, set through a descriptor
    return Path(root, *parts)


def write_bytes(root: Path, relative: str, data: bytes) -> Path:
    """Write the new file ``root/relative`` (its folders made; a name already taken is refused), every component
    made and opened relative to its parent's descriptor without following a link, the file readable and its folders
    writable by the kernel's user (modes, never owners: nothing a kernel can swap reaches ``chown``); its path."""
    parts = _parts(relative)
    if not parts:
        raise _failed("a file name is needed")
    folder = _made_folder(Path(root), parts[:-1], relative)
    try:
        try:
            # O_EXCL: nothing the kernel left under this name (a hard link to another file, a FIFO) is written
            # through; O_NONBLOCK: a FIFO made meanwhile must not hold the grader in open()
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
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


LOAD_CPU_SECONDS = 2
"""CPU time the process that reads one checkpoint may use (a course's checkpoints load in milliseconds)."""
LOAD_WALL_SECONDS = 30
"""Wall time the grader waits for that process, however loaded its machine."""


def load_weights(data: bytes):
    """``torch.load`` of bytes with ``weights_only=True`` (tensors and plain containers only), its size checked
    before anything is inflated or materialised (``wire.stored_records``: no compressed record, records no larger
    than the file; every tensor ``wire.bounded_tensor``: dense and no larger than its storage); ``CheckFailed``
    when torch or these checks refuse it.

    The pickle inside is never unpickled in the grader's process: a few hundred hostile bytes can make unpickling
    recurse in C until the process dies (a key nested a million tuples deep), or work for hours (a key that shares
    itself through the pickle's memo, 2**40 hashes; keys that all hash alike). A forked child loads it under a CPU
    limit and answers as a kernel does, in ``wire``'s encoding, which the grader decodes under ``wire``'s limits; a
    child that dies, overruns or answers anything else is a refusal. Torch is imported here, before the fork: the
    child's CPU limit is for the unpickling alone (importing torch takes about as much CPU as the limit allows)."""
    import torch

    from autograder.checks import wire

    try:
        wire.stored_records(data)
    except wire.WireError as error:
        raise _failed(f"the file is refused: {error}") from error
    answer = _in_a_child(lambda: _encoded_checkpoint(data))
    try:
        result = json.loads(answer)
        if type(result) is not dict or not ("value" in result or "refused" in result):
            raise ValueError("no answer")
    except ValueError as error:
        raise _failed("the file is not a weights-only checkpoint the grader can read in its time") from error
    if "refused" in result:
        raise _failed(f"the file is refused: {str(result['refused'])[:200]}")
    try:
        return wire.decode(result["value"], torch)
    except wire.WireError as error:
        raise _failed(f"the file is refused: {error}") from error


def _encoded_checkpoint(data: bytes) -> str:
    """In the child: the checkpoint loaded and checked, as ``{"value": wire tree}`` or ``{"refused": why}``."""
    import torch

    from autograder.checks import wire

    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        _bounded(loaded, torch, wire)
        return json.dumps({"value": wire.encode(loaded, torch)})
    except wire.WireError as error:
        return json.dumps({"refused": str(error)})
    except Exception as error:  # noqa: BLE001 - a pickle with code, a truncated file, ...
        return json.dumps({"refused": f"not a weights-only checkpoint: {type(error).__name__}"})


def _in_a_child(work) -> str:
    """``work()``'s text, computed in a forked child under ``LOAD_CPU_SECONDS`` of CPU; "" when the child died, ran
    out of time or wrote nothing. The child never returns into the grader's code: it ends with ``os._exit``."""
    import resource
    import select
    import signal
    import time

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        status = 1
        try:
            os.close(read_end)
            resource.setrlimit(resource.RLIMIT_CPU, (LOAD_CPU_SECONDS, LOAD_CPU_SECONDS))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file behind
            encoded = work().encode()
            view = memoryview(encoded)
            while view:
                view = view[os.write(write_end, view) :]
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + LOAD_WALL_SECONDS
    try:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([read_end], [], [], left)
            if not ready:
                break
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        ended, status = os.waitpid(pid, os.WNOHANG)
        if not ended:  # still at work past the deadline, or not yet gone after its answer
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        return ""
    return b"".join(chunks).decode(errors="replace")


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
