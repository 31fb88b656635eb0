"""What counts as an English sentence in the Japanese edition, and which English sentences are gpulab's.

An *English word* is a token of letters alone, lower case after its first letter, with an optional ``'s``-like
tail: ``peak``, ``Memory``, ``device's``. Code, numbers, units and names are not words: a token with a digit, an
underscore, a dot, brackets or an operator (``output_device=1``, ``nn.DataParallel``, ``(32, 4)``), or with a
capital after its first letter (``DataParallel``, ``MiB``, ``GPUs``, ``NVML``), or a unit (``ms``, ``s``). Nor is
a value as Python prints it: ``True``, ``False``, ``None``, or a one-word string in quotes (the keys of
``{'files': ['checkpoint.pt'], 'rank': 0}``); a string of several words (``'no file at path'``) is English. A
document's title quoted as Japanese quotes a title (``『NVIDIA T4 datasheet』``) is a name, not a sentence.

An *English sentence* is two or more English words in a row, separated by single spaces and at most light
punctuation (``,`` ``:`` ``;`` ``(`` ``)`` ``.``): ``allocated at end``, ``loss in forward``, ``memory trace
(virtual devices``. Two spaces or more end a sentence (the columns of a table). One word alone (``scatter``,
``rank``) is a name PyTorch gives, as the Japanese edition keeps them.

*gpulab's* English sentences are the sentences of three words or more in its source's string literals (the English
message catalogue, f-strings' fixed parts, data such as ``gpulab.scaling``'s sources), docstrings and
``messages.LABELS`` (the lessons' own texts) left out. A text a learner is shown says one of them when one of its
sentences holds one, word for word, and is not the lesson's own (``lesson_sentences``: what the lesson's code
prints of its own, such as a dict key that happens to be worded as one of gpulab's hints), nor PyTorch's own words
that gpulab's virtual devices repeat as PyTorch says them (``PYTORCH_WORDS``).
"""

from __future__ import annotations

import ast
import html
import re
from functools import cache
from pathlib import Path
from typing import NamedTuple

GPULAB = Path(__file__).resolve().parents[1] / "utils" / "gpulab"
UNITS = {"ms", "s", "px"}
_WORD = re.compile(r"[A-Za-z][a-z]*(?:'[a-z]*)?")
_EDGE = ",:;().!?\"'`{}[]"
_DATA_EDGE = ",:;.!?()[]{}"  # around a value in a repr: separators and brackets, not quotes
_QUOTES = "'\"`"
PYTHON_CONSTANTS = {"True", "False", "None"}  # a value printed, not a word
_TITLE = re.compile(r"『[^』]*』")
_PLACEHOLDER = re.compile(r"\{[^{}\s]*\}")
_COLUMNS = re.compile(r"\s{2,}|\t")
GPULAB_SENTENCE_WORDS = 3
# PyTorch's own warnings, which gpulab's virtual DataParallel raises in PyTorch's words (as PyTorch does on GPUs)
PYTORCH_WORDS = (
    "Was asked to gather along dimension 0, but all input tensors were scalars; will instead unsqueeze and return a "
    "vector.",
)


def _is_word(token: str) -> bool:
    bare = token.strip(_EDGE)
    core = token.strip(_DATA_EDGE)
    if len(core) > 1 and core[0] == core[-1] and core[0] in _QUOTES:
        return False  # a one-word string, as a value's repr shows it ({'files': [...]}): data, not prose
    return (
        bool(_WORD.fullmatch(bare))
        and bare not in UNITS
        and bare not in PYTHON_CONSTANTS
        and (len(bare) > 1 or bare in ("a", "A", "I"))
    )


def english_sentences(text: str) -> list[str]:
    """The English sentences in ``text`` (module docstring), each as its words joined by single spaces."""
    found = []
    for line in [part for row in _TITLE.sub(" ", text).splitlines() for part in _COLUMNS.split(row)]:
        run: list[str] = []
        for token in [*line.split(" "), ""]:  # "" ends the last run
            if token and _is_word(token):
                run.append(token.strip(_EDGE))
                continue
            if len(run) >= 2:
                found.append(" ".join(run))
            run = []
    return found


def _literals(node: ast.AST) -> list[str]:
    """The string constants under ``node``, without docstrings and without ``messages.LABELS`` (the lessons' own
    texts, which gpulab only translates)."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(target, ast.Name) and target.id == "LABELS" for target in targets):
            return []
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    children = list(ast.iter_child_nodes(node))
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        children.remove(body[0])  # a docstring
    return [literal for child in children for literal in _literals(child)]


@cache
def gpulab_sentences() -> frozenset[str]:
    """Every English sentence of gpulab's string literals (f-strings' fixed parts included; no docstrings)."""
    sentences = set()
    for path in GPULAB.rglob("*.py"):
        for literal in _literals(ast.parse(path.read_text(encoding="utf-8"))):
            literal = _PLACEHOLDER.sub(" | ", literal)  # a template's value is not one of its words
            sentences.update(
                found for found in english_sentences(literal) if len(found.split()) >= GPULAB_SENTENCE_WORDS
            )
    pytorch = [found for words in PYTORCH_WORDS for found in english_sentences(words)]
    sentences = {known for known in sentences if not any(_holds(words, known) for words in pytorch)}
    return frozenset(sentences)


def lesson_sentences(sources: list[str]) -> list[str]:
    """The English sentences of a lesson's own code (its code cells, the files next to it): of the code as written
    and of each of its string literals (a label inside an f-string, ``f"{'peak of the step':<30}"``, is one)."""
    found = []
    for source in sources:
        found += english_sentences(source)
        try:
            literals = _literals(ast.parse(source))
        except SyntaxError:  # a cell magic (%%writefile ...): its text as written
            literals = []
        found += [sentence for literal in literals for sentence in english_sentences(literal)]
    return found


def _holds(sentence: str, words: str) -> bool:
    return re.search(rf"(?<![A-Za-z']){re.escape(words)}(?![A-Za-z'])", sentence) is not None


def gpulab_english_in(text: str, lesson: list[str] = ()) -> list[str]:
    """The sentences of ``text`` that say one of gpulab's English sentences and are not in ``lesson`` (the
    lesson's own sentences: ``lesson_sentences``)."""
    ours = gpulab_sentences()
    return [
        sentence
        for sentence in english_sentences(text)
        if any(_holds(sentence, known) for known in ours) and not any(_holds(own, sentence) for own in lesson)
    ]


# ------------------------------------------------------------------ what an executed Japanese lesson shows, all of it
FIGURES = ("image/png", "image/svg+xml")  # a figure's text/plain ("<Figure size ...>") is not what one reads
QUOTED_LINE = 20  # a printed line this long or longer, found word for word in PyTorch's text, quotes PyTorch
COURSE_ERRORS = ("AssertionError",)  # a visible test's assert message, a self-check's verdict: the course's words
_INVISIBLE_MARKUP = re.compile(r"<(style|script)\b.*?</\1>", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r"<[^>]+>")


_ADDRESS = re.compile(r"\bat 0x[0-9a-f]+")


def _flat(text: str) -> str:
    """``text`` with single spaces and without objects' addresses (``<function f at 0x7f...>``)."""
    return " ".join(_ADDRESS.sub("at 0x", text).split())


def _raised(action) -> str:
    try:
        action()
    except Exception as error:  # whatever PyTorch or Python raises is what they say
        return str(error)
    return ""


def pytorchs_own_words() -> list[str]:
    """What PyTorch (and Python) say in their own words, which a lesson shows as they say them, each computed here
    from PyTorch (whitespace made single spaces): DataParallel's docstring (its advice to use DDP), the warning its
    gather raises for scalars, the error a BatchNorm replica given one sample raises (as DataParallel re-raises it)
    and a module's printed form (lesson 02); what ``load_state_dict`` says of keys that match or do not (for the
    classes lesson 04 loads into), ``torch.load``'s error for a GPU this machine lacks and its refusal of a global
    with ``weights_only=True``, pickle's refusal of a lambda (lesson 04); each whole and each of its lines."""
    import io
    import tempfile
    from pathlib import Path
    from unittest import mock

    import gpulab
    import torch
    from torch import nn

    said = [nn.DataParallel.__doc__ or "", *PYTORCH_WORDS]
    devices = gpulab.devices(2, quiet=True, remember=False)
    model = gpulab.models.BatchNormMLP(in_features=4, hidden=8, classes=3)
    said.append(_raised(lambda: gpulab.DataParallel(model, device_ids=devices)(torch.randn(3, 4))))
    said.append(repr(nn.SyncBatchNorm.convert_sync_batchnorm(model)))
    mlp = gpulab.models.MLP(in_features=4, hidden=8, classes=3)
    said.append(repr(mlp.load_state_dict(mlp.state_dict())))
    for into in (mlp, nn.Sequential(nn.Linear(4, 4)), gpulab.DataParallel(mlp, device_ids=devices)):
        said.append(_raised(lambda into=into: into.load_state_dict({"unexpected": torch.zeros(1)})))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "from_gpu.pt"
        missing_gpu = f"cuda:{torch.cuda.device_count()}"
        with mock.patch.object(torch.serialization, "location_tag", lambda storage: missing_gpu):
            torch.save(torch.zeros(1), path)
        said.append(_raised(lambda: torch.load(path, weights_only=True)))
    unsafe = io.BytesIO()
    torch.save({"epoch": _CallsPrint()}, unsafe)
    said.append(_raised(lambda: torch.load(io.BytesIO(unsafe.getvalue()), weights_only=True)))
    schedule = eval("lambda step: 0.5**step", {"__name__": "__main__"})  # a lambda written in a notebook
    said.append(_raised(lambda: torch.save({"schedule": schedule}, io.BytesIO())))
    said = [words for words in said if words]
    return [_flat(words) for words in said] + [_flat(line) for words in said for line in words.splitlines()]


class _CallsPrint:
    """A pickle that calls ``print`` when it is loaded (lesson 04's ``Surprise``)."""

    def __reduce__(self):
        return (print, ("",))


def _not_quoted(line: str, quoted: list[str]) -> str:
    """``line`` without what it quotes of PyTorch: nothing left when the whole line is in PyTorch's text (at least
    ``QUOTED_LINE`` characters of it), else the line with each whole PyTorch text it holds taken out."""
    flat = _flat(line)
    if len(flat) >= QUOTED_LINE and any(flat in words for words in quoted):
        return ""
    for words in quoted:
        if len(words) >= QUOTED_LINE and words in flat:
            flat = flat.replace(words, " | ")
    return flat


def shown_text(output) -> str:
    """The text a learner reads in one output in JupyterLab: a stream's text; of a display, its HTML as text (tags
    dropped, entities read) where it has HTML, else its markdown or plain text, nothing for a figure."""
    data = output.get("data", {})
    if "text/html" in data:
        return html.unescape(_TAG.sub("", _INVISIBLE_MARKUP.sub("", data["text/html"])))
    if any(kind in data for kind in FIGURES):
        return ""
    return output.get("text", "") or data.get("text/markdown", "") or data.get("text/plain", "")


class EnglishShown(NamedTuple):
    """An English sentence a notebook shows: in which cell, and the line (or error) that holds it."""

    cell: int
    sentence: str
    line: str

    def __str__(self) -> str:
        return f"cell {self.cell}: {self.sentence!r} in {self.line.strip()[:120]!r}"


def english_printed(cells, folder) -> list[EnglishShown]:
    """Every English sentence that executed code cells show: printed lines and displayed text (``shown_text``),
    not a line of the lesson's own code listed as code (``inspect.getsource`` of its module,
    ``IPython.display.Code``), not PyTorch's own words quoted whole (``_not_quoted``). From an error: all of an
    ``AssertionError``'s (``COURSE_ERRORS``: a visible test's message, a self-check's verdict), gpulab's English only
    from any other (Python's own error messages, such as a name not defined yet, are Python's)."""
    code = {line.strip() for path in folder.glob("*.py") for line in path.read_text(encoding="utf-8").splitlines()}
    quoted = pytorchs_own_words()
    found = []
    for index, cell in enumerate(cells):
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                said = output.get("evalue", "")
                english = english_sentences(said) if output.get("ename") in COURSE_ERRORS else gpulab_english_in(said)
                found += [EnglishShown(index, sentence, f"{output.get('ename')}: {said}") for sentence in english]
                continue
            for line in shown_text(output).splitlines():
                if line.strip() not in code:
                    found += [
                        EnglishShown(index, sentence, line) for sentence in english_sentences(_not_quoted(line, quoted))
                    ]
    return found
