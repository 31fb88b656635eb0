"""The grader's answer key of every lesson's quiz: the right answers and the explanations, kept in the grader.

gpulab, which a learner's kernel can import, declares each question only by its form, the section to re-read and a
nudge (``gpulab.quiz``); self-study's ``gpulab_solutions`` adds a salted digest of each right answer. The right
answers and the explanations (which name them) live here, in ``autograder/``, which no kernel can read
(``docs/architecture.md``, trust boundary). The quiz checks (``autograder/checks/quiz.py``) read each answer the
notebook returns with the question's own form (``Question.read``, ``Question.canonical``: code of the grader's own
gpulab, not data from the kernel) and compare it with the answer here; the feedback page shows the answer, the
verdict and the explanation in the student's edition (``feedback_line``). ``tests/test_quiz.py`` holds each digest
in ``gpulab_solutions`` to the answer here, so that the notebook's self-check and the grader agree; after changing
an answer here, ``python -m autograder.quizzes`` prints the digests for ``solutions/gpulab_solutions/quizzes.py``.

Numbers are computed with PyTorch where the lesson computes them, so that an answer is right exactly when it is
what PyTorch does.

A number answer is the kernel's data: written as a text, it is read only when it is small (``gpulab.quiz``'s
``_fraction``, which the self-check and the grader share: digits and exponent checked on the text before
``fractions.Fraction`` sees it, which would otherwise expand ``"1e999999999"`` into a billion-digit integer in the
grading worker or the learner's kernel); a larger one is unreadable, its question failed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from gpulab import quiz as forms
from torch import nn

STATUSES = ("right", "wrong", "unreadable", "unanswered")


@dataclass(frozen=True)
class Answer:
    """The right answer to question ``key`` (a letter, a number, a text, or a function computing one) and the
    explanation the feedback page shows."""

    key: str
    right: Any
    explanation: str

    def right_answer(self):
        return self.right() if callable(self.right) else self.right


def _gpus_with_data() -> int:
    """7 samples on 4 GPUs: how many chunks ``Tensor.chunk`` (DataParallel's scatter) makes."""
    return len(torch.arange(7).chunk(4))


def _device_of_sample_7() -> int:
    """Which of 3 GPUs gets sample 7 of a batch of 10."""
    return next(d for d, piece in enumerate(torch.arange(10).chunk(3)) if 7 in piece.tolist())


SPLITTING = (
    Answer(
        "q1",
        _gpus_with_data,
        (
            "7 samples on 4 GPUs are cut into chunks of ceil(7 / 4) = 2 samples: 2, 2, 2 and 1, so all 4 GPUs "
            "receive data. (5 samples would give 2, 2, 1: only 3 GPUs.)"
        ),
    ),
    Answer(
        "q2",
        _device_of_sample_7,
        (
            "10 samples on 3 GPUs give chunks of 4, 4 and 2: samples 0-3 on GPU 0, 4-7 on GPU 1, 8-9 on GPU 2. "
            "Sample 7 is on GPU 1."
        ),
    ),
    Answer(
        "q3",
        "b",
        (
            "(b): scatter cuts only tensors; any other argument, a Python float included, is repeated unchanged "
            "for every replica, so each receives temperature=0.5."
        ),
    ),
)


def _weight_of_the_last_chunk() -> Fraction:
    sizes = [len(chunk) for chunk in torch.arange(10).chunk(3)]
    return Fraction(sizes[-1], sum(sizes))


GRADIENT_AVERAGING = (
    Answer(
        "q1",
        _weight_of_the_last_chunk,
        (
            "w2 = n2 / B = 2 / 10 = 0.2: each chunk's mean gradient counts as much as its share of the samples "
            "(4/10, 4/10, 2/10), not 1/3 each."
        ),
    ),
    Answer(
        "q2",
        "b",
        (
            "(b): autograd sums the gradients that reach the parameters from every replica, and each is already "
            "scaled by 1/B because the loss is the mean over the whole gathered batch; nothing divides by the "
            "number of GPUs."
        ),
    ),
    Answer(
        "q3",
        "b",
        (
            "(b): DDP averages the 2 ranks' gradients, 1/2 each; rank 1's mean over its 2 samples gives each "
            "1/2 of that, so each weighs 1/4 (and each of rank 0's 6 samples 1/12) instead of 1/8."
        ),
    ),
    Answer(
        "q4",
        "b",
        (
            "(b): each replica's BatchNorm normalises its chunk with that chunk's own mean and variance, here "
            "GPU 1's 32 samples; the running statistics are used in eval mode only."
        ),
    ),
)


def _gathered_bytes() -> int:
    return 512 * 50_000 * torch.empty((), dtype=torch.float32).element_size()


GPU0_IMBALANCE = (
    Answer(
        "q1",
        _gathered_bytes,
        (
            "512 × 50,000 × 4 bytes (float32) = 102,400,000 bytes: GPU 0 receives the whole batch's output, "
            "however many GPUs computed it."
        ),
    ),
    Answer(
        "q2",
        Fraction(9) / Fraction(3 + 3 + 6, 3),
        ("9 / ((3 + 3 + 6) / 3) = 9 / 4 = 2.25: device 0's peak over the others' mean peak."),
    ),
    Answer(
        "q3",
        "b",
        (
            "(b): with the loss computed in forward, each replica turns its own outputs into a loss and only "
            "one number per GPU is gathered; output_device=1 only moves the outputs to GPU 1, and the learning "
            "rate changes no memory."
        ),
    ),
    Answer(
        "q4",
        "b",
        (
            "(b): gather turns each replica's 0-dim loss into shape [1] and concatenates them: shape [2], "
            "with a warning; take its mean yourself."
        ),
    ),
    Answer(
        "q5",
        "b",
        (
            "(b): PyTorch recommends DistributedDataParallel, one process per GPU, even on a single machine: no "
            "threads contending for the GIL, no replicas re-created each step, no outputs gathered on GPU 0."
        ),
    ),
)


def _wrapped_head_key() -> str:
    model = nn.Sequential(OrderedDict(body=nn.Linear(2, 2), head=nn.Linear(2, 1)))
    return next(key for key in nn.DataParallel(model).state_dict() if key.endswith("head.weight"))


CHECKPOINTS = (
    Answer(
        "q1",
        _wrapped_head_key,
        (
            "'module.head.weight': DataParallel keeps your model as its attribute .module, so every key of its "
            "state_dict starts with 'module.'."
        ),
    ),
    Answer(
        "q2",
        "c",
        (
            "(c): all ranks hold the same weights, so one writer is enough: rank 0 saves, and no two processes "
            "write to the same file."
        ),
    ),
    Answer(
        "q3",
        "a",
        (
            "(a): dist.barrier() makes every rank wait until rank 0 has finished writing; a sleep only makes "
            "that likely, and DDP synchronises gradients, not files."
        ),
    ),
    Answer(
        "q4",
        "b",
        (
            "(b): os.replace is atomic: the path holds either the previous checkpoint or the new, complete one, "
            "never a half-written file."
        ),
    ),
)

KEY: dict[str, tuple[Answer, ...]] = {
    "01_splitting": SPLITTING,
    "02_gradient_averaging": GRADIENT_AVERAGING,
    "03_gpu0_imbalance": GPU0_IMBALANCE,
    "04_checkpoints": CHECKPOINTS,
}

# The Japanese edition's explanations, by their English text.
JAPANESE = {
    (
        "7 samples on 4 GPUs are cut into chunks of ceil(7 / 4) = 2 samples: 2, 2, 2 and 1, so all 4 GPUs "
        "receive data. (5 samples would give 2, 2, 1: only 3 GPUs.)"
    ): (
        "7サンプルを4台のGPUに分けると、ceil(7 / 4) = 2サンプルずつのチャンク（2、2、2、1）になるので、4台すべてが"
        "データを受け取ります（5サンプルなら2、2、1となり、3台だけです）。"
    ),
    (
        "10 samples on 3 GPUs give chunks of 4, 4 and 2: samples 0-3 on GPU 0, 4-7 on GPU 1, 8-9 on GPU 2. "
        "Sample 7 is on GPU 1."
    ): (
        "10サンプルを3台のGPUに分けるとチャンクは4、4、2です。サンプル0〜3はGPU 0、4〜7はGPU 1、8〜9はGPU 2に"
        "送られるので、サンプル7はGPU 1にあります。"
    ),
    (
        "(b): scatter cuts only tensors; any other argument, a Python float included, is repeated unchanged "
        "for every replica, so each receives temperature=0.5."
    ): (
        "(b)：scatterが分割するのはテンソルだけです。Pythonのfloatを含むそれ以外の引数は、そのままの値で各レプリカに"
        "繰り返し渡されるので、どのレプリカもtemperature=0.5を受け取ります。"
    ),
    (
        "w2 = n2 / B = 2 / 10 = 0.2: each chunk's mean gradient counts as much as its share of the samples "
        "(4/10, 4/10, 2/10), not 1/3 each."
    ): (
        "w2 = n2 / B = 2 / 10 = 0.2です。各チャンクの平均勾配は、1/3ずつではなく、サンプル数の割合（4/10、4/10、"
        "2/10）の重みで数えます。"
    ),
    (
        "(b): autograd sums the gradients that reach the parameters from every replica, and each is already "
        "scaled by 1/B because the loss is the mean over the whole gathered batch; nothing divides by the "
        "number of GPUs."
    ): (
        "(b)：autogradは各レプリカからパラメータに届く勾配を合計します。損失は集められたバッチ全体の平均なので、"
        "それぞれはすでに1/B倍されています。GPUの台数で割る処理はどこにもありません。"
    ),
    (
        "(b): DDP averages the 2 ranks' gradients, 1/2 each; rank 1's mean over its 2 samples gives each "
        "1/2 of that, so each weighs 1/4 (and each of rank 0's 6 samples 1/12) instead of 1/8."
    ): (
        "(b)：DDPは2つのランクの勾配を1/2ずつで平均します。ランク1の損失は2サンプルの平均なので、各サンプルはその"
        "1/2、つまり1/8ではなく1/4の重みになります（ランク0の6サンプルはそれぞれ1/12）。"
    ),
    (
        "(b): each replica's BatchNorm normalises its chunk with that chunk's own mean and variance, here "
        "GPU 1's 32 samples; the running statistics are used in eval mode only."
    ): (
        "(b)：各レプリカのBatchNormは、自分のチャンク（ここではGPU 1の32サンプル）の平均と分散で正規化します。"
        "移動統計量が使われるのは評価モードのときだけです。"
    ),
    (
        "512 × 50,000 × 4 bytes (float32) = 102,400,000 bytes: GPU 0 receives the whole batch's output, "
        "however many GPUs computed it."
    ): (
        "512 × 50,000 × 4バイト（float32）= 102,400,000バイトです。何台のGPUで計算しても、GPU 0はバッチ全体の出力を"
        "受け取ります。"
    ),
    ("9 / ((3 + 3 + 6) / 3) = 9 / 4 = 2.25: device 0's peak over the others' mean peak."): (
        "9 / ((3 + 3 + 6) / 3) = 9 / 4 = 2.25です。デバイス0のピークを、ほかのデバイスのピークの平均で割った値です。"
    ),
    (
        "(b): with the loss computed in forward, each replica turns its own outputs into a loss and only "
        "one number per GPU is gathered; output_device=1 only moves the outputs to GPU 1, and the learning "
        "rate changes no memory."
    ): (
        "(b)：損失をforwardの中で計算すると、各レプリカが自分の出力を損失に変え、集められるのはGPUごとに1つの数値だけ"
        "になります。output_device=1は出力をGPU 1に移すだけで、学習率はメモリを変えません。"
    ),
    (
        "(b): gather turns each replica's 0-dim loss into shape [1] and concatenates them: shape [2], "
        "with a warning; take its mean yourself."
    ): (
        "(b)：gatherは各レプリカの0次元の損失を形状[1]にして連結するので、警告とともに形状[2]になります。"
        "平均は自分で取りましょう。"
    ),
    (
        "(b): PyTorch recommends DistributedDataParallel, one process per GPU, even on a single machine: no "
        "threads contending for the GIL, no replicas re-created each step, no outputs gathered on GPU 0."
    ): (
        "(b)：PyTorchは1台のマシンでも、GPUごとに1プロセスのDistributedDataParallelを勧めています。GILを奪い合う"
        "スレッドも、ステップごとのレプリカの作り直しも、GPU 0への出力の集約もありません。"
    ),
    (
        "'module.head.weight': DataParallel keeps your model as its attribute .module, so every key of its "
        "state_dict starts with 'module.'."
    ): (
        "'module.head.weight'です。DataParallelはモデルを属性.moduleとして保持するので、そのstate_dictのキーは"
        "すべて'module.'で始まります。"
    ),
    (
        "(c): all ranks hold the same weights, so one writer is enough: rank 0 saves, and no two processes "
        "write to the same file."
    ): (
        "(c)：すべてのランクが同じ重みを持つので、書き込むのは1つで十分です。ランク0が保存し、2つのプロセスが"
        "同じファイルに書き込むことはありません。"
    ),
    (
        "(a): dist.barrier() makes every rank wait until rank 0 has finished writing; a sleep only makes "
        "that likely, and DDP synchronises gradients, not files."
    ): (
        "(a)：dist.barrier()は、ランク0が書き終えるまですべてのランクを待たせます。sleepはそうなりやすくするだけで、"
        "DDPが同期するのは勾配であってファイルではありません。"
    ),
    (
        "(b): os.replace is atomic: the path holds either the previous checkpoint or the new, complete one, "
        "never a half-written file."
    ): (
        "(b)：os.replaceはアトミックです。パスにあるのは以前のチェックポイントか新しい完全なチェックポイントの"
        "どちらかで、書きかけのファイルになることはありません。"
    ),
}


def answer_of(lesson: str, key: str) -> Answer:
    """The key's answer to question ``key`` of ``lesson`` (its assignment name)."""
    for answer in KEY[lesson]:
        if answer.key == key:
            return answer
    raise KeyError(f"{lesson}'s answer key has no question {key!r}")


def right_canonical(lesson: str, key: str) -> str:
    """The right answer as the question's form writes every answer it counts as the same."""
    question = forms.quiz_of(lesson).question(key)
    reading = question.read(answer_of(lesson, key).right_answer())
    if reading is None:
        raise ValueError(f"{lesson} {key}: the key's answer does not have the question's form")
    return question.canonical(reading)


def judge(lesson: str, key: str, answers: Any) -> forms.Verdict:
    """The grader's verdict on question ``key`` of ``lesson`` for ``answers`` (what the grader read back of the
    notebook's ``quiz_answers``): the answer read with the question's form, compared with this key. The digest in
    gpulab plays no part. A number answer out of bounds (``gpulab.quiz.MAX_NUMBER_CHARACTERS``, ``MAX_EXPONENT``) is
    unreadable, never expanded."""
    question = forms.quiz_of(lesson).question(key)
    status, shown, reading = question.reading(answers)
    if status == "read":
        status = "right" if question.canonical(reading) == right_canonical(lesson, key) else "wrong"
    return forms.Verdict(key, status, shown)


def explanation(lesson: str, key: str, language: str = "en") -> str:
    """The explanation of question ``key`` of ``lesson``, in ``language`` (English when it has no translation)."""
    english = answer_of(lesson, key).explanation
    return JAPANESE.get(english, english) if language == "ja" else english


def feedback_line(record: Any, language: str = "en") -> str | None:
    """The feedback page's line for a graded quiz cell, from the grader's record of its verdict
    (``Verdict.record``): the learner's answer, right or not, and the explanation, in ``language``. ``None`` when
    the record is not one of a question in the key."""
    if not isinstance(record, dict):  # a NotebookNode when read from the graded notebook's metadata
        return None
    try:
        lesson = forms.quiz_of(str(record.get("lesson"))).lesson
        question = forms.quiz_of(lesson).question(str(record.get("question")))
        why = explanation(lesson, question.key, language)
    except KeyError:
        return None
    status, answer = record.get("status"), record.get("answer")
    if status not in STATUSES or type(answer) is not str:
        return None
    answer = answer if len(answer) <= 80 else answer[:77] + "..."
    if status == "unanswered":
        said = forms._message("quiz.feedback_unanswered", language, key=question.key)
    elif status == "unreadable":
        form = question.form(language)
        said = forms._message("quiz.feedback_unreadable", language, key=question.key, answer=answer, form=form)
    else:
        said = forms._message(f"quiz.feedback_{status}", language, key=question.key, answer=answer)
    return f"{'✔' if status == 'right' else '✘'} {forms._join(language, said, why)}"


def digests() -> dict[str, dict[str, str]]:
    """Per lesson and question, the digest of this key's answer with the salt of ``gpulab_solutions`` (what that
    package must declare)."""
    from gpulab_solutions.quizzes import DIGESTS

    found: dict[str, dict[str, str]] = {}
    for lesson, answers in KEY.items():
        for answer in answers:
            salt = DIGESTS[lesson][answer.key][0]
            canonical = right_canonical(lesson, answer.key)
            found.setdefault(lesson, {})[answer.key] = forms.digest(lesson, answer.key, salt, canonical)
    return found


if __name__ == "__main__":
    for lesson, table in digests().items():
        for key, value in table.items():
            print(lesson, key, value)
