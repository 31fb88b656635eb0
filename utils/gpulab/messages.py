"""The words gpulab says to a learner, in the language of the lesson's edition (every lesson, from lesson 01).

A lesson's install cell (written by the build for each edition) sets ``GPULAB_LANGUAGE`` before the set-up cell
imports gpulab: ``"en"`` in the English lessons, ``"ja"`` in the Japanese ones (``lessons/ja/``). Every message a
learner meets (the device-mode sentence, the self-checks' verdicts and hints, plot titles, axis labels and
legends) comes from here: ``message(key, **values)`` formats ``ENGLISH[key]``, or its translation in
``TRANSLATIONS[language()]`` when there is one. English is the fallback and the contract the tests hold; a
translation must use the same ``{placeholders}`` (``tests/test_messages.py``).

Texts written once for an exercise (a hint, the reason a case is expected) are translated by their English text
itself, gettext-style: ``text(english)`` returns ``TEXTS[language()][english]`` when there is one, else the English.
Each lesson's exercise module (``gpulab.exercises.<lesson>``) keeps its own translations next to its texts, in
``TRANSLATIONS = {"ja": {english: japanese}}``, which ``gpulab.check`` adds to ``TEXTS`` when it loads the module.

``language("ja")`` switches a running kernel; in Japanese, plots use a Japanese font (IPAexGothic, from
``matplotlib-fontja``), so that no glyph is drawn as a box.
"""

from __future__ import annotations

import os
import re
import string

ENVIRONMENT_VARIABLE = "GPULAB_LANGUAGE"
LANGUAGES = ("en", "ja")
FONT = "IPAexGothic"  # the Japanese font of the plots, shipped by matplotlib-fontja

ENGLISH: dict[str, str] = {
    # devices (lesson 01's set-up cell, every lesson's after it)
    "devices.real": "Real GPUs: {n} of {gpu_count} CUDA device(s) ({names}): nn.DataParallel runs for real.",
    "devices.virtual": (
        "Virtual devices: {n} on {backing} (this machine has {have}, the lesson asks for {n}). "
        "DataParallel's scatter, replicate, parallel threads and gather run for real on one device, "
        "and memory is measured per virtual device."
    ),
    "devices.no_gpu": "no CUDA GPU",
    "devices.one_gpu": "1 CUDA GPU",
    "devices.gpus": "{count} CUDA GPUs",
    # ddp (lessons 02 to 04: the errors a learner meets launching ranks from a notebook)
    "ddp.not_importable": (
        "gpulab.ddp.launch runs fn in new Python processes, which import it by name (module.function); {problem}.\n"
        "{fix}"
    ),
    "ddp.no_module_and_name": "{target} has no importable module and name",
    "ddp.defined_in_main": (
        "`{qualname}` was defined in the notebook (or the script being run), i.e. in module __main__, "
        "which the new processes cannot import"
    ),
    "ddp.lambda": "it is a lambda, which has no name a new process could import",
    "ddp.local_function": "`{qualname}` is defined inside another function, so a new process cannot import it by name",
    "ddp.cannot_import": "`{name}` cannot be imported ({error})",
    "ddp.different_object": "importing `{name}` gives a different object than the one passed",
    "ddp.argument_in_main": (
        "an argument passed to the ranks uses `{name}`, defined in the notebook (__main__), which the new processes "
        "cannot import.\n{fix}"
    ),
    "ddp.how_to_fix": (
        "Put it at the top level of a .py file next to the notebook and import it from there, e.g.\n\n"
        "    %%writefile ddp_steps.py\n"
        "    def {name}(rank, world_size):\n"
        "        ...\n\n"
        "and in the next cell:\n\n"
        "    from ddp_steps import {name}\n"
        "    gpulab.ddp.launch({name}, 2)"
    ),
    "ddp.timeout": (
        "the {world_size} ranks of {function} did not finish within {timeout} s and were ended. A common cause: one "
        "rank waits in a collective (all_reduce, barrier, a DDP backward) that another rank never reaches. Pass a "
        "larger timeout= if the work is just long."
    ),
    "ddp.starting": "starting {world_size} ranks… {seconds} s",
    "ddp.ready": ", ready: rank {ranks}",
    "ddp.running": "{world_size} ranks running {function}… {seconds} s",
    # check (the self-checks after each exercise)
    "check.correct": "Correct: {count} cases pass.",
    "check.not_a_function": "`{name}` is not a function (got {got}).",
    "check.not_written": "Not written yet: replace `raise NotImplementedError()` with your code.",
    "check.raised": "{call} raised {error}; expected {expected}.",
    "check.too_slow": "stopped after {seconds} s: an answer on these sizes has to count, not run or play",
    "check.should_raise": "{call} returned {got}; it should raise {error}: {why}",
    "check.changed_arguments": "{call} changed its arguments; leave them as they were: {why}",
    "check.left_arguments": "{call} left its arguments otherwise than the exercise asks: {why}",
    "check.returned_an_argument": "{call} returned its argument itself; return a new object: {why}",
    "check.returned": "{call} returned {got}, expected {expected}.{differs} {why}",
    "check.differs_at": " They first differ at {where}.",
    "check.hint_label": "Hint",
    "check.passed_badge": "✓ Correct",
    "check.failed_badge": "✗ Not yet",
    "check.hint_intro": "A hint, not the answer:",
    "check.solutions_off": (
        "Solutions are not installed here: a graded course keeps them with the instructor. Try check.hint(...) instead."
    ),
    "check.sure": (
        "Sure? Trying for a few more minutes teaches more than reading the answer. "
        "Run gpulab.check.solution({name!r}, confirm=True) to see it."
    ),
    "check.solution_of": "A solution of {name}:",
    # where two values first differ (gpulab.check.first_difference)
    "diff.at": "{where}: {what}",
    "diff.top_level": "the top level",
    "diff.instead": "{got} instead of {expected}",
    "diff.shape": "shape {got} instead of {expected}",
    "diff.dtype": "dtype {got} instead of {expected}",
    "diff.unusual_tensor": "a {kind} tensor instead of an ordinary one",
    "diff.entries": "{got} entries instead of {expected}",
    "diff.missing_key": "the key {name} is missing",
    "diff.extra_key": "an extra key {name}",
    "diff.a_kind": "a {kind}",
    "diff.with_kind": "{value} ({kind})",
    "diff.bool": "a bool",
    "diff.int": "an int",
    "diff.float": "a float",
    # memory (a trace's summary and the notices gpulab.memory prints)
    "memory.summary": "memory trace ({kind}), {samples} samples over {seconds} s",
    "memory.virtual_on": "virtual devices on {backing}",
    "memory.real_gpus": "real GPUs",
    "memory.summary_device": "  device {device}: peak {peak} MiB, allocated at end {now} MiB",
    "memory.summary_nvml": ", NVML used at end {used} MiB",
    "memory.note": "  note: {notice}",
    "memory.nvml_unavailable": (
        "NVML is unavailable ({error}); showing PyTorch's allocated memory only (trace.nvml_used stays empty)."
    ),
    "memory.nvml_stopped": "NVML stopped working ({error}); NVML series dropped.",
    "memory.live_plot_failed": "the live plot failed ({error})",
    "memory.sampler_stopped": "the sampler stopped early ({error})",
    # models (ShapeReporter, lesson 01)
    "models.replica_input": "  replica on device {device} ({where}): input shape {shape}",
    # bench and scaling (lesson 03)
    "bench.timing": "{label}: {ms} ms/step (median of {repeats}), {samples_per_s} samples/s",
    "scaling.measured": "measured {stage}: {mib} MiB at {rate} GB/s",
    "scaling.caveat": (
        "A prediction from peak link bandwidth (and, without real GPUs, from the step's counted FLOPs at the "
        "GPU's peak rate in PyTorch's default precision: TF32 for float32 convolutions where the GPU has it, FP32 "
        "for the rest, and its counted operations at the host's launch cost), with the host's costs calibrated on "
        "PyTorch's DDP benchmark and DataParallel's replicate() timed on this machine's CPU, not a measurement: it "
        "leaves out latency, the efficiency real transfers and kernels reach (often far below peak for small "
        "layers), the loss computed on device 0 over the whole batch, kernel-launch contention between the "
        "replicas' threads, ranks waiting for the slowest, and links shared through a PCIe switch or the CPU."
    ),
    # traffic (lesson 03: one step's stages under each algorithm)
    "traffic.table_header": "MiB per stage of one step: all links together | device {device}'s link",
    "traffic.algorithm_copy": "PyTorch without NCCL: a copy between device 0 and each other device",
    "traffic.algorithm_nccl": (
        "PyTorch on GPUs where torch.cuda.nccl.is_available: the broadcast and the reduce pass along a chain of "
        "devices, each link carrying them once in and once out (device 0's once); the other stages are copies"
    ),
    # plots
    "plots.time_s": "time (s)",
    "plots.mib": "MiB",
    "plots.memory_key": "solid: allocated\nshaded: highest value\nreached between samples\ndashed: peak",
    "plots.memory_key_nvml": "\ndotted: NVML used, rise",
    "plots.memory_per_device": "Memory per device ({kind})",
    "plots.virtual_devices": "virtual devices",
    "plots.gpus": "GPUs",
    "plots.peak_mib": "peak MiB",
    "plots.peak": "peak",
    "plots.peak_memory_per_device": "Peak memory per device",
    "plots.live_memory": "Memory per device (live)",
    "plots.device": "device {device}",
    "plots.step_time": "step time (ms), median and repeats",
    "plots.samples_per_s": "samples / s",
    "plots.step_time_and_throughput": "Step time and throughput",
    "plots.devices": "devices",
    "plots.linear_scaling": "dotted: linear scaling",
    "plots.scaling": "Scaling",
    "plots.link_mib": "MiB through the device's link",
    "plots.traffic_per_link": "Traffic per link, by stage",
    "plots.mib_per_step": "MiB per step",
    "plots.bytes_per_step": "Bytes per step",
    "plots.predicted": "{method} (predicted)",
    "plots.measured": "{method} (measured)",
    "plots.speedup": "speed-up over one device",
    "plots.predicted_speedup": "Predicted speed-up (a prediction, not a measurement)",
    "plots.backward_lane": "backward",
    "plots.all_reduce_lane": "all-reduce",
    "plots.ms_from_backward": "ms from the start of backward (predicted)",
    "plots.ddp_timeline": "DDP's buckets: backward and the all-reduce (a prediction)",
    "plots.live_last_frame": "<memory per device: last frame of the live plot>",
    # memory (lesson 03: a virtual device with a capacity)
    "memory.out_of_memory": (
        "Virtual device {device} is out of memory. Tried to allocate {tried:.2f} MiB; virtual device {device} has a "
        "capacity of {capacity:.2f} MiB, of which {free:.2f} MiB is free ({allocated:.2f} MiB allocated in this block)."
    ),
    # gil (lesson 03: threads against processes on a Python-bound forward)
    "gil.summary": (
        "Parallelism (CPU time of the workers added up / wall time), the highest of {repeats} repeats: "
        "{devices} plain Python processes side by side (what this machine gives now) {calibration:.2f}; "
        "DataParallel's {devices} threads {threads:.2f}; DDP's {devices} processes {processes:.2f}."
    ),
    "gil.no_free_core": (
        "This machine gave {calibration:.2f} to processes side by side: no second core is free right now (other "
        "programs use it). So these numbers show nothing about the GIL: threads without a GIL could not have run at "
        "once either."
    ),
    "gil.waits": (
        "A sign other programs cannot fake: a pure-Python loop gives up its core by itself only to wait for a lock. "
        "In their loops DataParallel's {devices} threads did so {threads} times, DDP's {devices} processes "
        "{processes} times (every repeat added up)."
    ),
    "gil.waits_show": "The threads waited for the GIL another thread held: that shows the GIL, at any load.",
    "gil.waits_do_not_show": "These counts do not show the GIL.",
    "gil.no_waits": "This system does not count a thread's waits, so nothing in this run can show the GIL.",
    "gil.calibration": "{devices} plain processes\n(calibration)",
    "gil.threads": "{devices} threads\n(DataParallel)",
    "gil.processes": "{devices} processes\n(DDP)",
    "gil.parallelism": "cores' worth of work at once",
    "gil.title": "A Python-bound forward: {batch_size} samples x {work:,} loop steps",
    # scaling (lesson 03: predicted efficiency)
    "scaling.efficiency_header": "predicted efficiency (speed-up / devices) at {counts} devices",
    "scaling.model_cost": "{name}: {gflop} GFLOP per device per step, {mib} MiB of gradients",
    "scaling.source": "source: {source}",
    "scaling.relative_speed": "speed relative to DataParallel {ratio}",
    "scaling.includes": "its times also hold: {what}",
    "scaling.one_device": "  one GPU, one step: measured {measured} ms, predicted {predicted} ms",
    "scaling.compared": "{way} on {devices} GPUs: efficiency measured {measured}, predicted {predicted}, gap {gap}",
    # diagrams (lesson 01)
    "diagrams.samples": "samples {first}..{last}",
    "diagrams.replica": "replica on device {device}",
    "diagrams.outputs": "{count} outputs\non device 0",
    "diagrams.pipeline": "scatter (split dim 0) → replicate → parallel forward → gather on the output device",
    "diagrams.sample_index": "sample index in the batch",
    "diagrams.which_device": "Which device processed which sample (batch of {batch_size})",
    # quiz (each lesson's quiz: the notebook's self-check and the feedback page; gpulab.quiz)
    "quiz.reread": "Re-read the section “{section}”.",
    "quiz.form_letter": "one letter, {first} to {last}",
    "quiz.form_number": "a number",
    "quiz.form_text": "a text in quotes",
    "quiz.unanswered": '{key}: no answer yet: set quiz_answers["{key}"].',
    "quiz.unreadable": "{key}: {answer} cannot be read as an answer: answer with {form}.",
    "quiz.read": "{key}: your answer {answer} can be read; grading will tell.",
    "quiz.right": "{key}: {answer} is right.",
    "quiz.wrong": "{key}: {answer} is not right yet.",
    "quiz.feedback_right": "{key}: your answer {answer} is right.",
    "quiz.feedback_wrong": "{key}: your answer {answer} is wrong.",
    "quiz.feedback_unreadable": "{key}: your answer {answer} could not be read (the question asks for {form}).",
    "quiz.feedback_unanswered": "{key}: no answer was given.",
}

# The lessons' register (です・ます; no space between Japanese and Latin letters or digits; a full-width colon after
# a label), their terms (仮想デバイス, レプリカ, 勾配, ピーク), PyTorch's names as they are.
JAPANESE: dict[str, str] = {
    "devices.real": (
        "実際のGPU：CUDAデバイス{gpu_count}台のうち{n}台（{names}）を使います。nn.DataParallelが実機で動きます。"
    ),
    "devices.virtual": (
        "仮想デバイス：{backing}上に{n}台（このマシンは{have}、レッスンが使うのは{n}台）。"
        "DataParallelのscatter、replicate、並列スレッド、gatherは1つのデバイス上で実際に動き、"
        "メモリは仮想デバイスごとに計測します。"
    ),
    "devices.no_gpu": "CUDA GPUなし",
    "devices.one_gpu": "CUDA GPUが1台",
    "devices.gpus": "CUDA GPUが{count}台",
    "ddp.not_importable": (
        "gpulab.ddp.launchはfnを新しいPythonプロセスで実行し、各プロセスはfnを名前（module.function）で"
        "インポートします。{problem}。\n{fix}"
    ),
    "ddp.no_module_and_name": "{target}には、インポートできるモジュール名と名前がありません",
    "ddp.defined_in_main": (
        "`{qualname}`はノートブック（または実行中のスクリプト）、つまりモジュール__main__で定義されていて、"
        "新しいプロセスからはインポートできません"
    ),
    "ddp.lambda": "lambdaには、新しいプロセスがインポートに使える名前がありません",
    "ddp.local_function": "`{qualname}`は別の関数の中で定義されているため、新しいプロセスは名前でインポートできません",
    "ddp.cannot_import": "`{name}`をインポートできません（{error}）",
    "ddp.different_object": "`{name}`をインポートすると、渡されたものとは別のオブジェクトになります",
    "ddp.argument_in_main": (
        "ランクに渡す引数が、ノートブック（__main__）で定義された`{name}`を使っていて、新しいプロセスからは"
        "インポートできません。\n{fix}"
    ),
    "ddp.how_to_fix": (
        "ノートブックの隣にある.pyファイルのトップレベルに置き、そこからインポートしてください。例：\n\n"
        "    %%writefile ddp_steps.py\n"
        "    def {name}(rank, world_size):\n"
        "        ...\n\n"
        "次のセルで：\n\n"
        "    from ddp_steps import {name}\n"
        "    gpulab.ddp.launch({name}, 2)"
    ),
    "ddp.timeout": (
        "{function}の{world_size}個のランクが{timeout}秒以内に終わらなかったため、終了させました。よくある原因："
        "あるランクが集団通信（all_reduce、barrier、DDPのバックワード）で待っているのに、別のランクがそこに"
        "到達しない。単に処理が長いだけなら、より大きなtimeout=を渡してください。"
    ),
    "ddp.starting": "{world_size}個のランクを起動中…{seconds}秒",
    "ddp.ready": "、準備完了：ランク{ranks}",
    "ddp.running": "{world_size}個のランクで{function}を実行中…{seconds}秒",
    "check.correct": "正解です：{count}件のケースがすべて通りました。",
    "check.not_a_function": "`{name}`が関数ではありません（{got}でした）。",
    "check.not_written": "まだ書かれていません：`raise NotImplementedError()`を自分のコードに置き換えてください。",
    "check.raised": "{call}で{error}が発生しました。期待される結果は{expected}です。",
    "check.too_slow": "{seconds}秒で止めました。この大きさでは、実行や再現ではなく数えて答える必要があります",
    "check.should_raise": "{call}は{got}を返しましたが、{error}を送出する必要があります：{why}",
    "check.changed_arguments": "{call}が引数を書き換えました。引数はそのままにしてください：{why}",
    "check.left_arguments": "{call}の実行後、引数が演習の求める状態になっていません：{why}",
    "check.returned_an_argument": "{call}は引数そのものを返しました。新しいオブジェクトを返してください：{why}",
    "check.returned": "{call}は{got}を返しましたが、期待される値は{expected}です。{differs}{why}",
    "check.differs_at": "最初の違いは{where}です。",
    "check.hint_label": "ヒント",
    "check.passed_badge": "✓ 正解",
    "check.failed_badge": "✗ まだです",
    "check.hint_intro": "答えではなくヒントです：",
    "check.solutions_off": (
        "ここには解答例がインストールされていません（採点されるコースでは講師だけが持っています）。"
        "代わりにcheck.hint(...)を試してください。"
    ),
    "check.sure": (
        "本当に見ますか？ あと数分考えてみるほうが、答えを読むより多くを学べます。"
        "見るにはgpulab.check.solution({name!r}, confirm=True)を実行してください。"
    ),
    "check.solution_of": "{name}の解答例：",
    "diff.at": "{where}で、{what}",
    "diff.top_level": "全体",
    "diff.instead": "{expected}ではなく{got}",
    "diff.shape": "形状が{expected}ではなく{got}",
    "diff.dtype": "dtypeが{expected}ではなく{got}",
    "diff.unusual_tensor": "通常のテンソルではなく{kind}のテンソル",
    "diff.entries": "要素数が{expected}ではなく{got}",
    "diff.missing_key": "キー{name}の欠落",
    "diff.extra_key": "余分なキー{name}",
    "diff.a_kind": "{kind}型",
    "diff.with_kind": "{kind}の{value}",
    "diff.bool": "bool型",
    "diff.int": "int型",
    "diff.float": "float型",
    "memory.summary": "メモリトレース（{kind}）：{seconds}秒間に{samples}サンプル",
    "memory.virtual_on": "{backing}上の仮想デバイス",
    "memory.real_gpus": "実際のGPU",
    "memory.summary_device": "  デバイス{device}：ピーク{peak} MiB、終了時の割り当て{now} MiB",
    "memory.summary_nvml": "、終了時のNVML使用量{used} MiB",
    "memory.note": "  注：{notice}",
    "memory.nvml_unavailable": (
        "NVMLを使えません（{error}）。PyTorchが割り当てたメモリだけを表示します（trace.nvml_usedは空のままです）。"
    ),
    "memory.nvml_stopped": "NVMLが動かなくなりました（{error}）。NVMLの系列は記録しません。",
    "memory.live_plot_failed": "ライブプロットが失敗しました（{error}）",
    "memory.sampler_stopped": "サンプラーが途中で止まりました（{error}）",
    "models.replica_input": "  デバイス{device}（{where}）のレプリカ：入力の形状{shape}",
    "bench.timing": "{label}：1ステップ{ms} ms（{repeats}回の中央値）、毎秒{samples_per_s}サンプル",
    "scaling.measured": "実測（{stage}）：{mib} MiB、{rate} GB/s",
    "scaling.caveat": (
        "これは測定値ではなく予測です。リンクのピーク帯域幅（実際のGPUがない場合は、数えたステップのFLOPsと"
        "PyTorchの既定の精度でのGPUのピーク演算性能。float32の畳み込みはGPUにあればTF32、ほかはFP32。"
        "数えた演算はホストの起動コストで見積もります）から求めています。ホストのコストはPyTorchのDDP"
        "ベンチマークで較正し、DataParallelのreplicate()はこのマシンのCPUで計っています。含まれていないもの："
        "レイテンシ、実際の転送とカーネルが達する効率（小さな層ではピークよりずっと低いことが多い）、"
        "デバイス0がバッチ全体で計算する損失、レプリカのスレッドどうしのカーネル起動の競合、最も遅いランクを"
        "待つ時間、PCIeスイッチやCPUを通して共有されるリンク。"
    ),
    "traffic.table_header": "1ステップの段階ごとのMiB：全リンクの合計 | デバイス{device}のリンク",
    "traffic.algorithm_copy": "NCCLなしのPyTorch：デバイス0とほかの各デバイスとの間で1回ずつコピーします",
    "traffic.algorithm_nccl": (
        "torch.cuda.nccl.is_availableが真になるGPU上のPyTorch：ブロードキャストとリデュースはデバイスの鎖に沿って"
        "受け渡され、各リンクはそれを1回受け取り1回送ります（デバイス0のリンクは1回）。ほかの段階はコピーです"
    ),
    "plots.time_s": "時間（秒）",
    "plots.mib": "MiB",
    "plots.memory_key": "実線：割り当て済み\n網掛け：サンプルとサンプルの\n間に達した最大値\n破線：ピーク",
    "plots.memory_key_nvml": "\n点線：NVMLの使用量（増加分）",
    "plots.memory_per_device": "デバイスごとのメモリ（{kind}）",
    "plots.virtual_devices": "仮想デバイス",
    "plots.gpus": "GPU",
    "plots.peak_mib": "ピーク（MiB）",
    "plots.peak": "ピーク",
    "plots.peak_memory_per_device": "デバイスごとのピークメモリ",
    "plots.live_memory": "デバイスごとのメモリ（ライブ）",
    "plots.device": "デバイス{device}",
    "plots.step_time": "ステップ時間（ms）：中央値と各回",
    "plots.samples_per_s": "サンプル数／秒",
    "plots.step_time_and_throughput": "ステップ時間とスループット",
    "plots.devices": "デバイス数",
    "plots.linear_scaling": "点線：線形スケーリング",
    "plots.scaling": "スケーリング",
    "plots.link_mib": "デバイスのリンクを通るデータ量（MiB）",
    "plots.traffic_per_link": "リンクごとの通信量（段階別）",
    "plots.mib_per_step": "1ステップあたりのMiB",
    "plots.bytes_per_step": "1ステップあたりのバイト数",
    "plots.predicted": "{method}（予測）",
    "plots.measured": "{method}（実測）",
    "plots.speedup": "1デバイスに対する高速化率",
    "plots.predicted_speedup": "予測される高速化率（測定値ではなく予測です）",
    "plots.backward_lane": "バックワード",
    "plots.all_reduce_lane": "オールリデュース",
    "plots.ms_from_backward": "バックワード開始からの時間（ms、予測）",
    "plots.ddp_timeline": "DDPのバケット：バックワードとオールリデュース（予測）",
    "plots.live_last_frame": "<デバイスごとのメモリ：ライブプロットの最後のフレーム>",
    "memory.out_of_memory": (
        "仮想デバイス{device}のメモリが足りません。{tried:.2f} MiBを確保しようとしました。仮想デバイス{device}の容量は"
        "{capacity:.2f} MiBで、空きは{free:.2f} MiBです（このブロックで確保済み：{allocated:.2f} MiB）。"
    ),
    "gil.summary": (
        "並列度（ワーカーのCPU時間の合計 / 経過時間）、{repeats}回の繰り返しのうち最も高い値："
        "Pythonだけのプロセス{devices}つを並べて実行（このマシンがいま出せる並列度）{calibration:.2f}、"
        "DataParallelの{devices}スレッド{threads:.2f}、DDPの{devices}プロセス{processes:.2f}。"
    ),
    "gil.no_free_core": (
        "並べて動かしたプロセスに、このマシンが出せた並列度は{calibration:.2f}でした。いまは2つ目のコアが空いていない"
        "（ほかのプログラムが使っている）ため、これらの値はGILについて何も示しません。GILがなくても、スレッドは同時には"
        "動けなかったからです。"
    ),
    "gil.waits": (
        "ほかのプログラムには作り出せない印：Pythonだけのループが自分からコアを手放すのは、ロックを待つときだけです。ループの間に"
        "そうした回数は、DataParallelの{devices}スレッドが{threads}回、DDPの{devices}プロセスが{processes}回"
        "（すべての繰り返しの合計）。"
    ),
    "gil.waits_show": "スレッドは、ほかのスレッドが持つGILを待っていました。これは負荷によらずGILを示しています。",
    "gil.waits_do_not_show": "これらの回数はGILを示していません。",
    "gil.no_waits": "このシステムはスレッドの待ちを数えないため、この実行ではGILを示せません。",
    "gil.calibration": "Pythonだけの{devices}プロセス\n（較正）",
    "gil.threads": "{devices}スレッド\n（DataParallel）",
    "gil.processes": "{devices}プロセス\n（DDP）",
    "gil.parallelism": "同時に進んだ仕事（コア何個分か）",
    "gil.title": "Pythonが律速のforward：{batch_size}サンプル × ループ{work:,}回",
    "scaling.efficiency_header": "予測される効率（高速化率 / デバイス数）、{counts}台",
    "scaling.model_cost": "{name}：デバイスあたり1ステップ{gflop} GFLOP、勾配{mib} MiB",
    "scaling.source": "出典：{source}",
    "scaling.relative_speed": "DataParallelに対する速さ{ratio}",
    "scaling.includes": "測定時間に含まれるもの：{what}",
    "scaling.one_device": "  GPU 1台の1ステップ：実測{measured} ms、予測{predicted} ms",
    "scaling.compared": "{way}（GPU {devices}台）：効率の実測{measured}、予測{predicted}、差{gap}",
    "diagrams.samples": "サンプル{first}..{last}",
    "diagrams.replica": "デバイス{device}のレプリカ",
    "diagrams.outputs": "{count}個の出力\nデバイス0上",
    "diagrams.pipeline": "scatter（次元0で分割）→ replicate → 並列フォワード → 出力デバイスへgather",
    "diagrams.sample_index": "バッチ内のサンプル番号",
    "diagrams.which_device": "どのデバイスがどのサンプルを処理したか（バッチサイズ{batch_size}）",
    "quiz.reread": "「{section}」をもう一度読んでみましょう。",
    "quiz.form_letter": "{first}〜{last}の記号",
    "quiz.form_number": "数値",
    "quiz.form_text": "引用符で囲んだ文字列",
    "quiz.unanswered": '{key}：まだ解答がありません。quiz_answers["{key}"]を設定してください。',
    "quiz.unreadable": "{key}：{answer}は解答として読み取れません。{form}で答えてください。",
    "quiz.read": "{key}：解答{answer}を読み取りました。正誤は採点でわかります。",
    "quiz.right": "{key}：{answer}は正解です。",
    "quiz.wrong": "{key}：{answer}はまだ正解ではありません。",
    "quiz.feedback_right": "{key}：あなたの解答{answer}は正解です。",
    "quiz.feedback_wrong": "{key}：あなたの解答{answer}は不正解です。",
    "quiz.feedback_unreadable": "{key}：あなたの解答{answer}は読み取れませんでした（{form}で答える問題です）。",
    "quiz.feedback_unanswered": "{key}：解答がありませんでした。",
}

TRANSLATIONS: dict[str, dict[str, str]] = {"ja": JAPANESE}

# Exercise texts (hints, the reasons cases are expected), keyed by their English text: see ``text``.
TEXTS: dict[str, dict[str, str]] = {"ja": {}}

# The texts the lessons' code cells hand to gpulab or to matplotlib (plot titles, series and stage labels, the
# sources of lesson 03's figures), keyed by their English text as the cell writes it. A key with ``{placeholders}``
# stands for the texts an f-string makes: ``text("step 2")`` finds ``"step {step}"`` and gives ``"ステップ2"``.
LABELS: dict[str, dict[str, str]] = {
    "ja": {
        # lesson 03: a demo that measures the learner's own LossInForward, before it is written
        "Write LossInForward (exercise 3) to measure the loss in forward too.": (
            "損失をforwardの中で計算する場合も測るには、演習3のLossInForwardを書いてください。"
        ),
        # lesson 01: what its cells print
        "nn.DataParallel device_ids on this machine: {device_ids}": (
            "このマシンでのnn.DataParallelのdevice_ids：{device_ids}"
        ),
        "gathered output: {shape} on {device}": "集約された出力：{shape}（{device}上）",
        "device {device}: samples {first}..{last} ({count})": "デバイス{device}：サンプル{first}..{last}（{count}個）",
        "{batch_size} samples on {n} devices -> {sizes}": "{batch_size}サンプルを{n}台のデバイスへ -> {sizes}",
        "{batch_size} samples -> {sizes}": "{batch_size}サンプル -> {sizes}",
        # lesson 02
        "full batch: 1/B for every sample": "バッチ全体：どのサンプルも1/B",
        "sample (colour: device)": "サンプル（色：デバイス）",
        "weight in the update": "更新での重み",
        "A plain average of chunk means": "チャンクごとの平均の単純平均",
        # lesson 02: what its cells print
        "each replica's input: {shapes}": "各レプリカの入力：{shapes}",
        "replica {index}: {kind}, grad_fn {grad_fn}, shares the model's memory: {shared}": (
            "レプリカ{index}：{kind}、grad_fn {grad_fn}、モデルとメモリを共有：{shared}"
        ),
        "each replica's output: {shapes}": "各レプリカの出力：{shapes}",
        "gathered {shape} on {device}; loss {loss} on {loss_device}": (
            "集約：{shape}（{device}上）。損失{loss}（{loss_device}上）"
        ),
        "largest difference from parallel(inputs): {difference}": "parallel(inputs)との最大の差：{difference}",
        "model's gradient - (replica 0's + replica 1's): {difference}": (
            "モデルの勾配 -（レプリカ0の勾配 + レプリカ1の勾配）：{difference}"
        ),
        "replica {index}: {of_batch} samples; its gradient - {share} x its chunk's mean-loss gradient: {difference}": (
            "レプリカ{index}：{of_batch}サンプル。その勾配 - {share} × そのチャンクの平均損失の勾配：{difference}"
        ),
        "DataParallel - full batch: {difference}": "DataParallel - バッチ全体：{difference}",
        "chunk sizes: {sizes}": "チャンクの大きさ：{sizes}",
        "weight of each sample in a plain average: {weights}": "単純平均での各サンプルの重み：{weights}",
        "weight of each sample in the full-batch mean: {weight}": "バッチ全体の平均での各サンプルの重み：{weight}",
        "plain average - full batch: {difference}": "単純平均 - バッチ全体：{difference}",
        "BatchNorm model, DataParallel - full batch: {gap}": "BatchNormのモデル、DataParallel - バッチ全体：{gap}",
        "step {step} ({samples} samples):": "ステップ{step}（{samples}サンプル）：",
        "one device": "1デバイス",
        "largest difference between the trained weights: {gap}": "学習後の重みの最大の差：{gap}",
        "{ranks} ranks returned after {seconds} s (mostly starting Python and torch)": (
            "{ranks}つのランクが{seconds}秒後に戻りました（ほとんどはPythonとtorchの起動時間）"
        ),
        "{samples} samples, {shards}: rank 0 - rank 1: {between}   DDP - full batch: {full}": (
            "{samples}サンプル（{shards}）：ランク0 - ランク1：{between}   DDP - バッチ全体：{full}"
        ),
        "gradient of the summed loss / gradient of the mean loss = {ratio}; batch size B = {batch}": (
            "合計損失の勾配 / 平均損失の勾配 = {ratio}。バッチサイズB = {batch}"
        ),
        "chunk 0's mean: {means}": "チャンク0の平均：{means}",
        "whole batch mean: {means}": "バッチ全体の平均：{means}",
        # lesson 03: a step's stages, the peaks, the traffic
        "start": "開始",
        "model": "モデル",
        "forward": "フォワード",
        "loss": "損失",
        "backward": "バックワード",
        "optimizer step": "オプティマイザのステップ",
        # (before "step {step}", which would match it too: patterns are tried in this order)
        "step {step}: {count} bucket(s), {total} MiB in all: {sizes} bytes": (
            "ステップ{step}：バケット{count}個、合計{total} MiB：{sizes}バイト"
        ),
        "step {step}": "ステップ{step}",
        "One DataParallel step, stage by stage": "DataParallelの1ステップ（段階ごと）",
        "gathered on device 0": "デバイス0に集約",
        "loss in forward": "損失をフォワード内で計算",
        "DDP, one rank per device": "DDP（デバイスごとに1ランク）",
        "Peak memory per device, three ways": "デバイスごとのピークメモリ（3通り）",
        "Peak memory per device: DataParallel three ways, and DDP": (
            "デバイスごとのピークメモリ：DataParallelの3通りとDDP"
        ),
        "DDP rank {rank}: its own device's memory": "DDPのランク{rank}：自分のデバイスのメモリ",
        "rank {rank}": "ランク{rank}",
        "One DataParallel step on 4 devices: bytes through each device's link": (
            "4台のデバイスでのDataParallelの1ステップ：\n各デバイスのリンクを通るバイト数"  # no spaces to wrap at
        ),
        "DataParallel, copies: device 0's link": "DataParallel（コピー）：デバイス0のリンク",
        "DataParallel, NCCL: device 0's link": "DataParallel（NCCL）：デバイス0のリンク",
        "DDP: what each rank sends": "DDP：各ランクが送るバイト数",
        "Bytes per step, {per_device} samples per device": (
            "1ステップあたりのバイト数（デバイスあたり{per_device}サンプル）"
        ),
        # lesson 03: where each figure of gpulab.scaling.INTERCONNECTS comes from (a document's title as it is)
        "PCI-SIG PCIe 3.0 base specification: 8 GT/s per lane, 128b/130b encoding, x16 = 15.75 GB/s per direction": (
            "『PCI-SIG PCIe 3.0 base specification』：1レーンあたり8 GT/s、128b/130b符号化、x16で片方向15.75 GB/s"
        ),
        "PCI-SIG PCIe 4.0 base specification: 16 GT/s per lane, 128b/130b encoding, x16 = 31.5 GB/s per direction": (
            "『PCI-SIG PCIe 4.0 base specification』：1レーンあたり16 GT/s、128b/130b符号化、x16で片方向31.5 GB/s"
        ),
        "NVIDIA A100 Tensor Core GPU datasheet: NVLink 600 GB/s per GPU, both directions: 300 GB/s each way": (
            "『NVIDIA A100 Tensor Core GPU datasheet』：NVLinkはGPUあたり双方向で600 GB/s、片方向300 GB/s"
        ),
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5): NVLink 900 GB/s per GPU, both directions: 450 GB/s each way": (
            "『NVIDIA H100 Tensor Core GPU datasheet』（SXM5）：NVLinkはGPUあたり双方向で900 GB/s、片方向450 GB/s"
        ),
        "NVIDIA T4 datasheet: PCIe Gen3 x16 interface, no NVLink: the two cards talk over PCIe 3.0 x16 at best": (
            "『NVIDIA T4 datasheet』：PCIe Gen3 x16インターフェース、NVLinkなし。2枚のカードは最大でもPCIe 3.0 x16で"
            "通信します"
        ),
        "NVIDIA V100 Tensor Core GPU datasheet: 14 TFLOPS single precision (PCIe)": (
            "『NVIDIA V100 Tensor Core GPU datasheet』：単精度14 TFLOPS（PCIe）"
        ),
        "NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS": (
            "『NVIDIA A100 Tensor Core GPU datasheet』：FP32 19.5 TFLOPS"
        ),
        "NVIDIA H100 Tensor Core GPU datasheet: FP32 67 TFLOPS (SXM5)": (
            "『NVIDIA H100 Tensor Core GPU datasheet』：FP32 67 TFLOPS（SXM5）"
        ),
        "NVIDIA T4 datasheet: 8.1 TFLOPS single precision (FP32)": "『NVIDIA T4 datasheet』：単精度（FP32）8.1 TFLOPS",
        "NVIDIA A100 Tensor Core GPU datasheet: Tensor Float 32 (TF32) 156 TFLOPS (312 TFLOPS with sparsity)": (
            "『NVIDIA A100 Tensor Core GPU datasheet』：TF32 156 TFLOPS（スパース性ありで312 TFLOPS）"
        ),
        (
            "NVIDIA H100 Tensor Core GPU datasheet: TF32 Tensor Core 989 TFLOPS (SXM5) with sparsity; "
            "without sparsity half of it, 494.5 TFLOPS"
        ): (
            "『NVIDIA H100 Tensor Core GPU datasheet』：TF32 Tensorコア989 TFLOPS（SXM5、スパース性あり）。"
            "スパース性なしではその半分の494.5 TFLOPS"
        ),
        # lesson 03: gpulab.scaling.PUBLISHED, the measurements set beside the predictions
        (
            "Hugging Face Transformers documentation, 'Efficient Training on Multiple GPUs' "
            "(docs/source/en/perf_train_gpu_many.md), DataParallel vs DistributedDataParallel"
        ): (
            "『Hugging Face Transformers documentation』の『Efficient Training on Multiple GPUs』"
            "（docs/source/en/perf_train_gpu_many.md）、DataParallelとDistributedDataParallelの比較"
        ),
        "2x TITAN RTX 24GB with NVLink (NV2); 'without NVLink': NCCL_P2P_DISABLE=1": (
            "TITAN RTX 24GB × 2、NVLink（NV2）で接続。「NVLinkなし」はNCCL_P2P_DISABLE=1で実行"
        ),
        "GPT-2 (openai-community/gpt2) fine-tuned on wikitext-2, 4 samples per GPU, 200 steps": (
            "GPT-2（openai-community/gpt2）をwikitext-2でファインチューニング、GPUあたり4サンプル、200ステップ"
        ),
        "DDP without NVLink": "DDP（NVLinkなし）",
        # lesson 03, Going further: GPU 0 runs out of memory first; when is DDP near-linear
        "loss outside forward": "損失をフォワードの外で計算",
        # (before the next one, whose {name} would match it too: patterns are tried in this order)
        "DDP, each rank within {capacity} MiB (the launch above): fits, peaks {peaks} MiB": (
            "DDP（上の起動）：各ランクが{capacity} MiB以内に収まりました。ピーク{peaks} MiB"
        ),
        "{name}: fits, peaks {peaks} MiB": "{name}：収まりました。ピーク{peaks} MiB",
        # lesson 03: what its cells print
        (
            "parameters: {parameters} MiB; one batch's output ({batch_size} x {vocabulary} floats): {output} MiB"
        ): "パラメータ：{parameters} MiB。1バッチの出力（{batch_size} × {vocabulary}個のfloat）：{output} MiB",
        "MiB on device 0 and on device 1, for each part of the step:": (
            "デバイス0とデバイス1のMiB（ステップの部分ごと）："
        ),
        "master parameters": "マスターのパラメータ",
        "forward: gathered outputs": "フォワード：集約された出力",
        "loss: log-softmax kept": "損失：保持されるlog-softmax",
        "backward, at its peak": "バックワード（ピーク時）",
        "gradients left by backward": "バックワードが残す勾配",
        "optimizer step: Adam's state": "オプティマイザのステップ：Adamの状態",
        "peak of the step, difference {difference}": "ステップのピーク、差{difference}",
        "gathered output {gathered} MiB, forward row {forward} MiB on device 0": (
            "集約された出力{gathered} MiB、デバイス0のフォワードの行{forward} MiB"
        ),
        "result: {values}, shape {shape}": "結果：{values}、形状{shape}",
        "warning: {messages}": "警告：{messages}",
        "{name}: peaks {peaks} MiB, device 0 / device 1 {ratio}": (
            "{name}：ピーク{peaks} MiB、デバイス0 / デバイス1 {ratio}"
        ),
        "{ranks} ranks returned after {seconds} s": "{ranks}つのランクが{seconds}秒後に戻りました",
        "DDP: every rank's peak {peaks} MiB, rank 0 / rank 1 {ratio}": (
            "DDP：各ランクのピーク{peaks} MiB、ランク0 / ランク1 {ratio}"
        ),
        "DataParallel: device 0 {first} MiB, device 1 {second} MiB": (
            "DataParallel：デバイス0 {first} MiB、デバイス1 {second} MiB"
        ),
        "See the warnings in help(nn.DataParallel).": "help(nn.DataParallel)の警告を見てください。",
        "{forwards} replica forwards, {objects} different replica objects": (
            "レプリカのフォワード{forwards}回、異なるレプリカのオブジェクト{objects}個"
        ),
        "any of them the model itself: {found}": "そのどれかがモデル自身か：{found}",
        "replicas whose weight shares the model's memory: {shared} (numbered from 0 to {last})": (
            "重みがモデルとメモリを共有するレプリカ：{shared}（0から{last}までの番号）"
        ),
        "WideHead (this lesson)": "WideHead（このレッスンのモデル）",
        "ConvNet (compute-bound)": "ConvNet（計算律速）",
        # lesson 03: DDP's buckets and the host's costs
        "the parameters: {parameters} MiB": "パラメータ：{parameters} MiB",
        "host: {operation} µs per operation, {gradient} µs per gradient under DDP; from: {source}": (
            "ホスト：1演算あたり{operation} µs、DDPでは勾配1つあたり{gradient} µs。出典：{source}"
        ),
        (
            "counted on the meta device: device 0's bytes as above {same_bytes}, DDP's buckets as measured "
            "{same_buckets}"
        ): (
            "metaデバイスで数えた値：デバイス0のバイト数が上と同じか{same_bytes}、"
            "DDPのバケットが測定と同じか{same_buckets}"
        ),
        "modelled: {modelled} bytes; measured from step 1 on: {measured} bytes": (
            "モデルによる値：{modelled}バイト。ステップ1以降の測定値：{measured}バイト"
        ),
        "this lesson's model, step 0: one bucket": "このレッスンのモデル、ステップ0：バケット1個",
        "this lesson's model, from step 1 on": "このレッスンのモデル、ステップ1以降",
        "ConvNet, from step 1 on": "ConvNet、ステップ1以降",
        "8 devices over PCIe 4.0 x16: backward and each bucket's all-reduce": (
            "PCIe 4.0 x16で結ばれた8台のデバイス：バックワードと各バケットのオールリデュース"
        ),
        # lesson 03: gpulab.scaling.PUBLISHED_SCALING, published runs of a model gpulab counts (DDP_BENCHMARK first)
        (
            "PyTorch repository, benchmarks/distributed/ddp/README.md (the DDP benchmark's example output), "
            "p50 seconds per iteration"
        ): (
            "PyTorchのリポジトリのbenchmarks/distributed/ddp/README.md（DDPベンチマークの出力例）、"
            "1イテレーションあたりの秒数のp50"
        ),
        "8x V100 (DGX-1: NVLink, 'nvidia-smi topo -m' as printed there); PyTorch 1.4.0a0, CUDA 10.0, NCCL": (
            "V100 × 8（DGX-1：NVLink。そこに載っている「nvidia-smi topo -m」の出力のとおり）。"
            "PyTorch 1.4.0a0、CUDA 10.0、NCCL"
        ),
        "ResNet-50 (torchvision), 32 images per GPU": "ResNet-50（torchvision）、GPUあたり32枚の画像",
        "the synthetic batch's handling and the optimizer step of the benchmark's loop": (
            "ベンチマークのループでの合成バッチの扱いとオプティマイザのステップ"
        ),
        (
            "GoogleCloudPlatform/vertex-ai-samples, community-content/pytorch_efficient_training/README.md, "
            "'Benchmark', seconds per epoch with local data (resnet.py, resnet_dp.py, resnet_ddp.py)"
        ): (
            "GoogleCloudPlatform/vertex-ai-samplesのcommunity-content/pytorch_efficient_training/README.md、"
            "『Benchmark』、ローカルのデータでの1エポックあたりの秒数（resnet.py、resnet_dp.py、resnet_ddp.py）"
        ),
        "4x NVIDIA T4": "NVIDIA T4 × 4",
        "ResNet-50 (torchvision), 32 images per GPU, ImageNet's validation images": (
            "ResNet-50（torchvision）、GPUあたり32枚の画像、ImageNetの検証用画像"
        ),
        (
            "loading and decoding the JPEG images (2 loader processes per GPU); the DDP run also synchronises "
            "BatchNorm across GPUs (SyncBatchNorm)"
        ): (
            "JPEG画像の読み込みとデコード（GPUあたり2つのローダープロセス）。DDPの実行ではGPU間でのBatchNormの"
            "同期（SyncBatchNorm）も含みます"
        ),
        # lesson 04: what its cells print, and its DDP ranks
        "parallel.module is model: {same}": "parallel.moduleとmodelは同じオブジェクトか：{same}",
        "same storage: {same}": "同じストレージか：{same}",
        "weights loaded: {loaded}": "重みが読み込まれたか：{loaded}",
        "same outputs: {same}": "出力が同じか：{same}",
        "CUDA GPUs here: {count}": "このマシンのCUDA GPU：{count}台",
        "{count} batches": "バッチ{count}個",
        "4 + 4 resumed steps vs 8 steps, largest difference: {difference}": (
            "再開した4 + 4ステップと、続けた8ステップとの最大の差：{difference}"
        ),
        "without the optimizer's state, largest difference: {difference}": (
            "オプティマイザの状態なしでの最大の差：{difference}"
        ),
        "before: {size} bytes; loads: {loads}": "保存の前：{size}バイト、読み込めるか：{loads}",
        "after: {size} bytes; loads: {loads}": "保存の後：{size}バイト、読み込めるか：{loads}",
        "this line was printed by torch.load: it could have been any code": (
            "この行はtorch.loadが表示しました。ここでどんなコードでも実行されえました"
        ),
        "rank": "ランク",
        "DDP keys": "DDPのキー",
        "saved keys": "保存したキー",
        "loaded weights equal this rank's": "読み込んだ重みがこのランクの重みと同じか",
        "files": "ファイル",
        "saved {name} at step {step}": "ステップ{step}で{name}を保存しました",
        # every lesson's quiz: the visible tests' messages
        "set quiz_answers in the answer cell above": "上の解答セルでquiz_answersを設定してください",
        "answer with a letter: a, b or c": "a、b、cのどれか1文字で答えてください",
    }
}

_chosen: list[str] = []  # set by language(code); otherwise GPULAB_LANGUAGE decides


def language(code: str | None = None) -> str:
    """The language gpulab speaks (``"en"`` or ``"ja"``); with ``code``, switch to it (every lesson).

    Without a switch, the environment variable ``GPULAB_LANGUAGE`` decides (the lesson's install cell sets it);
    anything else means English.
    """
    if code is not None:
        if code not in LANGUAGES:
            raise ValueError(f"gpulab speaks {', '.join(LANGUAGES)}, not {code!r}")
        _chosen[:] = [code]
    chosen = _chosen[0] if _chosen else os.environ.get(ENVIRONMENT_VARIABLE, "en")
    return chosen if chosen in LANGUAGES else "en"


def message(key: str, **values: object) -> str:
    """Message ``key`` in the current language, formatted with ``values`` (English when it has no translation)."""
    template = TRANSLATIONS.get(language(), {}).get(key, ENGLISH[key])
    return template.format(**values)


def text(english: str) -> str:
    """An exercise's text (a hint, a case's reason) or a text a lesson's cell passes (a plot's title, a label:
    ``LABELS``) in the current language: its translation, else itself (every lesson)."""
    if not english or not isinstance(english, str):
        return english
    chosen = language()
    translated = TEXTS.get(chosen, {}).get(english) or LABELS.get(chosen, {}).get(english)
    if translated:
        return translated
    for pattern, template in _label_patterns(chosen):
        found = pattern.fullmatch(english)
        if found:
            return template.format(**found.groupdict())
    return english


def _label_patterns(chosen: str) -> list[tuple[re.Pattern[str], str]]:
    """``LABELS``' keys with ``{placeholders}`` as patterns that match the texts they stand for."""
    patterns = []
    for english, translated in LABELS.get(chosen, {}).items():
        if placeholders(english):
            parts = [
                re.escape(literal) + (f"(?P<{field}>.+?)" if field is not None else "")
                for literal, field, _, _ in string.Formatter().parse(english)
            ]
            patterns.append((re.compile("".join(parts), re.DOTALL), translated))
    return patterns


def placeholders(template: str) -> set[str]:
    """The names of a template's ``{placeholders}`` (what ``tests/test_messages.py`` compares)."""
    return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}


def use_font() -> None:
    """In Japanese, make matplotlib draw with a Japanese font (IPAexGothic from ``matplotlib-fontja``); in
    English, leave matplotlib's fonts alone. Called by ``gpulab.plots.new_figure`` before every figure."""
    if language() == "ja":
        import matplotlib
        import matplotlib_fontja

        family = matplotlib.rcParams["font.family"]
        if not family or family[0] != FONT:
            matplotlib_fontja.japanize()  # registers the font file with matplotlib
            # IPAexGothic first; DejaVu Sans (matplotlib's own) for any glyph it lacks
            matplotlib.rcParams["font.family"] = [FONT, "DejaVu Sans"]
