"""The check protocol's data format and the kernel's side of a round trip (standard library and torch; in the
kernel also the gpulab functions a request names: a rule's adapter, the self-check's timer).

This file's source is sent, as it is, to the grading kernel with every request of ``autograder.checks`` (lesson
checks, e.g. ``autograder/checks/splitting.py`` for lesson 01); the grader's process imports it too, for the
same encoder and a decoder that never executes anything.

Values travel as a tagged JSON tree that keeps exact types: ``["none"]``, ``["bool", b]``, ``["int", "123"]``
(a decimal string: any size), ``["float", "0x1.8p+1"]`` (``float.hex``: exact, nan and inf included),
``["str", s]``, ``["list", [...]]``, ``["tuple", [...]]``, ``["dict", [[key, value], ...]]`` (an
``collections.OrderedDict`` as ``["ordered_dict", [[key, value], ...]]``: a state dict's own type),
``["tensor", base64]`` (``torch.save`` of ``t.detach().cpu()``, loaded with ``weights_only=True``),
``["number", node, "module.QualName"]`` for a number of another class (``numpy.int64``, an ``IntEnum``, a float
subclass, ``numpy.float32``): its value as an ``int`` or ``float`` node and its class's name, decoded to
``ForeignInt`` (an ``int``), ``ForeignFloat`` (a ``float``: the class was a float subclass) or ``ForeignReal``
(a ``numbers.Real`` that is no ``float``), so that a check can be exactly as strict as the test it replaces
(``type(v) is int`` refuses them, ``isinstance(v, int)`` takes what ``numbers.Integral`` took) and, for
anything else (other subclasses of these types included), ``["object", "module.QualName"]``: only its type's
name.
"""

from __future__ import annotations

import numbers
from collections import OrderedDict

MIME = "application/vnd.gpulab.check+json"
MAX_DEPTH = 64
MAX_NODES = 200_000
MAX_CHARS = 16_000_000  # characters of strings and tensors in one answer: the kernel stops encoding past them
MAX_UNSALTED_KEYS = 1_000  # dict keys other than str in one decoded value (their hashes can be made to collide)
MAX_INT_DIGITS = 4_300  # characters of an ``int`` node (Python's own limit on converting text to an int)
MAX_FLOAT_CHARS = 32  # characters of a ``float`` node: ``float.hex`` writes at most 24 ("-0x1.fffffffffffffp+1023")
MAX_NAME_CHARS = 300  # characters of a class name kept from a ``number`` or ``object`` node


class WireError(ValueError):
    """Data that is not a well-formed encoded value (or is too large or too deep)."""


class Opaque:
    """A decoded value of a type the format does not carry: only its type's qualified name is known."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __eq__(self, other):
        return type(other) is Opaque and other.type_name == self.type_name

    def __hash__(self):
        return hash(("Opaque", self.type_name))

    def __repr__(self):
        return f"<{self.type_name} object>"


class ForeignInt(int):
    """A decoded ``numbers.Integral`` of another class than ``int`` (``numpy.int64``, an ``IntEnum``...)."""

    type_name = "?"

    def __repr__(self):
        return f"{self.type_name}({int.__repr__(self)})"


class ForeignFloat(float):
    """A decoded instance of a subclass of ``float`` (``numpy.float64``...)."""

    type_name = "?"

    def __repr__(self):
        return f"{self.type_name}({float.__repr__(self)})"


class ForeignReal:
    """A decoded ``numbers.Real`` that is not a ``float`` (``numpy.float32``...): compares by its value."""

    __slots__ = ("type_name", "value")

    def __init__(self, value: float, type_name: str):
        self.value, self.type_name = value, type_name

    def __float__(self):
        return self.value

    def __eq__(self, other):
        return float(self.value) == other if isinstance(other, (int, float, ForeignReal)) else NotImplemented

    def __hash__(self):
        return hash(self.value)

    def __repr__(self):
        return f"{self.type_name}({self.value!r})"


numbers.Real.register(ForeignReal)


def _foreign(kind: str, value, type_name: str):
    if kind == "int":
        number = ForeignInt(value)
    elif kind == "float":
        number = ForeignFloat(value)
    else:
        return ForeignReal(value, type_name)
    number.type_name = type_name
    return number


def _qualname(value) -> str:
    kind = value.__class__
    try:
        return f"{kind.__module__}.{kind.__qualname__}"
    except Exception:  # noqa: BLE001 - a class with broken attributes
        return "?"


def encode(value, torch=None, budget=None):
    """``value`` as a tagged JSON tree (module docstring). Exact types only: subclasses become ``object``.
    ``budget``: a one-item list of characters left (shared by the encodings of one answer)."""
    nodes = [0]
    budget = budget if budget is not None else [MAX_CHARS]

    def spend(size):
        budget[0] -= size
        if budget[0] < 0:
            raise WireError(f"the answer is larger than {MAX_CHARS} characters")

    def walk(item, depth):
        nodes[0] += 1
        if depth > MAX_DEPTH or nodes[0] > MAX_NODES:
            raise WireError("the value is too deep or too large to encode")
        kind = type(item)
        if item is None:
            return ["none"]
        if kind is bool:
            return ["bool", item is True]
        if kind is int:
            return ["int", int.__repr__(item)]
        if kind is float:
            return ["float", float.hex(item)]
        if kind is str:
            spend(str.__len__(item))
            return ["str", str.__str__(item)]
        if kind is list or kind is tuple:
            return [kind.__name__, [walk(v, depth + 1) for v in list(item)]]
        if kind is dict or kind is OrderedDict:
            tag = "dict" if kind is dict else "ordered_dict"
            return [tag, [[walk(k, depth + 1), walk(v, depth + 1)] for k, v in dict.items(item)]]
        if torch is not None and kind is torch.Tensor:
            import base64
            import io

            buffer = io.BytesIO()
            spend(item.numel() * item.element_size() * 4 // 3)
            torch.save(item.detach().cpu().clone(), buffer)
            return ["tensor", base64.b64encode(buffer.getvalue()).decode("ascii")]
        if isinstance(item, numbers.Integral):
            return ["number", ["int", int.__repr__(int(item))], _qualname(item)]
        if isinstance(item, numbers.Real):
            as_float = ["float", float.hex(float(item))]
            return ["number", as_float, _qualname(item) + ("" if isinstance(item, float) else "|real")]
        return ["object", _qualname(item)]

    return walk(value, 0)


def decode(tree, torch=None):
    """The value a tagged JSON tree encodes; ``WireError`` for anything malformed. Executes nothing.

    Every number is bounded on its text before it is converted (``MAX_INT_DIGITS``, ``MAX_FLOAT_CHARS``), a class
    name is cut at ``MAX_NAME_CHARS``, and nothing of a malformed node is copied into the error.

    Decoding takes time linear in the tree: a ``str`` key's hash is salted per process, but ints, floats and tuples
    hash the same everywhere, so keys chosen to collide would make rebuilding a dict quadratic; at most
    ``MAX_UNSALTED_KEYS`` keys of other types than ``str`` are accepted in one value."""
    nodes = [0]
    unsalted = [0]

    def walk(item, depth):
        nodes[0] += 1
        if depth > MAX_DEPTH or nodes[0] > MAX_NODES:
            raise WireError("the value is too deep or too large")
        if type(item) is not list or not item or type(item[0]) is not str:
            raise WireError(f"malformed node of type {type(item).__name__}")  # never printed whole: it can be huge
        tag, rest = item[0], item[1:]
        if tag == "none" and not rest:
            return None
        if tag == "number" and len(rest) == 2 and type(rest[1]) is str:
            value = walk(rest[0], depth + 1)
            if type(value) not in (int, float):
                raise WireError("malformed number node")
            name, _, real = rest[1][:MAX_NAME_CHARS].partition("|")
            return _foreign("real" if real else type(value).__name__, value, name)
        if len(rest) != 1:
            raise WireError(f"malformed {tag!r} node")
        (payload,) = rest
        if tag == "bool" and type(payload) is bool:
            return payload
        if tag == "int" and type(payload) is str and len(payload) <= MAX_INT_DIGITS:
            return int(payload)
        if tag == "float" and type(payload) is str and len(payload) <= MAX_FLOAT_CHARS:
            return float.fromhex(payload)
        if tag == "str" and type(payload) is str:
            return payload
        if tag in ("list", "tuple") and type(payload) is list:
            values = [walk(v, depth + 1) for v in payload]
            return values if tag == "list" else tuple(values)
        if tag in ("dict", "ordered_dict") and type(payload) is list:
            result = {} if tag == "dict" else OrderedDict()
            for pair in payload:
                if type(pair) is not list or len(pair) != 2:
                    raise WireError("malformed dict entry")
                key = walk(pair[0], depth + 1)
                if type(key) is not str:
                    unsalted[0] += 1
                    if unsalted[0] > MAX_UNSALTED_KEYS:
                        raise WireError(f"more than {MAX_UNSALTED_KEYS} dict keys that are not strings")
                try:
                    result[key] = walk(pair[1], depth + 1)
                except TypeError as error:  # an unhashable key
                    raise WireError(f"a dict key of type {type(key).__name__}") from error
            return result
        if tag == "tensor" and type(payload) is str and torch is not None:
            return _load_tensor(payload, torch)
        if tag == "object" and type(payload) is str:
            return Opaque(payload[:MAX_NAME_CHARS])
        raise WireError(f"malformed {tag!r} node")

    try:
        return walk(tree, 0)
    except (ValueError, OverflowError, RecursionError) as error:
        if isinstance(error, WireError):
            raise
        raise WireError(str(error)) from error


MAX_TENSOR_ELEMENTS = 4_000_000  # elements of one decoded tensor (an answer of 16 M characters holds fewer)


def stored_records(data: bytes) -> None:
    """``WireError`` unless ``data`` is a zip archive (``torch.save``'s format) whose records are all *stored*
    (never compressed) and together no larger than the archive: nothing in it can inflate when torch reads it."""
    import io
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            records = archive.infolist()
    except Exception as error:  # noqa: BLE001 - zipfile raises many kinds on hostile bytes (NotImplementedError...)
        raise WireError("a tensor payload that is not torch.save's zip format") from error
    if not records or len(records) > 64:
        raise WireError("a tensor payload with an unexpected number of records")
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED or record.file_size != record.compress_size:
            raise WireError("a tensor payload with a compressed record")
    if sum(record.file_size for record in records) > len(data):
        raise WireError("a tensor payload whose records are larger than itself")


def _load_tensor(text: str, torch):
    """The tensor a ``tensor`` node carries, with its size checked before anything is inflated or materialised:
    the base64 text is bounded by the answer's cap; the archive's records must be stored uncompressed and fit in
    it (``stored_records``), so torch allocates no more storage than the answer's bytes; and the tensor must be
    an ordinary dense one that is no larger than its storage (a stride-0 or expanded view of a few bytes would
    otherwise become gigabytes at ``.tolist()``), of at most ``MAX_TENSOR_ELEMENTS`` elements."""
    import base64
    import binascii
    import io

    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise WireError("a tensor that is not base64") from error
    stored_records(data)
    try:
        tensor = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - weights_only refuses anything but tensors and plain containers
        raise WireError(f"a tensor payload torch refused: {type(error).__name__}") from error
    if type(tensor) is not torch.Tensor:
        raise WireError(f"a tensor payload holding a {type(tensor).__name__}")
    return bounded_tensor(tensor, torch)


def bounded_tensor(tensor, torch, max_elements: int = MAX_TENSOR_ELEMENTS):
    """``tensor`` if it is an ordinary dense CPU tensor of at most ``max_elements`` elements and ``MAX_DEPTH``
    dimensions that is no larger than its storage (no expanded or stride-0 view), else ``WireError``: what the grader
    may materialise."""
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested or tensor.device.type != "cpu":
        raise WireError("a tensor that is not an ordinary dense tensor")
    if tensor.numel() > max_elements:
        raise WireError(f"a tensor of more than {max_elements} elements")
    if tensor.dim() > MAX_DEPTH:  # its values nest as deep: .tolist() recurses in C, and 100,000 levels crash
        raise WireError(f"a tensor of more than {MAX_DEPTH} dimensions")
    if tensor.numel() * tensor.element_size() > tensor.untyped_storage().nbytes():
        raise WireError("a tensor larger than its storage (an expanded or stride-0 view)")
    return tensor


# --------------------------------------------------------------------------------------------- kernel side
def _failure(error) -> list:
    try:
        return [c.__name__ for c in type(error).__mro__]
    except Exception:  # noqa: BLE001
        return ["BaseException"]


def _adapter(name: str):
    """The function ``"gpulab.module:name"`` names: a rule's adapter, imported from gpulab in the kernel."""
    import importlib

    module, _, function = name.partition(":")
    if not module.startswith("gpulab.") or not function.isidentifier():
        raise WireError(f"no adapter {name!r}")
    return getattr(importlib.import_module(module), function)


def serve(request: dict, notebook: dict, torch) -> dict:
    """Run one request in the kernel: ``calls`` of a notebook function, or a ``probe``; the answer's ``result``.

    A call may come with seconds (``request["seconds"]``, a rule's ``gpulab.check.Rule.seconds``): past them the
    call is stopped, by the self-check's own timer (``gpulab.check.time_limit``), and no later call is made; the
    answer then holds the outcomes before it and ``too_slow``, its index. The timer runs here, in the kernel, where
    an answer can switch it off or keep its exception: the grader's bound is its own deadline, the cell's time."""
    import builtins
    import contextlib
    import importlib

    kind = request["kind"]
    if kind == "calls":
        name = request["name"]
        if name not in notebook:
            return {"missing": True}
        function = notebook[name]
        outcomes, budget = [], [MAX_CHARS]
        adapters = request.get("adapters") or [None] * len(request["calls"])
        seconds = request.get("seconds") or [None] * len(request["calls"])
        check = importlib.import_module("gpulab.check") if any(seconds) else None  # the self-check's timer
        for index, ((args_tree, kwargs_tree), adapter, limit) in enumerate(
            zip(request["calls"], adapters, seconds, strict=True)
        ):
            args, kwargs = decode(args_tree, torch), decode(kwargs_tree, torch)
            entry = {}
            try:
                with check.time_limit(limit) if limit else contextlib.nullcontext():
                    if adapter is None:
                        value = function(*args, **kwargs)
                    else:  # a rule's scenario run around the notebook's answer (gpulab.check.Rule.adapter)
                        value = _adapter(adapter)(function, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - the learner's exception is the outcome
                if limit and isinstance(error, check.TooSlow):
                    return {"outcomes": outcomes, "too_slow": index}
                entry["raised"] = _failure(error)
            else:
                try:
                    entry["value"] = encode(value, torch, budget)
                except Exception as error:  # noqa: BLE001 - too large, or a class that breaks on inspection
                    entry["unencodable"] = str(error)[:200] or type(error).__name__
            if request.get("fresh") and "value" in entry:
                entry["returned_an_argument"] = any(value is argument for argument in [*args, *kwargs.values()])
            if request.get("args_after"):
                try:
                    entry["args_after"] = encode([list(args), kwargs], torch, budget)
                except Exception as error:  # noqa: BLE001
                    entry["unencodable"] = str(error)[:200] or type(error).__name__
            outcomes.append(entry)
        return {"outcomes": outcomes}
    if kind == "probe":
        namespace = {"__builtins__": builtins, "__name__": "gpulab_check_probe"}
        builtins.exec(builtins.compile(request["source"], "<grader probe>", "exec"), namespace)
        inputs = decode(request["inputs"], torch)
        try:
            value = namespace[request["name"]](notebook, request["workdir"], **inputs)
        except Exception as error:  # noqa: BLE001 - learner code inside the probe raised
            return {"raised": _failure(error), "message": str(error)[:300]}
        return {"value": encode(value, torch)}
    raise WireError(f"unknown request {kind!r}")
