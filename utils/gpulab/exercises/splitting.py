"""Lesson 01 (splitting the batch): the self-checks of ``chunk_sizes``, ``device_of_sample``, ``split_batch``.

Their rules, inputs, comparisons and hints; the references (PyTorch's own ``Tensor.chunk``, the function
DataParallel's scatter uses), the grader's hidden inputs and the solutions are in ``gpulab_solutions.splitting``.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from gpulab.check import Call, Case, Exercise, Hint, Raises, Rule


def is_integer(value: Any) -> bool:
    """An integral number that is not a bool (``int``, ``numpy.int64``...: what the graded cells take)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def same_sizes(got: Any, expected: list[int]) -> bool:
    """A plain list of integers (not bools) equal to ``expected``."""
    return type(got) is list and all(is_integer(size) for size in got) and bool(got == expected)


def _sizes_visible() -> list[Call]:
    return [
        Call((64, 2), "the seed's example: 64 samples on 2 GPUs, 32 each"),
        Call((10, 3), "uneven: every chunk has ceil(10/3) = 4 samples, the last the rest"),
        Call((5, 4), "chunks of ceil(5/4) = 2: 2 + 2 + 1, the fourth device waits"),
    ]


def _sizes_extra() -> list[Call]:
    return [Call(pair, "Tensor.chunk semantics") for pair in [(1, 1), (7, 2), (9, 4), (13, 8), (17, 5), (100, 7)]]


# Which case of a rule an input is, named by the grader's feedback (translated in TRANSLATIONS below).
EVEN = "a batch that divides evenly over the devices"
UNEVEN = "an uneven batch, e.g. 7 samples over 4 devices: [2, 2, 2, 1]"
FEWER = "fewer samples than devices: only some devices receive a chunk"


def _batch_case(batch_size: int, n_devices: int) -> str:
    if batch_size < n_devices:
        return FEWER
    return EVEN if batch_size % n_devices == 0 else UNEVEN


# The cases of the tiny rule ("one per device that receives data"): which devices a batch leaves without a chunk.
SOME_IDLE = "at least as many samples as devices, yet some get none: 5 samples on 4 devices make chunks of 2, 2 and 1"
ALL_FED = "every device receives a chunk: as many chunks as devices"


def _tiny_case(batch_size: int, n_devices: int) -> str:
    if batch_size < n_devices:
        return FEWER
    return ALL_FED if len(range(0, batch_size, -(-batch_size // n_devices))) == n_devices else SOME_IDLE


INVALID = ("batch_size < 1 must raise ValueError", "n_devices < 1 must raise ValueError")


def _invalid_case(batch_size: int, n_devices: int) -> str:
    return INVALID[0] if batch_size < 1 else INVALID[1]


CHUNK_SIZES_RULES = (
    Rule(
        "the sub-batch sizes DataParallel produces, in device order, as a list of ints",
        "sizes",
        same=same_sizes,
        visible=_sizes_visible,
        extra=_sizes_extra,
        case_names=(EVEN, UNEVEN),
        case_name=_batch_case,
    ),
    Rule(
        "one per device that receives data",
        "tiny_and_invalid",
        same=same_sizes,
        visible=lambda: [Call((2, 4), "a tiny batch: only 2 devices receive data, the other 2 wait")],
        extra=lambda: [
            Call((1, 3), "Tensor.chunk semantics"),
            Call((5, 4), "chunks of ceil(5/4) = 2: 2 + 2 + 1, so the fourth device gets nothing"),
            Call((6, 6), "one sample per device: six chunks of one"),
        ],
        case_names=(FEWER, SOME_IDLE, ALL_FED),
        case_name=_tiny_case,
    ),
    Rule(
        "Raise `ValueError` if either argument is below 1",
        "tiny_and_invalid",
        raises=ValueError,
        visible=lambda: [
            Call((0, 2), "a batch needs at least one sample"),
            Call((3, 0), "there must be at least one device"),
        ],
        extra=lambda: [Call((8, 0), "there must be at least one device")],
        case_names=INVALID,
        case_name=_invalid_case,
    ),
)


def _sizes(got: Any) -> list[int] | None:
    """``got`` as a list of ints, or None when it is not one (then other hints apply)."""
    if isinstance(got, (list, tuple)) and all(isinstance(size, int) for size in got):
        return list(got)
    return None


def _loses_samples(case: Case, got: Any) -> bool:
    sizes = _sizes(got)
    return sizes is not None and sum(sizes) < case.args[0]


def _duplicates_samples(case: Case, got: Any) -> bool:
    sizes = _sizes(got)
    return sizes is not None and sum(sizes) > case.args[0]


def _has_empty_chunks(case: Case, got: Any) -> bool:
    sizes = _sizes(got)
    return sizes is not None and 0 in sizes


def _balanced(case: Case, got: Any) -> bool:
    sizes = _sizes(got)
    return (
        sizes is not None
        and sum(sizes) == case.args[0]
        and 0 not in sizes
        and max(sizes) - min(sizes) <= 1
        and sizes != case.expected
    )


CHUNK_SIZES = Exercise(
    name="chunk_sizes",
    rules=CHUNK_SIZES_RULES,
    hints=[
        Hint(
            lambda case, got: isinstance(case.expected, Raises),
            "A batch with no samples, or no device to send it to, is not a valid request: the contract asks for "
            "a ValueError before any splitting.",
        ),
        Hint(
            _loses_samples,
            "Samples are lost: your sizes add up to fewer than batch_size, so some samples would never reach a "
            "device. Every sample goes to exactly one device; the demo 'Uneven and tiny batches' prints sizes that "
            "always add up to the batch.",
        ),
        Hint(
            _duplicates_samples,
            "Samples are counted twice: your sizes add up to more than batch_size. Every sample goes to exactly one "
            "device; compare with the sizes Tensor.chunk prints in the demo 'Uneven and tiny batches'.",
        ),
        Hint(
            _has_empty_chunks,
            "DataParallel never sends an empty chunk: when the batch runs out, the remaining devices get nothing "
            "and are left out of the list (the demo with 2 samples on 4 devices shows it).",
        ),
        Hint(
            _balanced,
            "That is a balanced split (sizes differ by at most one), torch.tensor_split's way. DataParallel uses "
            "Tensor.chunk, which fills each chunk to the same size before starting the next; the demo comparing "
            "tensor_split and chunk shows the difference.",
        ),
        Hint(
            lambda case, got: type(got) is not list,
            "The contract asks for a plain Python list of ints, one per device that receives data.",
        ),
    ],
    general_hint="Each chunk holds ceil(batch_size / n_devices) samples; keep cutting until the batch runs out.",
)


def same_device(got: Any, expected: int) -> bool:
    """An integer (not a bool) equal to ``expected``."""
    return is_integer(got) and bool(got == expected)


def _device_visible() -> list[Call]:
    return [
        Call((0, 64, 2), "the first sample goes to device 0"),
        Call((31, 64, 2), "samples 0..31 go to device 0"),
        Call((32, 64, 2), "samples 32..63 go to device 1"),
        Call((8, 10, 3), "10 over 3 is [4, 4, 2]: samples 8 and 9 are on device 2"),
        Call((4, 5, 4), "5 over 4 is [2, 2, 1]: sample 4 is on device 2, and device 3 gets no sample"),
    ]


def _device_extra() -> list[Call]:
    return [Call(t, "Tensor.chunk semantics") for t in [(1, 2, 4), (6, 7, 2), (12, 13, 8)]]


DEVICE_CASES = (
    "the device of each sample of a batch that divides evenly",
    "the device of each sample of an uneven batch (the last chunk is shorter)",
    FEWER,
)
OUT_OF_RANGE = ("a negative index must raise IndexError", "an index past the end of the batch must raise IndexError")


def _device_case(index: int, batch_size: int, n_devices: int) -> str:
    return DEVICE_CASES[(EVEN, UNEVEN, FEWER).index(_batch_case(batch_size, n_devices))]


def _out_of_range_case(index: int, batch_size: int, n_devices: int) -> str:
    return OUT_OF_RANGE[0] if index < 0 else OUT_OF_RANGE[1]


DEVICE_OF_SAMPLE_RULES = (
    Rule(
        "the device (an int) whose chunk, cut as in Exercise 1, holds that sample",
        "devices",
        same=same_device,
        visible=_device_visible,
        extra=_device_extra,
        case_names=DEVICE_CASES,
        case_name=_device_case,
    ),
    Rule(
        "Raise `IndexError` if `index` is outside `[0, batch_size)`",
        "out_of_range",
        raises=IndexError,
        visible=lambda: [
            Call((64, 64, 2), "a batch of 64 has samples 0..63 only"),
            Call((-1, 64, 2), "negative indices are not samples"),
        ],
        case_names=OUT_OF_RANGE,
        case_name=_out_of_range_case,
    ),
)


DEVICE_OF_SAMPLE = Exercise(
    name="device_of_sample",
    rules=DEVICE_OF_SAMPLE_RULES,
    hints=[
        Hint(
            lambda case, got: isinstance(case.expected, Raises),
            "A sample index outside the batch names no sample at all; the contract asks for an IndexError.",
        ),
        Hint(
            lambda case, got: isinstance(got, int) and got == case.args[0] * case.args[2] // case.args[1],
            "That assumes every device gets an equal share of the batch. Chunks are filled one after another, "
            "each with the same size (the last one shorter): see the sample grid of 10 samples on 4 devices.",
        ),
    ],
    general_hint="Every chunk but the last holds ceil(batch_size / n_devices) samples, in order.",
)


def same_split(got: Any, expected: Any) -> bool:
    """Structural equality: the same container types (exactly) and lengths, tensors (exactly ``torch.Tensor``)
    equal in shape and values; any other object of a type plain data carries (str, a number, None) equal to the
    expected one, and any other object the expected object itself (repeated, not copied)."""
    if isinstance(expected, torch.Tensor):
        return type(got) is torch.Tensor and got.shape == expected.shape and got.tolist() == expected.tolist()
    if type(expected) in (list, tuple):
        return (
            type(got) is type(expected)
            and len(got) == len(expected)
            and all(same_split(g, e) for g, e in zip(got, expected, strict=True))
        )
    if type(expected) is dict:
        return (
            type(got) is dict and list(got) == list(expected) and all(same_split(got[k], expected[k]) for k in expected)
        )
    if expected is None or type(expected) in (str, int, float, bool):
        return type(got) is type(expected) and bool(got == expected)
    return got is expected


def _tensors_visible() -> list[Call]:
    return [Call((torch.arange(20).reshape(10, 2), 3), "a tensor is chunked along dim 0: 4, 4 and 2 rows")]


def _tensors_extra() -> list[Call]:
    x = torch.arange(14).reshape(7, 2)
    return [Call((x[:1], 3), "a batch of one sample: one chunk"), Call((x, 2), "Tensor.chunk semantics")]


def _containers_visible() -> list[Call]:
    x, y = torch.arange(20).reshape(10, 2), torch.arange(10)
    return [
        Call(((x, y), 2), "a tuple gives one tuple per device"),
        Call(({"inputs": x, "labels": y}, 3), "a dict gives one dict per device"),
    ]


def _containers_extra() -> list[Call]:
    x = torch.arange(14).reshape(7, 2)
    nested = ([x, (x[:, 0], 3.5)], {"mask": x > 3})
    return [
        Call(([x, x], 2), "a list gives one list per device"),
        Call((nested, 3), "containers nest"),
        Call(({"z": x, "a": x[:, 0]}, 2), "each dict keeps the batch's keys in their order"),
        Call(((x[:3], {"y": x[:3, 0]}), 5), "3 samples on 5 devices inside a tuple: 3 entries, one per device fed"),
    ]


class _Tag:
    """An object of the learner's own kind (neither a tensor nor a container), for the self-check."""

    def __init__(self, tag: str):
        self.tag = tag

    def __eq__(self, other: object) -> bool:
        return type(other) is _Tag and other.tag == self.tag  # a copy is equal, yet not the object itself

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<{self.tag}>"


SPLIT_BATCH_RULES = (
    Rule(
        "A tensor is cut along dim 0 as in Exercise 1",
        "tensors",
        same=same_split,
        visible=_tensors_visible,
        extra=_tensors_extra,
    ),
    Rule(
        "Leave `batch` unchanged",
        "tensors",
        same=same_split,
        visible=_tensors_visible,
        unchanged=True,
    ),
    Rule(
        "a tuple, list or dict gives a list of tuples, lists or dicts, split element by element",
        "containers",
        same=same_split,
        visible=_containers_visible,
        extra=_containers_extra,
    ),
    Rule(
        "any other object is repeated, itself, for each device",
        "others_and_tiny",
        same=same_split,
        visible=lambda: [
            Call(("mean", 3), "other objects are repeated for each device"),
            Call(((torch.arange(20).reshape(10, 2), "mean"), 2), "non-tensors are repeated for every chunk"),
        ],
        extra=lambda: [Call((_Tag("sent"), 3), "the object itself, not a copy, for each device")],
    ),
    Rule(
        "one entry per device that receives data",
        "others_and_tiny",
        same=same_split,
        visible=lambda: [Call((torch.arange(2), 4), "2 samples on 4 devices: only 2 chunks")],
    ),
)


SPLIT_BATCH = Exercise(
    name="split_batch",
    rules=SPLIT_BATCH_RULES,
    hints=[
        Hint(
            lambda case, got: isinstance(got, list) and len(got) == case.args[1] and len(got) != len(case.expected),
            "Return one entry per device that *receives data*: when the batch is smaller than the number of "
            "devices, Tensor.chunk makes fewer chunks, and the list is shorter.",
        ),
        Hint(
            lambda case, got: isinstance(case.args[0], (tuple, list, dict)) and isinstance(got, (tuple, dict)),
            "Return a list with one entry per device; each entry has the batch's own type (tuple, list or dict).",
        ),
        Hint(
            lambda case, got: isinstance(case.args[0], (tuple, list, dict)),
            "A container is split element by element: device i's entry holds piece i of every element, in the "
            "container's own type (the Inspector demo shows a dict arriving as one dict per replica). Anything that "
            "is neither a tensor nor a container is repeated for every device.",
        ),
    ],
    general_hint="Three kinds of values, three rules: tensors are cut along dim 0 as in chunk_sizes; containers "
    "are split element by element, and entry i gathers piece i of each element; anything else is repeated (the "
    "Inspector demo shows all three).",
)

EXERCISES = [CHUNK_SIZES, DEVICE_OF_SAMPLE, SPLIT_BATCH]

# The texts above in Japanese, for the Japanese edition (gpulab.messages.text looks them up by their English).
TRANSLATIONS: dict[str, dict[str, str]] = {
    "ja": {
        "chunks of ceil(5/4) = 2: 2 + 2 + 1, so the fourth device gets nothing": (
            "チャンクはceil(5/4) = 2サンプル：2 + 2 + 1なので、4台目のデバイスには何も届きません"
        ),
        "one sample per device: six chunks of one": "デバイスごとに1サンプル：1サンプルのチャンクが6つです",
        "3 samples on 5 devices inside a tuple: 3 entries, one per device fed": (
            "タプルの中の3サンプルを5台のデバイスへ：データを受け取るデバイスごとに1つ、計3エントリです"
        ),
        # The cases of the rules the grader's feedback names (case_name above).
        EVEN: "デバイス数で割り切れるバッチ",
        UNEVEN: "割り切れないバッチ（例：4台のデバイスに7サンプルなら[2, 2, 2, 1]）",
        FEWER: "デバイスよりサンプルが少ない場合：チャンクを受け取るのは一部のデバイスだけです",
        SOME_IDLE: (
            "サンプルがデバイスと同数以上でも、チャンクを受け取らないデバイスがある場合："
            "4台のデバイスに5サンプルなら、チャンクは2、2、1です"
        ),
        ALL_FED: "すべてのデバイスがチャンクを受け取る場合：チャンクの数とデバイスの数が同じです",
        "batch_size < 1 must raise ValueError": "batch_sizeが1未満ならValueErrorを送出します",
        "n_devices < 1 must raise ValueError": "n_devicesが1未満ならValueErrorを送出します",
        "the device of each sample of a batch that divides evenly": "割り切れるバッチの各サンプルのデバイス",
        "the device of each sample of an uneven batch (the last chunk is shorter)": (
            "割り切れないバッチ（最後のチャンクが短い）の各サンプルのデバイス"
        ),
        "an index past the end of the batch must raise IndexError": (
            "バッチの末尾を超えるインデックスならIndexErrorを送出します"
        ),
        "a negative index must raise IndexError": "負のインデックスならIndexErrorを送出します",
        "Each chunk holds ceil(batch_size / n_devices) samples; keep cutting until the batch runs out.": (
            "各チャンクにはceil(batch_size / n_devices)個のサンプルが入ります。"
            "バッチがなくなるまで切り分け続けましょう。"
        ),
        (
            "A batch with no samples, or no device to send it to, is not a valid request: the contract asks for a "
            "ValueError before any splitting."
        ): (
            "サンプルが1つもないバッチや、送り先のデバイスが1台もない場合は、正しい要求ではありません。仕様では、"
            "分割を始める前にValueErrorを送出することになっています。"
        ),
        (
            "Samples are lost: your sizes add up to fewer than batch_size, so some samples would never reach a "
            "device. Every sample goes to exactly one device; the demo 'Uneven and tiny batches' prints sizes that "
            "always add up to the batch."
        ): (
            "サンプルが失われています。サイズの合計がbatch_sizeより小さいため、"
            "どのデバイスにも届かないサンプルが出ます。各サンプルはちょうど1台のデバイスに送られます。"
            "「割り切れないバッチと小さすぎるバッチ」のデモが表示するサイズは、合計が必ずバッチサイズになります。"
        ),
        (
            "Samples are counted twice: your sizes add up to more than batch_size. Every sample goes to exactly one "
            "device; compare with the sizes Tensor.chunk prints in the demo 'Uneven and tiny batches'."
        ): (
            "サンプルが二重に数えられています。サイズの合計がbatch_sizeを超えています。"
            "各サンプルはちょうど1台のデバイスに送られます。「割り切れないバッチと小さすぎるバッチ」のデモでTensor.ch"
            "unkが表示するサイズと比べてみましょう。"
        ),
        (
            "DataParallel never sends an empty chunk: when the batch runs out, the remaining devices get nothing and "
            "are left out of the list (the demo with 2 samples on 4 devices shows it)."
        ): (
            "DataParallelは空のチャンクを送りません。バッチがなくなった時点で、残りのデバイスには何も送られず、"
            "リストにも含まれません（4台のデバイスに2サンプルを送るデモで確認できます）。"
        ),
        (
            "That is a balanced split (sizes differ by at most one), torch.tensor_split's way. DataParallel uses "
            "Tensor.chunk, which fills each chunk to the same size before starting the next; the demo comparing "
            "tensor_split and chunk shows the difference."
        ): (
            "それは均等な分割（サイズの差が最大1）で、torch.tensor_splitのやり方です。DataParallelが使うTensor.chunk"
            "は、各チャンクを同じサイズまで埋めてから次のチャンクに進みます。tensor_splitとchunkを比べるデモで違いを"
            "確認できます。"
        ),
        "The contract asks for a plain Python list of ints, one per device that receives data.": (
            "仕様では、データを受け取るデバイスごとに1つずつ、intを並べた通常のPythonのリストを返すことになっています。"
        ),
        "the seed's example: 64 samples on 2 GPUs, 32 each": "最初の例：2台のGPUに64サンプル、32個ずつ",
        "uneven: every chunk has ceil(10/3) = 4 samples, the last the rest": (
            "割り切れない場合：各チャンクはceil(10/3) = 4サンプルで、最後のチャンクが残り"
        ),
        "a tiny batch: only 2 devices receive data, the other 2 wait": (
            "小さすぎるバッチ：データを受け取るのは2台だけで、残りの2台は待機します"
        ),
        "chunks of ceil(5/4) = 2: 2 + 2 + 1, the fourth device waits": (
            "チャンクのサイズはceil(5/4) = 2：2 + 2 + 1で、4台目のデバイスは待機します"
        ),
        "a batch needs at least one sample": "バッチには少なくとも1つのサンプルが必要です",
        "there must be at least one device": "デバイスは少なくとも1台必要です",
        "Tensor.chunk semantics": "Tensor.chunkの仕様どおり",
        "Every chunk but the last holds ceil(batch_size / n_devices) samples, in order.": (
            "最後以外の各チャンクには、順番どおりにceil(batch_size / n_devices)個のサンプルが入ります。"
        ),
        "A sample index outside the batch names no sample at all; the contract asks for an IndexError.": (
            "バッチの範囲外のサンプル番号は、どのサンプルも指していません。仕様ではIndexErrorを送出することになってい"
            "ます。"
        ),
        (
            "That assumes every device gets an equal share of the batch. Chunks are filled one after another, each "
            "with the same size (the last one shorter): see the sample grid of 10 samples on 4 devices."
        ): (
            "それは、すべてのデバイスがバッチを均等に受け取ることを前提にしています。"
            "チャンクは同じサイズで1つずつ順に埋められます（最後のチャンクだけ短くなります）。"
            "4台のデバイスに10サンプルを送ったときのサンプルの図を見てみましょう。"
        ),
        "the first sample goes to device 0": "最初のサンプルはデバイス0に送られます",
        "samples 0..31 go to device 0": "サンプル0..31はデバイス0に送られます",
        "samples 32..63 go to device 1": "サンプル32..63はデバイス1に送られます",
        "10 over 3 is [4, 4, 2]: samples 8 and 9 are on device 2": (
            "10を3台に分けると[4, 4, 2]：サンプル8と9はデバイス2にあります"
        ),
        "a batch of 64 has samples 0..63 only": "サイズ64のバッチにあるのはサンプル0..63だけです",
        "5 over 4 is [2, 2, 1]: sample 4 is on device 2, and device 3 gets no sample": (
            "5を4台に分けると[2, 2, 1]：サンプル4はデバイス2にあり、デバイス3にはサンプルがありません"
        ),
        # The rules' statements, as the Japanese edition of lesson 01 states them.
        "A tensor is cut along dim 0 as in Exercise 1": "テンソルは演習1と同じように次元0に沿って切り分けます",
        "a tuple, list or dict gives a list of tuples, lists or dicts, split element by element": (
            "タプル、リスト、辞書からは、要素ごとに分割したタプル、リスト、辞書のリストができます"
        ),
        "any other object is repeated, itself, for each device": (
            "その他のオブジェクトは、そのもの自体をデバイスごとに繰り返します"
        ),
        "Leave `batch` unchanged": "`batch`は変更しないでください",
        "each dict keeps the batch's keys in their order": "各辞書のキーは、バッチのキーと同じ順番です",
        "one entry per device that receives data": "データを受け取るデバイス1台につき1つです",
        "other objects are repeated for each device": "テンソル以外のオブジェクトは、デバイスごとに繰り返されます",
        "the object itself, not a copy, for each device": "デバイスごとに、コピーではなくそのオブジェクト自体",
        "the sub-batch sizes DataParallel produces, in device order, as a list of ints": (
            "DataParallelが作るサブバッチのサイズを、デバイスの順にintのリストで返します"
        ),
        "one per device that receives data": "データを受け取るデバイス1台につき1つです",
        "Raise `ValueError` if either argument is below 1": "どちらかの引数が1未満なら`ValueError`を送出してください",
        "the device (an int) whose chunk, cut as in Exercise 1, holds that sample": (
            "演習1と同じように切り分けたとき、そのサンプルを含むチャンクのデバイス（int）を返します"
        ),
        "Raise `IndexError` if `index` is outside `[0, batch_size)`": (
            "`index`が`[0, batch_size)`の範囲外なら`IndexError`を送出してください"
        ),
        "negative indices are not samples": "負の番号はサンプルを指しません",
        (
            "Three kinds of values, three rules: tensors are cut along dim 0 as in chunk_sizes; containers are split "
            "element by element, and entry i gathers piece i of each element; anything else is repeated (the "
            "Inspector demo shows all three)."
        ): (
            "値の種類は3つ、ルールも3つです。テンソルはchunk_sizesと同じように次元0に沿って切り分けます。"
            "コンテナーは要素ごとに分割し、i番目のエントリーには各要素のi番目の断片をまとめます。"
            "それ以外の値は繰り返します（Inspectorのデモで3つとも確認できます）。"
        ),
        (
            "Return one entry per device that *receives data*: when the batch is smaller than the number of devices, "
            "Tensor.chunk makes fewer chunks, and the list is shorter."
        ): (
            "*データを受け取る*デバイスごとに1つのエントリーを返してください。バッチがデバイス数より小さいと、"
            "Tensor.chunkが作るチャンクは少なくなり、リストも短くなります。"
        ),
        "Return a list with one entry per device; each entry has the batch's own type (tuple, list or dict).": (
            "デバイスごとに1つのエントリーを持つリストを返してください。各エントリーの型は、バッチ自身の型（タプル、"
            "リスト、辞書）と同じです。"
        ),
        (
            "A container is split element by element: device i's entry holds piece i of every element, in the "
            "container's own type (the Inspector demo shows a dict arriving as one dict per replica). Anything that "
            "is neither a tensor nor a container is repeated for every device."
        ): (
            "コンテナーは要素ごとに分割します。デバイスiのエントリーには、すべての要素のi番目の断片が、"
            "コンテナー自身の型で入ります（Inspectorのデモでは、辞書がレプリカごとに1つの辞書として届く様子を確認でき"
            "ます）。テンソルでもコンテナーでもない値は、すべてのデバイスに繰り返し渡します。"
        ),
        "a tensor is chunked along dim 0: 4, 4 and 2 rows": "テンソルは次元0に沿って切り分けられます：4行、4行、2行",
        "a tuple gives one tuple per device": "タプルからはデバイスごとに1つのタプルができます",
        "a dict gives one dict per device": "辞書からはデバイスごとに1つの辞書ができます",
        "non-tensors are repeated for every chunk": "テンソル以外の値は、チャンクごとに繰り返されます",
        "2 samples on 4 devices: only 2 chunks": "4台のデバイスに2サンプル：チャンクは2つだけです",
        "a list gives one list per device": "リストからはデバイスごとに1つのリストができます",
        "containers nest": "コンテナーは入れ子にできます",
        "a batch of one sample: one chunk": "1サンプルだけのバッチ：チャンクは1つです",
    },
}
