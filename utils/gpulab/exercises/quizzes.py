"""Every lesson's quiz as the notebook sees it (``gpulab.quiz``): each question's form, the section it comes from and
a nudge, with the Japanese text of the sections and nudges.

No right answer, no digest of one and no explanation is here: gpulab is importable in a learner's kernel. The
grader keeps its own answer key and the explanations (``autograder/quizzes.py``); self-study's ``gpulab_solutions``
keeps the salted digests the self-check compares with (``tests/test_quiz.py`` holds them to that key)."""

from __future__ import annotations

from gpulab.quiz import Letter, Number, Quiz, Text

SPLITTING = Quiz(
    "01_splitting",
    (
        Number(
            key="q1",
            section="Uneven and tiny batches",
            nudge=("Work out how many samples each chunk holds first, then count the chunks."),
        ),
        Number(
            key="q2",
            section="Uneven and tiny batches",
            nudge=("Write down the three chunk sizes, then count the samples from 0."),
        ),
        Letter(
            key="q3",
            section="More than one tensor: tuples, dicts, kwargs and other arguments",
            nudge=("What does scatter do with an argument that is not a tensor?"),
        ),
    ),
)

GRADIENT_AVERAGING = Quiz(
    "02_gradient_averaging",
    (
        Number(
            key="q1",
            section="When a plain average is wrong",
            nudge=("A chunk's mean gradient stands for its own samples only: weigh it by its share of the batch."),
        ),
        Letter(
            key="q2",
            section="Where do the gradients go?",
            nudge=("Follow the mean loss of the gathered batch back to the parameters."),
        ),
        Letter(
            key="q3",
            section="DDP's way: one process per GPU, gradients all-reduced",
            nudge=("DDP averages the ranks' gradients: work out the weight of one sample on each rank."),
        ),
        Letter(
            key="q4",
            section="The exception: BatchNorm",
            nudge="Each replica runs the model on its own chunk only.",
        ),
    ),
)

GPU0_IMBALANCE = Quiz(
    "03_gpu0_imbalance",
    (
        Number(
            key="q1",
            section="What device 0 holds that device 1 does not",
            nudge=("Gathered outputs are the whole batch's, whatever the number of GPUs: count bytes, not elements."),
        ),
        Number(
            key="q2",
            section="Exercise 2: `imbalance_ratio`",
            nudge=("Device 0's peak is divided by the mean of the other devices' peaks, not of all four."),
        ),
        Letter(
            key="q3",
            section="Before and after, measured",
            nudge=("Compare where the outputs end up in the three measured runs."),
        ),
        Letter(
            key="q4",
            section="One number per device: the scalar warning",
            nudge="What does gather do with one 0-dim tensor per replica?",
        ),
        Letter(
            key="q5",
            section="When DataParallel is fine, and when to use DDP",
            nudge=("Which approach does PyTorch's documentation recommend, even on a single machine?"),
        ),
    ),
)

CHECKPOINTS = Quiz(
    "04_checkpoints",
    (
        Text(
            key="q1",
            section="Where the prefix comes from",
            nudge="Under which attribute does the wrapper keep your model?",
        ),
        Letter(
            key="q2",
            section="Under DDP: one writer, then a barrier",
            nudge=("The ranks hold the same weights: how many copies of the file are needed, and who writes them?"),
        ),
        Letter(
            key="q3",
            section="Under DDP: one writer, then a barrier",
            nudge=("Which option guarantees the order of the two events, rather than making it likely?"),
        ),
        Letter(
            key="q4",
            section="Saving safely",
            nudge="Think of a crash halfway through torch.save.",
        ),
    ),
)

QUIZZES = (SPLITTING, GRADIENT_AVERAGING, GPU0_IMBALANCE, CHECKPOINTS)

# The Japanese edition's texts, by their English text (the sections' as the lessons' ``.ja.po`` translate them).
JAPANESE = {
    "Uneven and tiny batches": "割り切れないバッチと小さすぎるバッチ",
    ("Work out how many samples each chunk holds first, then count the chunks."): (
        "まず各チャンクに入るサンプル数を求め、それからチャンクの数を数えましょう。"
    ),
    ("Write down the three chunk sizes, then count the samples from 0."): (
        "3つのチャンクのサイズを書き出し、サンプルを0から数えましょう。"
    ),
    (
        "More than one tensor: tuples, dicts, kwargs and other arguments"
    ): "複数のテンソル：タプル、辞書、キーワード引数、その他の引数",
    (
        "What does scatter do with an argument that is not a tensor?"
    ): "テンソルではない引数を、scatterはどう扱うでしょうか。",
    "When a plain average is wrong": "単純平均が誤りになるとき",
    ("A chunk's mean gradient stands for its own samples only: weigh it by its share of the batch."): (
        "チャンクの平均勾配は、そのチャンクのサンプルだけを代表しています。バッチ全体に占める割合で重み付けしましょう。"
    ),
    "Where do the gradients go?": "勾配はどこへ行くのか？",
    ("Follow the mean loss of the gathered batch back to the parameters."): (
        "集められたバッチ全体の平均損失から、パラメータまでたどってみましょう。"
    ),
    "DDP's way: one process per GPU, gradients all-reduced": "DDPの方式：GPUごとに1プロセス、勾配はオールリデュース",
    ("DDP averages the ranks' gradients: work out the weight of one sample on each rank."): (
        "DDPはランクの勾配を平均します。各ランクの1サンプルあたりの重みを求めてみましょう。"
    ),
    "The exception: BatchNorm": "例外：BatchNorm",
    "Each replica runs the model on its own chunk only.": "各レプリカは、自分のチャンクだけでモデルを実行します。",
    "What device 0 holds that device 1 does not": "デバイス0にあってデバイス1にないもの",
    ("Gathered outputs are the whole batch's, whatever the number of GPUs: count bytes, not elements."): (
        "集められる出力は、GPUの台数によらずバッチ全体の分です。要素数ではなくバイト数で数えましょう。"
    ),
    "Exercise 2: `imbalance_ratio`": "演習2：`imbalance_ratio`",
    ("Device 0's peak is divided by the mean of the other devices' peaks, not of all four."): (
        "デバイス0のピークを割るのは、4台すべてではなく、ほかのデバイスのピークの平均です。"
    ),
    "Before and after, measured": "対策の前後を測定する",
    ("Compare where the outputs end up in the three measured runs."): (
        "測定した3つの実行で、出力がどこに置かれるかを比べてみましょう。"
    ),
    "One number per device: the scalar warning": "デバイスごとに1つの数値：スカラーの警告",
    "What does gather do with one 0-dim tensor per replica?": (
        "レプリカごとに1つずつの0次元テンソルを、gatherはどう扱うでしょうか。"
    ),
    "When DataParallel is fine, and when to use DDP": "DataParallelで十分な場合と、DDPを使うべき場合",
    ("Which approach does PyTorch's documentation recommend, even on a single machine?"): (
        "1台のマシンでも、PyTorchのドキュメントはどの方法を勧めているでしょうか。"
    ),
    "Where the prefix comes from": "プレフィックスはどこから来るのか",
    "Under which attribute does the wrapper keep your model?": "ラッパーは、どの属性にモデルを保持しているでしょうか。",
    "Under DDP: one writer, then a barrier": "DDPの場合：書き込みは1プロセスだけ、その後にバリア",
    ("The ranks hold the same weights: how many copies of the file are needed, and who writes them?"): (
        "どのランクも同じ重みを持っています。ファイルはいくつ必要で、誰が書けばよいでしょうか。"
    ),
    ("Which option guarantees the order of the two events, rather than making it likely?"): (
        "2つの出来事の順序を、「たぶん」ではなく確実に保証するのはどの選択肢でしょうか。"
    ),
    "Saving safely": "安全に保存する",
    "Think of a crash halfway through torch.save.": "torch.saveの途中でクラッシュした場合を考えてみましょう。",
}
TRANSLATIONS = {"ja": JAPANESE}
