"""Every lesson's quiz as the notebook sees it (``gpulab.quiz``): each question's form, the section it comes from,
a nudge, and a salted digest of its right answer, with the Japanese text of the sections and nudges.

No right answer and no explanation is here: gpulab is importable in a learner's kernel. The grader keeps its own
answer key and the explanations (``autograder/quizzes.py``); ``tests/test_quiz.py`` holds each digest here to that
key (``python -m autograder.quizzes`` prints them after a change)."""

from __future__ import annotations

from gpulab.quiz import Letter, Number, Quiz, Text

SPLITTING = Quiz(
    "01_splitting",
    (
        Number(
            key="q1",
            section="Uneven and tiny batches",
            nudge=("Work out how many samples each chunk holds first, then count the chunks."),
            salt="7c47b24782adb8755096f36192118ccc",
            digest="4214aaedeb846999f08fb1e8446bbee0872c1bc557a3bcbff36606fde31c4468",
        ),
        Number(
            key="q2",
            section="Uneven and tiny batches",
            nudge=("Write down the three chunk sizes, then count the samples from 0."),
            salt="552080ce05beea1e8813cbc25ae68e08",
            digest="ad7118a9a7e2146cc0ce13c8b85d0baaf6d8a1f6256c612de4894960f4fdf270",
        ),
        Letter(
            key="q3",
            section="More than one tensor: tuples, dicts, kwargs and other arguments",
            nudge=("What does scatter do with an argument that is not a tensor?"),
            salt="40155d6b95993ceda6203700d3d828c6",
            digest="63ceb8ada63e19067f2f04ec96eba33d486abf3817aa9cf3eb8197052cbb9f62",
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
            salt="748e228f4e778b94260218f1c301a1e7",
            digest="16397e1aae54b8c4ccd2c294837588c98add45163b5962485ff5c7d4ed1d83cf",
        ),
        Letter(
            key="q2",
            section="Where do the gradients go?",
            nudge=("Follow the mean loss of the gathered batch back to the parameters."),
            salt="0cf82701d37e903dc9f6d77eacba7fd0",
            digest="23ff05ec98420d6346c6e2c8ef52244562407d14700a89ab14a1715f6019340b",
        ),
        Letter(
            key="q3",
            section="DDP's way: one process per GPU, gradients all-reduced",
            nudge=("DDP averages the ranks' gradients: work out the weight of one sample on each rank."),
            salt="85a526cb0237e0027794c6ea52d932d3",
            digest="718aafd582908c4b9f22e9eabb46b58f2ba8f24048425135dc23483deb0167bb",
        ),
        Letter(
            key="q4",
            section="The exception: BatchNorm",
            nudge="Each replica runs the model on its own chunk only.",
            salt="f29babba4377294ffed606f0d28958bc",
            digest="cca2d578b274d820ccfd22a95c5f00832396d5902306e0526f406a9ac41a68b0",
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
            salt="d76cf5206eb664e82a22b53e981d6f3b",
            digest="ef59e5480c8ce745484b6116a0eab723eb6a4ff0682af2fad9b23044992d6a39",
        ),
        Number(
            key="q2",
            section="Exercise 2: `imbalance_ratio`",
            nudge=("Device 0's peak is divided by the mean of the other devices' peaks, not of all four."),
            salt="6b0784a70605300712a0138d8fb0d0fb",
            digest="a5978348b6d322c5b89fe52828c20933e54ba9427689e435b1280bd86609d686",
        ),
        Letter(
            key="q3",
            section="Before and after, measured",
            nudge=("Compare where the outputs end up in the three measured runs."),
            salt="2064bfb432d9ff30f0a1e6e57770bca9",
            digest="2ae8d6674ce116e5d5c66ebc8d96e8e937f7841a418a70713ec2809ab2c13748",
        ),
        Letter(
            key="q4",
            section="One number per device: the scalar warning",
            nudge="What does gather do with one 0-dim tensor per replica?",
            salt="d6f158f648c98d0334989155cf3fa6ca",
            digest="a3a633aba2ea6bb5dbb80d7e220fd5118c3754f065a42a171c2114cccba8063f",
        ),
        Letter(
            key="q5",
            section="When DataParallel is fine, and when to use DDP",
            nudge=("Which approach does PyTorch's documentation recommend, even on a single machine?"),
            salt="e05c448486f572e06dbcbb64c1c3d013",
            digest="2d055587d6515e5396e5fdaa2f1c84b35a48a337ed7573a8a892358d48d69f14",
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
            salt="33f9d180279861ca3fc252ba1b9ed4b7",
            digest="05550e2c2b69e9f92da2d78def270d0c33b2a206919e65cd04c91dad84f80140",
        ),
        Letter(
            key="q2",
            section="Under DDP: one writer, then a barrier",
            nudge=("The ranks hold the same weights: how many copies of the file are needed, and who writes them?"),
            salt="5b3220bf5c7633cf8b2730aeb01c0194",
            digest="809fe9caab1759f31517ad055466d71be11c9f71c1a50518406f0e411616bc31",
        ),
        Letter(
            key="q3",
            section="Under DDP: one writer, then a barrier",
            nudge=("Which option guarantees the order of the two events, rather than making it likely?"),
            salt="8c1db0a13999d55ee5c28b3f8527c538",
            digest="dc8f4fb57c1739f6ec2001fc9c11c0727ff9ab26a85a4e3227ef2da0e37b06ac",
        ),
        Letter(
            key="q4",
            section="Saving safely",
            nudge="Think of a crash halfway through torch.save.",
            salt="438e28ba39e289b8634da6f81bbb8a89",
            digest="34ab49a20206752d30e080e906a51c8c192c6aee8366e99c7bedfe0cf98def70",
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
