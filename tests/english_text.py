"""What counts as an English sentence in the Japanese edition, and which English sentences are gpulab's.

An *English word* is a token of letters alone, lower case after its first letter, with an optional ``'s``-like
tail: ``peak``, ``Memory``, ``device's``. Code, numbers, units and names are not words: a token with a digit, an
underscore, a dot, brackets or an operator (``output_device=1``, ``nn.DataParallel``, ``(32, 4)``), or with a
capital after its first letter (``DataParallel``, ``MiB``, ``GPUs``, ``NVML``), or a unit (``ms``, ``s``). A
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
import re
from functools import cache
from pathlib import Path

GPULAB = Path(__file__).resolve().parents[1] / "utils" / "gpulab"
UNITS = {"ms", "s", "px"}
_WORD = re.compile(r"[A-Za-z][a-z]*(?:'[a-z]*)?")
_EDGE = ",:;().!?\"'`{}[]"
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
    return bool(_WORD.fullmatch(bare)) and bare not in UNITS and (len(bare) > 1 or bare in ("a", "A", "I"))


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
