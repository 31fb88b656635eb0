"""The grader's guard: runs *inside* the grading kernel and produces positive evidence that each test ran.

``autograder/execute.py`` (the grader side) inserts, as the first cell of every notebook it grades, a prologue
that loads this file and calls :func:`install` *before any learner code runs*, and replaces the source of
every autograded test cell by ``__gpulab_guard__.run("<grade_id>")``. Standard library only at import time.

What :func:`install` does, once per kernel:

* reads its configuration (a per-run secret key and nonce, the test sources, the evidence file) from a
  private file, which it deletes; the secret is never in any cell or notebook;
* compiles every test itself, from the instructor's source (through a pristine IPython transformer, so line
  magics still work): learner input transformers, AST transformers, edited or deleted test cells never touch
  the code that runs;
* snapshots what tests rely on: ``builtins``, the functions and classes of torch, gpulab and the standard
  modules tests use, and their entries in ``sys.modules``;
* installs an audit hook (``sys.addaudithook``; it cannot be removed) that voids the running test when
  notebook code, while a test runs, installs a trace or profile function, reaches for frames
  (``sys._getframe``, ``inspect``, ``traceback.tb_frame``, ...), walks the garbage collector, uses ctypes, adds
  an audit hook, patches a class, or compiles code under a library's file name.

What ``run(grade_id)`` does for each test:

1. restores everything in the snapshot that learner code replaced since (``torch.allclose``,
   ``torch.Tensor.tolist``, ``gpulab.check.cases``, ``builtins.isinstance``, a fake ``sys.modules["gpulab"]``,
   ...), removes trace and profile functions, and voids the test if a thread is running notebook code;
2. runs the test in a *private namespace* (a copy of the notebook's globals, with notebook names that shadow
   builtins or the usual module aliases put back), so learner functions that rebind globals (``global _want``)
   cannot reach the test's own variables; what the test defines is copied back to the notebook afterwards;
3. only if the test ran to its end, no audit event voided it, nothing in the snapshot changed while it ran and
   no trace function is set, writes one evidence record, an HMAC of (nonce, grade id, test source, partial
   credit) under the secret key, to a file the grader reads after the kernel stops. A missing or invalid record
   scores 0, whatever the cell's outputs say.

The guard's source and configuration reach the kernel through a descriptor the launcher opened outside the
sandbox (``evidence.CONFIG_FD``; the file is unlinked before the kernel starts), the evidence file through an
append-only descriptor (``evidence.EVIDENCE_FD``) whose file the sandbox does not show. What protects other
students, the gradebook and the installed packages is the sandbox (``sandbox.py``), not this guard.

Limits, stated plainly: learner code runs in the same process. Code that knows this guard and digs its state out
of the process (the guard object's attributes, its functions' globals, the evidence file descriptor) outside a
test could forge evidence; the guard is a tripwire that makes generic cheats fail and targeted ones conspicuous,
not a sandbox.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import hmac
import json
import linecache
import os
import sys
import sysconfig
import threading
import types

GUARD_NAME = "__gpulab_guard__"

# Modules whose functions and classes tests rely on; restored before every test, checked after it.
PROTECTED_MODULES = (
    "builtins",
    "abc",
    "collections",
    "collections.abc",
    "copy",
    "functools",
    "hashlib",
    "hmac",
    "io",
    "itertools",
    "json",
    "math",
    "numbers",
    "operator",
    "os",
    "os.path",
    "pathlib",
    "pickle",
    "random",
    "re",
    "shutil",
    "tempfile",
    "types",
    "numpy",
    "torch",
    "torch._C",
    "torch._tensor",
    "torch.autograd",
    "torch.cuda",
    "torch.distributed",
    "torch.functional",
    "torch.multiprocessing",
    "torch.nn",
    "torch.nn.functional",
    "torch.nn.modules.module",
    "torch.nn.parallel",
    "torch.nn.parallel.comm",
    "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.distributed",
    "torch.nn.parallel.parallel_apply",
    "torch.nn.parallel.replicate",
    "torch.nn.parallel.scatter_gather",
    "torch.nn.utils",
    "torch.optim",
    "torch.serialization",
    "torch.testing",
    "torch.testing._comparison",
)
# Every module of these packages loaded when the guard is installed is protected too (gpulab's submodules are
# imported first, so a lazily loaded one cannot be replaced before its first use).
PROTECTED_PACKAGES = ("gpulab",)
# Usual names of modules in a notebook's globals: a test sees the genuine module under these names.
MODULE_ALIASES = {"torch": "torch", "gpulab": "gpulab", "nn": "torch.nn", "F": "torch.nn.functional", "np": "numpy"}
# Frame attributes whose reads are audited (``object.__getattr__``).
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
# Audit events that void the running test when notebook code raises them.
VOIDING_EVENTS = frozenset(
    {
        "sys.settrace",
        "sys.setprofile",
        "sys._getframe",
        "sys._current_frames",
        "sys.addaudithook",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "object.__setattr__",
        "object.__delattr__",
        "code.__new__",
        "function.__new__",
    }
)
# Standard-library helpers that hand frames to their caller: the caller behind them is the one judged.
_FRAME_HELPERS = ("inspect.py", "traceback.py")


class TestVoided(Exception):
    """A test that ran but cannot be trusted (the message says why): it scores 0."""


def _code_trusted_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {os.path.dirname(os.__file__)}
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots if r))


class _Guard:
    """The object the notebook sees as ``__gpulab_guard__``; only ``run`` is meant to be called."""

    def __init__(self, config: dict, user_ns: dict):
        self._user_ns = user_ns
        self._nonce = config["nonce"]
        self._mac = hmac.new(bytes.fromhex(config["key"]), digestmod="sha256")
        self._write = os.write
        self._fd = config["evidence_fd"]  # opened by the launcher outside the sandbox: append-only, no path
        os.set_inheritable(self._fd, False)
        self._gettrace, self._getprofile = sys.gettrace, sys.getprofile
        self._settrace, self._setprofile = sys.settrace, sys.setprofile
        self._current_frames = sys._current_frames
        self._get_ident = threading.get_ident
        self._threading_dict = threading.__dict__
        self._builtins = builtins
        self._module_type = types.ModuleType
        self._active: str | None = None
        self._violations: list[str] = []
        self._in_hook: set[int] = set()
        self._trusted_roots = _code_trusted_roots()
        self._trusted_files = frozenset(os.path.realpath(f) for f in config.get("trusted_files", ()))
        self._trusted_cache: dict[str, bool] = {}
        self._tests = {}
        for grade_id, test in config["tests"].items():
            self._tests[grade_id] = self._compile(grade_id, test)
        self._snapshot()
        sys.addaudithook(self._audit)

    # ----------------------------------------------------------------------------------------- set-up
    @staticmethod
    def _compile(grade_id: str, test: dict) -> dict:
        """Compile a test from the instructor's source; keep its last expression apart (partial credit).

        Tracebacks may show the visible lines only: hidden ones are blank in ``linecache``.
        """
        from IPython.core.inputtransformer2 import TransformerManager

        source = test["source"]
        filename = f"<test {grade_id}>"
        entry = {"filename": filename, "digest": hashlib.sha256(source.encode()).hexdigest()}
        entry["hidden"] = [tuple(r) for r in test.get("hidden", [])]
        try:
            tree = ast.parse(TransformerManager().transform_cell(source), filename)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            entry["body"] = compile(tree, filename, "exec", dont_inherit=True)
            entry["last"] = compile(last, filename, "eval", dont_inherit=True) if last is not None else None
        except SyntaxError as error:  # the instructor's test is broken: report it, score 0
            entry["error"] = f"the test does not compile: {error}"
        visible = test.get("visible", "")
        linecache.cache[filename] = (len(visible), None, visible.splitlines(keepends=True), filename)
        return entry

    def _snapshot(self) -> None:
        import importlib
        import pkgutil

        for package in PROTECTED_PACKAGES:
            try:
                root = importlib.import_module(package)
            except Exception:  # noqa: BLE001 - the package is not installed: nothing to protect
                continue
            for info in pkgutil.walk_packages(getattr(root, "__path__", []), prefix=f"{package}."):
                try:
                    importlib.import_module(info.name)
                except Exception:  # noqa: BLE001 - a submodule that cannot load cannot be used either
                    pass
        names = [n for n in PROTECTED_MODULES if n in sys.modules or self._try_import(n)]
        names += sorted(n for n in sys.modules if n.split(".")[0] in PROTECTED_PACKAGES)
        self._modules = {name: sys.modules[name] for name in dict.fromkeys(names) if name in sys.modules}
        self._module_attrs = {}
        classes: dict[int, type] = {}
        for name, module in self._modules.items():
            attrs = {}
            for key, value in list(vars(module).items()):
                if _protected_value(value):
                    attrs[key] = value
                if isinstance(value, type) and _defined_in_protected(value, self._modules):
                    classes[id(value)] = value
            self._module_attrs[name] = attrs
        torch = self._modules.get("torch")
        if torch is not None:
            for cls in (torch.Tensor, getattr(torch._C, "TensorBase", None)):
                if cls is not None:
                    classes[id(cls)] = cls
        self._classes = [(cls, {k: v for k, v in vars(cls).items() if _protected_value(v)}) for cls in classes.values()]
        self._class_ids = frozenset(classes)
        self._builtin_names = {k: v for k, v in vars(builtins).items()}
        self._aliases = {alias: self._modules.get(module) for alias, module in MODULE_ALIASES.items()}

    @staticmethod
    def _try_import(name: str) -> bool:
        import importlib

        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not installed (numpy, torch.distributed on some builds): nothing to protect
            return False
        return True

    # ----------------------------------------------------------------------------------------- state
    def _differences(self, restore: bool) -> list[str]:
        """What learner code replaced in the snapshot; put it back when ``restore``."""
        changed = []
        modules = sys.modules
        for name, module in self._modules.items():
            if modules.get(name) is not module:
                changed.append(f"sys.modules[{name!r}]")
                if restore:
                    modules[name] = module
            current = vars(module)
            for key, value in self._replaced(current, self._module_attrs[name]):
                changed.append(f"{name}.{key}")
                if restore:
                    current[key] = value
        for cls, attrs in self._classes:
            current = vars(cls)
            for key, value in self._replaced(current, attrs):
                changed.append(f"{cls.__module__}.{cls.__qualname__}.{key}")
                if restore:
                    try:
                        type.__setattr__(cls, key, value)
                    except (TypeError, AttributeError):
                        pass
            for key in [k for k, v in current.items() if k not in attrs and _protected_value(v)]:
                changed.append(f"{cls.__module__}.{cls.__qualname__}.{key} (added)")
                if restore:
                    try:
                        type.__delattr__(cls, key)
                    except (TypeError, AttributeError):
                        pass
        return changed

    def _replaced(self, current, attrs: dict) -> list[tuple[str, object]]:
        """``(name, snapshot value)`` of the entries of ``attrs`` that ``current`` (a namespace) no longer holds.

        A library's own wrapper of a snapshot value (``_library_wrapper``) is not a replacement: it becomes the
        snapshot value instead.
        """
        replaced = []
        for key, value in attrs.items():  # assigning existing keys only: safe while iterating
            now = current.get(key, _MISSING)
            if now is value:
                continue
            if self._library_wrapper(value, now):
                attrs[key] = now
            else:
                replaced.append((key, value))
        return replaced

    def _library_wrapper(self, old, new) -> bool:
        """Whether ``new`` is a library's own wrapper of ``old`` (torch wraps ``Optimizer.step`` on first use)."""
        code = getattr(new, "__code__", None)
        if code is None or not self._trusted(code.co_filename):
            return False
        wrapped = new
        for _ in range(5):
            wrapped = getattr(wrapped, "__wrapped__", None)
            if wrapped is None:
                return False
            if wrapped is old:
                return True
        return False

    def _tracing(self) -> list[str]:
        found = []
        if self._gettrace() is not None:
            found.append("a trace function (sys.settrace)")
        if self._getprofile() is not None:
            found.append("a profile function (sys.setprofile)")
        if self._threading_dict.get("_trace_hook") is not None or self._threading_dict.get("_profile_hook"):
            found.append("a thread trace or profile hook (threading.settrace)")
        return found

    def _notebook_threads(self) -> list[str]:
        """Other threads that are running notebook code right now."""
        me = self._get_ident()
        found = []
        for ident, frame in self._current_frames().items():
            if ident == me:
                continue
            while frame is not None:
                if not self._trusted(frame.f_code.co_filename):
                    found.append(f"a thread running notebook code ({frame.f_code.co_name})")
                    break
                frame = frame.f_back
        return found

    def _trusted(self, filename: str) -> bool:
        known = self._trusted_cache.get(filename)
        if known is not None:
            return known
        if filename.startswith(("<test ", "<frozen ")) or filename == __file__:
            trusted = True
        elif filename.startswith("<"):
            trusted = False
        else:
            real = os.path.realpath(filename)
            trusted = real in self._trusted_files or real.startswith(self._trusted_roots)
        self._trusted_cache[filename] = trusted
        return trusted

    # ----------------------------------------------------------------------------------------- audit hook
    def _audit(self, event: str, args: tuple) -> None:
        if self._active is None:
            return
        if event == "object.__getattr__":
            if len(args) < 2 or args[1] not in FRAME_ATTRIBUTES:
                return
        elif event in ("object.__setattr__", "object.__delattr__"):
            if not args or id(args[0]) not in self._class_ids:
                return
        elif event not in VOIDING_EVENTS and event != "compile" and not event.startswith("ctypes."):
            return
        ident = self._get_ident()
        if ident in self._in_hook:
            return
        self._in_hook.add(ident)
        try:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.endswith(_FRAME_HELPERS):
                frame = frame.f_back
            if frame is None or self._trusted(frame.f_code.co_filename):
                return
            if event == "compile":
                filename = args[1] if len(args) > 1 else None
                if not (isinstance(filename, str) and self._trusted(filename)):
                    return
                event = f"compile under a library's file name ({filename})"
            self._violations.append(f"{event} from notebook code ({frame.f_code.co_name})")
        finally:
            self._in_hook.discard(ident)

    # ----------------------------------------------------------------------------------------- running
    def _namespace(self) -> tuple[dict, dict, set]:
        before = dict(self._user_ns)
        ns = dict(before)
        kept = set()
        for key, value in self._builtin_names.items():
            if key in ns and key not in ("__builtins__", "__name__", "__doc__", "__spec__", "__loader__"):
                if ns[key] is not value:
                    del ns[key]
                    kept.add(key)
        ns["__builtins__"] = self._builtins
        for alias, module in self._aliases.items():
            if alias in ns and module is not None and ns[alias] is not module:
                if alias in ("torch", "gpulab") or isinstance(ns[alias], self._module_type):
                    ns[alias] = module
                    kept.add(alias)
        return before, ns, kept

    def _copy_back(self, before: dict, ns: dict, kept: set) -> None:
        user_ns = self._user_ns
        for key, value in ns.items():
            if key in kept or key == "__builtins__" or key.startswith("__gpulab"):
                continue
            if key not in before or before[key] is not value:
                user_ns[key] = value
        for key in before:
            if key not in ns and key not in kept:
                user_ns.pop(key, None)

    def _emit(self, kind: str, grade_id: str, detail: str) -> None:
        """Write one authenticated record: ``["kind", "grade_id", "detail"] mac`` on a line."""
        test = self._tests.get(grade_id)
        digest = test["digest"] if test else ""
        mac = self._mac.copy()
        mac.update(f"{self._nonce}\0{kind}\0{grade_id}\0{digest}\0{detail}".encode())
        line = f"{json.dumps([kind, grade_id, detail])} {mac.hexdigest()}\n"
        try:
            self._write(self._fd, line.encode("utf-8", "replace"))
        except OSError:
            pass

    def _failure_line(self, test: dict, error: BaseException) -> int | None:
        tb, line = error.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == test["filename"]:
                line = tb.tb_lineno
            tb = tb.tb_next
        return line

    def run(self, grade_id: str):
        """Run the test ``grade_id``; return its last expression's value (nbgrader's partial credit)."""
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in tracebacks
        test = self._tests.get(grade_id)
        if test is None or "error" in test:
            reason = "unknown test" if test is None else test["error"]
            self._emit("void", grade_id, reason)
            raise TestVoided(f"{grade_id}: {reason}")
        self._settrace(None)
        self._setprofile(None)
        self._threading_dict["_trace_hook"] = None
        self._threading_dict["_profile_hook"] = None
        self._differences(restore=True)
        problems = self._notebook_threads()
        before, ns, kept = self._namespace()
        self._violations = []
        self._active = grade_id
        value = None
        try:
            exec(test["body"], ns)  # noqa: S102 - the instructor's test, compiled by the guard
            if test["last"] is not None:
                value = eval(test["last"], ns)  # noqa: S307
        except BaseException as error:
            self._active = None
            line = self._failure_line(test, error)
            hidden = line is not None and any(start <= line <= end for start, end in test["hidden"])
            where = "hidden" if hidden else ("visible" if line is not None else "unknown")
            self._emit("fail", grade_id, where)
            raise
        finally:
            self._active = None
            self._copy_back(before, ns, kept)
        problems += self._violations
        problems += self._tracing()
        problems += [f"{name} was replaced" for name in self._differences(restore=False)[:3]]
        problems += self._notebook_threads()
        if problems:
            reason = "; ".join(dict.fromkeys(problems))
            self._emit("void", grade_id, reason)
            raise TestVoided(f"this test cannot be trusted: {reason}")
        self._emit("ok", grade_id, _partial_credit(value))
        return value


class _Missing:
    pass


_MISSING = _Missing()


def _protected_value(value) -> bool:
    return callable(value) or isinstance(value, types.ModuleType) or hasattr(type(value), "__get__")


def _defined_in_protected(cls: type, modules: dict) -> bool:
    module = getattr(cls, "__module__", None)
    return isinstance(module, str) and (module in modules or module.split(".")[0] in ("torch", *PROTECTED_PACKAGES))


def _partial_credit(value) -> str:
    """The test's value as nbgrader's partial credit reads it: a number's repr, else ``""`` (full credit)."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        return repr(float(value))
    return ""


def install(config: dict, user_ns: dict) -> None:
    """Put the guard, configured by the grader (read from an inherited descriptor), in the notebook's globals."""
    user_ns[GUARD_NAME] = _Guard(config, user_ns)
